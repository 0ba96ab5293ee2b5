//! [`JournalReader`]: a journal opened read-only beside live writers, and [`ReadJournal`],
//! anything a journal can be read through.

use std::path::{Path, PathBuf};

use redb::ReadableDatabase;

use super::view::View;
use crate::journal::file::open::{
    check_format_version, check_journal_file, contained_open, open_read_only, read_format_version,
};
use crate::journal::format::error::{OpenError, ReadError, StorageFailure};

/// A journal opened read-only: sees the commits of live writers, never writes.
pub struct JournalReader {
    path: PathBuf,
    db: redb::ReadOnlyDatabase,
}

impl JournalReader {
    /// Opens an existing journal read-only. A panic of redb's on a damaged file is
    /// [`OpenError::Damaged`].
    pub fn open(path: impl AsRef<Path>) -> Result<JournalReader, OpenError> {
        let path = path.as_ref();
        contained_open(path, || JournalReader::open_unguarded(path))
    }

    fn open_unguarded(path: &Path) -> Result<JournalReader, OpenError> {
        if let Err(source) = std::fs::metadata(path) {
            return Err(OpenError::Io {
                path: path.to_path_buf(),
                source,
            });
        }
        check_journal_file(path)?;
        let db = open_read_only(path).map_err(|error| OpenError::from_database(path, error))?;
        let txn = db
            .begin_read()
            .map_err(|error| StorageFailure::new("beginning a read", error))?;
        match read_format_version(path, &txn)? {
            Some(version) => check_format_version(path, version)?,
            None => {
                return Err(OpenError::NotAJournal {
                    path: path.to_path_buf(),
                    reason: "no runjournal meta table".to_string(),
                });
            }
        }
        drop(txn);
        Ok(JournalReader {
            path: path.to_path_buf(),
            db,
        })
    }

    /// The file this journal lives in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A consistent read view of the journal as of now.
    pub fn view(&self) -> Result<View, ReadError> {
        View::begin(&self.db, &self.path)
    }
}

/// Anything the journal can be read through: a [`Journal`](crate::Journal), a [`JournalReader`], or a tool's
/// own source of views. Projections and verification read through it.
pub trait ReadJournal {
    fn view(&self) -> Result<View, ReadError>;
}

impl ReadJournal for JournalReader {
    fn view(&self) -> Result<View, ReadError> {
        JournalReader::view(self)
    }
}
