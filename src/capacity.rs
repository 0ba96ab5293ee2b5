//! What is known, across processes, about the journal writers and a full disk: whether the
//! space reserve is in place, and which writers are blocked waiting for space.
//!
//! A blocked writer is an empty file `blocked/<pid>-<start time>-<since ms>-<boot id>` under
//! the home: an empty file needs an inode and a directory entry but no data block, so it can
//! be made on a full disk, and its name carries everything a reader needs. The name carries
//! the writer's full identity because a marker outlives a writer killed while blocked, and by
//! the time it is read its pid alone may name another process.
//!
//! Invariant: a marker is reported only while its writer is alive by its full identity
//! ([`liveness::check`]), never by a bare pid.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::event::{ProcessIdentity, UnixMs};
use crate::home::Home;
use crate::liveness::{self, Liveness};
use crate::platform;

/// Whether an errno means "out of space or out of handles": errors that clear by waiting.
pub fn is_capacity_errno(errno: i32) -> bool {
    matches!(
        nix::errno::Errno::from_raw(errno),
        nix::errno::Errno::ENOSPC
            | nix::errno::Errno::EDQUOT
            | nix::errno::Errno::EMFILE
            | nix::errno::Errno::ENFILE
    )
}

/// Whether a file-system error is a capacity error (ENOSPC, EDQUOT, EMFILE, ENFILE).
pub fn is_capacity_io(error: &io::Error) -> bool {
    error.raw_os_error().is_some_and(is_capacity_errno)
        || matches!(
            error.kind(),
            io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded
        )
}

/// Whether a redb error is a capacity error, wherever redb carries the I/O error.
pub fn is_capacity_redb(error: &redb::Error) -> bool {
    match error {
        redb::Error::Io(error) => is_capacity_io(error),
        redb::Error::Backend(error) => error
            .downcast_ref::<io::Error>()
            .is_some_and(is_capacity_io),
        _ => false,
    }
}

/// The default size of the reserve.
pub const DEFAULT_RESERVE_BYTES: u64 = 8 << 20;

/// Environment variable overriding the reserve size, in bytes (0 disables it).
pub const RESERVE_ENV: &str = "RUNJOURNAL_RESERVE_BYTES";

/// The reserve size from `RUNJOURNAL_RESERVE_BYTES`, else the default.
pub fn reserve_bytes_from_env() -> Result<u64, String> {
    match std::env::var(RESERVE_ENV) {
        Ok(text) if !text.trim().is_empty() => text
            .trim()
            .parse()
            .map_err(|_| format!("{RESERVE_ENV}={text:?} is not a number of bytes")),
        _ => Ok(DEFAULT_RESERVE_BYTES),
    }
}

/// A preallocated file beside the journal, deleted on a capacity error so the retried commit
/// (a terminal transition, say) has room, and made again once space returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reserve {
    path: PathBuf,
    bytes: u64,
}

impl Reserve {
    pub fn new(path: impl Into<PathBuf>, bytes: u64) -> Reserve {
        Reserve {
            path: path.into(),
            bytes,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether the reserve file is in place.
    pub fn exists(&self) -> bool {
        self.path.is_file()
    }

    /// Makes the reserve if it is missing. `Ok(false)` when there is no room for it (or its
    /// size is 0); nothing half made is left behind.
    pub fn ensure(&self) -> io::Result<bool> {
        if self.bytes == 0 {
            return Ok(false);
        }
        if self.exists() {
            return Ok(true);
        }
        let temp = self.path.with_extension("making");
        let made = (|| {
            let file = crate::durable_fs::open_truncated(&temp)?;
            // Allocated blocks, not a sparse file: deleting it must free real space.
            platform::preallocate(&file, self.bytes)?;
            drop(file);
            fs::rename(&temp, &self.path)
        })();
        match made {
            Ok(()) => Ok(true),
            Err(error) => {
                let _ = fs::remove_file(&temp);
                if is_capacity_io(&error) {
                    Ok(false)
                } else {
                    Err(error)
                }
            }
        }
    }

    /// Deletes the reserve. `Ok(true)` if it was there.
    pub fn release(&self) -> io::Result<bool> {
        match fs::remove_file(&self.path) {
            Ok(()) => Ok(true),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(error) => Err(error),
        }
    }
}

/// A journal writer blocked on a full disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocked {
    /// The writer's process, by full identity.
    pub writer: ProcessIdentity,
    pub since_ms: UnixMs,
}

/// The capacity state of a home, as other processes see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapacityStatus {
    /// The reserve file exists (it is released on a capacity error and made again later).
    pub has_reserve: bool,
    /// Live writers blocked on a full disk, earliest first.
    pub blocked: Vec<Blocked>,
}

impl CapacityStatus {
    /// Since when the journal has been blocked, if any writer is.
    pub fn blocked_since_ms(&self) -> Option<UnixMs> {
        self.blocked.iter().map(|blocked| blocked.since_ms).min()
    }
}

/// The directory of blocked-writer markers.
pub fn blocked_dir(home: &Home) -> PathBuf {
    home.blocked_dir()
}

/// Whether a boot id can stand in a marker's name: what the kernel writes (a UUID) has only
/// these characters, and none of them is a path separator.
fn is_boot_id_nameable(boot_id: &str) -> bool {
    !boot_id.is_empty()
        && boot_id.len() <= 64
        && boot_id
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || byte == b'-')
}

/// The marker's file name, `<pid>-<start time>-<since ms>-<boot id>`, then `_<PID namespace>`
/// where the writer's pid has one: the numbers first, because the boot id holds dashes itself
/// (and never `_`).
fn marker_name(blocked: &Blocked) -> io::Result<String> {
    let writer = &blocked.writer;
    if !is_boot_id_nameable(&writer.boot_id) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "boot id {:?} cannot stand in a marker's name",
                writer.boot_id
            ),
        ));
    }
    let namespace = writer
        .pid_namespace
        .map(|namespace| format!("_{namespace}"))
        .unwrap_or_default();
    Ok(format!(
        "{}-{}-{}-{}{namespace}",
        writer.pid, writer.start_time, blocked.since_ms, writer.boot_id
    ))
}

/// What a file name in `blocked/` is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum MarkerName {
    /// A marker of this version.
    Current(Blocked),
    /// `<pid>-<since ms>`, as versions before full identities wrote: a bare pid, which cannot
    /// say whether its writer is alive.
    BarePid,
    /// Anything else: not ours to read or remove.
    Unknown,
}

/// Reads a marker's file name. Pure.
fn parse_marker_name(name: &str) -> MarkerName {
    // Digits only: `parse` would also take a leading `+`, which no marker is written with.
    fn number<T: std::str::FromStr>(text: &str) -> Option<T> {
        let is_digits = !text.is_empty() && text.bytes().all(|byte| byte.is_ascii_digit());
        is_digits.then(|| text.parse().ok()).flatten()
    }
    let parts: Vec<&str> = name.splitn(4, '-').collect();
    match parts.as_slice() {
        [pid, start_time, since_ms, boot_and_namespace] => {
            let (boot_id, namespace) = match boot_and_namespace.split_once('_') {
                Some((boot_id, namespace)) => match number::<u64>(namespace) {
                    Some(namespace) => (boot_id, Some(namespace)),
                    None => return MarkerName::Unknown,
                },
                None => (*boot_and_namespace, None),
            };
            if !is_boot_id_nameable(boot_id) {
                return MarkerName::Unknown;
            }
            match (number(pid), number(start_time), number(since_ms)) {
                (Some(pid), Some(start_time), Some(since_ms)) => MarkerName::Current(Blocked {
                    writer: ProcessIdentity {
                        pid,
                        start_time,
                        boot_id: boot_id.to_string(),
                        pid_namespace: namespace,
                    },
                    since_ms,
                }),
                _ => MarkerName::Unknown,
            }
        }
        [pid, since_ms] if number::<u32>(pid).is_some() && number::<u64>(since_ms).is_some() => {
            MarkerName::BarePid
        }
        _ => MarkerName::Unknown,
    }
}

fn marker_path(home: &Home, blocked: &Blocked) -> io::Result<PathBuf> {
    Ok(blocked_dir(home).join(marker_name(blocked)?))
}

/// Records that a journal writer (this process's, by its identity) is blocked on a full
/// disk. Removes, on the way, the markers of writers that are gone (killed while blocked) and
/// bare-pid markers of older versions, so that they do not pile up.
pub fn mark_blocked(home: &Home, blocked: &Blocked) -> io::Result<()> {
    let path = marker_path(home, blocked)?;
    crate::durable_fs::ensure_private_dir(&blocked_dir(home))?;
    // Best effort: a stale marker is never reported anyway.
    let _ = remove_stale_markers(home);
    crate::durable_fs::touch(&path)
}

/// Records that the writer is no longer blocked.
pub fn clear_blocked(home: &Home, blocked: &Blocked) -> io::Result<()> {
    crate::durable_fs::remove_if_present(&marker_path(home, blocked)?)
}

/// The markers in `blocked/`, by file name; empty when the directory does not exist.
fn marker_names(home: &Home) -> io::Result<Vec<(std::ffi::OsString, MarkerName)>> {
    let entries = match fs::read_dir(blocked_dir(home)) {
        Ok(entries) => entries,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => return Err(error),
    };
    let mut names = Vec::new();
    for entry in entries {
        let name = entry?.file_name();
        let marker = name.to_str().map_or(MarkerName::Unknown, parse_marker_name);
        names.push((name, marker));
    }
    Ok(names)
}

/// Removes bare-pid markers and markers whose writer is dead or of another boot; leaves
/// markers of live writers, those it cannot judge, and names it does not know. Returns how
/// many it removed.
fn remove_stale_markers(home: &Home) -> io::Result<usize> {
    let mut removed = 0;
    for (name, marker) in marker_names(home)? {
        let is_stale = match marker {
            MarkerName::BarePid => true,
            MarkerName::Current(blocked) => matches!(
                liveness::check(&blocked.writer),
                Ok(Liveness::Dead | Liveness::OtherBoot)
            ),
            MarkerName::Unknown => false,
        };
        if is_stale {
            crate::durable_fs::remove_if_present(&blocked_dir(home).join(name))?;
            removed += 1;
        }
    }
    Ok(removed)
}

/// Reads the capacity state. Only markers whose writer is alive by its full identity count:
/// markers of writers that are gone (or of another boot) are ignored, and so are bare-pid
/// markers of older versions, which cannot tell their writer from a process that got its pid.
pub fn read_status(home: &Home) -> io::Result<CapacityStatus> {
    let has_reserve = home.reserve_path().is_file();
    let mut blocked = Vec::new();
    for (_, marker) in marker_names(home)? {
        let MarkerName::Current(marker) = marker else {
            continue;
        };
        if liveness::check(&marker.writer)? == Liveness::Alive {
            blocked.push(marker);
        }
    }
    blocked.sort_by_key(|blocked| blocked.since_ms);
    Ok(CapacityStatus {
        has_reserve,
        blocked,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn me() -> ProcessIdentity {
        liveness::current().expect("identity of this process")
    }

    fn blocked(writer: ProcessIdentity, since_ms: UnixMs) -> Blocked {
        Blocked { writer, since_ms }
    }

    #[test]
    fn blocked_markers_of_live_processes_are_read_back() {
        let dir = tempfile::tempdir().expect("temp dir");
        let home = Home::at(dir.path());
        assert_eq!(
            read_status(&home).expect("read"),
            CapacityStatus {
                has_reserve: false,
                blocked: vec![]
            }
        );
        let me = blocked(me(), 1234);
        mark_blocked(&home, &me).expect("mark");
        // A process that cannot exist (pids are below 2^22 on Linux).
        let nobody = blocked(
            ProcessIdentity {
                pid: u32::MAX - 1,
                ..me.writer.clone()
            },
            1,
        );
        mark_blocked(&home, &nobody).expect("mark");
        fs::write(home.reserve_path(), b"").expect("reserve");
        let status = read_status(&home).expect("read");
        assert!(status.has_reserve);
        assert_eq!(status.blocked, vec![me.clone()]);
        assert_eq!(status.blocked_since_ms(), Some(1234));
        clear_blocked(&home, &me).expect("clear");
        assert_eq!(read_status(&home).expect("read").blocked, vec![]);
    }

    /// Regression: markers were read by bare pid, so a writer killed while blocked looked
    /// blocked forever once any process got its pid.
    #[test]
    fn a_marker_of_a_reused_pid_or_another_boot_is_not_read_as_blocked() {
        let dir = tempfile::tempdir().expect("temp dir");
        let home = Home::at(dir.path());
        // This process's pid, held now by "another" process: the marker's start time differs.
        let reused = blocked(
            ProcessIdentity {
                start_time: me().start_time + 1,
                ..me()
            },
            10,
        );
        let other_boot = blocked(
            ProcessIdentity {
                boot_id: "00000000-0000-0000-0000-000000000000".to_string(),
                ..me()
            },
            20,
        );
        for marker in [&reused, &other_boot] {
            crate::durable_fs::ensure_private_dir(&blocked_dir(&home)).expect("dir");
            crate::durable_fs::touch(&marker_path(&home, marker).expect("name")).expect("touch");
        }
        assert_eq!(read_status(&home).expect("read").blocked, vec![]);
    }

    #[test]
    fn old_bare_pid_markers_are_ignored_and_removed_when_a_writer_marks_itself() {
        let dir = tempfile::tempdir().expect("temp dir");
        let home = Home::at(dir.path());
        let markers = blocked_dir(&home);
        crate::durable_fs::ensure_private_dir(&markers).expect("dir");
        // An old-style marker of a live pid (ours), one of a dead writer, and a stranger's
        // file.
        let bare = markers.join(format!("{}-1000", std::process::id()));
        let dead = blocked(
            ProcessIdentity {
                pid: u32::MAX - 1,
                ..me()
            },
            5,
        );
        let dead_path = marker_path(&home, &dead).expect("name");
        let stranger = markers.join("notes.txt");
        for path in [&bare, &dead_path, &stranger] {
            crate::durable_fs::touch(path).expect("touch");
        }
        assert_eq!(read_status(&home).expect("read").blocked, vec![]);
        let me = blocked(me(), 2000);
        mark_blocked(&home, &me).expect("mark");
        assert!(!bare.exists(), "the bare-pid marker is removed");
        assert!(!dead_path.exists(), "the dead writer's marker is removed");
        assert!(stranger.exists(), "a name we do not know is left alone");
        assert_eq!(read_status(&home).expect("read").blocked, vec![me]);
    }

    #[test]
    fn marker_names_round_trip_and_odd_names_are_not_markers() {
        let marker = blocked(
            ProcessIdentity {
                pid: 4242,
                start_time: 987_654,
                boot_id: "ea802a0e-e617-4d83-bbb1-efd556ab6eb6".to_string(),
                pid_namespace: None,
            },
            1_700_000_000_000,
        );
        let name = marker_name(&marker).expect("name");
        assert_eq!(
            name,
            "4242-987654-1700000000000-ea802a0e-e617-4d83-bbb1-efd556ab6eb6"
        );
        assert_eq!(
            parse_marker_name(&name),
            MarkerName::Current(marker.clone())
        );
        assert_eq!(parse_marker_name("4242-1700000000000"), MarkerName::BarePid);
        for odd in [
            "",
            "-",
            "4242",
            "+4242-1-2-boot",
            "4242-x-2-boot",
            "4242-1-2-",
            "4242-1-2-boot/../x",
            "4242-1-2-boot id",
            "99999999999-1-2-boot",
            ".making",
        ] {
            assert_eq!(parse_marker_name(odd), MarkerName::Unknown, "{odd:?}");
        }
        let unnameable = Blocked {
            writer: ProcessIdentity {
                boot_id: "../escape".to_string(),
                ..marker.writer
            },
            ..marker
        };
        assert!(marker_name(&unnameable).is_err());
    }
}
