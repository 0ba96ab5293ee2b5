//! The FUSE file system over an [`Image`], its mount, its cut and its remount.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use fuser::{
    BackgroundSession, Config, Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation,
    INodeNo, LockOwner, MountOption, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow,
    WriteFlags,
};

use crate::image::{Image, Inode, Node, PendingWrite, apply, torn_prefix};

/// How long the kernel may keep an entry or attributes: not at all, so every lookup and
/// `stat` asks this file system (simple to reason about; a test's workload is small).
const TTL: Duration = Duration::ZERO;

/// What a cut keeps of the last write no `fsync` made durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tear {
    /// Nothing: every unsynced byte is lost.
    None,
    /// Its bytes up to its n-th 512-byte sector boundary (or up to its last boundary, when it
    /// has fewer); nothing when no boundary falls inside it.
    Sectors(u64),
}

struct Hook {
    name: OsString,
    remaining: u64,
    tear: Tear,
}

/// Everything behind the session's lock.
struct Shared {
    image: Image,
    /// What the cut left, once there was one: from then on every request fails.
    after_cut: Option<Image>,
    last_write: Option<PendingWrite>,
    hook: Option<Hook>,
    fsyncs: HashMap<OsString, u64>,
    handles: HashMap<u64, Handle>,
    next_fh: u64,
}

/// An open file: whether it was opened `O_APPEND`.
struct Handle {
    append: bool,
}

impl Shared {
    fn new(image: Image) -> Shared {
        Shared {
            image,
            after_cut: None,
            last_write: None,
            hook: None,
            fsyncs: HashMap::new(),
            handles: HashMap::new(),
            next_fh: 1,
        }
    }

    fn cut(&mut self, tear: Tear) -> bool {
        if self.after_cut.is_some() {
            return false;
        }
        let torn = match tear {
            Tear::None => None,
            Tear::Sectors(sectors) => self
                .last_write
                .as_ref()
                .and_then(|write| torn_prefix(write, sectors)),
        };
        self.after_cut = Some(self.image.after_cut(torn.as_ref()));
        true
    }

    fn live(&mut self) -> Result<&mut Image, Errno> {
        if self.after_cut.is_some() {
            return Err(Errno::EIO);
        }
        Ok(&mut self.image)
    }

    fn open_handle(&mut self, flags: i32) -> u64 {
        let fh = self.next_fh;
        self.next_fh += 1;
        self.handles.insert(
            fh,
            Handle {
                append: flags & libc::O_APPEND != 0,
            },
        );
        fh
    }
}

fn attr(ino: u64, inode: &Inode) -> FileAttr {
    let (kind, rdev) = match &inode.node {
        Node::File { .. } => (FileType::RegularFile, 0),
        Node::Dir { .. } => (FileType::Directory, 0),
        Node::Symlink { .. } => (FileType::Symlink, 0),
        Node::Special { kind, rdev } => (
            if *kind == libc::S_IFSOCK {
                FileType::Socket
            } else if *kind == libc::S_IFCHR {
                FileType::CharDevice
            } else if *kind == libc::S_IFBLK {
                FileType::BlockDevice
            } else {
                FileType::NamedPipe
            },
            *rdev,
        ),
    };
    let size = inode.size();
    FileAttr {
        ino: INodeNo(ino),
        size,
        blocks: size.div_ceil(512),
        atime: inode.atime,
        mtime: inode.mtime,
        ctime: inode.ctime,
        crtime: inode.ctime,
        kind,
        perm: inode.perm,
        nlink: if inode.is_dir() { 2 } else { inode.links },
        uid: inode.uid,
        gid: inode.gid,
        rdev,
        blksize: 4096,
        flags: 0,
    }
}

fn file_type_of(inode: &Inode) -> FileType {
    attr(0, inode).kind
}

fn entries(image: &Image, dir: u64) -> Result<&BTreeMap<OsString, u64>, Errno> {
    match image.inodes.get(&dir).map(|inode| &inode.node) {
        Some(Node::Dir { current, .. }) => Ok(current),
        Some(_) => Err(Errno::ENOTDIR),
        None => Err(Errno::ENOENT),
    }
}

fn entries_mut(image: &mut Image, dir: u64) -> Result<&mut BTreeMap<OsString, u64>, Errno> {
    match image.inodes.get_mut(&dir).map(|inode| &mut inode.node) {
        Some(Node::Dir { current, .. }) => Ok(current),
        Some(_) => Err(Errno::ENOTDIR),
        None => Err(Errno::ENOENT),
    }
}

fn lookup_in(image: &Image, dir: u64, name: &OsStr) -> Result<u64, Errno> {
    entries(image, dir)?.get(name).copied().ok_or(Errno::ENOENT)
}

fn unlink_count(image: &mut Image, ino: u64) {
    if let Some(inode) = image.inodes.get_mut(&ino) {
        inode.links = inode.links.saturating_sub(1);
        inode.ctime = SystemTime::now();
    }
}

fn is_empty_dir(image: &Image, ino: u64) -> bool {
    matches!(entries(image, ino), Ok(entries) if entries.is_empty())
}

/// Adds a new inode named `name` in `parent`; `EEXIST` if the name is taken.
fn add_entry(image: &mut Image, parent: u64, name: &OsStr, mut inode: Inode) -> Result<u64, Errno> {
    if name.as_bytes().len() > 255 {
        return Err(Errno::ENAMETOOLONG);
    }
    if entries(image, parent)?.contains_key(name) {
        return Err(Errno::EEXIST);
    }
    inode.links = 1;
    let ino = image.add(inode);
    entries_mut(image, parent)?.insert(name.to_os_string(), ino);
    if let Some(parent) = image.inodes.get_mut(&parent) {
        parent.touch();
    }
    Ok(ino)
}

fn rename_in(
    image: &mut Image,
    parent: u64,
    name: &OsStr,
    new_parent: u64,
    new_name: &OsStr,
    flags: RenameFlags,
) -> Result<(), Errno> {
    let moved = lookup_in(image, parent, name)?;
    entries(image, new_parent)?;
    let replaced = lookup_in(image, new_parent, new_name).ok();
    if flags.contains(RenameFlags::RENAME_EXCHANGE) {
        let Some(other) = replaced else {
            return Err(Errno::ENOENT);
        };
        entries_mut(image, parent)?.insert(name.to_os_string(), other);
        entries_mut(image, new_parent)?.insert(new_name.to_os_string(), moved);
        set_parent(image, other, parent);
        set_parent(image, moved, new_parent);
        return Ok(());
    }
    if let Some(replaced) = replaced {
        if flags.contains(RenameFlags::RENAME_NOREPLACE) {
            return Err(Errno::EEXIST);
        }
        if replaced == moved {
            return Ok(());
        }
        let moved_is_dir = image.inodes.get(&moved).is_some_and(Inode::is_dir);
        let replaced_is_dir = image.inodes.get(&replaced).is_some_and(Inode::is_dir);
        match (moved_is_dir, replaced_is_dir) {
            (true, false) => return Err(Errno::ENOTDIR),
            (false, true) => return Err(Errno::EISDIR),
            (true, true) if !is_empty_dir(image, replaced) => return Err(Errno::ENOTEMPTY),
            _ => {}
        }
        unlink_count(image, replaced);
    }
    entries_mut(image, parent)?.remove(name);
    entries_mut(image, new_parent)?.insert(new_name.to_os_string(), moved);
    set_parent(image, moved, new_parent);
    if let Some(inode) = image.inodes.get_mut(&moved) {
        inode.name = new_name.to_os_string();
        inode.ctime = SystemTime::now();
    }
    for dir in [parent, new_parent] {
        if let Some(dir) = image.inodes.get_mut(&dir) {
            dir.touch();
        }
    }
    Ok(())
}

fn set_parent(image: &mut Image, ino: u64, new_parent: u64) {
    if let Some(Inode {
        node: Node::Dir { parent, .. },
        ..
    }) = image.inodes.get_mut(&ino)
    {
        *parent = new_parent;
    }
}

/// The FUSE side: every request takes the lock, so the cut is one point in their order.
struct Fs {
    shared: Arc<Mutex<Shared>>,
}

impl Fs {
    fn lock(&self) -> MutexGuard<'_, Shared> {
        // A panic while holding the lock leaves a state no worse than the panic itself: a
        // test disk goes on serving it.
        self.shared
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn reply_entry(
        &self,
        reply: ReplyEntry,
        outcome: impl FnOnce(&mut Image) -> Result<u64, Errno>,
    ) {
        let mut shared = self.lock();
        let result = shared.live().and_then(|image| {
            let ino = outcome(image)?;
            let inode = image.inodes.get(&ino).ok_or(Errno::ENOENT)?;
            Ok(attr(ino, inode))
        });
        match result {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(errno) => reply.error(errno),
        }
    }

    fn reply_empty(
        &self,
        reply: ReplyEmpty,
        outcome: impl FnOnce(&mut Shared) -> Result<(), Errno>,
    ) {
        let mut shared = self.lock();
        let result = match shared.live() {
            Ok(_) => outcome(&mut shared),
            Err(errno) => Err(errno),
        };
        match result {
            Ok(()) => reply.ok(),
            Err(errno) => reply.error(errno),
        }
    }
}

impl fuser::Filesystem for Fs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.reply_entry(reply, |image| lookup_in(image, parent.0, name));
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let mut shared = self.lock();
        let result = shared.live().and_then(|image| {
            let inode = image.inodes.get(&ino.0).ok_or(Errno::ENOENT)?;
            Ok(attr(ino.0, inode))
        });
        match result {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(errno) => reply.error(errno),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut shared = self.lock();
        let result = shared.live().and_then(|image| {
            let inode = image.inodes.get_mut(&ino.0).ok_or(Errno::ENOENT)?;
            let time = |value: TimeOrNow| match value {
                TimeOrNow::SpecificTime(time) => time,
                TimeOrNow::Now => SystemTime::now(),
            };
            if let Some(size) = size {
                let Node::File { current, .. } = &mut inode.node else {
                    return Err(Errno::EISDIR);
                };
                current.resize(usize::try_from(size).map_err(|_| Errno::EFBIG)?, 0);
                inode.touch();
            }
            if let Some(mode) = mode {
                inode.perm = (mode & 0o7777) as u16;
            }
            if let Some(uid) = uid {
                inode.uid = uid;
            }
            if let Some(gid) = gid {
                inode.gid = gid;
            }
            if let Some(atime) = atime {
                inode.atime = time(atime);
            }
            if let Some(mtime) = mtime {
                inode.mtime = time(mtime);
            }
            inode.ctime = SystemTime::now();
            Ok(attr(ino.0, inode))
        });
        match result {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(errno) => reply.error(errno),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let mut shared = self.lock();
        let result = shared.live().and_then(|image| {
            match image.inodes.get(&ino.0).map(|inode| &inode.node) {
                Some(Node::Symlink { target }) => Ok(target.as_os_str().as_bytes().to_vec()),
                Some(_) => Err(Errno::EINVAL),
                None => Err(Errno::ENOENT),
            }
        });
        match result {
            Ok(target) => reply.data(&target),
            Err(errno) => reply.error(errno),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let (uid, gid) = (req.uid(), req.gid());
        self.reply_entry(reply, |image| {
            let kind = mode & libc::S_IFMT;
            let node = if kind == libc::S_IFREG || kind == 0 {
                Node::File {
                    current: Vec::new(),
                    durable: Vec::new(),
                }
            } else {
                Node::Special { kind, rdev }
            };
            let perm = (mode & !umask & 0o7777) as u16;
            add_entry(
                image,
                parent.0,
                name,
                Inode::new(node, perm, uid, gid, name),
            )
        });
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let (uid, gid) = (req.uid(), req.gid());
        self.reply_entry(reply, |image| {
            let node = Node::Dir {
                current: BTreeMap::new(),
                durable: BTreeMap::new(),
                parent: parent.0,
            };
            let perm = (mode & !umask & 0o7777) as u16;
            add_entry(
                image,
                parent.0,
                name,
                Inode::new(node, perm, uid, gid, name),
            )
        });
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.reply_empty(reply, |shared| {
            let image = &mut shared.image;
            let ino = lookup_in(image, parent.0, name)?;
            if image.inodes.get(&ino).is_some_and(Inode::is_dir) {
                return Err(Errno::EISDIR);
            }
            entries_mut(image, parent.0)?.remove(name);
            unlink_count(image, ino);
            if let Some(dir) = image.inodes.get_mut(&parent.0) {
                dir.touch();
            }
            Ok(())
        });
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.reply_empty(reply, |shared| {
            let image = &mut shared.image;
            let ino = lookup_in(image, parent.0, name)?;
            if !image.inodes.get(&ino).is_some_and(Inode::is_dir) {
                return Err(Errno::ENOTDIR);
            }
            if !is_empty_dir(image, ino) {
                return Err(Errno::ENOTEMPTY);
            }
            entries_mut(image, parent.0)?.remove(name);
            unlink_count(image, ino);
            if let Some(dir) = image.inodes.get_mut(&parent.0) {
                dir.touch();
            }
            Ok(())
        });
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let (uid, gid) = (req.uid(), req.gid());
        self.reply_entry(reply, |image| {
            let node = Node::Symlink {
                target: target.to_path_buf(),
            };
            add_entry(
                image,
                parent.0,
                link_name,
                Inode::new(node, 0o777, uid, gid, link_name),
            )
        });
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        self.reply_empty(reply, |shared| {
            rename_in(
                &mut shared.image,
                parent.0,
                name,
                newparent.0,
                newname,
                flags,
            )
        });
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        self.reply_entry(reply, |image| {
            if image.inodes.get(&ino.0).ok_or(Errno::ENOENT)?.is_dir() {
                return Err(Errno::EPERM);
            }
            if entries(image, newparent.0)?.contains_key(newname) {
                return Err(Errno::EEXIST);
            }
            entries_mut(image, newparent.0)?.insert(newname.to_os_string(), ino.0);
            if let Some(inode) = image.inodes.get_mut(&ino.0) {
                inode.links += 1;
                inode.name = newname.to_os_string();
                inode.ctime = SystemTime::now();
            }
            Ok(ino.0)
        });
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let mut shared = self.lock();
        let result = shared.live().and_then(|image| {
            image.inodes.get(&ino.0).ok_or(Errno::ENOENT)?;
            Ok(())
        });
        match result {
            Ok(()) => {
                let fh = shared.open_handle(flags.0);
                reply.opened(FileHandle(fh), FopenFlags::empty());
            }
            Err(errno) => reply.error(errno),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let mut shared = self.lock();
        let result = shared.live().and_then(|image| {
            match image.inodes.get(&ino.0).map(|inode| &inode.node) {
                Some(Node::File { current, .. }) => {
                    let start = usize::try_from(offset)
                        .unwrap_or(usize::MAX)
                        .min(current.len());
                    let end = start.saturating_add(size as usize).min(current.len());
                    Ok(current[start..end].to_vec())
                }
                Some(Node::Dir { .. }) => Err(Errno::EISDIR),
                Some(_) => Err(Errno::EINVAL),
                None => Err(Errno::ENOENT),
            }
        });
        match result {
            Ok(data) => reply.data(&data),
            Err(errno) => reply.error(errno),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let mut shared = self.lock();
        let append = shared
            .handles
            .get(&fh.0)
            .is_some_and(|handle| handle.append);
        let result = shared.live().and_then(|image| {
            let inode = image.inodes.get_mut(&ino.0).ok_or(Errno::ENOENT)?;
            let Node::File { current, .. } = &mut inode.node else {
                return Err(Errno::EINVAL);
            };
            let offset = if append { current.len() as u64 } else { offset };
            let write = PendingWrite {
                ino: ino.0,
                offset,
                data: data.to_vec(),
            };
            usize::try_from(offset)
                .ok()
                .and_then(|start| start.checked_add(data.len()))
                .ok_or(Errno::EFBIG)?;
            apply(current, &write);
            inode.touch();
            Ok(write)
        });
        match result {
            Ok(write) => {
                shared.last_write = Some(write);
                reply.written(data.len() as u32);
            }
            Err(errno) => reply.error(errno),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.lock().handles.remove(&fh.0);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.reply_empty(reply, |shared| {
            let inode = shared.image.inodes.get_mut(&ino.0).ok_or(Errno::ENOENT)?;
            match &mut inode.node {
                Node::File { current, durable } => durable.clone_from(current),
                Node::Dir {
                    current, durable, ..
                } => durable.clone_from(current),
                Node::Symlink { .. } | Node::Special { .. } => {}
            }
            let name = inode.name.clone();
            if shared
                .last_write
                .as_ref()
                .is_some_and(|write| write.ino == ino.0)
            {
                shared.last_write = None;
            }
            *shared.fsyncs.entry(name.clone()).or_default() += 1;
            let fire = match &mut shared.hook {
                Some(hook) if hook.name == name => {
                    hook.remaining = hook.remaining.saturating_sub(1);
                    (hook.remaining == 0).then_some(hook.tear)
                }
                _ => None,
            };
            if let Some(tear) = fire {
                shared.hook = None;
                shared.cut(tear);
            }
            Ok(())
        });
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let mut shared = self.lock();
        let listing = shared.live().and_then(|image| {
            let inode = image.inodes.get(&ino.0).ok_or(Errno::ENOENT)?;
            let Node::Dir {
                current, parent, ..
            } = &inode.node
            else {
                return Err(Errno::ENOTDIR);
            };
            let mut listing = vec![
                (ino.0, FileType::Directory, OsString::from(".")),
                (*parent, FileType::Directory, OsString::from("..")),
            ];
            for (name, &child) in current {
                if let Some(child_inode) = image.inodes.get(&child) {
                    listing.push((child, file_type_of(child_inode), name.clone()));
                }
            }
            Ok(listing)
        });
        match listing {
            Ok(listing) => {
                let skip = usize::try_from(offset).unwrap_or(usize::MAX);
                for (index, (child, kind, name)) in listing.into_iter().enumerate().skip(skip) {
                    if reply.add(INodeNo(child), index as u64 + 1, kind, &name) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(errno) => reply.error(errno),
        }
    }

    fn fsyncdir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.fsync(req, ino, fh, datasync, reply);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let mut shared = self.lock();
        let result = shared.live().map(|image| {
            let used: u64 = image
                .inodes
                .values()
                .map(|inode| inode.size().div_ceil(4096))
                .sum();
            (used, image.inodes.len() as u64)
        });
        match result {
            Ok((used, files)) => {
                let blocks: u64 = 4 << 20;
                let inodes: u64 = 1 << 20;
                let free = blocks.saturating_sub(used);
                reply.statfs(
                    blocks,
                    free,
                    free,
                    inodes,
                    inodes.saturating_sub(files),
                    4096,
                    255,
                    4096,
                );
            }
            Err(errno) => reply.error(errno),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let (uid, gid) = (req.uid(), req.gid());
        let mut shared = self.lock();
        let result = shared.live().and_then(|image| {
            let node = Node::File {
                current: Vec::new(),
                durable: Vec::new(),
            };
            let perm = (mode & !umask & 0o7777) as u16;
            let ino = add_entry(
                image,
                parent.0,
                name,
                Inode::new(node, perm, uid, gid, name),
            )?;
            let inode = image.inodes.get(&ino).ok_or(Errno::ENOENT)?;
            Ok(attr(ino, inode))
        });
        match result {
            Ok(attr) => {
                let fh = shared.open_handle(flags);
                reply.created(
                    &TTL,
                    &attr,
                    Generation(0),
                    FileHandle(fh),
                    FopenFlags::empty(),
                );
            }
            Err(errno) => reply.error(errno),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        self.reply_empty(reply, |shared| {
            if mode & !libc::FALLOC_FL_KEEP_SIZE != 0 {
                return Err(Errno::EOPNOTSUPP);
            }
            let inode = shared.image.inodes.get_mut(&ino.0).ok_or(Errno::ENOENT)?;
            let Node::File { current, .. } = &mut inode.node else {
                return Err(Errno::EINVAL);
            };
            let end = offset.checked_add(length).ok_or(Errno::EFBIG)?;
            let end = usize::try_from(end).map_err(|_| Errno::EFBIG)?;
            if mode & libc::FALLOC_FL_KEEP_SIZE == 0 && current.len() < end {
                current.resize(end, 0);
                inode.touch();
            }
            Ok(())
        });
    }
}

/// A mounted lazy disk. Dropping it unmounts it.
pub struct LazyDisk {
    mountpoint: PathBuf,
    shared: Arc<Mutex<Shared>>,
    session: Option<BackgroundSession>,
}

impl LazyDisk {
    /// Mounts an empty lazy disk on `mountpoint` (an existing empty directory); its root is
    /// durable, owned by the caller, mode 0755.
    ///
    /// # Errors
    ///
    /// When FUSE cannot mount there (no `/dev/fuse`, no permission).
    pub fn mount(mountpoint: &Path) -> io::Result<LazyDisk> {
        let image = Image::empty(
            nix::unistd::geteuid().as_raw(),
            nix::unistd::getegid().as_raw(),
        );
        let shared = Arc::new(Mutex::new(Shared::new(image)));
        let session = start(mountpoint, &shared)?;
        Ok(LazyDisk {
            mountpoint: mountpoint.to_path_buf(),
            shared,
            session: Some(session),
        })
    }

    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        &self.mountpoint
    }

    fn lock(&self) -> MutexGuard<'_, Shared> {
        self.shared
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Cuts the power now: what is durable at this instant is what the next [`remount`]
    /// serves; every request until then fails with `EIO`. False when it was already cut (by
    /// [`cut_after_fsync`]).
    ///
    /// [`remount`]: LazyDisk::remount
    /// [`cut_after_fsync`]: LazyDisk::cut_after_fsync
    pub fn cut(&self, tear: Tear) -> bool {
        self.lock().cut(tear)
    }

    /// Whether it has been cut (since the last mount).
    pub fn is_cut(&self) -> bool {
        self.lock().after_cut.is_some()
    }

    /// Arms a cut right after the `k`-th `fsync` (counted from now, `k` at least 1) of a file
    /// or directory last named `name` has made it durable; that `fsync` returns success.
    pub fn cut_after_fsync(&self, name: &str, k: u64, tear: Tear) {
        self.lock().hook = Some(Hook {
            name: OsString::from(name),
            remaining: k.max(1),
            tear,
        });
    }

    /// How many `fsync`s (and `fdatasync`s) the files and directories last named `name` have
    /// had since the last mount.
    pub fn fsync_count(&self, name: &str) -> u64 {
        self.lock()
            .fsyncs
            .get(OsStr::new(name))
            .copied()
            .unwrap_or(0)
    }

    /// Unmounts the disk and mounts what the cut left (cutting now, without a tear, if it was
    /// not cut yet), through a new FUSE session: no kernel cache survives. Every process that
    /// had a file open on it must have exited, or the old mount is detached lazily.
    ///
    /// # Errors
    ///
    /// When the new session cannot be mounted.
    pub fn remount(&mut self) -> io::Result<()> {
        let image = {
            let mut shared = self.lock();
            shared.cut(Tear::None);
            shared
                .after_cut
                .take()
                .unwrap_or_else(|| shared.image.clone())
        };
        self.stop();
        let shared = Arc::new(Mutex::new(Shared::new(image)));
        self.session = Some(start(&self.mountpoint, &shared)?);
        self.shared = shared;
        Ok(())
    }

    /// Unmounts: at once when nothing holds it, else after a few tries lazily (detached).
    fn stop(&mut self) {
        let Some(session) = self.session.take() else {
            return;
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match nix::mount::umount2(&self.mountpoint, nix::mount::MntFlags::empty()) {
                Ok(()) => break,
                Err(nix::errno::Errno::EBUSY) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(nix::errno::Errno::EBUSY) => {
                    let _ = nix::mount::umount2(&self.mountpoint, nix::mount::MntFlags::MNT_DETACH);
                    // The session ends when the last user lets go; not waited for.
                    drop(session);
                    return;
                }
                // Not mounted any more (or never): the session ends by itself.
                Err(_) => break,
            }
        }
        let _ = session.join();
    }
}

impl Drop for LazyDisk {
    fn drop(&mut self) {
        self.stop();
    }
}

fn start(mountpoint: &Path, shared: &Arc<Mutex<Shared>>) -> io::Result<BackgroundSession> {
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName("lazy-disk".to_string()),
        MountOption::DefaultPermissions,
    ];
    fuser::spawn_mount(
        Fs {
            shared: Arc::clone(shared),
        },
        mountpoint,
        &config,
    )
}
