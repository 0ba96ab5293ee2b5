//! A journal opened to be looked at, never written: the home's journal or a file the user
//! names (a copy, say), read beside live writers. A journal that was not shut down cleanly
//! (its writer crashed, or it was copied while open) cannot be read in place without writing
//! to it, so a private copy is recovered instead, in a temporary directory that lives as long
//! as the [`JournalSource`].
//!
//! Invariant: the user's journal is only ever opened read-only; whatever needs writing
//! (recovery, redb's integrity check) happens on a private copy.

use std::io;
use std::path::{Path, PathBuf};

use crate::home::{Home, Layout, LayoutMismatch, NoHome};
use crate::journal::ReadJournal;
use crate::journal::{self, CopyError, Journal, JournalReader, OpenError, ReadError, View};
use crate::verify::{self, Integrity, Problem, ProblemKind, Report, Severity};

/// Why a journal could not be opened for looking at. Nothing was written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SourceError {
    #[error(transparent)]
    NoHome(#[from] NoHome),
    #[error(transparent)]
    Open(#[from] OpenError),
    /// The home's journal is where the other layout keeps it.
    #[error(transparent)]
    Layout(#[from] LayoutMismatch),
    #[error("making a directory for a recovered copy of {journal}")]
    Scratch {
        journal: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("copying {journal} to recover it privately")]
    Copy {
        journal: PathBuf,
        #[source]
        source: CopyError,
    },
    #[error("recovering a copy of {journal}")]
    Recover {
        journal: PathBuf,
        #[source]
        source: Box<OpenError>,
    },
}

/// Why redb's integrity check of a copy could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IntegrityCheckError {
    #[error("making a directory for a copy of the journal")]
    Scratch(#[source] io::Error),
    #[error(transparent)]
    Copy(#[from] CopyError),
}

/// A journal to look at, and the home its projections live in (when known).
pub struct JournalSource {
    journal_path: PathBuf,
    home: Option<Home>,
    /// The layout asked for: the home's, and that of a directory a replay writes.
    layout: Layout,
    reader: Reader,
    /// Holds the recovered copy, when there is one, as long as the source lives.
    _scratch: Option<tempfile::TempDir>,
}

enum Reader {
    ReadOnly(JournalReader),
    /// A private copy of a journal that needed recovery, recovered; the user's file is
    /// untouched.
    Recovered(Journal),
}

impl ReadJournal for JournalSource {
    fn view(&self) -> Result<View, ReadError> {
        match &self.reader {
            Reader::ReadOnly(reader) => reader.view(),
            Reader::Recovered(journal) => journal.view(),
        }
    }
}

impl JournalSource {
    /// Opens `journal_file`, else the home's journal, read-only. The home, laid out as
    /// `layout`, is `home`, else (without `journal_file`) `$RUNJOURNAL_HOME` and the defaults
    /// of that layout ([`Home::resolve`]); a journal file named alone has no home (a copy has
    /// no projections of its own). A home whose journal is of the other layout is refused, and
    /// so is a home another user owns or may write ([`crate::store::check_home`]). A
    /// journal that needs recovery is read through a recovered private copy
    /// ([`JournalSource::was_recovered`]).
    pub fn open(
        home: Option<&Path>,
        journal_file: Option<&Path>,
        layout: Layout,
    ) -> Result<JournalSource, SourceError> {
        let (journal_path, home) = match journal_file {
            Some(file) => {
                let home = home
                    .map(|root| Home::resolve(Some(root), layout))
                    .transpose()?;
                if let Some(home) = &home {
                    crate::store::check_home(home)?;
                }
                (file.to_path_buf(), home)
            }
            None => {
                let home = Home::resolve(home, layout)?;
                home.check_layout()?;
                crate::store::check_home(&home)?;
                journal::check_home_journal(&home)?;
                (home.journal_path(), Some(home))
            }
        };
        let (reader, scratch) = match JournalReader::open(&journal_path) {
            Ok(reader) => (Reader::ReadOnly(reader), None),
            Err(OpenError::NeedsRecovery { .. }) => {
                let (journal, scratch) = recover_a_copy(&journal_path)?;
                (Reader::Recovered(journal), Some(scratch))
            }
            Err(error) => return Err(error.into()),
        };
        Ok(JournalSource {
            journal_path,
            home,
            layout,
            reader,
            _scratch: scratch,
        })
    }

    /// The journal file looked at (the user's, not a recovered copy).
    pub fn journal_path(&self) -> &Path {
        &self.journal_path
    }

    /// The home whose projections go with this journal, if known.
    pub fn home(&self) -> Option<&Home> {
        self.home.as_ref()
    }

    /// The layout asked for when it was opened.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// Whether the journal is read through a recovered private copy: it was not shut down
    /// cleanly. A person looking at it should be told.
    pub fn was_recovered(&self) -> bool {
        matches!(self.reader, Reader::Recovered(_))
    }

    /// A fresh read view.
    pub fn view(&self) -> Result<View, ReadError> {
        ReadJournal::view(self)
    }

    /// Runs redb's integrity check on a private copy of the journal, made in a temporary
    /// directory removed afterwards ([`verify::check_integrity_of_copy`]).
    pub fn check_integrity(&self) -> Result<Integrity, IntegrityCheckError> {
        let scratch = scratch_dir().map_err(IntegrityCheckError::Scratch)?;
        Ok(verify::check_integrity_of_copy(
            &self.journal_path,
            scratch.path(),
        )?)
    }
}

/// How redb's integrity check of a private copy came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntegrityCheck {
    Passed,
    /// Its problems are in the report.
    Failed,
    /// It could not run; a note in the report says why.
    Skipped,
}

impl IntegrityCheck {
    pub fn as_str(self) -> &'static str {
        match self {
            IntegrityCheck::Passed => "passed",
            IntegrityCheck::Failed => "failed",
            IntegrityCheck::Skipped => "skipped",
        }
    }
}

/// Why a verification could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VerifyError {
    #[error("reading the journal")]
    Read(#[from] ReadError),
    #[error("making a directory for a copy of the journal")]
    Scratch(#[source] io::Error),
}

/// A whole verification of a journal source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verification {
    pub report: Report,
    pub integrity: IntegrityCheck,
}

impl JournalSource {
    /// Checks everything ([`verify::verify`]): records, snapshots, indexes, and — with a home —
    /// projections, looked at again under each run's lock so a projector a moment behind its
    /// commit is not reported; then redb's integrity check on a private copy.
    /// Fails only when the journal cannot be read, or no scratch directory can be made for
    /// the copy; a copy that cannot be made is a note, and the check is skipped.
    pub fn verify(&self) -> Result<Verification, VerifyError> {
        let mut report = verify::verify(&self.view()?, self.home.as_ref());
        if let Some(home) = &self.home {
            report.problems = verify::recheck_projections(home, self, report.problems);
        }
        let integrity = match self.check_integrity() {
            Ok(integrity) => {
                let has_passed = integrity.problems.is_empty();
                report.problems.extend(integrity.problems);
                if has_passed {
                    IntegrityCheck::Passed
                } else {
                    IntegrityCheck::Failed
                }
            }
            Err(IntegrityCheckError::Scratch(error)) => return Err(VerifyError::Scratch(error)),
            Err(error) => {
                report.problems.push(Problem {
                    severity: Severity::Note,
                    kind: ProblemKind::Integrity,
                    run: None,
                    seq: None,
                    file: None,
                    message: format!("redb's integrity check was skipped: {error}"),
                    changes: Vec::new(),
                });
                IntegrityCheck::Skipped
            }
        };
        Ok(Verification { report, integrity })
    }
}

fn scratch_dir() -> io::Result<tempfile::TempDir> {
    tempfile::Builder::new().prefix("runjournal-").tempdir()
}

/// Copies the journal as it stood at one commit into a private directory and opens the copy
/// for writing, which recovers it.
fn recover_a_copy(journal_path: &Path) -> Result<(Journal, tempfile::TempDir), SourceError> {
    let journal = journal_path.to_path_buf();
    let scratch = scratch_dir().map_err(|source| SourceError::Scratch {
        journal: journal.clone(),
        source,
    })?;
    let copy = scratch.path().join("journal.redb");
    journal::copy_consistent(journal_path, &copy).map_err(|source| SourceError::Copy {
        journal: journal.clone(),
        source,
    })?;
    let recovered = Journal::open(&copy).map_err(|source| SourceError::Recover {
        journal,
        source: Box::new(source),
    })?;
    Ok((recovered, scratch))
}
