//! Is a recorded process still the one we think? A pid alone cannot say: pids are reused, and
//! a reboot resets them. A [`ProcessIdentity`] adds the process's start time (on Linux, clock
//! ticks since boot; on macOS, microseconds since the epoch) and the boot id, and all three
//! must match. The facts come from [`platform`]; this module judges them ([`judge`], pure).
//!
//! A pid is a number in one PID namespace. A process recorded in another namespace than the
//! observer's (a reader in a sandbox or a container with a namespace of its own, looking at a
//! runner outside it, or the reverse) is [`Liveness::OtherNamespace`]: neither alive nor dead
//! to this observer, who can neither see it nor tell it from a stranger holding the same
//! number here, and so must neither repair nor signal it. An identity recorded without a
//! namespace (by a version before namespaces were recorded, or on a platform without them) is
//! judged as of the observer's namespace, as the version that wrote it judged it.
//!
//! A process the platform cannot see is judged on both platforms the same way, and never
//! alive: a pid no process holds (or none this user can see) is [`Liveness::Dead`]; a pid
//! held by a process whose start time this user may not read (another user's process on
//! macOS, when we are not root) is [`Liveness::Dead`] too, because the process we recorded
//! ran as this user and one's own processes are always readable — the pid was reused by a
//! stranger. (A runner started by root in a user's home is therefore judged dead by that
//! user's reconciler: run it as the runner's user.) [`check`] fails only when the platform
//! could not look at all (the boot id or the process table unreadable); that is no answer
//! about the process, and [`is_alive`] then errs towards alive for that one look.
//!
//! Invariant: `is_alive` never mistakes a stranger for the recorded process; when it cannot
//! tell (the platform's facts cannot be read), it says dead only on positive evidence.

use std::io;

use crate::event::ProcessIdentity;
use crate::platform::{self, ProcessInfo};

/// The facts this module judges come from [`platform`]; they are re-exported here because
/// most callers want them together with [`check`].
pub use crate::platform::{boot_id, current_identity as current, identity_of, pid_namespace};

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
    /// Recorded in another PID namespace than the observer's: unknown here. Never repaired
    /// or signalled from here; an observer in its own namespace can tell.
    OtherNamespace,
}

/// Whether an identity recorded in the PID namespace `recorded` can be judged by an observer
/// in `current` (pure): the same namespace, or one recorded without a namespace (judged as
/// the observer's own). One recorded with a namespace cannot be judged where none can be read.
pub fn is_same_namespace(recorded: Option<u64>, current: Option<u64>) -> bool {
    match (recorded, current) {
        (None, _) => true,
        (Some(recorded), Some(current)) => recorded == current,
        (Some(_), None) => false,
    }
}

/// Checks a recorded identity against the live system.
pub fn check(identity: &ProcessIdentity) -> io::Result<Liveness> {
    let current_boot_id = boot_id()?;
    if current_boot_id != identity.boot_id {
        return Ok(Liveness::OtherBoot);
    }
    let current_namespace = pid_namespace()?;
    if !is_same_namespace(identity.pid_namespace, current_namespace) {
        return Ok(Liveness::OtherNamespace);
    }
    let holder = platform::process(identity.pid)?;
    Ok(judge(
        identity,
        &current_boot_id,
        current_namespace,
        holder.as_ref(),
    ))
}

/// Judges what the platform shows now under a recorded identity's pid (`holder`, `None`
/// when no visible process holds it), in the boot `current_boot_id` and the PID namespace
/// `current_namespace`. Pure: the one place where a missing, reused, unreadable or zombie
/// process, or one of another boot or namespace, is decided.
pub fn judge(
    recorded: &ProcessIdentity,
    current_boot_id: &str,
    current_namespace: Option<u64>,
    holder: Option<&ProcessInfo>,
) -> Liveness {
    if recorded.boot_id != current_boot_id {
        return Liveness::OtherBoot;
    }
    if !is_same_namespace(recorded.pid_namespace, current_namespace) {
        return Liveness::OtherNamespace;
    }
    match holder {
        // `start_time` is `None` when it is not ours to read: never equal to a recorded one.
        Some(process)
            if process.pid == recorded.pid
                && process.start_time == Some(recorded.start_time)
                && process.is_alive() =>
        {
            Liveness::Alive
        }
        _ => Liveness::Dead,
    }
}

/// Whether the recorded process may still be running: not known dead. An error reading the
/// platform's facts counts as alive, so nothing is declared dead on a failed look, and so does
/// a process of another PID namespace. Never a reason to signal it: that takes
/// [`Liveness::Alive`].
pub fn is_alive(identity: &ProcessIdentity) -> bool {
    !matches!(check(identity), Ok(Liveness::Dead | Liveness::OtherBoot))
}

/// A kill point of the tests, in builds with the `testkit` feature: when the environment
/// variable `env` names a file, the process that finds it there removes it and SIGKILLs
/// itself (so only the first process to pass the point dies). Nothing in other builds.
#[cfg(feature = "testkit")]
pub fn die_here_if_asked(env: &str) {
    let Some(path) = std::env::var_os(env) else {
        return;
    };
    if std::fs::remove_file(path).is_ok() {
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    }
}

/// Nothing: kill points are only in builds with the `testkit` feature.
#[cfg(not(feature = "testkit"))]
pub fn die_here_if_asked(_env: &str) {}

#[cfg(test)]
mod tests {
    use super::*;

    const NAMESPACE: u64 = 4_026_531_836;

    fn recorded() -> ProcessIdentity {
        ProcessIdentity {
            pid: 42,
            start_time: 1_700_000_000_123_456,
            boot_id: "3f6a8e4b-1c2d-4e5f-8a9b-0c1d2e3f4a5b".to_string(),
            pid_namespace: Some(NAMESPACE),
        }
    }

    fn holder(start_time: Option<u64>, is_zombie: bool) -> ProcessInfo {
        ProcessInfo {
            pid: 42,
            parent_pid: 1,
            group_id: 42,
            start_time,
            is_zombie,
        }
    }

    #[test]
    fn every_kind_of_holder_is_judged() {
        let recorded = recorded();
        let boot = recorded.boot_id.clone();
        let same_start = Some(recorded.start_time);
        let cases = [
            (
                "the recorded process",
                Some(holder(same_start, false)),
                Liveness::Alive,
            ),
            ("no process holds the pid", None, Liveness::Dead),
            ("a zombie", Some(holder(same_start, true)), Liveness::Dead),
            (
                "a stranger reusing the pid",
                Some(holder(Some(recorded.start_time + 1), false)),
                Liveness::Dead,
            ),
            (
                "a process whose start time this user may not read",
                Some(holder(None, false)),
                Liveness::Dead,
            ),
        ];
        let here = Some(NAMESPACE);
        for (case, holder, expected) in cases {
            assert_eq!(
                judge(&recorded, &boot, here, holder.as_ref()),
                expected,
                "{case}"
            );
        }
        assert_eq!(
            judge(
                &recorded,
                "another-boot",
                here,
                Some(&holder(same_start, false))
            ),
            Liveness::OtherBoot,
            "another boot, whatever holds the pid"
        );
        for (case, holder) in [
            (
                "the same pid and start time",
                Some(holder(same_start, false)),
            ),
            ("nobody", None),
            ("a stranger", Some(holder(Some(1), false))),
        ] {
            assert_eq!(
                judge(&recorded, &boot, Some(NAMESPACE + 1), holder.as_ref()),
                Liveness::OtherNamespace,
                "seen from another namespace: {case}"
            );
            assert_eq!(
                judge(&recorded, &boot, None, holder.as_ref()),
                Liveness::OtherNamespace,
                "seen where no namespace can be read: {case}"
            );
        }
        let unrecorded = ProcessIdentity {
            pid_namespace: None,
            ..recorded.clone()
        };
        for current in [Some(NAMESPACE), Some(NAMESPACE + 1), None] {
            assert_eq!(
                judge(
                    &unrecorded,
                    &boot,
                    current,
                    Some(&holder(same_start, false))
                ),
                Liveness::Alive,
                "recorded without a namespace: judged as here ({current:?})"
            );
            assert_eq!(
                judge(&unrecorded, &boot, current, None),
                Liveness::Dead,
                "recorded without a namespace: judged as here ({current:?})"
            );
        }
    }

    #[test]
    fn an_identity_of_another_namespace_is_unknown_and_counts_as_alive() {
        let me = current().expect("identity of this process");
        let elsewhere = ProcessIdentity {
            pid_namespace: Some(me.pid_namespace.unwrap_or(0).wrapping_add(1)),
            ..me
        };
        assert_eq!(check(&elsewhere).expect("check"), Liveness::OtherNamespace);
        assert!(is_alive(&elsewhere), "not known dead");
    }

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
        let identity = crate::testkit::exited_identity();
        assert_eq!(check(&identity).expect("check"), Liveness::Dead);
    }
}
