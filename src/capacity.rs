//! What is known, across processes, about the journal writers and their storage: which
//! failures clear by waiting (a full disk) and which are retried for a window (flaky storage),
//! whether the space reserve is in place, and which writers are blocked, and why.
//!
//! A blocked writer is an empty file under the home's `blocked/`: an empty file needs an inode
//! and a directory entry but no data block, so it can be made on a full disk, and its name
//! carries everything a reader needs: `<pid>-<start time>-<since ms>-<boot id>` for a writer
//! waiting for space (the name older versions write and read), `io-<errno>-<pid>-<start
//! time>-<since ms>-<boot id>` for one retrying through storage errors (older versions do not
//! know the name, and leave it alone). The name carries the writer's full identity because a
//! marker outlives a writer killed while blocked, and by the time it is read its pid alone may
//! name another process.
//!
//! Invariant: a marker is reported only while its writer is alive by its full identity
//! ([`liveness::check`]), never by a bare pid.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

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
    classify_redb(error) == FailureClass::Capacity
}

/// How a failure of the journal's storage is ridden out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureClass {
    /// Out of space or handles (ENOSPC, EDQUOT, EMFILE, ENFILE): it clears by waiting, and is
    /// retried until it does.
    Capacity,
    /// The storage failed for another reason (EIO, EROFS after a remount, ETIMEDOUT, ENOLCK,
    /// a handle that latched after such an error): retried on a fresh handle for the retry
    /// window. `errno` is the OS error number, 0 when there is none.
    Io { errno: i32 },
    /// Not about storage (damaged bytes, a bug): retrying cannot help.
    NotStorage,
}

impl FailureClass {
    /// The cause a blocked writer shows for this failure; `None` when it is not retried.
    pub fn cause(self) -> Option<BlockCause> {
        match self {
            FailureClass::Capacity => Some(BlockCause::Capacity),
            FailureClass::Io { errno } => Some(BlockCause::Io { errno }),
            FailureClass::NotStorage => None,
        }
    }
}

/// The class of a file-system error: any I/O error that is not about capacity is the
/// storage's.
pub fn classify_io(error: &io::Error) -> FailureClass {
    if is_capacity_io(error) {
        FailureClass::Capacity
    } else {
        FailureClass::Io {
            errno: error.raw_os_error().unwrap_or(0),
        }
    }
}

/// The class of a redb error, wherever redb carries the I/O error. `PreviousIo` (a handle
/// that latched after an I/O error) and a closed handle are storage failures a fresh handle
/// cures; corruption and everything else are not about storage.
pub fn classify_redb(error: &redb::Error) -> FailureClass {
    match error {
        redb::Error::Io(error) => classify_io(error),
        redb::Error::Backend(error) => match error.downcast_ref::<io::Error>() {
            Some(error) => classify_io(error),
            None => FailureClass::Io { errno: 0 },
        },
        redb::Error::PreviousIo | redb::Error::DatabaseClosed => FailureClass::Io { errno: 0 },
        _ => FailureClass::NotStorage,
    }
}

/// The default retry window for storage errors that are not about capacity.
pub const DEFAULT_IO_RETRY_WINDOW: Duration = Duration::from_secs(10 * 60);

/// Environment variable overriding the retry window (a duration: `30s`, `10m`, `1h`).
pub const IO_RETRY_WINDOW_ENV: &str = "RUNJOURNAL_IO_RETRY_WINDOW";

/// The retry window from `RUNJOURNAL_IO_RETRY_WINDOW` (the crate's one duration grammar), else
/// the default.
pub fn io_retry_window_from_env() -> Result<Duration, String> {
    io_retry_window_from(std::env::var(IO_RETRY_WINDOW_ENV).ok().as_deref())
}

/// The retry window `value` of [`IO_RETRY_WINDOW_ENV`] sets; unset or blank, the default.
fn io_retry_window_from(value: Option<&str>) -> Result<Duration, String> {
    match value {
        Some(text) if !text.trim().is_empty() => crate::duration::parse_duration(text)
            .map_err(|error| format!("{IO_RETRY_WINDOW_ENV}: {error}")),
        _ => Ok(DEFAULT_IO_RETRY_WINDOW),
    }
}

/// Whether a failure of class `class` is tried again, when the first storage failure of this
/// streak was `failing_for` ago: capacity always (it clears by waiting), other storage
/// failures while the window lasts, anything else never. The one rule of the writer and of
/// retried reads.
pub fn is_retried(class: FailureClass, failing_for: Duration, window: Duration) -> bool {
    match class {
        FailureClass::Capacity => true,
        FailureClass::Io { .. } => failing_for < window,
        FailureClass::NotStorage => false,
    }
}

/// The default size of the reserve.
pub const DEFAULT_RESERVE_BYTES: u64 = 8 << 20;

/// Environment variable overriding the reserve size, in bytes (0 disables it).
pub const RESERVE_ENV: &str = "RUNJOURNAL_RESERVE_BYTES";

/// The reserve size from `RUNJOURNAL_RESERVE_BYTES`, else the default.
pub fn reserve_bytes_from_env() -> Result<u64, String> {
    reserve_bytes_from(std::env::var(RESERVE_ENV).ok().as_deref())
}

/// The reserve size `value` of [`RESERVE_ENV`] sets; unset or blank, the default.
fn reserve_bytes_from(value: Option<&str>) -> Result<u64, String> {
    match value {
        Some(text) if !text.trim().is_empty() => text
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
        matches!(
            crate::durable_fs::look(&self.path),
            Ok(Some(entry)) if entry.facts.kind == crate::durable_fs::EntryKind::File
        )
    }

    /// Makes the reserve if it is missing, or shorter than its size (a power cut can keep its
    /// name but not its blocks, which are never synced). `Ok(false)` when there is no room for
    /// it (or its size is 0); nothing half made is left behind.
    pub fn ensure(&self) -> io::Result<bool> {
        if self.bytes == 0 {
            return Ok(false);
        }
        let is_whole = matches!(
            crate::durable_fs::look(&self.path),
            Ok(Some(entry)) if entry.facts.kind == crate::durable_fs::EntryKind::File
                && entry.stamp.len >= self.bytes
        );
        if is_whole {
            return Ok(true);
        }
        let temp = self.path.with_extension("making");
        let made = (|| {
            let file = crate::durable_fs::open_truncated(&temp)?;
            // Allocated blocks, not a sparse file: deleting it must free real space.
            platform::preallocate(&file, self.bytes)?;
            drop(file);
            crate::durable_fs::rename(&temp, &self.path)
        })();
        match made {
            Ok(()) => Ok(true),
            Err(error) => {
                let _ = crate::durable_fs::remove_if_present(&temp);
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
        crate::durable_fs::remove_file(&self.path)
    }
}

/// Why a journal writer is blocked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockCause {
    /// Out of space or handles: it waits until space returns.
    Capacity,
    /// Storage errors (`errno`, 0 when unknown): it retries for its retry window.
    Io { errno: i32 },
    /// Another process has held the journal's write lock for a while (one stopped inside a
    /// write transaction, say): it waits until the lock is let go.
    WriteLock,
}

impl BlockCause {
    /// What blocks the writer, for people: "a full disk", "storage errors (Input/output
    /// error)".
    pub fn describe(self) -> String {
        match self {
            BlockCause::Capacity => "a full disk".to_string(),
            BlockCause::Io { errno: 0 } => "storage errors".to_string(),
            BlockCause::Io { errno } => format!(
                "storage errors ({})",
                nix::errno::Errno::from_raw(errno).desc()
            ),
            BlockCause::WriteLock => {
                "the journal's write lock, held by another process".to_string()
            }
        }
    }

    /// `capacity` or `io`, for JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            BlockCause::Capacity => "capacity",
            BlockCause::Io { .. } => "io",
            BlockCause::WriteLock => "lock",
        }
    }
}

/// A journal writer blocked on a full disk or on storage errors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocked {
    /// The writer's process, by full identity.
    pub writer: ProcessIdentity,
    pub since_ms: UnixMs,
    pub cause: BlockCause,
}

/// The capacity state of a home, as other processes see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapacityStatus {
    /// The reserve file exists (it is released on a capacity error and made again later).
    pub has_reserve: bool,
    /// Live writers blocked on a full disk or on storage errors, earliest first.
    pub blocked: Vec<Blocked>,
}

impl CapacityStatus {
    /// Since when the journal has been blocked, if any writer is, whatever the cause.
    pub fn blocked_since_ms(&self) -> Option<UnixMs> {
        self.blocked.iter().map(|blocked| blocked.since_ms).min()
    }

    /// The writers blocked for a cause of `cause`'s kind (capacity, or storage errors of any
    /// errno), earliest first.
    pub fn blocked_by(&self, cause: BlockCause) -> Vec<&Blocked> {
        self.blocked
            .iter()
            .filter(|blocked| blocked.cause.as_str() == cause.as_str())
            .collect()
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

/// The prefix of a marker of a writer blocked on storage errors.
const IO_MARKER_PREFIX: &str = "io-";

/// The prefix of a marker of a writer waiting for another process's write lock.
const LOCK_MARKER_PREFIX: &str = "lock-";

/// The marker's file name, `<pid>-<start time>-<since ms>-<boot id>` (capacity) or
/// `io-<errno>-<pid>-<start time>-<since ms>-<boot id>` (storage errors), then
/// `_<PID namespace>` where the writer's pid has one: the numbers first, because the boot id
/// holds dashes itself (and never `_`).
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
    let prefix = match blocked.cause {
        BlockCause::Capacity => String::new(),
        // The errno is never negative; one that is would not parse back, so it is not written.
        BlockCause::Io { errno } => format!("{IO_MARKER_PREFIX}{}-", errno.max(0)),
        BlockCause::WriteLock => LOCK_MARKER_PREFIX.to_string(),
    };
    Ok(format!(
        "{prefix}{}-{}-{}-{}{namespace}",
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
    let (cause, name) = if let Some(rest) = name.strip_prefix(LOCK_MARKER_PREFIX) {
        (BlockCause::WriteLock, rest)
    } else if let Some(rest) = name.strip_prefix(IO_MARKER_PREFIX) {
        match rest.split_once('-') {
            Some((errno, rest)) => match number::<i32>(errno) {
                Some(errno) => (BlockCause::Io { errno }, rest),
                None => return MarkerName::Unknown,
            },
            None => return MarkerName::Unknown,
        }
    } else {
        (BlockCause::Capacity, name)
    };
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
                    cause,
                }),
                _ => MarkerName::Unknown,
            }
        }
        [pid, since_ms]
            if cause == BlockCause::Capacity
                && number::<u32>(pid).is_some()
                && number::<u64>(since_ms).is_some() =>
        {
            MarkerName::BarePid
        }
        _ => MarkerName::Unknown,
    }
}

fn marker_path(home: &Home, blocked: &Blocked) -> io::Result<PathBuf> {
    Ok(blocked_dir(home).join(marker_name(blocked)?))
}

/// Records that a journal writer (this process's, by its identity) is blocked on a full
/// disk or on storage errors. Removes, on the way, the markers of writers that are gone (killed while blocked) and
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
    let Some(found) = crate::durable_fs::dir_names(&blocked_dir(home))? else {
        return Ok(Vec::new());
    };
    let mut names = Vec::new();
    for name in found {
        let marker = name.to_str().map_or(MarkerName::Unknown, parse_marker_name);
        names.push((name, marker));
    }
    Ok(names)
}

/// Removes bare-pid markers and markers whose writer is dead or of another boot; leaves
/// markers of live writers, those it cannot judge, and names it does not know.
fn remove_stale_markers(home: &Home) -> io::Result<()> {
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
        }
    }
    Ok(())
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
    use std::fs;

    fn me() -> ProcessIdentity {
        liveness::current().expect("identity of this process")
    }

    fn blocked(writer: ProcessIdentity, since_ms: UnixMs) -> Blocked {
        Blocked {
            writer,
            since_ms,
            cause: BlockCause::Capacity,
        }
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

    /// Only a missing marker directory means no marker (a survivor of mutation testing): one
    /// that cannot be read is an error, not "nothing blocked".
    #[test]
    fn a_marker_directory_that_cannot_be_read_is_an_error() {
        let dir = tempfile::tempdir().expect("temp dir");
        let home = Home::at(dir.path());
        let markers = blocked_dir(&home);
        std::fs::create_dir_all(markers.parent().expect("a parent")).expect("parent");
        std::fs::write(&markers, b"").expect("a file where the directory belongs");
        assert!(read_status(&home).is_err());
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

    #[test]
    fn a_marker_names_its_cause_and_reads_back_with_it() {
        let writer = ProcessIdentity {
            pid: 4242,
            start_time: 987_654,
            boot_id: "ea802a0e-e617-4d83-bbb1-efd556ab6eb6".to_string(),
            pid_namespace: None,
        };
        let io = Blocked {
            writer: writer.clone(),
            since_ms: 1_700_000_000_000,
            cause: BlockCause::Io { errno: 5 },
        };
        let name = marker_name(&io).expect("name");
        assert_eq!(
            name,
            "io-5-4242-987654-1700000000000-ea802a0e-e617-4d83-bbb1-efd556ab6eb6"
        );
        assert_eq!(parse_marker_name(&name), MarkerName::Current(io.clone()));
        let capacity = Blocked {
            cause: BlockCause::Capacity,
            ..io.clone()
        };
        assert_ne!(marker_name(&capacity).expect("name"), name);
        let lock = Blocked {
            cause: BlockCause::WriteLock,
            ..io.clone()
        };
        let lock_name = marker_name(&lock).expect("name");
        assert_eq!(
            lock_name,
            "lock-4242-987654-1700000000000-ea802a0e-e617-4d83-bbb1-efd556ab6eb6"
        );
        assert_eq!(parse_marker_name(&lock_name), MarkerName::Current(lock));
        assert_eq!(parse_marker_name("lock-"), MarkerName::Unknown);
        for odd in [
            "io-",
            "io-5",
            "io-x-4242-1-2-boot",
            "io--4242-1-2-boot",
            "io-5-4242-1000",
            "io-+5-4242-1-2-boot",
        ] {
            assert_eq!(parse_marker_name(odd), MarkerName::Unknown, "{odd:?}");
        }
        assert_eq!(
            BlockCause::Io { errno: 5 }.describe(),
            "storage errors (I/O error)"
        );
        assert_eq!(BlockCause::Capacity.describe(), "a full disk");
    }

    #[test]
    fn both_causes_are_read_back_and_told_apart() {
        let dir = tempfile::tempdir().expect("temp dir");
        let home = Home::at(dir.path());
        let full = blocked(me(), 10);
        let flaky = Blocked {
            since_ms: 20,
            cause: BlockCause::Io { errno: 5 },
            ..full.clone()
        };
        mark_blocked(&home, &full).expect("mark");
        mark_blocked(&home, &flaky).expect("mark");
        let status = read_status(&home).expect("read");
        assert_eq!(status.blocked, vec![full.clone(), flaky.clone()]);
        assert_eq!(status.blocked_by(BlockCause::Capacity), vec![&full]);
        assert_eq!(status.blocked_by(BlockCause::Io { errno: 0 }), vec![&flaky]);
        clear_blocked(&home, &flaky).expect("clear");
        assert_eq!(read_status(&home).expect("read").blocked, vec![full]);
    }

    /// Survivors of mutation testing: out of handles is capacity too, whether it comes as an
    /// errno or wrapped by redb, and each retried class shows its cause.
    #[test]
    fn every_capacity_errno_is_capacity_wherever_it_is_carried() {
        for (errno, name) in [
            (28, "ENOSPC"),
            (122, "EDQUOT"),
            (24, "EMFILE"),
            (23, "ENFILE"),
        ] {
            assert!(is_capacity_errno(errno), "{name}");
            let error = io::Error::from_raw_os_error(errno);
            assert!(is_capacity_io(&error), "{name}");
            assert!(is_capacity_redb(&redb::Error::Io(error)), "{name}");
        }
        for errno in [0, 5, 30, 110] {
            assert!(!is_capacity_errno(errno), "errno {errno}");
            let error = redb::Error::Io(io::Error::from_raw_os_error(errno));
            assert!(!is_capacity_redb(&error), "errno {errno}");
        }
        assert!(is_capacity_io(&io::Error::from(io::ErrorKind::StorageFull)));
        assert!(!is_capacity_redb(&redb::Error::PreviousIo));
        assert_eq!(FailureClass::Capacity.cause(), Some(BlockCause::Capacity));
        assert_eq!(
            FailureClass::Io { errno: 5 }.cause(),
            Some(BlockCause::Io { errno: 5 })
        );
        assert_eq!(FailureClass::NotStorage.cause(), None);
    }

    /// The values of the two variables, unset, blank, set and wrong; the defaults are the
    /// documented ones (10 minutes, 8 MiB).
    #[test]
    fn the_window_and_the_reserve_read_their_variables() {
        assert_eq!(DEFAULT_IO_RETRY_WINDOW, Duration::from_secs(600));
        assert_eq!(DEFAULT_RESERVE_BYTES, 8 * 1024 * 1024);
        for unset in [None, Some(""), Some("  ")] {
            assert_eq!(io_retry_window_from(unset), Ok(DEFAULT_IO_RETRY_WINDOW));
            assert_eq!(reserve_bytes_from(unset), Ok(DEFAULT_RESERVE_BYTES));
        }
        assert_eq!(
            io_retry_window_from(Some("30s")),
            Ok(Duration::from_secs(30))
        );
        assert_eq!(reserve_bytes_from(Some(" 0 ")), Ok(0));
        assert_eq!(reserve_bytes_from(Some("4096")), Ok(4096));
        let error = io_retry_window_from(Some("soon")).expect_err("not a duration");
        assert!(error.starts_with(IO_RETRY_WINDOW_ENV), "{error}");
        let error = reserve_bytes_from(Some("8M")).expect_err("not a number of bytes");
        assert!(error.contains("is not a number of bytes"), "{error}");
    }

    /// The `_from_env` functions read their variables: checked in a child process of this
    /// test binary, the only place a test may set them without racing other tests.
    #[test]
    fn the_variables_are_read_from_the_environment() {
        const CHILD: &str = "RUNJOURNAL_TEST_CAPACITY_ENV_CHILD";
        if std::env::var_os(CHILD).is_some() {
            assert_eq!(io_retry_window_from_env(), Ok(Duration::from_secs(7)));
            assert_eq!(reserve_bytes_from_env(), Ok(12345));
            return;
        }
        let test = "capacity::tests::the_variables_are_read_from_the_environment";
        let exe = std::env::current_exe().expect("this test binary");
        let output = std::process::Command::new(exe)
            .args([test, "--exact", "--test-threads=1"])
            .env(CHILD, "1")
            .env(IO_RETRY_WINDOW_ENV, "7s")
            .env(RESERVE_ENV, "12345")
            .output()
            .expect("run the child");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "the child failed: {stdout}");
        assert!(
            stdout.contains("1 passed"),
            "the child ran one test: {stdout}"
        );
    }

    /// The reserve file made, kept, released, and not made at size 0; a release that cannot
    /// tell is an error. Survivors of mutation testing.
    #[test]
    fn the_reserve_is_made_once_and_released_once() {
        let dir = tempfile::tempdir().expect("temp dir");
        let reserve = Reserve::new(dir.path().join("journal.reserve"), 4096);
        assert_eq!(reserve.bytes(), 4096);
        assert!(!reserve.exists());
        assert!(reserve.ensure().expect("made"));
        assert!(reserve.exists());
        let made = fs::metadata(reserve.path()).expect("the reserve file");
        assert_eq!(made.len(), 4096);
        assert!(reserve.ensure().expect("kept"), "already there");
        assert!(reserve.release().expect("released"), "it was there");
        assert!(!reserve.exists());
        assert!(
            !reserve.release().expect("nothing to release"),
            "it was not there"
        );

        // Short, as a power cut may leave it: made again at its size.
        fs::write(reserve.path(), b"short").expect("a short reserve");
        assert!(reserve.ensure().expect("made again"));
        let made = fs::metadata(reserve.path()).expect("the reserve file");
        assert_eq!(made.len(), 4096);

        let none = Reserve::new(dir.path().join("none.reserve"), 0);
        assert!(!none.ensure().expect("nothing to make"));
        assert!(!none.exists());

        let directory = Reserve::new(dir.path(), 4096);
        assert!(!directory.exists(), "a directory is no reserve");
        assert!(
            directory.release().is_err(),
            "a directory cannot be released"
        );
    }

    #[test]
    fn failures_are_classed_by_what_retrying_can_do() {
        let eio = io::Error::from_raw_os_error(5);
        let erofs = io::Error::from_raw_os_error(30);
        let enospc = io::Error::from_raw_os_error(28);
        assert_eq!(classify_io(&eio), FailureClass::Io { errno: 5 });
        assert_eq!(classify_io(&erofs), FailureClass::Io { errno: 30 });
        assert_eq!(classify_io(&enospc), FailureClass::Capacity);
        assert_eq!(
            classify_redb(&redb::Error::Io(io::Error::from_raw_os_error(122))),
            FailureClass::Capacity,
            "EDQUOT"
        );
        assert_eq!(
            classify_redb(&redb::Error::PreviousIo),
            FailureClass::Io { errno: 0 }
        );
        assert_eq!(
            classify_redb(&redb::Error::Backend(Box::new(
                io::Error::from_raw_os_error(110)
            ))),
            FailureClass::Io { errno: 110 },
            "ETIMEDOUT carried by a backend"
        );
        assert_eq!(
            classify_redb(&redb::Error::Corrupted("bad page".to_string())),
            FailureClass::NotStorage
        );
        let window = Duration::from_secs(60);
        let io_failure = FailureClass::Io { errno: 5 };
        assert!(is_retried(io_failure, Duration::ZERO, window));
        assert!(is_retried(io_failure, Duration::from_secs(59), window));
        assert!(!is_retried(io_failure, window, window));
        assert!(
            !is_retried(io_failure, Duration::ZERO, Duration::ZERO),
            "a window of zero tries once"
        );
        assert!(is_retried(FailureClass::Capacity, Duration::MAX, window));
        assert!(!is_retried(
            FailureClass::NotStorage,
            Duration::ZERO,
            window
        ));
    }
}
