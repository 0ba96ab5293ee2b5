//! Launching a run and following it: create the run, start its runner detached, and wait until
//! the journal shows the runner took it (the journal is the handshake, docs/design.md, "Runner and launch");
//! then, if asked, follow it to its end and record the runner's exit, or wait for any run to
//! end.
//!
//! Invariants:
//! * the launcher gives up on a run only through a conditional append that no `RunnerStarted`
//!   preceded (`Terminal` failed + `ProcessTerminalObserved` not-started); once that is durable,
//!   the reducer refuses any later `RunnerStarted`, so a late runner cannot take the run, and
//!   only then is the runner killed;
//! * the runner is started in its own session with stdin from /dev/null and stdout and stderr
//!   appended to `runs/<id>/runner.log` (or /dev/null when that cannot be made: a full disk
//!   does not keep a run from starting; the runner writes its log itself once it can), so it
//!   outlives the launcher and its terminal;
//! * the runner gets no descriptor of the launcher's but those three: every other one is
//!   close-on-exec in the runner's process before it execs;
//! * a launcher that reaps its runner ([`follow_launched`]) records how it exited, as its
//!   parent: a host embedding the library owes the journal what the CLI does;
//! * waiting never decides anything: the launcher sleeps on the handshake's pipe
//!   ([`runner::ready`]) and a follower on a watch of the run's directory
//!   ([`crate::platform::DirWatch`]), each for a bounded time, and what they then read in the
//!   journal decides. A wake-up that never comes costs a bounded delay, never a wrong answer.

use std::ffi::OsString;
use std::io;
use std::ops::ControlFlow;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::durable_fs;
use crate::duration::format_duration;
use crate::event::{
    self, Event, HostIds, Mode, Observer, ProcessExit, Proof, Record, Repairer, RunId, RunSpec,
    TerminalState, truncate_text,
};
use crate::exit::describe_exit;
use crate::home::{Home, Layout};
use crate::journal::{AppendError, Condition, QueueRefusal, ReadError, ResumeRefusal};
use crate::liveness::{self, Liveness};
use crate::platform;
use crate::reconcile::{self, ReconcileError};
use crate::run_env::{EnvError, HookCommandError, RunEnvironment, RunPrivate, check_hook_commands};
use crate::runner;
use crate::spec::RunRequest;
use crate::state::{RunState, RunStatus, StepStatus, TransitionError};
use crate::store::{ReadHome, Store};

pub mod after;
pub mod delay;
pub mod queue;
pub mod startable;
pub mod watch;

/// How long a launcher that followed its run waits for the runner process to exit once the
/// run is terminal, before it leaves it be.
pub const RUNNER_EXIT_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the launcher waits for `RunnerStarted`.
pub const RUNNER_START_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest the launcher, or a follower, sleeps between two looks at the journal: its
/// wake-ups (the handshake's pipe, a watch of the run's directory) usually come first.
pub const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// A follower's first sleep without a wake-up; it doubles up to [`POLL_INTERVAL`] while nothing
/// changes, and starts again after a change.
const FIRST_POLL_INTERVAL: Duration = Duration::from_millis(2);

/// Most retries of a conditional append whose expected head another writer moved.
const MAX_HEAD_RETRIES: u32 = 64;

/// How to start a runner: `program leading_args... RUN_ID --home HOME --layout LAYOUT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunnerProgram {
    pub program: PathBuf,
    pub leading_args: Vec<OsString>,
}

impl RunnerProgram {
    /// The runner of the `runjournal` binary at `program`: `program __runner RUN`.
    pub fn runjournal(program: impl Into<PathBuf>) -> RunnerProgram {
        RunnerProgram {
            program: program.into(),
            leading_args: vec!["__runner".into()],
        }
    }

    /// This program with a runner's own settings after its arguments: how often it rewrites
    /// status.json while it lives, and its steps' idle timeout (neither is journaled for a run
    /// started at once).
    pub fn with_settings(
        &self,
        heartbeat: Option<Duration>,
        idle_timeout: Option<Duration>,
    ) -> RunnerProgram {
        let mut program = self.clone();
        if let Some(heartbeat) = heartbeat {
            program.leading_args.push("--heartbeat".into());
            program
                .leading_args
                .push(format!("{}ms", heartbeat.as_millis()).into());
        }
        if let Some(idle_timeout) = idle_timeout {
            program.leading_args.push("--idle-timeout".into());
            program
                .leading_args
                .push(format!("{}ms", idle_timeout.as_millis()).into());
        }
        program
    }

    /// The program that starts `request`'s runner. A run that waits (in a queue, for other
    /// runs, or for its due time) keeps its runner settings in the journal, and whoever starts
    /// its runner later adds them to this base ([`queue::program_for`]); a run started at once
    /// gets them here.
    pub fn for_request(&self, request: &crate::spec::RunRequest) -> RunnerProgram {
        let waits = request.queue.is_some()
            || !request.after.is_empty()
            || !request.after_any.is_empty()
            || request.start_at_ms.is_some();
        if waits {
            self.clone()
        } else {
            self.with_settings(request.heartbeat, request.idle_timeout)
        }
    }

    /// The command that runs `run`'s runner in `home`.
    pub fn command(&self, home: &Home, run: RunId) -> io::Result<Command> {
        let root = std::path::absolute(home.root())?;
        let mut command = Command::new(&self.program);
        command
            .args(&self.leading_args)
            .arg(run.to_string())
            .arg("--home")
            .arg(root)
            .arg("--layout")
            .arg(home.layout().as_str());
        Ok(command)
    }
}

/// Whether the runner took the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunnerStart {
    /// `RunnerStarted` is in the journal.
    Started { instance_id: String, pid: u32 },
    /// The runner did not take the run; the run is recorded failed (or was ended by someone
    /// else first).
    NotStarted { error: String },
    /// The run waits for its dependencies (`pending`: those that have yet to end); whoever
    /// records the last one's end starts it.
    Waiting { pending: Vec<RunId> },
    /// The run waits for its due time; the home's timer, or a reconcile pass, starts it then.
    Delayed {
        due_at_ms: crate::event::UnixMs,
        /// The home's timer's pid, when this launch started one (one already running may
        /// hold the home's lock: it exits at once, leaving the due time to that one).
        timer: Result<u32, String>,
    },
    /// Launched once: another run held the key (docs/design.md, "Launched once"), so nothing
    /// was created and that run is [`Launched::run`].
    Existing { key: String },
    /// The run waits in its queue for a slot; whoever frees one starts it.
    Queued {
        queue: String,
        /// Its place in the queue (1: next), as the journal stood after the launch.
        place: Option<u64>,
        usage: crate::journal::QueueUsage,
    },
}

/// A launched run.
#[derive(Debug)]
pub struct Launched {
    pub run: RunId,
    /// The runner process, when it was started and not reaped. The launcher is its parent: it
    /// may wait for it and record how it ended ([`record_runner_exit`]).
    pub runner: Option<Child>,
    pub start: RunnerStart,
}

/// Why a launch failed. A run that was created stays in the journal.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LaunchError {
    #[error("creating the run: {0}")]
    Create(#[source] AppendError),
    #[error("run {run}: recording that its runner did not start: {source}")]
    RecordFailure {
        run: RunId,
        #[source]
        source: AppendError,
    },
    #[error("run {run}: {source}")]
    Read {
        run: RunId,
        #[source]
        source: ReadError,
    },
    /// The home's default run timeout could not be read: nothing was written.
    #[error("reading the home's default run timeout: {0}")]
    Policy(#[source] ReadError),
    #[error(
        "run {run}: could not record that its runner did not start: its head kept moving over {MAX_HEAD_RETRIES} attempts"
    )]
    HeadKeptMoving { run: RunId },
    #[error("run {run} disappeared from the journal")]
    Vanished { run: RunId },
    /// The runner exited before taking the run, saying the journal is damaged
    /// ([`crate::journal::DAMAGE_EXIT_CODE`]); the run is recorded failed where the journal
    /// still allowed it.
    #[error("run {run}: its runner exited before taking the run: {source}")]
    RunnerFoundDamage {
        run: RunId,
        #[source]
        source: crate::journal::DamageReported,
    },
    #[error("run {run}: recording how its runner exited: {source}")]
    RecordExit {
        run: RunId,
        #[source]
        source: AppendError,
    },
    #[error("run {run}: admitting runs of its queue: {source}")]
    Queue {
        run: RunId,
        #[source]
        source: Box<queue::QueueError>,
    },
    /// The environment the run would keep cannot be kept (past its bounds, a bad name):
    /// nothing was written.
    #[error(transparent)]
    Environment(#[from] EnvError),
    /// A completion hook cannot be one of the run's: nothing was written.
    #[error(transparent)]
    Hook(#[from] HookCommandError),
    /// The run could not start ([`startable::check_startable`]); it was not created.
    #[error(transparent)]
    Unstartable(#[from] startable::Unstartable),
    /// A run to wait for (`--after`, `--after-any`) cannot be one: nothing was written.
    #[error("cannot wait for {text:?}: {reason}")]
    Dependency { text: String, reason: String },
    /// Judging the created run's dependencies failed; the run stays, waiting, and the next
    /// reconcile pass judges it.
    #[error("run {run}: judging its dependencies: {source}")]
    Judge {
        run: RunId,
        #[source]
        source: Box<after::DependencyError>,
    },
    /// A run waits for a queue's slot or for its due time, not both: nothing was written.
    #[error(
        "a run cannot both wait in queue {queue} and start later (--at, --delay); use one of them"
    )]
    DelayedInQueue { queue: String },
    /// A run waits for other runs or for its due time, not both: nothing was written.
    #[error(
        "a run cannot both wait for other runs (--after, --after-any) and start later (--at, --delay); use one of them"
    )]
    DelayedAfterRuns,
}

impl LaunchError {
    /// Whether the launch was refused for what it was asked, as opposed to a failure of the
    /// journal or the system (nothing was written): the CLI's exit code 2.
    pub fn is_bad_input(&self) -> bool {
        matches!(
            self,
            LaunchError::Environment(_)
                | LaunchError::Hook(_)
                | LaunchError::Unstartable(_)
                | LaunchError::Dependency { .. }
                | LaunchError::DelayedInQueue { .. }
                | LaunchError::DelayedAfterRuns
        )
    }
}

/// What `request`'s run keeps in the home only: the environment of this process (the
/// launcher), as the request asks it, and the run's own hooks, checked. Read here, at the
/// launch, so that whoever starts its runner later starts its steps as this launcher would
/// have.
fn private_of(request: &RunRequest) -> Result<RunPrivate, LaunchError> {
    check_hook_commands(&request.on_exit)?;
    let env = RunEnvironment::capture(&request.env.set, request.env.clear)?;
    Ok(RunPrivate {
        env: Some(env),
        on_exit: request.on_exit.clone(),
    })
}

/// Creates the run, starts its runner, and waits up to `start_timeout` for `RunnerStarted`.
/// A run of a queue ([`RunRequest::queue`]) is created waiting; the launcher admits what the
/// queue allows, first in first, and waits for its own run only if it was admitted, else it
/// returns at once with [`RunnerStart::Queued`]. For a queued run, `program` is the base the
/// run's own runner settings are added to ([`queue::program_for`]).
///
/// The run keeps this process's environment (as [`RunRequest::env`] asks), working directory
/// and umask, read now and written with its creation batch: every runner of the run starts
/// its steps with them (docs/design.md, "Environment"). An environment past its bounds, or a
/// hook that cannot be one, is refused before anything is written.
pub fn launch(
    store: &Store,
    request: RunRequest,
    program: &RunnerProgram,
    start_timeout: Duration,
) -> Result<Launched, LaunchError> {
    check_launchable(&request.spec)?;
    let request = with_home_timeout(store, request)?;
    let private = private_of(&request)?;
    if let (Some(queue), Some(_)) = (&request.queue, request.start_at_ms) {
        return Err(LaunchError::DelayedInQueue {
            queue: queue.clone(),
        });
    }
    if request.start_at_ms.is_some() && !(request.after.is_empty() && request.after_any.is_empty())
    {
        return Err(LaunchError::DelayedAfterRuns);
    }
    let launched = if let Some(due_at_ms) = request.start_at_ms {
        launch_delayed(store, request, private, due_at_ms, program)
    } else if !request.after.is_empty() || !request.after_any.is_empty() {
        launch_dependent(store, request, private, program, start_timeout)
    } else if let Some(queue_name) = request.queue.clone() {
        launch_queued(store, request, private, &queue_name, program, start_timeout)
    } else {
        launch_with(store, request, Vec::new(), private, program, start_timeout)
    };
    match launched {
        // Launched once: the journal refused the creation because another run holds the key.
        // Nothing was written; that run is the answer.
        Err(LaunchError::Create(AppendError::Queue {
            refusal: QueueRefusal::UniqueHeld { key, holder },
            ..
        })) => Ok(Launched {
            run: holder,
            runner: None,
            start: RunnerStart::Existing { key },
        }),
        // The home's watcher follows the run from here, whoever else does (docs/design.md,
        // "The home's watcher"); a delayed launch started it already. Best effort: every
        // command's upkeep starts it again while runs are active.
        Ok(launched) => {
            if !matches!(launched.start, RunnerStart::Delayed { .. }) {
                let _ = delay::start_timer_if_none(store.home(), &program.program);
            }
            Ok(launched)
        }
        other => other,
    }
}

/// pi-subagents' timeout of a background run that names none: 30 minutes.
pub const PI_DEFAULT_TIMEOUT_MS: u64 = 30 * 60 * 1000;

/// The timeout a run gets when its launch names none and its home set none: pi-subagents'
/// 30 minutes in its layout (as its launcher gives every background run), none in
/// runjournal's own.
pub fn layout_default_timeout_ms(layout: Layout) -> Option<u64> {
    match layout {
        Layout::PiSubagents => Some(PI_DEFAULT_TIMEOUT_MS),
        Layout::Runjournal => None,
    }
}

/// The timeout a run gets when its launch names none, in the home of `store`: the one the home
/// set ([`crate::Journal::set_run_timeout`]), else its layout's
/// ([`layout_default_timeout_ms`]). `None`: no timeout.
pub fn default_timeout_ms(store: &Store) -> Result<Option<u64>, ReadError> {
    let set = store.journal().view()?.run_timeout_set()?;
    Ok(set.unwrap_or_else(|| layout_default_timeout_ms(store.home().layout())))
}

/// `request` with the home's default timeout when it names none and does not refuse one
/// ([`RunRequest::home_timeout`]): what the journal keeps is the timeout the run runs under.
fn with_home_timeout(store: &Store, mut request: RunRequest) -> Result<RunRequest, LaunchError> {
    if request.spec.timeout_ms.is_none() && request.home_timeout {
        request.spec.timeout_ms = default_timeout_ms(store).map_err(LaunchError::Policy)?;
    }
    Ok(request)
}

/// `more`, then the run's `RetryPolicy` when it is tried again, then its `UniqueKey` when it is
/// launched once: the last events of its creation batch.
fn with_tail(mut more: Vec<Event>, request: &RunRequest) -> Vec<Event> {
    let millis = |duration: Duration| u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
    if let Some(retry) = &request.retry {
        let (idle_timeout_ms, heartbeat_ms) = kept_settings(request);
        more.push(Event::RetryPolicy {
            retries: retry.retries,
            backoff_ms: millis(retry.backoff),
            backoff_max_ms: millis(retry.backoff_max),
            on: retry.on.clone(),
            idle_timeout_ms,
            heartbeat_ms,
        });
    }
    if let Some(unique) = &request.unique {
        more.push(Event::UniqueKey {
            key: unique.key.clone(),
            hold_ms: unique.hold.map(millis),
        });
    }
    more
}

/// [`startable::check_startable`] of `spec`, from this process's directory and `PATH`.
fn check_launchable(spec: &RunSpec) -> Result<(), startable::Unstartable> {
    let cwd = std::env::current_dir().map_err(|source| startable::Unstartable::CwdUnusable {
        cwd: PathBuf::from("."),
        source,
    })?;
    startable::check_startable(spec, startable::launcher_search_path().as_deref(), &cwd)
}

/// [`launch`], with `more` events in the run's creation batch after its `RunCreated`.
fn launch_with(
    store: &Store,
    request: RunRequest,
    more: Vec<Event>,
    private: RunPrivate,
    program: &RunnerProgram,
    start_timeout: Duration,
) -> Result<Launched, LaunchError> {
    let more = with_tail(more, &request);
    let creation = crate::journal::Creation {
        spec: request.spec,
        hosts: request.hosts,
        more,
        private: Some(private),
    };
    // The runner starts as soon as the run is durable; the run is projected meanwhile.
    let (created, spawned) = store
        .create_then(creation, |created| {
            spawn_runner(store.home(), created.run, program)
        })
        .map_err(LaunchError::Create)?;
    let run = created.run;
    let (runner, ready) = match spawned {
        Ok(spawned) => spawned,
        Err(error) => {
            let start = give_up(
                store,
                run,
                None,
                format!("cannot start the runner: {error}"),
                None,
            )?;
            return Ok(Launched {
                run,
                runner: None,
                start,
            });
        }
    };
    await_runner(store, run, runner, ready, start_timeout)
}

/// The runner settings a run keeps for a later starter (`QueueJoined`, `DependsOn`,
/// `StartDelayed`), in ms:
/// `(idle_timeout_ms, heartbeat_ms)`.
fn kept_settings(request: &RunRequest) -> (Option<u64>, Option<u64>) {
    let ms = |duration: Duration| u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
    (request.idle_timeout.map(ms), request.heartbeat.map(ms))
}

/// A launch of a run that waits for others (docs/design.md, "Dependencies"): what it names
/// resolved to runs of the journal (refused, nothing written, if one is not), the run created
/// with its `DependsOn` (after its `QueueJoined` when it has a queue), then judged at once.
/// `program` is the base its runner settings are added to, as for a queued run.
fn launch_dependent(
    store: &Store,
    request: RunRequest,
    private: RunPrivate,
    program: &RunnerProgram,
    start_timeout: Duration,
) -> Result<Launched, LaunchError> {
    let (after, after_any) = after::resolve(store, &request.after, &request.after_any)?;
    let (idle_timeout_ms, heartbeat_ms) = kept_settings(&request);
    let mut more = Vec::new();
    if let Some(queue) = &request.queue {
        more.push(Event::QueueJoined {
            queue: queue.clone(),
            idle_timeout_ms,
            heartbeat_ms,
        });
    }
    more.push(Event::DependsOn {
        after,
        after_any,
        idle_timeout_ms,
        heartbeat_ms,
    });
    let more = with_tail(more, &request);
    let creation = crate::journal::Creation {
        spec: request.spec,
        hosts: request.hosts,
        more,
        private: Some(private),
    };
    let (created, ()) = store
        .create_then(creation, |_| ())
        .map_err(LaunchError::Create)?;
    after::enter(store, created.run, program, start_timeout)
}

fn launch_queued(
    store: &Store,
    request: RunRequest,
    private: RunPrivate,
    queue_name: &str,
    program: &RunnerProgram,
    start_timeout: Duration,
) -> Result<Launched, LaunchError> {
    let (idle_timeout_ms, heartbeat_ms) = kept_settings(&request);
    let joined = Event::QueueJoined {
        queue: queue_name.to_string(),
        idle_timeout_ms,
        heartbeat_ms,
    };
    let more = with_tail(vec![joined], &request);
    let creation = crate::journal::Creation {
        spec: request.spec,
        hosts: request.hosts,
        more,
        private: Some(private),
    };
    let (created, ()) = store
        .create_then(creation, |_| ())
        .map_err(LaunchError::Create)?;
    enter_queue(store, created.run, queue_name, program, start_timeout)
}

/// Creates a delayed run (`StartDelayed` in its creation batch), then starts the home's timer
/// (`program` with [`delay::TIMER_SUBCOMMAND`]) and returns at once: the timer, or a reconcile
/// pass, starts the run once due. A timer that cannot be started is left to the next reconcile
/// pass, as one killed is.
fn launch_delayed(
    store: &Store,
    request: RunRequest,
    private: RunPrivate,
    due_at_ms: crate::event::UnixMs,
    program: &RunnerProgram,
) -> Result<Launched, LaunchError> {
    let (idle_timeout_ms, heartbeat_ms) = kept_settings(&request);
    let delayed = Event::StartDelayed {
        due_at_ms,
        idle_timeout_ms,
        heartbeat_ms,
    };
    let more = with_tail(vec![delayed], &request);
    let creation = crate::journal::Creation {
        spec: request.spec,
        hosts: request.hosts,
        more,
        private: Some(private),
    };
    let (created, ()) = store
        .create_then(creation, |_| ())
        .map_err(LaunchError::Create)?;
    let timer =
        delay::start_timer(store.home(), &program.program).map_err(|error| error.to_string());
    Ok(Launched {
        run: created.run,
        runner: None,
        start: RunnerStart::Delayed { due_at_ms, timer },
    })
}

/// After creating `run` in `queue_name` (or finding its dependencies met): admits what the
/// queue allows and waits for its own runner if it was admitted, else reports its place.
fn enter_queue(
    store: &Store,
    run: RunId,
    queue_name: &str,
    program: &RunnerProgram,
    start_timeout: Duration,
) -> Result<Launched, LaunchError> {
    match queue::enter(store, run, queue_name, program)? {
        queue::Entered::Started { child, ready } => {
            await_runner(store, run, child, ready, start_timeout)
        }
        queue::Entered::NotStarted { error } => Ok(Launched {
            run,
            runner: None,
            start: RunnerStart::NotStarted { error },
        }),
        queue::Entered::Waiting => {
            let state = snapshot(store, run)?;
            if let Some(start) = start_of(&state) {
                return Ok(Launched {
                    run,
                    runner: None,
                    start,
                });
            }
            let queue_failed = |error: queue::QueueError| LaunchError::Queue {
                run,
                source: Box::new(error),
            };
            let place = queue::place_of(store, &state).map_err(queue_failed)?;
            let usage = queue::view(store, queue_name, 0)
                .map_err(queue_failed)?
                .usage;
            Ok(Launched {
                run,
                runner: None,
                start: RunnerStart::Queued {
                    queue: queue_name.to_string(),
                    place,
                    usage,
                },
            })
        }
    }
}

/// Waits up to `start_timeout` for the journal to show that `runner` took `run`; gives the run
/// up if it does not.
fn await_runner(
    store: &Store,
    run: RunId,
    mut runner: Child,
    mut ready: Option<std::fs::File>,
    start_timeout: Duration,
) -> Result<Launched, LaunchError> {
    let deadline = Instant::now() + start_timeout;
    loop {
        let state = snapshot(store, run)?;
        if let Some(start) = start_of(&state) {
            return Ok(Launched {
                run,
                runner: Some(runner),
                start,
            });
        }
        let exited = runner.try_wait().ok().flatten();
        if exited.is_some() || Instant::now() >= deadline {
            let error = match exited {
                Some(status) => format!(
                    "runner exited ({}) before taking the run; see {}",
                    describe_exit(status.into()),
                    store.home().runner_log_path(run).display()
                ),
                None => format!(
                    "runner did not start within {}; see {}",
                    format_duration(start_timeout),
                    store.home().runner_log_path(run).display()
                ),
            };
            let exit = exited.map(ProcessExit::from);
            // A runner that stopped on the journal as damaged: the launch reports the damage,
            // as every command does, though its own reads met none.
            let is_damage_exit = exit
                .as_ref()
                .is_some_and(|exit| exit.code == Some(i32::from(crate::journal::DAMAGE_EXIT_CODE)));
            let start = give_up(
                store,
                run,
                exited.is_none().then_some(&mut runner),
                error,
                exit,
            )?;
            if is_damage_exit && matches!(start, RunnerStart::NotStarted { .. }) {
                return Err(LaunchError::RunnerFoundDamage {
                    run,
                    source: crate::journal::DamageReported {
                        path: store.home().journal_path(),
                        by: format!(
                            "its runner (see {})",
                            store.home().runner_log_path(run).display()
                        ),
                    },
                });
            }
            return Ok(Launched {
                run,
                runner: exited.is_none().then_some(runner),
                start,
            });
        }
        let timeout = POLL_INTERVAL.min(deadline.saturating_duration_since(Instant::now()));
        match ready.as_ref().map(|pipe| wait_for_signal(pipe, timeout)) {
            // The byte (RunnerStarted is durable), or a timeout: look again.
            Some(Ok(Signal::Ready | Signal::Nothing)) => {}
            // The runner closed its end (it exited, or it will not signal): poll from now on.
            Some(Ok(Signal::Closed)) | Some(Err(_)) => ready = None,
            None => std::thread::sleep(timeout),
        }
    }
}

/// Why a run cannot be resumed, or the resume failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ResumeError {
    #[error("run {run} is not in the journal")]
    UnknownRun { run: RunId },
    #[error("run {run} was pruned from the journal: nothing is left of it to resume")]
    Pruned { run: RunId },
    #[error("run {run} cannot be resumed: {refusal}")]
    Refused { run: RunId, refusal: ResumeRefusal },
    #[error(
        "run {run} cannot be resumed: every one of its steps completed before it was paused; nothing is left to run"
    )]
    NothingLeft { run: RunId },
    /// The paused run had spent its whole timeout before it paused: its deadline is past, so
    /// nothing may run for it any more.
    #[error(
        "run {run} cannot be resumed: it ran {spent} of its {timeout} timeout before it paused; its deadline is past"
    )]
    TimeoutSpent {
        run: RunId,
        timeout: String,
        spent: String,
    },
    #[error("run {run}: {source}")]
    Read {
        run: RunId,
        #[source]
        source: ReadError,
    },
    #[error("resuming run {run}: {source}")]
    Launch {
        run: RunId,
        /// Boxed: it is large, and every refusal carries this enum.
        #[source]
        source: Box<LaunchError>,
    },
    /// The paused run's control inbox could not be taken (what a host asked of it would be
    /// left unread): nothing was resumed.
    #[error(
        "run {run}: its control inbox could not be taken ({source}); nothing was resumed: run resume again"
    )]
    Inbox {
        run: RunId,
        /// Boxed, as `Launch`'s.
        #[source]
        source: Box<crate::control_inbox::TakeError>,
    },
    /// A file of the paused run's control inbox was still being written after the bounded
    /// wait for it (`control_inbox::take_whole`): nothing was resumed.
    #[error(
        "run {run}: {files} in its control inbox is still being written; nothing was resumed: run resume again once it is whole"
    )]
    InboxBeingWritten { run: RunId, files: String },
}

impl ResumeError {
    /// Whether the caller named a run that cannot be resumed (as opposed to a failure of the
    /// journal or of the launch): the CLI's exit code 2.
    pub fn is_bad_input(&self) -> bool {
        match self {
            ResumeError::UnknownRun { .. }
            | ResumeError::Pruned { .. }
            | ResumeError::Refused { .. }
            | ResumeError::NothingLeft { .. }
            | ResumeError::TimeoutSpent { .. } => true,
            ResumeError::Launch { source, .. } => source.is_bad_input(),
            ResumeError::Read { .. }
            | ResumeError::Inbox { .. }
            | ResumeError::InboxBeingWritten { .. } => false,
        }
    }
}

/// What a resume is asked beyond the paused run itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResumeOptions {
    /// The new runner's idle timeout (not journaled, so not inherited).
    pub idle_timeout: Option<Duration>,
    /// Variables set over the paused run's recorded environment (`clear`: only these).
    pub env: crate::spec::EnvRequest,
    /// Completion hooks of the new run after the paused run's own.
    pub on_exit: Vec<String>,
}

/// What the run that resumes `state` keeps in the home only: the paused run's recorded
/// environment (cwd and umask too) with `options.env` over it — a resume carries the work on
/// as it was launched, whoever resumes it; a paused run recorded without one (an earlier
/// version) takes the resumer's, as a launch would — and the paused run's own hooks, then
/// `options.on_exit`.
fn resume_private(
    store: &Store,
    run: RunId,
    options: &ResumeOptions,
) -> Result<RunPrivate, ResumeError> {
    let read = |source| ResumeError::Read { run, source };
    let refused = |source: LaunchError| ResumeError::Launch {
        run,
        source: Box::new(source),
    };
    let view = store.journal().view().map_err(read)?;
    let recorded = view.run_env(run).map_err(read)?;
    let mut on_exit = view.run_hooks(run).map_err(read)?.own;
    on_exit.extend(options.on_exit.iter().cloned());
    check_hook_commands(&on_exit).map_err(|error| refused(error.into()))?;
    let env = match recorded {
        Some(recorded) => recorded.overlay(&options.env.set, options.env.clear),
        None => RunEnvironment::capture(&options.env.set, options.env.clear),
    }
    .map_err(|error| refused(error.into()))?;
    Ok(RunPrivate {
        env: Some(env),
        on_exit,
    })
}

/// The run that carries a paused run on, as [`resume_plan`] makes it from the paused run's
/// state.
#[derive(Debug, Clone, PartialEq)]
pub struct ResumePlan {
    /// The paused run.
    pub from: RunId,
    /// The paused run's steps the new run runs, in order: the new run's step `i` is the paused
    /// run's step `steps[i]`.
    pub steps: Vec<u32>,
    /// The new run's spec: the paused run's, with those steps and the timeout it has left.
    pub spec: RunSpec,
    /// The paused run's host ids, unchanged.
    pub hosts: HostIds,
}

/// Plans the run that carries `state`, a paused run, on. Pure.
///
/// * Steps: in a chain, the first step that did not complete (the interrupted one) and every
///   step after it; in parallel, every step that did not complete (interrupted, failed or
///   never started), in their order; a single run's one step. Steps that completed are not
///   run again.
/// * Timeout: what the paused run had left — its timeout less the time from its runner's
///   start to its end — so that a run cannot outlive its deadline by being paused and
///   resumed; none when it had none. The time it spent paused is not counted. A run that had
///   nothing left is refused ([`ResumeError::TimeoutSpent`]), as pi-subagents refuses to
///   recover a run past its deadline.
/// * Name, mode, concurrency, cwd, session id, completion owner id and tool-call id: the
///   paused run's. The name and the tool-call id then name the new run (the latest run wins
///   an alias), which is the work the host's call goes on with.
pub fn resume_plan(state: &RunState) -> Result<ResumePlan, ResumeError> {
    let run = state.run_id;
    if state.status != RunStatus::Paused {
        return Err(ResumeError::Refused {
            run,
            refusal: ResumeRefusal::NotPaused {
                state: state.status,
            },
        });
    }
    let is_left = |index: &usize| state.steps[*index].status != StepStatus::Complete;
    let indexes: Vec<usize> = match state.spec.mode {
        Mode::Chain => match (0..state.steps.len()).find(is_left) {
            Some(first) => (first..state.steps.len()).collect(),
            None => Vec::new(),
        },
        Mode::Parallel | Mode::Single => (0..state.steps.len()).filter(is_left).collect(),
    };
    if indexes.is_empty() {
        return Err(ResumeError::NothingLeft { run });
    }
    let spent = match (&state.runner, &state.terminal) {
        (Some(runner), Some(terminal)) => terminal.at_ms.saturating_sub(runner.started_at_ms),
        _ => 0,
    };
    let timeout_ms = match state.spec.timeout_ms {
        Some(timeout) if spent >= timeout => {
            return Err(ResumeError::TimeoutSpent {
                run,
                timeout: crate::duration::format_duration_ms(timeout),
                spent: crate::duration::format_duration_ms(spent),
            });
        }
        timeout => timeout.map(|timeout| timeout - spent),
    };
    let spec = RunSpec {
        name: state.spec.name.clone(),
        mode: state.spec.mode,
        concurrency: state.spec.concurrency,
        timeout_ms,
        cwd: state.spec.cwd.clone(),
        steps: indexes
            .iter()
            .map(|&index| state.spec.steps[index].clone())
            .collect(),
    };
    Ok(ResumePlan {
        from: run,
        steps: indexes
            .iter()
            .map(|&index| u32::try_from(index).unwrap_or(u32::MAX))
            .collect(),
        spec,
        hosts: HostIds {
            session_id: state.session_id.clone(),
            completion_owner_id: state.completion_owner_id.clone(),
            tool_call_id: state.tool_call_id.clone(),
        },
    })
}

/// A run launched to carry a paused run on.
#[derive(Debug)]
pub struct Resumed {
    pub launched: Launched,
    pub plan: ResumePlan,
}

/// Resumes `run`, a paused run: launches the run [`resume_plan`] makes of it, whose creation
/// batch records `Resumed` after its `RunCreated`, and waits for its runner as [`launch`]
/// does. The journal links the two runs in the transaction that creates the new one, and
/// only if `run` is paused and was not resumed yet, so of two resumes of one run one lands
/// and the other is refused. A run is resumed once: to carry on again, resume the run that
/// resumed it once it is paused itself. A resume whose runner never took its run (the launch
/// gave up on it) ran nothing and does not count: the paused run may be resumed again. `idle_timeout` is the new runner's (not journaled, so
/// not inherited). The paused run's records are not touched; its files are projected again
/// to show the link.
pub fn resume(
    store: &Store,
    run: RunId,
    idle_timeout: Option<Duration>,
    program: &RunnerProgram,
    start_timeout: Duration,
) -> Result<Resumed, ResumeError> {
    let options = ResumeOptions {
        idle_timeout,
        ..ResumeOptions::default()
    };
    resume_with(store, run, &options, program, start_timeout)
}

/// [`resume`], with `options`: the new run keeps the paused run's environment with
/// `options.env` over it, and the paused run's hooks with `options.on_exit` after them.
pub fn resume_with(
    store: &Store,
    run: RunId,
    options: &ResumeOptions,
    program: &RunnerProgram,
    start_timeout: Duration,
) -> Result<Resumed, ResumeError> {
    let idle_timeout = options.idle_timeout;
    let read = |source| ResumeError::Read { run, source };
    // The run that resumed `run`, unless it ended before a runner took it (it ran nothing, and
    // the journal lets another resume take its place).
    let resumed_by = |store: &Store| -> Result<Option<RunId>, ReadError> {
        let view = store.journal().view()?;
        let Some(by) = view.resume_links(run)?.resumed_by else {
            return Ok(None);
        };
        Ok(match view.snapshot(by)? {
            Some(resumer) if resumer.ended_unstarted() => None,
            _ => Some(by),
        })
    };
    // What a host wrote into the paused run's control inbox is taken first: its messages go
    // on with the resume. Nothing reads a paused run's inbox after its resume, so a resume
    // that cannot take it resumes nothing: the next one takes it. A file still being written
    // is waited for, a bounded time. (A run that is not in the journal is refused below.)
    match crate::control_inbox::take_whole(
        store.home(),
        run,
        || store.journal().view()?.snapshot(run),
        |events, condition| store.append(run, events, condition),
    ) {
        Ok(taken) if !taken.waiting.is_empty() => {
            return Err(ResumeError::InboxBeingWritten {
                run,
                files: taken.waiting.join(", "),
            });
        }
        Ok(_) | Err(crate::control_inbox::TakeError::UnknownRun { .. }) => {}
        Err(source) => {
            return Err(ResumeError::Inbox {
                run,
                source: Box::new(source),
            });
        }
    }
    let view = store.journal().view().map_err(read)?;
    let Some(state) = view.snapshot(run).map_err(read)? else {
        return Err(match view.tombstone(run).map_err(read)? {
            Some(_) => ResumeError::Pruned { run },
            None => ResumeError::UnknownRun { run },
        });
    };
    drop(view);
    if let Some(by) = resumed_by(store).map_err(read)? {
        return Err(ResumeError::Refused {
            run,
            refusal: ResumeRefusal::AlreadyResumed { by },
        });
    }
    let plan = resume_plan(&state)?;
    check_launchable(&plan.spec).map_err(|source| ResumeError::Launch {
        run,
        source: Box::new(source.into()),
    })?;
    // A resumed run starts at once: it takes no queue (its paused run held no slot).
    let request = RunRequest {
        spec: plan.spec.clone(),
        hosts: plan.hosts.clone(),
        idle_timeout,
        heartbeat: None,
        queue: None,
        env: crate::spec::EnvRequest::default(),
        on_exit: Vec::new(),
        after: Vec::new(),
        after_any: Vec::new(),
        start_at_ms: None,
        unique: None,
        retry: None,
        home_timeout: false,
    };
    let private = resume_private(store, run, options)?;
    // The messages the paused run kept for its resume wait for the new run's steps.
    let mut more = vec![Event::Resumed { from: run }];
    more.extend(crate::control::carried_steers(store, &state, &plan.steps).map_err(read)?);
    match launch_with(store, request, more, private, program, start_timeout) {
        Ok(launched) => {
            store.project_linked(run, state.head_seq);
            Ok(Resumed { launched, plan })
        }
        Err(LaunchError::Create(AppendError::Resume { refusal, .. })) => {
            Err(ResumeError::Refused { run, refusal })
        }
        Err(source) => {
            // Through a commit leader, a resume that lost the race to another comes back as
            // the leader's failure to judge it: look again.
            if let Ok(Some(by)) = resumed_by(store) {
                return Err(ResumeError::Refused {
                    run,
                    refusal: ResumeRefusal::AlreadyResumed { by },
                });
            }
            Err(ResumeError::Launch {
                run,
                source: Box::new(source),
            })
        }
    }
}

/// What `runjournal resume --json` prints of a run just resumed.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ResumeReport {
    /// The new run.
    pub run_id: String,
    /// The paused run it carries on.
    pub resumed_from: String,
    /// The paused run's steps the new run runs (its step `i` is `steps[i]`).
    pub steps: Vec<u32>,
    /// `running` once its runner took it, else `failed`.
    pub state: &'static str,
    pub runner_pid: Option<u32>,
    pub error: Option<String>,
    pub timeout_ms: Option<u64>,
    pub status_path: PathBuf,
    pub result_path: PathBuf,
}

impl ResumeReport {
    pub fn of(home: &Home, resumed: &Resumed) -> ResumeReport {
        let run = resumed.launched.run;
        let (state, runner_pid, error) = match &resumed.launched.start {
            RunnerStart::Started { pid, .. } => ("running", Some(*pid), None),
            RunnerStart::NotStarted { error } => ("failed", None, Some(error.clone())),
            RunnerStart::Queued { .. }
            | RunnerStart::Waiting { .. }
            | RunnerStart::Delayed { .. }
            | RunnerStart::Existing { .. } => ("queued", None, None),
        };
        ResumeReport {
            run_id: run.to_string(),
            resumed_from: resumed.plan.from.to_string(),
            steps: resumed.plan.steps.clone(),
            state,
            runner_pid,
            error,
            timeout_ms: resumed.plan.spec.timeout_ms,
            status_path: home.status_path(run),
            result_path: home.result_path(run),
        }
    }
}

/// What the handshake's pipe said.
enum Signal {
    /// The runner wrote its byte.
    Ready,
    /// Its end is closed without one.
    Closed,
    /// Nothing within the timeout.
    Nothing,
}

/// Waits up to `timeout` for the runner's byte on the handshake's pipe.
fn wait_for_signal(pipe: &std::fs::File, timeout: Duration) -> io::Result<Signal> {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use std::io::Read;
    use std::os::fd::AsFd;
    let mut fds = [PollFd::new(pipe.as_fd(), PollFlags::POLLIN)];
    let timeout = PollTimeout::try_from(timeout).unwrap_or(PollTimeout::MAX);
    match poll(&mut fds, timeout) {
        Ok(0) => return Ok(Signal::Nothing),
        Ok(_) => {}
        Err(nix::errno::Errno::EINTR) => return Ok(Signal::Nothing),
        Err(error) => return Err(error.into()),
    }
    let mut byte = [0u8; 1];
    match (&*pipe).read(&mut byte) {
        Ok(0) => Ok(Signal::Closed),
        Ok(_) => Ok(Signal::Ready),
        Err(error) if error.kind() == io::ErrorKind::Interrupted => Ok(Signal::Nothing),
        Err(error) => Err(error),
    }
}

/// `Started` once the run has a runner; `NotStarted` if it ended without one.
fn start_of(state: &RunState) -> Option<RunnerStart> {
    if let Some(runner) = &state.runner {
        return Some(RunnerStart::Started {
            instance_id: runner.instance_id.clone(),
            pid: runner.identity.pid,
        });
    }
    if state.is_terminal() || state.process_terminal.is_some() {
        let error = state
            .terminal
            .as_ref()
            .and_then(|terminal| terminal.error.clone())
            .unwrap_or_else(|| format!("the run is {} without a runner", state.status));
        return Some(RunnerStart::NotStarted { error });
    }
    None
}

/// Records that no runner took the run, unless one did meanwhile; then kills the runner
/// process, which can no longer take it.
pub(crate) fn give_up(
    store: &Store,
    run: RunId,
    runner: Option<&mut Child>,
    error: String,
    exit: Option<ProcessExit>,
) -> Result<RunnerStart, LaunchError> {
    let error = truncate_text(&error, crate::event::MAX_TEXT_BYTES);
    for _ in 0..MAX_HEAD_RETRIES {
        let state = snapshot(store, run)?;
        if let Some(start) = start_of(&state) {
            return Ok(start);
        }
        let events = vec![
            Event::Terminal {
                state: TerminalState::Failed,
                error: Some(error.clone()),
                summary: "the runner never started".to_string(),
                exit_code: runner::EXIT_FAILED,
                repaired_by: Some(Repairer::Launcher),
            },
            Event::ProcessTerminalObserved {
                instance_id: String::new(),
                exit,
                proof: Proof::NotStarted,
                observer: Observer::Launcher,
            },
        ];
        match store.append(run, events, Condition::expect_head(state.head_seq)) {
            Ok(_) => {
                if let Some(runner) = runner {
                    // The journal now refuses this runner; make sure it is gone too.
                    let _ = runner.kill();
                    let _ = runner.wait();
                }
                return Ok(RunnerStart::NotStarted { error });
            }
            Err(AppendError::HeadMismatch { .. }) => continue,
            Err(source) => return Err(LaunchError::RecordFailure { run, source }),
        }
    }
    Err(LaunchError::HeadKeptMoving { run })
}

fn snapshot(store: &dyn ReadHome, run: RunId) -> Result<RunState, LaunchError> {
    let read = |source| LaunchError::Read { run, source };
    store
        .view()
        .map_err(read)?
        .snapshot(run)
        .map_err(read)?
        .ok_or(LaunchError::Vanished { run })
}

/// Starts the runner detached: its own session, stdin from /dev/null, stdout and stderr
/// appended to `runs/<id>/runner.log`, and the write end of the handshake's pipe passed on
/// purpose (named in [`runner::READY_FD_ENV`]). Returns the runner and the pipe's read end
/// (`None` if no pipe could be made: the launcher then polls the journal).
pub(crate) fn spawn_runner(
    home: &Home,
    run: RunId,
    program: &RunnerProgram,
) -> io::Result<(Child, Option<std::fs::File>)> {
    use std::os::fd::{AsRawFd, OwnedFd};
    // What the runner writes before it opens its own log (a panic, a failure to start) lands
    // in runner.log when it can be made; a full disk must not keep the run from starting.
    let log = durable_fs::ensure_private_dir(&home.run_dir(run))
        .and_then(|()| durable_fs::open_append(&home.runner_log_path(run)));
    let output = || match log.as_ref().map(std::fs::File::try_clone) {
        Ok(Ok(file)) => Stdio::from(file),
        _ => Stdio::null(),
    };
    let mut command = program.command(home, run)?;
    command
        .stdin(Stdio::null())
        .stdout(output())
        .stderr(output());
    // Both ends close-on-exec, so no other child of this process inherits them; above the
    // standard streams, which the spawn replaces in the child.
    let pipe: Option<(OwnedFd, OwnedFd)> = platform::pipe_cloexec()
        .and_then(|(read_end, write_end)| Ok((above_stdio(read_end)?, above_stdio(write_end)?)))
        .ok();
    let ready_fd = pipe.as_ref().map(|(_, write_end)| write_end.as_raw_fd());
    if let Some(fd) = ready_fd {
        command.env(runner::READY_FD_ENV, fd.to_string());
    }
    // SAFETY: setsid, the descriptor walk and fcntl are raw system calls, async-signal-safe,
    // as calls between fork and exec must be. The walk leaves 0-2, which std has just set;
    // then close-on-exec is cleared on the handshake's write end, in the child alone: the one
    // descriptor above 2 passed on purpose.
    unsafe {
        command.pre_exec(move || {
            nix::unistd::setsid().map_err(io::Error::from)?;
            platform::mark_cloexec_from(3)?;
            if let Some(fd) = ready_fd {
                let borrowed = std::os::fd::BorrowedFd::borrow_raw(fd);
                nix::fcntl::fcntl(
                    borrowed,
                    nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
                )
                .map_err(io::Error::from)?;
            }
            Ok(())
        });
    }
    let child = command.spawn()?;
    // Our copy of the write end goes now: once the runner's is closed too, the read end
    // reads the end of the pipe.
    Ok((
        child,
        pipe.map(|(read_end, _)| std::fs::File::from(read_end)),
    ))
}

/// `fd`, or a close-on-exec duplicate of it numbered above 2 if it is a standard stream's
/// number (the launcher's own were closed): a spawn replaces those in the child.
fn above_stdio(fd: std::os::fd::OwnedFd) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::{AsRawFd, FromRawFd};
    if fd.as_raw_fd() > 2 {
        return Ok(fd);
    }
    let duplicate = nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(3))
        .map_err(io::Error::from)?;
    // SAFETY: F_DUPFD_CLOEXEC returned a new descriptor that nothing else owns.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(duplicate) })
}

/// How following a run ended.
#[derive(Debug, Clone, PartialEq)]
pub enum FollowEnd {
    /// The run is terminal.
    Terminal(RunState),
    /// The runner (the caller's child) exited and the run is still not terminal.
    RunnerExited { state: RunState, exit: ProcessExit },
    /// The recorded runner is gone (checked by its identity) and the run is not terminal.
    RunnerGone(RunState),
    /// The deadline passed first.
    TimedOut(RunState),
    /// `on_record` asked to stop (its reader went away: a closed pipe).
    Left(RunState),
}

/// Follows `run` until it is terminal, handing each record after `after_seq` to `on_record`
/// as it lands; `on_record` may end the follow early by breaking. With `runner` (the caller is
/// the runner's parent), a runner that exits without a `Terminal` ends the follow; without
/// it, a recorded runner found dead by its identity does.
///
/// Each look reads the run's snapshot and only the records after the last one handed on (its
/// seq is the cursor), so following costs the same at the run's 10,000th record as at its
/// first. Between looks it sleeps on a watch of the run's directory, which every projection
/// after a commit writes to, bounded by a poll that starts at a few milliseconds and backs off
/// to [`POLL_INTERVAL`] while nothing changes.
pub fn follow(
    store: &dyn ReadHome,
    run: RunId,
    after_seq: u64,
    runner: Option<&mut Child>,
    deadline: Option<Instant>,
    on_record: impl FnMut(&Record) -> ControlFlow<()>,
) -> Result<FollowEnd, LaunchError> {
    follow_looking(
        store,
        run,
        after_seq,
        runner,
        deadline,
        || ControlFlow::Continue(()),
        on_record,
    )
}

/// [`follow`], calling `on_look` at every look, after the records up to the run's head were
/// read and before they are handed to `on_record`: whatever the run wrote before those records
/// (its steps' output) is there for `on_look` to show first. `on_look` may break as
/// `on_record` may.
pub fn follow_looking(
    store: &dyn ReadHome,
    run: RunId,
    mut after_seq: u64,
    mut runner: Option<&mut Child>,
    deadline: Option<Instant>,
    mut on_look: impl FnMut() -> ControlFlow<()>,
    mut on_record: impl FnMut(&Record) -> ControlFlow<()>,
) -> Result<FollowEnd, LaunchError> {
    let read = |source| LaunchError::Read { run, source };
    // Made before the first look, so a change between a look and the sleep after it wakes
    // the sleep. Without one (inotify exhausted, say), the bounded poll alone wakes us.
    let watch = watch_run(store.home(), run);
    let mut sleep = FIRST_POLL_INTERVAL;
    loop {
        let view = store.view().map_err(read)?;
        let state = view
            .snapshot(run)
            .map_err(read)?
            .ok_or(LaunchError::Vanished { run })?;
        let has_changed = state.head_seq > after_seq;
        let records = if has_changed {
            view.records_between(run, after_seq, state.head_seq)
                .map_err(read)?
        } else {
            Vec::new()
        };
        if on_look().is_break() {
            return Ok(FollowEnd::Left(state));
        }
        {
            for record in records {
                after_seq = record.seq;
                if on_record(&record).is_break() {
                    return Ok(FollowEnd::Left(state));
                }
            }
        }
        drop(view);
        if state.is_terminal() {
            return Ok(FollowEnd::Terminal(state));
        }
        let runner_exit = match runner.as_deref_mut() {
            Some(child) => child.try_wait().ok().flatten(),
            None => None,
        };
        // Without a child of our own to watch: the recorded runner is dead, or someone saw it
        // go, or no runner took the run within the start grace.
        let is_never_started = state.runner.is_none()
            && state.startable_at_ms().is_some_and(|startable_at_ms| {
                event::now_ms().saturating_sub(startable_at_ms) > crate::reconcile::START_GRACE_MS
            });
        let is_runner_gone = runner_exit.is_some()
            || (runner.is_none()
                && (state.is_stale()
                    || is_never_started
                    || state.runner.as_ref().is_some_and(|info| {
                        matches!(
                            liveness::check(&info.identity),
                            Ok(Liveness::Dead | Liveness::OtherBoot)
                        )
                    })));
        if is_runner_gone {
            // It may have recorded its end just before it went: look once more.
            let state = snapshot(store, run)?;
            if state.head_seq > after_seq {
                continue;
            }
            if state.is_terminal() {
                continue;
            }
            return Ok(match runner_exit {
                Some(status) => FollowEnd::RunnerExited {
                    state,
                    exit: ProcessExit::from(status),
                },
                None => FollowEnd::RunnerGone(state),
            });
        }
        let now = Instant::now();
        if deadline.is_some_and(|deadline| now >= deadline) {
            return Ok(FollowEnd::TimedOut(state));
        }
        sleep = if has_changed {
            FIRST_POLL_INTERVAL
        } else {
            (sleep * 2).min(POLL_INTERVAL)
        };
        let timeout = deadline.map_or(sleep, |deadline| sleep.min(deadline - now));
        sleep_or_wake(watch.as_ref(), timeout);
    }
}

/// A watch of the run's events.jsonl and status.json, which the projection after each of its
/// commits writes; `None` if the platform cannot make one now.
fn watch_run(home: &Home, run: RunId) -> Option<crate::platform::DirWatch> {
    let name = |path: PathBuf| path.file_name()?.to_str().map(str::to_string);
    let names: Vec<String> = [home.events_path(run), home.status_path(run)]
        .into_iter()
        .filter_map(name)
        .collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    crate::platform::watch_dir(&home.run_dir(run), &names).ok()
}

/// Sleeps `timeout`, or less if `watch` sees a file of the run change.
pub(crate) fn sleep_or_wake(watch: Option<&crate::platform::DirWatch>, timeout: Duration) {
    let is_watched = watch.is_some_and(|watch| watch.wait(timeout).is_ok());
    if !is_watched {
        std::thread::sleep(timeout);
    }
}

/// Records, as the runner's parent, how the runner process ended. A process terminal someone
/// else recorded first is fine.
pub fn record_runner_exit(
    store: &Store,
    run: RunId,
    instance_id: &str,
    exit: ProcessExit,
) -> Result<(), AppendError> {
    let event = Event::ProcessTerminalObserved {
        instance_id: instance_id.to_string(),
        exit: Some(exit),
        proof: Proof::Observed,
        observer: Observer::RunnerParent,
    };
    match store.append(run, vec![event], Condition::none()) {
        Ok(_)
        | Err(AppendError::Transition {
            source: TransitionError::ProcessTerminalAlreadyObserved { .. },
            ..
        }) => Ok(()),
        Err(error) => Err(error),
    }
}

/// Waits up to `timeout` for a child to exit; its status, or `None` if it is still running.
/// Where the platform has process descriptors (Linux's pidfd) it sleeps on one and wakes the
/// moment the child exits; elsewhere it looks often at first (a runner exits a few
/// milliseconds after its run ends), then every 20 ms, and sees the exit up to a pause late.
pub fn wait_with_timeout(child: &mut Child, timeout: Duration) -> io::Result<Option<ExitStatus>> {
    let deadline = Instant::now() + timeout;
    if let Some(status) = child.try_wait()? {
        return Ok(Some(status));
    }
    // The child is not reaped yet, so its pid names it until this process waits for it.
    if let Ok(Some(handle)) = crate::platform::open_process(child.id()) {
        handle.wait_exited(timeout)?;
        return child.try_wait();
    }
    let mut pause = Duration::from_millis(1);
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(None);
        }
        std::thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}

/// What became of the runner process of a run a launcher followed to its end.
#[derive(Debug)]
pub enum RunnerExitSeen {
    /// It exited so; its `ProcessTerminalObserved` (observer `runner-parent`) is recorded, or
    /// someone else recorded the runner gone first.
    Recorded(ProcessExit),
    /// It was still running [`RUNNER_EXIT_TIMEOUT`] after the run ended: left to exit by itself
    /// (whoever sees it gone records it).
    StillRunning,
    /// Waiting for it failed.
    WaitFailed(io::Error),
    /// The launcher is not its parent (no runner was started, or it was reaped).
    NotOurs,
}

/// How following a launched run to its end came out.
#[derive(Debug)]
pub enum Followed {
    /// The run is terminal.
    Ended {
        state: RunState,
        runner: RunnerExitSeen,
    },
    /// The runner exited without recording an outcome. Its exit is recorded (as its parent),
    /// then a reconcile pass recorded the run's end; `state` is the run as the runner left it.
    RunnerDied {
        state: RunState,
        exit: ProcessExit,
        reconciled: Result<reconcile::Report, ReconcileError>,
    },
    /// Following stopped before the run ended: no runner of the launcher's own to watch, and
    /// the recorded one is gone.
    Stopped { state: RunState },
    /// `on_record` asked to stop before the run ended; the run goes on (its runner is in a
    /// session of its own), and whoever sees the runner gone records it.
    Left { state: RunState },
}

/// Follows a run just launched to its end, handing each of its records to `on_record` as it
/// lands (from the first), and records — as the runner's parent — how the runner process
/// ended: what a launcher such as `runjournal run --wait` owes the journal. `on_record` may
/// break to stop following ([`Followed::Left`]).
pub fn follow_launched(
    store: &Store,
    launched: &mut Launched,
    on_record: impl FnMut(&Record) -> ControlFlow<()>,
) -> Result<Followed, LaunchError> {
    follow_launched_looking(store, launched, || ControlFlow::Continue(()), on_record)
}

/// [`follow_launched`], calling `on_look` at every look as [`follow_looking`] does: what
/// `runjournal run --wait` shows the steps' output with.
pub fn follow_launched_looking(
    store: &Store,
    launched: &mut Launched,
    on_look: impl FnMut() -> ControlFlow<()>,
    on_record: impl FnMut(&Record) -> ControlFlow<()>,
) -> Result<Followed, LaunchError> {
    let run = launched.run;
    let mut instance_id = match &launched.start {
        RunnerStart::Started { instance_id, .. } => Some(instance_id.clone()),
        RunnerStart::NotStarted { .. }
        | RunnerStart::Queued { .. }
        | RunnerStart::Waiting { .. }
        | RunnerStart::Delayed { .. }
        | RunnerStart::Existing { .. } => None,
    };
    let (mut on_look, mut on_record) = (on_look, on_record);
    let mut after_seq = 0;
    let end = loop {
        let end = follow_looking(
            store,
            run,
            after_seq,
            launched.runner.as_mut(),
            None,
            &mut on_look,
            &mut on_record,
        )?;
        // The runner ended its attempt and the run is tried again (docs/design.md, "Retries"):
        // its exit is recorded with that attempt, and the run is followed on, its next
        // runner judged by its recorded identity (another process starts it).
        match end {
            FollowEnd::RunnerExited { state, exit }
                if instance_id
                    .as_deref()
                    .is_some_and(|instance| state.attempt_of_runner(instance).is_some()) =>
            {
                if let Some(instance_id) = instance_id.take() {
                    record_runner_exit(store, run, &instance_id, exit)
                        .map_err(|source| LaunchError::RecordExit { run, source })?;
                }
                launched.runner = None;
                after_seq = state.head_seq;
            }
            end => break end,
        }
    };
    let record_exit = |exit: ProcessExit| match &instance_id {
        Some(instance_id) => record_runner_exit(store, run, instance_id, exit)
            .map_err(|source| LaunchError::RecordExit { run, source }),
        None => Ok(()),
    };
    match end {
        FollowEnd::Terminal(state) => {
            let runner = match (launched.runner.as_mut(), &instance_id) {
                (Some(child), Some(_)) => match wait_with_timeout(child, RUNNER_EXIT_TIMEOUT) {
                    Ok(Some(status)) => {
                        let exit = ProcessExit::from(status);
                        record_exit(exit)?;
                        launched.runner = None;
                        RunnerExitSeen::Recorded(exit)
                    }
                    Ok(None) => RunnerExitSeen::StillRunning,
                    Err(error) => RunnerExitSeen::WaitFailed(error),
                },
                _ => RunnerExitSeen::NotOurs,
            };
            Ok(Followed::Ended { state, runner })
        }
        FollowEnd::RunnerExited { state, exit } => {
            record_exit(exit)?;
            launched.runner = None;
            let reconciled = reconcile::reconcile(store, &reconcile::Options::default());
            Ok(Followed::RunnerDied {
                state,
                exit,
                reconciled,
            })
        }
        FollowEnd::RunnerGone(state) | FollowEnd::TimedOut(state) => {
            Ok(Followed::Stopped { state })
        }
        FollowEnd::Left(state) => Ok(Followed::Left { state }),
    }
}

/// How waiting for a run to end came out.
#[derive(Debug)]
pub enum WaitEnd {
    /// The run is terminal.
    Ended(RunState),
    /// The deadline passed first.
    TimedOut(RunState),
    /// Its runner is gone without recording an outcome, and a reconcile pass did not end it.
    RunnerGone(RunState),
}

/// What waiting for a run did.
#[derive(Debug)]
pub struct Waited {
    pub end: WaitEnd,
    /// The reconcile pass made when the runner was found gone, if one was.
    pub reconciled: Option<Result<reconcile::Report, ReconcileError>>,
}

/// Waits until `run` is terminal or `deadline` passes (`runjournal wait`, or a host). A runner
/// found gone without recording an outcome is reconciled at once, so the wait ends with the
/// run's recorded end rather than hanging on a run that will never end by itself; read
/// through a home that is not open for writing, it is not, and the wait ends there.
pub fn wait_for_end(
    reading: &dyn ReadHome,
    run: RunId,
    deadline: Option<Instant>,
) -> Result<Waited, LaunchError> {
    let mut state = snapshot(reading, run)?;
    loop {
        let waited = wait_once(reading, run, state.head_seq, deadline)?;
        // The pass tried the run again (docs/design.md, "Retries"): its next attempt is
        // waited for too.
        match &waited.end {
            WaitEnd::RunnerGone(after)
                if waited.reconciled.is_some()
                    && after.ended_attempts() > state.ended_attempts() =>
            {
                state = after.clone();
            }
            _ => return Ok(waited),
        }
    }
}

/// One follow of [`wait_for_end`], from `head_seq`, and the reconcile pass of a runner gone.
fn wait_once(
    reading: &dyn ReadHome,
    run: RunId,
    head_seq: u64,
    deadline: Option<Instant>,
) -> Result<Waited, LaunchError> {
    let end = follow(reading, run, head_seq, None, deadline, |_| {
        ControlFlow::Continue(())
    })?;
    Ok(match end {
        FollowEnd::Terminal(state) => Waited {
            end: WaitEnd::Ended(state),
            reconciled: None,
        },
        FollowEnd::TimedOut(state) | FollowEnd::Left(state) => Waited {
            end: WaitEnd::TimedOut(state),
            reconciled: None,
        },
        FollowEnd::RunnerGone(state) | FollowEnd::RunnerExited { state, .. } => {
            let Some(store) = reading.store() else {
                return Ok(Waited {
                    end: WaitEnd::RunnerGone(state),
                    reconciled: None,
                });
            };
            let reconciled = reconcile::reconcile(store, &reconcile::Options::default());
            let state = snapshot(store, run)?;
            let end = if state.is_terminal() {
                WaitEnd::Ended(state)
            } else {
                WaitEnd::RunnerGone(state)
            };
            Waited {
                end,
                reconciled: Some(reconciled),
            }
        }
    })
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::event::{FORMAT_VERSION, StepEnd, WriterId};
    use crate::testkit as kit;

    const RUN: RunId = RunId::from_bytes([4; 16]);

    fn spec(mode: Mode, steps: usize, timeout_ms: Option<u64>) -> RunSpec {
        RunSpec {
            name: Some("nightly".to_string()),
            concurrency: 2,
            timeout_ms,
            cwd: Some("/work".to_string()),
            ..kit::spec(mode, kit::numbered(steps, &kit::sh("true")))
        }
    }

    /// A run of `spec` that started at 1 000 ms, whose steps ended as `ends` says (`None`:
    /// still running, or never started when `started` is false), then was paused at `paused_at`.
    fn paused(spec: RunSpec, ends: &[(bool, Option<StepEnd>)], paused_at: u64) -> RunState {
        let hosts = kit::hosts(Some("s"), Some("o"), Some("t"));
        let mut events = vec![
            kit::created(spec, 900, hosts),
            kit::runner_started(kit::identity(1), "i"),
        ];
        for (step, (started, end)) in ends.iter().enumerate() {
            let step = u32::try_from(step).expect("a few steps");
            if *started {
                events.push(kit::step_running(step, None));
            }
            if let Some(end) = end {
                events.push(kit::step_finished(step, *end, Some(0), None));
            }
        }
        events.push(kit::terminal(TerminalState::Paused, 130, "paused", None));
        let count = events.len();
        let mut state: Option<RunState> = None;
        for (index, event) in events.into_iter().enumerate() {
            let seq = index as u64 + 1;
            let time_ms = match seq {
                1 => 900,
                _ if index + 1 == count => paused_at,
                _ => 1_000,
            };
            let record = Record {
                format_version: FORMAT_VERSION,
                run_id: RUN,
                seq,
                time_ms,
                writer: WriterId(1),
                writer_seq: seq,
                event,
            };
            state = Some(crate::state::apply(state.as_ref(), &record).expect("a legal record"));
        }
        state.expect("a run")
    }

    #[test]
    fn a_chain_carries_on_from_its_first_step_that_did_not_complete() {
        let state = paused(
            spec(Mode::Chain, 4, Some(60_000)),
            &[
                (true, Some(StepEnd::Complete)),
                (true, None),
                (false, None),
                (false, None),
            ],
            21_000,
        );
        let plan = resume_plan(&state).expect("a plan");
        assert_eq!(plan.steps, [1, 2, 3]);
        let names: Vec<&str> = plan
            .spec
            .steps
            .iter()
            .map(|step| step.name.as_str())
            .collect();
        assert_eq!(names, ["step-1", "step-2", "step-3"]);
        // 20 s of 60 were spent between the runner's start and the pause.
        assert_eq!(plan.spec.timeout_ms, Some(40_000));
        assert_eq!(plan.spec.name.as_deref(), Some("nightly"));
        assert_eq!(plan.spec.cwd.as_deref(), Some("/work"));
        assert_eq!(plan.spec.mode, Mode::Chain);
        assert_eq!(
            plan.hosts,
            HostIds {
                session_id: Some("s".to_string()),
                completion_owner_id: Some("o".to_string()),
                tool_call_id: Some("t".to_string()),
            }
        );
    }

    #[test]
    fn a_parallel_run_carries_on_with_every_step_that_did_not_complete() {
        let state = paused(
            spec(Mode::Parallel, 4, None),
            &[
                (true, Some(StepEnd::Failed)),
                (true, Some(StepEnd::Complete)),
                (true, None),
                (false, None),
            ],
            2_000,
        );
        let plan = resume_plan(&state).expect("a plan");
        assert_eq!(plan.steps, [0, 2, 3]);
        assert_eq!(plan.spec.concurrency, 2);
        assert_eq!(plan.spec.timeout_ms, None);
    }

    #[test]
    fn a_spent_timeout_is_refused_and_a_finished_run_has_nothing_to_resume() {
        let state = paused(spec(Mode::Single, 1, Some(500)), &[(true, None)], 9_000);
        let refused = resume_plan(&state);
        assert!(
            matches!(&refused, Err(ResumeError::TimeoutSpent { run: RUN, .. })),
            "{refused:?}"
        );
        assert!(refused.expect_err("refused").is_bad_input());
        let done = paused(
            spec(Mode::Chain, 1, None),
            &[(true, Some(StepEnd::Complete))],
            2_000,
        );
        assert!(matches!(
            resume_plan(&done),
            Err(ResumeError::NothingLeft { run: RUN })
        ));
    }
}
