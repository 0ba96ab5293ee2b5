//! The runner: the detached process that executes a run's steps and records their
//! transitions (docs/design.md, "Runner and launch").
//!
//! It takes the run with `RunnerStarted`, starts steps per mode (`single`; `chain` in order,
//! stopping at the first failure; `parallel`, at most `concurrency` at once), and records
//! `StepRunning`, `StepFinished` and finally `Terminal`, each committed before it acts on what
//! follows. Control requests (stop, timeout, interrupt) are read from the journal: the runner
//! polls its run every [`RunnerConfig::poll_interval`], and a SIGTERM or SIGINT makes it
//! record a stop itself and look at once.
//!
//! Invariants:
//! * a step's program runs only after its `StepRunning` is durable, and that append is
//!   conditional on the head the runner last checked for control requests, so a stop recorded
//!   before a step starts is honoured: the step never runs ([`step_process`]);
//! * every step's process group is verified empty (or reported with survivors) before its
//!   `StepFinished`, and every `StepFinished` before the `Terminal`;
//! * once no step runs, nothing a step started is left below the runner: the descendant
//!   [`sweep`] ends it and the step's error names it; and nothing is left when the runner exits;
//! * the runner and its steps start with descriptors 0–2 only (and a step's are its output
//!   pipe), whatever the runner's launcher had open;
//! * no write to a log (the runner's own, a step's output) can end the runner or a step: logs
//!   are best effort ([`output`]);
//! * the runner records nothing after `Terminal` but its run's hooks' attempts
//!   ([`crate::hooks`]): `ProcessTerminalObserved` is for whoever sees it gone;
//! * a step starts in the environment its run's launcher recorded, whoever started this
//!   runner ([`crate::store::Store::start_environment`]).
//!
//! # Exit codes of a run
//!
//! `Terminal.exit_code` is 0 for a complete run; for a failed one the first failing step's exit
//! code when it is non-zero (128 + N for a step killed by signal N, 127 for a program that
//! could not be run), else 1; [`EXIT_TIMED_OUT`] (124) for a run that timed out,
//! [`EXIT_STOPPED`] (143) for a stopped one and [`EXIT_INTERRUPTED`] (130) for an interrupted
//! (paused) one.

pub mod control_inbox;
pub mod external_job;
pub mod outcome;
pub mod output;
pub mod ready;
mod recorder;
pub mod steer;
pub mod step;
pub mod step_process;

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::{Notify, watch};
use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior};

pub use ready::{READY_FD_ENV, ReadySignal};
pub use recorder::Recorder;

use crate::event::{
    self, AttemptCause, ControlAction, Event, ExternalJobStatus, JobState, MAX_TEXT_BYTES, Mode,
    RunId, RunSpec, StepEnd, StepOutcome, TerminalState, UnixMs,
};
use crate::exit::describe_exit;
use crate::home::Home;
use crate::journal::{AppendError, CapacityEvent, Condition, OpenError, ReadError};
use crate::liveness;
use crate::logs::{self, TailBounds};
use crate::process_group::sweep::{self, Swept};
use crate::state::{
    AttemptFailure, ControlInfo, RunState, RunStatus, StepStatus, StepStopInfo, TransitionError,
};
use crate::store::{Store, StoreOptions};
use outcome::{StepFailure, halt_error};
use output::StepOutput;
use step::{JobEnd, ProcessReport};

/// Exit code of a failed run whose failure has no exit code of its own.
pub const EXIT_FAILED: i32 = 1;
/// Exit code of a step whose program could not be found.
pub const EXIT_NOT_FOUND: i32 = 127;
/// Exit code of a step whose program could not be executed (permissions, format).
pub const EXIT_CANNOT_EXECUTE: i32 = 126;
/// Exit code of a run that reached its timeout (as coreutils' `timeout` uses it).
pub const EXIT_TIMED_OUT: i32 = 124;
/// Exit code of an interrupted (paused) run: 128 + SIGINT.
pub const EXIT_INTERRUPTED: i32 = 130;
/// Exit code of a stopped run: 128 + SIGTERM.
pub const EXIT_STOPPED: i32 = 143;

/// Most retries of a conditional append whose expected head another writer moved.
const MAX_HEAD_RETRIES: u32 = 64;

/// How much of the last step's output is kept as the run's summary.
const SUMMARY_TAIL: TailBounds = TailBounds {
    max_lines: 5,
    max_bytes: 1000,
};

/// How long the runner keeps retrying failed projections before it exits.
const PROJECTION_FLUSH_TIMEOUT: Duration = Duration::from_secs(2);

/// How long, once a step has ended, its output may take to be drained and written: its
/// pipe's last writers are gone (its group and what it left were ended), so this bounds only a
/// slow disk or a pipe handed to a process the runner cannot reach.
const OUTPUT_FINISH_TIMEOUT: Duration = Duration::from_secs(2);

/// How long the runner's last log lines may take to be written before it exits.
const RUNNER_LOG_FLUSH_TIMEOUT: Duration = Duration::from_secs(2);

/// Timings of a runner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunnerConfig {
    /// Between SIGTERM and SIGKILL when a step's group is ended.
    pub grace: Duration,
    /// Between two reads of the run's snapshot (control requests, pushed job statuses).
    pub poll_interval: Duration,
    /// Most time between two writes of the run's status.json while the runner lives
    /// ([`Store::heartbeat`]): a quiet step records nothing, and a host that judges a live
    /// runner by `lastUpdate`'s age must still see it move.
    pub heartbeat: Duration,
    /// A step that writes no output and reports no job status for this long is ended, failed
    /// with [`EXIT_TIMED_OUT`] and an error saying it was idle; `None`: never.
    pub idle_timeout: Option<Duration>,
}

/// The heartbeat's default period: pi-subagents fails a live run whose `lastUpdate` is 24 h
/// old, and a status.json write every 10 minutes costs nothing.
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(10 * 60);

/// The environment variable that sets [`RunnerConfig::heartbeat`] (`10m`, `30s`).
pub const HEARTBEAT_ENV: &str = "RUNJOURNAL_HEARTBEAT";

impl Default for RunnerConfig {
    fn default() -> RunnerConfig {
        RunnerConfig {
            grace: Duration::from_secs(3),
            poll_interval: Duration::from_millis(250),
            heartbeat: DEFAULT_HEARTBEAT,
            idle_timeout: None,
        }
    }
}

/// Why the runner could not do its job.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunnerError {
    #[error(transparent)]
    Open(#[from] OpenError),
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error(transparent)]
    Append(#[from] AppendError),
    #[error("run {run} is not in the journal")]
    UnknownRun { run: RunId },
    #[error("run {run} cannot be taken by a runner: {reason}")]
    NotRunnable { run: RunId, reason: String },
    #[error("{what}: {source}")]
    Io {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    /// Told to stop, while the journal had not answered a call for this long.
    #[error(
        "{signal} received while the journal had not answered for {waited_ms} ms; giving up on it"
    )]
    Stuck {
        signal: &'static str,
        waited_ms: u64,
    },
}

/// How a runner finished.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunnerOutcome {
    /// The runner recorded the run's `Terminal`.
    Ended {
        state: TerminalState,
        exit_code: i32,
    },
    /// Someone else recorded the run's `Terminal` first; the runner ended its steps and left.
    EndedElsewhere { state: RunStatus },
    /// The runner recorded its attempt's end, and the run is tried again from `retry_at_ms`
    /// by another runner (docs/design.md, "Retries").
    AttemptEnded { attempt: u32, retry_at_ms: UnixMs },
}

/// The environment variable of a test hook, in builds with the `testkit` feature: when it
/// names a file, the runner that finds it there removes it and SIGKILLs itself right after
/// its attempt's `AttemptEnded` is durable, before it starts the next attempt or the timer —
/// the kill point between an attempt's end and the next attempt's start.
pub const KILL_AFTER_ATTEMPT_ENV: &str = "RUNJOURNAL_TEST_KILL_AFTER_ATTEMPT";

/// The runner process's entry point, to be called first thing in a fresh process: closes
/// every descriptor above 2 it inherited (a runner holds nothing of its launcher's), sends its
/// log lines to the run's `runner.log` (best effort, see [`output`]), makes this process the
/// child subreaper of its steps' orphans (so that they can be reaped, a step's group verified
/// empty and what steps left behind found), opens `home` (holding its directory until the
/// process ends, see [`crate::durable_fs::HomeDir`]), and runs `run` to its end on a
/// fresh tokio runtime. At every point where no step runs, and at its end, it ends every
/// process left below this one: call it only in a process of its own (`runjournal __runner`).
/// Once the run's end is recorded (and its hooks delivered), `last_act` gets the runner's own
/// store, still open: what follows the run's end (its queue's next run) needs no store of its
/// own, whose open and close would each sync the journal again before the runner exits.
pub fn run_in_process(
    home: Home,
    run: RunId,
    config: RunnerConfig,
    last_act: impl FnOnce(&Store),
) -> Result<RunnerOutcome, RunnerError> {
    // First, before anything is closed: the launch handshake's pipe, the one descriptor above
    // 2 the launcher passes on purpose.
    let ready = ReadySignal::from_env().unwrap_or_else(|why| {
        log(&format!(
            "launch handshake: {why}; the launcher will find RunnerStarted by looking"
        ));
        None
    });
    // Nothing else is open yet but what the launcher passed: 0-2 are kept, the rest would keep
    // the launcher's pipes (`3>&1 | cat`) open for as long as the run lasts.
    if let Err(error) = close_inherited(ready.as_ref().map(ReadySignal::raw_fd)) {
        log(&format!(
            "cannot close the descriptors it inherited: {error}"
        ));
    }
    // The home's directory, held for the rest of this process, which is the runner's alone:
    // every file of the run — to its queue's next run, started as its last act — is written in
    // the home checked here, wherever its path leads later. A home that fails the check is
    // refused, with why, by the store's open below.
    if let Ok(held) = crate::durable_fs::HomeDir::open(home.root()) {
        std::mem::forget(held);
    }
    if let Err(error) = output::open_runner_log(home.runner_log_path(run)) {
        log(&format!(
            "cannot start writing runner.log ({error}); its lines go to stderr"
        ));
    }
    let outcome = run_with_runtime(home, run, config, ready, last_act);
    if let Err(error) = &outcome {
        log(&format!("the runner failed: {}", with_sources(error)));
    }
    output::flush_runner_log(RUNNER_LOG_FLUSH_TIMEOUT);
    outcome
}

/// Closes every descriptor above 2 this fresh process inherited, but `keep` (the handshake's
/// pipe). Like [`crate::platform::close_from`], only for the start of a process that owns none
/// of them yet.
fn close_inherited(keep: Option<std::os::fd::RawFd>) -> io::Result<()> {
    let Some(keep) = keep else {
        return crate::platform::close_from(3);
    };
    for fd in 3..keep {
        // SAFETY: closing a number that is not an open descriptor answers EBADF; nothing in
        // this process holds these yet (see `platform::close_from`).
        unsafe { nix::libc::close(fd) };
    }
    crate::platform::close_from(keep + 1)
}

fn run_with_runtime(
    home: Home,
    run: RunId,
    config: RunnerConfig,
    ready: Option<ReadySignal>,
    last_act: impl FnOnce(&Store),
) -> Result<RunnerOutcome, RunnerError> {
    if let Err(error) = crate::platform::become_child_subreaper() {
        log(&format!(
            "cannot become a child subreaper ({error}); orphans of steps go to init"
        ));
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| RunnerError::Io {
            what: "starting the runtime",
            source,
        })?;
    let mut options = StoreOptions::from_env().map_err(|reason| RunnerError::Io {
        what: "reading the store's settings from the environment",
        source: io::Error::new(io::ErrorKind::InvalidInput, reason),
    })?;
    // The runner's stderr is runner.log: a full disk shows there, and a wait for the
    // journal's write lock with how long the runner waits for it.
    let lock_bound = options.lock_wait.give_up_after;
    options.listener = Some(Arc::new(move |event: &CapacityEvent| {
        log(&describe_capacity(event, lock_bound))
    }));
    let store = Arc::new(Store::open_with(home, options)?);
    let outcome = runtime.block_on(run_steps(Arc::clone(&store), run, config, ready));
    if outcome.is_ok() {
        deliver_hooks(&store, run);
        last_act(&store);
    }
    // A journal call that never answered (the runner gave up on it after a stop signal) holds
    // a blocking thread: the runtime does not wait for it, and the process ends without it.
    runtime.shutdown_timeout(RUNTIME_SHUTDOWN_TIMEOUT);
    outcome
}

/// How long the runtime waits, once the run is done, for its blocking threads.
const RUNTIME_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(2);

/// An error and its sources, as one line: a damaged journal's error says what redb met.
fn with_sources(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        // Many errors already show their source in their own words.
        let said = cause.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        source = cause.source();
    }
    text
}

impl RunnerError {
    /// Whether the runner stopped because the journal is damaged, lost or of an unknown
    /// format ([`crate::journal::is_damage`]).
    pub fn is_damage(&self) -> bool {
        match self {
            RunnerError::Open(error) => error.is_damage(),
            RunnerError::Read(error) => error.is_damage(),
            RunnerError::Append(error) => error.is_damage(),
            _ => false,
        }
    }
}

/// The run's end is durable: its completion hooks run now, before the runner exits
/// ([`crate::hooks`]); what this runner cannot finish (a retry due later, a failure of the
/// journal) is left to a deliverer a reconcile pass starts.
fn deliver_hooks(store: &Store, run: RunId) {
    let by = format!("runner of {run}");
    let mut options =
        match crate::hooks::DeliveryOptions::from_env(by, crate::hooks::RUNNER_MAX_WAIT) {
            Ok(options) => options,
            Err(reason) => {
                log(&format!("not delivering the run's hooks: {reason}"));
                return;
            }
        };
    // Its steps are ended and swept: what is below the runner from now on is its hooks'.
    options.ends_descendants = true;
    match crate::hooks::deliver_run(store, run, &options) {
        Ok(delivery) => {
            for attempted in &delivery.attempts {
                let left_behind = attempted
                    .left_behind
                    .as_ref()
                    .map_or(String::new(), |text| format!("; {text}"));
                log(&format!(
                    "hook {} attempt {}: {}{left_behind}",
                    attempted.hook,
                    attempted.attempt,
                    crate::exit::describe_hook_outcome(&attempted.outcome)
                ));
            }
            if !delivery.attempts.is_empty() {
                store.flush_projections(PROJECTION_FLUSH_TIMEOUT);
            }
        }
        Err(error) => log(&format!(
            "delivering the run's hooks: {error}; a reconcile pass delivers them"
        )),
    }
}

/// A runner.log line for a capacity event; `lock_bound` is how long the runner waits for the
/// journal's write lock.
fn describe_capacity(event: &CapacityEvent, lock_bound: Option<Duration>) -> String {
    match event {
        CapacityEvent::Blocked {
            since_ms,
            error,
            cause: cause @ crate::capacity::BlockCause::WriteLock,
        } => format!(
            "journal blocked on {} since {since_ms} (Unix ms): {error}; steps keep running, transitions wait{}",
            cause.describe(),
            match lock_bound {
                Some(bound) => format!(
                    " for at most {} (the I/O retry window): then the runner ends its steps and exits, and the reconciler fails the run",
                    crate::duration::format_duration(bound)
                ),
                None => String::new(),
            }
        ),
        CapacityEvent::Blocked {
            since_ms,
            error,
            cause,
        } => format!(
            "journal blocked on {} since {since_ms} (Unix ms): {error}; steps keep running, transitions wait",
            cause.describe()
        ),
        CapacityEvent::GaveUp { blocked_ms, error } => format!(
            "journal storage kept failing for {blocked_ms} ms, the whole retry window: {error}; giving up"
        ),
        CapacityEvent::ReserveReleased { bytes } => {
            format!("released the {bytes}-byte space reserve to make room")
        }
        CapacityEvent::Unblocked { blocked_ms } => {
            format!("journal writes resumed after {blocked_ms} ms blocked")
        }
        CapacityEvent::ReserveRestored { bytes } => {
            format!("the {bytes}-byte space reserve is back")
        }
    }
}

/// Runs `run`: takes it (telling the launcher through `ready` once `RunnerStarted` is
/// durable), executes its steps, records its end. Not public: it ends every descendant of this
/// process that outlives the steps (the sweep), which only a process of its own, the runner,
/// may do — a host starts a runner (`launch`), never runs one inside it.
async fn run_steps(
    store: Arc<Store>,
    run: RunId,
    config: RunnerConfig,
    ready: Option<ReadySignal>,
) -> Result<RunnerOutcome, RunnerError> {
    let signal_error = |source| RunnerError::Io {
        what: "installing signal handlers",
        source,
    };
    // Installed before RunnerStarted: a stop signalled as soon as the runner is on record must
    // not kill it before it can act on the stop.
    let sigterm = signal(SignalKind::terminate()).map_err(signal_error)?;
    let sigint = signal(SignalKind::interrupt()).map_err(signal_error)?;
    // pi-subagents' interrupt signal: its hosts send it to the runner's pid to pause a run.
    let mut sigusr2 = signal(SignalKind::user_defined2()).map_err(signal_error)?;
    let mut signalled = watch_signals(sigterm, sigint);
    let recorder = Arc::new(Recorder::new(Arc::clone(&store), run));
    // Signalled as soon as RunnerStarted is durable, before its projection; on failure `ready`
    // is dropped, closing the pipe: the launcher looks at once either way.
    let state = tokio::select! {
        taken = take_run(&recorder, ready) => taken?,
        stuck = journal_stuck_after_signal(&recorder, signalled.clone()) => return Err(stuck),
    };
    log(&format!(
        "run {run} taken by runner pid {}",
        std::process::id()
    ));
    let grace = config.grace;
    // The launcher's environment, whoever started this runner: every step starts in it.
    let environment = {
        let store = Arc::clone(&store);
        let cwd = state.spec.cwd.clone();
        tokio::task::spawn_blocking(move || store.start_environment(run, cwd.as_deref()))
            .await
            .map_err(|error| RunnerError::Io {
                what: "reading the run's environment",
                source: io::Error::other(error.to_string()),
            })??
    };
    let heartbeat = tokio::spawn(beat(Arc::clone(&store), run, config.heartbeat));
    // A host's requests wake the loop; its poll takes them too where no watch can be made.
    let wake = Arc::new(Notify::new());
    let _inbox_watch = control_inbox::watch(store.home(), run, Arc::clone(&wake));
    let mut run_loop = RunLoop {
        recorder: Arc::clone(&recorder),
        home: store.home().clone(),
        environment,
        spec: Arc::clone(&state.spec),
        config,
        wake,
        inbox_settling: crate::control_inbox::Settling::default(),
        tasks: JoinSet::new(),
        running: BTreeMap::new(),
        spawned: BTreeSet::new(),
        next_step: 0,
        halt: None,
        lost: None,
        first_failure: None,
        last_finished: None,
        steps_complete: 0,
    };
    run_loop.observe(&state);
    let deadline = state
        .spec
        .timeout_ms
        .map(|timeout_ms| Instant::now() + Duration::from_millis(timeout_ms));
    // A journal that stops answering (a write lock held, storage retried for its window)
    // cannot keep a runner that was told to stop: past the bound it gives up as it does on a
    // journal that failed.
    let watching = signalled.clone();
    let outcome = tokio::select! {
        outcome = run_loop.run(deadline, &mut signalled, &mut sigusr2) => outcome,
        stuck = journal_stuck_after_signal(&recorder, watching) => Err(stuck),
    };
    heartbeat.abort();
    if let Err(error) = &outcome {
        run_loop.abandon(error).await;
    }
    // A loop that failed may still leave steps running (abandon ended those it followed):
    // dropping it stops following them, and the sweep below ends them with whatever else is
    // left, so the runner leaves nothing behind.
    let never_reap = std::mem::take(&mut run_loop.spawned);
    drop(run_loop);
    let swept = sweep_descendants(never_reap, grace).await;
    if !swept.is_empty() {
        log(&format!("at exit: {}", swept.describe()));
    }
    flush_projections(&store).await;
    outcome
}

/// How long a journal call may go unanswered after the runner was told to stop (SIGTERM,
/// SIGINT) before the runner gives up on the journal: ends its steps' groups and exits without
/// recording an outcome. A working journal answers in milliseconds, and a damaged one at once.
pub const JOURNAL_WAIT_AFTER_SIGNAL: Duration = Duration::from_secs(5);

/// A stop signal: which one arrived last, watched by the run loop and the journal's watchdog.
type Signalled = watch::Receiver<Option<&'static str>>;

/// Turns SIGTERM and SIGINT into a watched value, so that more than one waiter sees them.
fn watch_signals(mut sigterm: Signal, mut sigint: Signal) -> Signalled {
    let (sender, receiver) = watch::channel(None);
    tokio::spawn(async move {
        loop {
            let name = tokio::select! {
                _ = sigterm.recv() => "SIGTERM",
                _ = sigint.recv() => "SIGINT",
            };
            if sender.send(Some(name)).is_err() {
                return;
            }
        }
    });
    receiver
}

/// Resolves once a stop signal came and some journal call has then gone unanswered for
/// [`JOURNAL_WAIT_AFTER_SIGNAL`]: the error the runner gives up with. Never resolves
/// otherwise.
async fn journal_stuck_after_signal(recorder: &Recorder, mut signalled: Signalled) -> RunnerError {
    let name = loop {
        if let Some(name) = *signalled.borrow_and_update() {
            break name;
        }
        if signalled.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    let mut ticks = tokio::time::interval(Duration::from_millis(250));
    loop {
        ticks.tick().await;
        if let Some(waited) = recorder.waiting_for()
            && waited >= JOURNAL_WAIT_AFTER_SIGNAL
        {
            return RunnerError::Stuck {
                signal: name,
                waited_ms: u64::try_from(waited.as_millis()).unwrap_or(u64::MAX),
            };
        }
    }
}

/// The runner's heartbeat: every `period`, the run's status.json is written again with
/// `lastUpdate` now, until the run is terminal or the task is aborted. A failed write is
/// logged once per streak and tried again at the next beat: it is only a projection.
async fn beat(store: Arc<Store>, run: RunId, period: Duration) {
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    // The first tick is at once: RunnerStarted's projection has just been written.
    ticks.tick().await;
    let mut has_failed = false;
    loop {
        ticks.tick().await;
        let store = Arc::clone(&store);
        match tokio::task::spawn_blocking(move || store.heartbeat(run)).await {
            Ok(Ok(true)) => has_failed = false,
            Ok(Ok(false)) => return,
            Ok(Err(error)) => {
                if !has_failed {
                    log(&format!("heartbeat: cannot write status.json: {error}"));
                }
                has_failed = true;
            }
            Err(error) => std::panic::resume_unwind(error.into_panic()),
        }
    }
}

/// Runs the descendant [`sweep`] on a blocking thread; a sweep that could not look at the
/// processes is logged and counts as having found nothing.
async fn sweep_descendants(never_reap: BTreeSet<u32>, grace: Duration) -> Swept {
    let swept =
        tokio::task::spawn_blocking(move || sweep::sweep(std::process::id(), &never_reap, grace))
            .await;
    match swept {
        Ok(Ok(swept)) => swept,
        Ok(Err(error)) => {
            log(&format!(
                "cannot look for processes steps left behind: {error}"
            ));
            Swept::default()
        }
        Err(error) => {
            log(&format!(
                "looking for processes steps left behind failed: {error}"
            ));
            Swept::default()
        }
    }
}

/// Records `RunnerStarted`: the run must be queued, without a runner and without a recorded
/// process terminal (the launcher gives up on a run by recording one). Once it is durable,
/// `ready` tells the launcher.
async fn take_run(
    recorder: &Recorder,
    ready: Option<ReadySignal>,
) -> Result<RunState, RunnerError> {
    // Shared with the append's callback, which takes it only when the append lands.
    let ready = Arc::new(std::sync::Mutex::new(ready));
    let run = recorder.run();
    let runner = liveness::current().map_err(|source| RunnerError::Io {
        what: "reading the runner's own identity",
        source,
    })?;
    let instance_id = ulid::Ulid::generate().to_string();
    for _ in 0..MAX_HEAD_RETRIES {
        let state = recorder
            .snapshot()
            .await?
            .ok_or(RunnerError::UnknownRun { run })?;
        if state.status != RunStatus::Queued || state.process_terminal.is_some() {
            let observed = if state.process_terminal.is_some() {
                " and its process terminal was recorded (the launcher gave up on it)"
            } else {
                ""
            };
            return Err(RunnerError::NotRunnable {
                run,
                reason: format!("it is {}{observed}", state.status),
            });
        }
        let signal = Arc::clone(&ready);
        let appended = recorder
            .append_then(
                vec![Event::RunnerStarted {
                    runner: runner.clone(),
                    instance_id: instance_id.clone(),
                }],
                Condition::expect_head(state.head_seq),
                move |_| {
                    let ready = signal
                        .lock()
                        .unwrap_or_else(|poisoned| poisoned.into_inner())
                        .take();
                    if let Some(ready) = ready
                        && let Err(error) = ready.signal()
                    {
                        log(&format!(
                            "telling the launcher that the run is taken: {error}"
                        ));
                    }
                },
            )
            .await;
        match appended {
            Ok(appended) => return Ok(appended.state),
            // A control request landed first; look again.
            Err(AppendError::HeadMismatch { .. }) => continue,
            Err(AppendError::Transition { source, .. }) => {
                return Err(RunnerError::NotRunnable {
                    run,
                    reason: source.to_string(),
                });
            }
            Err(error) => return Err(error.into()),
        }
    }
    Err(RunnerError::NotRunnable {
        run,
        reason: format!("its head kept moving over {MAX_HEAD_RETRIES} attempts"),
    })
}

/// Why the runner asked a step to end.
#[derive(Debug, Clone, PartialEq)]
enum Ending {
    /// A control request ends the whole run.
    Control(ControlInfo),
    /// A host asked that this step alone end.
    StepStop(StepStopInfo),
    /// Someone pushed a terminal status of the step's external job.
    PushedJob(ExternalJobStatus),
    /// The step wrote no output and reported no job status for this long.
    Idle(Duration),
}

/// A step whose process is running.
#[derive(Debug)]
struct RunningStep {
    terminate: watch::Sender<step::Ending>,
    ending: Option<Ending>,
    output: StepOutput,
    /// Its inbox, unless it could not be made (the step then runs without steering).
    inbox: Option<steer::StepInbox>,
    /// When the step last showed it is alive: its start, its last output, or a change of its
    /// job status in the journal (`last_job`).
    active_at: Instant,
    last_job: Option<ExternalJobStatus>,
}

impl RunningStep {
    /// The step's last sign of activity.
    fn last_active(&self) -> Instant {
        match self.output.last_push() {
            Some(pushed) => self.active_at.max(Instant::from_std(pushed)),
            None => self.active_at,
        }
    }
}

/// How an attempt to start a step went.
enum Start {
    Started(std::process::Child, StepOutput, Option<steer::StepInbox>),
    /// A control request was recorded first: the step did not start and no other will.
    Halted(ControlInfo),
    /// A host asked that this step end before it started: it is skipped.
    StepStopped(StepStopInfo),
    /// The run ended elsewhere.
    Lost(RunStatus),
    /// `StepRunning` is recorded but the program could not be executed.
    ExecFailed {
        exit_code: i32,
        error: String,
    },
    /// Nothing could be started (output log, fork); nothing is recorded yet.
    Unstartable(String),
}

struct RunLoop {
    recorder: Arc<Recorder>,
    home: Home,
    /// How its steps start: the launcher's recorded environment, cwd and umask.
    environment: crate::run_env::StepEnvironment,
    spec: Arc<RunSpec>,
    config: RunnerConfig,
    /// Notified when the run's control inbox changes.
    wake: Arc<Notify>,
    /// The inbox's files not yet whole as its last look found them, for the next look.
    inbox_settling: crate::control_inbox::Settling,
    tasks: JoinSet<(usize, ProcessReport)>,
    running: BTreeMap<usize, RunningStep>,
    /// Every process this runner spawned for a step: their waiters reap them, a sweep never.
    spawned: BTreeSet<u32>,
    /// Steps start in index order in every mode.
    next_step: usize,
    halt: Option<ControlInfo>,
    lost: Option<RunStatus>,
    first_failure: Option<StepFailure>,
    last_finished: Option<usize>,
    steps_complete: usize,
}

impl RunLoop {
    /// At least 1: RunSpec::check refuses a parallel run of concurrency 0, and nothing reaches
    /// a runner unchecked; with 0 the loop would wait forever for a step it never starts.
    fn concurrency(&self) -> usize {
        match self.spec.mode {
            Mode::Parallel => (self.spec.concurrency as usize).max(1),
            Mode::Single | Mode::Chain => 1,
        }
    }

    fn may_start_more(&self) -> bool {
        let is_chain_broken = self.spec.mode != Mode::Parallel && self.first_failure.is_some();
        self.halt.is_none()
            && self.lost.is_none()
            && !is_chain_broken
            && self.next_step < self.spec.steps.len()
    }

    /// Runs the steps until the run ends. A stop signal (`signalled`) is a stop; SIGUSR2
    /// (`interrupts`), pi-subagents' interrupt signal, is an interrupt, as a host's request.
    async fn run(
        &mut self,
        deadline: Option<Instant>,
        signalled: &mut Signalled,
        interrupts: &mut Signal,
    ) -> Result<RunnerOutcome, RunnerError> {
        let mut poll = tokio::time::interval(self.config.poll_interval);
        poll.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut has_timed_out = false;
        let wake = Arc::clone(&self.wake);
        // What a host asked before the runner took the run is taken before any step starts.
        self.take_inbox().await?;
        self.poll().await?;
        loop {
            while self.may_start_more() && self.running.len() < self.concurrency() {
                let index = self.next_step;
                self.start(index).await?;
            }
            if self.running.is_empty() && !self.may_start_more() {
                break;
            }
            tokio::select! {
                joined = self.tasks.join_next(), if !self.tasks.is_empty() => {
                    let Some(joined) = joined else { continue };
                    let (index, report) = match joined {
                        Ok(done) => done,
                        Err(error) => std::panic::resume_unwind(error.into_panic()),
                    };
                    self.finish(index, report).await?;
                }
                _ = poll.tick() => {
                    self.take_inbox().await?;
                    self.poll().await?;
                }
                () = wake.notified() => {
                    self.take_inbox().await?;
                    self.poll().await?;
                }
                _ = sleep_until_or_never(deadline), if !has_timed_out && self.halt.is_none() => {
                    has_timed_out = true;
                    let timeout_ms = self.spec.timeout_ms.unwrap_or_default();
                    self.request(
                        ControlAction::Timeout,
                        "runner".to_string(),
                        format!("the run's timeout of {} was reached", crate::duration::format_duration_ms(timeout_ms)),
                    ).await?;
                }
                Ok(()) = signalled.changed() => {
                    let name = (*signalled.borrow_and_update()).unwrap_or("SIGTERM");
                    self.request(ControlAction::Stop, format!("signal {name}"), format!("the runner received {name}")).await?;
                }
                Some(()) = interrupts.recv() => {
                    self.request(
                        ControlAction::Interrupt,
                        "signal SIGUSR2".to_string(),
                        "the runner received SIGUSR2".to_string(),
                    ).await?;
                }
            }
        }
        if let Some(state) = self.lost {
            log(&format!(
                "run {} was ended elsewhere ({state}); its steps are ended",
                self.recorder.run()
            ));
            return Ok(RunnerOutcome::EndedElsewhere { state });
        }
        self.record_terminal().await
    }

    /// Starts step `index`, or learns why it must not start.
    async fn start(&mut self, index: usize) -> Result<(), RunnerError> {
        let step_number = u32::try_from(index).expect("RunSpec::check bounds the step count");
        self.next_step = index + 1;
        match self.start_gated(index, step_number).await? {
            Start::Started(child, output, inbox) => {
                let (terminate, terminate_rx) = watch::channel(step::Ending::Running);
                let grace = self.config.grace;
                if self.spec.steps[index].is_external_job() {
                    let log = output.sink();
                    let recorder = Arc::clone(&self.recorder);
                    self.tasks.spawn(async move {
                        let report = step::run_external_job(
                            child,
                            recorder,
                            step_number,
                            log,
                            terminate_rx,
                            grace,
                        )
                        .await;
                        (index, report)
                    });
                } else {
                    self.tasks.spawn(async move {
                        (index, step::run_process(child, terminate_rx, grace).await)
                    });
                }
                self.running.insert(
                    index,
                    RunningStep {
                        terminate,
                        ending: None,
                        output,
                        inbox,
                        active_at: Instant::now(),
                        last_job: None,
                    },
                );
            }
            Start::Halted(control) => self.halt_with(control),
            Start::StepStopped(stop) => {
                self.record_finished(
                    index,
                    StepOutcome {
                        end: StepEnd::Skipped,
                        exit_code: None,
                        error: Some(event::truncate_text(
                            &format!("stopped before it started by {}: {}", stop.by, stop.reason),
                            MAX_TEXT_BYTES,
                        )),
                    },
                    Vec::new(),
                )
                .await?;
            }
            Start::Lost(state) => self.lose(state),
            Start::ExecFailed { exit_code, error } => {
                self.record_finished(
                    index,
                    StepOutcome {
                        end: StepEnd::Failed,
                        exit_code: Some(exit_code),
                        error: Some(error),
                    },
                    Vec::new(),
                )
                .await?;
            }
            Start::Unstartable(error) => {
                let running = Event::StepRunning {
                    step: step_number,
                    process: None,
                };
                self.record_finished(
                    index,
                    StepOutcome {
                        end: StepEnd::Failed,
                        exit_code: None,
                        error: Some(error),
                    },
                    vec![running],
                )
                .await?;
            }
        }
        Ok(())
    }

    /// The gated start (see [`step_process`]): fork, record `StepRunning` conditionally on the
    /// head at which no control request was seen, then let the program run.
    async fn start_gated(&mut self, index: usize, step_number: u32) -> Result<Start, RunnerError> {
        let run = self.recorder.run();
        // The log itself is opened at the first write, and may fail then: only the pipe and
        // the threads that drain it must exist for the step to start.
        let mut output = match StepOutput::start(self.home.output_log_path(run, index)) {
            Ok(output) => output,
            Err(error) => {
                return Ok(Start::Unstartable(format!(
                    "cannot start the step's output writer: {error}"
                )));
            }
        };
        // The step's inbox, made before its process: it finds it in its environment.
        let mut inbox = match steer::StepInbox::make(&self.home, run, step_number) {
            Ok(inbox) => Some(inbox),
            Err(error) => {
                log(&format!(
                    "step {index}: cannot make its inbox ({error}); it runs without steering"
                ));
                None
            }
        };
        let command = match output.pipe().map(|pipe| {
            step::command(
                &self.home,
                run,
                index,
                &self.spec.steps[index],
                &self.environment,
                pipe,
            )
        }) {
            Ok(Ok(mut command)) => {
                if let Some(inbox) = &inbox {
                    command.env(steer::ENV_INBOX, inbox.dir());
                }
                command
            }
            Ok(Err(error)) | Err(error) => {
                return Ok(Start::Unstartable(format!(
                    "cannot make the step's output pipe: {error}"
                )));
            }
        };
        // From here, every return before `release` drops `gated`, which aborts the child: it
        // never runs its program.
        let gated = match step_process::spawn_gated(command).await {
            Ok(gated) => gated,
            Err(error) => {
                return Ok(Start::Unstartable(format!(
                    "cannot start the step's process: {error}"
                )));
            }
        };
        self.spawned.insert(gated.pid());
        let process = match liveness::identity_of(gated.pid()) {
            Ok(process) => process,
            Err(error) => {
                log(&format!(
                    "cannot read the identity of step {index}'s process {}: {error}",
                    gated.pid()
                ));
                None
            }
        };
        if let Some(not_started) = self
            .record_step_running(index, step_number, process.as_ref())
            .await?
        {
            if let Some(inbox) = inbox {
                inbox.close();
            }
            return Ok(not_started);
        }
        // The messages already waiting for the step are there when it starts.
        if let Some(inbox) = inbox.as_mut() {
            self.fill_inbox(inbox, None).await?;
        }
        match gated.release().await {
            Ok(child) => Ok(Start::Started(child, output, inbox)),
            Err(error) => {
                if let Some(inbox) = inbox {
                    inbox.close();
                }
                let exit_code = if error.kind() == io::ErrorKind::NotFound {
                    EXIT_NOT_FOUND
                } else {
                    EXIT_CANNOT_EXECUTE
                };
                Ok(Start::ExecFailed {
                    exit_code,
                    error: format!("cannot run the step's program: {error}"),
                })
            }
        }
    }

    /// Records `StepRunning` of the step with its forked, gated `process`, conditionally on the
    /// head at which no control request was seen; tried again when another append moved the
    /// head. `Ok(None)` once it is recorded; otherwise why the step must not start (the run
    /// ended, or a control request came first).
    async fn record_step_running(
        &mut self,
        index: usize,
        step_number: u32,
        process: Option<&event::ProcessIdentity>,
    ) -> Result<Option<Start>, RunnerError> {
        let run = self.recorder.run();
        let mut attempts = 0;
        // The last attempt's refusal, judged against the state read again.
        let mut refused: Option<AppendError> = None;
        loop {
            let state = match self.recorder.snapshot().await {
                Ok(Some(state)) => state,
                Ok(None) => return Err(RunnerError::UnknownRun { run }),
                Err(error) => return Err(error.into()),
            };
            if let Some(refusal) = refused.take() {
                // A refusal does not prove that nothing landed: an attempt whose answer was
                // lost (a commit leader that died between its commit and its answer) is
                // refused when tried again, by the head or the step it moved itself. The step
                // running with the very process just forked is that attempt's record.
                if is_start_recorded(&state, index, process) {
                    log(&format!(
                        "step {index}: its start is recorded (an earlier attempt landed unanswered; this one was answered: {refusal})"
                    ));
                    return Ok(None);
                }
                match refusal {
                    AppendError::HeadMismatch { .. } if attempts < MAX_HEAD_RETRIES => {
                        attempts += 1;
                    }
                    refusal => return Err(refusal.into()),
                }
            }
            if state.is_terminal() {
                return Ok(Some(Start::Lost(state.status)));
            }
            if let Some(control) = state.controls.first() {
                log(&format!(
                    "step {index} not started: {} requested by {}",
                    control.action.as_str(),
                    control.by
                ));
                return Ok(Some(Start::Halted(control.clone())));
            }
            if let Some(stop) = state.step_stop(step_number) {
                log(&format!(
                    "step {index} not started: its stop requested by {}",
                    stop.by
                ));
                return Ok(Some(Start::StepStopped(stop.clone())));
            }
            let appended = self
                .recorder
                .append(
                    vec![Event::StepRunning {
                        step: step_number,
                        process: process.cloned(),
                    }],
                    Condition::expect_head(state.head_seq),
                )
                .await;
            match appended {
                Ok(_) => return Ok(None),
                Err(
                    refusal @ (AppendError::HeadMismatch { .. }
                    | AppendError::Transition { .. }
                    | AppendError::WriterSeqReused { .. }),
                ) => refused = Some(refusal),
                Err(error) => return Err(error.into()),
            }
        }
    }

    /// Records how a step's process ended: once no other step runs, after ending what it left
    /// outside its group (named in its error), and after its output is written.
    async fn finish(&mut self, index: usize, report: ProcessReport) -> Result<(), RunnerError> {
        let running = self.running.remove(&index);
        // With other steps running, an orphan cannot be told to be this step's: the sweep
        // waits for the last of them (see `sweep`).
        let swept = if self.running.is_empty() {
            sweep_descendants(self.spawned.clone(), self.config.grace).await
        } else {
            Swept::default()
        };
        if !swept.is_empty() {
            log(&format!("step {index}: {}", swept.describe()));
        }
        // Its group is verified empty: nothing of the step can take a message any more.
        let mut inbox = None;
        let ending = match running {
            Some(mut running) => {
                inbox = running.inbox.take();
                let end = running.output.finish(OUTPUT_FINISH_TIMEOUT).await;
                if !end.is_complete {
                    log(&format!(
                        "step {index}: its output was not all written within {}; what comes later is still written",
                        crate::duration::format_duration(OUTPUT_FINISH_TIMEOUT)
                    ));
                }
                if end.lost_bytes > 0 {
                    log(&format!(
                        "step {index}: {} bytes of its output could not be written to its log",
                        end.lost_bytes
                    ));
                }
                running.ending
            }
            None => None,
        };
        let outcome = self.step_outcome(index, &report, ending, &swept);
        let delivered = inbox
            .as_mut()
            .map(steer::StepInbox::taken)
            .unwrap_or_default();
        let recorded = self.record_finished(index, outcome, delivered).await;
        if let Some(inbox) = inbox {
            inbox.close();
        }
        recorded
    }

    /// Appends `before` (if any) and the step's `StepFinished`, and updates the loop's view.
    async fn record_finished(
        &mut self,
        index: usize,
        outcome: StepOutcome,
        mut before: Vec<Event>,
    ) -> Result<(), RunnerError> {
        let step = u32::try_from(index).expect("RunSpec::check bounds the step count");
        before.push(Event::StepFinished {
            step,
            outcome: outcome.clone(),
        });
        match self
            .recorder
            .append(before, Condition::expect_not_terminal())
            .await
        {
            Ok(_) => {}
            Err(AppendError::AlreadyTerminal { state, .. }) => {
                self.lose(state);
                return Ok(());
            }
            Err(error) => return Err(error.into()),
        }
        self.last_finished = Some(index);
        match outcome.end {
            StepEnd::Complete => self.steps_complete += 1,
            StepEnd::Failed if self.first_failure.is_none() => {
                self.first_failure = Some(StepFailure {
                    step: index,
                    exit_code: outcome.exit_code,
                    error: outcome.error.unwrap_or_else(|| "failed".to_string()),
                });
            }
            // Without a control request, a step ends stopped or skipped only by a host's stop
            // of that step: the run did not do all it was asked, as after a failure.
            StepEnd::Stopped | StepEnd::Skipped
                if self.first_failure.is_none() && self.halt.is_none() =>
            {
                self.first_failure = Some(StepFailure {
                    step: index,
                    exit_code: None,
                    error: outcome.error.unwrap_or_else(|| "stopped".to_string()),
                });
            }
            _ => {}
        }
        Ok(())
    }

    /// Turns a process report (and what the sweep after it ended) into the step's outcome.
    fn step_outcome(
        &self,
        index: usize,
        report: &ProcessReport,
        ending: Option<Ending>,
        swept: &Swept,
    ) -> StepOutcome {
        // A step's exit code is its own: none when the runner ended its process.
        let exit_code = match &report.status {
            Some(Ok(status)) if !report.was_leader_signalled => step::exit_code_of(*status),
            _ => None,
        };
        let survivors = match report.ended {
            Some(ended) if ended.has_survivors => survivors_note(),
            _ => String::new(),
        };
        let job_end = match (&ending, &report.job) {
            (Some(Ending::PushedJob(status)), _) => Some(JobEnd::Reported(status.clone())),
            (Some(Ending::Control(_) | Ending::StepStop(_) | Ending::Idle(_)), _) => None,
            (None, job) => job.clone(),
        };
        let exit_code = match &ending {
            Some(Ending::Idle(_)) => Some(EXIT_TIMED_OUT),
            _ => exit_code,
        };
        let (end, error) = if let Some(Ending::Idle(idle)) = &ending {
            (
                StepEnd::Failed,
                format!(
                    "timed out: idle for {} (no output and no job status)",
                    crate::duration::format_duration(*idle)
                ),
            )
        } else if let Some(Ending::Control(control)) = &ending {
            match control.action {
                ControlAction::Timeout => (StepEnd::Failed, halt_error(control)),
                ControlAction::Stop | ControlAction::Interrupt => {
                    (StepEnd::Stopped, halt_error(control))
                }
            }
        } else if let Some(Ending::StepStop(stop)) = &ending {
            (
                StepEnd::Stopped,
                format!("stopped by {}: {}", stop.by, stop.reason),
            )
        } else if let Some(error) = &report.append_error {
            (StepEnd::Failed, error.clone())
        } else if let Some(job_end) = job_end {
            match job_end {
                JobEnd::Reported(status) if status.state == JobState::Succeeded => {
                    (StepEnd::Complete, String::new())
                }
                JobEnd::Reported(status) => {
                    let message = status
                        .message
                        .map(|message| format!(": {message}"))
                        .unwrap_or_default();
                    (
                        StepEnd::Failed,
                        format!("external job {}{message}", status.state.as_str()),
                    )
                }
                JobEnd::ProviderError(error) => (StepEnd::Failed, error),
                JobEnd::NoTerminalStatus { last_line } => {
                    let exit = match &report.status {
                        Some(Ok(status)) => describe_exit((*status).into()),
                        Some(Err(error)) => error.clone(),
                        None => "ended".to_string(),
                    };
                    let last = last_line
                        .map(|line| format!("; its last line: {line}"))
                        .unwrap_or_else(|| "; it printed no status".to_string());
                    (
                        StepEnd::Failed,
                        format!("the provider {exit} without a terminal job status{last}"),
                    )
                }
            }
        } else {
            match &report.status {
                Some(Ok(status)) if status.success() => (StepEnd::Complete, String::new()),
                Some(Ok(status)) => (StepEnd::Failed, describe_exit((*status).into())),
                Some(Err(error)) => (StepEnd::Failed, error.clone()),
                None => (
                    StepEnd::Failed,
                    format!("step {index}'s process could not be waited for"),
                ),
            }
        };
        let left_behind = swept.describe();
        let error = match (format!("{error}{survivors}"), left_behind.is_empty()) {
            (error, true) => error,
            (error, false) if error.is_empty() => left_behind,
            (error, false) => format!("{error}; {left_behind}"),
        };
        let error = (!error.is_empty()).then(|| event::truncate_text(&error, MAX_TEXT_BYTES));
        // A step whose group, or what it left, outlived SIGKILL did not complete cleanly.
        let has_survivors = !survivors.is_empty() || !swept.survivors.is_empty();
        let end = if end == StepEnd::Complete && has_survivors {
            StepEnd::Failed
        } else {
            end
        };
        StepOutcome {
            end,
            exit_code,
            error,
        }
    }

    /// Reads the run and acts on what changed: control requests, pushed job statuses, an end
    /// recorded elsewhere.
    async fn poll(&mut self) -> Result<(), RunnerError> {
        let run = self.recorder.run();
        let state = self
            .recorder
            .snapshot()
            .await?
            .ok_or(RunnerError::UnknownRun { run })?;
        self.observe(&state);
        self.tend_inboxes(&state).await
    }

    /// Takes the run's control inbox ([`crate::control_inbox::take`]) on a blocking thread:
    /// each request journaled, then its file removed (or refused and moved aside).
    async fn take_inbox(&mut self) -> Result<(), RunnerError> {
        let recorder = Arc::clone(&self.recorder);
        let home = self.home.clone();
        let mut settling = std::mem::take(&mut self.inbox_settling);
        let taken = tokio::task::spawn_blocking(move || {
            let run = recorder.run();
            let store = Arc::clone(recorder.store());
            let taken = crate::control_inbox::take(
                &home,
                run,
                &mut settling,
                || store.journal().read_retrying(|view| view.snapshot(run)),
                |events, condition| recorder.append_blocking(events, condition),
            );
            (taken, settling)
        })
        .await;
        let taken = match taken {
            Ok((taken, settling)) => {
                self.inbox_settling = settling;
                taken
            }
            Err(error) => std::panic::resume_unwind(error.into_panic()),
        };
        match taken {
            Ok(taken) => {
                if taken.has_recorded() {
                    log(&format!(
                        "control inbox: {} request(s) taken, {} file(s) refused",
                        taken.recorded, taken.refused
                    ));
                }
                for unsettled in taken.unsettled {
                    log(&format!("control inbox: {unsettled}"));
                }
                Ok(())
            }
            Err(crate::control_inbox::TakeError::Append(error)) => Err(error.into()),
            Err(crate::control_inbox::TakeError::Read(error)) => Err(error.into()),
            Err(crate::control_inbox::TakeError::UnknownRun { run }) => {
                Err(RunnerError::UnknownRun { run })
            }
        }
    }

    /// Writes the messages waiting for each running step into its inbox, and journals the
    /// delivery of those a step took.
    async fn tend_inboxes(&mut self, state: &RunState) -> Result<(), RunnerError> {
        let indexes: Vec<usize> = self.running.keys().copied().collect();
        for index in indexes {
            let Some(mut inbox) = self
                .running
                .get_mut(&index)
                .and_then(|running| running.inbox.take())
            else {
                continue;
            };
            let filled = self.fill_inbox(&mut inbox, Some(state)).await;
            let delivered = inbox.taken();
            if let Some(running) = self.running.get_mut(&index) {
                running.inbox = Some(inbox);
            }
            filled?;
            if delivered.is_empty() {
                continue;
            }
            match self
                .recorder
                .append(delivered, Condition::expect_not_terminal())
                .await
            {
                Ok(_) => {}
                Err(AppendError::AlreadyTerminal { state, .. }) => self.lose(state),
                // The step ended meanwhile: its end settled them.
                Err(AppendError::Transition { source, .. }) => {
                    log(&format!("step {index}: a delivery not recorded: {source}"));
                }
                Err(error) => return Err(error.into()),
            }
        }
        Ok(())
    }

    /// Writes into `inbox` the messages waiting for its step that are not there yet, as
    /// `state` (read now when `None`) has them. A message that cannot be written waits for the
    /// next look.
    async fn fill_inbox(
        &self,
        inbox: &mut steer::StepInbox,
        state: Option<&RunState>,
    ) -> Result<(), RunnerError> {
        let run = self.recorder.run();
        let read;
        let state = match state {
            Some(state) => state,
            None => {
                read = self
                    .recorder
                    .snapshot()
                    .await?
                    .ok_or(RunnerError::UnknownRun { run })?;
                &read
            }
        };
        for (id, seq) in inbox.unwritten(state) {
            let Some(record) = self.recorder.record(seq).await? else {
                continue;
            };
            if let Err(error) = inbox.write(&record) {
                log(&format!(
                    "steer request {id}: cannot write it into the step's inbox yet: {error}"
                ));
            }
        }
        Ok(())
    }

    fn observe(&mut self, state: &RunState) {
        if state.is_terminal() {
            self.lose(state.status);
            return;
        }
        if self.halt.is_none()
            && let Some(control) = state.controls.first()
        {
            self.halt_with(control.clone());
            return;
        }
        for (index, running) in &mut self.running {
            let stop = u32::try_from(*index)
                .ok()
                .and_then(|step| state.step_stop(step));
            if let (None, Some(stop)) = (&running.ending, stop) {
                log(&format!(
                    "step {index}: stop requested by {}: {}; ending it",
                    stop.by, stop.reason
                ));
                running.ending = Some(Ending::StepStop(stop.clone()));
                running.terminate.send_replace(step::Ending::Terminate);
                continue;
            }
            let job = state.steps[*index].job.as_ref();
            if job != running.last_job.as_ref() {
                running.last_job = job.cloned();
                running.active_at = Instant::now();
            }
            if let (None, Some(idle)) = (&running.ending, self.config.idle_timeout)
                && running.last_active().elapsed() >= idle
            {
                log(&format!(
                    "step {index}: idle for {}: no output and no job status; ending it",
                    crate::duration::format_duration(idle)
                ));
                running.ending = Some(Ending::Idle(idle));
                running.terminate.send_replace(step::Ending::Terminate);
                continue;
            }
            let pushed = job.filter(|job| job.state.is_terminal());
            if let (None, Some(job)) = (&running.ending, pushed) {
                log(&format!(
                    "step {index}: external job {} (pushed); ending its provider",
                    job.state.as_str()
                ));
                running.ending = Some(Ending::PushedJob(job.clone()));
                running.terminate.send_replace(step::Ending::Terminate);
            }
        }
    }

    /// Records a control request (one already recorded is fine), then acts on the first one.
    async fn request(
        &mut self,
        action: ControlAction,
        by: String,
        reason: String,
    ) -> Result<(), RunnerError> {
        let appended = self
            .recorder
            .append(
                vec![Event::ControlRequested { action, by, reason }],
                Condition::expect_not_terminal(),
            )
            .await;
        match appended {
            Ok(_)
            | Err(AppendError::Transition {
                source: TransitionError::ControlAlreadyRequested { .. },
                ..
            }) => {}
            Err(AppendError::AlreadyTerminal { state, .. }) => {
                self.lose(state);
                return Ok(());
            }
            Err(error) => return Err(error.into()),
        }
        self.poll().await
    }

    /// Stops starting steps and asks every running one to end.
    fn halt_with(&mut self, control: ControlInfo) {
        log(&format!(
            "{} requested by {}: {}; ending {} running step(s)",
            control.action.as_str(),
            control.by,
            control.reason,
            self.running.len()
        ));
        // An interrupt is SIGINT first (the step may end itself cleanly), then as a stop.
        let how = if control.action == ControlAction::Interrupt {
            step::Ending::Interrupt
        } else {
            step::Ending::Terminate
        };
        for running in self.running.values_mut() {
            if running.ending.is_none() {
                running.ending = Some(Ending::Control(control.clone()));
                running.terminate.send_replace(how);
            } else {
                running.terminate.send_replace(step::Ending::Terminate);
            }
        }
        self.halt = Some(control);
    }

    /// The run was ended by another writer: end every step, record nothing more.
    fn lose(&mut self, state: RunStatus) {
        if self.lost.is_none() {
            for running in self.running.values_mut() {
                running.terminate.send_replace(step::Ending::Terminate);
            }
        }
        self.lost = Some(state);
    }

    /// The runner cannot go on: the journal cannot record its transitions (storage errors
    /// outlasted the retry window), or something else failed. It ends every running step's
    /// group, so that nothing it started runs on unrecorded, and says why in its log; it then
    /// exits without an outcome, and the reconciler fails the run, naming this runner, once
    /// the journal can record it.
    async fn abandon(&mut self, error: &RunnerError) {
        log(&format!(
            "cannot go on: {}; ending {} running step(s) and exiting without recording an outcome (the reconciler fails the run once the journal can record it)",
            with_sources(error),
            self.running.len()
        ));
        for running in self.running.values_mut() {
            running.terminate.send_replace(step::Ending::Terminate);
        }
        // Each task ends its step's group (SIGTERM, grace, SIGKILL) before it returns.
        while let Some(joined) = self.tasks.join_next().await {
            if let Err(error) = joined
                && error.is_panic()
            {
                std::panic::resume_unwind(error.into_panic());
            }
        }
        self.running.clear();
    }

    /// Records the run's `Terminal`, as the outcome table ([`outcome::TABLE`]) decides it.
    async fn record_terminal(&mut self) -> Result<RunnerOutcome, RunnerError> {
        let (_, end) = outcome::run_end(
            &self.spec,
            self.halt.as_ref(),
            self.first_failure.as_ref(),
            self.steps_complete,
        );
        let outcome::RunEnd {
            state,
            error,
            exit_code,
        } = end;
        let summary = self.summary();
        if let Some(outcome) = self
            .try_again(state, error.as_ref(), &summary, exit_code)
            .await?
        {
            return Ok(outcome);
        }
        let appended = self
            .recorder
            .append(
                vec![Event::Terminal {
                    state,
                    error,
                    summary,
                    exit_code,
                    repaired_by: None,
                }],
                Condition::expect_not_terminal(),
            )
            .await;
        match appended {
            Ok(_) => {
                log(&format!(
                    "run {} {} (exit code {exit_code})",
                    self.recorder.run(),
                    state.as_str()
                ));
                Ok(RunnerOutcome::Ended { state, exit_code })
            }
            Err(AppendError::AlreadyTerminal { state, .. }) => {
                Ok(RunnerOutcome::EndedElsewhere { state })
            }
            Err(error) => Err(error.into()),
        }
    }

    /// Ends the attempt instead of the run when the run's retry policy tries this failure
    /// again (docs/design.md, "Retries"): a failed exit or a timeout. `None`: the run ends as
    /// `state` says — it did not fail so, no retry is left, or the journal refused the attempt's
    /// end (a stop came first).
    async fn try_again(
        &mut self,
        state: TerminalState,
        error: Option<&String>,
        summary: &str,
        exit_code: i32,
    ) -> Result<Option<RunnerOutcome>, RunnerError> {
        if state != TerminalState::Failed {
            return Ok(None);
        }
        let cause = match self.halt.as_ref().map(|halt| halt.action) {
            None => AttemptCause::Exit,
            Some(ControlAction::Timeout) => AttemptCause::Timeout,
            Some(ControlAction::Stop | ControlAction::Interrupt) => return Ok(None),
        };
        let Some(current) = self.recorder.snapshot().await? else {
            return Ok(None);
        };
        let failure = AttemptFailure {
            cause,
            error: error.cloned(),
            summary: summary.to_string(),
            exit_code,
        };
        let Some(event) = current.retry_event(failure, event::now_ms(), rand::random()) else {
            return Ok(None);
        };
        let Event::AttemptEnded {
            attempt,
            retry_at_ms,
            ..
        } = &event
        else {
            return Ok(None);
        };
        let (attempt, retry_at_ms) = (*attempt, *retry_at_ms);
        match self
            .recorder
            .append(vec![event], Condition::expect_head(current.head_seq))
            .await
        {
            Ok(_) => {
                crate::liveness::die_here_if_asked(KILL_AFTER_ATTEMPT_ENV);
                log(&format!(
                    "run {} attempt {attempt} failed ({}, exit code {exit_code}); tried again at {retry_at_ms}",
                    self.recorder.run(),
                    cause.as_str()
                ));
                Ok(Some(RunnerOutcome::AttemptEnded {
                    attempt,
                    retry_at_ms,
                }))
            }
            Err(AppendError::AlreadyTerminal { state, .. }) => {
                Ok(Some(RunnerOutcome::EndedElsewhere { state }))
            }
            // Something was recorded meanwhile (a stop, a job's update): the run's end decides.
            Err(AppendError::HeadMismatch { .. } | AppendError::Transition { .. }) => Ok(None),
            Err(error) => Err(error.into()),
        }
    }

    /// The last lines of the last finished step's output, or a count of complete steps.
    fn summary(&self) -> String {
        let tail = self
            .last_finished
            .and_then(|index| {
                // The summary is a convenience: an unreadable log leaves the count of steps.
                logs::tail(
                    &self.home.output_log_path(self.recorder.run(), index),
                    SUMMARY_TAIL,
                )
                .ok()
            })
            .unwrap_or_default();
        outcome::summary(tail, self.steps_complete, self.spec.steps.len())
    }
}

async fn sleep_until_or_never(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// Retries failed projections for a bounded time, so the files hosts read are current when
/// the runner exits. The journal has everything either way, and the reconciler rebuilds what
/// is still missing.
async fn flush_projections(store: &Arc<Store>) {
    let store = Arc::clone(store);
    let left =
        tokio::task::spawn_blocking(move || store.flush_projections(PROJECTION_FLUSH_TIMEOUT))
            .await
            .unwrap_or_default();
    if left > 0 {
        log(&format!(
            "{left} projection(s) still failing at exit; the reconciler will rebuild them"
        ));
    }
}

/// Whether `state` shows step `index` running with `process`, the identity this runner tried
/// to record in its `StepRunning`: then that append landed, whatever it was answered. The pid,
/// start time and boot name one process; the PID namespace is left out, being the runner's own
/// (the pid was read in it). Without an identity nothing tells this runner's record apart.
fn is_start_recorded(
    state: &RunState,
    index: usize,
    process: Option<&event::ProcessIdentity>,
) -> bool {
    let (Some(process), Some(step)) = (process, state.steps.get(index)) else {
        return false;
    };
    step.status == StepStatus::Running
        && step.process.as_ref().is_some_and(|recorded| {
            recorded.pid == process.pid
                && recorded.start_time == process.start_time
                && recorded.boot_id == process.boot_id
        })
}

/// A line in the runner's own log (`runs/<id>/runner.log`), written at best ([`output`]).
fn log(message: &str) {
    output::runner_log_line(&format!(
        "{} runner[{}]: {message}",
        event::now_ms(),
        std::process::id()
    ));
}

/// What a step's error adds when members of its process group outlived SIGKILL.
fn survivors_note() -> String {
    format!(
        " ({} {} after SIGKILL)",
        crate::exit::SURVIVORS_NOTE,
        crate::duration::format_duration_ms(
            u64::try_from(step_process::KILL_VERIFY_TIMEOUT.as_millis()).unwrap_or(u64::MAX)
        )
    )
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::event::{FORMAT_VERSION, HostIds, ProcessIdentity, Record, WriterId};
    use crate::testkit::{self as kit, namespaced_identity as identity, step_running};

    /// A running chain of two steps after `events`.
    fn state_after(events: Vec<Event>) -> RunState {
        let spec = kit::spec(Mode::Chain, kit::numbered(2, &kit::argv(&["true"])));
        let mut all = vec![
            kit::created(spec, 1_700_000_000_000, HostIds::default()),
            kit::runner_started(identity(1), "instance"),
        ];
        all.extend(events);
        let mut state: Option<RunState> = None;
        for (index, event) in all.into_iter().enumerate() {
            let seq = index as u64 + 1;
            let record = Record {
                format_version: FORMAT_VERSION,
                run_id: RunId::from_bytes([3; 16]),
                seq,
                time_ms: 1_700_000_000_000 + seq,
                writer: WriterId(9),
                writer_seq: seq,
                event,
            };
            state = Some(crate::state::apply(state.as_ref(), &record).expect("a legal event"));
        }
        state.expect("a run")
    }

    /// A refused `StepRunning` whose record is there, with the process just forked, landed
    /// (its answer was lost); anything else leaves the refusal standing.
    #[test]
    fn a_start_counts_as_recorded_only_with_the_very_process_running() {
        let ours = identity(4242);
        let recorded = state_after(vec![step_running(0, Some(ours.clone()))]);
        assert!(is_start_recorded(&recorded, 0, Some(&ours)));
        let without_namespace = ProcessIdentity {
            pid_namespace: None,
            ..ours.clone()
        };
        assert!(
            is_start_recorded(&recorded, 0, Some(&without_namespace)),
            "the namespace is the runner's own: pid, start time and boot decide"
        );
        for other in [
            ProcessIdentity {
                pid: 4243,
                ..ours.clone()
            },
            ProcessIdentity {
                start_time: 78,
                ..ours.clone()
            },
            ProcessIdentity {
                boot_id: "another boot".to_string(),
                ..ours.clone()
            },
        ] {
            assert!(
                !is_start_recorded(&recorded, 0, Some(&other)),
                "another process: {other:?}"
            );
        }
        assert!(
            !is_start_recorded(&recorded, 0, None),
            "without an identity nothing tells the record apart"
        );
        assert!(
            !is_start_recorded(&recorded, 1, Some(&ours)),
            "another step"
        );
        assert!(
            !is_start_recorded(&recorded, 7, Some(&ours)),
            "no such step"
        );
        let without_process = state_after(vec![step_running(0, None)]);
        assert!(!is_start_recorded(&without_process, 0, Some(&ours)));
        let pending = state_after(Vec::new());
        assert!(!is_start_recorded(&pending, 0, Some(&ours)));
        let finished = state_after(vec![
            step_running(0, Some(ours.clone())),
            kit::step_complete(0),
        ]);
        assert!(
            !is_start_recorded(&finished, 0, Some(&ours)),
            "a step no longer running is not one to start"
        );
    }
}
