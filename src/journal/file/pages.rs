//! A bound on the pages redb reads: no page pointer may name a page larger than the file.
//!
//! redb trusts a page pointer it reads from its file. A pointer carries its page's order (its
//! size, up to 2^20 pages of 4 KiB), and redb allocates and zero-fills a buffer of the whole page
//! before it asks the storage backend for the bytes, and before it compares the page with the
//! file's length. One flipped bit in a branch page's pointers could so make a read ask for
//! gigabytes: where the allocation fails (a cap on the address space, a memory cgroup) the
//! process aborts, which no [`contain`] can catch; where it succeeds it costs the memory, and
//! only then does the read fail as damage.
//!
//! Nothing behind the backend can refuse that buffer once redb has made it, but every pointer
//! redb follows inside a tree is read first, in the branch page that holds it, and that page
//! comes through the backend. [`PageBound`] looks at each branch page as it is read and refuses
//! the read (as damage: a page past the end of the file, [`past_the_end`]) when one of its
//! children would be larger than the file, so the pointer is never followed. The cost is a look
//! at the pointers of the branch pages a command reads, never a walk of the file.
//!
//! What it does not cover: the root of each table, which redb keeps in a leaf of its table of
//! tables, and the roots in the commit slots (those have a checksum of their own). A damaged
//! table root is met as the allocation it names, then as damage; the home's scrub (`scrub`)
//! finds it on its schedule. A pointer of a sane size to the wrong place is read as the page
//! there: redb panics on it or our records' own checksums refuse it, either way damage.
//!
//! [`contain`]: super::contain::contain
//! [`past_the_end`]: crate::journal::format::error

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use redb::StorageBackend;

/// redb's page size: the unit a page's order multiplies. A journal is made with redb's default.
const PAGE_BYTES: u64 = 4096;

/// The first byte of a b-tree branch page.
const BRANCH: u8 = 2;

/// Where a branch page's checksums begin: after its kind, its key count and padding.
const BRANCH_CHILDREN_AT: usize = 8;

/// A child's checksum in a branch page (redb's 128-bit checksum), then its page number.
const CHECKSUM_BYTES: usize = 16;
const POINTER_BYTES: usize = 8;

/// A page number keeps its page's order in its top five bits.
const ORDER_SHIFT: u32 = 59;

/// The bound every journal handed to redb is read through ([module docs](self)): the handle's
/// backend ([`super::lock_wait::PatientLocks`]) hands each page it read to [`PageBound::check`]
/// before redb sees it.
#[derive(Debug)]
pub(crate) struct PageBound {
    /// The file's length when last looked at: a bound only grows as the file does, so a stale
    /// one is looked at again before a read is refused.
    known_len: AtomicU64,
    /// The journal file's device and inode, for [`refused_in`]; `None` for a backend that is
    /// no file.
    file: Option<FileId>,
}

/// A file by device and inode.
pub(crate) type FileId = (u64, u64);

/// The files a [`PageBound`] of this process refused a page of, and why. redb answers every
/// later call on a handle whose backend failed a read with `PreviousIo`, which says nothing of
/// why: through this, a caller learns that the failure behind it was damage, and never retries
/// it as a failing disk. A refused page is a fact about the file: its tree names it until a
/// commit rewrites the branch, which needs the branch read first.
static REFUSED: Mutex<Vec<(FileId, String)>> = Mutex::new(Vec::new());

/// Why a guard of this process refused a page of the file `file`, if one did.
pub(crate) fn refused_in(file: FileId) -> Option<String> {
    REFUSED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .iter()
        .find(|(id, _)| *id == file)
        .map(|(_, reason)| reason.clone())
}

/// `failure` as the damage behind it, when it is redb's `PreviousIo` on a handle of the
/// journal at `path` and a guard of this process refused a page of that very file: the read
/// that latched the handle was damage, and is never retried as a failing disk.
pub(crate) fn damage_behind(
    path: &std::path::Path,
    failure: crate::journal::format::error::StorageFailure,
) -> crate::journal::format::error::StorageFailure {
    use std::os::unix::fs::MetadataExt;
    if !matches!(failure.source, redb::Error::PreviousIo) {
        return failure;
    }
    let refused = std::fs::metadata(path)
        .ok()
        .and_then(|metadata| refused_in((metadata.dev(), metadata.ino())));
    match refused {
        Some(reason) => crate::journal::format::error::StorageFailure::new(
            failure.op,
            redb::Error::Corrupted(format!(
                "a page past the end of the file ({reason}), met earlier through this handle"
            )),
        ),
        None => failure,
    }
}

/// The device and inode of `file`.
pub(crate) fn file_id(file: &std::fs::File) -> Option<FileId> {
    use std::os::unix::fs::MetadataExt;
    file.metadata()
        .ok()
        .map(|metadata| (metadata.dev(), metadata.ino()))
}

impl PageBound {
    /// The bound of the journal file `file` (`None`: a backend that is no file).
    pub(crate) fn new(file: Option<FileId>) -> PageBound {
        PageBound {
            known_len: AtomicU64::new(0),
            file,
        }
    }

    /// Refuses `page`, just read at `offset` from `backend`, when it is a branch page naming a
    /// child larger than the file: as a read past the end of the file.
    pub(crate) fn check(
        &self,
        backend: &dyn StorageBackend,
        offset: u64,
        page: &[u8],
    ) -> std::io::Result<()> {
        // The header is in the first page; every other read is of a whole page.
        if offset < PAGE_BYTES || (page.len() as u64) < PAGE_BYTES || page[0] != BRANCH {
            return Ok(());
        }
        self.check_branch(backend, offset, page)
    }

    /// Refuses the read as damage, and keeps why for [`refused_in`].
    fn refuse(&self, reason: String) -> std::io::Error {
        if let Some(file) = self.file {
            let mut refused = REFUSED
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            if !refused.iter().any(|(id, _)| *id == file) {
                refused.push((file, reason.clone()));
            }
        }
        damaged(reason)
    }

    /// Refuses the branch page read at `offset` when a child it names is larger than the file.
    fn check_branch(
        &self,
        backend: &dyn StorageBackend,
        offset: u64,
        page: &[u8],
    ) -> std::io::Result<()> {
        let keys = usize::from(u16::from_le_bytes([page[2], page[3]]));
        let children = keys + 1;
        let pointers_at = BRANCH_CHILDREN_AT + CHECKSUM_BYTES * children;
        let pointers_end = pointers_at + POINTER_BYTES * children;
        let Some(pointers) = page.get(pointers_at..pointers_end) else {
            return Err(self.refuse(format!(
                "the branch page at byte {offset} names {children} children, more than it holds"
            )));
        };
        let largest_order = pointers
            .chunks_exact(POINTER_BYTES)
            .map(|pointer| {
                let mut bytes = [0u8; POINTER_BYTES];
                bytes.copy_from_slice(pointer);
                u64::from_le_bytes(bytes) >> ORDER_SHIFT
            })
            .max()
            .unwrap_or(0);
        let largest = PAGE_BYTES << largest_order;
        if largest <= self.known_len.load(Ordering::Relaxed) {
            return Ok(());
        }
        let len = backend.len()?;
        self.known_len.fetch_max(len, Ordering::Relaxed);
        if largest <= len {
            return Ok(());
        }
        Err(self.refuse(format!(
            "the branch page at byte {offset} names a child page of {largest} bytes, \
             larger than the file's {len}"
        )))
    }
}

/// A read refused as damage, in the form a read past the end of the file takes: the journal's
/// errors call such a read corruption, never an I/O error to retry.
fn damaged(reason: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::UnexpectedEof, reason)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A branch page of one key whose two children have these orders.
    fn branch(orders: [u64; 2]) -> Vec<u8> {
        let mut page = vec![0u8; PAGE_BYTES as usize];
        page[0] = BRANCH;
        page[2..4].copy_from_slice(&1u16.to_le_bytes());
        let at = BRANCH_CHILDREN_AT + CHECKSUM_BYTES * 2;
        for (index, order) in orders.into_iter().enumerate() {
            let pointer = (order << ORDER_SHIFT) | 7;
            page[at + index * POINTER_BYTES..][..POINTER_BYTES]
                .copy_from_slice(&pointer.to_le_bytes());
        }
        page
    }

    /// A memory backend holding `pages` after a first page of zeros (the header's place).
    fn backend_of(pages: &[Vec<u8>]) -> redb::backends::InMemoryBackend {
        let backend = redb::backends::InMemoryBackend::new();
        let len = PAGE_BYTES * (1 + pages.len() as u64);
        backend.set_len(len).expect("the memory backend grows");
        for (index, page) in pages.iter().enumerate() {
            backend
                .write(PAGE_BYTES * (1 + index as u64), page)
                .expect("a page is written");
        }
        backend
    }

    /// Reads page `index` of `backend` and hands it to a bound, as the journal's backend does.
    fn read_page(backend: &redb::backends::InMemoryBackend, index: u64) -> std::io::Result<()> {
        read_at(
            &PageBound::new(None),
            backend,
            PAGE_BYTES * index,
            PAGE_BYTES as usize,
        )
    }

    fn read_at(
        bound: &PageBound,
        backend: &redb::backends::InMemoryBackend,
        offset: u64,
        len: usize,
    ) -> std::io::Result<()> {
        let mut out = vec![0u8; len];
        backend
            .read(offset, &mut out)
            .map_err(std::io::Error::from)?;
        bound.check(backend, offset, &out)
    }

    #[test]
    fn a_branch_naming_pages_that_fit_the_file_is_read() {
        // Three pages of 4 KiB: children of one and two pages fit.
        let backend = backend_of(&[branch([0, 1]), vec![0u8; PAGE_BYTES as usize]]);
        read_page(&backend, 1).expect("a sane branch is read");
    }

    #[test]
    fn a_branch_naming_a_page_larger_than_the_file_is_refused_as_a_read_past_its_end() {
        let backend = backend_of(&[branch([0, 19])]);
        let error = read_page(&backend, 1).expect_err("a 2 GiB child is refused");
        assert_eq!(error.kind(), std::io::ErrorKind::UnexpectedEof, "{error}");
        assert!(error.to_string().contains("2147483648 bytes"), "{error}");
    }

    #[test]
    fn a_branch_naming_more_children_than_it_holds_is_refused() {
        let mut page = branch([0, 0]);
        page[2..4].copy_from_slice(&u16::MAX.to_le_bytes());
        let backend = backend_of(&[page]);
        let error = read_page(&backend, 1).expect_err("refused");
        assert_eq!(error.kind(), std::io::ErrorKind::UnexpectedEof, "{error}");
    }

    /// The bound follows the file as it grows: a page another process's commit added is read.
    #[test]
    fn a_child_that_fits_only_the_grown_file_is_read() {
        let backend = backend_of(&[branch([0, 3])]);
        let bound = PageBound::new(None);
        let page = PAGE_BYTES as usize;
        assert!(
            read_at(&bound, &backend, PAGE_BYTES, page).is_err(),
            "32 KiB does not fit 8 KiB"
        );
        backend.set_len(PAGE_BYTES * 16).expect("the file grows");
        read_at(&bound, &backend, PAGE_BYTES, page).expect("32 KiB fits 64 KiB");
    }

    /// A refusal is kept by the file's identity, for a handle that latched on it.
    #[test]
    fn a_refusal_is_kept_for_the_file_it_was_of() {
        let file = (u64::MAX, 42);
        let backend = backend_of(&[branch([0, 19])]);
        let bound = PageBound::new(Some(file));
        assert_eq!(refused_in(file), None);
        read_at(&bound, &backend, PAGE_BYTES, PAGE_BYTES as usize).expect_err("refused");
        let reason = refused_in(file).expect("kept");
        assert!(reason.contains("2147483648 bytes"), "{reason}");
        assert_eq!(
            refused_in((u64::MAX, 43)),
            None,
            "another file is not damaged"
        );
    }

    /// Leaves, the header and pages that are not branches are handed over as they are.
    #[test]
    fn pages_that_are_not_branches_are_not_looked_into() {
        let mut leaf = branch([0, 19]);
        leaf[0] = 1;
        let backend = backend_of(&[leaf]);
        read_page(&backend, 1).expect("a leaf is not judged");
        let mut header = branch([0, 19]);
        header.truncate(320);
        backend.write(0, &header).expect("a header is written");
        read_at(&PageBound::new(None), &backend, 0, 320).expect("the header is not judged");
    }
}
