//! What is known, across processes, about the journal writers and a full disk: whether the
//! space reserve is in place, and which writers are blocked waiting for space.
//!
//! A blocked writer is an empty file `blocked/<pid>-<since ms>` under the home: an empty file
//! needs an inode and a directory entry but no data block, so it can be made on a full disk,
//! and its name carries everything a reader needs.

use std::fs;
use std::io;
use std::path::PathBuf;

use crate::event::UnixMs;
use crate::home::Home;

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
