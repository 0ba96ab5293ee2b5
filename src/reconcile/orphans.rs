//! Ending the process groups a dead runner left behind, and knowing they are gone.
//!
//! Unlike the runner, which ends groups of its own children, the reconciler signals processes
//! it did not start and cannot reap, named only by what the journal recorded. Each step runs
//! in its own process group whose id is the step's pid. A group outlives its
//! leader while children remain, and Linux does not hand out a pid that is still some group's
//! id, so while any member lives the group id still means our group.
//!
//! Invariant: a group is signalled only when its id cannot belong to a stranger: the leader is
//! the recorded process (same boot, same start time), or the leader is gone and no other
//! process holds its pid.

use std::io;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use crate::event::ProcessIdentity;
use crate::liveness;

/// How a group ended when asked to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupEnd {
    /// Nothing was left to signal.
    AlreadyGone,
    /// It left after SIGTERM, within the grace.
    Terminated,
    /// SIGKILL was needed.
    Killed,
    /// Its id may belong to someone else now (another boot, or the pid was reused): not
    /// signalled.
    NotOurs,
}

fn pgid(leader: &ProcessIdentity) -> io::Result<Pid> {
    let raw = i32::try_from(leader.pid)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "pid out of range"))?;
    if raw <= 1 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("refusing to signal process group {raw}"),
        ));
    }
    Ok(Pid::from_raw(raw))
}

/// Whether signalling the leader's group can only reach our processes.
pub fn is_ours(leader: &ProcessIdentity) -> io::Result<bool> {
    if liveness::boot_id()? != leader.boot_id {
        return Ok(false);
    }
    Ok(match liveness::start_time(leader.pid)? {
        // The leader itself, or its pid held by nobody: only our group can use the id.
        Some(start_time) => start_time == leader.start_time,
        None => true,
    })
}

/// Whether any live process is left in the group. Zombies do not count: they have exited and
/// only wait for their parent to reap them (the leader waits for ours).
pub fn is_empty(leader: &ProcessIdentity) -> io::Result<bool> {
    let group = pgid(leader)?.as_raw();
    match killpg(Pid::from_raw(group), None) {
        Err(Errno::ESRCH) => return Ok(true),
        Ok(()) | Err(Errno::EPERM) => {}
        Err(errno) => return Err(io::Error::from(errno)),
    }
    // Something answers to the group id; look for a member that is not a zombie.
    for entry in std::fs::read_dir("/proc")? {
        let name = entry?.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|name| name.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue; // it exited while we looked
        };
        let Some(after_name) = stat.rfind(')').map(|end| &stat[end + 1..]) else {
            continue;
        };
        // Fields after the name: state (3), ppid (4), pgrp (5).
        let mut fields = after_name.split_whitespace();
        let state = fields.next();
        let pgrp = fields.nth(1).and_then(|pgrp| pgrp.parse::<i32>().ok());
        if pgrp == Some(group) && state != Some("Z") {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Sends `signal` to the group if it is ours. Returns whether anything was signalled.
pub fn signal(leader: &ProcessIdentity, signal: Signal) -> io::Result<bool> {
    if !is_ours(leader)? {
        return Ok(false);
    }
    match killpg(pgid(leader)?, signal) {
        Ok(()) => Ok(true),
        Err(Errno::ESRCH) => Ok(false),
        Err(errno) => Err(io::Error::from(errno)),
    }
}

/// SIGTERM, up to `grace` for the group to leave, then SIGKILL; returns once the group is
/// verified empty, or with an error if it is still there after SIGKILL and `grace` more.
pub fn terminate(leader: &ProcessIdentity, grace: Duration) -> io::Result<GroupEnd> {
    if !is_ours(leader)? {
        return Ok(GroupEnd::NotOurs);
    }
    if !signal(leader, Signal::SIGTERM)? {
        return Ok(GroupEnd::AlreadyGone);
    }
    if wait_empty(leader, grace)? {
        return Ok(GroupEnd::Terminated);
    }
    signal(leader, Signal::SIGKILL)?;
    if wait_empty(leader, grace.max(Duration::from_secs(1)))? {
        return Ok(GroupEnd::Killed);
    }
    Err(io::Error::other(format!(
        "process group {} still has members after SIGKILL",
        leader.pid
    )))
}

fn wait_empty(leader: &ProcessIdentity, within: Duration) -> io::Result<bool> {
    let deadline = Instant::now() + within;
    loop {
        if is_empty(leader)? {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;
    use std::process::Command;

    fn spawn_group(script: &str) -> (std::process::Child, ProcessIdentity) {
        let child = Command::new("sh")
            .args(["-c", script])
            .process_group(0)
            .spawn()
            .expect("spawn");
        let identity = liveness::identity_of(child.id())
            .expect("read /proc")
            .expect("child alive");
        (child, identity)
    }

    #[test]
    fn terminate_ends_the_leader_and_its_grandchildren() {
        let (mut child, identity) = spawn_group("sleep 60 & sleep 60 & wait");
        assert!(!is_empty(&identity).expect("probe"));
        let end = terminate(&identity, Duration::from_secs(3)).expect("terminate");
        assert!(
            matches!(end, GroupEnd::Terminated | GroupEnd::Killed),
            "{end:?}"
        );
        child.wait().expect("reap");
        assert!(is_empty(&identity).expect("probe"));
    }

    #[test]
    fn a_group_that_ignores_sigterm_is_killed() {
        let dir = tempfile::tempdir().expect("temp dir");
        let ready = dir.path().join("ready");
        let (mut child, identity) = spawn_group(&format!(
            "trap '' TERM; sleep 60 & touch {}; wait; sleep 60",
            ready.display()
        ));
        // Bounded wait for the trap to be in place.
        for _ in 0..500 {
            if ready.exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(ready.exists(), "the group set its trap within 5 s");
        let end = terminate(&identity, Duration::from_millis(300)).expect("terminate");
        assert_eq!(end, GroupEnd::Killed);
        child.wait().expect("reap");
        assert!(is_empty(&identity).expect("probe"));
    }

    #[test]
    fn a_group_of_another_boot_or_a_reused_pid_is_not_signalled() {
        let (mut child, identity) = spawn_group("sleep 60");
        let other_boot = ProcessIdentity {
            boot_id: "another-boot".to_string(),
            ..identity.clone()
        };
        let reused = ProcessIdentity {
            start_time: identity.start_time + 1,
            ..identity.clone()
        };
        for stranger in [other_boot, reused] {
            assert!(!is_ours(&stranger).expect("probe"));
            assert_eq!(
                terminate(&stranger, Duration::from_millis(100)).expect("terminate"),
                GroupEnd::NotOurs
            );
        }
        assert!(
            !is_empty(&identity).expect("probe"),
            "the real group is untouched"
        );
        child.kill().expect("kill");
        child.wait().expect("reap");
    }
}
