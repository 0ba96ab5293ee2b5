//! A home opened for work: its journal, and the projections that follow each commit.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::durable_fs;
use crate::event::{Event, RunId, RunSpec};
use crate::home::Home;
use crate::journal::{AppendError, Appended, Condition, HostIds, Journal, OpenError};
use crate::projection::{self, ProjectionError, ResultPolicy};

/// A home with its journal open for writing.
#[derive(Debug)]
pub struct Store {
    home: Home,
    journal: Journal,
    /// Runs whose last projection failed, with the error; retried by
    /// [`Store::retry_projections`]. The journal has what they lack.
    failed_projections: Mutex<BTreeMap<RunId, ProjectionError>>,
}

impl Store {
    /// Opens the home, creating its directories (0700) and journal as needed.
    pub fn open(home: Home) -> Result<Store, OpenError> {
        for dir in [
            home.root().to_path_buf(),
            home.runs_dir(),
            home.results_dir(),
        ] {
            durable_fs::ensure_private_dir(&dir).map_err(|source| OpenError::Io {
                path: dir.clone(),
                source,
            })?;
        }
        let journal = Journal::open(home.journal_path())?;
        Ok(Store {
            home,
            journal,
            failed_projections: Mutex::new(BTreeMap::new()),
        })
    }

    pub fn home(&self) -> &Home {
        &self.home
    }

    pub fn journal(&self) -> &Journal {
        &self.journal
    }

    /// Creates a run and projects it.
    pub fn create_run(&self, spec: RunSpec, hosts: HostIds) -> Result<Appended, AppendError> {
        let appended = self.journal.create_run(spec, hosts)?;
        self.project_after_commit(appended.run);
        Ok(appended)
    }

    /// Appends a batch (see [`Journal::append`]) and then projects the run. A projection
    /// failure does not fail the append: the append is durable, and the projection is kept for
    /// [`Store::retry_projections`].
    pub fn append(
        &self,
        run: RunId,
        events: Vec<Event>,
        condition: Condition,
    ) -> Result<Appended, AppendError> {
        let appended = self.journal.append(run, events, condition)?;
        if !appended.was_duplicate {
            self.project_after_commit(run);
        }
        Ok(appended)
    }

    fn project_after_commit(&self, run: RunId) {
        let outcome = projection::project(&self.home, &self.journal, run, ResultPolicy::Publish);
        let mut failed = self
            .failed_projections
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        match outcome {
            Ok(()) => {
                failed.remove(&run);
            }
            Err(error) => {
                failed.insert(run, error);
            }
        }
    }

    /// Projects one run now (a result a host consumed is not written again).
    pub fn project(&self, run: RunId) -> Result<(), ProjectionError> {
        projection::project(&self.home, &self.journal, run, ResultPolicy::Publish)
    }

    /// Runs whose last projection failed.
    pub fn failed_projections(&self) -> Vec<RunId> {
        let failed = self
            .failed_projections
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        failed.keys().copied().collect()
    }

    /// Projects again every run whose last projection failed; returns those still failing.
    pub fn retry_projections(&self) -> Vec<(RunId, ProjectionError)> {
        let runs = self.failed_projections();
        let mut still_failing = Vec::new();
        for run in runs {
            match self.project(run) {
                Ok(()) => {
                    let mut failed = self
                        .failed_projections
                        .lock()
                        .unwrap_or_else(|poisoned| poisoned.into_inner());
                    failed.remove(&run);
                }
                Err(error) => still_failing.push((run, error)),
            }
        }
        still_failing
    }
}
