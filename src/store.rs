//! A home opened for work: its journal, and the projections that follow each commit.
//!
//! After each commit the run is projected in proportion to what changed
//! ([`projection::incremental`]): events.jsonl appended, status.json of samples coalesced per
//! run. A background thread writes the status files put off when they are due, and retries
//! failed projections.
//!
//! Invariants:
//! * an append is acknowledged by the journal's commit alone; a projection that fails after
//!   it never fails the append, and is retried in the background (the journal has what the
//!   files lack);
//! * a status.json write put off is written when due, by [`Store::flush_projections`], or when
//!   the store is dropped: an orderly exit loses none;
//! * a failed open leaves nothing behind that it made.

use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::capacity::{self, Reserve};
use crate::durable_fs;
use crate::event::{Event, HostIds, RunId, RunSpec};
use crate::home::Home;
use crate::journal::lock_wait::LockWait;
use crate::journal::{
    AppendError, Appended, CapacityListener, CommitSharing, Condition, Journal, Location,
    OpenError, WriterOptions,
};
use crate::journal::{DEFAULT_LEADER_TIMEOUT, leader_timeout_from_env};
use crate::projection::incremental::Projector;
use crate::projection::pending::PendingProjections;
use crate::projection::{self, ProjectionError, ResultPolicy};

/// The environment variable of a test hook of debug builds: while a file exists at the path it
/// names, an open that has made the home's directories removes it and stops this whole process
/// (SIGSTOP) before it creates or opens the journal, so that a test can have another process
/// make the journal meanwhile and then fail this open.
pub const STOP_IN_OPEN_ENV: &str = "RUNJOURNAL_TEST_STOP_IN_OPEN";

#[cfg(debug_assertions)]
fn stop_in_open_if_asked() {
    let Some(path) = std::env::var_os(STOP_IN_OPEN_ENV) else {
        return;
    };
    if std::fs::remove_file(path).is_ok() {
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGSTOP);
    }
}

#[cfg(not(debug_assertions))]
fn stop_in_open_if_asked() {}

/// How a store is opened.
#[derive(Clone)]
pub struct StoreOptions {
    /// Size of the space reserve beside the journal; 0 disables it.
    pub reserve_bytes: u64,
    /// Told when the journal writer is blocked on a full disk or on storage errors, when it
    /// recovers, and when it gives up.
    pub listener: Option<CapacityListener>,
    /// How long storage errors other than a full disk are retried before an append fails
    /// (see [`WriterOptions::io_retry_window`]).
    pub io_retry_window: Duration,
    /// Whether commits are shared with the other processes that have the home open (the
    /// default), or made alone.
    pub commit_sharing: CommitSharing,
    /// How long a word from the commit leader may take (see
    /// [`WriterOptions::leader_timeout`]).
    pub leader_timeout: Duration,
    /// How long a commit waits for another process's write lock (see [`LockWait`]).
    pub lock_wait: LockWait,
}

impl Default for StoreOptions {
    /// No reserve, no listener, the default retry window, commits shared.
    fn default() -> StoreOptions {
        StoreOptions {
            reserve_bytes: 0,
            listener: None,
            io_retry_window: capacity::DEFAULT_IO_RETRY_WINDOW,
            commit_sharing: CommitSharing::default(),
            leader_timeout: DEFAULT_LEADER_TIMEOUT,
            lock_wait: LockWait::WAIT_ON,
        }
    }
}

impl StoreOptions {
    /// The defaults, with the reserve size from `RUNJOURNAL_RESERVE_BYTES`, the retry window
    /// from `RUNJOURNAL_IO_RETRY_WINDOW`, commit sharing from `RUNJOURNAL_COMMIT_SHARING`
    /// (`on`, `lead` or `off`) and the leader timeout from `RUNJOURNAL_LEADER_TIMEOUT` if set.
    /// The lock wait is a runner's (wait on); a command sets its own bound.
    pub fn from_env() -> Result<StoreOptions, String> {
        Ok(StoreOptions {
            reserve_bytes: capacity::reserve_bytes_from_env()?,
            listener: None,
            io_retry_window: capacity::io_retry_window_from_env()?,
            commit_sharing: CommitSharing::from_env()?,
            leader_timeout: leader_timeout_from_env()?,
            lock_wait: LockWait::WAIT_ON,
        })
    }
}

/// Delays between projection retries while they keep failing.
const PROJECTION_RETRY_DELAYS_MS: [u64; 6] = [50, 100, 250, 500, 1000, 2000];

struct Inner {
    home: Home,
    journal: Journal,
    projector: Projector,
    pending: PendingProjections,
    /// Wakes the background thread: set when something failed, when a status write was put
    /// off, or to stop it.
    wake: Mutex<RetryControl>,
    woken: Condvar,
}

#[derive(Default)]
struct RetryControl {
    has_work: bool,
    /// A status write was put off since the thread last looked at when the next is due.
    has_deferred: bool,
    should_stop: bool,
}

/// A home with its journal open for writing.
pub struct Store {
    inner: Arc<Inner>,
    retry_thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("home", &self.inner.home)
            .finish()
    }
}

/// Opens the journal; with a bound on the lock wait (a command's), gives up opening after it.
/// Opening a journal for writing takes its write lock for a moment, and so waits while
/// another process is stopped inside a write transaction.
fn open_journal(path: PathBuf, writer: WriterOptions) -> Result<Journal, OpenError> {
    let Some(bound) = writer.lock_wait.give_up_after else {
        return Journal::open_with(Location::Path(path), writer);
    };
    let since_ms = crate::event::now_ms();
    let (sender, receiver) = std::sync::mpsc::sync_channel(1);
    let opening = path.clone();
    let spawned = std::thread::Builder::new()
        .name("runjournal-open".to_string())
        .spawn(move || {
            // Nobody left to take it (the caller gave up): the handle is closed here.
            let _ = sender.send(Journal::open_with(Location::Path(opening), writer));
        });
    if let Err(error) = spawned {
        return Err(OpenError::from_io(&path, error));
    }
    match receiver.recv_timeout(bound) {
        Ok(opened) => opened,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            Err(OpenError::WriteLockHeld(crate::journal::LockHeld {
                since_ms,
                holder: crate::platform::journal_write_lock_holder(&path),
            }))
        }
        // The opening thread ended without an answer: it failed, it was not kept waiting.
        // Never a held lock (an open contains redb's panics, so this is a backstop).
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Err(OpenError::Io {
            path,
            source: std::io::Error::other("the thread opening the journal ended without an answer"),
        }),
    }
}

/// Refuses a home that is not private to this user, as OpenSSH's StrictModes refuses a
/// `~/.ssh` others can write: each of its [`Home::private_dirs`] that exists must be a
/// directory of the effective user that neither group nor others may write (a link to one,
/// of this user or root, will do), and its journal, if it exists, a regular file of the
/// effective user that neither group nor others may write, and no link
/// ([`durable_fs::judge_private`]). What is missing passes: it is made private when it is made.
/// Anyone who could write there could plant links that runjournal would write through, forge
/// records it would act on, or read its runs' argv and environment.
pub fn check_home(home: &Home) -> Result<(), OpenError> {
    for dir in home.private_dirs() {
        durable_fs::check_private(&dir, durable_fs::Expect::Directory)
            .map_err(|source| OpenError::from_io(&dir, source))?;
    }
    let journal = home.journal_path();
    durable_fs::check_private(&journal, durable_fs::Expect::File)
        .map_err(|source| OpenError::from_io(&journal, source))?;
    Ok(())
}

impl Store {
    /// Opens the home with options from the environment (see [`StoreOptions::from_env`]).
    pub fn open(home: Home) -> Result<Store, OpenError> {
        let options = StoreOptions::from_env().map_err(|reason| OpenError::Io {
            path: home.root().to_path_buf(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidInput, reason),
        })?;
        Store::open_with(home, options)
    }

    /// Opens the home, creating its directories (0700) and journal as needed. If that fails
    /// (a full disk, say), what this call created is removed again. A home that holds runs
    /// or results but whose journal file is missing, empty, zeroed, cut short or not a
    /// database is refused ([`OpenError::Lost`]) before anything is made.
    pub fn open_with(home: Home, options: StoreOptions) -> Result<Store, OpenError> {
        let mut created: Vec<PathBuf> = Vec::new();
        let outcome = Store::open_inner(home, options, &mut created);
        if outcome.is_err() {
            // Newest first: the journal file, then the directories that held it.
            for path in created.iter().rev() {
                if path.is_dir() {
                    let _ = std::fs::remove_dir(path);
                } else {
                    let _ = std::fs::remove_file(path);
                }
            }
        }
        outcome
    }

    fn open_inner(
        home: Home,
        options: StoreOptions,
        created: &mut Vec<PathBuf>,
    ) -> Result<Store, OpenError> {
        // Before anything is made: a home whose journal is of the other layout is refused,
        // so one directory never gets a second journal by mistake.
        home.check_layout().map_err(|mismatch| OpenError::Io {
            path: home.journal_path(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidInput, mismatch),
        })?;
        // Before anything is made either: a home someone else owns or may write is refused.
        check_home(&home)?;
        // Nor is a journal that was lost beside runs made anew: that would wipe the history.
        crate::journal::check_home_journal(&home)?;
        // `blocked/` is made now, while there is room: on a full ext4 a new directory needs a
        // block, but an empty marker file in an existing one does not.
        let dirs = [
            home.root().to_path_buf(),
            home.state_dir(),
            home.runs_dir(),
            home.results_dir(),
            capacity::blocked_dir(&home),
        ];
        // Only what this call made itself is listed for removal: a directory or a journal
        // another process made at the same moment is that process's (removing a journal it
        // has begun to commit to would lose its commits, and make the next process start an
        // empty one).
        for dir in dirs {
            // Durable: a journal whose directory's entry a power cut loses is lost whole.
            let made = durable_fs::ensure_private_dir_durable(&dir)
                .map_err(|source| OpenError::from_io(&dir, source))?;
            if made {
                created.push(dir);
            }
        }
        stop_in_open_if_asked();
        let journal_path = home.journal_path();
        match durable_fs::create_exclusive(&journal_path) {
            Ok(_) => {
                created.push(journal_path.clone());
                // The file's entry durable before any commit to it is acknowledged.
                durable_fs::sync_parent(&journal_path)
                    .map_err(|source| OpenError::from_io(&journal_path, source))?;
            }
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(source) => return Err(OpenError::from_io(&journal_path, source)),
        }
        let writer = WriterOptions {
            reserve: (options.reserve_bytes > 0)
                .then(|| Reserve::new(home.reserve_path(), options.reserve_bytes)),
            blocked_markers: Some(home.clone()),
            listener: options.listener,
            commit_sharing: options.commit_sharing,
            io_retry_window: options.io_retry_window,
            leader_timeout: options.leader_timeout,
            lock_wait: options.lock_wait,
            ..WriterOptions::default()
        };
        let journal = open_journal(journal_path, writer)?;
        let inner = Arc::new(Inner {
            home,
            journal,
            projector: Projector::new(),
            pending: PendingProjections::new(),
            wake: Mutex::new(RetryControl::default()),
            woken: Condvar::new(),
        });
        let retry_thread = std::thread::Builder::new()
            .name("runjournal-projection-retry".to_string())
            .spawn({
                let inner = Arc::clone(&inner);
                move || retry_loop(&inner)
            })
            .map_err(|source| OpenError::Io {
                path: PathBuf::from("<projection retry thread>"),
                source,
            })?;
        Ok(Store {
            inner,
            retry_thread: Some(retry_thread),
        })
    }

    pub fn home(&self) -> &Home {
        &self.inner.home
    }

    pub fn journal(&self) -> &Journal {
        &self.inner.journal
    }

    /// Creates a run and projects it.
    pub fn create_run(&self, spec: RunSpec, hosts: HostIds) -> Result<Appended, AppendError> {
        let appended = self.inner.journal.create_run(spec, hosts)?;
        self.inner
            .project_after_commit(appended.run, appended.last_seq);
        Ok(appended)
    }

    /// Appends a batch (see [`Journal::append`]) and then projects the run. A projection
    /// failure does not fail the append: the append is durable, and the projection is retried
    /// in the background.
    pub fn append(
        &self,
        run: RunId,
        events: Vec<Event>,
        condition: Condition,
    ) -> Result<Appended, AppendError> {
        let appended = self.inner.journal.append(run, events, condition)?;
        self.inner.project_after_commit(run, appended.last_seq);
        Ok(appended)
    }

    /// [`Store::create_run`], calling `on_durable` once the run is durable and before it is
    /// projected: for what should not wait for the files (a launch starting its runner).
    pub fn create_run_then<T>(
        &self,
        spec: RunSpec,
        hosts: HostIds,
        on_durable: impl FnOnce(&Appended) -> T,
    ) -> Result<(Appended, T), AppendError> {
        self.create_run_with_then(spec, hosts, Vec::new(), on_durable)
    }

    /// [`Store::create_run_then`] with `more` events in the creation batch after its
    /// `RunCreated` ([`Journal::create_run_with`]).
    pub fn create_run_with_then<T>(
        &self,
        spec: RunSpec,
        hosts: HostIds,
        more: Vec<Event>,
        on_durable: impl FnOnce(&Appended) -> T,
    ) -> Result<(Appended, T), AppendError> {
        let appended = self.inner.journal.create_run_with(spec, hosts, more)?;
        let value = on_durable(&appended);
        self.inner
            .project_after_commit(appended.run, appended.last_seq);
        Ok((appended, value))
    }

    /// Creates a run waiting in a queue ([`Journal::create_queued_run`]; `joined` is its
    /// `QueueJoined`), then projects it.
    pub fn create_queued_run(
        &self,
        spec: RunSpec,
        hosts: HostIds,
        joined: Event,
    ) -> Result<Appended, AppendError> {
        let appended = self.inner.journal.create_queued_run(spec, hosts, joined)?;
        self.inner
            .project_after_commit(appended.run, appended.last_seq);
        Ok(appended)
    }

    /// [`Store::append`], calling `on_durable` once the batch is durable and before it is
    /// projected: for what should not wait for the files (a runner telling its launcher that
    /// it took the run).
    pub fn append_then<T>(
        &self,
        run: RunId,
        events: Vec<Event>,
        condition: Condition,
        on_durable: impl FnOnce(&Appended) -> T,
    ) -> Result<(Appended, T), AppendError> {
        let appended = self.inner.journal.append(run, events, condition)?;
        let value = on_durable(&appended);
        self.inner.project_after_commit(run, appended.last_seq);
        Ok((appended, value))
    }

    /// Appends several batches (see [`Journal::append_all`]: queued together, committed in as
    /// few transactions as the writer's bounds allow, each answered on its own), then projects
    /// each run that an acknowledged batch changed. Results are in the order given.
    pub fn append_all(
        &self,
        batches: impl IntoIterator<Item = (RunId, Vec<Event>, Condition)>,
    ) -> Vec<Result<Appended, AppendError>> {
        let results = self.inner.journal.append_all(batches);
        for appended in results.iter().flatten() {
            self.inner
                .project_after_commit(appended.run, appended.last_seq);
        }
        results
    }

    /// Projects one run now (a result a host consumed is not written again).
    pub fn project(&self, run: RunId) -> Result<(), ProjectionError> {
        self.inner.project(run).map(|_| ())
    }

    /// Projects `run`, whose head is `head_seq`, after another run's batch changed what its
    /// files show (a resume links the paused run to the run that carries it on, in the resume
    /// index, without a record of its own). A failure waits for a retry, as after a commit.
    pub fn project_linked(&self, run: RunId, head_seq: u64) {
        self.inner.project_after_commit(run, head_seq);
    }

    /// A live runner's heartbeat for `run`: its status.json rewritten with `lastUpdate` now
    /// ([`projection::heartbeat`]); nothing is appended. `Ok(false)` when the run is terminal.
    pub fn heartbeat(&self, run: RunId) -> Result<bool, ProjectionError> {
        projection::heartbeat(
            &self.inner.home,
            &self.inner.journal,
            run,
            crate::event::now_ms(),
        )
    }

    /// How many runs have a projection waiting to be written again.
    pub fn pending_projections(&self) -> usize {
        self.inner.pending.count()
    }

    /// Writes every status.json put off, then retries the waiting projections until none is
    /// left or `within` has passed; returns how many are still waiting. A projection lost here
    /// is rebuilt by the reconciler later.
    pub fn flush_projections(&self, within: Duration) -> usize {
        let deadline = Instant::now() + within;
        self.inner
            .write_deferred(self.inner.projector.deferred_runs());
        let mut attempt = 0;
        loop {
            self.inner.retry_pending();
            let left = self.inner.pending.count();
            if left == 0 || Instant::now() >= deadline {
                return left;
            }
            let delay = Duration::from_millis(
                PROJECTION_RETRY_DELAYS_MS[attempt.min(PROJECTION_RETRY_DELAYS_MS.len() - 1)],
            );
            std::thread::sleep(delay.min(deadline.saturating_duration_since(Instant::now())));
            attempt += 1;
        }
    }
}

impl Inner {
    fn project(&self, run: RunId) -> Result<u64, ProjectionError> {
        projection::project(&self.home, &self.journal, run, ResultPolicy::Publish)
    }

    fn project_after_commit(&self, run: RunId, head_seq: u64) {
        self.project_incrementally(run, head_seq, true);
    }

    /// Projects `run` in proportion to what changed; a failure waits for a retry.
    fn project_incrementally(&self, run: RunId, head_seq: u64, may_defer_status: bool) {
        let projected = self.projector.project(
            &self.home,
            &self.journal,
            run,
            Instant::now(),
            may_defer_status,
        );
        match projected {
            Ok(projected) => {
                self.pending.succeeded(run, projected.head_seq);
                if projected.status_due.is_some() {
                    self.wake_with(|control| control.has_deferred = true);
                }
            }
            Err(_) => {
                self.pending.failed(run, head_seq);
                self.wake_with(|control| control.has_work = true);
            }
        }
    }

    fn wake_with(&self, change: impl FnOnce(&mut RetryControl)) {
        let mut control = self
            .wake
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        change(&mut control);
        drop(control);
        self.woken.notify_one();
    }

    /// Writes the status files put off of these runs now (with the runs' latest state).
    fn write_deferred(&self, runs: Vec<RunId>) {
        for run in runs {
            self.project_incrementally(run, 0, false);
        }
    }

    /// One pass over the waiting projections.
    fn retry_pending(&self) {
        for (run, pending) in self.pending.snapshot() {
            match self.project(run) {
                Ok(projected_seq) => self.pending.succeeded(run, projected_seq),
                Err(_) => self.pending.failed(run, pending.wanted_seq),
            }
        }
    }
}

/// The background thread: writes the status files put off when they are due, and retries
/// failed projections with growing delays until nothing waits. It sleeps while there is
/// nothing to do, and never blocks an append.
fn retry_loop(inner: &Inner) {
    let mut retry_at: Option<Instant> = None;
    loop {
        let mut control = inner
            .wake
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        loop {
            if control.should_stop {
                return;
            }
            if control.has_work && retry_at.is_none() {
                let attempts = inner.pending.max_attempts() as usize;
                let delay = Duration::from_millis(
                    PROJECTION_RETRY_DELAYS_MS[attempts
                        .min(PROJECTION_RETRY_DELAYS_MS.len())
                        .saturating_sub(1)],
                );
                retry_at = Some(Instant::now() + delay);
            }
            control.has_deferred = false;
            let next = [retry_at, inner.projector.next_due()]
                .into_iter()
                .flatten()
                .min();
            let now = Instant::now();
            match next {
                Some(next) if next <= now => break,
                Some(next) => {
                    control = inner
                        .woken
                        .wait_timeout(control, next - now)
                        .unwrap_or_else(|poisoned| poisoned.into_inner())
                        .0;
                }
                None => {
                    control = inner
                        .woken
                        .wait(control)
                        .unwrap_or_else(|poisoned| poisoned.into_inner());
                }
            }
        }
        drop(control);
        let now = Instant::now();
        inner.write_deferred(inner.projector.due_runs(now));
        if retry_at.is_some_and(|at| at <= now) {
            retry_at = None;
            inner.retry_pending();
            let mut control = inner
                .wake
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            control.has_work = inner.pending.count() > 0;
        }
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        // The status files put off are written before the store goes: a caller that appended
        // and dropped its store leaves them current.
        self.inner
            .write_deferred(self.inner.projector.deferred_runs());
        let mut control = self
            .inner
            .wake
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        control.should_stop = true;
        drop(control);
        self.inner.woken.notify_all();
        if let Some(thread) = self.retry_thread.take() {
            let _ = thread.join();
        }
    }
}
