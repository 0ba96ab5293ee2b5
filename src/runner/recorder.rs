//! The runner's one way into the journal. Appends are blocking (a durable commit) and run on
//! tokio's blocking pool; each is projected by the [`Store`] right after its commit.
//!
//! Invariant: every record the runner writes goes through [`Recorder::append`].

use std::sync::Arc;

use crate::event::{Event, Record, RunId};
use crate::journal::{AppendError, Appended, Condition, ReadError};
use crate::state::RunState;
use crate::store::Store;

/// Appends and reads for one run.
#[derive(Debug)]
pub struct Recorder {
    store: Arc<Store>,
    run: RunId,
}

impl Recorder {
    pub fn new(store: Arc<Store>, run: RunId) -> Recorder {
        Recorder { store, run }
    }

    pub fn run(&self) -> RunId {
        self.run
    }

    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// Appends a batch durably (see [`Store::append`]) without blocking the runtime.
    pub async fn append(
        &self,
        events: Vec<Event>,
        condition: Condition,
    ) -> Result<Appended, AppendError> {
        let store = Arc::clone(&self.store);
        let run = self.run;
        unwind(tokio::task::spawn_blocking(move || store.append(run, events, condition)).await)
    }

    /// [`Recorder::append`], calling `on_durable` once the batch is durable, before the run is
    /// projected (see [`Store::append_then`]).
    pub async fn append_then(
        &self,
        events: Vec<Event>,
        condition: Condition,
        on_durable: impl FnOnce(&Appended) + Send + 'static,
    ) -> Result<Appended, AppendError> {
        let store = Arc::clone(&self.store);
        let run = self.run;
        unwind(
            tokio::task::spawn_blocking(move || {
                store
                    .append_then(run, events, condition, on_durable)
                    .map(|(appended, ())| appended)
            })
            .await,
        )
    }

    /// [`Recorder::append`] on the calling thread, for work the runner does on a blocking
    /// thread (taking its control inbox).
    pub fn append_blocking(
        &self,
        events: Vec<Event>,
        condition: Condition,
    ) -> Result<Appended, AppendError> {
        self.store.append(self.run, events, condition)
    }

    /// The run's record of `seq`, if it has one.
    pub async fn record(&self, seq: u64) -> Result<Option<Record>, ReadError> {
        let store = Arc::clone(&self.store);
        let run = self.run;
        unwind(
            tokio::task::spawn_blocking(move || {
                store.journal().read_retrying(|view| {
                    Ok(view
                        .records_between(run, seq.saturating_sub(1), seq)?
                        .into_iter()
                        .next())
                })
            })
            .await,
        )
    }

    /// The run's latest snapshot; `None` if the run is not in the journal. A storage failure
    /// is retried as the journal's writer retries one ([`crate::Journal::read_retrying`]), so
    /// the runner reads through a flaky disk as it writes through it.
    pub async fn snapshot(&self) -> Result<Option<RunState>, ReadError> {
        let store = Arc::clone(&self.store);
        let run = self.run;
        unwind(
            tokio::task::spawn_blocking(move || {
                store.journal().read_retrying(|view| view.snapshot(run))
            })
            .await,
        )
    }
}

/// The result of a blocking task. Blocking tasks are never cancelled, so a failed join is a
/// panic inside the journal code: it is raised again here rather than turned into a storage
/// error it is not.
fn unwind<T>(joined: Result<T, tokio::task::JoinError>) -> T {
    match joined {
        Ok(value) => value,
        Err(error) => std::panic::resume_unwind(error.into_panic()),
    }
}
