//! The in-memory state of the disk: inodes with a current and a durable version of their
//! content, and what a cut leaves of them.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::ffi::{OsStr, OsString};
use std::path::PathBuf;
use std::time::SystemTime;

/// The root directory's inode number (FUSE's).
pub(crate) const ROOT: u64 = 1;

/// The bytes of one sector: a torn write keeps whole ones.
pub(crate) const SECTOR: u64 = 512;

#[derive(Clone, Debug)]
pub(crate) enum Node {
    File {
        current: Vec<u8>,
        durable: Vec<u8>,
    },
    Dir {
        current: BTreeMap<OsString, u64>,
        durable: BTreeMap<OsString, u64>,
        /// The directory holding it now (`..`).
        parent: u64,
    },
    Symlink {
        target: PathBuf,
    },
    /// A socket or a FIFO (`mknod`): `kind` is its `S_IFMT` bits.
    Special {
        kind: u32,
        rdev: u32,
    },
}

#[derive(Clone, Debug)]
pub(crate) struct Inode {
    pub(crate) node: Node,
    pub(crate) perm: u16,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    pub(crate) atime: SystemTime,
    pub(crate) mtime: SystemTime,
    pub(crate) ctime: SystemTime,
    /// Current directory entries naming it.
    pub(crate) links: u32,
    /// The last name it was given (what the counting hooks match).
    pub(crate) name: OsString,
}

impl Inode {
    pub(crate) fn new(node: Node, perm: u16, uid: u32, gid: u32, name: &OsStr) -> Inode {
        let now = SystemTime::now();
        Inode {
            node,
            perm,
            uid,
            gid,
            atime: now,
            mtime: now,
            ctime: now,
            links: 0,
            name: name.to_os_string(),
        }
    }

    pub(crate) fn size(&self) -> u64 {
        match &self.node {
            Node::File { current, .. } => current.len() as u64,
            Node::Dir { current, .. } => current.len() as u64,
            Node::Symlink { target } => target.as_os_str().len() as u64,
            Node::Special { .. } => 0,
        }
    }

    pub(crate) fn is_dir(&self) -> bool {
        matches!(self.node, Node::Dir { .. })
    }

    pub(crate) fn touch(&mut self) {
        let now = SystemTime::now();
        self.mtime = now;
        self.ctime = now;
    }
}

/// A write that no `fsync` has made durable yet, kept so that a cut can tear it.
#[derive(Clone, Debug)]
pub(crate) struct PendingWrite {
    pub(crate) ino: u64,
    pub(crate) offset: u64,
    pub(crate) data: Vec<u8>,
}

/// Every inode, by number.
#[derive(Clone, Debug)]
pub(crate) struct Image {
    pub(crate) inodes: HashMap<u64, Inode>,
    pub(crate) next_ino: u64,
}

impl Image {
    /// An empty file system: a root directory, durable as it is.
    pub(crate) fn empty(uid: u32, gid: u32) -> Image {
        let mut root = Inode::new(
            Node::Dir {
                current: BTreeMap::new(),
                durable: BTreeMap::new(),
                parent: ROOT,
            },
            0o755,
            uid,
            gid,
            OsStr::new(""),
        );
        root.links = 1;
        Image {
            inodes: HashMap::from([(ROOT, root)]),
            next_ino: ROOT + 1,
        }
    }

    pub(crate) fn add(&mut self, inode: Inode) -> u64 {
        let ino = self.next_ino;
        self.next_ino += 1;
        self.inodes.insert(ino, inode);
        ino
    }

    /// What a power cut leaves: the inodes reachable from the root through durable entries,
    /// each with its durable content as its current one; `torn` is the part of the last
    /// unsynced write that reached the disk anyway.
    pub(crate) fn after_cut(&self, torn: Option<&PendingWrite>) -> Image {
        let mut reachable = HashSet::from([ROOT]);
        let mut queue = VecDeque::from([ROOT]);
        let mut links: HashMap<u64, u32> = HashMap::from([(ROOT, 1)]);
        while let Some(ino) = queue.pop_front() {
            let Some(Inode {
                node: Node::Dir { durable, .. },
                ..
            }) = self.inodes.get(&ino)
            else {
                continue;
            };
            for &child in durable.values() {
                if !self.inodes.contains_key(&child) {
                    continue;
                }
                *links.entry(child).or_default() += 1;
                if reachable.insert(child) {
                    queue.push_back(child);
                }
            }
        }
        let mut inodes = HashMap::new();
        for &ino in &reachable {
            let Some(inode) = self.inodes.get(&ino) else {
                continue;
            };
            let mut kept = inode.clone();
            kept.links = links.get(&ino).copied().unwrap_or(1);
            match &mut kept.node {
                Node::File { current, durable } => {
                    *current = durable.clone();
                    if let Some(write) = torn.filter(|write| write.ino == ino) {
                        apply(durable, write);
                        *current = durable.clone();
                    }
                }
                Node::Dir {
                    current, durable, ..
                } => {
                    durable.retain(|_, child| reachable.contains(child));
                    *current = durable.clone();
                }
                Node::Symlink { .. } | Node::Special { .. } => {}
            }
            inodes.insert(ino, kept);
        }
        // A directory's `..` is the durable directory naming it.
        let parents: Vec<(u64, u64)> = inodes
            .iter()
            .filter_map(|(&ino, inode)| match &inode.node {
                Node::Dir { durable, .. } => Some(
                    durable
                        .values()
                        .map(move |&child| (child, ino))
                        .collect::<Vec<_>>(),
                ),
                _ => None,
            })
            .flatten()
            .collect();
        for (child, parent) in parents {
            if let Some(Inode {
                node: Node::Dir { parent: slot, .. },
                ..
            }) = inodes.get_mut(&child)
            {
                *slot = parent;
            }
        }
        Image {
            inodes,
            next_ino: self.next_ino,
        }
    }
}

/// Writes `write` into `content` at its offset, growing it with zeros as needed.
pub(crate) fn apply(content: &mut Vec<u8>, write: &PendingWrite) {
    let Ok(start) = usize::try_from(write.offset) else {
        return;
    };
    let end = start + write.data.len();
    if content.len() < end {
        content.resize(end, 0);
    }
    content[start..end].copy_from_slice(&write.data);
}

/// The first `sectors` whole sectors (on the disk's 512-byte grid) of `write`; `None` when not
/// even one sector boundary falls inside it.
pub(crate) fn torn_prefix(write: &PendingWrite, sectors: u64) -> Option<PendingWrite> {
    let end = write.offset + write.data.len() as u64;
    let first_boundary = write.offset.div_ceil(SECTOR) * SECTOR;
    let boundary = first_boundary + sectors.saturating_sub(1) * SECTOR;
    let boundary = if sectors == 0 { write.offset } else { boundary };
    let boundary = if boundary >= end {
        // Keep the whole sectors that fit: the last boundary before the end.
        (end / SECTOR) * SECTOR
    } else {
        boundary
    };
    if boundary <= write.offset {
        return None;
    }
    let kept = usize::try_from(boundary - write.offset).ok()?;
    Some(PendingWrite {
        ino: write.ino,
        offset: write.offset,
        data: write.data[..kept].to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(offset: u64, len: usize) -> PendingWrite {
        PendingWrite {
            ino: 7,
            offset,
            data: vec![1; len],
        }
    }

    #[test]
    fn a_torn_write_ends_on_a_sector_boundary_inside_it() {
        // 100..2000: boundaries 512, 1024, 1536 fall inside.
        let pending = write(100, 1900);
        let ends: Vec<Option<u64>> = (0..5)
            .map(|sectors| {
                torn_prefix(&pending, sectors).map(|torn| torn.offset + torn.data.len() as u64)
            })
            .collect();
        assert_eq!(
            ends,
            vec![None, Some(512), Some(1024), Some(1536), Some(1536)]
        );
        // A write within one sector cannot be torn at a boundary: all or nothing.
        assert!(torn_prefix(&write(10, 100), 1).is_none());
    }
}
