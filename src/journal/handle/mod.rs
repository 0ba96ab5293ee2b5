//! [`Journal`]: a journal opened for reading and writing, with its writer thread (`writer`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use redb::{Database, ReadableTable};

use crate::journal::read::reader::ReadJournal;

mod writer;

use crate::event::{self, Event, HostIds, RunId, RunSpec, WriterId};
use crate::journal::file::Location;
use crate::journal::file::contain::contain;
use crate::journal::file::lock_wait::{self, Within};
use crate::journal::file::open::{open_location, reopen_location};
use crate::journal::format::error::{
    AppendError, Damaged, OpenError, ReadError, StorageFailure, storage,
};
use crate::journal::format::retention::Retention;
use crate::journal::format::tables;
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
/// An append from a thread that finds nobody committing is committed on that thread, with
/// whatever waits; appends from any number of threads while one commits queue for this
/// handle's writer thread, which commits everything waiting as one durable write transaction
/// (group commit). Each caller is answered with its own result. Reads run beside it on
/// snapshots.
pub struct Journal {
    shared: Arc<commit::Shared>,
    queue: Arc<Queue<commit::Request, commit::Answer>>,
    /// Whoever holds it commits; `None` once the writer died or ended.
    committer: Arc<crate::sync::Mutex<Option<writer::Committer>>>,
    /// Set when the writer died of a contained panic.
    death: Arc<writer::Death>,
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
        let queue = Arc::new(Queue::answering_dropped(
            shared.options.queue_capacity,
            writer_gone,
        ));
        let death = Arc::new(writer::Death::default());
        let committer = Arc::new(crate::sync::Mutex::new(Some(writer::Committer::new(
            &shared, &queue,
        ))));
        let thread = std::thread::Builder::new()
            .name("runjournal-writer".to_string())
            .spawn({
                let shared = Arc::clone(&shared);
                let queue = Arc::clone(&queue);
                let committer = Arc::clone(&committer);
                let death = Arc::clone(&death);
                move || writer::run(shared, queue, committer, death)
            })
            .map_err(|source| OpenError::Io {
                path: PathBuf::from("<writer thread>"),
                source,
            })?;
        Ok(Journal {
            shared,
            queue,
            committer,
            death,
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
                Err(ReadError::Storage(failure)) => match &self.shared.location {
                    Location::Path(path) => {
                        crate::journal::file::pages::damage_behind(path, failure)
                    }
                    Location::Backend { .. } => failure,
                },
                done => {
                    if let Ok(db) = db {
                        release(db);
                    }
                    return done;
                }
            };
            if let Ok(db) = db {
                // The handle is suspect: the next attempt (and the writer) reopen.
                self.shared.discard_database(&db);
                release(db);
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
        View::begin(db, self.path())
    }

    /// A consistent read view of the journal as of now.
    pub fn view(&self) -> Result<View, ReadError> {
        let db = self.database()?;
        let begun = View::begin(db.as_ref(), self.path());
        release(db);
        match begun {
            Ok(view) => Ok(view),
            Err(error @ ReadError::Damaged(_)) => Err(error),
            // The shared handle failed under a write; read through a handle of our own.
            Err(_) if matches!(self.shared.location, Location::Path(_)) => {
                let reader = JournalReader::open(self.path()).map_err(|error| match error {
                    OpenError::Damaged(damaged) => ReadError::Damaged(damaged),
                    other => {
                        ReadError::Storage(reopen_failure("opening a read-only handle", other))
                    }
                })?;
                reader.view()
            }
            Err(error) => Err(error),
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
        self.commit_or_submit(local_request(run, events, condition, None))?
            .wait()
            .result
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
            .map(|(run, events, condition)| {
                self.submit(local_request(run, events, condition, None))
            })
            .collect();
        tickets
            .into_iter()
            .map(|ticket| ticket.and_then(|ticket| ticket.wait().result))
            .collect()
    }

    /// Queues a batch for the writer thread, for a caller with more than one to commit.
    fn submit(
        &self,
        request: commit::Request,
    ) -> Result<queue::Ticket<commit::Answer>, AppendError> {
        let ticket = self.queue.submit(request);
        self.ticket_or_refusal(ticket)
    }

    /// Commits a batch on this thread when nobody commits now, with whatever waits;
    /// otherwise queues it for whoever commits next ([`Queue::commit_here_or_submit`]).
    fn commit_or_submit(
        &self,
        request: commit::Request,
    ) -> Result<queue::Ticket<commit::Answer>, AppendError> {
        let is_counted = std::cell::Cell::new(false);
        let ticket = self.queue.commit_here_or_submit(
            &self.committer,
            request,
            self.shared.options.max_group_events,
            |request| request.events.len(),
            |slot, group| {
                // Counted as it is taken, before its commit, as a queued batch is once queued.
                self.count_submitted();
                is_counted.set(true);
                writer::commit_group(slot, &self.shared, &self.queue, &self.death, group);
            },
        );
        if is_counted.get() {
            return ticket.map_err(|_| self.closed());
        }
        self.ticket_or_refusal(ticket)
    }

    fn count_submitted(&self) {
        self.shared
            .stats
            .submitted
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Why an append found the queue closed.
    fn closed(&self) -> AppendError {
        match self.death.cause() {
            // The writer died of damage: every later append is told so at once.
            Some(damaged) => AppendError::Damaged(damaged),
            None => AppendError::Storage(StorageFailure::new(
                "queueing an append",
                redb::Error::Io(std::io::Error::other("the journal is closing")),
            )),
        }
    }

    fn ticket_or_refusal(
        &self,
        ticket: Result<queue::Ticket<commit::Answer>, queue::Closed>,
    ) -> Result<queue::Ticket<commit::Answer>, AppendError> {
        let ticket = ticket.map_err(|_| self.closed())?;
        self.count_submitted();
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
        contain(move || append::commit_batches(&db, batches)).unwrap_or_else(|panic| {
            Err(StorageFailure::new(
                "committing",
                redb::Error::Corrupted(panic.to_string()),
            ))
        })
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
        self.commit_or_submit(local_request(
            run,
            events,
            Condition::expect_head(0),
            private,
        ))?
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
        self.upkeep("pruning", |txn| {
            prune::prune_in(txn, runs, finished, now_ms)
        })
    }

    /// Sets the home's retention policy.
    pub fn set_retention(&self, policy: &Retention) -> Result<(), AppendError> {
        self.upkeep("setting the retention policy", |txn| {
            prune::set_retention_in(txn, policy)
        })
    }

    /// A write of the journal's upkeep on this thread ([`commit::commit_upkeep`]), a panic of
    /// redb's contained: reported as damage, the handle dropped so the next use reopens.
    fn upkeep<T>(
        &self,
        during: &'static str,
        once: impl FnMut(&redb::WriteTransaction) -> Result<T, StorageFailure>,
    ) -> Result<T, AppendError> {
        contain(|| commit::commit_upkeep(&self.shared, once)).unwrap_or_else(|panic| {
            if let Some(db) = self.shared.database() {
                self.shared.discard_database(&db);
                release(db);
            }
            Err(AppendError::Damaged(Damaged::new(
                self.path(),
                during,
                panic,
            )))
        })
    }

    /// Sets `queue`'s limit of active runs (docs/design.md, "Queues"), durable on return. The
    /// name must pass [`crate::event::check_queue_name`]; the caller checks it.
    pub fn set_queue_limit(&self, queue: &str, max_active: u64) -> Result<(), AppendError> {
        self.upkeep("setting a queue's limit", |txn| {
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

    /// Keeps what the home's scrub found (meta `scrub`, [`crate::scrub::ScrubRecord`]), in a
    /// write transaction of its own. Durable on return.
    pub fn set_scrub_record(&self, record: &[u8]) -> Result<(), AppendError> {
        self.set_meta(tables::META_SCRUB, record)
    }

    /// Sets the home's scrub interval in ms (meta `scrub_every_ms`). Durable on return.
    pub fn set_scrub_every_ms(&self, every_ms: u64) -> Result<(), AppendError> {
        self.set_meta(tables::META_SCRUB_EVERY, &every_ms.to_be_bytes())
    }

    /// Sets the timeout a run gets when its launch names none (meta `run_timeout_ms`): `Some`
    /// a timeout (`Some(None)`: none at all), `None` back to the layout's default. Runs
    /// launched from then on get it; durable on return.
    pub fn set_run_timeout(&self, timeout_ms: Option<Option<u64>>) -> Result<(), AppendError> {
        match timeout_ms {
            Some(timeout_ms) => self.set_meta(
                tables::META_RUN_TIMEOUT,
                &timeout_ms.unwrap_or(0).to_be_bytes(),
            ),
            None => commit::commit_upkeep(&self.shared, |txn| {
                let mut meta = txn
                    .open_table(tables::META)
                    .map_err(storage("opening meta"))?;
                meta.remove(tables::META_RUN_TIMEOUT)
                    .map_err(storage("writing meta"))?;
                Ok(())
            }),
        }
    }

    /// Keeps where retention's clock is anchored in this boot (meta `clock`,
    /// [`crate::retention::clock`]), in a write transaction of its own. Durable on return.
    pub fn set_clock_anchor(
        &self,
        anchor: &crate::journal::format::retention::ClockAnchor,
    ) -> Result<(), AppendError> {
        self.set_meta(tables::META_CLOCK, &anchor.to_bytes())
    }

    fn set_meta(&self, key: &'static str, value: &[u8]) -> Result<(), AppendError> {
        commit::commit_upkeep(&self.shared, |txn| {
            let mut meta = txn
                .open_table(tables::META)
                .map_err(storage("opening meta"))?;
            meta.insert(key, value).map_err(storage("writing meta"))?;
            Ok(())
        })
    }

    /// Replaces the home's kept size (meta `home_size`, `home_size`) with what
    /// `update` makes of the stored one (`None`: leave it), in a write transaction of its own,
    /// never with an append. Durable on return.
    pub fn update_home_size(
        &self,
        mut update: impl FnMut(Option<&[u8]>) -> Option<Vec<u8>>,
    ) -> Result<(), AppendError> {
        commit::commit_upkeep(&self.shared, |txn| {
            let mut meta = txn
                .open_table(tables::META)
                .map_err(storage("opening meta"))?;
            let stored = meta
                .get(tables::META_HOME_SIZE)
                .map_err(storage("reading the home's size"))?
                .map(|value| value.value().to_vec());
            if let Some(new) = update(stored.as_deref()) {
                meta.insert(tables::META_HOME_SIZE, new.as_slice())
                    .map_err(storage("writing the home's size"))?;
            }
            Ok(())
        })
    }

    /// Facts about the journal file.
    pub fn meta(&self) -> Result<JournalMeta, ReadError> {
        self.view()?.meta()
    }

    /// Runs redb's own integrity check (every page checksum, the allocator state) through a
    /// handle of its own. The journal must be a file. A panic of redb's on damaged bytes is a
    /// failed check.
    pub fn check_integrity(&self) -> Result<bool, StorageFailure> {
        contain(|| self.check_integrity_unguarded()).unwrap_or_else(|panic| {
            Err(StorageFailure::new(
                "checking integrity",
                redb::Error::Corrupted(panic.to_string()),
            ))
        })
    }

    fn check_integrity_unguarded(&self) -> Result<bool, StorageFailure> {
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

/// A batch of this handle's own, as the committer takes it.
fn local_request(
    run: RunId,
    events: Vec<Event>,
    condition: Condition,
    private: Option<Arc<RunPrivate>>,
) -> commit::Request {
    commit::Request {
        run,
        events,
        condition,
        origin: commit::Origin::Local,
        private,
    }
}

/// The answer to an append whose writer dropped it unanswered: the thread ended in a way its
/// own containment did not catch. The batch may or may not have landed.
fn writer_gone() -> commit::Answer {
    commit::Answer {
        result: Err(AppendError::Storage(StorageFailure::new(
            "committing",
            redb::Error::Io(std::io::Error::other(
                "the journal's writer thread ended without answering; the append may or may not have landed",
            )),
        ))),
        refused_against: None,
        was_retried: true,
    }
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
        // The handle's last reference goes here, where its close (which writes the allocator
        // state, reading the file) may meet damage.
        if let Some(db) = self.shared.database() {
            self.shared.discard_database(&db);
            release(db);
        }
    }
}

/// Drops a reference to the redb handle inside [`contain`]: the last one closes the database,
/// which reads and writes the file and so may panic on damaged bytes. Nothing is lost by
/// ignoring such a panic: the close only saves the next open a repair.
pub(crate) fn release(db: Arc<Database>) {
    let _ = contain(move || drop(db));
}

impl ReadJournal for Journal {
    fn view(&self) -> Result<View, ReadError> {
        Journal::view(self)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::Duration;

    use super::*;
    use crate::event::Mode;
    use crate::journal::write::options::CommitSharing;
    use crate::testkit;

    /// Generous: a caller still waiting past it waits on a dead writer.
    const BOUND: Duration = Duration::from_secs(60);

    fn spec() -> RunSpec {
        testkit::spec(
            Mode::Single,
            vec![testkit::step("build", testkit::argv(&["true"]))],
        )
    }

    /// A writer thread whose commit panics (redb on damaged bytes) answers the callers of its
    /// group and every caller queued behind them with the damage, and every later append at
    /// once: nobody waits on a writer that is gone.
    #[test]
    fn every_caller_queued_on_a_writer_that_died_is_answered_with_the_damage() {
        const QUEUED: usize = 4;
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("journal.redb");
        let options = WriterOptions {
            commit_sharing: CommitSharing::Alone,
            ..WriterOptions::default()
        };
        let journal = Arc::new(
            Journal::open_with(Location::Path(path.clone()), options).expect("a new journal"),
        );
        let (entered, is_entered) = mpsc::channel();
        let (release, is_released) = mpsc::channel::<()>();
        writer::test_hook::before_commit_of(&path, move || {
            let _ = entered.send(());
            let _ = is_released.recv();
            panic!("a page the test damaged");
        });

        let (answers, answered) = mpsc::channel();
        let call = |answers: mpsc::Sender<Result<Appended, AppendError>>| {
            let journal = Arc::clone(&journal);
            std::thread::spawn(move || {
                let _ = answers.send(journal.create_run(spec(), HostIds::default()));
            })
        };
        let mut callers = vec![call(answers.clone())];
        is_entered
            .recv_timeout(BOUND)
            .expect("the writer starts the first commit");
        callers.extend((0..QUEUED).map(|_| call(answers.clone())));
        let waiting_since = std::time::Instant::now();
        while journal.queue.len() < QUEUED {
            assert!(
                waiting_since.elapsed() < BOUND,
                "the callers queue behind the commit"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        release.send(()).expect("the writer waits in the hook");

        for caller in 0..=QUEUED {
            let answer = answered
                .recv_timeout(BOUND)
                .unwrap_or_else(|_| panic!("caller {caller} of {} is answered", QUEUED + 1));
            match answer {
                Err(AppendError::Damaged(damaged)) => {
                    assert_eq!(damaged.path, path);
                    assert_eq!(damaged.during, "committing");
                    assert!(
                        damaged.panic.message.contains("a page the test damaged"),
                        "{damaged}"
                    );
                }
                other => panic!("caller {caller}: {other:?}"),
            }
        }
        for caller in callers {
            caller.join().expect("a caller ends");
        }
        let later = journal.create_run(spec(), HostIds::default());
        assert!(
            matches!(later, Err(AppendError::Damaged(_))),
            "a later append is answered the damage at once: {later:?}"
        );
    }
}
