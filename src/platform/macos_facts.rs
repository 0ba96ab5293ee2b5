//! The pure half of the macOS implementation: every decision `macos.rs` takes on what the
//! kernel answered, as functions of plain values. It holds no system call, so it is compiled
//! and unit-tested on Linux too (under `cfg(test)`), where no macOS kernel can be asked.
//!
//! The values come from `proc_pidinfo` (`PROC_PIDTBSDINFO`, `PROC_PIDT_SHORTBSDINFO`),
//! `proc_listpgrppids` / `proc_listchildpids`, and `sysctlbyname` (`kern.bootsessionuuid`,
//! `kern.boottime`). The errno values used here (EPERM 1, ESRCH 3, EACCES 13) are the same
//! on Linux and macOS, so the decisions tested here are the ones macOS takes.

use std::io;

use super::ProcessInfo;

/// `p_stat` of a process that has exited and waits to be reaped (`SZOMB` in XNU's
/// `sys/proc.h`; `macos.rs` checks it against `libc::SZOMB` at compile time).
pub(super) const SZOMB: u32 = 5;

/// Microseconds in a second: `pbi_start_tvusec` and `kern.boottime`'s `tv_usec` stay below.
const MICROSECONDS_PER_SECOND: u64 = 1_000_000;

/// What `proc_pidinfo(PROC_PIDTBSDINFO)` says of a pid, copied out of `libc::proc_bsdinfo`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct BsdInfo {
    pub pid: u32,
    pub parent_pid: u32,
    pub group_id: u32,
    /// `p_stat`: `SIDL`, `SRUN`, `SSLEEP`, `SSTOP` or [`SZOMB`].
    pub status: u32,
    pub start_seconds: u64,
    pub start_microseconds: u64,
}

/// What `proc_pidinfo(PROC_PIDT_SHORTBSDINFO)` says of a pid: no start time, but the
/// kernel answers it for every user's process (`PROC_PIDTBSDINFO` only for one's own, or
/// for root).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ShortBsdInfo {
    pub pid: u32,
    pub parent_pid: u32,
    pub group_id: u32,
    pub status: u32,
}

/// What one `proc_pidinfo` call came to.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum PidInfoAnswer {
    /// The kernel filled the whole structure.
    Filled,
    /// No process holds the pid (`ESRCH`): not even a zombie, since we ask with `arg = 1`,
    /// which makes the kernel look among zombies too.
    NoProcess,
    /// A process holds the pid, but this user may not read this flavor of it (`EPERM` or
    /// `EACCES`: another user's process, and we are not root).
    NotPermitted,
    /// Anything else: the look itself failed, and says nothing about the process.
    Failed { errno: i32 },
    /// The kernel wrote fewer bytes than the structure holds: a kernel whose structure
    /// differs from the one we were built against.
    Short { written_bytes: usize },
}

/// Reads `proc_pidinfo`'s return value: the number of bytes written, or 0 with `errno` set.
pub(super) fn pidinfo_answer(returned: i32, structure_bytes: usize, errno: i32) -> PidInfoAnswer {
    match usize::try_from(returned) {
        Ok(written_bytes) if written_bytes >= structure_bytes => PidInfoAnswer::Filled,
        Ok(0) | Err(_) => match errno {
            nix::libc::ESRCH => PidInfoAnswer::NoProcess,
            nix::libc::EPERM | nix::libc::EACCES => PidInfoAnswer::NotPermitted,
            errno => PidInfoAnswer::Failed { errno },
        },
        Ok(written_bytes) => PidInfoAnswer::Short { written_bytes },
    }
}

/// Why the kernel's facts about a process could not be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub(super) enum FactError {
    #[error("proc_pidinfo for pid {asked} answered for pid {answered}")]
    OtherPid { asked: u32, answered: u32 },
    #[error("pid {pid}: start time {seconds} s {microseconds} us is not a time")]
    BadStartTime {
        pid: u32,
        seconds: u64,
        microseconds: u64,
    },
    #[error("proc_pidinfo for pid {pid} wrote {written_bytes} bytes, fewer than its structure")]
    Short { pid: u32, written_bytes: usize },
}

impl From<FactError> for io::Error {
    fn from(error: FactError) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, error)
    }
}

/// A start time as one number: microseconds since the Unix epoch, so a pid reused within the
/// same second is still told apart. The kernel stores it once, at fork, so it never moves
/// (unlike the boot time, see [`boot_id_from_boot_time`]).
pub(super) fn start_time_microseconds(
    pid: u32,
    seconds: u64,
    microseconds: u64,
) -> Result<u64, FactError> {
    let bad = || FactError::BadStartTime {
        pid,
        seconds,
        microseconds,
    };
    if microseconds >= MICROSECONDS_PER_SECOND {
        return Err(bad());
    }
    seconds
        .checked_mul(MICROSECONDS_PER_SECOND)
        .and_then(|whole| whole.checked_add(microseconds))
        .ok_or_else(bad)
}

/// The facts of `asked`, from a filled `proc_bsdinfo`.
pub(super) fn process_info(asked: u32, info: &BsdInfo) -> Result<ProcessInfo, FactError> {
    if info.pid != asked {
        return Err(FactError::OtherPid {
            asked,
            answered: info.pid,
        });
    }
    Ok(ProcessInfo {
        pid: info.pid,
        parent_pid: info.parent_pid,
        group_id: info.group_id,
        start_time: Some(start_time_microseconds(
            info.pid,
            info.start_seconds,
            info.start_microseconds,
        )?),
        is_zombie: info.status == SZOMB,
    })
}

/// The facts of `asked`, from a filled `proc_bsdshortinfo`: another user's process, whose
/// start time this user may not read. It has no identity we could have recorded.
pub(super) fn unreadable_process_info(
    asked: u32,
    info: &ShortBsdInfo,
) -> Result<ProcessInfo, FactError> {
    if info.pid != asked {
        return Err(FactError::OtherPid {
            asked,
            answered: info.pid,
        });
    }
    Ok(ProcessInfo {
        pid: info.pid,
        parent_pid: info.parent_pid,
        group_id: info.group_id,
        start_time: None,
        is_zombie: info.status == SZOMB,
    })
}

/// The boot id from `kern.bootsessionuuid`: a UUID the kernel makes at every boot, like
/// Linux's `boot_id`. Lower-cased, checked to be a UUID (it is stored in the journal and put
/// into file names). The value may end in NUL bytes (a C string).
pub(super) fn boot_id_from_session_uuid(bytes: &[u8]) -> io::Result<String> {
    let text = std::str::from_utf8(bytes)
        .map_err(|_| invalid_boot_id(&String::from_utf8_lossy(bytes)))?
        .trim_end_matches('\0')
        .trim();
    let groups: Vec<&str> = text.split('-').collect();
    let is_uuid = groups.iter().map(|group| group.len()).eq([8, 4, 4, 4, 12])
        && groups
            .iter()
            .all(|group| group.bytes().all(|byte| byte.is_ascii_hexdigit()));
    if !is_uuid {
        return Err(invalid_boot_id(text));
    }
    Ok(text.to_ascii_lowercase())
}

fn invalid_boot_id(text: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("kern.bootsessionuuid {text:?} is not a UUID"),
    )
}

/// The boot id of a kernel without `kern.bootsessionuuid`: `kern.boottime`, as
/// `boottime-<seconds>-<microseconds>`. Only a fallback: XNU moves the boot time whenever the
/// calendar clock is set (`clock_set_calendar_microtime` adjusts it by the step), so a clock
/// step would make every process recorded before it look like one of another boot.
pub(super) fn boot_id_from_boot_time(seconds: u64, microseconds: u64) -> io::Result<String> {
    if seconds == 0 || microseconds >= MICROSECONDS_PER_SECOND {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("kern.boottime {seconds} s {microseconds} us is not a boot time"),
        ));
    }
    Ok(format!("boottime-{seconds}-{microseconds:06}"))
}

/// The pids a `proc_list*pids` call wrote into `buffer` (its return value `count` is the
/// number of pids), or `None` when the buffer may have been too small to hold them all and
/// the call must be made again with a bigger one. Pid 0 (the kernel) and negative values are
/// never members of a group or children we could act on, so they are left out.
pub(super) fn listed_pids(count: i32, buffer: &[i32]) -> Option<Vec<u32>> {
    let count = usize::try_from(count).unwrap_or(0);
    if count >= buffer.len() {
        return None;
    }
    let mut pids: Vec<u32> = buffer[..count]
        .iter()
        .filter_map(|&pid| u32::try_from(pid).ok())
        .filter(|&pid| pid > 0)
        .collect();
    pids.sort_unstable();
    pids.dedup();
    Some(pids)
}

/// Whether `F_PREALLOCATE` failed in a way that writing zeros can work around: the file
/// system does not support it. A full disk (or anything else) is answered as it is.
pub(super) fn preallocation_falls_back_to_zeros(error: &io::Error) -> bool {
    error.kind() == io::ErrorKind::Unsupported
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bsd_info(pid: u32, status: u32) -> BsdInfo {
        BsdInfo {
            pid,
            parent_pid: 1,
            group_id: 77,
            status,
            start_seconds: 1_700_000_000,
            start_microseconds: 123_456,
        }
    }

    #[test]
    fn a_filled_bsd_info_becomes_the_process_with_its_start_to_the_microsecond() {
        let info = process_info(42, &bsd_info(42, 2)).expect("valid");
        assert_eq!(
            info,
            ProcessInfo {
                pid: 42,
                parent_pid: 1,
                group_id: 77,
                start_time: Some(1_700_000_000_123_456),
                is_zombie: false,
            }
        );
    }

    #[test]
    fn a_pid_reused_within_the_same_second_is_another_start_time() {
        let first = process_info(42, &bsd_info(42, 2)).expect("valid");
        let reused = process_info(
            42,
            &BsdInfo {
                start_microseconds: 123_457,
                ..bsd_info(42, 2)
            },
        )
        .expect("valid");
        assert_ne!(first.start_time, reused.start_time);
    }

    #[test]
    fn only_szomb_is_a_zombie() {
        // SIDL 1, SRUN 2, SSLEEP 3, SSTOP 4, SZOMB 5 (XNU sys/proc.h).
        for (status, is_zombie) in [(1, false), (2, false), (3, false), (4, false), (5, true)] {
            let info = process_info(7, &bsd_info(7, status)).expect("valid");
            assert_eq!(info.is_zombie, is_zombie, "p_stat {status}");
            assert_eq!(info.is_alive(), !is_zombie, "p_stat {status}");
        }
    }

    #[test]
    fn an_answer_for_another_pid_or_an_impossible_start_is_refused() {
        assert_eq!(
            process_info(42, &bsd_info(43, 2)),
            Err(FactError::OtherPid {
                asked: 42,
                answered: 43
            })
        );
        let bad_microseconds = BsdInfo {
            start_microseconds: 1_000_000,
            ..bsd_info(42, 2)
        };
        assert!(matches!(
            process_info(42, &bad_microseconds),
            Err(FactError::BadStartTime { .. })
        ));
        let overflowing = BsdInfo {
            start_seconds: u64::MAX / 1_000,
            ..bsd_info(42, 2)
        };
        assert!(matches!(
            process_info(42, &overflowing),
            Err(FactError::BadStartTime { .. })
        ));
    }

    #[test]
    fn an_unreadable_process_has_no_start_time_and_is_not_taken_for_a_recorded_one() {
        let info = unreadable_process_info(
            9,
            &ShortBsdInfo {
                pid: 9,
                parent_pid: 1,
                group_id: 9,
                status: 3,
            },
        )
        .expect("valid");
        assert_eq!(info.start_time, None);
        assert!(info.is_alive(), "it is alive, only not ours to judge");
        assert!(
            unreadable_process_info(
                9,
                &ShortBsdInfo {
                    pid: 8,
                    ..ShortBsdInfo {
                        pid: 9,
                        parent_pid: 1,
                        group_id: 9,
                        status: 3,
                    }
                }
            )
            .is_err()
        );
    }

    #[test]
    fn what_proc_pidinfo_answered_is_read_from_its_size_and_errno() {
        const SIZE: usize = 136;
        assert_eq!(pidinfo_answer(136, SIZE, 0), PidInfoAnswer::Filled);
        assert_eq!(
            pidinfo_answer(0, SIZE, nix::libc::ESRCH),
            PidInfoAnswer::NoProcess
        );
        assert_eq!(
            pidinfo_answer(0, SIZE, nix::libc::EPERM),
            PidInfoAnswer::NotPermitted
        );
        assert_eq!(
            pidinfo_answer(0, SIZE, nix::libc::EACCES),
            PidInfoAnswer::NotPermitted
        );
        assert_eq!(
            pidinfo_answer(0, SIZE, nix::libc::ENOMEM),
            PidInfoAnswer::Failed {
                errno: nix::libc::ENOMEM
            }
        );
        assert_eq!(
            pidinfo_answer(-1, SIZE, nix::libc::ESRCH),
            PidInfoAnswer::NoProcess
        );
        assert_eq!(
            pidinfo_answer(64, SIZE, 0),
            PidInfoAnswer::Short { written_bytes: 64 }
        );
    }

    #[test]
    fn a_short_answer_is_an_error_that_names_the_pid_and_the_size() {
        let error = io::Error::from(FactError::Short {
            pid: 42,
            written_bytes: 64,
        });
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);
        assert_eq!(
            error.to_string(),
            "proc_pidinfo for pid 42 wrote 64 bytes, fewer than its structure"
        );
    }

    #[test]
    fn the_boot_session_uuid_is_the_boot_id_lower_cased() {
        assert_eq!(
            boot_id_from_session_uuid(b"3F6A8E4B-1C2D-4E5F-8A9B-0C1D2E3F4A5B\0").expect("uuid"),
            "3f6a8e4b-1c2d-4e5f-8a9b-0c1d2e3f4a5b"
        );
        for bad in [
            &b""[..],
            b"\0",
            b"not-a-uuid",
            b"3F6A8E4B-1C2D-4E5F-8A9B-0C1D2E3F4A5",
            b"3F6A8E4B-1C2D-4E5F-8A9B-0C1D2E3F4A5G",
            b"3F6A8E4B/1C2D-4E5F-8A9B-0C1D2E3F4A5B",
            b"\xff\xfe",
        ] {
            assert!(boot_id_from_session_uuid(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_boot_time_fallback_is_a_stable_string_a_file_name_can_hold() {
        let id = boot_id_from_boot_time(1_700_000_000, 42).expect("boot time");
        assert_eq!(id, "boottime-1700000000-000042");
        assert_eq!(
            boot_id_from_boot_time(1_700_000_000, 42).expect("boot time"),
            id,
            "the same boot time gives the same id"
        );
        assert!(
            id.bytes()
                .all(|byte| byte.is_ascii_alphanumeric() || byte == b'-')
        );
        assert!(boot_id_from_boot_time(0, 0).is_err());
        assert!(boot_id_from_boot_time(1, 1_000_000).is_err());
    }

    #[test]
    fn a_full_pid_buffer_asks_for_a_bigger_one() {
        assert_eq!(listed_pids(3, &[5, 3, 9, 0]), Some(vec![3, 5, 9]));
        assert_eq!(listed_pids(4, &[5, 3, 9, 4]), None, "it may hold more");
        assert_eq!(listed_pids(0, &[0; 4]), Some(vec![]));
        assert_eq!(listed_pids(-1, &[0; 4]), Some(vec![]), "-1 is read as none");
        assert_eq!(
            listed_pids(4, &[0, -3, 7, 7, 0, 0]),
            Some(vec![7]),
            "the kernel, nonsense and duplicates are left out"
        );
    }

    #[test]
    fn only_an_unsupported_file_system_falls_back_to_writing_zeros() {
        assert!(preallocation_falls_back_to_zeros(&io::Error::from(
            io::ErrorKind::Unsupported
        )));
        for kind in [
            io::ErrorKind::StorageFull,
            io::ErrorKind::QuotaExceeded,
            io::ErrorKind::PermissionDenied,
            io::ErrorKind::InvalidInput,
        ] {
            assert!(!preallocation_falls_back_to_zeros(&io::Error::from(kind)));
        }
    }
}
