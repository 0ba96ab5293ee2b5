//! Where the journal and the home are, and opening the journal without ever writing to it.

use std::path::{Path, PathBuf};

use anyhow::Context;
use runjournal::Home;
use runjournal::home::Layout;
use runjournal::journal::{self, Journal, JournalReader, OpenError, ReadError, View};
use runjournal::projection::ReadJournal;

use crate::output::note;

/// The journal being read, and the home its projections live in (if known).
pub struct Source {
    /// The journal file the user named (or the home's).
    pub journal_path: PathBuf,
    /// The home: `--home`, else (without `--journal`) `$RUNJOURNAL_HOME` and the defaults.
    /// `None` for `--journal FILE` alone: a copied journal has no projections of its own.
    pub home: Option<Home>,
    /// `--layout`: the home's, and that of a directory `replay --out` writes.
    pub layout: Layout,
    reader: Reader,
    /// Holds the recovered copy, when there is one, until the end.
    _scratch: Option<tempfile::TempDir>,
}

enum Reader {
    ReadOnly(JournalReader),
    /// A private copy of a journal that needed recovery, recovered; the user's file is
    /// untouched.
    Recovered(Journal),
}

impl ReadJournal for Source {
    fn view(&self) -> Result<View, ReadError> {
        match &self.reader {
            Reader::ReadOnly(reader) => reader.view(),
            Reader::Recovered(journal) => journal.view(),
        }
    }
}

impl Source {
    /// Opens the journal read-only. One that was not shut down cleanly (its writer crashed, or
    /// it is a copy taken while writers had it open) cannot be read in place without writing
    /// to it: a private copy is recovered instead, and stderr says so.
    pub fn open(
        home: Option<&Path>,
        journal_file: Option<&Path>,
        layout: Layout,
    ) -> anyhow::Result<Source> {
        let (journal_path, home) = match journal_file {
            Some(file) => (
                file.to_path_buf(),
                home.map(|root| Home::in_layout(root, layout)),
            ),
            None => {
                let home = Home::resolve(home, layout)?;
                home.check_layout()
                    .map_err(|mismatch| crate::UsageError(mismatch.to_string()))?;
                (home.journal_path(), Some(home))
            }
        };
        let (reader, scratch) = match JournalReader::open(&journal_path) {
            Ok(reader) => (Reader::ReadOnly(reader), None),
            Err(OpenError::NeedsRecovery { .. }) => {
                let scratch = tempfile::Builder::new()
                    .prefix("journal-tools-")
                    .tempdir()
                    .context("making a directory for a recovered copy of the journal")?;
                let copy = scratch.path().join("journal.redb");
                journal::copy_consistent(&journal_path, &copy)?;
                let recovered = Journal::open(&copy)
                    .with_context(|| format!("recovering a copy of {}", journal_path.display()))?;
                note(&format!(
                    "{} was not shut down cleanly (its writer crashed, or it was copied while open); reading a recovered private copy, the file itself is left as it is",
                    journal_path.display()
                ));
                (Reader::Recovered(recovered), Some(scratch))
            }
            Err(error) => return Err(error.into()),
        };
        Ok(Source {
            journal_path,
            home,
            layout,
            reader,
            _scratch: scratch,
        })
    }

    /// A fresh read view.
    pub fn view(&self) -> anyhow::Result<View> {
        ReadJournal::view(self).context("reading the journal")
    }

    /// The home, or an error saying why the command needs one.
    pub fn require_home(&self, why: &str) -> anyhow::Result<&Home> {
        self.home.as_ref().ok_or_else(|| {
            anyhow::Error::new(crate::UsageError(format!(
                "{why} needs a home: with --journal FILE, give --home DIR too"
            )))
        })
    }
}
