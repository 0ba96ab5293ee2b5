//! Is a recorded process still the one we think? A pid alone cannot say: pids are reused, and
//! a reboot resets them. A [`ProcessIdentity`] adds the process's start time (on Linux, clock
//! ticks since boot) and the boot id, and all three must match. The facts come from
//! [`platform`]; this module judges them.
//!
//! Invariant: `is_alive` never mistakes a stranger for the recorded process; when it cannot
//! tell (the platform's facts cannot be read), it says dead only on positive evidence.

use std::io;

use crate::event::ProcessIdentity;
use crate::platform;

/// The facts this module judges come from [`platform`]; they are re-exported here because
/// most callers want them together with [`check`].
pub use crate::platform::{boot_id, current_identity as current, identity_of};

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
    Ok(match platform::process(identity.pid)? {
        Some(process) if process.start_time == identity.start_time && process.is_alive() => {
            Liveness::Alive
        }
        _ => Liveness::Dead,
    })
}

/// Whether the recorded process is still running. An error reading the platform's facts
/// counts as alive, so nothing is declared dead on a failed look.
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
            identity_of(child.id()).expect("read /proc").is_some(),
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
}
