//! Process identities for tests to record as a runner's or a step's: made-up ones of a boot no
//! machine has, and the identity of a real process that has exited. None of them is ever
//! taken for alive or signalled.

use crate::event::ProcessIdentity;
use crate::liveness;

/// The boot of an [`identity`]: no machine has it.
pub const BOOT_ID: &str = "test-boot";

/// The PID namespace of a [`namespaced_identity`] (Linux's initial one), as a runner records
/// its processes: it must reach the journal as it was sent, through a commit leader too.
pub const PID_NAMESPACE: u64 = 4_026_531_836;

/// Process `pid` of a boot no machine has ([`BOOT_ID`]), without a PID namespace: never
/// alive, never signalled.
pub fn identity(pid: u32) -> ProcessIdentity {
    ProcessIdentity {
        pid,
        start_time: 7,
        boot_id: BOOT_ID.to_string(),
        pid_namespace: None,
    }
}

/// Process `pid` of a boot whose id has the shape of a real one (a UUID, as Linux reports it),
/// for what measures the size of records: never alive, never signalled all the same.
pub fn uuid_boot_identity(pid: u32) -> ProcessIdentity {
    ProcessIdentity {
        pid,
        start_time: 1_234_567,
        boot_id: "6f1c9b52-3d4e-4a8b-9c1d-2e3f4a5b6c7d".to_string(),
        pid_namespace: None,
    }
}

/// [`identity`] recorded in [`PID_NAMESPACE`].
pub fn namespaced_identity(pid: u32) -> ProcessIdentity {
    ProcessIdentity {
        pid_namespace: Some(PID_NAMESPACE),
        ..identity(pid)
    }
}

/// The identity of a real process of this machine that has exited and been reaped (a `true`
/// this function ran): whoever looks finds it dead.
pub fn exited_identity() -> ProcessIdentity {
    let mut child = std::process::Command::new("true")
        .spawn()
        .expect("`true` starts");
    let identity = liveness::identity_of(child.id())
        .expect("/proc reads")
        .expect("the child is in /proc until it is reaped");
    child.wait().expect("the child is reaped");
    identity
}
