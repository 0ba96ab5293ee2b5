//! File-system primitives: private directories, atomic replacement, the per-run lock, logs
//! opened for appending, reads bounded in size, and private Unix sockets.
//!
//! Invariant: a file written here is either its old content or its new content, never a mix
//! (same-directory temp file, then rename). Nothing here fsyncs: these files are projections
//! and logs, and the journal is the durable copy.
//! Invariant: a bounded read never reads more than its limit and one byte, whatever the file.

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

/// Creates `dir` and its missing parents, each 0700.
pub fn ensure_private_dir(dir: &Path) -> io::Result<()> {
    DirBuilder::new().recursive(true).mode(0o700).create(dir)
}

/// Creates `dir` (0700) if it does not exist; its parent must. For a directory that belongs
/// in an existing home (a run's): a home that was removed is not made again from below.
pub fn make_private_dir(dir: &Path) -> io::Result<()> {
    match DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(error) => Err(error),
    }
}

/// Replaces `path` with `bytes` atomically; the file is 0600.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let temp = temp_path(path)?;
    let result = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&temp)?;
        file.write_all(bytes)?;
        drop(file);
        fs::rename(&temp, path)
    })();
    if result.is_err() {
        // The temp file is ours alone; a failure to remove it changes nothing for readers.
        let _ = fs::remove_file(&temp);
    }
    result
}

fn temp_path(path: &Path) -> io::Result<PathBuf> {
    let name = path.file_name().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} has no file name", path.display()),
        )
    })?;
    let nonce: u32 = rand::random();
    let mut temp_name = std::ffi::OsString::from(".");
    temp_name.push(name);
    temp_name.push(format!(".{}.{nonce:08x}.tmp", std::process::id()));
    Ok(path.with_file_name(temp_name))
}

/// Creates `path` as an empty 0600 file if it does not exist; leaves an existing one as it is
/// (so its mtime keeps telling when it was first made).
pub fn touch(path: &Path) -> io::Result<()> {
    match OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(error) if error.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(error) => Err(error),
    }
}

/// Removes `path`; a file that is already gone is fine.
pub fn remove_if_present(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(error),
    }
}

/// Removes `dir` if it is empty; a missing or non-empty directory is left alone.
pub fn remove_dir_if_empty(dir: &Path) {
    // ENOTEMPTY and ENOENT are both fine outcomes here.
    let _ = fs::remove_dir(dir);
}

/// Opens a log (a step's output, the runner's log) for appending, 0600, creating it if
/// needed.
pub fn open_append(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
}

/// What a bounded read found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bounded {
    /// Everything there was, at most the limit.
    Whole(Vec<u8>),
    /// There is more than the limit: the first `limit` bytes, and nothing more was read.
    Over(Vec<u8>),
}

/// Reads `reader` to its end, or up to `limit` bytes and one more, which tells that there is
/// more: an endless source (`/dev/zero`) is refused after `limit + 1` bytes.
pub fn read_bounded(reader: impl Read, limit: u64) -> io::Result<Bounded> {
    let mut bytes = Vec::new();
    reader
        .take(limit.saturating_add(1))
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        bytes.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
        Ok(Bounded::Over(bytes))
    } else {
        Ok(Bounded::Whole(bytes))
    }
}

/// A file of the home (a projection, the reconciler's cursor) read up to `limit` bytes. Only
/// a regular file is read: a FIFO or a device put in its place is refused (`InvalidData`)
/// without blocking — it is opened non-blocking, and a FIFO without a writer would otherwise
/// hang the open.
pub fn read_file_bounded(path: &Path, limit: u64) -> io::Result<Bounded> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open(path)?;
    let file_type = file.metadata()?.file_type();
    if !file_type.is_file() {
        let kind = if file_type.is_fifo() {
            "a FIFO"
        } else if file_type.is_dir() {
            "a directory"
        } else if file_type.is_char_device() || file_type.is_block_device() {
            "a device"
        } else {
            "not a regular file"
        };
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} is {kind}, not a regular file", path.display()),
        ));
    }
    read_bounded(file, limit)
}

/// An exclusive `flock` on a lock file, released on drop.
#[derive(Debug)]
pub struct FileLock {
    file: File,
}

impl FileLock {
    /// Waits for the exclusive lock on `path`, creating the file (0600) if needed.
    pub fn acquire(path: &Path) -> io::Result<FileLock> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)?;
        file.lock()?;
        Ok(FileLock { file })
    }

    /// Takes the exclusive lock on `path` if nobody holds it, creating the file (0600) if
    /// needed; `None` when another open file holds it. A symlink at `path` is refused.
    pub fn try_acquire(path: &Path) -> io::Result<Option<FileLock>> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(path)?;
        match file.try_lock() {
            Ok(()) => Ok(Some(FileLock { file })),
            Err(fs::TryLockError::WouldBlock) => Ok(None),
            Err(fs::TryLockError::Error(error)) => Err(error),
        }
    }

    /// Replaces the lock file's content with `note` (who holds it, for people and tests to
    /// read; nothing decides by it).
    pub fn write_note(&self, note: &[u8]) -> io::Result<()> {
        let mut file = &self.file;
        file.set_len(0)?;
        file.rewind()?;
        file.write_all(note)
    }
}

/// What is at the path where a private Unix socket should be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SocketPath {
    Missing,
    /// A socket owned by this process's user.
    OurSocket,
    /// Something else: a socket of another user, or not a socket at all. Never used, never
    /// removed.
    Other {
        what: String,
    },
}

/// Looks at `path` without following a symlink there.
pub fn inspect_socket_path(path: &Path) -> io::Result<SocketPath> {
    let metadata = match fs::symlink_metadata(path) {
        Ok(metadata) => metadata,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(SocketPath::Missing),
        Err(error) => return Err(error),
    };
    let uid = nix::unistd::geteuid().as_raw();
    if !metadata.file_type().is_socket() {
        return Ok(SocketPath::Other {
            what: "not a socket".to_string(),
        });
    }
    if metadata.uid() != uid {
        return Ok(SocketPath::Other {
            what: format!("a socket of user {}, not {uid}", metadata.uid()),
        });
    }
    Ok(SocketPath::OurSocket)
}

/// Listens on a new Unix socket at `path` (which must not exist), readable and writable by
/// its owner only.
pub fn bind_private_socket(path: &Path) -> io::Result<UnixListener> {
    let listener = UnixListener::bind(path)?;
    if let Err(error) = fs::set_permissions(path, fs::Permissions::from_mode(0o600)) {
        let _ = fs::remove_file(path);
        return Err(error);
    }
    Ok(listener)
}

impl Drop for FileLock {
    fn drop(&mut self) {
        // Closing the file releases the lock as well; unlocking first only makes it prompt.
        let _ = self.file.unlock();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn atomic_write_replaces_content_and_leaves_no_temp_file() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("status.json");
        write_atomic(&path, b"old").expect("first write");
        write_atomic(&path, b"new").expect("second write");
        assert_eq!(fs::read(&path).expect("read"), b"new");
        let mode = fs::metadata(&path).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let names: Vec<_> = fs::read_dir(dir.path())
            .expect("list")
            .map(|entry| entry.expect("entry").file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("status.json")]);
    }

    #[test]
    fn private_dirs_are_0700() {
        let dir = tempfile::tempdir().expect("temp dir");
        let nested = dir.path().join("a/b");
        ensure_private_dir(&nested).expect("create");
        for path in [dir.path().join("a"), nested] {
            let mode = fs::metadata(&path).expect("stat").permissions().mode() & 0o777;
            assert_eq!(mode, 0o700, "{}", path.display());
        }
    }

    #[test]
    fn a_held_lock_is_not_taken_again_and_is_free_once_dropped() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("commit.lock");
        let held = FileLock::try_acquire(&path).expect("open").expect("free");
        held.write_note(b"4242\n").expect("note");
        assert!(
            FileLock::try_acquire(&path).expect("open").is_none(),
            "held"
        );
        drop(held);
        assert!(
            FileLock::try_acquire(&path).expect("open").is_some(),
            "free"
        );
        assert_eq!(fs::read(&path).expect("read"), b"4242\n");
        std::os::unix::fs::symlink(&path, dir.path().join("link")).expect("symlink");
        assert!(FileLock::try_acquire(&dir.path().join("link")).is_err());
    }

    #[test]
    fn a_socket_path_is_told_apart_from_anything_else() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("commit.sock");
        assert_eq!(
            inspect_socket_path(&path).expect("look"),
            SocketPath::Missing
        );
        let listener = bind_private_socket(&path).expect("bind");
        assert_eq!(
            inspect_socket_path(&path).expect("look"),
            SocketPath::OurSocket
        );
        let mode = fs::metadata(&path).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        drop(listener);
        fs::remove_file(&path).expect("remove");
        fs::write(&path, b"not a socket").expect("write");
        assert!(matches!(
            inspect_socket_path(&path).expect("look"),
            SocketPath::Other { .. }
        ));
    }

    #[test]
    fn a_bounded_read_stops_one_byte_past_its_limit() {
        let endless = std::io::repeat(0x5a);
        assert_eq!(
            read_bounded(endless, 4).expect("reads"),
            Bounded::Over(vec![0x5a; 4])
        );
        assert_eq!(
            read_bounded(&b"abcd"[..], 4).expect("reads"),
            Bounded::Whole(b"abcd".to_vec())
        );
        assert_eq!(
            read_bounded(&b"abcde"[..], 4).expect("reads"),
            Bounded::Over(b"abcd".to_vec())
        );
    }

    #[test]
    fn a_bounded_file_read_refuses_what_is_not_a_regular_file() {
        let dir = tempfile::tempdir().expect("temp dir");
        let fifo = dir.path().join("status.json");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
        // A FIFO without a writer: a blocking open would hang here.
        let error = read_file_bounded(&fifo, 100).expect_err("a FIFO is refused");
        assert_eq!(error.kind(), io::ErrorKind::InvalidData, "{error}");
        assert!(error.to_string().contains("FIFO"), "{error}");
        let error = read_file_bounded(Path::new("/dev/zero"), 100).expect_err("a device");
        assert_eq!(error.kind(), io::ErrorKind::InvalidData, "{error}");
        let file = dir.path().join("plain");
        fs::write(&file, b"0123456789").expect("write");
        assert_eq!(
            read_file_bounded(&file, 4).expect("reads"),
            Bounded::Over(b"0123".to_vec())
        );
    }

    #[test]
    fn touch_keeps_existing_content() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("marker");
        fs::write(&path, b"x").expect("write");
        touch(&path).expect("touch");
        assert_eq!(fs::read(&path).expect("read"), b"x");
    }
}
