//! Signalling recorded processes and ending a step's process group, and knowing it is gone:
//! the one implementation, used by the runner for its own steps (through a thin async
//! wrapper, `runner::step_process`), by the reconciler for the steps a dead runner left
//! behind, and by `stop` for a runner ([`signal_process`]).
//!
//! Each step runs in its own process group, whose id is the pid of its leader, the step's
//! process, recorded in `StepRunning` by its full identity. A group outlives its leader while
//! members remain, and the kernel does not hand out a pid that is still some group's id, so
//! while any member lives the group id still means our group.
//!
//! Each rule has one home:
//! * ownership, [`is_ours`]: a group is signalled only when a member of it is verified ours —
//!   the leader itself by its recorded identity (alive or a zombie, it holds the group's id),
//!   or, once the leader is gone, a member whose ancestry leads to the live process that owns
//!   the group (the runner, its steps' child subreaper). A group whose id nobody we can verify
//!   holds is left alone: a recycled pid may lead a stranger's group under the same id;
//! * a single process is signalled through a pidfd opened and then checked against its
//!   recorded identity ([`signal_process`]), so the signal cannot reach a process that got its
//!   pid since; without pidfd (macOS, old kernels) the identity is checked right before `kill`;
//! * the zombie rule, [`ProcessInfo::is_alive`]: a zombie member has exited and does not count.
//!   Whoever can reap zombie members ([`Reaping::ZombieMembers`], the runner as a child
//!   subreaper) does, except the leader, whose exit status belongs to whoever waits for it;
//! * ending, [`end`]: SIGTERM, up to the grace for the group to empty, SIGKILL, then the group
//!   verified empty within [`KILL_VERIFY_TIMEOUT`].
//!
//! Nothing recorded in another boot or another PID namespace is ever signalled: its pid means
//! another process here.
//!
//! Invariant: nothing is signalled unless [`is_ours`] (a group) or the recorded identity (a
//! process) said yes just before.
//! Invariant: a group is reported empty only when no member is alive by the zombie rule.

pub mod sweep;

use std::io;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill, killpg};
use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::Pid;

use crate::event::ProcessIdentity;
use crate::liveness::{self, Liveness};
use crate::platform::{self, ProcessInfo};

/// How long a group has, after SIGKILL, to be seen empty before its members are reported as
/// survivors.
pub const KILL_VERIFY_TIMEOUT: Duration = Duration::from_secs(5);

/// How often a group is looked at while waiting for it to empty.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// How many parents up a member's ancestry is followed looking for the group's owner: far
/// deeper than any step's process tree, and a bound on a tree that changes while it is read.
const MAX_ANCESTRY: usize = 4096;

/// Whether the caller reaps zombie members while it waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reaping {
    /// Reap nothing: the caller is not the members' parent (the reconciler, a host), and
    /// reaping a stranger's child would steal its exit status.
    Nothing,
    /// Reap every zombie member that is this process's child, except the leader: the runner,
    /// a child subreaper, inherits its steps' orphans and must not let them pile up.
    ZombieMembers,
}

/// How ending a group went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupEnd {
    /// No member could be verified ours (another boot or PID namespace, the leader's pid held
    /// by another process, or members nobody we know started): nothing was signalled.
    NotOurs,
    /// No member was alive: nothing was signalled.
    AlreadyEmpty,
    /// It emptied after SIGTERM.
    Terminated,
    /// SIGKILL was needed, and then it emptied.
    Killed,
    /// Members were still alive [`KILL_VERIFY_TIMEOUT`] after SIGKILL (or, after SIGTERM,
    /// could no longer be verified ours, so were not sent SIGKILL).
    Survived,
}

/// What sending a signal to a group did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sent {
    Delivered,
    NotOurs,
    NoMember,
}

/// The group id of `leader`'s group, refusing ids that would signal more than one group
/// (`killpg(0)` is the caller's own group, `killpg(1)` init's).
fn group_id(leader: &ProcessIdentity) -> io::Result<Pid> {
    match i32::try_from(leader.pid) {
        Ok(raw) if raw > 1 => Ok(Pid::from_raw(raw)),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("refusing to signal process group {}", leader.pid),
        )),
    }
}

/// Whether signalling `leader`'s group can only reach our processes: same boot and PID
/// namespace, and a member of the group verified ours now —
/// * the leader's pid is held by the recorded leader itself (alive or a zombie): no other
///   group can have its id while it does; or
/// * nobody holds the leader's pid, and a live member's ancestry leads to `owner` (the live
///   process whose descendants the group's processes are: the runner, which inherits its
///   steps' orphans as their subreaper), checked by its full identity.
///
/// Otherwise no: a stranger may have been given the leader's pid once our group emptied, led a
/// group of its own under that id, and exited, leaving its own members there. The reconciler
/// passes the dead runner as `owner`, so it signals only groups whose leader is still there.
pub fn is_ours(leader: &ProcessIdentity, owner: Option<&ProcessIdentity>) -> io::Result<bool> {
    if platform::boot_id()? != leader.boot_id {
        return Ok(false);
    }
    if !liveness::is_same_namespace(leader.pid_namespace, platform::pid_namespace()?) {
        return Ok(false);
    }
    match platform::process(leader.pid)? {
        // A holder whose start time we may not read is another user's: not ours.
        Some(holder) => Ok(holder.start_time == Some(leader.start_time)),
        None => {
            let Some(owner) = owner else {
                return Ok(false);
            };
            if liveness::check(owner)? != Liveness::Alive {
                return Ok(false);
            }
            for member in platform::group_members(leader.pid)? {
                if member.is_alive() && descends_from(&member, owner)? {
                    return Ok(true);
                }
            }
            Ok(false)
        }
    }
}

/// Whether `owner` (alive, checked by the caller) is among `member`'s ancestors, itself
/// included, as the parent links show them now.
fn descends_from(member: &ProcessInfo, owner: &ProcessIdentity) -> io::Result<bool> {
    let mut current = member.clone();
    for _ in 0..MAX_ANCESTRY {
        if current.pid == owner.pid {
            return Ok(current.start_time == Some(owner.start_time));
        }
        if current.parent_pid <= 1 {
            return Ok(false);
        }
        match platform::process(current.parent_pid)? {
            Some(parent) => current = parent,
            // The parent exited while we looked: the member is being handed to a subreaper.
            None => return Ok(false),
        }
    }
    Ok(false)
}

/// Whether no member of `leader`'s group is alive (zombies do not count). A read of the
/// group, whoever owns it now: it signals nothing.
pub fn is_empty(leader: &ProcessIdentity) -> io::Result<bool> {
    look(leader, Reaping::Nothing)
}

/// Sends `signal` to `leader`'s group if it is ours (see [`is_ours`]); whether it reached any
/// member.
pub fn signal(
    leader: &ProcessIdentity,
    owner: Option<&ProcessIdentity>,
    signal: Signal,
) -> io::Result<bool> {
    Ok(send(leader, owner, signal)? == Sent::Delivered)
}

/// Sends `signal` to the process recorded as `identity`, if it is alive by that identity (same
/// boot, same PID namespace, same start time, not a zombie); whether it was sent.
///
/// Through a pidfd opened and then checked, the signal reaches the recorded process or nobody,
/// even if it exits and its pid is reused in between. Where there is no pidfd (macOS, Linux
/// before 5.3, a sandbox refusing the call) the identity is checked again right before `kill`;
/// the window left is between those two calls.
pub fn signal_process(identity: &ProcessIdentity, signal: Signal) -> io::Result<bool> {
    if liveness::check(identity)? != Liveness::Alive {
        return Ok(false);
    }
    signal_opened(identity, signal, platform::open_process(identity.pid))
}

/// [`signal_process`] once the recorded process was opened (`opened`: a pidfd, none, or why
/// not): through the handle, or, where the platform has none, by `kill` right after a check.
fn signal_opened(
    identity: &ProcessIdentity,
    signal: Signal,
    opened: io::Result<Option<platform::ProcessHandle>>,
) -> io::Result<bool> {
    match opened {
        Ok(None) => Ok(false),
        Ok(Some(handle)) => {
            // The handle names the process that held the pid when it was opened; if the
            // recorded process holds it now, it held it then.
            if liveness::check(identity)? != Liveness::Alive {
                return Ok(false);
            }
            handle.signal(signal)
        }
        Err(error) if error.kind() == io::ErrorKind::Unsupported => {
            let pid = i32::try_from(identity.pid).map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("pid {} is out of range", identity.pid),
                )
            })?;
            if liveness::check(identity)? != Liveness::Alive {
                return Ok(false);
            }
            match kill(Pid::from_raw(pid), signal) {
                Ok(()) => Ok(true),
                Err(Errno::ESRCH) => Ok(false),
                Err(errno) => Err(io::Error::from(errno)),
            }
        }
        Err(error) => Err(error),
    }
}

/// Ends `leader`'s group: SIGTERM to every member, up to `grace` for the group to empty,
/// SIGKILL to whatever is left, and up to [`KILL_VERIFY_TIMEOUT`] for it to empty then.
/// Ownership ([`is_ours`], with `owner`) is checked before each signal. Blocks the calling
/// thread while it waits.
pub fn end(
    leader: &ProcessIdentity,
    owner: Option<&ProcessIdentity>,
    grace: Duration,
    reaping: Reaping,
) -> io::Result<GroupEnd> {
    if !is_same_place(leader)? {
        return Ok(GroupEnd::NotOurs);
    }
    if look(leader, reaping)? {
        return Ok(GroupEnd::AlreadyEmpty);
    }
    match send(leader, owner, Signal::SIGTERM)? {
        Sent::Delivered => {}
        Sent::NotOurs => return Ok(GroupEnd::NotOurs),
        Sent::NoMember => return Ok(GroupEnd::AlreadyEmpty),
    }
    if wait_empty(leader, grace, reaping)? {
        return Ok(GroupEnd::Terminated);
    }
    match send(leader, owner, Signal::SIGKILL)? {
        Sent::Delivered => {}
        Sent::NoMember => return Ok(GroupEnd::Terminated),
        // Members no longer verified ours are not signalled: they are reported as survivors
        // unless the group emptied meanwhile.
        Sent::NotOurs => {
            return Ok(if look(leader, reaping)? {
                GroupEnd::Terminated
            } else {
                GroupEnd::Survived
            });
        }
    }
    if wait_empty(leader, KILL_VERIFY_TIMEOUT, reaping)? {
        Ok(GroupEnd::Killed)
    } else {
        Ok(GroupEnd::Survived)
    }
}

/// Whether `leader` was recorded in this boot and PID namespace: elsewhere its pid, and its
/// group's id, name other processes here, which are not even looked at.
fn is_same_place(leader: &ProcessIdentity) -> io::Result<bool> {
    Ok(platform::boot_id()? == leader.boot_id
        && liveness::is_same_namespace(leader.pid_namespace, platform::pid_namespace()?))
}

fn send(
    leader: &ProcessIdentity,
    owner: Option<&ProcessIdentity>,
    signal: Signal,
) -> io::Result<Sent> {
    let group = group_id(leader)?;
    if !is_ours(leader, owner)? {
        return Ok(Sent::NotOurs);
    }
    match killpg(group, signal) {
        Ok(()) => Ok(Sent::Delivered),
        Err(Errno::ESRCH) => Ok(Sent::NoMember),
        Err(errno) => Err(io::Error::other(format!(
            "cannot send {signal} to process group {}: {errno}",
            leader.pid
        ))),
    }
}

/// Reaps what `reaping` allows, then tells whether no member is alive.
fn look(leader: &ProcessIdentity, reaping: Reaping) -> io::Result<bool> {
    let group = group_id(leader)?;
    // Cheap first: a group with no member at all, zombies included, answers ESRCH.
    match killpg(group, None) {
        Err(Errno::ESRCH) => return Ok(true),
        Ok(()) | Err(Errno::EPERM) => {}
        Err(errno) => return Err(io::Error::from(errno)),
    }
    let members = platform::group_members(leader.pid)?;
    if reaping == Reaping::ZombieMembers {
        for member in members.iter().filter(|member| is_reapable(member, leader)) {
            // ECHILD when it is not our child: someone else reaps it, and it does not count.
            let _ = waitpid(
                Pid::from_raw(i32::try_from(member.pid).unwrap_or(i32::MAX)),
                Some(WaitPidFlag::WNOHANG),
            );
        }
    }
    Ok(!members.iter().any(ProcessInfo::is_alive))
}

/// A zombie member other than the leader, whose exit status is its waiter's.
fn is_reapable(member: &ProcessInfo, leader: &ProcessIdentity) -> bool {
    member.is_zombie && member.pid != leader.pid && member.parent_pid == std::process::id()
}

fn wait_empty(leader: &ProcessIdentity, within: Duration, reaping: Reaping) -> io::Result<bool> {
    let deadline = Instant::now() + within;
    loop {
        if look(leader, reaping)? {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;
    use std::process::{Child, Command};

    fn me() -> ProcessIdentity {
        platform::current_identity().expect("identity of this process")
    }

    fn spawn_group(script: &str) -> (Child, ProcessIdentity) {
        let child = Command::new("sh")
            .args(["-c", script])
            .process_group(0)
            .spawn()
            .expect("spawn");
        let identity = platform::identity_of(child.id())
            .expect("read /proc")
            .expect("child alive");
        (child, identity)
    }

    /// Found by mutation testing: the path without a pidfd (macOS, old kernels, sandboxes
    /// refusing the call) never ran here. It kills the recorded process when the platform
    /// cannot open it, only after checking it is still alive; any other failure to open it is
    /// an error and signals nothing.
    #[test]
    fn without_a_pidfd_a_live_process_is_signalled_by_kill_and_other_failures_signal_nothing() {
        use std::os::unix::process::ExitStatusExt;
        let unsupported = || Err(io::Error::from(io::ErrorKind::Unsupported));
        let (mut child, identity) = spawn_group("exec sleep 60");
        let refused = signal_opened(
            &identity,
            Signal::SIGKILL,
            Err(io::Error::from(io::ErrorKind::PermissionDenied)),
        );
        assert!(refused.is_err(), "{refused:?}");
        assert!(
            child.try_wait().expect("try_wait").is_none(),
            "not signalled"
        );
        assert!(
            signal_opened(&identity, Signal::SIGKILL, unsupported()).expect("signal"),
            "sent by kill"
        );
        let status = child.wait().expect("wait");
        assert_eq!(status.signal(), Some(9), "{status}");
        assert!(
            !signal_opened(&identity, Signal::SIGKILL, unsupported()).expect("signal"),
            "a reaped process is not signalled"
        );
    }

    /// Found by mutation testing: a leader recorded in another boot, or in this boot but
    /// another PID namespace, is not ours, even when no group has its id here.
    #[test]
    fn a_leader_of_another_boot_or_namespace_is_never_ours() {
        let mut other_boot = liveness::current().expect("me");
        other_boot.pid = i32::MAX.unsigned_abs();
        other_boot.boot_id = "an-earlier-boot".to_string();
        let mut other_namespace = liveness::current().expect("me");
        other_namespace.pid = i32::MAX.unsigned_abs();
        other_namespace.pid_namespace = Some(other_namespace.pid_namespace.unwrap_or(0) ^ 1);
        let mut here = liveness::current().expect("me");
        here.pid = i32::MAX.unsigned_abs();
        for (leader, expected) in [
            (&other_boot, GroupEnd::NotOurs),
            (&other_namespace, GroupEnd::NotOurs),
            (&here, GroupEnd::AlreadyEmpty),
        ] {
            let ended = end(leader, None, Duration::ZERO, Reaping::Nothing).expect("end");
            assert_eq!(ended, expected, "{leader:?}");
        }
    }

    /// Found by mutation testing: nothing checked the ids that would signal more than one
    /// group. `killpg(0)` is the caller's own group (and pid 0 is held by no process, so the
    /// ownership check alone would let it through); `killpg(1)`, init's. Checked on the id
    /// alone: a broken guard must not get to signal the test's own group.
    #[test]
    fn the_ids_of_the_callers_group_and_inits_are_refused() {
        let leader = |pid| ProcessIdentity {
            pid,
            start_time: 1,
            boot_id: "boot".to_string(),
            pid_namespace: None,
        };
        for pid in [0, 1] {
            let error = group_id(&leader(pid)).expect_err("refused");
            assert_eq!(error.kind(), io::ErrorKind::InvalidInput, "pid {pid}");
        }
        assert_eq!(group_id(&leader(2)).expect("a group id"), Pid::from_raw(2));
    }

    /// Found by mutation testing: nothing checked that `signal` delivers, nor what it answers.
    #[test]
    fn signal_reaches_a_live_group_and_says_whether_it_did() {
        use std::os::unix::process::ExitStatusExt;
        let (mut child, identity) = spawn_group("exec sleep 60");
        assert!(
            signal(&identity, None, Signal::SIGKILL).expect("signal"),
            "delivered"
        );
        let status = child.wait().expect("wait");
        assert_eq!(status.signal(), Some(9), "{status}");
        assert!(
            !signal(&identity, None, Signal::SIGKILL).expect("signal"),
            "an emptied group has no member to reach"
        );
    }

    fn live_members(leader: &ProcessIdentity) -> Vec<u32> {
        platform::group_members(leader.pid)
            .expect("members")
            .into_iter()
            .filter(ProcessInfo::is_alive)
            .map(|member| member.pid)
            .collect()
    }

    /// Bounded wait until `leader`'s group has at least `count` live members.
    fn wait_for_members(leader: &ProcessIdentity, count: usize) -> Vec<u32> {
        let mut members = Vec::new();
        for _ in 0..500 {
            members = live_members(leader);
            if members.len() >= count {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(members.len() >= count, "the group has {members:?}");
        members
    }

    #[test]
    fn sigterm_suffices_for_a_group_that_heeds_it() {
        let (mut child, identity) = spawn_group("sleep 60 & sleep 60 & wait");
        wait_for_members(&identity, 3);
        // A long grace costs nothing when the group leaves at once.
        let end = end(
            &identity,
            Some(&me()),
            Duration::from_secs(60),
            Reaping::Nothing,
        )
        .expect("end");
        assert_eq!(end, GroupEnd::Terminated);
        assert!(is_empty(&identity).expect("probe"));
        let status = child.wait().expect("reap the leader");
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(15),
            "the leader's status is left to its waiter"
        );
    }

    /// Found by mutation testing: nothing checked that `end` gives a group its grace. This one
    /// heeds SIGTERM, but takes a moment (its trap) to leave: it must be let go, not killed.
    #[test]
    fn a_group_that_takes_a_moment_to_heed_sigterm_gets_its_grace() {
        let dir = tempfile::tempdir().expect("temp dir");
        let ready = dir.path().join("ready");
        let (mut child, identity) = spawn_group(&format!(
            "trap 'sleep 0.3; exit 0' TERM; touch {}; while :; do sleep 1; done",
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
        let end = end(&identity, None, Duration::from_secs(60), Reaping::Nothing).expect("end");
        assert_eq!(end, GroupEnd::Terminated);
        let status = child.wait().expect("reap the leader");
        assert_eq!(status.code(), Some(0), "it left by its trap: {status}");
    }

    #[test]
    fn grandchildren_in_the_group_are_ended_too() {
        let (mut child, identity) =
            spawn_group("sh -c 'sleep 60 & sleep 60 & wait' & sleep 60 & wait");
        let members = wait_for_members(&identity, 5);
        let end = end(
            &identity,
            Some(&me()),
            Duration::from_secs(60),
            Reaping::Nothing,
        )
        .expect("end");
        assert!(
            matches!(end, GroupEnd::Terminated | GroupEnd::Killed),
            "{end:?}"
        );
        child.wait().expect("reap");
        for member in members {
            assert!(
                platform::process(member)
                    .expect("read")
                    .is_none_or(|process| !process.is_alive() || process.group_id != identity.pid),
                "member {member} survived"
            );
        }
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
        let end = end(
            &identity,
            Some(&me()),
            Duration::from_millis(300),
            Reaping::Nothing,
        )
        .expect("end");
        assert_eq!(end, GroupEnd::Killed);
        child.wait().expect("reap");
        assert!(is_empty(&identity).expect("probe"));
    }

    #[test]
    fn a_group_of_another_boot_or_a_reused_pid_is_not_signalled() {
        let (mut child, identity) = spawn_group("exec sleep 60");
        let other_boot = ProcessIdentity {
            boot_id: "another-boot".to_string(),
            ..identity.clone()
        };
        let reused = ProcessIdentity {
            start_time: identity.start_time + 1,
            ..identity.clone()
        };
        let other_namespace = ProcessIdentity {
            pid_namespace: Some(identity.pid_namespace.unwrap_or(0).wrapping_add(1)),
            ..identity.clone()
        };
        for stranger in [other_boot, reused, other_namespace] {
            assert!(!is_ours(&stranger, Some(&me())).expect("probe"));
            assert!(!signal(&stranger, Some(&me()), Signal::SIGKILL).expect("signal"));
            assert_eq!(
                end(
                    &stranger,
                    Some(&me()),
                    Duration::from_millis(100),
                    Reaping::Nothing
                )
                .expect("end"),
                GroupEnd::NotOurs
            );
            assert!(!signal_process(&stranger, Signal::SIGKILL).expect("signal"));
        }
        assert!(is_ours(&identity, None).expect("probe"));
        assert_eq!(
            live_members(&identity),
            vec![identity.pid],
            "the real group is untouched"
        );
        child.kill().expect("kill");
        child.wait().expect("reap");
    }

    #[test]
    fn a_pid_held_by_nobody_is_not_ours_and_its_empty_group_is_left_alone() {
        let (mut child, identity) = spawn_group("exit 0");
        child.wait().expect("reap");
        assert!(
            !is_ours(&identity, Some(&me())).expect("probe"),
            "no member is left to verify"
        );
        assert_eq!(
            end(
                &identity,
                Some(&me()),
                Duration::from_millis(100),
                Reaping::Nothing
            )
            .expect("end"),
            GroupEnd::AlreadyEmpty
        );
    }

    /// Once the leader is gone, a group is ours through a member whose ancestry leads to the
    /// owner, and only then: the same group is not verified for an owner that is not its
    /// members' ancestor, nor without an owner.
    #[test]
    fn a_leaderless_group_is_ours_only_through_a_member_descending_from_the_owner() {
        let (mut leader, identity) = spawn_group("exec sleep 60");
        // A child of this process joins the leader's group, so its ancestry leads here.
        let mut member = Command::new("sleep")
            .arg("60")
            .process_group(i32::try_from(identity.pid).expect("pid fits"))
            .spawn()
            .expect("spawn a member");
        let (mut unrelated, unrelated_identity) = spawn_group("exec sleep 60");
        leader.kill().expect("kill the leader");
        leader.wait().expect("reap the leader");
        assert_eq!(platform::process(identity.pid).expect("read"), None);
        assert_eq!(live_members(&identity), vec![member.id()]);
        assert!(!is_ours(&identity, None).expect("probe"), "no owner");
        assert!(
            !is_ours(&identity, Some(&unrelated_identity)).expect("probe"),
            "an owner that is not the member's ancestor"
        );
        assert!(is_ours(&identity, Some(&me())).expect("probe"));
        assert_eq!(
            end(
                &identity,
                Some(&unrelated_identity),
                Duration::from_millis(100),
                Reaping::Nothing
            )
            .expect("end"),
            GroupEnd::NotOurs
        );
        assert_eq!(member.try_wait().expect("try_wait"), None, "untouched");
        assert_eq!(
            end(
                &identity,
                Some(&me()),
                Duration::from_secs(60),
                Reaping::Nothing
            )
            .expect("end"),
            GroupEnd::Terminated
        );
        member.wait().expect("reap the member");
        unrelated.kill().expect("kill");
        unrelated.wait().expect("reap");
    }

    #[test]
    fn a_live_process_is_signalled_by_its_identity_and_a_reused_pid_is_not() {
        let (mut child, identity) = spawn_group("exec sleep 60");
        let reused = ProcessIdentity {
            start_time: identity.start_time + 1,
            ..identity.clone()
        };
        assert!(!signal_process(&reused, Signal::SIGKILL).expect("signal"));
        assert_eq!(child.try_wait().expect("try_wait"), None, "still running");
        assert!(signal_process(&identity, Signal::SIGKILL).expect("signal"));
        let status = child.wait().expect("reap");
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9)
        );
        assert!(
            !signal_process(&identity, Signal::SIGKILL).expect("signal"),
            "gone: not signalled"
        );
    }

    #[test]
    fn a_zombie_member_does_not_count_and_only_non_leaders_are_reaped() {
        // The leader, our child, sleeps; a second child of ours joins its group and exits.
        let (mut leader, identity) = spawn_group("exec sleep 60");
        let member = Command::new("true")
            .process_group(i32::try_from(identity.pid).expect("pid fits"))
            .spawn()
            .expect("spawn a member");
        let member_pid = member.id();
        // Bounded wait for the member to be a zombie.
        for _ in 0..500 {
            if platform::process(member_pid)
                .expect("read")
                .is_some_and(|process| process.is_zombie)
            {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!is_empty(&identity).expect("probe"), "the leader is alive");
        leader.kill().expect("kill the leader");
        // Bounded wait for the leader to be a zombie too: then nothing in the group is alive,
        // though both are still in it.
        let mut is_group_empty = false;
        for _ in 0..500 {
            is_group_empty = is_empty(&identity).expect("probe");
            if is_group_empty {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(
            is_group_empty,
            "zombies do not count: {:?}",
            platform::group_members(identity.pid)
        );
        assert_eq!(
            platform::group_members(identity.pid)
                .expect("members")
                .len(),
            2,
            "both zombies are still there"
        );
        assert_eq!(
            end(
                &identity,
                Some(&me()),
                Duration::from_millis(100),
                Reaping::ZombieMembers
            )
            .expect("end"),
            GroupEnd::AlreadyEmpty
        );
        assert_eq!(
            platform::process(member_pid).expect("read"),
            None,
            "the member, our child, was reaped"
        );
        let status = leader.wait().expect("the leader was left to its waiter");
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9)
        );
        drop(member);
    }
}
