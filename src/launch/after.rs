//! Dependencies between runs (docs/design.md, "Dependencies"): a run created with `--after`
//! or `--after-any` waits until the runs it names have ended, then starts (or, in a queue,
//! waits for a slot); a run whose `--after` dependency ended other than `complete` ends
//! without starting, and its own dependents are judged in turn.
//!
//! Invariants:
//! * a run's wait ends only by a `DependenciesMet` that the journal accepted inside the write
//!   transaction that commits it, having read every dependency ended as asked there
//!   (`journal::write::append::check_start`, the one judge of a waiting run, which also judges
//!   its queue slot); a dependency's end never changes, so a verdict read here stays true;
//! * whoever records a run's end judges its dependents (found through the journal's
//!   dependents index, not a scan) and starts the runners of those met, as queue admission
//!   does; every reconcile pass judges every waiting run, so a crash in between costs at most
//!   one pass;
//! * a run failed for its dependency fails its own dependents in the same pass: a chain fails
//!   through at once.

use std::collections::BTreeSet;

use super::{LaunchError, Launched, RunnerProgram, RunnerStart, give_up, spawn_runner};
use crate::event::{Event, RunId, TerminalState, truncate_text};
use crate::journal::{AppendError, Condition, ReadError};
use crate::runner;
use crate::state::{DependencyVerdict as Verdict, RunState, RunStatus, TransitionError};
use crate::store::Store;

/// Most attempts to judge one run while other processes keep moving it.
const MAX_JUDGE_ATTEMPTS: u32 = 16;

/// Why judging dependencies failed. What was recorded before the failure stays.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DependencyError {
    #[error("reading the journal: {0}")]
    Read(#[from] ReadError),
    #[error("run {run}: recording how its dependencies ended: {source}")]
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
    #[error("queue {queue}: admitting the runs met: {source}")]
    Queue {
        queue: String,
        #[source]
        source: Box<super::queue::QueueError>,
    },
}

/// What judging one waiting run recorded.
#[derive(Debug, Clone, PartialEq)]
enum Judged {
    /// `DependenciesMet` is durable: the run may start (or wait for a slot).
    Met(Box<RunState>),
    /// The run is recorded failed for `dependency`.
    Failed { dependency: RunId },
    /// It still waits, or someone else moved it first.
    Unchanged,
}

/// The error of a run failed for its dependency.
fn failure_text(dependency: RunId, ended: Option<RunStatus>) -> String {
    match ended {
        Some(status) => format!("dependency {dependency} ended {status}, not complete"),
        None => format!("dependency {dependency} is no longer in the journal"),
    }
}

/// Judges `run` once and records the verdict: `DependenciesMet`, or its end without starting.
fn judge(store: &Store, run: RunId, by: &str) -> Result<Judged, DependencyError> {
    for _ in 0..MAX_JUDGE_ATTEMPTS {
        let view = store.journal().view()?;
        let Some(state) = view.snapshot(run)? else {
            return Ok(Judged::Unchanged);
        };
        let (events, failed_for) = match view.dependency_verdict(&state)? {
            None | Some(Verdict::Waiting { .. }) => return Ok(Judged::Unchanged),
            Some(Verdict::Met) => (vec![Event::DependenciesMet { by: by.to_string() }], None),
            Some(Verdict::Failed { dependency, ended }) => {
                let error = failure_text(dependency, ended);
                let terminal = Event::Terminal {
                    state: TerminalState::Failed,
                    error: Some(truncate_text(&error, crate::event::MAX_TEXT_BYTES)),
                    summary: "not started: a dependency did not complete".to_string(),
                    exit_code: runner::EXIT_FAILED,
                    repaired_by: None,
                };
                (vec![terminal], Some(dependency))
            }
        };
        drop(view);
        match store.append(run, events, Condition::expect_head(state.head_seq)) {
            Ok(appended) => {
                return Ok(match failed_for {
                    None => Judged::Met(Box::new(appended.state)),
                    Some(dependency) => Judged::Failed { dependency },
                });
            }
            // Moved by someone else since it was read (met, stopped, ended): read again.
            Err(
                AppendError::HeadMismatch { .. }
                | AppendError::AlreadyTerminal { .. }
                | AppendError::Transition {
                    source: TransitionError::DependenciesAlreadyMet { .. },
                    ..
                },
            ) => continue,
            // The journal judged the dependencies otherwise than the view read them (a
            // dependency moved since): the run is judged again by the next pass.
            Err(AppendError::Queue { .. }) => return Ok(Judged::Unchanged),
            Err(source) => {
                return Err(DependencyError::Record {
                    run,
                    source: Box::new(source),
                });
            }
        }
    }
    Ok(Judged::Unchanged)
}

/// Which waiting runs a pass judges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The runs that wait for this run (it just ended): what whoever recorded its end does.
    DependentsOf(RunId),
    /// Every run that waits for its dependencies: what a reconcile pass does.
    All,
}

/// A waiting run a pass moved.
#[derive(Debug)]
pub struct Settled {
    pub run: RunId,
    pub outcome: SettledOutcome,
}

/// What became of it.
#[derive(Debug)]
pub enum SettledOutcome {
    /// Its dependencies were met and its runner started (`Err`: it could not be, and the run
    /// is recorded failed).
    Started { runner: Result<u32, String> },
    /// Its dependencies were met; it now waits for a slot of `queue` (and was admitted if the
    /// queue had room).
    Queued { queue: String },
    /// It ended without starting, for `dependency`.
    Failed { dependency: RunId },
}

/// Judges the waiting runs `scope` names, records each verdict, and starts the runner of each
/// run met (a run of a queue takes its place there, and the queue admits what it allows); a
/// run failed for its dependency has its own dependents judged in the same pass.
pub fn settle(
    store: &Store,
    base: &RunnerProgram,
    by: &str,
    scope: Scope,
) -> Result<Vec<Settled>, DependencyError> {
    let mut work: Vec<RunId> = match scope {
        Scope::DependentsOf(run) => store.journal().view()?.dependents_of(run)?,
        Scope::All => {
            let edges = store.journal().view()?.dependency_edges()?;
            let dependents: BTreeSet<RunId> =
                edges.into_iter().map(|(_, dependent)| dependent).collect();
            dependents.into_iter().collect()
        }
    };
    let mut settled = Vec::new();
    let mut queues = BTreeSet::new();
    let mut seen = BTreeSet::new();
    while let Some(run) = work.pop() {
        if !seen.insert(run) {
            continue;
        }
        match judge(store, run, by)? {
            Judged::Unchanged => {}
            Judged::Failed { dependency } => {
                work.extend(store.journal().view()?.dependents_of(run)?);
                settled.push(Settled {
                    run,
                    outcome: SettledOutcome::Failed { dependency },
                });
            }
            Judged::Met(state) => {
                let outcome = match &state.queue {
                    Some(queue) => {
                        queues.insert(queue.name.clone());
                        SettledOutcome::Queued {
                            queue: queue.name.clone(),
                        }
                    }
                    None => SettledOutcome::Started {
                        runner: start_runner(store, &state, base)?,
                    },
                };
                settled.push(Settled { run, outcome });
            }
        }
    }
    for queue in queues {
        super::queue::start_admissible(store, base, by, Some(&queue)).map_err(|source| {
            DependencyError::Queue {
                queue: queue.clone(),
                source: Box::new(source),
            }
        })?;
    }
    let has_failed = settled
        .iter()
        .any(|settled| matches!(settled.outcome, SettledOutcome::Failed { .. }));
    if has_failed {
        // A run ended here may have completion hooks due. Best effort: a deliverer that cannot
        // start now is started by the next reconcile pass.
        let _ = crate::hooks::start_deliverer_if_needed(store, &base.program);
    }
    Ok(settled)
}

/// Starts the runner of `state`, a run whose dependencies were just met, detached; a runner
/// that cannot be started gives the run up.
fn start_runner(
    store: &Store,
    state: &RunState,
    base: &RunnerProgram,
) -> Result<Result<u32, String>, DependencyError> {
    let run = state.run_id;
    let program = super::queue::program_for(base, state);
    match spawn_runner(store.home(), run, &program) {
        Ok((child, _ready)) => {
            let pid = child.id();
            super::queue::reap_in_background(child);
            Ok(Ok(pid))
        }
        Err(error) => {
            let error = format!("cannot start the runner: {error}");
            give_up(store, run, None, error.clone(), None).map_err(|source| {
                DependencyError::Start {
                    run,
                    source: Box::new(source),
                }
            })?;
            Ok(Err(error))
        }
    }
}

/// Resolves what a launch names as its dependencies (ids, unique prefixes or names) to runs
/// in the journal. Refused, naming the text, when one names no run, a pruned one, or one
/// named twice. Nothing is written.
pub(super) fn resolve(
    store: &Store,
    after: &[String],
    after_any: &[String],
) -> Result<(Vec<RunId>, Vec<RunId>), LaunchError> {
    let view = store
        .journal()
        .view()
        .map_err(|source| LaunchError::Create(source.into()))?;
    let one = |text: &String| -> Result<RunId, LaunchError> {
        let refuse = |reason: String| LaunchError::Dependency {
            text: text.clone(),
            reason,
        };
        // As `status` resolves what it is given: an id, a unique prefix, a name (its latest
        // run) or a tool-call id.
        let run = crate::resolve::resolve_run(&view, text).map_err(|error| match error {
            crate::journal::ResolveError::Read(error) => LaunchError::Create(error.into()),
            other => refuse(other.to_string()),
        })?;
        match view.snapshot(run) {
            Ok(Some(_)) => Ok(run),
            Ok(None) => Err(refuse(format!(
                "run {run} was pruned from the journal; a run can wait only for runs the journal holds"
            ))),
            Err(error) => Err(LaunchError::Create(error.into())),
        }
    };
    let after = after.iter().map(one).collect::<Result<Vec<_>, _>>()?;
    let after_any = after_any.iter().map(one).collect::<Result<Vec<_>, _>>()?;
    if let Some(flaw) = crate::event::dependencies_flaw(&after, &after_any) {
        return Err(LaunchError::Dependency {
            text: String::new(),
            reason: format!("the runs to wait for {flaw}"),
        });
    }
    Ok((after, after_any))
}

/// After creating `run`, which waits for its dependencies: judges them at once (a dependency
/// may have ended already, or ended before the run was created), and starts it if they are met
/// — through its queue when it has one, the launcher keeping its own runner as its child —
/// or reports it waiting or failed.
pub(super) fn enter(
    store: &Store,
    run: RunId,
    program: &RunnerProgram,
    start_timeout: std::time::Duration,
) -> Result<Launched, LaunchError> {
    let failed = |error: DependencyError| LaunchError::Judge {
        run,
        source: Box::new(error),
    };
    match judge(store, run, "launcher").map_err(failed)? {
        Judged::Met(state) => match &state.queue {
            Some(queue) => {
                super::enter_queue(store, run, &queue.name.clone(), program, start_timeout)
            }
            None => {
                let program = super::queue::program_for(program, &state);
                match spawn_runner(store.home(), run, &program) {
                    Ok((child, ready)) => {
                        super::await_runner(store, run, child, ready, start_timeout)
                    }
                    Err(error) => {
                        let start = give_up(
                            store,
                            run,
                            None,
                            format!("cannot start the runner: {error}"),
                            None,
                        )?;
                        Ok(Launched {
                            run,
                            runner: None,
                            start,
                        })
                    }
                }
            }
        },
        Judged::Failed { .. } | Judged::Unchanged => {
            let view = store
                .journal()
                .view()
                .map_err(|source| LaunchError::Read { run, source })?;
            let state = view
                .snapshot(run)
                .map_err(|source| LaunchError::Read { run, source })?
                .ok_or(LaunchError::Vanished { run })?;
            if let Some(start) = super::start_of(&state) {
                return Ok(Launched {
                    run,
                    runner: None,
                    start,
                });
            }
            let pending = view
                .waiting_for(&state)
                .map_err(|source| LaunchError::Read { run, source })?;
            Ok(Launched {
                run,
                runner: None,
                start: RunnerStart::Waiting { pending },
            })
        }
    }
}

/// A launch that left its run waiting for its dependencies, as `runjournal run --json` prints
/// it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WaitingLaunchReport {
    pub run_id: String,
    /// Always `queued`: pi-subagents' own state for a run not started.
    pub state: &'static str,
    /// The runs it waits for that have yet to end.
    pub waiting_for: Vec<String>,
    pub status_path: std::path::PathBuf,
    pub result_path: std::path::PathBuf,
}

impl WaitingLaunchReport {
    pub fn of(home: &crate::home::Home, run: RunId, pending: &[RunId]) -> WaitingLaunchReport {
        WaitingLaunchReport {
            run_id: run.to_string(),
            state: "queued",
            waiting_for: pending.iter().map(RunId::to_string).collect(),
            status_path: home.status_path(run),
            result_path: home.result_path(run),
        }
    }
}
