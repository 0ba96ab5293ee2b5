//! Where a journal's bytes live: a file, or (in tests) a storage backend made afresh for each
//! (re)open.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use redb::StorageBackend;

/// Makes a fresh storage backend for each (re)open of a journal that does not live in a file.
pub type BackendFactory = Arc<dyn Fn() -> io::Result<Box<dyn StorageBackend>> + Send + Sync>;

/// Where the journal's bytes live.
#[derive(Clone)]
pub enum Location {
    Path(PathBuf),
    /// Tests: a backend that keeps only synced bytes, or fails on cue.
    Backend {
        name: PathBuf,
        factory: BackendFactory,
    },
}

impl Location {
    /// The path to name in messages.
    pub fn path(&self) -> &Path {
        match self {
            Location::Path(path) => path,
            Location::Backend { name, .. } => name,
        }
    }
}
