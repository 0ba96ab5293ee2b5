//! Queues that cap how many runs are active at once (docs/design.md, "Queues"): setting a
//! queue's limit, admitting its first waiting run through the journal's conditional append,
//! and starting the runner of each run admitted.
//!
//! Invariants:
//! * a run takes a slot only by a `QueueAdmitted` that the journal accepted inside the write
//!   transaction that commits it, against its queue indexes: whoever admits (a launcher, an
//!   ending runner, a reconcile pass, a host), two cannot take the same last slot;
//! * a runner is started only for a run whose admission is durable, by the process whose
//!   append admitted it; should that process die before the runner takes the run, the
//!   reconciler fails the run "runner never started" once the start grace, counted from the
//!   admission, has passed, and its slot frees;
//! * admitting costs the same however many runs wait: it reads the first waiting entry of the
//!   queue's index and counts its active ones.

use std::process::Child;

use super::{LaunchError, RunnerProgram, give_up, spawn_runner};
use crate::event::{Event, QueueNameError, RunId, check_queue_name};
use crate::journal::{AppendError, Condition, QueueRefusal, QueueUsage, ReadError};
use crate::state::{RunState, TransitionError};
use crate::store::{ReadHome, Store};

/// Most attempts to admit a queue's first run while other processes keep admitting or ending
/// it first.
pub const MAX_ADMIT_ATTEMPTS: u32 = 64;

/// Why a queue operation failed. Nothing was admitted unless it says so.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QueueError {
    #[error(transparent)]
    Name(#[from] QueueNameError),
    #[error("reading the journal: {0}")]
    Read(#[from] ReadError),
    #[error("setting queue {queue}'s limit: {source}")]
    SetLimit {
        queue: String,
        #[source]
        source: Box<AppendError>,
    },
    #[error("run {run}: admitting it: {source}")]
    Admit {
        run: RunId,
        #[source]
        source: Box<AppendError>,
    },
    #[error("queue {queue}: its first run kept changing over {MAX_ADMIT_ATTEMPTS} attempts")]
    KeptMoving { queue: String },
    #[error("run {run}: starting its runner: {source}")]
    Start {
        run: RunId,
        #[source]
        source: Box<LaunchError>,
    },
}

/// Sets `queue`'s limit of active runs. Durable on return; the runs it now allows are started
/// by the next admission ([`start_admissible`]).
pub fn set_limit(store: &Store, queue: &str, max_active: u64) -> Result<(), QueueError> {
    check_queue_name(queue)?;
    store
        .journal()
        .set_queue_limit(queue, max_active)
        .map_err(|source| QueueError::SetLimit {
            queue: queue.to_string(),
            source: Box::new(source),
        })
}

/// A queue's limit and use, and its first waiting runs (at most `first`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueView {
    pub usage: QueueUsage,
    pub active: Vec<RunId>,
    pub first_waiting: Vec<RunId>,
}

/// `queue` as the journal holds it now.
pub fn view(home: &dyn ReadHome, queue: &str, first: usize) -> Result<QueueView, QueueError> {
    check_queue_name(queue)?;
    let view = home.view()?;
    Ok(QueueView {
        usage: view.queue_usage(queue)?,
        active: view.queue_active(queue)?,
        first_waiting: view.queue_waiting(queue, first)?,
    })
}

/// A waiting run's place in its queue (1: next to be admitted), or `None` when it does not
/// wait. Reads the queue's waiting entries up to the run: for showing, never on an
/// admission's path.
pub fn place_of(home: &dyn ReadHome, state: &RunState) -> Result<Option<u64>, QueueError> {
    let Some(queue) = state.queue.as_ref().filter(|_| state.is_waiting_for_slot()) else {
        return Ok(None);
    };
    let view = home.view()?;
    let waiting = view.queue_waiting(&queue.name, usize::MAX)?;
    Ok(waiting
        .iter()
        .position(|run| *run == state.run_id)
        .map(|index| index as u64 + 1))
}

/// Admits `queue`'s first waiting run if the queue has a free slot: one conditional append
/// of `QueueAdmitted`, which the journal accepts only while fewer runs of the queue are active
/// than its limit and only for its first waiting run. `Ok(None)` when the queue is full or
/// nobody waits. `by` is recorded as who admitted it.
pub fn admit_next(store: &Store, queue: &str, by: &str) -> Result<Option<RunState>, QueueError> {
    for _ in 0..MAX_ADMIT_ATTEMPTS {
        let first = {
            let view = store.journal().view()?;
            match view.queue_waiting(queue, 1)?.first() {
                Some(first) => *first,
                None => return Ok(None),
            }
        };
        let event = Event::QueueAdmitted { by: by.to_string() };
        match store.append(first, vec![event], Condition::expect_not_terminal()) {
            Ok(appended) => return Ok(Some(appended.state)),
            Err(AppendError::Queue {
                refusal: QueueRefusal::Full { .. } | QueueRefusal::NoSuchQueue { .. },
                ..
            }) => return Ok(None),
            // Someone admitted, stopped or ended the first run since we read it: read again.
            Err(
                AppendError::Queue {
                    refusal: QueueRefusal::NotFirst { .. },
                    ..
                }
                | AppendError::AlreadyTerminal { .. }
                | AppendError::Transition {
                    source: TransitionError::AlreadyAdmitted { .. },
                    ..
                },
            ) => continue,
            Err(source) => {
                return Err(QueueError::Admit {
                    run: first,
                    source: Box::new(source),
                });
            }
        }
    }
    Err(QueueError::KeptMoving {
        queue: queue.to_string(),
    })
}

/// The program that starts `state`'s runner: `base`, with the runner settings its launcher
/// kept in its `QueueJoined`, its `DependsOn` or its `StartDelayed`.
pub fn program_for(base: &RunnerProgram, state: &RunState) -> RunnerProgram {
    let mut program = base.clone();
    let (idle_timeout_ms, heartbeat_ms) = state.kept_runner_settings();
    if let Some(heartbeat_ms) = heartbeat_ms {
        program.leading_args.push("--heartbeat".into());
        program
            .leading_args
            .push(format!("{heartbeat_ms}ms").into());
    }
    if let Some(idle_timeout_ms) = idle_timeout_ms {
        program.leading_args.push("--idle-timeout".into());
        program
            .leading_args
            .push(format!("{idle_timeout_ms}ms").into());
    }
    program
}

/// A run admitted and its runner started (or not: then the run is recorded failed, and its
/// slot is free again).
#[derive(Debug)]
pub struct Admitted {
    pub run: RunId,
    pub queue: String,
    /// The runner's pid; `Err` says why it could not be started.
    pub runner: Result<u32, String>,
}

/// Starts `state`'s runner detached, its process reaped by a thread of this process. A runner
/// that cannot be started gives the run up at once (`Terminal` failed, not started), so its
/// slot frees.
fn start_runner(
    store: &Store,
    state: &RunState,
    base: &RunnerProgram,
) -> Result<Result<Child, String>, LaunchError> {
    let run = state.run_id;
    match spawn_runner(store.home(), run, &program_for(base, state)) {
        Ok((child, _ready)) => Ok(Ok(child)),
        Err(error) => {
            let error = format!("cannot start the runner: {error}");
            give_up(store, run, None, error.clone(), None)?;
            Ok(Err(error))
        }
    }
}

/// [`start_runner`], its child reaped on a thread of this process: the runner's pid, or why
/// it could not be started (the run is then recorded failed).
pub(super) fn start_runner_detached(
    store: &Store,
    state: &RunState,
    base: &RunnerProgram,
) -> Result<Result<u32, String>, LaunchError> {
    Ok(start_runner(store, state, base)?.map(|child| {
        let pid = child.id();
        reap_in_background(child);
        pid
    }))
}

/// Reaps `child` on a thread of its own, so a long-lived process that started it keeps no
/// zombie; a process that exits first leaves it to init.
pub(super) fn reap_in_background(mut child: Child) {
    let spawned = std::thread::Builder::new()
        .name("runjournal-reap".to_string())
        .spawn(move || {
            let _ = child.wait();
        });
    // Without a thread, the child stays a zombie until this process exits: harmless.
    drop(spawned);
}

/// Admits what every queue's limit allows, first in first, and starts the runner of each run
/// admitted: what an ending runner does as its last act and what follows every reconcile
/// pass, so no queue keeps a free slot while a run waits. With `only`, just that queue.
pub fn start_admissible(
    store: &Store,
    base: &RunnerProgram,
    by: &str,
    only: Option<&str>,
) -> Result<Vec<Admitted>, QueueError> {
    let queues: Vec<String> = match only {
        Some(queue) => vec![queue.to_string()],
        None => queue_names(&store.journal().view()?)?,
    };
    start_admissible_in(store, base, by, &queues)
}

/// The names of the queues that have a limit, as `view` holds them.
pub fn queue_names(view: &crate::journal::View) -> Result<Vec<String>, ReadError> {
    Ok(view
        .queue_limits()?
        .into_iter()
        .map(|(name, _)| name)
        .collect())
}

/// [`start_admissible`] over `queues`, in order.
pub fn start_admissible_in(
    store: &Store,
    base: &RunnerProgram,
    by: &str,
    queues: &[String],
) -> Result<Vec<Admitted>, QueueError> {
    let mut admitted = Vec::new();
    for queue in queues {
        while let Some(state) = admit_next(store, queue, by)? {
            let run = state.run_id;
            let runner =
                match start_runner(store, &state, base).map_err(|source| QueueError::Start {
                    run,
                    source: Box::new(source),
                })? {
                    Ok(child) => {
                        let pid = child.id();
                        reap_in_background(child);
                        Ok(pid)
                    }
                    Err(error) => Err(error),
                };
            admitted.push(Admitted {
                run,
                queue: queue.clone(),
                runner,
            });
        }
    }
    Ok(admitted)
}

/// How a launch into a queue went before the launcher waits for its own run's runner.
pub(super) enum Entered {
    /// The run was admitted at once and its runner started: the launcher waits for it as for
    /// any run.
    Started {
        child: Child,
        ready: Option<std::fs::File>,
    },
    /// The runner could not be started; the run is recorded failed.
    NotStarted { error: String },
    /// The queue is full: the run waits.
    Waiting,
}

/// After creating `run` in `queue`: admits what the queue allows, first in first (runs ahead
/// of it first), starting each runner; the launcher's own run keeps its runner as its child
/// for the handshake.
pub(super) fn enter(
    store: &Store,
    run: RunId,
    queue: &str,
    base: &RunnerProgram,
) -> Result<Entered, LaunchError> {
    let admit_failed = |error: QueueError| LaunchError::Queue {
        run,
        source: Box::new(error),
    };
    while let Some(state) = admit_next(store, queue, "launcher").map_err(admit_failed)? {
        if state.run_id == run {
            return match spawn_runner(store.home(), run, &program_for(base, &state)) {
                Ok((child, ready)) => Ok(Entered::Started { child, ready }),
                Err(error) => {
                    let error = format!("cannot start the runner: {error}");
                    give_up(store, run, None, error.clone(), None)?;
                    Ok(Entered::NotStarted { error })
                }
            };
        }
        if let Ok(child) = start_runner(store, &state, base)? {
            reap_in_background(child);
        }
    }
    Ok(Entered::Waiting)
}

/// A queue as `runjournal queue NAME --json` prints it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueReport {
    pub name: String,
    /// `None`: no limit was set, so no run can join it.
    pub max_active: Option<u64>,
    pub active: u64,
    pub waiting: u64,
    /// The runs holding a slot.
    pub active_runs: Vec<String>,
    /// The first runs waiting, first in first.
    pub first_waiting: Vec<String>,
}

impl QueueReport {
    /// The report of a queue's view.
    pub fn of(view: &QueueView) -> QueueReport {
        QueueReport {
            name: view.usage.name.clone(),
            max_active: view.usage.max_active,
            active: view.usage.active,
            waiting: view.usage.waiting,
            active_runs: view.active.iter().map(RunId::to_string).collect(),
            first_waiting: view.first_waiting.iter().map(RunId::to_string).collect(),
        }
    }
}

/// A launch that left its run waiting in its queue, as `runjournal run --json` prints it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QueuedLaunchReport {
    pub run_id: String,
    /// Always `queued`.
    pub state: &'static str,
    pub queue: String,
    pub place: Option<u64>,
    pub active: u64,
    pub max_active: Option<u64>,
    pub waiting: u64,
    pub status_path: std::path::PathBuf,
    pub result_path: std::path::PathBuf,
}

/// The words of a queue's use: `3/4 active, 12 queued`. A queue whose limit is 0 is said to
/// be held, and how to let it go: otherwise its runs would wait without a word of why.
pub fn usage_text(usage: &QueueUsage) -> String {
    let limit = usage
        .max_active
        .map_or_else(|| "no limit".to_string(), |max| max.to_string());
    let text = format!("{}/{limit} active, {} queued", usage.active, usage.waiting);
    if usage.max_active == Some(0) {
        return format!(
            "{text}; held: a limit of 0 starts no run until `runjournal queue {} --max-active N` raises it",
            usage.name
        );
    }
    text
}

/// A queue's limit and use, as `journal-tools inspect stats --json` lists each queue.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueUsageReport {
    pub name: String,
    pub max_active: Option<u64>,
    pub active: u64,
    pub waiting: u64,
}

impl QueueUsageReport {
    pub fn of(usage: &QueueUsage) -> QueueUsageReport {
        QueueUsageReport {
            name: usage.name.clone(),
            max_active: usage.max_active,
            active: usage.active,
            waiting: usage.waiting,
        }
    }
}
