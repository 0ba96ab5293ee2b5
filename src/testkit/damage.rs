//! A lost journal: the ways `journal.redb` is found lost beside runs (missing, emptied,
//! zero-filled, truncated), done to a file, and a picture of a directory to check that a
//! refusal changed nothing.

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

/// Every file under `dir` with its bytes (directories as `None`).
pub fn tree(dir: &Path) -> BTreeMap<PathBuf, Option<Vec<u8>>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read_dir") {
            let path = entry.expect("entry").path();
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
