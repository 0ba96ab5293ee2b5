//! A lost or damaged journal: the ways `journal.redb` is found lost beside runs (missing,
//! emptied, zero-filled, truncated), done to a file; a byte flipped at offsets spread over its
//! pages; every b-tree page pointed at a 2 GiB page; a copy of a home to damage; and a picture of a directory to check that a refusal
//! changed nothing.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// How a journal file was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Damage {
    Missing,
    Emptied,
    ZeroFilled,
    Truncated,
}

impl Damage {
    /// Every damage.
    pub const ALL: [Damage; 4] = [
        Damage::Missing,
        Damage::Emptied,
        Damage::ZeroFilled,
        Damage::Truncated,
    ];

    /// Does it to the file at `path`; a truncated file keeps its first half.
    pub fn apply(self, path: &Path) {
        self.apply_keeping(path, 2);
    }

    /// Does it to the file at `path`; a truncated file keeps its first `1/divisor`.
    pub fn apply_keeping(self, path: &Path, divisor: u64) {
        let bytes = std::fs::metadata(path).expect("the journal").len();
        match self {
            Damage::Missing => std::fs::remove_file(path).expect("remove"),
            Damage::Emptied => std::fs::write(path, b"").expect("empty"),
            Damage::ZeroFilled => {
                std::fs::write(path, vec![0u8; bytes as usize]).expect("zero-fill")
            }
            Damage::Truncated => std::fs::OpenOptions::new()
                .write(true)
                .open(path)
                .and_then(|file| file.set_len(bytes / divisor))
                .expect("truncate"),
        }
    }

    /// How a refusal names what it found.
    pub fn named(self) -> &'static str {
        match self {
            Damage::Missing => "is missing",
            Damage::Emptied => "is empty (0 bytes)",
            Damage::ZeroFilled => "is zero-filled",
            Damage::Truncated => "is truncated",
        }
    }
}

/// Every file under `dir` with its bytes (directories as `None`). A socket is left out: the
/// commit leader's lives beside the journal only while that process leads (the home's watcher
/// may lead a moment after the runs it followed ended), and holds no bytes.
pub fn tree(dir: &Path) -> BTreeMap<PathBuf, Option<Vec<u8>>> {
    use std::os::unix::fs::FileTypeExt;
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read_dir") {
            let entry = entry.expect("entry");
            let path = entry.path();
            if entry.file_type().is_ok_and(|kind| kind.is_socket()) {
                continue;
            }
            if path.is_dir() {
                out.insert(path.clone(), None);
                stack.push(path);
            } else {
                out.insert(path.clone(), Some(std::fs::read(&path).expect("read")));
            }
        }
    }
    out
}

/// redb's page size, the unit [`flip_offsets`] spreads its offsets over.
pub const PAGE_BYTES: u64 = 4096;

/// Where the damage tests flip a byte of a journal file of `bytes` bytes: in redb's header
/// (its magic number, and the primary commit slot, which redb checks by its checksum), the first
/// byte of the page after it, and the first byte (a b-tree page's kind) of about ten pages
/// spread over the rest of the file, and one byte in the middle of a page.
pub fn flip_offsets(bytes: u64) -> Vec<u64> {
    let pages = bytes / PAGE_BYTES;
    let mut offsets = vec![3, 100];
    if pages > 1 {
        offsets.push(PAGE_BYTES);
    }
    if pages > 2 {
        offsets.push(2 * PAGE_BYTES + 1500);
    }
    let step = (pages / 10).max(1);
    let mut page = 2;
    while page < pages {
        offsets.push(page * PAGE_BYTES);
        page += step;
    }
    offsets
}

/// Flips every bit of the byte at `offset` of the file at `path`.
pub fn flip_byte(path: &Path, offset: u64) {
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .expect("the journal opens for the flip");
    let mut byte = [0u8; 1];
    file.read_exact_at(&mut byte, offset)
        .expect("the byte to flip is in the file");
    file.write_all_at(&[!byte[0]], offset)
        .expect("the flip is written");
}

/// Copies the directory `from` to `to` (which must not exist) with its files and their modes.
pub fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir(to).expect("the copy's directory");
    std::fs::set_permissions(
        to,
        std::fs::metadata(from)
            .expect("the directory")
            .permissions(),
    )
    .expect("its mode");
    for entry in std::fs::read_dir(from).expect("read_dir") {
        let entry = entry.expect("entry");
        let kind = entry.file_type().expect("file type");
        let target = to.join(entry.file_name());
        if kind.is_dir() {
            copy_tree(&entry.path(), &target);
        } else if kind.is_file() {
            std::fs::copy(entry.path(), &target).expect("a file is copied");
        }
    }
}

/// Makes every b-tree page of the journal at `path` (a page whose first byte says leaf or
/// branch) a branch with one child, named by a page pointer of order 19: a page of 2^19 pages
/// of 4 KiB, 2 GiB, far past the file's end. Its checksum in the parent no longer matches. redb
/// allocates the whole page before it reads it, so whichever tree a read walks, it meets such a
/// pointer at its first page.
pub fn point_pages_at_a_huge_page(path: &Path) {
    use std::os::unix::fs::FileExt;
    const LEAF: u8 = 1;
    const BRANCH: u8 = 2;
    /// After the kind, the key count and padding (8 bytes) and the one child's checksum.
    const CHILD_POINTER_AT: usize = 8 + 16;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .expect("the journal opens for the damage");
    let len = file.metadata().expect("the journal's length").len();
    let mut page = vec![0u8; PAGE_BYTES as usize];
    // Page 0 holds redb's header.
    for start in (1..len / PAGE_BYTES).map(|index| index * PAGE_BYTES) {
        file.read_exact_at(&mut page, start)
            .expect("a whole page reads");
        if page[0] != LEAF && page[0] != BRANCH {
            continue;
        }
        page.fill(0);
        page[0] = BRANCH;
        let huge_child = 19u64 << 59;
        page[CHILD_POINTER_AT..CHILD_POINTER_AT + 8].copy_from_slice(&huge_child.to_le_bytes());
        file.write_all_at(&page, start)
            .expect("the damaged page is written");
    }
}
