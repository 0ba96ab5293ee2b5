//! The runner's one way into the journal. Appends are blocking (a durable commit) and run on
//! tokio's blocking pool; each is projected by the [`Store`] right after its commit.
//!
//! Invariant: every record the runner writes goes through [`Recorder::append`].
//!
//! It also knows how long its oldest call has waited for the journal
//! ([`Recorder::waiting_for`]): a blocking call cannot be cancelled, so a runner told to stop
//! while the journal does not answer gives up on it by that (see `runner::run_steps`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::event::{Event, Record, RunId};
use crate::journal::{AppendError, Appended, Condition, ReadError};
use crate::state::RunState;
use crate::store::Store;

/// Appends and reads for one run.
#[derive(Debug)]
pub struct Recorder {
    store: Arc<Store>,
    run: RunId,
    in_flight: Mutex<InFlight>,
}

/// The journal calls under way, by number, with when each began.
#[derive(Debug, Default)]
struct InFlight {
    next: u64,
    since: BTreeMap<u64, Instant>,
}

/// Removes a call from [`InFlight`] when it ends, or when its future is dropped.
struct CallEnded<'a> {
    recorder: &'a Recorder,
    id: u64,
}

impl Drop for CallEnded<'_> {
    fn drop(&mut self) {
        self.recorder.in_flight().since.remove(&self.id);
    }
}

impl Recorder {
    pub fn new(store: Arc<Store>, run: RunId) -> Recorder {
        Recorder {
            store,
            run,
            in_flight: Mutex::new(InFlight::default()),
        }
    }

    fn in_flight(&self) -> std::sync::MutexGuard<'_, InFlight> {
        self.in_flight
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// How long the oldest journal call under way has waited; `None` when none is.
    pub fn waiting_for(&self) -> Option<Duration> {
        self.in_flight()
            .since
            .values()
            .min()
            .map(|since| since.elapsed())
    }

    /// Runs `work`, a blocking journal call, on tokio's blocking pool, counted as under way
    /// until it returns.
    async fn call<T: Send + 'static>(&self, work: impl FnOnce() -> T + Send + 'static) -> T {
        let id = {
            let mut in_flight = self.in_flight();
            let id = in_flight.next;
            in_flight.next += 1;
            in_flight.since.insert(id, Instant::now());
            id
        };
        let _ended = CallEnded { recorder: self, id };
        unwind(tokio::task::spawn_blocking(work).await)
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
        self.call(move || store.append(run, events, condition))
            .await
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
        self.call(move || {
            store
                .append_then(run, events, condition, on_durable)
                .map(|(appended, ())| appended)
        })
        .await
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
        self.call(move || store.journal().read_retrying(|view| view.snapshot(run)))
            .await
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
