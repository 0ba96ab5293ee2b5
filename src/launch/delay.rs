//! Delayed starts (docs/design.md, "Delayed starts"): a run created with `StartDelayed` waits,
//! `queued` and without a runner, until its due time; then whoever records its `DelayEnded`
//! starts its runner. The home's timer — one detached process per home, held by a lock file,
//! started when a run is delayed — sleeps until the soonest due time, starts what is due and
//! exits when nothing waits; every reconcile pass also starts what is due and starts the timer
//! again if it is gone.
//!
//! Invariants:
//! * a runner is started only for a run whose `DelayEnded` is durable, by the process whose
//!   append recorded it; the journal accepts it only once, and only in a record whose time is
//!   at or past the due time, so no runner starts early and two starters cannot both start one;
//!   should that process die before the runner takes the run, the reconciler fails the run
//!   "runner never started" once the start grace, counted from the delay's end, has passed;
//! * what is due is read from the `delayed` index, soonest first: a pass costs the same with 10
//!   runs waiting or 10,000;
//! * at most one timer leads per home (`Home::timer_lock_path`), and one stands by; one that
//!   finds nothing waiting lets the lock go and looks once more, so a run delayed meanwhile is
//!   never left without a timer and a reconcile pass;
//! * a timer stopped while it leads is taken over by the one standing by (or the next one
//!   started) once it has been silent for [`TIMER_SILENT_AFTER`]; should it go on, it finds
//!   its lock file replaced and exits.

use std::ffi::OsString;
use std::io;
use std::path::Path;
use std::time::Duration;

use super::watch::Watch;
use super::{LaunchError, RunnerProgram, queue};
use crate::durable_fs::FileLock;
use crate::event::{self, Event, RunId, UnixMs};
use crate::home::Home;
use crate::journal::share::lease::{Lease, file_id, is_deposed};
use crate::journal::{AppendError, Condition, ReadError};
use crate::state::TransitionError;
use crate::store::Store;

/// The hidden subcommand of `runjournal` that is the home's timer (`runjournal __timer --home
/// HOME --layout LAYOUT`), started detached ([`start_timer`]).
pub const TIMER_SUBCOMMAND: &str = "__timer";

/// The longest the timer sleeps between two looks at the `delayed` index: a run delayed to a
/// sooner time than the one it sleeps for is started at most this late. At each look the
/// timer also shows it is alive: it rewrites its lock file (its pid), which moves the file's
/// modification time on.
pub const TIMER_RECHECK: Duration = Duration::from_millis(250);

/// A timer whose lock file has not moved on for this long is taken for stopped (SIGSTOP, a
/// frozen container, a debugger) and its role is taken over ([`run_timer`]). Taking it from a
/// timer that was only slow costs nothing: the journal records a run's `DelayEnded` once, and
/// the slow timer, finding its lock file replaced, exits.
pub const TIMER_SILENT_AFTER: Duration = Duration::from_secs(1);

/// Most runs one look starts; the rest are started by the next look, at once.
pub const MAX_DUE_PER_LOOK: usize = 256;

/// The environment variable of a test hook, in builds with the `testkit` feature: when it
/// names a file, the timer that finds it there removes it and SIGKILLs itself before it starts
/// anything — a timer killed while runs wait.
pub const KILL_TIMER_ENV: &str = "RUNJOURNAL_TEST_KILL_TIMER";

/// Why starting delayed runs failed. What was journaled stays.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DelayError {
    #[error("reading the delayed runs: {0}")]
    Read(#[from] ReadError),
    #[error("run {run}: recording that it is due: {source}")]
    Record {
        run: RunId,
        #[source]
        source: Box<AppendError>,
    },
    #[error("run {run}: starting its runner: {source}")]
    Start {
        run: RunId,
        #[source]
        source: Box<LaunchError>,
    },
    #[error("the home's timer: {path}: {source}")]
    Lock {
        path: std::path::PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("starting the home's timer: {0}")]
    Spawn(#[source] io::Error),
}

/// A delayed run that was due and whose runner was started (or not: then the run is recorded
/// failed).
#[derive(Debug)]
pub struct DueStarted {
    pub run: RunId,
    pub due_at_ms: UnixMs,
    /// The runner's pid; `Err` says why it could not be started.
    pub runner: Result<u32, String>,
}

/// Starts every delayed run due by now: for each, soonest first, one conditional append of
/// `DelayEnded` (which the journal refuses before the due time, after the run ended, or once
/// another process recorded it), then its runner. `by` is recorded as who started it.
pub fn start_due(
    store: &Store,
    base: &RunnerProgram,
    by: &str,
) -> Result<Vec<DueStarted>, DelayError> {
    let mut started = Vec::new();
    loop {
        let now_ms = event::now_ms();
        let due = store
            .journal()
            .view()?
            .delayed_due_by(now_ms, MAX_DUE_PER_LOOK)?;
        let is_more = due.len() == MAX_DUE_PER_LOOK;
        for (due_at_ms, run) in due {
            let event = Event::DelayEnded { by: by.to_string() };
            let state = match store.append(run, vec![event], Condition::expect_not_terminal()) {
                Ok(appended) => appended.state,
                // Another process took it, or it ended (a stop) since the index was read.
                Err(
                    AppendError::AlreadyTerminal { .. }
                    | AppendError::Transition {
                        source: TransitionError::DelayAlreadyEnded { .. },
                        ..
                    },
                ) => continue,
                Err(source) => {
                    return Err(DelayError::Record {
                        run,
                        source: Box::new(source),
                    });
                }
            };
            // A retried run of a queue, once due, waits for a slot again: admitted (and
            // started) when its queue allows, by this pass or whoever frees a slot.
            if let Some(queue) = state.queue.as_ref().filter(|_| state.is_waiting_for_slot()) {
                queue::start_admissible(store, base, by, Some(&queue.name)).map_err(|source| {
                    DelayError::Start {
                        run,
                        source: Box::new(LaunchError::Queue {
                            run,
                            source: Box::new(source),
                        }),
                    }
                })?;
                continue;
            }
            let runner = queue::start_runner_detached(store, &state, base).map_err(|source| {
                DelayError::Start {
                    run,
                    source: Box::new(source),
                }
            })?;
            started.push(DueStarted {
                run,
                due_at_ms,
                runner,
            });
        }
        if !is_more {
            return Ok(started);
        }
    }
}

/// The soonest due time of a delayed run waiting, if one waits.
pub fn soonest_due(store: &Store) -> Result<Option<UnixMs>, DelayError> {
    Ok(store
        .journal()
        .view()?
        .soonest_delayed(1)?
        .first()
        .map(|(due_at_ms, _)| *due_at_ms))
}

/// How a timer ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimerEnd {
    /// Another timer holds the home's lock, and another stands by: this one did nothing.
    AlreadyRunning,
    /// Its lock file was replaced by a timer that took its role over, having found it silent.
    TakenOver,
    /// Nothing waits any more.
    NothingWaits,
    /// The home's journal is no longer the file this timer opened (it was rebuilt, say): the
    /// next reconcile pass starts a timer on the one there now.
    JournalReplaced,
}

/// The home's timer: takes the home's timer lock — from a timer found silent too
/// ([`TIMER_SILENT_AFTER`]) — or, while a live timer holds it, stands by (one per home,
/// `timer.lock.standby`) watching it until it lets go or falls silent; returns at once if
/// another stands by already. Holding the lock, it starts what is due, sleeps until the
/// soonest due time (at most [`TIMER_RECHECK`] at a time, so a run delayed meanwhile to a
/// sooner time is not missed, and so it is heard from), and returns once nothing waits, once
/// the home's journal is another file than the one it opened, or once another timer took its
/// role over. A failure to start one run is written through `note` and the timer goes on; a
/// failure to read the journal ends it (the next reconcile pass starts another).
pub fn run_timer(
    store: &Store,
    base: &RunnerProgram,
    by: &str,
    note: &mut dyn FnMut(&str),
) -> Result<TimerEnd, DelayError> {
    let path = store.home().timer_lock_path();
    let lock_error = |source| DelayError::Lock {
        path: path.clone(),
        source,
    };
    let Some(mut lease) = take_or_stand_by(store, &path).map_err(lock_error)? else {
        return Ok(TimerEnd::AlreadyRunning);
    };
    let beat = |lease: &Lease| {
        let _ = lease.write_note(format!("{}\n", std::process::id()).as_bytes());
    };
    beat(&lease);
    crate::liveness::die_here_if_asked(KILL_TIMER_ENV);
    let journal_path = store.home().journal_path();
    let journal = crate::durable_fs::file_identity(&journal_path);
    let mut watch = Watch::new();
    let mut idle_since: Option<std::time::Instant> = None;
    loop {
        if is_deposed(&path, lease.id()) {
            return Ok(TimerEnd::TakenOver);
        }
        beat(&lease);
        if journal.is_none() || crate::durable_fs::file_identity(&journal_path) != journal {
            return Ok(TimerEnd::JournalReplaced);
        }
        match start_due(store, base, by) {
            Ok(started) => {
                for started in started {
                    if let Err(error) = started.runner {
                        note(&format!("run {}: {error}", started.run));
                    }
                }
            }
            Err(error @ DelayError::Read(_)) => return Err(error),
            Err(error) => note(&error.to_string()),
        }
        let following = watch.look(store, base, by, note)?.following;
        let soonest = soonest_due(store)?;
        if soonest.is_some() || following > 0 {
            idle_since = None;
        }
        match soonest {
            Some(due_at_ms) => {
                let wait = Duration::from_millis(due_at_ms.saturating_sub(event::now_ms()));
                watch.sleep(wait.min(TIMER_RECHECK));
            }
            None if following > 0 => watch.sleep(TIMER_RECHECK),
            // Nothing to do: it stays a moment, for the launches right after the last run.
            None if idle_since
                .get_or_insert_with(std::time::Instant::now)
                .elapsed()
                < WATCHER_LINGER =>
            {
                watch.sleep(TIMER_RECHECK);
            }
            None => {
                // Let the lock go, then look once more: a run delayed or launched after the
                // look above started a timer that found the lock held; it is found here, or
                // its own timer takes the lock now.
                drop(lease);
                if soonest_due(store)?.is_none() && !super::watch::has_active(store)? {
                    return Ok(TimerEnd::NothingWaits);
                }
                match Lease::try_take(&path).map_err(lock_error)? {
                    Some(taken) => lease = taken,
                    None => return Ok(TimerEnd::AlreadyRunning),
                }
            }
        }
    }
}

/// How long the home's watcher stays once nothing is left to follow or start, so the launches
/// right after a run find it there rather than start another.
pub const WATCHER_LINGER: Duration = Duration::from_secs(1);

/// The timer's lock: taken if free, taken over if its holder is silent; else this process
/// stands by (holding the standby lock; `None` at once if another does) and looks again every
/// [`TIMER_RECHECK`], until it takes the lock or nothing waits (`None`).
fn take_or_stand_by(store: &Store, path: &Path) -> io::Result<Option<Lease>> {
    let standby_path = standby_path(path);
    let mut standby = None;
    loop {
        if let Some(lease) = take_timer_lock(path)? {
            return Ok(Some(lease));
        }
        if standby.is_none() {
            standby = Lease::try_take(&standby_path)?;
            if standby.is_none() {
                return Ok(None);
            }
        }
        match soonest_due(store) {
            Ok(Some(_)) => std::thread::sleep(TIMER_RECHECK),
            // Nothing waits, or the journal cannot be read: the leading timer (or the next
            // reconcile pass) sees to it.
            Ok(None) | Err(_) => return Ok(None),
        }
    }
}

/// Takes the timer's lock if nobody holds it, or over from a holder silent for
/// [`TIMER_SILENT_AFTER`]; `None` while a live timer holds it.
fn take_timer_lock(path: &Path) -> io::Result<Option<Lease>> {
    if let Some(lease) = Lease::try_take(path)? {
        return Ok(Some(lease));
    }
    let held = file_id(path)?;
    if !is_silent(path) {
        return Ok(None);
    }
    Lease::take_over(path, held)
}

/// Whether the timer lock file at `path` has not moved on for [`TIMER_SILENT_AFTER`] (a lock
/// file whose time is ahead of the clock, or that cannot be read, is not).
fn is_silent(path: &Path) -> bool {
    let Ok(Some(entry)) = crate::durable_fs::look(path) else {
        return false;
    };
    let silent_for_ms = i128::from(crate::event::now_ms()) - entry.stamp.modified_ms();
    silent_for_ms >= i128::try_from(TIMER_SILENT_AFTER.as_millis()).unwrap_or(i128::MAX)
}

/// The standby timer's lock beside the timer's lock at `path`.
fn standby_path(path: &Path) -> std::path::PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".standby");
    std::path::PathBuf::from(name)
}

/// The arguments the timer is started with, after the program.
pub fn timer_args(home: &Home) -> io::Result<Vec<OsString>> {
    crate::hooks::home_subcommand_args(TIMER_SUBCOMMAND, home)
}

/// Starts the home's timer detached (`program TIMER_SUBCOMMAND --home HOME --layout LAYOUT`);
/// its pid. A timer that finds another holding the lock exits at once.
pub fn start_timer(home: &Home, program: &Path) -> Result<u32, DelayError> {
    let args = timer_args(home).map_err(DelayError::Spawn)?;
    crate::hooks::start_detached(program, &args).map_err(DelayError::Spawn)
}

/// Starts the home's timer (its watcher) unless a live one holds its lock: its pid, if it
/// started one.
pub fn start_timer_if_none(home: &Home, program: &Path) -> Result<Option<u32>, DelayError> {
    if is_timer_running(home)? {
        return Ok(None);
    }
    start_timer(home, program).map(Some)
}

/// What a reconcile pass does for delayed runs: starts what is due, then, when runs still wait
/// and no timer holds the home's lock, starts one with `base.program`. The pass never waits
/// for a due time.
pub fn reconcile_delayed(
    store: &Store,
    base: &RunnerProgram,
    by: &str,
) -> Result<Vec<DueStarted>, DelayError> {
    let started = start_due(store, base, by)?;
    let is_wanted = soonest_due(store)?.is_some() || super::watch::has_active(store)?;
    if is_wanted && !is_timer_running(store.home())? {
        start_timer(store.home(), &base.program)?;
    }
    Ok(started)
}

/// Whether a live timer holds the home's lock now: held, and heard from within
/// [`TIMER_SILENT_AFTER`] (a silent one is taken over by the next timer started).
pub fn is_timer_running(home: &Home) -> Result<bool, DelayError> {
    let path = home.timer_lock_path();
    match FileLock::try_acquire(&path) {
        Ok(Some(_free)) => Ok(false),
        Ok(None) => Ok(!is_silent(&path)),
        Err(source) => Err(DelayError::Lock { path, source }),
    }
}

/// A launch that left its run waiting for its due time, as `runjournal run --json` prints it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DelayedLaunchReport {
    pub run_id: String,
    /// Always `queued`.
    pub state: &'static str,
    pub due_at_ms: UnixMs,
    /// The timer this launch started, if it could start one.
    pub timer_pid: Option<u32>,
    pub status_path: std::path::PathBuf,
    pub result_path: std::path::PathBuf,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit;

    fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = Store::open(Home::at(dir.path())).expect("open store");
        (dir, store)
    }

    fn delayed(store: &Store, due_at_ms: UnixMs) -> RunId {
        let creation = crate::journal::Creation {
            spec: testkit::chain_spec(1),
            hosts: Default::default(),
            more: vec![Event::StartDelayed {
                due_at_ms,
                idle_timeout_ms: None,
                heartbeat_ms: None,
            }],
            private: None,
        };
        store.create_then(creation, |_| ()).expect("created").0.run
    }

    #[test]
    fn a_delay_ends_only_at_its_due_time_and_once() {
        let (_dir, store) = store();
        let due_at_ms = event::now_ms() + 60_000;
        let run = delayed(&store, due_at_ms);
        let ended = |store: &Store| {
            store.append(
                run,
                vec![Event::DelayEnded {
                    by: "test".to_string(),
                }],
                Condition::expect_not_terminal(),
            )
        };
        assert!(matches!(
            ended(&store),
            Err(AppendError::Transition {
                source: TransitionError::NotYetDue { .. },
                ..
            })
        ));
        assert_eq!(soonest_due(&store).expect("read"), Some(due_at_ms));
    }

    #[test]
    fn the_delayed_index_gives_the_soonest_first_and_loses_a_run_once_it_is_due_or_stopped() {
        let (_dir, store) = store();
        let now_ms = event::now_ms();
        let later = delayed(&store, now_ms + 120_000);
        let sooner = delayed(&store, now_ms + 60_000);
        let past = delayed(&store, now_ms.saturating_sub(1));
        let view = store.journal().view().expect("view");
        let soonest: Vec<RunId> = view
            .soonest_delayed(10)
            .expect("read")
            .into_iter()
            .map(|(_, run)| run)
            .collect();
        assert_eq!(soonest, vec![past, sooner, later]);
        drop(view);
        let stopped =
            crate::control::request_stop(&store, sooner, "test", "not needed").expect("stopped");
        assert!(
            matches!(
                &stopped,
                crate::control::StopOutcome::StoppedWaiting { waiting }
                    if waiting.starts_with("for its due time")
            ),
            "{stopped:?}"
        );
        // The past one is due: its delay ends (its runner, a program that does not exist here,
        // cannot start, so it is recorded failed).
        let base = RunnerProgram {
            program: "/nonexistent/runjournal".into(),
            leading_args: Vec::new(),
        };
        let started = start_due(&store, &base, "test").expect("started");
        assert_eq!(started.len(), 1);
        assert_eq!(started[0].run, past);
        let state = store
            .journal()
            .view()
            .expect("view")
            .snapshot(past)
            .expect("read");
        let state = state.expect("the run");
        let ended = state
            .delay
            .and_then(|delay| delay.ended)
            .expect("its delay ended");
        assert!(ended.at_ms >= now_ms.saturating_sub(1));
        let left: Vec<RunId> = store
            .journal()
            .view()
            .expect("view")
            .soonest_delayed(10)
            .expect("read")
            .into_iter()
            .map(|(_, run)| run)
            .collect();
        assert_eq!(left, vec![later]);
    }
}
