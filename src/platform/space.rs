//! How much room the file system holding a path has. [`space_of`], for what is shown: through
//! `sysinfo`'s list of disks (the mount whose mount point is the longest prefix of the path,
//! which names it), and through `statvfs` for a file system that list leaves out (FUSE, say).
//! [`room_of`], for what is decided at every retention pass: one `statvfs` of the path, whose
//! cost does not grow with the host's mounts (listing them costs a `statvfs` of each).

use std::io;
use std::path::{Path, PathBuf};

use sysinfo::{DiskRefreshKind, Disks};

/// The size and free space of a file system.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Space {
    pub mount_point: PathBuf,
    pub total_bytes: u64,
    /// Free to an unprivileged writer.
    pub available_bytes: u64,
}

/// The file system that holds `path` (which must exist).
pub fn space_of(path: &Path) -> io::Result<Space> {
    let path = path.canonicalize()?;
    let disks = Disks::new_with_refreshed_list_specifics(DiskRefreshKind::nothing().with_storage())
        .map_err(|error| io::Error::other(error.to_string()))?;
    let best = disks
        .iter()
        .filter(|disk| path.starts_with(disk.mount_point()))
        .max_by_key(|disk| disk.mount_point().as_os_str().len());
    if let Some(disk) = best {
        let listed_mount = disk.mount_point().to_path_buf();
        // A mount that sysinfo does not list may sit below the one it found.
        let fallback = statvfs_space(&path)?;
        if fallback.total_bytes == disk.total_space() {
            return Ok(Space {
                mount_point: listed_mount,
                total_bytes: disk.total_space(),
                available_bytes: disk.available_space(),
            });
        }
        return Ok(fallback);
    }
    statvfs_space(&path)
}

/// The size and free space of the file system that holds `path` (which must exist), from one
/// `statvfs`; `mount_point` is `path` itself.
pub fn room_of(path: &Path) -> io::Result<Space> {
    statvfs_space(path)
}

fn statvfs_space(path: &Path) -> io::Result<Space> {
    let stat = nix::sys::statvfs::statvfs(path).map_err(io::Error::from)?;
    let block = stat.fragment_size() as u64;
    Ok(Space {
        mount_point: path.to_path_buf(),
        total_bytes: (stat.blocks() as u64).saturating_mul(block),
        available_bytes: (stat.blocks_available() as u64).saturating_mul(block),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_space_of_a_directory_is_that_of_its_file_system() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let space = space_of(dir.path()).expect("the temp dir's file system answers");
        assert!(space.total_bytes > 0);
        assert!(space.available_bytes <= space.total_bytes);
        assert!(
            dir.path()
                .canonicalize()
                .expect("it exists")
                .starts_with(&space.mount_point)
        );
        // Both ways see the same file system.
        let room = room_of(dir.path()).expect("statvfs answers");
        assert_eq!(room.total_bytes, space.total_bytes);
    }
}
