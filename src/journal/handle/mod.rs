//! [`Journal`]: a journal opened for reading and writing, with its writer thread (`writer`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use redb::{Database, ReadableDatabase};

use crate::journal::read::reader::ReadJournal;

mod writer;

use crate::event::{self, Event, HostIds, RunId, RunSpec, WriterId};
use crate::journal::file::Location;
use crate::journal::file::lock_wait::{self, Within};
use crate::journal::file::open::{open_location, reopen_location};
use crate::journal::format::error::{AppendError, OpenError, ReadError, StorageFailure};
use crate::journal::format::retention::Retention;
use crate::journal::read::reader::JournalReader;
use crate::journal::read::view::{JournalMeta, View};
use crate::journal::write::append::{self, Appended, Condition};
use crate::journal::write::commit::{self, WriterStats};
use crate::journal::write::options::{WriterOptions, open_lock_notice};
use crate::journal::write::prune;
use crate::journal::write::queue::{self, Queue};
use crate::journal::write::ship_mark;
use crate::run_env::RunPrivate;

/// A journal opened for reading and writing. Any number of processes may hold one at once.
///
/// Appends from any number of threads go through one queue to this handle's writer thread,
/// which commits everything waiting as one durable write transaction (group commit) and
/// answers each caller with its own result. Reads run beside it on snapshots.
pub struct Journal {
    shared: Arc<commit::Shared>,
    queue: Arc<Queue<commit::Request, commit::Answer>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("path", &self.shared.location.path())
            .field("writer", &self.shared.writer)
            .finish()
    }
}

impl Journal {
    /// Opens the journal at `path`, creating it (and its tables) if it does not exist.
    ///
    /// A journal of a newer format, or a file that is not a journal, is refused without
    /// writing anything. A journal file this call created is removed again if the open fails.
    pub fn open(path: impl AsRef<Path>) -> Result<Journal, OpenError> {
        Journal::open_with(
            Location::Path(path.as_ref().to_path_buf()),
            WriterOptions::default(),
        )
    }

    /// Opens a journal from `source` with these writer options.
    ///
    /// Opening takes the journal's write lock for a moment: while another process holds it, the
    /// open waits as `options.lock_wait` says, and past its bound fails with
    /// [`OpenError::WriteLockHeld`].
    pub fn open_with(source: Location, options: WriterOptions) -> Result<Journal, OpenError> {
        let db = lock_wait::within(&options.lock_wait, open_lock_notice(&options), || {
            open_location(&source)
        })
        .map_err(|within| match within {
            Within::Failed(error) => error,
            Within::GaveUp(held) => OpenError::WriteLockHeld(held),
        })?;
        if let Some(reserve) = &options.reserve {
            // Best effort: without room for it, the journal still works, only without slack.
            let _ = reserve.ensure();
        }
        let shared = Arc::new(commit::Shared::new(source, db, options));
        let queue = Arc::new(Queue::new(shared.options.queue_capacity));
        let thread = std::thread::Builder::new()
            .name("runjournal-writer".to_string())
            .spawn({
                let shared = Arc::clone(&shared);
                let queue = Arc::clone(&queue);
                move || writer::run(shared, queue)
            })
            .map_err(|source| OpenError::Io {
                path: PathBuf::from("<writer thread>"),
                source,
            })?;
        Ok(Journal {
            shared,
            queue,
            thread: Some(thread),
        })
    }

    /// The file this journal lives in.
    pub fn path(&self) -> &Path {
        self.shared.location.path()
    }

    /// This handle's writer id.
    pub fn writer(&self) -> WriterId {
        self.shared.writer
    }

    /// Counters of this handle's writer.
    pub fn writer_stats(&self) -> &WriterStats {
        &self.shared.stats
    }

    pub(crate) fn database(&self) -> Result<Arc<Database>, StorageFailure> {
        if let Some(db) = self.shared.database() {
            return Ok(db);
        }
        // The writer dropped a failed handle and has not reopened yet.
        self.shared
            .reopen_database()
            .map_err(|error| reopen_failure("opening a handle to read", error))
    }

    /// Reads through a fresh view with `read`, riding out storage failures as the writer
    /// does: a capacity failure is retried until it clears, another storage failure (EIO, a
    /// handle that latched) on a fresh handle with bounded backoff until the writer's retry
    /// window has passed since the first failure; anything else (damaged records) is returned
    /// at once. A runner reads its run through it, so a flaky disk does not end the run.
    pub fn read_retrying<T>(
        &self,
        mut read: impl FnMut(&View) -> Result<T, ReadError>,
    ) -> Result<T, ReadError> {
        let window = self.shared.options.io_retry_window;
        let mut first_failure: Option<std::time::Instant> = None;
        let mut attempt = 0usize;
        loop {
            let db = self.database();
            let outcome = db
                .as_ref()
                .map_err(|failure| ReadError::Storage(failure.duplicate()))
                .and_then(|db| self.view_of(db))
                .and_then(|view| read(&view));
            let failure = match outcome {
                Err(ReadError::Storage(failure)) => failure,
                done => return done,
            };
            if let Ok(db) = &db {
                // The handle is suspect: the next attempt (and the writer) reopen.
                self.shared.discard_database(db);
            }
            let failing_for = first_failure
                .get_or_insert_with(std::time::Instant::now)
                .elapsed();
            if !crate::capacity::is_retried(failure.class(), failing_for, window) {
                return Err(ReadError::Storage(failure));
            }
            let delay = commit::RETRY_DELAYS_MS[attempt.min(commit::RETRY_DELAYS_MS.len() - 1)];
            std::thread::sleep(
                std::time::Duration::from_millis(delay).min(window.saturating_sub(failing_for)),
            );
            attempt += 1;
        }
    }

    fn view_of(&self, db: &Database) -> Result<View, ReadError> {
        match db.begin_read() {
            Ok(txn) => Ok(View::new(txn)),
            Err(error) => Err(StorageFailure::new("beginning a read", error).into()),
        }
    }

    /// A consistent read view of the journal as of now.
    pub fn view(&self) -> Result<View, ReadError> {
        let db = self.database()?;
        match db.begin_read() {
            Ok(txn) => Ok(View::new(txn)),
            // The shared handle failed under a write; read through a handle of our own.
            Err(_) if matches!(self.shared.location, Location::Path(_)) => {
                let reader = JournalReader::open(self.path()).map_err(|error| {
                    StorageFailure::new(
                        "opening a read-only handle",
                        redb::Error::Io(std::io::Error::other(error.to_string())),
                    )
                })?;
                reader.view()
            }
            Err(error) => Err(StorageFailure::new("beginning a read", error).into()),
        }
    }

    /// Appends `events` to `run` as one batch, atomically and durably, if `condition` holds and
    /// every event passes [`crate::state::apply`]. Returns once the commit is durable.
    ///
    /// Waits while the append queue is full, and while the disk is full: a capacity error is
    /// retried until space returns. [`AppendError::Storage`] means the writer gave up on
    /// another kind of storage failure; the batch may or may not have landed.
    pub fn append(
        &self,
        run: RunId,
        events: Vec<Event>,
        condition: Condition,
    ) -> Result<Appended, AppendError> {
        self.submit(run, events, condition, None)?.wait().result
    }

    /// Appends several batches, each as [`Journal::append`] would, and answers each with its
    /// own result, in the order given. They are queued together before any answer is awaited,
    /// so the writer commits them in as few transactions as its bounds allow: one caller can
    /// close a thousand runs at the cost of a few commits. A refused batch fails only itself;
    /// batches for the same run land in the order given.
    pub fn append_all(
        &self,
        batches: impl IntoIterator<Item = (RunId, Vec<Event>, Condition)>,
    ) -> Vec<Result<Appended, AppendError>> {
        let tickets: Vec<_> = batches
            .into_iter()
            .map(|(run, events, condition)| self.submit(run, events, condition, None))
            .collect();
        tickets
            .into_iter()
            .map(|ticket| ticket.and_then(|ticket| ticket.wait().result))
            .collect()
    }

    fn submit(
        &self,
        run: RunId,
        events: Vec<Event>,
        condition: Condition,
        private: Option<Arc<RunPrivate>>,
    ) -> Result<queue::Ticket<commit::Answer>, AppendError> {
        let ticket = self
            .queue
            .submit(commit::Request {
                run,
                events,
                condition,
                origin: commit::Origin::Local,
                private,
            })
            .map_err(|_| {
                AppendError::Storage(StorageFailure::new(
                    "queueing an append",
                    redb::Error::Io(std::io::Error::other("the journal is closing")),
                ))
            })?;
        self.shared
            .stats
            .submitted
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(ticket)
    }

    /// Commits `batches` in one durable write transaction on the calling thread, with the
    /// writer ids and writer seqs they carry, as the writer thread does when it retries a group
    /// after a reopen.
    ///
    /// It exists for tests: the model test (`tests/it/model.rs`) commits batches of its own
    /// writer and commits them again under the same writer seq, to check that a retry is
    /// recognised. A program appends with [`Journal::append`], which numbers its batches itself.
    #[cfg(any(test, feature = "testkit"))]
    pub(crate) fn commit_batches_for_tests(
        &self,
        batches: &[append::Batch],
    ) -> Result<Vec<Result<Appended, AppendError>>, StorageFailure> {
        let db = self.database()?;
        append::commit_batches(&db, batches)
    }

    /// Creates a run: appends its `RunCreated` under a fresh id.
    pub fn create_run(&self, spec: RunSpec, hosts: HostIds) -> Result<Appended, AppendError> {
        self.create_run_with(spec, hosts, Vec::new())
    }

    /// Creates a run whose creation batch carries `more` after its `RunCreated` (a
    /// `Resumed`, say), under a fresh id.
    pub fn create_run_with(
        &self,
        spec: RunSpec,
        hosts: HostIds,
        more: Vec<Event>,
    ) -> Result<Appended, AppendError> {
        self.create(Creation {
            spec,
            hosts,
            more,
            private: None,
        })
    }

    /// Creates a new run waiting in a queue: `RunCreated` and `QueueJoined` in one batch. The
    /// journal refuses it when the queue has no limit ([`crate::journal::QueueRefusal::NoSuchQueue`]).
    pub fn create_queued_run(
        &self,
        spec: RunSpec,
        hosts: HostIds,
        joined: Event,
    ) -> Result<Appended, AppendError> {
        self.create_run_with(spec, hosts, vec![joined])
    }

    /// Creates a run under a fresh id: its `RunCreated`, then `creation.more`, in one batch,
    /// and in the same transaction what it keeps in the home only (`creation.private`: its
    /// environment and its own hooks), so the run never exists without them.
    pub fn create(&self, creation: Creation) -> Result<Appended, AppendError> {
        let run = RunId::generate();
        let hosts = creation.hosts;
        let event = Event::RunCreated {
            spec: Arc::new(creation.spec),
            created_at_ms: event::now_ms(),
            session_id: hosts.session_id,
            completion_owner_id: hosts.completion_owner_id,
            tool_call_id: hosts.tool_call_id,
        };
        let mut events = vec![event];
        events.extend(creation.more);
        let private = creation
            .private
            .filter(|private| !private.is_empty())
            .map(Arc::new);
        self.submit(run, events, Condition::expect_head(0), private)?
            .wait()
            .result
    }

    /// Prunes `runs` in one durable write transaction (each one only if it is still terminal
    /// and closed: see [`prune`]), and forgets the `pruning` entries of `finished`, whose
    /// files are gone. Rides out a full disk like an append.
    pub fn prune(
        &self,
        runs: &[RunId],
        finished: &[RunId],
        now_ms: event::UnixMs,
    ) -> Result<Vec<(RunId, prune::Pruned)>, AppendError> {
        commit::commit_upkeep(&self.shared, |txn| {
            prune::prune_in(txn, runs, finished, now_ms)
        })
    }

    /// Sets the home's retention policy.
    pub fn set_retention(&self, policy: &Retention) -> Result<(), AppendError> {
        commit::commit_upkeep(&self.shared, |txn| prune::set_retention_in(txn, policy))
    }

    /// Sets `queue`'s limit of active runs (docs/design.md, "Queues"), durable on return. The
    /// name must pass [`crate::event::check_queue_name`]; the caller checks it.
    pub fn set_queue_limit(&self, queue: &str, max_active: u64) -> Result<(), AppendError> {
        commit::commit_upkeep(&self.shared, |txn| {
            append::set_queue_limit_in(txn, queue, max_active)
        })
    }

    /// Records that the home ships, and that every record at or below global seq `through`
    /// is proven shipped (the shipper checked the server's record there against this
    /// journal's). In a write transaction of its own, never with an append; the mark only
    /// rises (a lower `through` leaves a higher mark as it is), and a home that did not ship
    /// ships from now on. Durable on return.
    pub fn mark_shipped(&self, through: u64) -> Result<(), AppendError> {
        commit::commit_upkeep(&self.shared, |txn| ship_mark::mark_shipped_in(txn, through))
    }

    /// Records that the home no longer ships: retention stops keeping records for a shipper.
    pub fn stop_shipping(&self) -> Result<(), AppendError> {
        commit::commit_upkeep(&self.shared, ship_mark::stop_shipping_in)
    }

    /// Sets the home's completion hook, run for every run that ends from now on (`None`:
    /// none), durable on return (docs/design.md, "Hooks"). The command must pass
    /// [`crate::run_env::check_hook_command`]; the caller checks it.
    pub fn set_home_hook(&self, command: Option<&str>) -> Result<(), AppendError> {
        commit::commit_upkeep(&self.shared, |txn| append::set_home_hook_in(txn, command))
    }

    /// Facts about the journal file.
    pub fn meta(&self) -> Result<JournalMeta, ReadError> {
        self.view()?.meta()
    }

    /// Runs redb's own integrity check (every page checksum, the allocator state) through a
    /// handle of its own. The journal must be a file.
    pub fn check_integrity(&self) -> Result<bool, StorageFailure> {
        let mut db = reopen_location(&self.shared.location).map_err(|error| {
            // An open that failed is not damage: keep its I/O error (ENOSPC, say).
            let source = match error {
                OpenError::Io { source, .. } => redb::Error::Io(source),
                OpenError::Storage(failure) => failure.source,
                other => redb::Error::Io(std::io::Error::other(other.to_string())),
            };
            StorageFailure::new("opening a handle for the integrity check", source)
        })?;
        db.check_integrity()
            .map_err(|error| StorageFailure::new("checking integrity", error))
    }
}

/// What a new run is made of ([`Journal::create`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Creation {
    pub spec: RunSpec,
    pub hosts: HostIds,
    /// Events of the creation batch after its `RunCreated` (`QueueJoined`, `Resumed`).
    pub more: Vec<Event>,
    /// What the run keeps in the home only; `None` (or empty): nothing.
    pub private: Option<RunPrivate>,
}

/// A failed reopen as a storage failure that keeps its class: an OS error stays one (a
/// retried read tries again); a file that is no longer a journal is damage, not retried.
fn reopen_failure(op: &'static str, error: OpenError) -> StorageFailure {
    match error {
        OpenError::Storage(failure) => failure,
        OpenError::Io { source, .. } => StorageFailure::new(op, source),
        other => StorageFailure::new(op, redb::Error::Corrupted(other.to_string())),
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        // A commit leader takes no new clients from now on; appends already queued (its own
        // and its clients') are still committed and answered before the thread ends, and the
        // thread hands the leadership on (see `share`).
        self.shared
            .is_closing
            .store(true, std::sync::atomic::Ordering::Release);
        self.queue.close();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl ReadJournal for Journal {
    fn view(&self) -> Result<View, ReadError> {
        Journal::view(self)
    }
}
