//! File-system primitives: private directories, atomic replacement, the per-run lock, logs
//! opened for appending, reads bounded in size, private Unix sockets, and the one rule of what
//! a home's directories and files must look like (like OpenSSH's StrictModes).
//!
//! Every file runjournal creates or opens for writing under a home is opened here, and none
//! through a symbolic link in its last component: temp files and markers are created
//! exclusively (`O_CREAT | O_EXCL`, which never follows a link), logs, lock files and the
//! reserve's temp file with `O_NOFOLLOW`, and each such file is checked, once open, to be a
//! regular file (or a FIFO) of this user; the journal, once open, also to be writable by nobody
//! else ([`open_existing_read_write`]). Every file of a home that runjournal reads is opened
//! here too ([`open_existing_read_only`]): no link followed, non-blocking, and only a regular
//! file read, so a FIFO put in a file's place never hangs a reader. Directories are made 0700
//! and checked to be this user's and writable by nobody else ([`judge_private`]), so nobody
//! else can plant a link or a file in them.
//!
//! Invariants:
//! * a file written here is either its old content or its new content, never a mix
//!   (same-directory temp file, then rename); only [`append_existing`] grows a file in place,
//!   and its caller checks the file's end before it trusts it. Nothing here fsyncs: these files
//!   are projections and logs, and the journal is the durable copy;
//! * a bounded read never reads more than its limit and one byte, whatever the file;
//! * no open here follows a symbolic link in the last component of its path;
//! * no open for reading here waits for a FIFO's writer, and what it returns is a regular file;
//! * a directory this module makes or hands out as private belongs to the effective user and is
//!   not writable by group or others.

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

/// `O_NOFOLLOW`: the open fails (ELOOP) when the last component is a symbolic link.
const NO_FOLLOW: i32 = nix::libc::O_NOFOLLOW;

/// `O_NONBLOCK`: the open of a FIFO without a writer returns at once instead of waiting for
/// one. It changes nothing for a regular file's reads and writes.
const NON_BLOCK: i32 = nix::libc::O_NONBLOCK;

/// What an entry of a home must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    Directory,
    File,
}

/// The kind of a file-system entry, as `lstat` or `stat` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    Directory,
    File,
    Symlink,
    Other,
}

/// What the rule of [`judge_private`] looks at: an entry's kind, owner and permission bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryFacts {
    pub kind: EntryKind,
    pub owner_uid: u32,
    /// The permission bits (`st_mode & 0o7777`).
    pub mode: u32,
}

impl EntryFacts {
    pub fn of(metadata: &fs::Metadata) -> EntryFacts {
        let file_type = metadata.file_type();
        let kind = if file_type.is_symlink() {
            EntryKind::Symlink
        } else if file_type.is_dir() {
            EntryKind::Directory
        } else if file_type.is_file() {
            EntryKind::File
        } else {
            EntryKind::Other
        };
        EntryFacts {
            kind,
            owner_uid: metadata.uid(),
            mode: metadata.mode() & 0o7777,
        }
    }
}

/// Why an entry of a home is not safe to use, with what to do about it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UnsafePath {
    #[error(
        "{path} belongs to uid {owner}, not to uid {euid} who runs runjournal: use a home of your own, or `chown {euid} {path}`",
        path = path.display()
    )]
    NotOwned {
        path: PathBuf,
        owner: u32,
        euid: u32,
    },
    #[error(
        "{path} is writable by {by} (mode {mode:o}): `chmod go-w {path}`",
        path = path.display()
    )]
    Writable {
        path: PathBuf,
        by: &'static str,
        mode: u32,
    },
    #[error(
        "{path} is a symbolic link owned by uid {owner}, neither uid {euid} nor root: remove it, or `chown -h {euid} {path}`",
        path = path.display()
    )]
    ForeignLink {
        path: PathBuf,
        owner: u32,
        euid: u32,
    },
    #[error(
        "{path} is a symbolic link: runjournal opens its files without following links; put the file itself there",
        path = path.display()
    )]
    LinkedFile { path: PathBuf },
    #[error("{path} is not a {expected}", path = path.display())]
    WrongKind {
        path: PathBuf,
        expected: &'static str,
    },
}

impl UnsafePath {
    /// The path concerned.
    pub fn path(&self) -> &Path {
        match self {
            UnsafePath::NotOwned { path, .. }
            | UnsafePath::Writable { path, .. }
            | UnsafePath::ForeignLink { path, .. }
            | UnsafePath::LinkedFile { path }
            | UnsafePath::WrongKind { path, .. } => path,
        }
    }

    /// The `UnsafePath` an I/O error of this module carries, if it is one.
    pub fn of(error: &io::Error) -> Option<&UnsafePath> {
        error.get_ref()?.downcast_ref::<UnsafePath>()
    }
}

impl From<UnsafePath> for io::Error {
    fn from(unsafe_path: UnsafePath) -> io::Error {
        io::Error::new(io::ErrorKind::PermissionDenied, unsafe_path)
    }
}

/// The one rule of what a home's directories and files must look like (pure): the entry at
/// `path` (`link`, as `lstat` shows it; `target`, as `stat` shows it when `link` is a symbolic
/// link) must be of the `expected` kind, belong to `euid`, and not be writable by group or
/// others. A directory may be reached through a symbolic link of this user or of root (a
/// home in a linked directory); a file never is, because runjournal opens files without
/// following links.
pub fn judge_private(
    path: &Path,
    link: EntryFacts,
    target: Option<EntryFacts>,
    expected: Expect,
    euid: u32,
) -> Result<(), UnsafePath> {
    let facts = if link.kind == EntryKind::Symlink {
        if expected == Expect::File {
            return Err(UnsafePath::LinkedFile {
                path: path.to_path_buf(),
            });
        }
        if link.owner_uid != euid && link.owner_uid != 0 {
            return Err(UnsafePath::ForeignLink {
                path: path.to_path_buf(),
                owner: link.owner_uid,
                euid,
            });
        }
        // A link whose target is gone, or another link's target, is judged as what it is.
        target.unwrap_or(link)
    } else {
        link
    };
    let (is_expected_kind, expected_text) = match expected {
        Expect::Directory => (facts.kind == EntryKind::Directory, "directory"),
        Expect::File => (facts.kind == EntryKind::File, "regular file"),
    };
    if !is_expected_kind {
        return Err(UnsafePath::WrongKind {
            path: path.to_path_buf(),
            expected: expected_text,
        });
    }
    if facts.owner_uid != euid {
        return Err(UnsafePath::NotOwned {
            path: path.to_path_buf(),
            owner: facts.owner_uid,
            euid,
        });
    }
    let by = match (facts.mode & 0o020 != 0, facts.mode & 0o002 != 0) {
        (false, false) => return Ok(()),
        (true, false) => "its group",
        (false, true) => "others",
        (true, true) => "its group and others",
    };
    Err(UnsafePath::Writable {
        path: path.to_path_buf(),
        by,
        mode: facts.mode,
    })
}

/// The effective user id: the user whose home this process may use.
pub fn effective_uid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// Checks the entry at `path` by [`judge_private`]. `Ok(false)` when there is nothing there
/// (it is made private when it is made); an unsafe entry is an error carrying its
/// [`UnsafePath`] (see [`UnsafePath::of`]).
pub fn check_private(path: &Path, expected: Expect) -> io::Result<bool> {
    let link = match fs::symlink_metadata(path) {
        Ok(metadata) => EntryFacts::of(&metadata),
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(error) => return Err(error),
    };
    let target = if link.kind == EntryKind::Symlink {
        match fs::metadata(path) {
            Ok(metadata) => Some(EntryFacts::of(&metadata)),
            // A dangling link: judged as a link, which is never the expected kind.
            Err(error) if error.kind() == io::ErrorKind::NotFound => None,
            Err(error) => return Err(error),
        }
    } else {
        None
    };
    judge_private(path, link, target, expected, effective_uid())?;
    Ok(true)
}

/// Checks a file this module just opened: of this user, and a regular file or a FIFO (which a
/// user may put in a log's place to follow it; a device or a directory is refused).
fn check_opened(file: File, path: &Path) -> io::Result<File> {
    let metadata = file.metadata()?;
    let is_fifo = metadata.file_type().is_fifo();
    let facts = EntryFacts::of(&metadata);
    judge_owned_file(path, facts, is_fifo)?;
    Ok(file)
}

/// An opened file must be a regular file (or a FIFO) of this user; its mode is ours to set.
fn judge_owned_file(path: &Path, facts: EntryFacts, is_fifo: bool) -> Result<(), UnsafePath> {
    let euid = effective_uid();
    if facts.kind != EntryKind::File && !is_fifo {
        return Err(UnsafePath::WrongKind {
            path: path.to_path_buf(),
            expected: "regular file",
        });
    }
    if facts.owner_uid != euid {
        return Err(UnsafePath::NotOwned {
            path: path.to_path_buf(),
            owner: facts.owner_uid,
            euid,
        });
    }
    Ok(())
}

/// Creates `dir` and its missing parents, each 0700, and checks that `dir` is private
/// ([`check_private`]): this user's, not writable by group or others.
pub fn ensure_private_dir(dir: &Path) -> io::Result<()> {
    DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    check_private(dir, Expect::Directory).map(|_| ())
}

/// [`ensure_private_dir`], and each directory it makes durable: a new directory's entry
/// survives a power cut only once the directory holding it is synced (`fsync(2)` promises
/// nothing more), so the parent of each one made is synced, outermost first. For the
/// directories that hold the journal: a commit acknowledged in a journal whose directory entry
/// was lost would be lost with it. True when this call made `dir` itself (not another process
/// at the same moment).
pub fn ensure_private_dir_durable(dir: &Path) -> io::Result<bool> {
    let mut missing = Vec::new();
    let mut cursor = Some(dir);
    while let Some(path) = cursor {
        if path.as_os_str().is_empty() || path.symlink_metadata().is_ok() {
            break;
        }
        missing.push(path);
        cursor = path.parent();
    }
    if let Some(parent) = dir.parent().filter(|parent| !parent.as_os_str().is_empty()) {
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)?;
    }
    let made = match DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => true,
        Err(error) if error.kind() == io::ErrorKind::AlreadyExists => false,
        Err(error) => return Err(error),
    };
    check_private(dir, Expect::Directory)?;
    for path in missing.iter().rev() {
        sync_parent(path)?;
    }
    Ok(made)
}

/// Syncs the directory holding `path`, making its entry (a create, a rename, an unlink there)
/// durable.
pub fn sync_parent(path: &Path) -> io::Result<()> {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => sync_dir(parent),
        _ => sync_dir(Path::new(".")),
    }
}

/// Syncs a directory: the entries in it become durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    // O_DIRECTORY: anything but a directory is refused at the open, a FIFO without waiting.
    OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_DIRECTORY)
        .open(dir)?
        .sync_all()
}

/// Creates `dir` (0700) if it does not exist, and checks that it is private; its parent must
/// exist. For a directory that belongs in an existing home (a run's): a home that was removed
/// is not made again from below.
pub fn make_private_dir(dir: &Path) -> io::Result<()> {
    match DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {}
        Err(error) => return Err(error),
    }
    check_private(dir, Expect::Directory).map(|_| ())
}

/// Creates `path` as a new, empty 0600 file: fails if anything is there already, a symbolic
/// link included (`O_CREAT | O_EXCL`).
pub fn create_exclusive(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(NO_FOLLOW)
        .open(path)
}

/// Opens `path` for appending, creating it 0600 if needed, without following a symbolic link;
/// checked to be a regular file of this user. For logs (a step's output, the runner's log).
pub fn open_append(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(NO_FOLLOW)
        .open(path)?;
    check_opened(file, path)
}

/// Opens `path` for writing from empty, creating it 0600 if needed, without following a
/// symbolic link; checked to be a regular file of this user.
pub fn open_truncated(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(NO_FOLLOW)
        .open(path)?;
    check_opened(file, path)
}

/// Opens an existing file for reading and writing, without following a symbolic link and
/// without blocking; checked, once open, by [`judge_private`] as a file: a regular file of this
/// user that group and others cannot write. For the journal file, whose records runjournal acts
/// on: the check is made on the file opened, so a file swapped in after a check by path is
/// judged too.
pub fn open_existing_read_write(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(NO_FOLLOW | NON_BLOCK)
        .open(path)
        .map_err(|error| refused_link(path, error))?;
    check_opened_private(&file, path)?;
    Ok(file)
}

/// Opens an existing regular file for reading, without following a symbolic link and without
/// blocking. Anything else in its place is refused: a link as
/// [`UnsafePath::LinkedFile`], a FIFO, a device or a directory as `InvalidData` naming what it
/// is. For every file of a home that runjournal reads (the journal read-only, projections,
/// the reconciler's cursor).
pub fn open_existing_read_only(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(NO_FOLLOW | NON_BLOCK)
        .open(path)
        .map_err(|error| refused_link(path, error))?;
    let file_type = file.metadata()?.file_type();
    if !file_type.is_file() {
        return Err(not_a_regular_file(path, file_type));
    }
    Ok(file)
}

/// Checks an open file by [`judge_private`] as a file, from its own metadata (`fstat`).
pub fn check_opened_private(file: &File, path: &Path) -> io::Result<()> {
    let facts = EntryFacts::of(&file.metadata()?);
    judge_private(path, facts, None, Expect::File, effective_uid())?;
    Ok(())
}

/// An `O_NOFOLLOW` open's ELOOP, which means a symbolic link is in the file's place, as the
/// [`UnsafePath::LinkedFile`] it is; other errors as they are.
fn refused_link(path: &Path, error: io::Error) -> io::Error {
    if error.raw_os_error() == Some(nix::libc::ELOOP) {
        UnsafePath::LinkedFile {
            path: path.to_path_buf(),
        }
        .into()
    } else {
        error
    }
}

/// The error for a file of a home that is not a regular file.
fn not_a_regular_file(path: &Path, file_type: fs::FileType) -> io::Error {
    let kind = if file_type.is_fifo() {
        "a FIFO"
    } else if file_type.is_dir() {
        "a directory"
    } else if file_type.is_char_device() || file_type.is_block_device() {
        "a device"
    } else if file_type.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    };
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{} is {kind}, not a regular file", path.display()),
    )
}

/// Replaces `path` with `bytes` atomically; the file is 0600.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let temp = temp_path(path)?;
    let result = (|| {
        let mut file = create_exclusive(&temp)?;
        file.write_all(bytes)?;
        drop(file);
        // rename replaces whatever is at `path`, a link included, never what a link points to.
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
    match create_exclusive(path) {
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

/// What tells cheaply whether a file changed since we last wrote it: which file it is (device
/// and inode: a rename puts another one in its place), its length and its modification time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileStamp {
    device: u64,
    inode: u64,
    pub len: u64,
    modified_ns: i128,
}

impl FileStamp {
    fn of(metadata: &fs::Metadata) -> FileStamp {
        use std::os::unix::fs::MetadataExt;
        FileStamp {
            device: metadata.dev(),
            inode: metadata.ino(),
            len: metadata.len(),
            modified_ns: i128::from(metadata.mtime()) * 1_000_000_000
                + i128::from(metadata.mtime_nsec()),
        }
    }
}

/// The stamp of the regular file at `path` (not followed if it is a symlink); `None` when
/// nothing is there. Anything but a regular file is an error.
pub fn stamp(path: &Path) -> io::Result<Option<FileStamp>> {
    match fs::symlink_metadata(path) {
        Ok(metadata) if metadata.file_type().is_file() => Ok(Some(FileStamp::of(&metadata))),
        Ok(_) => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} is not a regular file", path.display()),
        )),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(error),
    }
}

/// Appends `bytes` to the existing regular file at `path` (never created here, never through
/// a symlink) in one `write` where the kernel allows; returns the file's stamp after it.
/// A failure may leave part of `bytes` written: the caller must not trust the file's tail then.
pub fn append_existing(path: &Path, bytes: &[u8]) -> io::Result<FileStamp> {
    // Non-blocking: a FIFO without a reader fails the open (ENXIO) instead of hanging it.
    let file = OpenOptions::new()
        .append(true)
        .custom_flags(NO_FOLLOW | NON_BLOCK)
        .open(path)?;
    let mut file = check_opened(file, path)?;
    if !file.metadata()?.file_type().is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} is not a regular file", path.display()),
        ));
    }
    file.write_all(bytes)?;
    Ok(FileStamp::of(&file.metadata()?))
}

/// The last `max_bytes` of the file at `path` (all of it if shorter), and the file's length.
pub fn read_tail(path: &Path, max_bytes: u64) -> io::Result<(Vec<u8>, u64)> {
    use std::io::{Seek, SeekFrom};
    let mut file = open_existing_read_only(path)?;
    let len = file.metadata()?.len();
    file.seek(SeekFrom::Start(len.saturating_sub(max_bytes)))?;
    let mut bytes = Vec::new();
    file.take(max_bytes).read_to_end(&mut bytes)?;
    Ok((bytes, len))
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
/// a regular file is read ([`open_existing_read_only`]): a link, a FIFO or a device put in its
/// place is refused without blocking — it is opened non-blocking, and a FIFO without a writer
/// would otherwise hang the open.
pub fn read_file_bounded(path: &Path, limit: u64) -> io::Result<Bounded> {
    read_bounded(open_existing_read_only(path)?, limit)
}

/// An exclusive `flock` on a lock file, released on drop.
#[derive(Debug)]
pub struct FileLock {
    file: File,
}

impl FileLock {
    /// Waits for the exclusive lock on `path`, creating the file (0600) if needed; a symbolic
    /// link there is not followed.
    pub fn acquire(path: &Path) -> io::Result<FileLock> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(NO_FOLLOW)
            .open(path)?;
        let file = check_opened(file, path)?;
        file.lock()?;
        Ok(FileLock { file })
    }

    /// Takes the exclusive lock on `path` if nobody holds it, creating the file (0600) if
    /// needed; `None` when another open file holds it. A symbolic link there is not followed.
    pub fn try_acquire(path: &Path) -> io::Result<Option<FileLock>> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(NO_FOLLOW)
            .open(path)?;
        let file = check_opened(file, path)?;
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

    /// A FIFO put where a projection is appended to: with no reader, a blocking open for
    /// writing would wait forever.
    #[test]
    fn appending_to_a_fifo_without_a_reader_fails_at_once() {
        let dir = tempfile::tempdir().expect("temp dir");
        let fifo = dir.path().join("events.jsonl");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
        append_existing(&fifo, b"line\n").expect_err("a FIFO is not appended to");
        let error = read_tail(&fifo, 100).expect_err("nor read");
        assert_eq!(error.kind(), io::ErrorKind::InvalidData, "{error}");
    }

    /// A link where a home's file is read is refused as a link, naming it.
    #[test]
    fn a_read_of_a_homes_file_refuses_a_link_as_one() {
        let dir = tempfile::tempdir().expect("temp dir");
        let victim = dir.path().join("victim");
        fs::write(&victim, b"secret").expect("write");
        let planted = dir.path().join("status.json");
        std::os::unix::fs::symlink(&victim, &planted).expect("plant a link");
        let error = read_file_bounded(&planted, 100).expect_err("a link is refused");
        assert!(
            matches!(UnsafePath::of(&error), Some(UnsafePath::LinkedFile { .. })),
            "{error:?}"
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

    fn facts(kind: EntryKind, owner_uid: u32, mode: u32) -> EntryFacts {
        EntryFacts {
            kind,
            owner_uid,
            mode,
        }
    }

    /// The permission rule, case by case: who owns the entry, who may write it, what it is,
    /// and whether it is reached through a link.
    #[test]
    fn a_durable_private_dir_says_whether_this_call_made_it() {
        let dir = tempfile::tempdir().expect("temp dir");
        let nested = dir.path().join("a").join("b");
        assert!(ensure_private_dir_durable(&nested).expect("made with its parent"));
        assert!(nested.is_dir());
        assert!(
            !ensure_private_dir_durable(&nested).expect("there already"),
            "a directory that was there (another process's) is not this call's"
        );
        assert!(!ensure_private_dir_durable(&dir.path().join("a")).expect("made above"));
        let mode = fs::metadata(&nested).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
    }

    #[test]
    fn the_permission_rule_accepts_only_private_entries_of_this_user() {
        use EntryKind::{Directory, File, Other, Symlink};
        let me = 1000;
        let path = Path::new("/h");
        let ok = Ok(());
        type Case = (
            &'static str,
            EntryFacts,
            Option<EntryFacts>,
            Expect,
            Result<(), &'static str>,
        );
        let cases: Vec<Case> = vec![
            (
                "a 0700 directory of mine",
                facts(Directory, me, 0o700),
                None,
                Expect::Directory,
                ok,
            ),
            (
                "a 0755 directory of mine",
                facts(Directory, me, 0o755),
                None,
                Expect::Directory,
                ok,
            ),
            (
                "a sticky 01700 directory of mine",
                facts(Directory, me, 0o1700),
                None,
                Expect::Directory,
                ok,
            ),
            (
                "a 0600 file of mine",
                facts(File, me, 0o600),
                None,
                Expect::File,
                ok,
            ),
            (
                "a 0644 file of mine",
                facts(File, me, 0o644),
                None,
                Expect::File,
                ok,
            ),
            (
                "another user's directory",
                facts(Directory, 1001, 0o700),
                None,
                Expect::Directory,
                Err("NotOwned"),
            ),
            (
                "root's directory",
                facts(Directory, 0, 0o755),
                None,
                Expect::Directory,
                Err("NotOwned"),
            ),
            (
                "another user's file",
                facts(File, 1001, 0o600),
                None,
                Expect::File,
                Err("NotOwned"),
            ),
            (
                "a group-writable directory",
                facts(Directory, me, 0o770),
                None,
                Expect::Directory,
                Err("Writable"),
            ),
            (
                "a world-writable directory",
                facts(Directory, me, 0o707),
                None,
                Expect::Directory,
                Err("Writable"),
            ),
            (
                "a world-writable sticky directory",
                facts(Directory, me, 0o1777),
                None,
                Expect::Directory,
                Err("Writable"),
            ),
            (
                "a group-writable file",
                facts(File, me, 0o620),
                None,
                Expect::File,
                Err("Writable"),
            ),
            (
                "a file where a directory belongs",
                facts(File, me, 0o700),
                None,
                Expect::Directory,
                Err("WrongKind"),
            ),
            (
                "a directory where a file belongs",
                facts(Directory, me, 0o700),
                None,
                Expect::File,
                Err("WrongKind"),
            ),
            (
                "a FIFO where a file belongs",
                facts(Other, me, 0o600),
                None,
                Expect::File,
                Err("WrongKind"),
            ),
            (
                "my link to my directory",
                facts(Symlink, me, 0o777),
                Some(facts(Directory, me, 0o700)),
                Expect::Directory,
                ok,
            ),
            (
                "root's link to my directory",
                facts(Symlink, 0, 0o777),
                Some(facts(Directory, me, 0o700)),
                Expect::Directory,
                ok,
            ),
            (
                "another user's link to my directory",
                facts(Symlink, 1001, 0o777),
                Some(facts(Directory, me, 0o700)),
                Expect::Directory,
                Err("ForeignLink"),
            ),
            (
                "my link to another user's directory",
                facts(Symlink, me, 0o777),
                Some(facts(Directory, 1001, 0o700)),
                Expect::Directory,
                Err("NotOwned"),
            ),
            (
                "my link to a world-writable directory",
                facts(Symlink, me, 0o777),
                Some(facts(Directory, me, 0o777)),
                Expect::Directory,
                Err("Writable"),
            ),
            (
                "a dangling link",
                facts(Symlink, me, 0o777),
                None,
                Expect::Directory,
                Err("WrongKind"),
            ),
            (
                "my link to my file",
                facts(Symlink, me, 0o777),
                Some(facts(File, me, 0o600)),
                Expect::File,
                Err("LinkedFile"),
            ),
        ];
        for (case, link, target, expected, want) in cases {
            let got = judge_private(path, link, target, expected, me);
            let got = got.map_err(|error| match error {
                UnsafePath::NotOwned { .. } => "NotOwned",
                UnsafePath::Writable { .. } => "Writable",
                UnsafePath::ForeignLink { .. } => "ForeignLink",
                UnsafePath::LinkedFile { .. } => "LinkedFile",
                UnsafePath::WrongKind { .. } => "WrongKind",
            });
            assert_eq!(got, want, "{case}");
        }
    }

    #[test]
    fn each_refusal_names_the_path_and_the_fix() {
        let path = Path::new("/srv/home");
        let writable = judge_private(
            path,
            facts(EntryKind::Directory, 7, 0o777),
            None,
            Expect::Directory,
            7,
        )
        .expect_err("refused");
        assert_eq!(
            writable.to_string(),
            "/srv/home is writable by its group and others (mode 777): `chmod go-w /srv/home`"
        );
        let foreign = judge_private(
            path,
            facts(EntryKind::Directory, 8, 0o700),
            None,
            Expect::Directory,
            7,
        )
        .expect_err("refused");
        assert!(
            foreign.to_string().contains("belongs to uid 8")
                && foreign.to_string().contains("`chown 7 /srv/home`"),
            "{foreign}"
        );
    }

    #[test]
    fn a_group_writable_directory_is_refused_on_disk_and_a_private_one_accepted() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("temp dir");
        let home = dir.path().join("home");
        ensure_private_dir(&home).expect("made private");
        assert!(check_private(&home, Expect::Directory).expect("checked"));
        fs::set_permissions(&home, fs::Permissions::from_mode(0o770)).expect("chmod");
        let error = ensure_private_dir(&home).expect_err("a group-writable directory is refused");
        assert!(
            matches!(UnsafePath::of(&error), Some(UnsafePath::Writable { .. })),
            "{error}"
        );
        assert!(!check_private(&dir.path().join("missing"), Expect::Directory).expect("checked"));
    }

    /// A link planted where runjournal writes a log, a lock or a marker is never followed:
    /// the file it points to is left as it was.
    #[test]
    fn no_writer_follows_a_planted_link() {
        let dir = tempfile::tempdir().expect("temp dir");
        let victim = dir.path().join("victim");
        fs::write(&victim, b"precious").expect("write the victim");
        let planted = dir.path().join("planted");
        std::os::unix::fs::symlink(&victim, &planted).expect("plant a link");
        assert!(open_append(&planted).is_err(), "open_append");
        assert!(open_truncated(&planted).is_err(), "open_truncated");
        assert!(create_exclusive(&planted).is_err(), "create_exclusive");
        assert!(
            open_existing_read_write(&planted).is_err(),
            "open_existing_read_write"
        );
        assert!(FileLock::acquire(&planted).is_err(), "FileLock::acquire");
        touch(&planted).expect("touch finds something there and leaves it");
        write_atomic(&planted, b"new").expect("write_atomic replaces the link itself");
        assert_eq!(fs::read(&victim).expect("read"), b"precious");
        assert_eq!(fs::read(&planted).expect("read"), b"new");
        assert!(
            !fs::symlink_metadata(&planted)
                .expect("lstat")
                .file_type()
                .is_symlink()
        );
    }
}
