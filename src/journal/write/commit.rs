//! The commit step: a group of batches committed in one durable write transaction, each
//! caller answered with its own result, riding out a full disk and flaky storage. The writer
//! thread (`handle::writer`) and a commit leader (`share`) both commit through it.
//!
//! Invariants:
//! * a caller is answered only after the commit holding its batch returned, or once its batch
//!   was refused, or once the writer gave up: at once on a failure that is not about storage,
//!   and on another storage failure once it has lasted the retry window; a capacity failure
//!   is never answered, it is waited out;
//! * on any storage failure the redb handle is dropped and the database reopened before the
//!   next attempt (redb refuses every call on a handle after an I/O error, and a failed fsync
//!   must never be retried on the same file and trusted); a reopen never creates a journal;
//! * a retried group keeps its writer seqs, so a commit that did land before the failure is
//!   recognised and not applied twice;
//! * on a capacity error the reserve file is released first, so the retry has room.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use redb::Database;

use crate::capacity::{self, BlockCause, FailureClass, Reserve};
use crate::event::{Event, RunId, UnixMs, WriterId, now_ms};
use crate::journal::file::Location;
use crate::journal::file::lock_wait::{self, BeginError, Within};
use crate::journal::file::open::reopen_location;
use crate::journal::file::pages;
use crate::journal::format::error::{AppendError, LockHeld, OpenError, StorageFailure};
use crate::journal::write::append::{self, Appended, Batch, Condition};
use crate::journal::write::options::{CapacityEvent, WriterOptions, open_lock_notice};
use crate::state::RunState;

/// Delays between attempts while the disk stays full or the storage keeps failing: short at
/// first, then every 2 s.
pub const RETRY_DELAYS_MS: [u64; 8] = [10, 25, 50, 100, 250, 500, 1000, 2000];

fn retry_delay(attempt: usize) -> Duration {
    Duration::from_millis(RETRY_DELAYS_MS[attempt.min(RETRY_DELAYS_MS.len() - 1)])
}

/// One caller's append.
pub(crate) struct Request {
    pub(crate) run: RunId,
    pub(crate) events: Vec<Event>,
    pub(crate) condition: Condition,
    pub(crate) origin: Origin,
    /// What a new run keeps in the home only ([`Batch::private`]).
    pub(crate) private: Option<std::sync::Arc<crate::run_env::RunPrivate>>,
}

/// Whose batch a request is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    /// A caller of this handle: the writer numbers it with this handle's writer id.
    Local,
    /// Another process's batch, handed to this handle as the commit leader (`share`): it is
    /// committed under the writer id, writer seq and time its own writer gave it.
    Remote {
        writer: WriterId,
        writer_seq: u64,
        time_ms: UnixMs,
    },
}

/// The writer's answer to one request.
pub(crate) struct Answer {
    pub(crate) result: Result<Appended, AppendError>,
    /// For a refused remote batch: the run's state it was judged against (see
    /// [`append::Judged`]).
    pub(crate) refused_against: Option<Option<RunState>>,
    /// An attempt at the commit failed before this answer, so an earlier attempt may have
    /// landed: a remote writer may then judge its batch again under a fresh seq.
    pub(crate) was_retried: bool,
}

/// Counters of the writer's work.
#[derive(Debug, Default)]
pub struct WriterStats {
    /// Batches (caller appends) queued so far, each counted just after it entered the queue;
    /// those not yet in `batches` are waiting or being committed.
    pub submitted: AtomicU64,
    /// Write transactions committed.
    pub commits: AtomicU64,
    /// Batches (caller appends) answered from those commits.
    pub batches: AtomicU64,
    /// Storage failures met (each followed by a reopen).
    pub failures: AtomicU64,
    /// Times the writer gave up on storage errors that outlasted the retry window.
    pub give_ups: AtomicU64,
    /// Batches of this handle answered by another handle, the commit leader, which committed
    /// (or refused) them for it.
    pub through_leader: AtomicU64,
    /// Batches of other handles that this handle committed as their commit leader.
    pub for_others: AtomicU64,
}

/// What the journal handle and its writer thread share.
pub(crate) struct Shared {
    pub(crate) location: Location,
    pub(crate) writer: WriterId,
    db: RwLock<Option<Arc<Database>>>,
    pub(crate) options: WriterOptions,
    pub(crate) stats: WriterStats,
    /// Set when the handle is being dropped: a commit leader takes no new clients then.
    pub(crate) is_closing: std::sync::atomic::AtomicBool,
    /// While the writer waits for the journal's write lock past its notice: since when, and
    /// who holds it (a commit leader tells its clients).
    pub(crate) waiting_for_lock: std::sync::Mutex<Option<LockHeld>>,
    /// The states this handle's commits last stored (only its writer thread commits).
    stored: std::sync::Mutex<append::StoredStates>,
}

impl Shared {
    pub(crate) fn new(location: Location, db: Database, options: WriterOptions) -> Shared {
        Shared {
            location,
            writer: WriterId::generate(),
            db: RwLock::new(Some(Arc::new(db))),
            options,
            stats: WriterStats::default(),
            is_closing: std::sync::atomic::AtomicBool::new(false),
            waiting_for_lock: std::sync::Mutex::new(None),
            stored: std::sync::Mutex::default(),
        }
    }

    /// The current handle; `None` while it is being reopened after a failure.
    pub(crate) fn database(&self) -> Option<Arc<Database>> {
        let db = self
            .db
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        db.clone()
    }

    fn set_database(&self, db: Option<Arc<Database>>) {
        let mut slot = self
            .db
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *slot = db;
    }

    /// Drops the current handle if it is `failed` (a reader met a storage failure through
    /// it), so that the next use reopens; a handle the writer already replaced is kept.
    pub(crate) fn discard_database(&self, failed: &Arc<Database>) {
        let mut slot = self
            .db
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if slot.as_ref().is_some_and(|db| Arc::ptr_eq(db, failed)) {
            *slot = None;
        }
    }

    /// A fresh handle, made the shared one if none is (the writer may have reopened first).
    pub(crate) fn reopen_database(&self) -> Result<Arc<Database>, OpenError> {
        let db = Arc::new(self.reopen()?);
        let mut slot = self
            .db
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if slot.is_none() {
            *slot = Some(Arc::clone(&db));
        }
        Ok(db)
    }

    /// The journal opened again ([`reopen_location`]), waiting for its write lock as the
    /// handle's [`LockWait`] says.
    ///
    /// [`LockWait`]: crate::journal::file::lock_wait::LockWait
    fn reopen(&self) -> Result<Database, OpenError> {
        lock_wait::within(
            &self.options.lock_wait,
            open_lock_notice(&self.options),
            || reopen_location(&self.location),
        )
        .map_err(|within| match within {
            Within::Failed(error) => error,
            Within::GaveUp(held) => OpenError::WriteLockHeld(held),
        })
    }

    fn set_waiting_for_lock(&self, held: Option<LockHeld>) {
        *self
            .waiting_for_lock
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = held;
    }

    /// Whether the writer is believed to have its reserve in place.
    fn has_reserve(&self) -> bool {
        self.options.reserve.as_ref().is_some_and(Reserve::exists)
    }

    fn emit(&self, event: CapacityEvent) {
        if let Some(listener) = &self.options.listener {
            listener(&event);
        }
    }
}

/// What the writer knows of its fight with a full disk or flaky storage.
#[derive(Default)]
pub(crate) struct CapacityState {
    blocked_since_ms: Option<u64>,
    /// Why it is blocked now (the latest failure's cause).
    blocked_cause: Option<BlockCause>,
    /// The marker this writer made for others to see while blocked, to remove once unblocked.
    blocked_marker: Option<capacity::Blocked>,
    /// When the first storage failure of the current streak happened: the retry window runs
    /// from there, across groups, until a commit lands.
    failing_since: Option<Instant>,
    /// Storage errors outlasted the window and no commit has landed since: each group is
    /// tried once.
    has_given_up: bool,
    /// The reserve is (believed) missing and should be made again when space allows.
    is_reserve_missing: bool,
    last_reserve_attempt: Option<Instant>,
}

impl CapacityState {
    /// A writer's state before its first commit: the reserve is missing if it should be there
    /// and is not.
    pub(crate) fn of(shared: &Shared) -> CapacityState {
        CapacityState {
            is_reserve_missing: shared.options.reserve.is_some() && !shared.has_reserve(),
            ..CapacityState::default()
        }
    }

    /// A writer that stops (its journal handle closed) is no longer blocked: its marker goes.
    pub(crate) fn clear_marker_at_exit(&mut self, shared: &Shared) {
        if let (Some(home), Some(blocked)) =
            (&shared.options.blocked_markers, self.blocked_marker.take())
        {
            let _ = capacity::clear_blocked(home, &blocked);
        }
    }
}

/// Most times the refused batches of a group are judged again (see [`commit_and_rejudge`]);
/// each time needs another failed commit that in fact landed.
const MAX_REJUDGE_ROUNDS: usize = 8;

/// Commits a group (see [`commit_group`]), then judges again, under fresh writer seqs from
/// `renumber`, every batch of this handle's writer that a retry answered with its own writer
/// seq "reused".
///
/// When a group's commit lands but reports a failure (the last sync failed, say), the retry
/// finds the writer mark past every batch of the group. A batch that was committed is then
/// recognised by its records; a batch that was refused (a head mismatch, an illegal
/// transition) wrote none, so the retry could only call its seq reused, and its caller got
/// that instead of its refusal. Nothing of such a batch is in the journal and its caller has no
/// answer yet, so judging it again now, as a new batch, is exact. `was_uncertain` says that
/// the group was handed to a commit leader before, which may have committed it without
/// answering: a seq found reused is then judged again as after a retry. Batches of other
/// writers (a leader's clients) are answered as they are; their own writers judge them again.
pub(crate) fn commit_and_rejudge(
    shared: &Shared,
    mut batches: Vec<Batch>,
    capacity: &mut CapacityState,
    was_uncertain: bool,
    renumber: &mut dyn FnMut(Batch) -> Batch,
) -> Vec<Answer> {
    let (mut answers, mut was_retried) = commit_group(shared, &batches, capacity);
    was_retried |= was_uncertain;
    // Positions in `answers` of the batches being judged again.
    let mut positions: Vec<usize> = (0..batches.len()).collect();
    for _ in 0..MAX_REJUDGE_ROUNDS {
        if !was_retried {
            break;
        }
        let stale: Vec<usize> = (0..batches.len())
            .filter(|&index| {
                batches[index].writer == shared.writer
                    && answers.get(positions[index]).is_some_and(|answer| {
                        matches!(
                            &answer.result,
                            Err(AppendError::WriterSeqReused { writer, writer_seq, .. })
                                if *writer == batches[index].writer
                                    && *writer_seq == batches[index].writer_seq
                        )
                    })
            })
            .collect();
        if stale.is_empty() {
            break;
        }
        let again: Vec<Batch> = stale
            .iter()
            .map(|&index| renumber(batches[index].clone()))
            .collect();
        positions = stale.iter().map(|&index| positions[index]).collect();
        let (again_answers, retried) = commit_group(shared, &again, capacity);
        for (position, answer) in positions.iter().zip(again_answers) {
            if let Some(slot) = answers.get_mut(*position) {
                *slot = answer;
            }
        }
        batches = again;
        was_retried = retried;
    }
    answers
}

/// Exactly one answer per batch of a group, in the group's order (`runs`: each batch's run),
/// whatever `answers` holds: checked in every build, for a caller without an answer would wait
/// for ever. An answer missing (a fault of this build) tells its caller that its batch may or
/// may not have landed; an answer beyond the group is dropped.
pub(crate) fn one_answer_per_batch(mut answers: Vec<Answer>, runs: &[RunId]) -> Vec<Answer> {
    answers.truncate(runs.len());
    let answered = answers.len();
    answers.extend(runs[answered..].iter().map(|&run| Answer {
        result: Err(AppendError::Unanswered { run }),
        refused_against: None,
        was_retried: false,
    }));
    answers
}

/// Commits a group, retrying through reopens until it lands (see [`commit_retrying`]). Returns
/// the answers (each saying whether an attempt failed before it, so an earlier attempt may have
/// landed unacknowledged), and that flag.
fn commit_group(
    shared: &Shared,
    batches: &[Batch],
    capacity: &mut CapacityState,
) -> (Vec<Answer>, bool) {
    // Refusals of other writers' batches keep the state they were judged against, for their
    // writers to word them.
    let is_remote = |batch: &Batch| batch.writer != shared.writer;
    let mut stored = shared
        .stored
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let attempted = commit_retrying(shared, capacity, |txn| {
        append::commit_batches_judged_in(
            txn,
            batches,
            append::Marks::Idempotent,
            is_remote,
            &mut stored,
        )
    });
    drop(stored);
    let failed = |result: &dyn Fn() -> AppendError, was_retried| {
        batches
            .iter()
            .map(|_| Answer {
                result: Err(result()),
                refused_against: None,
                was_retried,
            })
            .collect()
    };
    match attempted {
        Attempted::Landed {
            value: judged,
            was_retried,
        } => {
            let remote = batches.iter().filter(|batch| is_remote(batch)).count();
            if remote > 0 {
                shared
                    .stats
                    .for_others
                    .fetch_add(remote as u64, Ordering::Relaxed);
            }
            let answers = judged
                .into_iter()
                .map(|judged| Answer {
                    result: judged.result,
                    refused_against: judged.refused_against,
                    was_retried,
                })
                .collect();
            (answers, was_retried)
        }
        // Given up on another process's write transaction: nothing was begun, so nothing of
        // the group was judged or written.
        Attempted::Held { held, was_retried } => (
            failed(&|| AppendError::WriteLockHeld((*held).clone()), was_retried),
            false,
        ),
        Attempted::GaveUp {
            failure,
            was_retried,
        } => (
            failed(&|| AppendError::Storage(failure.duplicate()), was_retried),
            false,
        ),
    }
}

/// How [`commit_retrying`] ended.
enum Attempted<T> {
    Landed {
        value: T,
        was_retried: bool,
    },
    /// The wait for another process's write lock was given up; nothing was begun.
    Held {
        held: Box<LockHeld>,
        was_retried: bool,
    },
    /// A failure that is not retried, or retried past its window.
    GaveUp {
        failure: StorageFailure,
        was_retried: bool,
    },
}

/// Runs `once` in a durable write transaction until it lands: a capacity failure is retried
/// until it clears (the reserve released to make room), another storage failure until the
/// retry window (from the first failure of the streak) has passed, and a failure that is not
/// about storage not at all. The handle is reopened after every failure.
fn commit_retrying<T>(
    shared: &Shared,
    capacity: &mut CapacityState,
    mut once: impl FnMut(redb::WriteTransaction) -> Result<T, StorageFailure>,
) -> Attempted<T> {
    let mut attempt = 0usize;
    loop {
        let outcome = current_or_reopened(shared).and_then(|db| {
            let txn = begin_write(shared, capacity, &db)?;
            once(txn).map_err(Failed::from)
        });
        let failure = match outcome {
            Ok(value) => {
                shared.stats.commits.fetch_add(1, Ordering::Relaxed);
                after_success(shared, capacity);
                return Attempted::Landed {
                    value,
                    was_retried: attempt > 0,
                };
            }
            Err(Failed {
                held: Some(held), ..
            }) => {
                return Attempted::Held {
                    held,
                    was_retried: attempt > 0,
                };
            }
            Err(failure) => damage_behind(&shared.location, failure),
        };
        shared.stats.failures.fetch_add(1, Ordering::Relaxed);
        // The handle is suspect after any failure: drop it; the next attempt reopens.
        shared.set_database(None);
        let class = failure.class;
        let failing_for = match class {
            FailureClass::NotStorage => Duration::ZERO,
            _ => capacity
                .failing_since
                .get_or_insert_with(Instant::now)
                .elapsed(),
        };
        let window = shared.options.io_retry_window;
        // After a give-up, storage errors get one attempt per group until a commit lands.
        let is_retried = capacity::is_retried(class, failing_for, window)
            && !(capacity.has_given_up && class != FailureClass::Capacity);
        if !is_retried {
            if class != FailureClass::NotStorage && !capacity.has_given_up {
                capacity.has_given_up = true;
                shared.stats.give_ups.fetch_add(1, Ordering::Relaxed);
                shared.emit(CapacityEvent::GaveUp {
                    blocked_ms: duration_ms(failing_for),
                    error: failure.failure.to_string(),
                });
            }
            // Leave a working handle for the next group if one can be had.
            let _ = current_or_reopened(shared);
            return Attempted::GaveUp {
                failure: failure.failure,
                was_retried: attempt > 0,
            };
        }
        if let Some(cause) = class.cause() {
            on_blocked(shared, capacity, cause, &failure.failure);
        }
        if class == FailureClass::Capacity {
            release_reserve(shared, capacity);
        }
        let delay = retry_delay(attempt);
        // A storage error is retried up to the window's end, not a whole delay past it.
        let delay = match class {
            FailureClass::Io { .. } => delay.min(window.saturating_sub(failing_for)),
            _ => delay,
        };
        std::thread::sleep(delay);
        attempt += 1;
    }
}

/// A write of the journal's upkeep (pruning, the retention policy), made on the calling thread
/// rather than through the queue: it holds no run's batch, so it is never shared with a commit
/// leader. It rides out a full disk and flaky storage as a group does, with its own record of
/// the fight (a marker of its own while it is blocked).
pub(crate) fn commit_upkeep<T>(
    shared: &Shared,
    once: impl FnMut(&redb::WriteTransaction) -> Result<T, StorageFailure>,
) -> Result<T, AppendError> {
    let mut once = once;
    let mut capacity = CapacityState::of(shared);
    let attempted = commit_retrying(shared, &mut capacity, |mut txn| {
        txn.set_durability(redb::Durability::Immediate)
            .map_err(|e| StorageFailure::new("setting durability", redb::Error::from(e)))?;
        let value = once(&txn)?;
        txn.commit()
            .map_err(|e| StorageFailure::new("committing", e))?;
        Ok(value)
    });
    capacity.clear_marker_at_exit(shared);
    match attempted {
        Attempted::Landed { value, .. } => Ok(value),
        Attempted::Held { held, .. } => Err(AppendError::WriteLockHeld(*held)),
        Attempted::GaveUp { failure, .. } => Err(AppendError::Storage(failure)),
    }
}

fn duration_ms(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// The environment variable of a test hook, built only with the `testkit` feature (which the
/// tests turn on, in every profile): while a file exists at the path it names, the next write
/// transaction that begins removes it and stops this whole process (SIGSTOP) inside the
/// transaction, holding the journal's write lock, as a process stopped by a debugger or a
/// frozen cgroup would. A file holding a number N above 0 lets N more write transactions (of
/// any process with the variable) pass first, each counting it down.
pub const STOP_IN_COMMIT_ENV: &str = "RUNJOURNAL_TEST_STOP_IN_COMMIT";

#[cfg(feature = "testkit")]
fn stop_here_if_asked() {
    let Some(path) = std::env::var_os(STOP_IN_COMMIT_ENV) else {
        return;
    };
    let to_pass = std::fs::read_to_string(&path)
        .ok()
        .and_then(|text| text.trim().parse::<u64>().ok())
        .unwrap_or(0);
    if to_pass > 0 {
        let _ = std::fs::write(&path, (to_pass - 1).to_string());
        return;
    }
    if std::fs::remove_file(path).is_ok() {
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGSTOP);
    }
}

#[cfg(not(feature = "testkit"))]
fn stop_here_if_asked() {}

/// A failed attempt: what failed, and how it is ridden out.
struct Failed {
    failure: StorageFailure,
    class: FailureClass,
    /// The wait for another process's write lock was given up (see `LockWait`).
    held: Option<Box<LockHeld>>,
}

impl From<StorageFailure> for Failed {
    fn from(failure: StorageFailure) -> Failed {
        let class = failure.class();
        Failed {
            failure,
            class,
            held: None,
        }
    }
}

/// A handle that latched on a page its guard refused answers `PreviousIo`: that failure is the
/// damage behind it ([`pages::damage_behind`]), never a disk to wait for.
fn damage_behind(location: &Location, failed: Failed) -> Failed {
    let Location::Path(path) = location else {
        return failed;
    };
    if failed.held.is_some() {
        return failed;
    }
    Failed::from(pages::damage_behind(path, failed.failure))
}

/// Begins the group's write transaction, waiting for another process's write lock as the
/// handle's `LockWait` says: a wait past its notice marks the writer blocked (for `status`
/// and `list` to show, and the listener to log) until a commit lands again.
fn begin_write(
    shared: &Shared,
    capacity: &mut CapacityState,
    db: &Arc<Database>,
) -> Result<redb::WriteTransaction, Failed> {
    let path = match &shared.location {
        Location::Path(path) => Some(path.as_path()),
        Location::Backend { .. } => None,
    };
    let mut on_notice = |held: &LockHeld| {
        let failure = StorageFailure::new(
            "waiting for the journal's write lock",
            redb::Error::Io(io::Error::other(held.to_string())),
        );
        on_blocked(shared, capacity, BlockCause::WriteLock, &failure);
        shared.set_waiting_for_lock(Some(held.clone()));
    };
    let begun = lock_wait::begin_write(db, path, &shared.options.lock_wait, &mut on_notice);
    shared.set_waiting_for_lock(None);
    match begun {
        Ok(txn) => {
            stop_here_if_asked();
            Ok(txn)
        }
        Err(BeginError::Redb(error)) => Err(Failed::from(StorageFailure::new(
            "beginning a write",
            redb::Error::from(error),
        ))),
        Err(BeginError::GaveUp(held)) => Err(Failed {
            failure: StorageFailure::new(
                "waiting for the journal's write lock",
                redb::Error::Io(io::Error::other(held.to_string())),
            ),
            class: FailureClass::NotStorage,
            held: Some(Box::new(held)),
        }),
    }
}

/// The current handle, or a fresh one if the last failed. A reopen never creates a journal:
/// a file that is no longer a journal fails the attempt as not about storage.
fn current_or_reopened(shared: &Shared) -> Result<Arc<Database>, Failed> {
    if let Some(db) = shared.database() {
        return Ok(db);
    }
    let db = Arc::new(shared.reopen().map_err(open_failure)?);
    shared.set_database(Some(Arc::clone(&db)));
    Ok(db)
}

/// A failed reopen as a failed attempt, keeping what it says about storage: an I/O error is
/// the storage's; a file that is no longer a journal of ours is not about storage.
pub(crate) fn open_failure_class(error: &OpenError) -> FailureClass {
    match error {
        OpenError::Storage(failure) => failure.class(),
        OpenError::Io { source, .. } => capacity::classify_io(source),
        _ => FailureClass::NotStorage,
    }
}

fn open_failure(error: OpenError) -> Failed {
    if let OpenError::WriteLockHeld(held) = error {
        return Failed {
            failure: StorageFailure::new(
                "reopening the journal",
                redb::Error::Io(io::Error::other(held.to_string())),
            ),
            class: FailureClass::NotStorage,
            held: Some(Box::new(held)),
        };
    }
    let class = open_failure_class(&error);
    let failure = match error {
        OpenError::Storage(failure) => failure,
        OpenError::Io { source, .. } => StorageFailure::new("reopening the journal", source),
        // Damage stays damage (`StorageFailure::is_damage`): never retried, exit 4.
        other if other.is_damage() => StorageFailure::new(
            "reopening the journal",
            redb::Error::Corrupted(other.to_string()),
        ),
        other => StorageFailure::new(
            "reopening the journal",
            redb::Error::Io(io::Error::other(other.to_string())),
        ),
    };
    Failed {
        failure,
        class,
        held: None,
    }
}

/// Marks the writer blocked (for other processes, and the listener) when it was not, or when
/// the cause changed.
fn on_blocked(
    shared: &Shared,
    capacity: &mut CapacityState,
    cause: BlockCause,
    failure: &StorageFailure,
) {
    if capacity.blocked_cause == Some(cause) {
        return;
    }
    let since_ms = *capacity.blocked_since_ms.get_or_insert_with(now_ms);
    capacity.blocked_cause = Some(cause);
    if let Some(home) = &shared.options.blocked_markers {
        // Best effort: a marker is for others to see; the retry does not depend on it.
        if let Some(old) = capacity.blocked_marker.take() {
            let _ = capacity::clear_blocked(home, &old);
        }
        if let Ok(writer) = crate::liveness::current() {
            let blocked = capacity::Blocked {
                writer,
                since_ms,
                cause,
            };
            let _ = capacity::mark_blocked(home, &blocked);
            capacity.blocked_marker = Some(blocked);
        }
    }
    shared.emit(CapacityEvent::Blocked {
        since_ms,
        error: failure.to_string(),
        cause,
    });
}

/// Deletes the reserve so that the retry has room.
fn release_reserve(shared: &Shared, capacity: &mut CapacityState) {
    let reserve = shared.options.reserve.as_ref();
    if let Some((reserve, Ok(true))) = reserve.map(|reserve| (reserve, reserve.release())) {
        capacity.is_reserve_missing = true;
        shared.emit(CapacityEvent::ReserveReleased {
            bytes: reserve.bytes(),
        });
    }
}

fn after_success(shared: &Shared, capacity: &mut CapacityState) {
    let was_blocked = capacity.blocked_since_ms.is_some();
    capacity.failing_since = None;
    capacity.has_given_up = false;
    capacity.blocked_cause = None;
    if let Some(since_ms) = capacity.blocked_since_ms.take() {
        if let (Some(home), Some(blocked)) = (
            &shared.options.blocked_markers,
            capacity.blocked_marker.take(),
        ) {
            let _ = capacity::clear_blocked(home, &blocked);
        }
        shared.emit(CapacityEvent::Unblocked {
            blocked_ms: now_ms().saturating_sub(since_ms),
        });
    }
    let Some(reserve) = &shared.options.reserve else {
        return;
    };
    if !capacity.is_reserve_missing {
        return;
    }
    // Making the reserve costs a file write: try as soon as space came back, and otherwise
    // at most once a second.
    let is_due = was_blocked
        || capacity
            .last_reserve_attempt
            .is_none_or(|last| last.elapsed() >= Duration::from_secs(1));
    if !is_due {
        return;
    }
    capacity.last_reserve_attempt = Some(Instant::now());
    if let Ok(true) = reserve.ensure() {
        capacity.is_reserve_missing = false;
        shared.emit(CapacityEvent::ReserveRestored {
            bytes: reserve.bytes(),
        });
    }
}
