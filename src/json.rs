//! The JSON the binaries print with `--json`: one typed document per kind, so that the keys are
//! written once and follow one convention. Keys are camelCase; a run's id is `runId`; a moment
//! is milliseconds since the Unix epoch under a key ending in `Ms` (`createdAtMs`), a span of
//! time is milliseconds under a key ending in `Ms` too (`keepForMs`), a size is bytes under a
//! key ending in `Bytes` or named `bytes`. (The projections — status.json, results — keep the
//! names pi-subagents reads, and are not these documents.) `journal-tools` prints each as one
//! JSON Lines object with a `"type"` put first.
//!
//! Invariant: pure; each document is built from what the library already read.

use std::path::Path;

use serde::Serialize;
use serde_json::{Map, Value};

use crate::capacity::{BlockCause, CapacityStatus};
use crate::event::{Record, RunId, UnixMs};
use crate::home::Home;
use crate::journal::{KeepFree, Retention, Tombstone};
use crate::reconcile::Outcome;
use crate::retention::{Chosen, Kept, PassReport};
use crate::show;
use crate::state::{RunState, RunStatus};

/// One record of a journal: `inspect events`, `inspect run`, and the fleet's.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RecordDoc {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub global_seq: Option<u64>,
    pub run_id: String,
    pub seq: u64,
    pub time_ms: UnixMs,
    pub writer: String,
    pub writer_seq: u64,
    pub event: &'static str,
    pub fields: Map<String, Value>,
}

impl RecordDoc {
    pub fn of(global_seq: Option<u64>, record: &Record) -> RecordDoc {
        RecordDoc {
            global_seq,
            run_id: record.run_id.to_string(),
            seq: record.seq,
            time_ms: record.time_ms,
            writer: record.writer.to_string(),
            writer_seq: record.writer_seq,
            event: record.event.name(),
            fields: show::event_fields(&record.event),
        }
    }
}

/// A run as `journal-tools inspect runs` lists it.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunDoc {
    pub run_id: String,
    pub name: Option<String>,
    pub state: &'static str,
    pub closed: bool,
    pub stale: bool,
    pub dismissed: bool,
    pub steps_done: usize,
    pub steps_total: usize,
    pub created_at_ms: UnixMs,
    pub ended_at_ms: Option<UnixMs>,
    pub head_seq: u64,
    pub runner_pid: Option<u32>,
    /// `alive`, `dead` … as [`show::RunnerSeen`] says; absent when no runner was recorded.
    pub runner_alive: Option<&'static str>,
}

impl RunDoc {
    /// Looks at the run's runner (see [`show::look_at_runner`]).
    pub fn of(state: &RunState) -> RunDoc {
        RunDoc {
            run_id: state.run_id.to_string(),
            name: state.spec.name.clone(),
            state: state.status.as_str(),
            closed: state.is_closed(),
            stale: state.is_stale(),
            dismissed: state.dismissed_at_ms.is_some(),
            steps_done: state.steps_done(),
            steps_total: state.steps.len(),
            created_at_ms: state.created_at_ms,
            ended_at_ms: state.ended_at_ms(),
            head_seq: state.head_seq,
            runner_pid: state.runner.as_ref().map(|runner| runner.identity.pid),
            runner_alive: show::look_at_runner(state).map(show::RunnerSeen::as_str),
        }
    }
}

/// A run as `runjournal list --json` lists it: in the journal, or pruned from it.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum ListedDoc {
    Run(ListedRunDoc),
    Pruned(PrunedRunDoc),
}

/// A run of the journal in `runjournal list --json`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ListedRunDoc {
    pub run_id: String,
    pub name: Option<String>,
    pub state: &'static str,
    pub mode: &'static str,
    pub steps: usize,
    pub steps_done: usize,
    pub created_at_ms: UnixMs,
    pub ended_at_ms: Option<UnixMs>,
    pub exit_code: Option<i32>,
    pub error: Option<String>,
    pub dismissed: bool,
    pub session_id: Option<String>,
    pub tool_call_id: Option<String>,
    /// The queue the run is in, and its place there while it waits (1: the next admitted).
    pub queue: Option<String>,
    pub queue_place: Option<u64>,
    /// The runs it waits for that have yet to end (empty: it waits for none).
    pub waiting_for: Vec<String>,
    /// When a delayed run may start (`run --at`, `--delay`), or a retried one's next attempt.
    pub due_at_ms: Option<UnixMs>,
    /// The attempt a run with retries is on, and how many it may have.
    pub attempt: Option<u32>,
    pub max_attempts: Option<u32>,
}

impl ListedRunDoc {
    /// `queue_place`: the run's place in its queue while it waits.
    pub fn of(state: &RunState, queue_place: Option<u64>, waiting_for: &[RunId]) -> ListedRunDoc {
        let terminal = state.terminal.as_ref();
        ListedRunDoc {
            queue: state.queue.as_ref().map(|queue| queue.name.clone()),
            queue_place,
            waiting_for: waiting_for.iter().map(RunId::to_string).collect(),
            due_at_ms: state.delay.as_ref().map(|delay| delay.due_at_ms),
            attempt: state
                .retry
                .as_ref()
                .map(crate::state::RetryInfo::current_attempt),
            max_attempts: state
                .retry
                .as_ref()
                .map(|retry| retry.retries.saturating_add(1)),
            run_id: state.run_id.to_string(),
            name: state.spec.name.clone(),
            state: state.status.as_str(),
            mode: state.spec.mode.as_str(),
            steps: state.steps.len(),
            steps_done: state.steps_done(),
            created_at_ms: state.created_at_ms,
            ended_at_ms: state.ended_at_ms(),
            exit_code: terminal.map(|terminal| terminal.exit_code),
            error: terminal.and_then(|terminal| terminal.error.clone()),
            dismissed: state.dismissed_at_ms.is_some(),
            session_id: state.session_id.clone(),
            tool_call_id: state.tool_call_id.clone(),
        }
    }
}

/// What is left of a pruned run: `status --json` of it, and its entry in `list --all --json`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PrunedRunDoc {
    pub run_id: String,
    pub name: Option<String>,
    pub state: &'static str,
    /// Always true: tells a pruned entry from a run's.
    pub pruned: bool,
    pub pruned_at_ms: UnixMs,
    pub created_at_ms: UnixMs,
    pub ended_at_ms: UnixMs,
    pub exit_code: i32,
    pub session_id: Option<String>,
    pub tool_call_id: Option<String>,
}

impl PrunedRunDoc {
    pub fn of(tombstone: &Tombstone) -> PrunedRunDoc {
        PrunedRunDoc {
            run_id: tombstone.run_id.to_string(),
            name: tombstone.name.clone(),
            state: RunStatus::from(tombstone.state).as_str(),
            pruned: true,
            pruned_at_ms: tombstone.pruned_at_ms,
            created_at_ms: tombstone.created_at_ms,
            ended_at_ms: tombstone.ended_at_ms,
            exit_code: tombstone.exit_code,
            session_id: tombstone.session_id.clone(),
            tool_call_id: tombstone.tool_call_id.clone(),
        }
    }
}

/// A journal writer blocked on storage, as `status --json` and `inspect stats` show it.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BlockedDoc {
    pub pid: u32,
    pub since_ms: UnixMs,
    pub cause: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub errno: Option<i32>,
}

/// The writers blocked on storage.
pub fn blocked_docs(status: &CapacityStatus) -> Vec<BlockedDoc> {
    status
        .blocked
        .iter()
        .map(|blocked| BlockedDoc {
            pid: blocked.writer.pid,
            since_ms: blocked.since_ms,
            cause: blocked.cause.as_str(),
            errno: match blocked.cause {
                BlockCause::Io { errno } => Some(errno),
                _ => None,
            },
        })
        .collect()
}

/// The capacity state of a home as `status --json` shows it beside the run.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase", untagged)]
pub enum CapacityDoc {
    Read {
        #[serde(rename = "blockedSinceMs")]
        blocked_since_ms: Option<UnixMs>,
        #[serde(rename = "blockedWriters")]
        blocked_writers: usize,
        blocked: Vec<BlockedDoc>,
        #[serde(rename = "hasReserve")]
        has_reserve: bool,
    },
    Unread {
        error: String,
    },
}

impl CapacityDoc {
    /// Reads the home's capacity state.
    pub fn of(home: &Home) -> CapacityDoc {
        match crate::capacity::read_status(home) {
            Ok(status) => CapacityDoc::Read {
                blocked_since_ms: status.blocked_since_ms(),
                blocked_writers: status.blocked.len(),
                blocked: blocked_docs(&status),
                has_reserve: status.has_reserve,
            },
            Err(error) => CapacityDoc::Unread {
                error: error.to_string(),
            },
        }
    }
}

/// `runjournal status --json`: the run's status.json document as it is now, and beside it (as
/// readers of that format ignore fields they do not know) the journal's capacity, the running
/// steps' resources and shipping's lag.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusCommandDoc {
    #[serde(flatten)]
    pub status: crate::projection::documents::StatusDoc,
    pub journal_capacity: CapacityDoc,
    pub resources: Option<Vec<show::StepResources>>,
    pub shipping: Option<crate::ship::state::Lag>,
    /// The run's queue: its place while it waits, and the queue's use.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_use: Option<QueueUseDoc>,
    /// The environment its launcher gave it: its size, cwd and umask; the variables only when
    /// asked (`--show-env`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub environment: Option<EnvironmentDoc>,
    /// Its completion hooks and their deliveries.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<crate::hooks::HookReport>,
    /// The runs it waits for, when it was created with some.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dependencies: Option<DependenciesDoc>,
    /// Its delayed start, when it was created with one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delay: Option<DelayDoc>,
}

/// A run's dependencies as `status` shows them (docs/design.md, "Dependencies").
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DependenciesDoc {
    /// Each must end `complete`.
    pub after: Vec<String>,
    /// Each must end, however.
    pub after_any: Vec<String>,
    /// Those it still waits for (not yet ended); empty once it waits no more.
    pub waiting_for: Vec<String>,
    /// When they were found met; `None` while it waits, or when it ended without them met.
    pub met_at_ms: Option<UnixMs>,
}

impl DependenciesDoc {
    /// `waiting_for`: the runs it still waits for ([`crate::journal::View::waiting_for`]).
    pub fn of(state: &RunState, waiting_for: &[RunId]) -> Option<DependenciesDoc> {
        let dependencies = state.dependencies.as_ref()?;
        let texts = |runs: &[RunId]| runs.iter().map(RunId::to_string).collect();
        Some(DependenciesDoc {
            after: texts(&dependencies.after),
            after_any: texts(&dependencies.after_any),
            waiting_for: texts(waiting_for),
            met_at_ms: dependencies.met.as_ref().map(|met| met.at_ms),
        })
    }
}

/// A run's delayed start (`run --at`, `--delay`), as `status --json` shows it.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DelayDoc {
    pub due_at_ms: UnixMs,
    /// When its delay ended and its runner was started, and by whom; `None` while it waits.
    pub started_at_ms: Option<UnixMs>,
    pub started_by: Option<String>,
}

impl DelayDoc {
    pub fn of(state: &RunState) -> Option<DelayDoc> {
        let delay = state.delay.as_ref()?;
        Some(DelayDoc {
            due_at_ms: delay.due_at_ms,
            started_at_ms: delay.ended.as_ref().map(|ended| ended.at_ms),
            started_by: delay.ended.as_ref().map(|ended| ended.by.clone()),
        })
    }
}

/// The environment a run keeps, as `status` shows it: the variables (secrets) only when asked.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EnvironmentDoc {
    pub variables: usize,
    pub bytes: usize,
    pub cwd: Option<String>,
    /// Octal, as `umask` prints it.
    pub umask: Option<String>,
    /// The variables, by name (not UTF-8: with U+FFFD in place of what is not); only with
    /// `--show-env`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub values: Option<Vec<EnvVarDoc>>,
}

/// One variable of a run's kept environment.
#[derive(Debug, Clone, Serialize)]
pub struct EnvVarDoc {
    pub name: String,
    pub value: String,
}

impl EnvironmentDoc {
    pub fn of(environment: &crate::run_env::RunEnvironment, show_values: bool) -> EnvironmentDoc {
        EnvironmentDoc {
            variables: environment.vars.len(),
            bytes: environment.bytes(),
            cwd: environment.cwd_path().map(|cwd| cwd.display().to_string()),
            umask: environment.umask.map(|umask| format!("{umask:04o}")),
            values: show_values.then(|| {
                environment
                    .vars
                    .iter()
                    .map(|(name, value)| EnvVarDoc {
                        name: String::from_utf8_lossy(name).into_owned(),
                        value: String::from_utf8_lossy(value).into_owned(),
                    })
                    .collect()
            }),
        }
    }
}

/// A run's queue as `status` shows it: its place while it waits, and the queue's use.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueUseDoc {
    pub queue: String,
    /// 1: the next to be admitted; `None` once admitted (or ended).
    pub place: Option<u64>,
    pub active: u64,
    pub max_active: Option<u64>,
    pub waiting: u64,
    #[serde(skip)]
    usage: crate::journal::QueueUsage,
}

impl QueueUseDoc {
    /// Reads the run's queue; `None` for a run in no queue.
    pub fn of(
        store: &dyn crate::store::ReadHome,
        state: &RunState,
    ) -> Result<Option<QueueUseDoc>, crate::launch::queue::QueueError> {
        let Some(queue) = &state.queue else {
            return Ok(None);
        };
        let place = crate::launch::queue::place_of(store, state)?;
        let usage = crate::launch::queue::view(store, &queue.name, 0)?.usage;
        Ok(Some(QueueUseDoc {
            queue: queue.name.clone(),
            place,
            active: usage.active,
            max_active: usage.max_active,
            waiting: usage.waiting,
            usage,
        }))
    }

    /// `gpu: place 2; 3/4 active, 12 queued`.
    pub fn line(&self) -> String {
        let place = self
            .place
            .map_or_else(String::new, |place| format!("place {place}; "));
        format!(
            "{}: {place}{}",
            self.queue,
            crate::launch::queue::usage_text(&self.usage)
        )
    }
}

/// What `runjournal run --json` prints once the runner took the run (or failed to).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LaunchedDoc {
    pub run_id: String,
    /// `running`, or `failed` when no runner took the run.
    pub state: &'static str,
    pub runner_pid: Option<u32>,
    pub error: Option<String>,
    pub status_path: String,
    pub result_path: String,
}

impl LaunchedDoc {
    /// `runner` is the runner's pid, or why no runner took the run.
    pub fn of(home: &Home, run: RunId, runner: Result<u32, String>) -> LaunchedDoc {
        let (state, runner_pid, error) = match runner {
            Ok(pid) => ("running", Some(pid), None),
            Err(error) => ("failed", None, Some(error)),
        };
        LaunchedDoc {
            run_id: run.to_string(),
            state,
            runner_pid,
            error,
            status_path: path_text(&home.status_path(run)),
            result_path: path_text(&home.result_path(run)),
        }
    }
}

/// What `runjournal run --json` prints when another run held the launch's key (docs/design.md,
/// "Launched once"): that run, and that nothing was created.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ExistingLaunchDoc {
    pub run_id: String,
    /// Always `true`: the run existed before this launch.
    pub existing: bool,
    pub unique_key: String,
    /// The run's state as the journal stands (`None`: it left the journal since).
    pub state: Option<&'static str>,
    pub status_path: String,
    pub result_path: String,
}

impl ExistingLaunchDoc {
    pub fn of(
        home: &Home,
        run: RunId,
        key: &str,
        state: Option<&'static str>,
    ) -> ExistingLaunchDoc {
        ExistingLaunchDoc {
            run_id: run.to_string(),
            existing: true,
            unique_key: key.to_string(),
            state,
            status_path: path_text(&home.status_path(run)),
            result_path: path_text(&home.result_path(run)),
        }
    }
}

/// What `runjournal run --wait --json` prints once the run ended.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EndedDoc {
    pub run_id: String,
    pub state: &'static str,
    pub exit_code: Option<i32>,
    pub error: Option<String>,
    pub status_path: String,
    pub result_path: String,
}

impl EndedDoc {
    pub fn of(home: &Home, state: &RunState) -> EndedDoc {
        let run = state.run_id;
        let terminal = state.terminal.as_ref();
        EndedDoc {
            run_id: run.to_string(),
            state: state.status.as_str(),
            exit_code: terminal.map(|terminal| terminal.exit_code),
            error: terminal.and_then(|terminal| terminal.error.clone()),
            status_path: path_text(&home.status_path(run)),
            result_path: path_text(&home.result_path(run)),
        }
    }
}

fn path_text(path: &Path) -> String {
    path.display().to_string()
}

/// One line of `runjournal reconcile --json`, each with its `type`.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum ReconcileLine {
    /// What the pass decided for a run.
    #[serde(rename_all = "camelCase")]
    Run {
        run_id: String,
        /// The reconciler's table row that matched.
        row: &'static str,
        action: &'static str,
        appended: Vec<&'static str>,
        reprojected: bool,
        reason: Option<String>,
        note: Option<String>,
        error: Option<String>,
    },
    /// A run the admissions that follow it admitted from its queue.
    #[serde(rename_all = "camelCase")]
    Admitted {
        run_id: String,
        queue: String,
        runner_pid: Option<u32>,
        /// Why its runner did not start (the run is then recorded failed).
        error: Option<String>,
    },
    /// A delayed run the pass started once due.
    #[serde(rename_all = "camelCase")]
    Due {
        run_id: String,
        due_at_ms: UnixMs,
        runner_pid: Option<u32>,
        /// Why its runner did not start (the run is then recorded failed).
        error: Option<String>,
    },
    /// A run waiting for other runs that the pass judged: its dependencies met (its runner
    /// started, or it took its place in its queue), or ended without starting for one that
    /// did not complete.
    #[serde(rename_all = "camelCase")]
    Judged {
        run_id: String,
        /// `started`, `queued` or `failed`.
        verdict: &'static str,
        /// The dependency a run failed for.
        dependency: Option<String>,
        /// The queue a run met waits in.
        queue: Option<String>,
        runner_pid: Option<u32>,
        /// Why its runner did not start (the run is then recorded failed).
        error: Option<String>,
    },
    /// A run the retention pass that follows it pruned.
    Pruned(PrunedDoc),
    /// The pass's counts: the last line.
    #[serde(rename_all = "camelCase")]
    Summary {
        active: usize,
        changed: usize,
        pruned: usize,
        errors: usize,
    },
}

/// The text of a line of `runjournal reconcile`: what `--json` says, in words.
impl std::fmt::Display for ReconcileLine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReconcileLine::Run { .. } => write!(f, "{}", self.run_text()),
            ReconcileLine::Admitted {
                run_id,
                queue,
                runner_pid,
                error,
            } => match (runner_pid, error) {
                (Some(pid), _) => {
                    write!(f, "{run_id}  admitted by queue {queue}  runner pid {pid}")
                }
                (None, error) => write!(
                    f,
                    "{run_id}  admitted by queue {queue}  its runner did not start: {}",
                    show::escape_control(error.as_deref().unwrap_or("unknown"))
                ),
            },
            ReconcileLine::Due {
                run_id,
                due_at_ms,
                runner_pid,
                error,
            } => {
                let due = crate::duration::format_time_s(*due_at_ms);
                match (runner_pid, error) {
                    (Some(pid), _) => write!(f, "{run_id}  due at {due}  runner pid {pid}"),
                    (None, error) => write!(
                        f,
                        "{run_id}  due at {due}  its runner did not start: {}",
                        show::escape_control(error.as_deref().unwrap_or("unknown"))
                    ),
                }
            }
            ReconcileLine::Judged {
                run_id,
                dependency,
                queue,
                runner_pid,
                error,
                ..
            } => match (dependency, queue, runner_pid) {
                (Some(dependency), _, _) => write!(
                    f,
                    "{run_id}  failed without starting: its dependency {dependency} did not complete"
                ),
                (None, Some(queue), _) => {
                    write!(f, "{run_id}  dependencies met  waits in queue {queue}")
                }
                (None, None, Some(pid)) => {
                    write!(f, "{run_id}  dependencies met  runner pid {pid}")
                }
                (None, None, None) => write!(
                    f,
                    "{run_id}  dependencies met  its runner did not start: {}",
                    show::escape_control(error.as_deref().unwrap_or("unknown"))
                ),
            },
            ReconcileLine::Pruned(pruned) => write!(f, "{}", pruned.line("pruned")),
            ReconcileLine::Summary {
                active,
                changed,
                pruned,
                errors,
            } => write!(
                f,
                "{active} active run(s), {changed} changed, {pruned} pruned, {errors} error(s)"
            ),
        }
    }
}

impl ReconcileLine {
    /// The line of a waiting run a pass judged.
    pub fn judged(settled: &crate::launch::after::Settled) -> ReconcileLine {
        use crate::launch::after::SettledOutcome;
        let (verdict, dependency, queue, runner) = match &settled.outcome {
            SettledOutcome::Started { runner } => ("started", None, None, Some(runner)),
            SettledOutcome::Queued { queue } => ("queued", None, Some(queue.clone()), None),
            SettledOutcome::Failed { dependency } => {
                ("failed", Some(dependency.to_string()), None, None)
            }
        };
        ReconcileLine::Judged {
            run_id: settled.run.to_string(),
            verdict,
            dependency,
            queue,
            runner_pid: runner.and_then(|runner| runner.as_ref().ok().copied()),
            error: runner.and_then(|runner| runner.as_ref().err().cloned()),
        }
    }

    /// The line of a delayed run a pass started.
    pub fn due(started: &crate::launch::delay::DueStarted) -> ReconcileLine {
        ReconcileLine::Due {
            run_id: started.run.to_string(),
            due_at_ms: started.due_at_ms,
            runner_pid: started.runner.as_ref().ok().copied(),
            error: started.runner.as_ref().err().cloned(),
        }
    }

    /// The words of a [`ReconcileLine::Run`] (empty for any other line).
    fn run_text(&self) -> String {
        let ReconcileLine::Run {
            run_id,
            row,
            appended,
            reprojected,
            reason,
            note,
            error,
            action,
        } = self
        else {
            return String::new();
        };
        let mut line = format!("{run_id}  {row}");
        if !appended.is_empty() {
            line.push_str(&format!("  recorded {}", appended.join(" + ")));
        } else if *action != crate::reconcile::Action::Nothing.as_str() {
            line.push_str("  (someone else acted first)");
        }
        if *reprojected && appended.is_empty() {
            line.push_str("  projection rebuilt");
        }
        if let Some(reason) = reason {
            line.push_str(&format!("  reason: {reason}"));
        }
        if let Some(note) = note {
            line.push_str(&format!("  note: {note}"));
        }
        if let Some(error) = error {
            line.push_str(&format!("  error: {error}"));
        }
        show::escape_control(&line).into_owned()
    }

    /// The line of a run a pass admitted.
    pub fn admitted(admitted: &crate::launch::queue::Admitted) -> ReconcileLine {
        ReconcileLine::Admitted {
            run_id: admitted.run.to_string(),
            queue: admitted.queue.clone(),
            runner_pid: admitted.runner.as_ref().ok().copied(),
            error: admitted.runner.as_ref().err().cloned(),
        }
    }

    /// The line of what a pass decided for a run.
    pub fn of(outcome: &Outcome) -> ReconcileLine {
        ReconcileLine::Run {
            run_id: outcome.run.to_string(),
            row: outcome.row,
            action: outcome.action.as_str(),
            appended: outcome.appended.clone(),
            reprojected: outcome.reprojected,
            reason: outcome.reason.clone(),
            note: outcome.note.clone(),
            error: outcome.error.clone(),
        }
    }
}

/// A run a retention pass pruned (or, in a dry run, would).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PrunedDoc {
    pub run_id: String,
    pub name: Option<String>,
    pub state: &'static str,
    pub exit_code: Option<i32>,
    pub ended_at_ms: UnixMs,
    /// The first bound it was past.
    pub why: &'static str,
    pub bytes: u64,
    pub unconsumed_result: bool,
}

impl PrunedDoc {
    /// Its line in words, `verb` saying what was done: `pruned`, or `would prune` in a dry run.
    pub fn line(&self, verb: &str) -> String {
        let mut line = format!(
            "{}  {verb}  {} ({}), ended {}",
            self.run_id,
            self.why,
            crate::text::format_bytes(self.bytes),
            crate::duration::format_time_s(self.ended_at_ms),
        );
        if self.unconsumed_result {
            line.push_str("  its result had not been consumed");
        }
        line
    }

    /// The document of a run a pass chose.
    pub fn of(chosen: &Chosen) -> PrunedDoc {
        PrunedDoc {
            run_id: chosen.run.to_string(),
            name: chosen.state.spec.name.clone(),
            state: chosen.state.status.as_str(),
            exit_code: chosen.state.terminal.as_ref().map(|end| end.exit_code),
            ended_at_ms: chosen.ended_at_ms,
            why: chosen.why.as_str(),
            bytes: chosen.bytes,
            unconsumed_result: chosen.unconsumed_result,
        }
    }
}

/// `runjournal prune --json`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PruneDoc {
    pub dry_run: bool,
    /// Pruned, or (a dry run) what would be.
    pub runs: Vec<PrunedDoc>,
    pub bytes: u64,
    /// Runs past a bound that were kept, and why.
    pub kept: Vec<KeptDoc>,
    pub errors: Vec<String>,
}

/// `runjournal prune`'s text: a line per run pruned (or that a dry run would prune), then a
/// line per run kept past a bound.
impl std::fmt::Display for PruneDoc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for run in &self.runs {
            writeln!(f, "{}", run.line(self.verb()))?;
        }
        for kept in &self.kept {
            writeln!(f, "{}  kept  {}", kept.run_id, kept.why)?;
        }
        Ok(())
    }
}

impl PruneDoc {
    fn verb(&self) -> &'static str {
        if self.dry_run {
            "would prune"
        } else {
            "pruned"
        }
    }

    /// The one line that sums it up: `pruned 3 run(s), 12.0 KiB; 1 kept past a bound`.
    pub fn summary(&self) -> String {
        format!(
            "{} {} run(s), {}; {} kept past a bound",
            self.verb(),
            self.runs.len(),
            crate::text::format_bytes(self.bytes),
            self.kept.len()
        )
    }

    /// The document of a pruning.
    pub fn of(report: &PassReport, dry_run: bool) -> PruneDoc {
        PruneDoc {
            dry_run,
            runs: report.chosen.iter().map(PrunedDoc::of).collect(),
            bytes: report.chosen.iter().map(|chosen| chosen.bytes).sum(),
            kept: report.kept.iter().map(KeptDoc::of).collect(),
            errors: report.errors.clone(),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KeptDoc {
    pub run_id: String,
    pub why: &'static str,
}

impl KeptDoc {
    pub fn of(kept: &Kept) -> KeptDoc {
        KeptDoc {
            run_id: kept.run.to_string(),
            why: kept.why,
        }
    }
}

/// The home's default run timeout: `runjournal default-timeout --json`, and through `Display`
/// its text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DefaultTimeoutDoc {
    /// `null`: none.
    pub timeout_ms: Option<u64>,
    /// `home` (set for this home) or `layout` (its layout's).
    pub source: &'static str,
}

impl DefaultTimeoutDoc {
    /// `set` as the journal holds it ([`crate::journal::View::run_timeout_set`]), in a home of
    /// `layout`.
    pub fn of(set: Option<Option<u64>>, layout: crate::home::Layout) -> DefaultTimeoutDoc {
        match set {
            Some(timeout_ms) => DefaultTimeoutDoc {
                timeout_ms,
                source: "home",
            },
            None => DefaultTimeoutDoc {
                timeout_ms: crate::launch::layout_default_timeout_ms(layout),
                source: "layout",
            },
        }
    }
}

impl std::fmt::Display for DefaultTimeoutDoc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let value = self
            .timeout_ms
            .map_or_else(|| "none".to_string(), crate::duration::format_duration_ms);
        let from = if self.source == "home" {
            "set for this home"
        } else {
            "the layout's default"
        };
        writeln!(f, "default run timeout: {value} ({from})")
    }
}

/// The retention policy: `runjournal retention --json` and `inspect stats`. A bound that is off
/// is `null`; the free-space floor is a percentage or a size, the other `null`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyDoc {
    pub keep_for_ms: Option<u64>,
    pub keep_runs: Option<u64>,
    pub max_size_bytes: Option<u64>,
    pub keep_free_percent: Option<u8>,
    pub keep_free_bytes: Option<u64>,
    /// No policy was ever set: these are the defaults.
    pub is_default: bool,
}

impl PolicyDoc {
    pub fn of(policy: &Retention, is_default: bool) -> PolicyDoc {
        let (keep_free_percent, keep_free_bytes) = match policy.keep_free {
            Some(KeepFree::Percent(percent)) => (Some(percent), None),
            Some(KeepFree::Bytes(bytes)) => (None, Some(bytes)),
            None => (None, None),
        };
        PolicyDoc {
            keep_for_ms: policy.keep_for_ms,
            keep_runs: policy.keep_runs,
            max_size_bytes: policy.max_size_bytes,
            keep_free_percent,
            keep_free_bytes,
            is_default,
        }
    }
}

/// `journal-tools inspect run --json`: the run, and the state its records fold to, its keys in
/// camelCase.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InspectedRunDoc {
    #[serde(flatten)]
    pub run: RunDoc,
    pub state_folded: Value,
}

impl InspectedRunDoc {
    pub fn of(state: &RunState) -> InspectedRunDoc {
        InspectedRunDoc {
            run: RunDoc::of(state),
            state_folded: serde_json::to_value(state).map_or(Value::Null, show::camel_case_keys),
        }
    }
}

/// The summary line of `inspect runs`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunsSummary {
    pub runs: usize,
    pub total: u64,
    pub damaged: usize,
}

/// The summary line of `inspect run` (and the fleet's, with the host).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunSummary {
    pub run_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub journal_id: Option<String>,
    pub records: usize,
    pub head_seq: u64,
}

/// The summary line of `inspect events`: how many were shown, and (of a local journal) the
/// global seq to go on after.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EventsSummary {
    pub events: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cursor: Option<u64>,
}

/// The summary line of `inspect stats`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StatsSummary {
    pub runs: u64,
    pub records: u64,
}

/// One problem `verify` (or a replay, or a fold) found.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProblemDoc {
    pub severity: &'static str,
    pub kind: &'static str,
    pub run_id: Option<String>,
    pub seq: Option<u64>,
    pub file_kind: Option<&'static str>,
    /// The file's path, under the home's root when there is one.
    pub path: Option<String>,
    pub message: String,
    pub changes: Vec<String>,
}

impl ProblemDoc {
    /// `shown_path` says how a file's path is shown (relative to the home, say).
    pub fn of(
        problem: &crate::verify::Problem,
        shown_path: impl Fn(&Path) -> String,
    ) -> ProblemDoc {
        ProblemDoc {
            severity: problem.severity.as_str(),
            kind: problem.kind.as_str(),
            run_id: problem.run.map(|run| run.to_string()),
            seq: problem.seq,
            file_kind: problem.file.as_ref().map(|(kind, _)| kind.as_str()),
            path: problem.file.as_ref().map(|(_, path)| shown_path(path)),
            message: problem.message.clone(),
            changes: problem.changes.clone(),
        }
    }
}

/// The summary line of `inspect verify`, with a count per severity.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VerifySummary {
    pub runs: u64,
    pub records: u64,
    pub files: u64,
    pub projections_checked: bool,
    pub integrity: &'static str,
    pub ok: bool,
    pub damaged: usize,
    pub unchecked: usize,
    pub inconsistent: usize,
    pub note: usize,
}

/// A file `replay` wrote or checked.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplayFileDoc {
    pub run_id: String,
    pub kind: &'static str,
    pub path: String,
    pub action: &'static str,
    pub was: &'static str,
}

/// The summary line of `replay`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplaySummary {
    /// `check` or `write`.
    pub mode: &'static str,
    pub target: String,
    pub in_place: bool,
    pub runs: u64,
    pub runs_skipped: u64,
    pub files: u64,
    pub files_changed: u64,
    pub results_left_absent: u64,
    pub until_seq: Option<u64>,
    pub ok: bool,
}

/// A run `recover` rebuilt.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RecoveredRunDoc {
    pub run_id: String,
    pub records: u64,
    pub state: &'static str,
    pub closed: bool,
}

/// A run `recover` could not rebuild, or whose projections it could not write: why.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunProblemDoc {
    pub run_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A queue whose limit `recover` chose (its own was kept only in the lost journal).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RecoveredQueueDoc {
    pub name: String,
    pub max_active: u64,
    /// Why this limit.
    pub basis: String,
}

/// A journal-only fact `recover` could not restore: of the home, or of one run.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FactNotRecoveredDoc {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    pub fact: String,
    pub reason: String,
}

/// The summary line of `recover`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RecoverSummary {
    pub journal: String,
    /// What was found in the journal's place.
    pub found: String,
    pub moved_aside: Option<String>,
    pub runs: usize,
    pub records: u64,
    pub active_runs: u64,
    pub unrecoverable: usize,
    pub results_without_runs: usize,
    /// Queues whose limit was chosen.
    pub queues: usize,
    /// Facts not recovered, the home's and every run's.
    pub facts_not_recovered: usize,
}

/// What `journal-tools compact` did.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CompactedDoc {
    pub journal: String,
    pub bytes_before: u64,
    pub bytes_after: u64,
}

/// A run of the fleet (`journal-tools --from URL inspect runs`).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FleetRunDoc {
    pub host: String,
    pub journal_id: String,
    pub run_id: String,
    pub name: Option<String>,
    pub state: &'static str,
    pub closed: bool,
    pub stale: bool,
    pub dismissed: bool,
    pub steps_done: u32,
    pub steps_total: u32,
    pub created_at_ms: UnixMs,
    pub ended_at_ms: Option<UnixMs>,
    pub head_seq: u64,
    pub runner_pid: Option<u32>,
    /// Since when the run's host has been silent, when it has.
    pub host_silent_since_ms: Option<UnixMs>,
}

#[cfg(feature = "ship")]
impl FleetRunDoc {
    pub fn of(run: &crate::ship::fleet::FleetRun, silent_since_ms: Option<UnixMs>) -> FleetRunDoc {
        FleetRunDoc {
            host: run.host_name.clone(),
            journal_id: run.journal_id.clone(),
            run_id: run.run_id.to_string(),
            name: run.name.clone(),
            state: run.state.as_str(),
            closed: run.is_closed,
            stale: run.is_stale,
            dismissed: run.is_dismissed,
            steps_done: run.steps_done,
            steps_total: run.steps_total,
            created_at_ms: run.created_at_ms,
            ended_at_ms: run.ended_at_ms,
            head_seq: run.head_seq,
            runner_pid: run.runner_pid,
            host_silent_since_ms: silent_since_ms,
        }
    }
}

/// A record of the fleet, as shipped.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FleetEventDoc {
    pub host: String,
    pub journal_id: String,
    pub global_seq: i64,
    pub run_id: String,
    pub seq: i64,
    pub time_ms: i64,
    pub event: String,
    pub fields: Value,
}

/// A journal of the fleet (`inspect stats --from`).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FleetJournalDoc {
    pub host: String,
    pub journal_id: String,
    pub home: String,
    pub journal_created_at_ms: UnixMs,
    pub runs: u64,
    pub runs_open: u64,
    pub runs_by_state: Map<String, Value>,
    pub records: u64,
    pub shipped_through: u64,
    pub shipped_at_ms: Option<UnixMs>,
    pub heartbeat_at_ms: UnixMs,
    pub silent_since_ms: Option<UnixMs>,
}

/// The summary line of the fleet's `inspect runs` and `inspect stats`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FleetSummary {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
    pub journals: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub silent_journals: Option<usize>,
    pub runs: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub records: Option<u64>,
}

/// The summary line of `replay --against URL`: a journal compared with what its host shipped.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CompareSummary {
    pub journal_id: String,
    pub server: String,
    pub registered: bool,
    pub shipped_through: u64,
    pub local_head: u64,
    pub records_compared: u64,
    pub not_yet_shipped: u64,
    pub missing: usize,
    pub extra: usize,
    pub different: usize,
    pub ok: bool,
}

/// The keys of `value` (at any depth) that break the convention of this module: not camelCase,
/// a run's id under `run`, a moment under a key ending in `At` rather than `AtMs`. The objects
/// under `fields` and `stateFolded` (an event's fields, a folded state) are not documents of
/// this module and are not looked into. For tests of every binary's output.
pub fn keys_off_convention(value: &Value) -> Vec<String> {
    let mut off = Vec::new();
    let mut pending = vec![(String::new(), value)];
    while let Some((path, value)) = pending.pop() {
        match value {
            Value::Object(object) => {
                for (key, inner) in object {
                    let here = format!("{path}/{key}");
                    let is_camel = key.chars().next().is_some_and(|c| c.is_ascii_lowercase())
                        && key.chars().all(|c| c.is_ascii_alphanumeric());
                    if !is_camel || key == "run" || key.ends_with("At") {
                        off.push(here.clone());
                    }
                    if key != "fields" && key != "stateFolded" {
                        pending.push((here, inner));
                    }
                }
            }
            Value::Array(items) => {
                for (index, inner) in items.iter().enumerate() {
                    pending.push((format!("{path}/{index}"), inner));
                }
            }
            _ => {}
        }
    }
    off.sort();
    off
}

/// `runjournal status --home-health --json`: what the home's last scrub found, and when the
/// next is due ([`crate::scrub`]).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HomeHealth {
    /// `None`: never scrubbed.
    pub last_scrub: Option<crate::scrub::ScrubRecord>,
    pub scrub_every_ms: u64,
    pub next_scrub_due_at_ms: UnixMs,
    /// Why the next is due then: an interval after the last, a restart of the host, a scrub
    /// that could not run.
    pub next_scrub_why: &'static str,
}

impl HomeHealth {
    /// The document of `view`'s home, judged in the boot `boot_id`.
    pub fn of(
        view: &crate::journal::View,
        boot_id: &str,
    ) -> Result<HomeHealth, crate::journal::ReadError> {
        let due = crate::scrub::next_due(view, boot_id)?;
        Ok(HomeHealth {
            last_scrub: crate::scrub::last(view)?,
            scrub_every_ms: u64::try_from(crate::scrub::interval(view)?.as_millis())
                .unwrap_or(u64::MAX),
            next_scrub_due_at_ms: due.at_ms,
            next_scrub_why: due.why,
        })
    }
}

impl std::fmt::Display for HomeHealth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.last_scrub {
            Some(record) => writeln!(f, "last scrub: {record}")?,
            None => writeln!(f, "last scrub: never")?,
        }
        write!(
            f,
            "next scrub: due {} ({}), every {}",
            crate::duration::format_time_s(self.next_scrub_due_at_ms),
            self.next_scrub_why,
            crate::duration::format_duration_ms(self.scrub_every_ms)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_off_the_convention_are_found_at_any_depth_and_fields_are_not_looked_into() {
        let value = serde_json::json!({
            "runId": "x",
            "createdAtMs": 1,
            "run": "x",
            "endedAt": 2,
            "snake_case": 3,
            "nested": [{"Capital": 1, "fine": 2}],
            "fields": {"free_form": 1},
        });
        assert_eq!(
            keys_off_convention(&value),
            ["/endedAt", "/nested/0/Capital", "/run", "/snake_case"]
        );
    }

    #[test]
    fn the_summaries_and_policy_keep_the_convention() {
        let documents = [
            serde_json::to_value(ReconcileLine::Summary {
                active: 1,
                changed: 0,
                pruned: 0,
                errors: 0,
            }),
            serde_json::to_value(PolicyDoc::of(&Retention::DEFAULT, true)),
            serde_json::to_value(PruneDoc::of(&PassReport::default(), true)),
            serde_json::to_value(CapacityDoc::Unread {
                error: "no home".to_string(),
            }),
            serde_json::to_value(HomeHealth {
                last_scrub: Some(crate::scrub::ScrubRecord {
                    at_ms: 1,
                    boot_id: "boot".to_string(),
                    took_ms: 2,
                    bytes: 4096,
                    outcome: crate::scrub::ScrubOutcome::Damaged {
                        problems: vec!["a page".to_string()],
                    },
                }),
                scrub_every_ms: 3,
                next_scrub_due_at_ms: 4,
                next_scrub_why: "why",
            }),
        ];
        for document in documents {
            let document = document.expect("a document serializes");
            assert_eq!(
                keys_off_convention(&document),
                Vec::<String>::new(),
                "{document}"
            );
        }
    }
}
