//! What is known, across processes, about the journal writers and a full disk: whether the
//! space reserve is in place, and which writers are blocked waiting for space.
//!
//! A blocked writer is an empty file `blocked/<pid>-<since ms>` under the home: an empty file
//! needs an inode and a directory entry but no data block, so it can be made on a full disk,
//! and its name carries everything a reader needs.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::event::UnixMs;
use crate::home::Home;

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
            use std::os::unix::fs::OpenOptionsExt;
            let file = fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&temp)?;
            // Allocated blocks, not a sparse file: deleting it must free real space.
            crate::platform::preallocate(&file, self.bytes)?;
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Blocked {
    pub pid: u32,
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
    home.root().join("blocked")
}

fn marker_path(home: &Home, blocked: Blocked) -> PathBuf {
    blocked_dir(home).join(format!("{}-{}", blocked.pid, blocked.since_ms))
}

/// Records that this process's journal writer is blocked on a full disk.
pub fn mark_blocked(home: &Home, blocked: Blocked) -> io::Result<()> {
    crate::durable_fs::ensure_private_dir(&blocked_dir(home))?;
    crate::durable_fs::touch(&marker_path(home, blocked))
}

/// Records that the writer is no longer blocked.
pub fn clear_blocked(home: &Home, blocked: Blocked) -> io::Result<()> {
    crate::durable_fs::remove_if_present(&marker_path(home, blocked))
}

/// Reads the capacity state. Markers of processes that are gone are ignored.
pub fn read_status(home: &Home) -> io::Result<CapacityStatus> {
    let has_reserve = home.reserve_path().is_file();
    let mut blocked = Vec::new();
    let entries = match fs::read_dir(blocked_dir(home)) {
        Ok(entries) => entries,
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            return Ok(CapacityStatus {
                has_reserve,
                blocked,
            });
        }
        Err(error) => return Err(error),
    };
    for entry in entries {
        let name = entry?.file_name();
        let Some((pid, since_ms)) = name.to_str().and_then(|name| name.split_once('-')) else {
            continue;
        };
        let (Ok(pid), Ok(since_ms)) = (pid.parse::<u32>(), since_ms.parse::<u64>()) else {
            continue;
        };
        if PathBuf::from(format!("/proc/{pid}")).exists() {
            blocked.push(Blocked { pid, since_ms });
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
        let me = Blocked {
            pid: std::process::id(),
            since_ms: 1234,
        };
        mark_blocked(&home, me).expect("mark");
        // A process that cannot exist (pids are below 2^22 on Linux).
        mark_blocked(
            &home,
            Blocked {
                pid: u32::MAX - 1,
                since_ms: 1,
            },
        )
        .expect("mark");
        fs::write(home.reserve_path(), b"").expect("reserve");
        let status = read_status(&home).expect("read");
        assert!(status.has_reserve);
        assert_eq!(status.blocked, vec![me]);
        assert_eq!(status.blocked_since_ms(), Some(1234));
        clear_blocked(&home, me).expect("clear");
        assert_eq!(read_status(&home).expect("read").blocked, vec![]);
    }
}
