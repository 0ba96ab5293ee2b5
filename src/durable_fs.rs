//! File-system primitives: private directories, atomic replacement, the per-run lock, logs
//! opened for appending, reads bounded in size, private Unix sockets, the one rule of what a
//! home's directories and files must look like, and the one rule of what the directories above
//! a home must look like (both like OpenSSH's StrictModes).
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
//! Above the home, every directory the path to it passes through — each parent, and the
//! directories that hold a symbolic link on the way — must belong to root or to this user and
//! be writable by nobody else unless it is sticky ([`judge_parent`], [`check_parents`]): whoever
//! may rename an entry of one of them could swap the home for a directory of their choosing.
//! And once a home is open for work, its directory is held open ([`HomeDir`]): while it is, a
//! path under the home given to any function here is opened relative to that handle (the
//! `openat` family), so a path swapped above the home after the check cannot redirect a
//! write. Unix sockets, and a directory's watch, can only be given a path: a path under a held
//! home is handed to them through the held directory ([`held_path`]: on Linux
//! `/proc/self/fd/<home>/...`), never as it is; where the platform has no such path it is
//! refused, and the caller does without (the commit leader's socket then lives in this user's
//! private socket directory). Their peers are checked too.
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
//!   not writable by group or others;
//! * while a [`HomeDir`] lives, every path under its root is resolved from its handle, never
//!   again from the root's path, a socket's and a watch's included.

use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{self, Read, Seek, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use nix::fcntl::{AT_FDCWD, AtFlags, OFlag};
use nix::sys::stat::{FileStat, Mode};
use nix::unistd::UnlinkatFlags;

/// `O_NOFOLLOW`: the open fails (ELOOP) when the last component is a symbolic link.
const NO_FOLLOW: OFlag = OFlag::O_NOFOLLOW;

/// `O_NONBLOCK`: the open of a FIFO without a writer returns at once instead of waiting for
/// one. It changes nothing for a regular file's reads and writes.
const NON_BLOCK: OFlag = OFlag::O_NONBLOCK;

/// The mode of every file made here (0600), before the umask.
const FILE_MODE: Mode = Mode::S_IRUSR.union(Mode::S_IWUSR);

/// The mode of every directory made here (0700), before the umask.
const DIR_MODE: Mode = Mode::S_IRWXU;

/// Most symbolic links followed while the path to a home is checked, as the kernel's own
/// bound (`ELOOP`).
const MAX_LINKS_FOLLOWED: usize = 40;

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

/// What the rules of [`judge_private`] and [`judge_parent`] look at: an entry's kind, owner
/// and permission bits.
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

    /// The facts of a `stat` or `lstat` answer.
    fn of_stat(stat: &FileStat) -> EntryFacts {
        let mode = mode_bits(stat.st_mode);
        let kind = match mode & mode_bits(nix::libc::S_IFMT) {
            format if format == mode_bits(nix::libc::S_IFLNK) => EntryKind::Symlink,
            format if format == mode_bits(nix::libc::S_IFDIR) => EntryKind::Directory,
            format if format == mode_bits(nix::libc::S_IFREG) => EntryKind::File,
            _ => EntryKind::Other,
        };
        EntryFacts {
            kind,
            owner_uid: stat.st_uid,
            mode: mode & 0o7777,
        }
    }
}

/// A `mode_t` as `u32`: it is `u16` on macOS.
#[allow(clippy::useless_conversion)]
fn mode_bits(mode: nix::libc::mode_t) -> u32 {
    u32::from(mode)
}

/// Why an entry of a home, or a directory above it, is not safe to use, with what to do about
/// it.
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
    /// A directory on the way to the home belongs to someone else, who could swap the home.
    #[error(
        "{path}, a directory above the home, belongs to uid {owner}, neither root nor uid {euid} who runs runjournal: its owner could swap the home for a directory of their choosing; keep the home under directories of yours or root's",
        path = path.display()
    )]
    ForeignParent {
        path: PathBuf,
        owner: u32,
        euid: u32,
    },
    /// A directory on the way to the home may be written by others and is not sticky.
    #[error(
        "{path}, a directory above the home, is writable by {by} (mode {mode:o}) and not sticky: anyone who may write it could swap the home; `chmod go-w {path}` (or `chmod +t {path}`), or keep the home elsewhere",
        path = path.display()
    )]
    WritableParent {
        path: PathBuf,
        by: &'static str,
        mode: u32,
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
            | UnsafePath::WrongKind { path, .. }
            | UnsafePath::ForeignParent { path, .. }
            | UnsafePath::WritableParent { path, .. } => path,
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

/// Who may write an entry with permission bits `mode`, besides its owner; `None` for nobody.
fn writers_besides_owner(mode: u32) -> Option<&'static str> {
    match (mode & 0o020 != 0, mode & 0o002 != 0) {
        (false, false) => None,
        (true, false) => Some("its group"),
        (false, true) => Some("others"),
        (true, true) => Some("its group and others"),
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
        judge_link_owner(path, link, euid)?;
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
    match writers_besides_owner(facts.mode) {
        None => Ok(()),
        Some(by) => Err(UnsafePath::Writable {
            path: path.to_path_buf(),
            by,
            mode: facts.mode,
        }),
    }
}

/// A symbolic link on the way to a home, or in its place, must be this user's or root's:
/// whoever owns a link may point it elsewhere.
fn judge_link_owner(path: &Path, link: EntryFacts, euid: u32) -> Result<(), UnsafePath> {
    if link.owner_uid != euid && link.owner_uid != 0 {
        return Err(UnsafePath::ForeignLink {
            path: path.to_path_buf(),
            owner: link.owner_uid,
            euid,
        });
    }
    Ok(())
}

/// The one rule of what a directory above a home must look like (pure), as OpenSSH's
/// StrictModes judges the directories above `~/.ssh`: the directory at `path` (as `stat` shows
/// it) must belong to root or to `euid`, and not be writable by group or others unless it is
/// sticky (`/tmp`: there nobody may rename or remove another user's entry).
pub fn judge_parent(path: &Path, facts: EntryFacts, euid: u32) -> Result<(), UnsafePath> {
    if facts.kind != EntryKind::Directory {
        return Err(UnsafePath::WrongKind {
            path: path.to_path_buf(),
            expected: "directory",
        });
    }
    if facts.owner_uid != 0 && facts.owner_uid != euid {
        return Err(UnsafePath::ForeignParent {
            path: path.to_path_buf(),
            owner: facts.owner_uid,
            euid,
        });
    }
    let is_sticky = facts.mode & 0o1000 != 0;
    match writers_besides_owner(facts.mode) {
        Some(by) if !is_sticky => Err(UnsafePath::WritableParent {
            path: path.to_path_buf(),
            by,
            mode: facts.mode,
        }),
        _ => Ok(()),
    }
}

/// Checks the directories above `home` by [`judge_parent`]: the path is walked as the kernel
/// resolves it, from `/` (or the working directory, whose own path is walked), following each
/// symbolic link on the way (each must be root's or this user's), and every directory in
/// which a name is looked up is judged — so a link's own directory is judged as well as the
/// directories of its target. The walk ends at the home itself (judged by
/// [`check_private`]), or at the first name that does not exist yet: what is missing will be
/// made by this user. An unsafe directory is an error carrying its [`UnsafePath`].
pub fn check_parents(home: &Path) -> io::Result<()> {
    let euid = effective_uid();
    let absolute = if home.is_absolute() {
        home.to_path_buf()
    } else {
        std::env::current_dir()?.join(home)
    };
    let mut pending: Vec<OsString> = names_of(&absolute);
    pending.reverse();
    // The real path of the directory in which the next name is looked up.
    let mut dir = PathBuf::from("/");
    let mut links_followed = 0;
    while let Some(name) = pending.pop() {
        if name == ".." {
            dir.pop();
            continue;
        }
        let facts = EntryFacts::of(&fs::metadata(&dir)?);
        judge_parent(&dir, facts, euid)?;
        let next = dir.join(&name);
        let link = match fs::symlink_metadata(&next) {
            Ok(metadata) => EntryFacts::of(&metadata),
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(error) => return Err(error),
        };
        if link.kind != EntryKind::Symlink {
            dir = next;
            continue;
        }
        judge_link_owner(&next, link, euid)?;
        links_followed += 1;
        if links_followed > MAX_LINKS_FOLLOWED {
            return Err(io::Error::from_raw_os_error(nix::libc::ELOOP));
        }
        let target = fs::read_link(&next)?;
        if target.is_absolute() {
            dir = PathBuf::from("/");
        }
        let mut target_names = names_of(&target);
        target_names.reverse();
        pending.extend(target_names);
    }
    Ok(())
}

/// The names of a path's components, `..` kept as a name, `.` and the root left out.
fn names_of(path: &Path) -> Vec<OsString> {
    path.components()
        .filter_map(|component| match component {
            Component::Normal(name) => Some(name.to_os_string()),
            Component::ParentDir => Some(OsString::from("..")),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
        })
        .collect()
}

/// The effective user id: the user whose home this process may use.
pub fn effective_uid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// A home's directory, opened once after its parents and itself were checked, and held open
/// while the home is used: a path under its root given to this module is resolved from this
/// handle (see the module's docs), so renaming or swapping a directory above the home
/// afterwards changes nothing of where runjournal writes. Dropping the last `Arc` of it ends
/// that.
#[derive(Debug)]
pub struct HomeDir {
    root: PathBuf,
    fd: OwnedFd,
}

/// The homes this process holds open, newest last; a dropped one is skipped and pruned.
static OPEN_HOMES: Mutex<Vec<Weak<HomeDir>>> = Mutex::new(Vec::new());

impl HomeDir {
    /// Checks the directories above `root` ([`check_parents`]), opens `root` (a directory,
    /// which must exist) and checks what was opened to be a private directory of this user
    /// ([`judge_private`], from the descriptor). From then on, until the returned value and its
    /// clones are dropped, paths under `root` resolve from this handle. While this process
    /// holds `root` open already, that same handle is returned: a second store of the process
    /// (a runner admitting its queue's next run after its own ended) works in the directory the
    /// first one checked, wherever the path leads now.
    pub fn open(root: &Path) -> io::Result<Arc<HomeDir>> {
        check_parents(root)?;
        let held = OPEN_HOMES
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .rev()
            .filter_map(Weak::upgrade)
            .find(|home| home.root == root);
        if let Some(home) = held {
            check_private(root, Expect::Directory)?;
            return Ok(home);
        }
        check_private(root, Expect::Directory)?;
        let fd = nix::fcntl::openat(
            AT_FDCWD,
            root,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(io::Error::from)?;
        let directory = File::from(fd);
        let facts = EntryFacts::of(&directory.metadata()?);
        judge_private(root, facts, None, Expect::Directory, effective_uid())?;
        let home = Arc::new(HomeDir {
            root: root.to_path_buf(),
            fd: OwnedFd::from(directory),
        });
        let mut open = OPEN_HOMES.lock().unwrap_or_else(PoisonError::into_inner);
        open.retain(|held| held.strong_count() > 0);
        open.push(Arc::downgrade(&home));
        Ok(home)
    }

    /// The path the home was opened by.
    pub fn root(&self) -> &Path {
        &self.root
    }
}

/// A path as the `*at` calls take it: relative to an open home's handle when it lies under
/// one, else as it is (from the working directory).
struct Resolved {
    home: Option<Arc<HomeDir>>,
    path: PathBuf,
}

impl Resolved {
    fn of(path: &Path) -> Resolved {
        let open = OPEN_HOMES.lock().unwrap_or_else(PoisonError::into_inner);
        // The innermost open home whose root holds the path; a path climbing out with `..` is
        // left as it is.
        let mut best: Option<(Arc<HomeDir>, PathBuf)> = None;
        for held in open.iter().rev() {
            let Some(home) = held.upgrade() else {
                continue;
            };
            let Ok(rest) = path.strip_prefix(&home.root) else {
                continue;
            };
            if !rest
                .components()
                .all(|component| matches!(component, Component::Normal(_)))
            {
                continue;
            }
            let is_deeper = best.as_ref().is_none_or(|(current, _)| {
                home.root.components().count() > current.root.components().count()
            });
            if is_deeper {
                let rest = if rest.as_os_str().is_empty() {
                    PathBuf::from(".")
                } else {
                    rest.to_path_buf()
                };
                best = Some((home, rest));
            }
        }
        drop(open);
        match best {
            Some((home, rest)) => Resolved {
                home: Some(home),
                path: rest,
            },
            None => Resolved {
                home: None,
                path: path.to_path_buf(),
            },
        }
    }

    fn dirfd(&self) -> BorrowedFd<'_> {
        self.home.as_ref().map_or(AT_FDCWD, |home| home.fd.as_fd())
    }

    fn open(&self, flags: OFlag, mode: Mode) -> io::Result<File> {
        let fd = nix::fcntl::openat(
            self.dirfd(),
            self.path.as_path(),
            flags | OFlag::O_CLOEXEC,
            mode,
        )?;
        Ok(File::from(fd))
    }

    /// `lstat` (`follow` false) or `stat`; `None` when nothing is there.
    fn stat(&self, follow: bool) -> io::Result<Option<FileStat>> {
        let flags = if follow {
            AtFlags::empty()
        } else {
            AtFlags::AT_SYMLINK_NOFOLLOW
        };
        match nix::sys::stat::fstatat(self.dirfd(), self.path.as_path(), flags) {
            Ok(stat) => Ok(Some(stat)),
            Err(nix::errno::Errno::ENOENT) => Ok(None),
            Err(errno) => Err(errno.into()),
        }
    }

    fn make_dir(&self) -> io::Result<()> {
        nix::sys::stat::mkdirat(self.dirfd(), self.path.as_path(), DIR_MODE)
            .map_err(io::Error::from)
    }

    fn unlink(&self, flags: UnlinkatFlags) -> io::Result<()> {
        nix::unistd::unlinkat(self.dirfd(), self.path.as_path(), flags).map_err(io::Error::from)
    }
}

/// Renames `from` to `to` (each resolved from its home's handle), replacing what is at `to`
/// (a symbolic link there itself, never what it points to).
pub fn rename(from: &Path, to: &Path) -> io::Result<()> {
    let (from, to) = (Resolved::of(from), Resolved::of(to));
    nix::fcntl::renameat(
        from.dirfd(),
        from.path.as_path(),
        to.dirfd(),
        to.path.as_path(),
    )
    .map_err(io::Error::from)
}

/// Checks the entry at `path` by [`judge_private`]. `Ok(false)` when there is nothing there
/// (it is made private when it is made); an unsafe entry is an error carrying its
/// [`UnsafePath`] (see [`UnsafePath::of`]).
pub fn check_private(path: &Path, expected: Expect) -> io::Result<bool> {
    let resolved = Resolved::of(path);
    let Some(link) = resolved.stat(false)? else {
        return Ok(false);
    };
    let link = EntryFacts::of_stat(&link);
    let target = if link.kind == EntryKind::Symlink {
        // A dangling link: judged as a link, which is never the expected kind.
        resolved.stat(true)?.map(|stat| EntryFacts::of_stat(&stat))
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

/// Makes `dir` (0700) and its missing parents, as `mkdir -p` does; true when `dir` itself was
/// made by this call. Nothing is checked: for a directory a host may make too (a run's
/// control inbox), which its caller checks as it needs; else [`ensure_private_dir`].
pub fn make_dirs(dir: &Path) -> io::Result<bool> {
    match Resolved::of(dir).make_dir() {
        Ok(()) => return Ok(true),
        Err(error) if error.kind() == io::ErrorKind::AlreadyExists => return Ok(false),
        Err(error) if error.kind() == io::ErrorKind::NotFound => {}
        Err(error) => return Err(error),
    }
    match dir.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => {
            make_dirs(parent)?;
        }
        _ => return Err(io::Error::from(io::ErrorKind::NotFound)),
    }
    match Resolved::of(dir).make_dir() {
        Ok(()) => Ok(true),
        Err(error) if error.kind() == io::ErrorKind::AlreadyExists => Ok(false),
        Err(error) => Err(error),
    }
}

/// Creates `dir` and its missing parents, each 0700, and checks that `dir` is private
/// ([`check_private`]): this user's, not writable by group or others.
pub fn ensure_private_dir(dir: &Path) -> io::Result<()> {
    make_dirs(dir)?;
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
        if path.as_os_str().is_empty() || Resolved::of(path).stat(false)?.is_some() {
            break;
        }
        missing.push(path);
        cursor = path.parent();
    }
    let made = make_dirs(dir)?;
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
    Resolved::of(dir)
        .open(OFlag::O_RDONLY | OFlag::O_DIRECTORY, Mode::empty())?
        .sync_all()
}

/// Creates `dir` (0700) if it does not exist, and checks that it is private; its parent must
/// exist. For a directory that belongs in an existing home (a run's): a home that was removed
/// is not made again from below.
pub fn make_private_dir(dir: &Path) -> io::Result<()> {
    match Resolved::of(dir).make_dir() {
        Ok(()) => {}
        Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {}
        Err(error) => return Err(error),
    }
    check_private(dir, Expect::Directory).map(|_| ())
}

/// Creates `path` as a new, empty 0600 file: fails if anything is there already, a symbolic
/// link included (`O_CREAT | O_EXCL`).
pub fn create_exclusive(path: &Path) -> io::Result<File> {
    Resolved::of(path).open(
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | NO_FOLLOW,
        FILE_MODE,
    )
}

/// Opens `path` for appending, creating it 0600 if needed, without following a symbolic link;
/// checked to be a regular file of this user. For logs (a step's output, the runner's log).
pub fn open_append(path: &Path) -> io::Result<File> {
    let file = Resolved::of(path).open(
        OFlag::O_WRONLY | OFlag::O_APPEND | OFlag::O_CREAT | NO_FOLLOW,
        FILE_MODE,
    )?;
    check_opened(file, path)
}

/// Opens `path` for writing from empty, creating it 0600 if needed, without following a
/// symbolic link; checked to be a regular file of this user.
pub fn open_truncated(path: &Path) -> io::Result<File> {
    let file = Resolved::of(path).open(
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_TRUNC | NO_FOLLOW,
        FILE_MODE,
    )?;
    check_opened(file, path)
}

/// Opens an existing file for reading and writing, without following a symbolic link and
/// without blocking; checked, once open, by [`judge_private`] as a file: a regular file of this
/// user that group and others cannot write. For the journal file, whose records runjournal acts
/// on: the check is made on the file opened, so a file swapped in after a check by path is
/// judged too.
pub fn open_existing_read_write(path: &Path) -> io::Result<File> {
    let file = Resolved::of(path)
        .open(OFlag::O_RDWR | NO_FOLLOW | NON_BLOCK, Mode::empty())
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
    let file = Resolved::of(path)
        .open(OFlag::O_RDONLY | NO_FOLLOW | NON_BLOCK, Mode::empty())
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
        rename(&temp, path)
    })();
    if result.is_err() {
        // The temp file is ours alone; a failure to remove it changes nothing for readers.
        let _ = remove_if_present(&temp);
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

/// Removes `path` (not a directory); a file that is already gone is fine.
pub fn remove_if_present(path: &Path) -> io::Result<()> {
    remove_file(path).map(|_| ())
}

/// Removes `path` (not a directory); `Ok(false)` when nothing was there.
pub fn remove_file(path: &Path) -> io::Result<bool> {
    match Resolved::of(path).unlink(UnlinkatFlags::NoRemoveDir) {
        Ok(()) => Ok(true),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(error) => Err(error),
    }
}

/// Removes `dir` if it is empty; a missing or non-empty directory is left alone.
pub fn remove_dir_if_empty(dir: &Path) {
    // ENOTEMPTY and ENOENT are both fine outcomes here.
    let _ = Resolved::of(dir).unlink(UnlinkatFlags::RemoveDir);
}

/// Removes what is at `path`: a directory with everything in it, or any other entry (a
/// symbolic link itself, never what it points to). Nothing there is fine.
pub fn remove_tree(path: &Path) -> io::Result<()> {
    let resolved = Resolved::of(path);
    let Some(stat) = resolved.stat(false)? else {
        return Ok(());
    };
    if EntryFacts::of_stat(&stat).kind != EntryKind::Directory {
        return remove_if_present(path);
    }
    let mut names = Vec::new();
    {
        let opened = nix::dir::Dir::openat(
            resolved.dirfd(),
            resolved.path.as_path(),
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | NO_FOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        );
        let mut dir = match opened {
            Ok(dir) => dir,
            // Removed meanwhile (another pass): what was asked is done.
            Err(nix::errno::Errno::ENOENT) => return Ok(()),
            Err(errno) => return Err(errno.into()),
        };
        for entry in dir.iter() {
            let name = entry?.file_name().to_bytes().to_vec();
            if name != b"." && name != b".." {
                names.push(std::ffi::OsStr::from_bytes(&name).to_os_string());
            }
        }
    }
    for name in names {
        remove_tree(&path.join(name))?;
    }
    match resolved.unlink(UnlinkatFlags::RemoveDir) {
        Err(error) if error.kind() != io::ErrorKind::NotFound => Err(error),
        _ => Ok(()),
    }
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
        FileStamp {
            device: metadata.dev(),
            inode: metadata.ino(),
            len: metadata.len(),
            modified_ns: i128::from(metadata.mtime()) * 1_000_000_000
                + i128::from(metadata.mtime_nsec()),
        }
    }

    /// The stamp of a `stat` answer, as `FileStamp::of` reads `std`'s (whose fields are
    /// the same casts of the same `stat`: their widths differ between platforms).
    #[allow(clippy::unnecessary_cast, clippy::useless_conversion)]
    pub fn of_stat(stat: &FileStat) -> FileStamp {
        FileStamp {
            device: stat.st_dev as u64,
            inode: stat.st_ino as u64,
            len: stat.st_size as u64,
            modified_ns: i128::from(stat.st_mtime as i64) * 1_000_000_000
                + i128::from(stat.st_mtime_nsec as i64),
        }
    }

    /// Which file it is: its device and inode.
    pub fn id(&self) -> (u64, u64) {
        (self.device, self.inode)
    }

    /// Its modification time, Unix ms (before 1970: negative).
    pub fn modified_ms(&self) -> i128 {
        self.modified_ns.div_euclid(1_000_000)
    }
}

/// The stamp of the regular file at `path` (not followed if it is a symlink); `None` when
/// nothing is there. Anything but a regular file is an error.
pub fn stamp(path: &Path) -> io::Result<Option<FileStamp>> {
    match Resolved::of(path).stat(false)? {
        Some(stat) if EntryFacts::of_stat(&stat).kind == EntryKind::File => {
            Ok(Some(FileStamp::of_stat(&stat)))
        }
        Some(_) => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} is not a regular file", path.display()),
        )),
        None => Ok(None),
    }
}

/// Appends `bytes` to the existing regular file at `path` (never created here, never through
/// a symlink) in one `write` where the kernel allows; returns the file's stamp after it.
/// A failure may leave part of `bytes` written: the caller must not trust the file's tail then.
pub fn append_existing(path: &Path, bytes: &[u8]) -> io::Result<FileStamp> {
    // Non-blocking: a FIFO without a reader fails the open (ENXIO) instead of hanging it.
    let file = Resolved::of(path).open(
        OFlag::O_WRONLY | OFlag::O_APPEND | NO_FOLLOW | NON_BLOCK,
        Mode::empty(),
    )?;
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
    use std::io::SeekFrom;
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

/// The device and inode of the file at `path`, a link not followed: whether it is still the
/// file it was (a journal rebuilt in its place is another).
pub fn file_identity(path: &Path) -> Option<(u64, u64)> {
    look(path).ok().flatten().map(|entry| entry.stamp.id())
}

/// What is at a path, as `lstat` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub facts: EntryFacts,
    pub stamp: FileStamp,
}

/// What is at `path`, a symbolic link not followed; `None` when nothing is there.
pub fn look(path: &Path) -> io::Result<Option<Entry>> {
    Ok(Resolved::of(path).stat(false)?.map(|stat| Entry {
        facts: EntryFacts::of_stat(&stat),
        stamp: FileStamp::of_stat(&stat),
    }))
}

/// Whether a directory is at `path` (not a link to one). A failure to look counts as no.
pub fn is_directory(path: &Path) -> bool {
    matches!(look(path), Ok(Some(entry)) if entry.facts.kind == EntryKind::Directory)
}

/// Opens the directory at `path` (a link to one followed, as a home's directories may be
/// reached), to open and list its entries relative to it.
pub fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    Resolved::of(path)
        .open(OFlag::O_RDONLY | OFlag::O_DIRECTORY, Mode::empty())
        .map(OwnedFd::from)
}

/// The names in the directory at `path` (but `.` and `..`), in no particular order; `None`
/// when it does not exist.
pub fn dir_names(path: &Path) -> io::Result<Option<Vec<OsString>>> {
    let resolved = Resolved::of(path);
    let opened = nix::dir::Dir::openat(
        resolved.dirfd(),
        resolved.path.as_path(),
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    );
    let mut dir = match opened {
        Ok(dir) => dir,
        Err(nix::errno::Errno::ENOENT) => return Ok(None),
        Err(errno) => return Err(errno.into()),
    };
    let mut names = Vec::new();
    for entry in dir.iter() {
        let name = entry?.file_name().to_bytes().to_vec();
        if name != b"." && name != b".." {
            names.push(std::ffi::OsStr::from_bytes(&name).to_os_string());
        }
    }
    Ok(Some(names))
}

/// Opens the lock file at `path` for reading and writing, creating it (0600) if needed,
/// without following a symbolic link; checked, once open, by [`judge_private`] as a file. For
/// the locks taken over by a fresh file renamed over the old one (the commit leader's, the
/// timer's), whose file is never this module's [`FileLock`].
pub fn open_lock_file(path: &Path) -> io::Result<File> {
    let file = Resolved::of(path).open(OFlag::O_RDWR | OFlag::O_CREAT | NO_FOLLOW, FILE_MODE)?;
    check_opened_private(&file, path)?;
    Ok(file)
}

/// An exclusive `flock` on a lock file, released on drop. Taken at once or not
/// ([`FileLock::try_acquire`]), or within a bound ([`FileLock::acquire_within`]): never by an
/// unbounded wait, which a process stopped while holding the lock would make last as long as
/// it stays stopped.
#[derive(Debug)]
pub struct FileLock {
    file: File,
}

impl FileLock {
    /// Opens the lock file at `path` for the lock, creating it (0600) if needed; a symbolic
    /// link there is not followed.
    fn open(path: &Path) -> io::Result<File> {
        let file =
            Resolved::of(path).open(OFlag::O_RDWR | OFlag::O_CREAT | NO_FOLLOW, FILE_MODE)?;
        check_opened(file, path)
    }

    /// Takes the exclusive lock on `path` if nobody holds it, creating the file (0600) if
    /// needed; `None` when another open file holds it. A symbolic link there is not followed.
    pub fn try_acquire(path: &Path) -> io::Result<Option<FileLock>> {
        let file = FileLock::open(path)?;
        FileLock::try_take(file)
    }

    /// Waits at most `bound` for the exclusive lock on `path`, creating the file (0600) if
    /// needed; `None` when another open file still holds it then (a process stopped while it
    /// holds it holds it for as long as it stays stopped: `flock` itself cannot be bounded, so
    /// the lock is tried, then tried again after sleeps that grow to 2 ms). A symbolic link
    /// there is not followed.
    pub fn acquire_within(path: &Path, bound: std::time::Duration) -> io::Result<Option<FileLock>> {
        const POLL_DELAYS_US: [u64; 6] = [50, 100, 200, 500, 1000, 2000];
        let file = FileLock::open(path)?;
        let started = std::time::Instant::now();
        let mut tries = 0;
        loop {
            match file.try_lock() {
                Ok(()) => return Ok(Some(FileLock { file })),
                Err(fs::TryLockError::WouldBlock) => {}
                Err(fs::TryLockError::Error(error)) => return Err(error),
            }
            let elapsed = started.elapsed();
            if elapsed >= bound {
                return Ok(None);
            }
            let delay = std::time::Duration::from_micros(
                POLL_DELAYS_US[tries.min(POLL_DELAYS_US.len() - 1)],
            );
            tries += 1;
            std::thread::sleep(delay.min(bound - elapsed));
        }
    }

    fn try_take(file: File) -> io::Result<Option<FileLock>> {
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
    let Some(stat) = Resolved::of(path).stat(false)? else {
        return Ok(SocketPath::Missing);
    };
    let uid = effective_uid();
    let format = mode_bits(stat.st_mode) & mode_bits(nix::libc::S_IFMT);
    if format != mode_bits(nix::libc::S_IFSOCK) {
        return Ok(SocketPath::Other {
            what: "not a socket".to_string(),
        });
    }
    if stat.st_uid != uid {
        return Ok(SocketPath::Other {
            what: format!("a socket of user {}, not {uid}", stat.st_uid),
        });
    }
    Ok(SocketPath::OurSocket)
}

/// A path for the calls that take nothing but a path (a Unix socket's bind and connect, a
/// directory's watch), leading where the path it was made from leads in the held home
/// ([`held_path`]). It keeps that home held while it lives: the descriptor it names stays
/// open.
#[derive(Debug, Clone)]
pub struct HeldPath {
    _home: Option<Arc<HomeDir>>,
    path: PathBuf,
}

impl HeldPath {
    /// The path to hand to the call.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The held home `path` lies under, if any: keeping it keeps `path` resolved from its
/// directory.
pub fn holding(path: &Path) -> Option<Arc<HomeDir>> {
    Resolved::of(path).home
}

/// `path` for a call that takes nothing but a path: as it is when it lies under no held home;
/// under one, a path through the home's held directory
/// ([`crate::platform::path_through_dir`]), so that a directory above the home swapped since
/// it was checked redirects nothing. Where the platform has no such path (macOS), a path
/// under a held home is refused (`Unsupported`) rather than handed on as it is.
pub fn held_path(path: &Path) -> io::Result<HeldPath> {
    let resolved = Resolved::of(path);
    let Some(home) = resolved.home else {
        return Ok(HeldPath {
            _home: None,
            path: path.to_path_buf(),
        });
    };
    let through = crate::platform::path_through_dir(home.fd.as_fd()).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::Unsupported,
            format!(
                "{} cannot be named through the home's held directory on this system",
                path.display()
            ),
        )
    })?;
    let path = if resolved.path == Path::new(".") {
        through
    } else {
        through.join(&resolved.path)
    };
    Ok(HeldPath {
        _home: Some(home),
        path,
    })
}

/// Listens on a new Unix socket at `address` (nothing must be there), readable and writable
/// by its owner only.
pub fn bind_private_socket(address: &HeldPath) -> io::Result<UnixListener> {
    let path = address.path();
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

    /// A wait for a held lock ends at its bound with `None`; a lock let go during the wait is
    /// taken.
    #[test]
    fn a_wait_for_a_held_lock_ends_at_its_bound() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("run.lock");
        let held = FileLock::try_acquire(&path).expect("open").expect("free");
        let bound = std::time::Duration::from_millis(30);
        assert!(
            FileLock::acquire_within(&path, bound)
                .expect("open")
                .is_none(),
            "still held at the bound"
        );
        let letting_go = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            drop(held);
        });
        assert!(
            FileLock::acquire_within(&path, std::time::Duration::from_secs(60))
                .expect("open")
                .is_some(),
            "taken once let go"
        );
        letting_go.join().expect("the holder");
    }

    #[test]
    fn a_socket_path_is_told_apart_from_anything_else() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("commit.sock");
        assert_eq!(
            inspect_socket_path(&path).expect("look"),
            SocketPath::Missing
        );
        let address = held_path(&path).expect("a path under no held home is itself");
        assert_eq!(address.path(), path);
        let listener = bind_private_socket(&address).expect("bind");
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
                other => panic!("{case}: not a refusal of judge_private: {other}"),
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
        assert!(
            FileLock::acquire_within(&planted, std::time::Duration::ZERO).is_err(),
            "FileLock::acquire_within"
        );
        assert!(open_lock_file(&planted).is_err(), "open_lock_file");
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

    /// The rule for the directories above a home, case by case: owner (root, me, another),
    /// who may write it, and whether it is sticky.
    #[test]
    fn a_parent_directory_must_be_roots_or_mine_and_written_by_nobody_else_unless_sticky() {
        use EntryKind::{Directory, File};
        let me = 1000;
        let cases: [(&str, EntryFacts, Result<(), &str>); 9] = [
            ("root's 0755", facts(Directory, 0, 0o755), Ok(())),
            ("my 0700", facts(Directory, me, 0o700), Ok(())),
            ("my 0755", facts(Directory, me, 0o755), Ok(())),
            (
                "root's sticky 1777, as /tmp",
                facts(Directory, 0, 0o1777),
                Ok(()),
            ),
            (
                "another user's 0755",
                facts(Directory, 1001, 0o755),
                Err("ForeignParent"),
            ),
            (
                "another user's sticky 1777",
                facts(Directory, 1001, 0o1777),
                Err("ForeignParent"),
            ),
            (
                "root's 0777, not sticky",
                facts(Directory, 0, 0o777),
                Err("WritableParent"),
            ),
            (
                "my group-writable 0775",
                facts(Directory, me, 0o775),
                Err("WritableParent"),
            ),
            ("a file", facts(File, 0, 0o644), Err("WrongKind")),
        ];
        for (case, parent, want) in cases {
            let got = judge_parent(Path::new("/p"), parent, me).map_err(|error| match error {
                UnsafePath::ForeignParent { .. } => "ForeignParent",
                UnsafePath::WritableParent { .. } => "WritableParent",
                UnsafePath::WrongKind { .. } => "WrongKind",
                other => panic!("{case}: not a refusal of judge_parent: {other}"),
            });
            assert_eq!(got, want, "{case}");
        }
        let refusal =
            judge_parent(Path::new("/srv/p"), facts(Directory, 0, 0o777), me).expect_err("refused");
        assert!(
            refusal
                .to_string()
                .starts_with("/srv/p, a directory above the home, is writable")
                && refusal.to_string().contains("`chmod go-w /srv/p`"),
            "{refusal}"
        );
    }

    /// The walk judges the directories the path really passes through: a non-sticky
    /// world-writable directory is found whether it is named in the path or reached through a
    /// link, and a missing tail is fine (runjournal will make it).
    #[test]
    fn the_parents_are_judged_along_the_path_and_through_its_links() {
        let dir = tempfile::tempdir().expect("temp dir");
        let open = dir.path().join("open");
        fs::create_dir(&open).expect("mkdir");
        fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).expect("chmod");
        let error = check_parents(&open.join("home")).expect_err("under a writable directory");
        assert!(
            matches!(UnsafePath::of(&error), Some(UnsafePath::WritableParent { path, .. }) if *path == open),
            "{error}"
        );
        let error = check_parents(&open.join("a/b/home")).expect_err("above missing parents");
        assert!(UnsafePath::of(&error).is_some(), "{error}");
        // The link's own directory is private; its target's is not.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&open, &link).expect("symlink");
        let error = check_parents(&link.join("home")).expect_err("through a link");
        assert!(
            matches!(UnsafePath::of(&error), Some(UnsafePath::WritableParent { path, .. }) if *path == open),
            "{error}"
        );
        fs::set_permissions(&open, fs::Permissions::from_mode(0o1777)).expect("sticky");
        check_parents(&link.join("home")).expect("sticky, as /tmp");
        check_parents(&dir.path().join("missing/home")).expect("a missing tail");
        let relative = Path::new("relative-home-that-does-not-exist");
        check_parents(relative).expect("the working directory's path is walked");
    }

    /// While a home's directory is held, a rename of a directory above it and a link in its
    /// old place redirect none of this module's writes, reads or removals.
    #[test]
    fn writes_under_a_held_home_follow_its_directory_not_its_path() {
        let dir = tempfile::tempdir().expect("temp dir");
        let parent = dir.path().join("p");
        let root = parent.join("home");
        ensure_private_dir(&root).expect("home");
        let held = HomeDir::open(&root).expect("held");
        let moved = dir.path().join("p-moved");
        fs::rename(&parent, &moved).expect("rename the parent");
        let decoy = dir.path().join("decoy");
        fs::create_dir_all(decoy.join("home")).expect("decoy");
        std::os::unix::fs::symlink(&decoy, &parent).expect("a link in its place");

        let run_dir = root.join("runs/r1");
        ensure_private_dir(&run_dir).expect("mkdir -p under the home");
        write_atomic(&run_dir.join("status.json"), b"{}").expect("write_atomic");
        open_append(&run_dir.join("output-0.log"))
            .and_then(|mut log| log.write_all(b"line\n"))
            .expect("append");
        touch(&root.join("marker")).expect("touch");
        assert_eq!(
            read_file_bounded(&run_dir.join("status.json"), 10).expect("read"),
            Bounded::Whole(b"{}".to_vec())
        );
        assert!(
            stamp(&run_dir.join("output-0.log"))
                .expect("stamp")
                .is_some()
        );
        assert!(check_private(&run_dir, Expect::Directory).expect("checked"));
        let lock = FileLock::try_acquire(&root.join("commit.lock")).expect("lock");
        drop(lock);
        let lease = open_lock_file(&root.join("lease.lock")).expect("a lock file");
        let fresh = root.join("lease.lock.fresh");
        create_exclusive(&fresh).expect("a fresh lock file");
        rename(&fresh, &root.join("lease.lock")).expect("renamed over it");
        let lease_id = FileStamp::of(&lease.metadata().expect("fstat")).id();
        let found = look(&root.join("lease.lock"))
            .expect("look")
            .expect("there");
        assert_ne!(found.stamp.id(), lease_id, "the fresh file is there now");
        assert!(make_dirs(&run_dir.join("control/stop-requests")).expect("mkdir -p"));
        assert!(is_directory(&run_dir.join("control")));
        let control = open_dir(&run_dir.join("control")).expect("opened");
        assert_eq!(
            dir_names(&run_dir.join("control")).expect("listed"),
            Some(vec![OsString::from("stop-requests")])
        );
        drop(control);
        #[cfg(target_os = "linux")]
        {
            let socket = root.join("commit.sock");
            let address = held_path(&socket).expect("a path through the held directory");
            assert!(address.path().starts_with("/proc/self/fd"), "{address:?}");
            let listener = bind_private_socket(&address).expect("bind");
            assert_eq!(
                inspect_socket_path(&socket).expect("look"),
                SocketPath::OurSocket
            );
            crate::platform::connect_without_waiting(address.path()).expect("connect");
            drop(listener);
            remove_if_present(&socket).expect("removed");
        }

        let moved_home = moved.join("home");
        assert_eq!(
            fs::read(moved_home.join("runs/r1/status.json")).expect("written in the home"),
            b"{}"
        );
        assert_eq!(
            fs::read(moved_home.join("runs/r1/output-0.log")).expect("appended in the home"),
            b"line\n"
        );
        assert!(moved_home.join("marker").exists());
        assert!(moved_home.join("lease.lock").is_file());
        assert!(moved_home.join("runs/r1/control/stop-requests").is_dir());
        let strays: Vec<_> = fs::read_dir(decoy.join("home")).expect("list").collect();
        assert!(strays.is_empty(), "nothing reached the decoy: {strays:?}");

        remove_tree(&root.join("runs")).expect("remove_tree");
        assert!(!moved_home.join("runs").exists(), "removed in the home");
        drop(held);
        // Released: the path is the path again, and now leads to the decoy.
        touch(&root.join("after")).expect("touch");
        assert!(decoy.join("home/after").exists());
    }

    #[test]
    fn a_held_home_must_be_a_private_directory() {
        let dir = tempfile::tempdir().expect("temp dir");
        let root = dir.path().join("home");
        fs::create_dir(&root).expect("mkdir");
        fs::set_permissions(&root, fs::Permissions::from_mode(0o770)).expect("chmod");
        let error = HomeDir::open(&root).expect_err("group-writable");
        assert!(
            matches!(UnsafePath::of(&error), Some(UnsafePath::Writable { .. })),
            "{error}"
        );
        assert!(HomeDir::open(&dir.path().join("missing")).is_err());
    }

    #[test]
    fn remove_tree_removes_a_directory_with_everything_in_it_and_never_follows_a_link() {
        let dir = tempfile::tempdir().expect("temp dir");
        let victim = dir.path().join("victim");
        fs::create_dir(&victim).expect("mkdir");
        fs::write(victim.join("keep"), b"x").expect("write");
        let tree = dir.path().join("tree");
        fs::create_dir_all(tree.join("a/b")).expect("mkdir");
        fs::write(tree.join("a/b/f"), b"x").expect("write");
        std::os::unix::fs::symlink(&victim, tree.join("a/link")).expect("symlink");
        remove_tree(&tree).expect("removed");
        assert!(!tree.exists());
        assert!(victim.join("keep").exists(), "the link's target is left");
        remove_tree(&tree).expect("nothing there is fine");
    }
}
