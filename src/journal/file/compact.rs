//! Shrinking a journal file: redb reuses the pages that pruning frees, but never gives them back
//! to the file system by itself. Compaction needs the file alone: it opens it exclusively (the
//! single-writer mode), which fails while any other process has it open, and then nobody can
//! open it until compaction is over. The file is opened as every journal under a home is: no
//! link followed, a private regular file of this user.

use std::path::Path;

use redb::Database;

use crate::durable_fs;
use crate::journal::format::error::{Damaged, StorageFailure};

/// What a compaction did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Compacted {
    pub bytes_before: u64,
    pub bytes_after: u64,
}

/// Why a compaction did not happen.
#[derive(Debug, thiserror::Error)]
pub enum CompactError {
    #[error(
        "{path}: another process has the journal open (a runner, a command, a shipper); compact when nothing uses the home"
    )]
    InUse { path: String },
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    Failed { path: String, reason: String },
    #[error(transparent)]
    Storage(#[from] StorageFailure),
    /// redb panicked on the file's bytes.
    #[error(transparent)]
    Damaged(Damaged),
}

/// How long compaction waits for the other handles on the journal to let it go before it is
/// refused ([`CompactError::InUse`]).
pub const HOLDERS_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// Compacts the journal at `path`, which no other process may have open (it waits up to
/// [`HOLDERS_WAIT`] for them to let it go). A panic of redb's on damaged bytes is
/// [`CompactError::Damaged`].
pub fn compact(path: &Path) -> Result<Compacted, CompactError> {
    super::contain::contain(|| compact_unguarded(path)).unwrap_or_else(|panic| {
        Err(CompactError::Damaged(Damaged::new(
            path,
            "compacting the journal",
            panic,
        )))
    })
}

fn compact_unguarded(path: &Path) -> Result<Compacted, CompactError> {
    let shown = path.display().to_string();
    let size = |path: &Path| {
        std::fs::metadata(path)
            .map(|metadata| metadata.len())
            .map_err(|source| CompactError::Io {
                path: shown.clone(),
                source,
            })
    };
    // The rules of every open under a home: no link followed, a regular file of this user that
    // nobody else can write, opened by us and handed to redb as a backend.
    super::open::check_journal_file(path).map_err(|error| CompactError::Failed {
        path: shown.clone(),
        reason: error.to_string(),
    })?;
    let file = durable_fs::open_existing_read_write(path).map_err(|source| CompactError::Io {
        path: shown.clone(),
        source,
    })?;
    let bytes_before = size(path)?;
    if bytes_before == 0 {
        return Err(CompactError::Failed {
            path: shown,
            reason: "the file is empty: not a journal".to_string(),
        });
    }
    // The exclusive mode: the open fails while a multi-writer handle is open anywhere. The
    // home's own helpers (its watcher, a deliverer) let the journal go within moments once no
    // run is active: they are waited for, up to `HOLDERS_WAIT`.
    let deadline = std::time::Instant::now() + HOLDERS_WAIT;
    let mut db = loop {
        let backend = redb::backends::FileBackend::new(file.try_clone().map_err(|source| {
            CompactError::Io {
                path: shown.clone(),
                source,
            }
        })?);
        match Database::builder().create_with_backend(backend) {
            Ok(db) => break db,
            Err(redb::DatabaseError::DatabaseAlreadyOpen)
                if std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            Err(redb::DatabaseError::DatabaseAlreadyOpen) => {
                return Err(CompactError::InUse { path: shown });
            }
            Err(error) => {
                return Err(CompactError::Failed {
                    path: shown,
                    reason: error.to_string(),
                });
            }
        }
    };
    // Each call compacts what it can; it says when nothing more can be.
    loop {
        match db.compact(redb::CompactionMode::Balanced) {
            Ok(true) => {}
            Ok(false) => break,
            Err(error) => {
                return Err(CompactError::Failed {
                    path: shown,
                    reason: error.to_string(),
                });
            }
        }
    }
    drop(db);
    Ok(Compacted {
        bytes_before,
        bytes_after: size(path)?,
    })
}
