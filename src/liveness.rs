//! Is a recorded process still the one we think? A pid alone cannot say: pids are reused, and
//! a reboot resets them. A [`ProcessIdentity`] adds the process's start time (clock ticks
//! since boot) and the boot id, and all three must match.
//!
//! Invariant: `is_alive` never mistakes a stranger for the recorded process; when it cannot
//! tell (no /proc), it says dead only on positive evidence.

use std::fs;
use std::io;

use crate::event::ProcessIdentity;

/// The id of the current boot, from `/proc/sys/kernel/random/boot_id`.
pub fn boot_id() -> io::Result<String> {
    Ok(fs::read_to_string("/proc/sys/kernel/random/boot_id")?
        .trim()
        .to_string())
}

/// Start time of `pid` in clock ticks since boot (`/proc/<pid>/stat`, field 22); `None` when
/// no such process exists.
pub fn start_time(pid: u32) -> io::Result<Option<u64>> {
    Ok(stat(pid)?.map(|(_, start_time)| start_time))
}

/// State letter (field 3) and start time (field 22) of `pid`; `None` when it does not exist.
fn stat(pid: u32) -> io::Result<Option<(char, u64)>> {
    let stat = match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(error),
    };
    // The command name (field 2) is in parentheses and may hold spaces or parentheses itself;
    // the fields after the last ')' are plain.
    let after_name = stat
        .rfind(')')
        .map(|end| &stat[end + 1..])
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no ')' in /proc stat"))?;
    // after_name starts at field 3 (state); start time is field 22.
    let too_short = || io::Error::new(io::ErrorKind::InvalidData, "/proc stat has too few fields");
    let mut fields = after_name.split_whitespace();
    let state = fields
        .next()
        .and_then(|state| state.chars().next())
        .ok_or_else(too_short)?;
    let start_time = fields
        .nth(22 - 4)
        .ok_or_else(too_short)?
        .parse()
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "start time is not a number"))?;
    Ok(Some((state, start_time)))
}

/// The identity of a live process; `None` when it does not exist.
pub fn identity_of(pid: u32) -> io::Result<Option<ProcessIdentity>> {
    let Some(start_time) = start_time(pid)? else {
        return Ok(None);
    };
    Ok(Some(ProcessIdentity {
        pid,
        start_time,
        boot_id: boot_id()?,
    }))
}

/// The identity of this process.
pub fn current() -> io::Result<ProcessIdentity> {
    identity_of(std::process::id())?
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "this process is not in /proc"))
}

/// What we know of a recorded process now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// Same boot, pid present, same start time, and not a zombie.
    Alive,
    /// Gone: no such pid, the pid now belongs to another process, or the process has exited
    /// and waits as a zombie for a parent that may never reap it.
    Dead,
    /// Recorded in another boot: gone, and its pid means nothing now.
    OtherBoot,
}

/// Checks a recorded identity against the live system.
pub fn check(identity: &ProcessIdentity) -> io::Result<Liveness> {
    if boot_id()? != identity.boot_id {
        return Ok(Liveness::OtherBoot);
    }
    Ok(match stat(identity.pid)? {
        Some((state, start_time)) if start_time == identity.start_time && state != 'Z' => {
            Liveness::Alive
        }
        _ => Liveness::Dead,
    })
}

/// Whether the recorded process is still running. An error reading /proc counts as alive, so
/// nothing is declared dead on a failed look.
pub fn is_alive(identity: &ProcessIdentity) -> bool {
    !matches!(check(identity), Ok(Liveness::Dead | Liveness::OtherBoot))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_current_process_is_alive() {
        let me = current().expect("identity of this process");
        assert_eq!(me.pid, std::process::id());
        assert!(is_alive(&me));
        assert_eq!(check(&me).expect("check"), Liveness::Alive);
    }

    #[test]
    fn a_reused_pid_is_dead() {
        let me = current().expect("identity of this process");
        let stranger = ProcessIdentity {
            start_time: me.start_time + 1,
            ..me
        };
        assert_eq!(check(&stranger).expect("check"), Liveness::Dead);
        assert!(!is_alive(&stranger));
    }

    #[test]
    fn an_identity_from_another_boot_is_dead() {
        let me = current().expect("identity of this process");
        let before_reboot = ProcessIdentity {
            boot_id: "00000000-0000-0000-0000-000000000000".to_string(),
            ..me
        };
        assert_eq!(check(&before_reboot).expect("check"), Liveness::OtherBoot);
        assert!(!is_alive(&before_reboot));
    }

    #[test]
    fn an_unreaped_zombie_is_dead() {
        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("spawn true");
        let identity = identity_of(child.id())
            .expect("read /proc")
            .expect("child exists until reaped");
        // Bounded wait for the child to exit; it stays a zombie until we reap it.
        for _ in 0..500 {
            if check(&identity).expect("check") == Liveness::Dead {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(check(&identity).expect("check"), Liveness::Dead);
        assert!(
            start_time(child.id()).expect("read /proc").is_some(),
            "still in /proc as a zombie"
        );
        child.wait().expect("reap");
    }

    #[test]
    fn an_exited_process_is_dead() {
        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("spawn true");
        let identity = identity_of(child.id())
            .expect("read /proc")
            .expect("child exists until reaped");
        child.wait().expect("wait");
        assert_eq!(check(&identity).expect("check"), Liveness::Dead);
    }

    #[test]
    fn a_command_name_with_spaces_and_parentheses_parses() {
        // /proc/<pid>/stat shows the name in parentheses; a name that holds ") " must not
        // shift the fields after it.
        let dir = tempfile::tempdir().expect("temp dir");
        let tricky = dir.path().join("a) 1 2 (b");
        std::os::unix::fs::symlink("/bin/sleep", &tricky).expect("symlink");
        let mut child = std::process::Command::new(&tricky)
            .arg("30")
            .spawn()
            .expect("spawn");
        let identity = identity_of(child.id()).expect("read /proc").expect("alive");
        let stat = fs::read_to_string(format!("/proc/{}/stat", child.id())).expect("stat");
        assert!(stat.contains("(a) 1 2 (b)"), "{stat}");
        assert_eq!(check(&identity).expect("check"), Liveness::Alive);
        let me = current().expect("identity");
        assert!(identity.start_time >= me.start_time);
        child.kill().expect("kill");
        child.wait().expect("wait");
    }
}
