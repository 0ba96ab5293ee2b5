//! The documents hosts read, as their own serde types (wire types apart from domain types),
//! and the pure functions that render them from a run's state and records.
//!
//! Field names and values follow the pi-subagents format (its status.json `AsyncStatus`, its
//! result file, its index markers), so its readers read our runs. Our additions (`journalSeq`,
//! `name`, `toolCallId`, per-step `outputPath`, ...) are extra fields those readers ignore.
//! Nothing here reads a clock: the same records always render to the same bytes.

use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::event::{
    ControlAction, ExternalJobStatus, JobState, Mode, Proof, Record, Repairer, RunId, StepAction,
    TerminalState, UnixMs,
};
use crate::home::Home;
use crate::journal::ResumeLinks;
use crate::state::{RunState, SteerDelivery, StepStatus, TerminalInfo, Undelivered};

/// The pi-subagents lifecycle artifact version whose `processTerminal` contract we keep.
pub const LIFECYCLE_ARTIFACT_VERSION: u32 = 3;

/// status.json.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusDoc {
    pub lifecycle_artifact_version: u32,
    pub run_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub mode: String,
    pub state: String,
    pub started_at: UnixMs,
    pub last_update: UnixMs,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<UnixMs>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    pub current_step: usize,
    pub chain_step_count: usize,
    pub steps: Vec<StepDoc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_owner_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_at: Option<UnixMs>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timed_out: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_dismissed_at: Option<UnixMs>,
    pub process_terminal: ProcessTerminalDoc,
    /// The head seq of the run this document reflects.
    pub journal_seq: u64,
    /// When the live runner last said it is there (its heartbeat, a projection write, never
    /// a record): only in a status.json a heartbeat wrote, whose `lastUpdate` is then at least
    /// this. A projection after a commit leaves it out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_heard_at: Option<UnixMs>,
    /// The paused run this run carries on from (`runjournal resume`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed_from: Option<String>,
    /// The run that carries this paused run on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed_by: Option<String>,
    /// runjournal's: the queue the run waits in or took a slot of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// runjournal's: when the run took its queue's slot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_admitted_at: Option<UnixMs>,
    /// runjournal's: the attempt a run with retries is on (1, 2, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    /// runjournal's: how many attempts it may have (its retries and the first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    /// runjournal's: the attempts that ended and were tried again, first first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attempts: Vec<AttemptDoc>,
    /// pi-subagents' layout of parallel steps: a parallel run is one logical step of them all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel_groups: Option<Vec<ParallelGroupDoc>>,
    /// The output log of the step a reader shows as current, once a step has started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_file: Option<String>,
    /// pi-subagents' steering block: the run's steer requests and where each got.
    pub steering: SteeringDoc,
}

/// One entry of status.json `attempts`: an attempt that ended and was tried again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttemptDoc {
    pub attempt: u32,
    /// `exit`, `crash` or `timeout`.
    pub cause: String,
    pub exit_code: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub ended_at: UnixMs,
    /// When the next attempt was due.
    pub retry_at: UnixMs,
}

/// One entry of status.json `parallelGroups`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ParallelGroupDoc {
    /// The first step of the group.
    pub start: usize,
    pub count: usize,
    /// The logical step the group is.
    pub step_index: usize,
}

/// pi-subagents' `SteeringStatus`: counts of the targets of the run's steer requests by where
/// their message is, and the most recent requests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SteeringDoc {
    pub requested: usize,
    pub scheduled: usize,
    pub pending: usize,
    pub delivered: usize,
    pub failed: usize,
    pub recovered: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_requested_at: Option<UnixMs>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_delivered_at: Option<UnixMs>,
    pub recent: Vec<SteeringRequestDoc>,
}

/// pi-subagents' `SteeringRequestStatus`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SteeringRequestDoc {
    pub id: String,
    pub requested_at: UnixMs,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    pub message_preview: String,
    /// runjournal's: `steer` or `follow-up`.
    pub mode: String,
    pub targets: Vec<SteeringTargetDoc>,
}

/// pi-subagents' `SteeringTargetStatus`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SteeringTargetDoc {
    pub index: u32,
    /// `scheduled` (its step has not started), `queued` (in its running step's inbox),
    /// `delivered`, `failed` (never taken), `recovered` (handed to the run that resumed it).
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivered_at: Option<UnixMs>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_at: Option<UnixMs>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replacement_run_id: Option<String>,
}

/// One entry of status.json `steps[]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StepDoc {
    pub agent: String,
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<UnixMs>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<UnixMs>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_job: Option<ExternalJobDoc>,
    pub output_path: String,
    /// runjournal's: the step never ran (its `status` is pi-subagents' word for why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped: Option<bool>,
    /// A host asked that this step alone stop (pi-subagents' `stopRequested`), and when.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_requested: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_requested_at: Option<UnixMs>,
    /// pi-subagents' per-step proof that the step's processes are gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process_terminal: Option<StepProcessTerminalDoc>,
}

/// The per-step proof of `steps[i].processTerminal` and `process-terminal.json`'s `steps`:
/// `pending` while the run's runner has not been seen gone; `not-started` for a step that never
/// ran; `observed` when the runner's parent saw it exit after it recorded the run's end itself
/// (each step's process group was verified empty before its end was recorded); `unknown`
/// otherwise.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StepProcessTerminalDoc {
    pub version: u32,
    pub run_id: String,
    pub child_index: usize,
    pub runner_process_instance_id: String,
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_at: Option<UnixMs>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instances: Option<Vec<ProcessInstanceDoc>>,
}

/// `process-terminal.json`: pi-subagents' proof sidecar (its `ProcessTerminal`), with each
/// step's proof beside it (an addition its readers ignore).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcessTerminalFileDoc {
    #[serde(flatten)]
    pub run: ProcessTerminalDoc,
    pub steps: Vec<StepProcessTerminalDoc>,
}

/// `control/steer-inbox-closed.json`: the run takes no more steering, as pi-subagents closes a
/// run's inbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SteerInboxClosedDoc {
    pub version: u32,
    pub closed_at: UnixMs,
    pub state: String,
}

/// pi-subagents' `ExternalJobStatus`, filled from ours.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExternalJobDoc {
    pub provider: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_job_id: Option<String>,
    /// sha256 of the provider command: what was dispatched.
    pub prompt_digest: String,
    pub options: serde_json::Map<String, serde_json::Value>,
    /// `queued|running|completed|failed|stopped`.
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handle_url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<UnixMs>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<UnixMs>,
}

/// pi-subagents' `ProcessTerminal`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcessTerminalDoc {
    pub version: u32,
    /// `pending|observed|unknown|not-started`.
    pub state: String,
    pub run_id: String,
    pub runner_process_instance_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_at: Option<UnixMs>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instances: Option<Vec<ProcessInstanceDoc>>,
}

/// A process's exit in `processTerminal.instances`: the runner's (`kind` `runner`), and in a
/// step's proof the step's own process (`pi-writer`, pi-subagents' kind for the process a step
/// runs), with how its process group was found to end.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcessInstanceDoc {
    pub process_instance_id: String,
    pub kind: String,
    /// A step's process: its attempt (one per step in a run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    pub close_observed_at: UnixMs,
    pub exit_code: Option<i32>,
    pub signal: Option<String>,
    /// A step's process: whether its process group was seen empty once it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process_tree: Option<ProcessTreeDoc>,
}

/// How a step's process group ended, as pi-subagents' `processTree`: `observed` (the runner
/// saw the group empty after the step, through its process group) or `unknown`, with why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcessTreeDoc {
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mechanism: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process_group_id: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verified_at: Option<UnixMs>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// `results/<id>.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResultDoc {
    pub lifecycle_artifact_version: u32,
    pub id: String,
    pub run_id: String,
    pub agent: String,
    pub mode: String,
    pub success: bool,
    pub state: String,
    pub summary: String,
    /// Whether `summary` was cut to pi-subagents' bounds (it then starts `[TRUNCATED: …`).
    #[serde(default)]
    pub truncated: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub results: Vec<StepResultDoc>,
    pub exit_code: i32,
    pub timestamp: UnixMs,
    pub duration_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_owner_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timed_out: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_at: Option<UnixMs>,
    pub async_dir: String,
    /// The directory the run's steps ran in, when the run named one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// The seq of the run's `Terminal` record: a result never changes after it.
    pub journal_seq: u64,
}

/// One entry of the result's `results[]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StepResultDoc {
    pub agent: String,
    /// The end of the step's output (its log, `outputPath`, holds all of it); the journal
    /// does not hold it.
    pub output: String,
    pub output_state: String,
    pub output_path: String,
    pub success: bool,
    pub skipped: bool,
    pub stopped: bool,
    /// Ended by the interrupt that paused the run (pi-subagents' `interrupted`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interrupted: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_job: Option<ExternalJobDoc>,
}

/// `runs/.terminal-runs/<session>/<ended>-<run>.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TerminalMarkerDoc {
    pub version: u32,
    pub run_id: String,
    pub session_id: String,
    pub ended_at: UnixMs,
}

/// `results/result-index/sessions/<session>/<run>.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResultIndexDoc {
    pub version: u32,
    pub run_id: String,
    pub session_id: String,
    pub file: String,
    pub written_at: UnixMs,
    pub async_dir: String,
}

fn path_text(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

/// A job's state as pi-subagents names it (`ExternalJobDoc::state`).
pub fn job_state_name(state: JobState) -> &'static str {
    match state {
        JobState::Queued => "queued",
        JobState::Running => "running",
        JobState::Succeeded => "completed",
        JobState::Failed => "failed",
        JobState::Cancelled => "stopped",
        JobState::Blocked => "blocked",
    }
}

/// A step's external job; in pi-subagents' layout (`is_pi`) its provider is named by its
/// program only, as a step is ([`crate::spec::agent_name`]): the command may hold the task.
fn job_doc(
    is_pi: bool,
    provider: &str,
    job: &ExternalJobStatus,
    state: &crate::state::StepState,
) -> ExternalJobDoc {
    let pi_state = job_state_name(job.state);
    let digest = Sha256::digest(provider.as_bytes());
    let shown = if is_pi {
        crate::spec::agent_name(&crate::spec::named_step(StepAction::ExternalJob {
            provider: provider.to_string(),
        }))
    } else {
        provider.to_string()
    };
    ExternalJobDoc {
        provider: shown,
        provider_job_id: job.id.clone(),
        prompt_digest: digest.iter().map(|byte| format!("{byte:02x}")).collect(),
        options: serde_json::Map::new(),
        state: pi_state.to_string(),
        handle_url: job.url.clone(),
        failure_message: match job.state {
            JobState::Failed | JobState::Cancelled => job.message.clone(),
            _ => None,
        },
        message: job.message.clone(),
        progress: job.progress,
        started_at: state.started_at_ms,
        updated_at: state.job_updated_at_ms,
    }
}

/// Whether step `index` was ended by the interrupt that paused its run: pi-subagents calls
/// such a step `paused` (and its result `interrupted`), not `stopped`.
fn is_interrupted(state: &RunState, index: usize) -> bool {
    state
        .terminal
        .as_ref()
        .is_some_and(|terminal| terminal.state == TerminalState::Paused)
        && state
            .steps
            .get(index)
            .is_some_and(|step| step.status == StepStatus::Stopped)
}

/// A step's status as status.json names it, in pi-subagents' words: a step ended by the
/// interrupt that paused its run is `paused`; one that never ran (ours `skipped`, which
/// pi-subagents does not know) is `stopped` if a host stopped it, else what its run's end made
/// of it — `pending` in a paused run (its resume runs it), `stopped` in a stopped one, else
/// `failed`.
fn step_status_name(state: &RunState, index: usize) -> &'static str {
    if is_interrupted(state, index) {
        return "paused";
    }
    match state.steps.get(index).map(|step| step.status) {
        None => "pending",
        // Skipped when its turn came, a host having stopped it first.
        Some(StepStatus::Skipped) if stop_of(state, index).is_some() => "stopped",
        Some(StepStatus::Skipped) => match state.status {
            crate::state::RunStatus::Paused => "pending",
            crate::state::RunStatus::Stopped => "stopped",
            _ => "failed",
        },
        Some(status) => status.as_str(),
    }
}

/// The stop a host asked of step `index` alone, if any.
fn stop_of(state: &RunState, index: usize) -> Option<&crate::state::StepStopInfo> {
    u32::try_from(index)
        .ok()
        .and_then(|step| state.step_stop(step))
}

/// The per-step proof of step `index` ([`StepProcessTerminalDoc`]).
fn step_process_terminal(state: &RunState, index: usize) -> StepProcessTerminalDoc {
    let run = process_terminal_doc(state);
    let step = &state.steps[index];
    let never_ran = step.started_at_ms.is_none();
    let is_runners_own_end = state
        .terminal
        .as_ref()
        .is_some_and(|terminal| terminal.repaired_by.is_none());
    let (state_name, reason, instances, observed_at) = match (run.state.as_str(), never_ran) {
        ("pending", _) => ("pending", None, None, None),
        (_, true) => ("not-started", None, None, None),
        ("observed", false) if is_runners_own_end => (
            "observed",
            None,
            run.instances.clone().map(|instances| {
                // The runner, and this step's own process.
                let writer = step_writer(run.run_id.as_str(), index, step);
                instances
                    .into_iter()
                    .filter(|instance| instance.kind == "runner")
                    .chain(writer)
                    .collect()
            }),
            step.ended_at_ms.or(run.observed_at),
        ),
        ("observed", false) => (
            "unknown",
            Some("process-tree-unverified".to_string()),
            None,
            None,
        ),
        (_, false) => (
            "unknown",
            Some(
                run.reason
                    .clone()
                    .unwrap_or_else(|| "observer-unavailable".to_string()),
            ),
            None,
            None,
        ),
    };
    StepProcessTerminalDoc {
        version: 1,
        run_id: run.run_id.clone(),
        child_index: index,
        runner_process_instance_id: run.runner_process_instance_id.clone(),
        state: state_name.to_string(),
        observed_at,
        reason,
        instances,
    }
}

/// Step `index`'s own process as pi-subagents' proof names a writer: its exit (the signal that
/// killed it, when one did), and its process group, which the runner ends and checks when the
/// step ends: `observed` empty, unless members outlived SIGKILL (the step's error says so).
/// `None` for a step with no process or no end.
fn step_writer(
    run_id: &str,
    index: usize,
    step: &crate::state::StepState,
) -> Option<ProcessInstanceDoc> {
    let process = step.process.as_ref()?;
    let ended_at = step.ended_at_ms?;
    let error = step.error.as_deref().unwrap_or_default();
    let signal = crate::exit::killing_signal(error).map(str::to_string);
    let process_tree = if error.contains(crate::exit::SURVIVORS_NOTE) {
        ProcessTreeDoc {
            state: "unknown".to_string(),
            mechanism: None,
            process_group_id: None,
            verified_at: None,
            reason: Some("verification-failed".to_string()),
        }
    } else {
        ProcessTreeDoc {
            state: "observed".to_string(),
            mechanism: Some("posix-process-group".to_string()),
            process_group_id: Some(process.pid),
            verified_at: Some(ended_at),
            reason: None,
        }
    };
    Some(ProcessInstanceDoc {
        process_instance_id: format!(
            "{run_id}-step-{index}-pid-{}-{}",
            process.pid, process.start_time
        ),
        kind: "pi-writer".to_string(),
        attempt: Some(1),
        close_observed_at: ended_at,
        exit_code: if signal.is_some() {
            None
        } else {
            step.exit_code
        },
        signal,
        process_tree: Some(process_tree),
    })
}

/// `process-terminal.json` of a run: its proof, and each step's.
pub fn process_terminal_file_doc(state: &RunState) -> ProcessTerminalFileDoc {
    ProcessTerminalFileDoc {
        run: process_terminal_doc(state),
        steps: (0..state.steps.len())
            .map(|index| step_process_terminal(state, index))
            .collect(),
    }
}

/// `control/steer-inbox-closed.json` of a run that takes no more steering: once it ended, but
/// a paused run takes messages for its resume until it is resumed (then the resume's creation
/// is when it closed). `None` while it takes them.
pub fn steer_inbox_closed(
    home: &Home,
    state: &RunState,
    links: &ResumeLinks,
) -> Option<SteerInboxClosedDoc> {
    let terminal = state.terminal.as_ref()?;
    let closed_at = match (terminal.state, links.resumed_by) {
        (TerminalState::Paused, None) => return None,
        (TerminalState::Paused, Some(by)) => by.created_at_ms().max(terminal.at_ms),
        _ => terminal.at_ms,
    };
    Some(SteerInboxClosedDoc {
        version: 1,
        closed_at,
        state: projected_state(home, state).to_string(),
    })
}

/// pi-subagents' steering block of a run: how many targets of its steer requests are where,
/// and the last [`STEERING_RECENT`] requests.
pub fn steering_doc(state: &RunState, links: &ResumeLinks) -> SteeringDoc {
    let mut doc = SteeringDoc {
        requested: state.steers.len(),
        scheduled: 0,
        pending: 0,
        delivered: 0,
        failed: 0,
        recovered: 0,
        last_requested_at: state.steers.last().map(|steer| steer.requested_at_ms),
        last_delivered_at: None,
        recent: Vec::new(),
    };
    let is_handed_on =
        state.status == crate::state::RunStatus::Paused && links.resumed_by.is_some();
    let first_recent = state.steers.len().saturating_sub(STEERING_RECENT);
    for (position, steer) in state.steers.iter().enumerate() {
        let mut targets = Vec::with_capacity(steer.targets.len());
        for target in &steer.targets {
            let step = state.steps.get(target.step as usize);
            let mut doc_target = SteeringTargetDoc {
                index: target.step,
                state: String::new(),
                delivered_at: None,
                failed_at: None,
                reason: None,
                replacement_run_id: None,
            };
            let name = match target.delivery {
                SteerDelivery::Queued if is_handed_on => {
                    doc.recovered += 1;
                    doc_target.replacement_run_id = links.resumed_by.map(|run| run.to_string());
                    "recovered"
                }
                SteerDelivery::Queued
                    if step.is_some_and(|step| step.status == StepStatus::Running) =>
                {
                    doc.pending += 1;
                    "queued"
                }
                SteerDelivery::Queued => {
                    doc.scheduled += 1;
                    "scheduled"
                }
                SteerDelivery::Delivered { at_ms } => {
                    doc.delivered += 1;
                    doc.last_delivered_at = doc.last_delivered_at.max(Some(at_ms));
                    doc_target.delivered_at = Some(at_ms);
                    "delivered"
                }
                SteerDelivery::Undelivered { at_ms, why } => {
                    doc.failed += 1;
                    doc_target.failed_at = Some(at_ms);
                    doc_target.reason = Some(undelivered_reason(why).to_string());
                    "failed"
                }
            };
            doc_target.state = name.to_string();
            targets.push(doc_target);
        }
        if position >= first_recent {
            doc.recent.push(SteeringRequestDoc {
                id: steer.id.clone(),
                requested_at: steer.requested_at_ms,
                source: Some(steer.source.clone()).filter(|source| !source.is_empty()),
                message_preview: steer.preview.clone(),
                mode: steer.mode.as_str().to_string(),
                targets,
            });
        }
    }
    doc
}

/// How many steer requests the steering block lists (pi-subagents' `MAX_STEERING_REQUESTS`).
pub const STEERING_RECENT: usize = 20;

/// Why a message never reached its step, as the steering block and the events say it.
pub fn undelivered_reason(why: Undelivered) -> &'static str {
    match why {
        Undelivered::StepEnded => "the step ended before taking it",
        Undelivered::RunEnded => "the run ended before the step took it",
    }
}

/// pi-subagents' layout of a parallel run: one group of all its steps, its only logical step.
fn parallel_groups(state: &RunState) -> Option<Vec<ParallelGroupDoc>> {
    (state.spec.mode == Mode::Parallel).then(|| {
        vec![ParallelGroupDoc {
            start: 0,
            count: state.steps.len(),
            step_index: 0,
        }]
    })
}

fn step_docs(home: &Home, state: &RunState) -> Vec<StepDoc> {
    state
        .spec
        .steps
        .iter()
        .zip(&state.steps)
        .enumerate()
        .map(|(index, (spec, step))| StepDoc {
            agent: step_agent(home, spec),
            status: step_status_name(state, index).to_string(),
            started_at: step.started_at_ms,
            ended_at: step.ended_at_ms,
            duration_ms: step
                .started_at_ms
                .zip(step.ended_at_ms)
                .map(|(start, end)| end.saturating_sub(start)),
            exit_code: step.exit_code,
            error: step.error.clone(),
            pid: step.process.as_ref().map(|process| process.pid),
            external_job: match (&spec.action, &step.job) {
                (StepAction::ExternalJob { provider }, Some(job)) => {
                    Some(job_doc(is_pi(home), provider, job, step))
                }
                _ => None,
            },
            output_path: path_text(&home.output_log_path(state.run_id, index)),
            skipped: (step.status == StepStatus::Skipped).then_some(true),
            stop_requested: stop_of(state, index).map(|_| true),
            stop_requested_at: stop_of(state, index).map(|stop| stop.at_ms),
            process_terminal: Some(step_process_terminal(state, index)),
        })
        .collect()
}

/// The external job of step `index` as status.json shows it in pi-subagents' layout, if it is
/// an external-job step with a status.
pub fn job_doc_of(state: &RunState, index: usize) -> Option<ExternalJobDoc> {
    let (spec, step) = (state.spec.steps.get(index)?, state.steps.get(index)?);
    match (&spec.action, &step.job) {
        (StepAction::ExternalJob { provider }, Some(job)) => {
            Some(job_doc(true, provider, job, step))
        }
        _ => None,
    }
}

/// The step a reader should show as current (status.json's `currentStep`).
pub fn current_step_index(state: &RunState) -> usize {
    current_step(state)
}

/// The step a reader should show as current: the first running one, else the first not yet
/// done, else the last.
fn current_step(state: &RunState) -> usize {
    let last = state.steps.len().saturating_sub(1);
    state
        .steps
        .iter()
        .position(|step| step.status == StepStatus::Running)
        .or_else(|| state.steps.iter().position(|step| !step.status.is_done()))
        .unwrap_or(last)
}

fn signal_name(signal: i32) -> String {
    match signal {
        1 => "SIGHUP".to_string(),
        2 => "SIGINT".to_string(),
        3 => "SIGQUIT".to_string(),
        6 => "SIGABRT".to_string(),
        9 => "SIGKILL".to_string(),
        11 => "SIGSEGV".to_string(),
        13 => "SIGPIPE".to_string(),
        15 => "SIGTERM".to_string(),
        other => format!("SIG{other}"),
    }
}

/// status.json's `processTerminal` of a run.
pub fn process_terminal_doc(state: &RunState) -> ProcessTerminalDoc {
    let run_id = state.run_id.to_string();
    let instance = state
        .runner
        .as_ref()
        .map(|runner| runner.instance_id.clone());
    match &state.process_terminal {
        None => ProcessTerminalDoc {
            version: 1,
            state: "pending".to_string(),
            run_id,
            runner_process_instance_id: instance.unwrap_or_else(|| "unassigned".to_string()),
            observed_at: None,
            reason: None,
            instances: None,
        },
        Some(observed) => {
            let (mut reason, mut instances) = match observed.proof {
                Proof::Observed => (
                    None,
                    Some(vec![ProcessInstanceDoc {
                        process_instance_id: observed.instance_id.clone(),
                        kind: "runner".to_string(),
                        attempt: None,
                        close_observed_at: observed.at_ms,
                        exit_code: observed.exit.and_then(|exit| exit.code),
                        signal: observed.exit.and_then(|exit| exit.signal).map(signal_name),
                        process_tree: None,
                    }]),
                ),
                Proof::Unknown => (Some("observer-unavailable".to_string()), None),
                Proof::NotStarted => (None, None),
            };
            let mut proof = observed.proof.as_str();
            // The runner's own end: each step's process is a writer of pi-subagents' proof,
            // and a process group not seen empty leaves the run's proof unknown, as there.
            let is_runners_own_end = state
                .terminal
                .as_ref()
                .is_some_and(|terminal| terminal.repaired_by.is_none());
            if let Some(runner) = instances.as_mut().filter(|_| is_runners_own_end) {
                runner.extend(
                    state
                        .steps
                        .iter()
                        .enumerate()
                        .filter_map(|(index, step)| step_writer(&run_id, index, step)),
                );
                let is_unverified = runner.iter().any(|instance| {
                    instance
                        .process_tree
                        .as_ref()
                        .is_some_and(|tree| tree.state != "observed")
                });
                if is_unverified {
                    proof = "unknown";
                    reason = Some("process-tree-unverified".to_string());
                    instances = None;
                }
            }
            ProcessTerminalDoc {
                version: 1,
                state: proof.to_string(),
                run_id,
                runner_process_instance_id: if observed.instance_id.is_empty() {
                    "unassigned".to_string()
                } else {
                    observed.instance_id.clone()
                },
                observed_at: Some(observed.at_ms),
                reason,
                instances,
            }
        }
    }
}

/// The status document of a run.
pub fn status_doc(home: &Home, state: &RunState, links: &ResumeLinks) -> StatusDoc {
    let terminal = state.terminal.as_ref();
    let is_timed_out = state.has_control(crate::event::ControlAction::Timeout);
    // A dismissal hides a live run; its end shows it again, as pi-subagents' repair clears
    // it. A run dismissed once ended stays hidden.
    let display_dismissed_at = state
        .dismissed_at_ms
        .filter(|dismissed_at| terminal.is_none_or(|terminal| *dismissed_at >= terminal.at_ms));
    // pi-subagents' `outputFile`: a parallel group's first step's log, else the log of the
    // last step that started.
    let output_step = match state.spec.mode {
        Mode::Parallel => state
            .steps
            .iter()
            .any(|step| step.started_at_ms.is_some())
            .then_some(0),
        Mode::Single | Mode::Chain => state
            .steps
            .iter()
            .rposition(|step| step.started_at_ms.is_some()),
    };
    StatusDoc {
        lifecycle_artifact_version: LIFECYCLE_ARTIFACT_VERSION,
        run_id: state.run_id.to_string(),
        name: state.spec.name.clone(),
        mode: state.spec.mode.as_str().to_string(),
        state: projected_state(home, state).to_string(),
        started_at: state.created_at_ms,
        last_update: state.updated_at_ms,
        ended_at: terminal.map(|terminal| terminal.at_ms),
        pid: state.runner.as_ref().map(|runner| runner.identity.pid),
        cwd: state.spec.cwd.clone(),
        current_step: current_step(state),
        // A parallel run is one logical step (its group), as pi-subagents counts it.
        chain_step_count: if state.spec.mode == Mode::Parallel {
            1
        } else {
            state.steps.len()
        },
        steps: step_docs(home, state),
        error: terminal.and_then(|terminal| terminal.error.clone()),
        session_id: state.session_id.clone(),
        completion_owner_id: state.completion_owner_id.clone(),
        tool_call_id: state.tool_call_id.clone(),
        timeout_ms: state.spec.timeout_ms,
        deadline_at: deadline_at(state),
        stopped: terminal
            .filter(|terminal| terminal.state == TerminalState::Stopped)
            .map(|_| true),
        timed_out: is_timed_out.then_some(true),
        display_dismissed_at,
        process_terminal: process_terminal_doc(state),
        journal_seq: state.head_seq,
        runner_heard_at: None,
        resumed_from: links.resumed_from.map(|run| run.to_string()),
        resumed_by: links.resumed_by.map(|run| run.to_string()),
        queue: state.queue.as_ref().map(|queue| queue.name.clone()),
        queue_admitted_at: state
            .queue
            .as_ref()
            .and_then(|queue| queue.admitted.as_ref())
            .map(|admitted| admitted.at_ms),
        attempt: state
            .retry
            .as_ref()
            .map(crate::state::RetryInfo::current_attempt),
        max_attempts: state
            .retry
            .as_ref()
            .map(|retry| retry.retries.saturating_add(1)),
        attempts: state
            .retry
            .iter()
            .flat_map(|retry| &retry.attempts)
            .map(|attempt| AttemptDoc {
                attempt: attempt.attempt,
                cause: attempt.cause.as_str().to_string(),
                exit_code: attempt.exit_code,
                error: attempt.error.clone(),
                ended_at: attempt.ended_at_ms,
                retry_at: attempt.retry_at_ms,
            })
            .collect(),
        parallel_groups: parallel_groups(state),
        output_file: output_step.map(|step| path_text(&home.output_log_path(state.run_id, step))),
        steering: steering_doc(state, links),
    }
}

/// The status document a heartbeat writes for a run that is not terminal: the fresh one, with
/// `runnerHeardAt` and a `lastUpdate` moved up to when the runner was heard from, so a host
/// that judges a live runner by `lastUpdate`'s age (pi-subagents fails one silent for 24 h)
/// sees a quiet step's run as alive.
pub fn heartbeat_status_doc(
    home: &Home,
    state: &RunState,
    links: &ResumeLinks,
    heard_at_ms: UnixMs,
) -> StatusDoc {
    let mut doc = status_doc(home, state, links);
    doc.last_update = doc.last_update.max(heard_at_ms);
    doc.runner_heard_at = Some(heard_at_ms);
    doc
}

/// Whether `on_disk` is exactly the `expected` status document but for a heartbeat (see
/// [`heartbeat_status_doc`]): `runnerHeardAt` set, and `lastUpdate` at or after both it and
/// the expected one. Only for a run that is not terminal: a heartbeat never follows `Terminal`.
pub fn is_heartbeat_of(on_disk: &[u8], expected: &[u8]) -> bool {
    let (Ok(mut seen), Ok(fresh)) = (
        serde_json::from_slice::<StatusDoc>(on_disk),
        serde_json::from_slice::<StatusDoc>(expected),
    ) else {
        return false;
    };
    let Some(heard_at) = seen.runner_heard_at else {
        return false;
    };
    if fresh.ended_at.is_some() || seen.last_update < fresh.last_update.max(heard_at) {
        return false;
    }
    seen.last_update = fresh.last_update;
    seen.runner_heard_at = None;
    to_json_bytes(&seen) == expected
}

/// The seq of the run's `Terminal` record (its head while it has none).
pub fn terminal_seq(state: &RunState, records: &[Record]) -> u64 {
    records
        .iter()
        .find(|record| matches!(record.event, crate::event::Event::Terminal { .. }))
        .map_or(state.head_seq, |record| record.seq)
}

/// How much of a step's output its result entry holds: pi-subagents' bound for a command's
/// output (`MAX_OUTPUT_TAIL_BYTES` of its external-CLI runner), the end kept.
pub const STEP_OUTPUT_TAIL_BYTES: u64 = 64 * 1024;

/// pi-subagents' default bound of a result's aggregated summary (`DEFAULT_MAX_OUTPUT`).
pub const SUMMARY_MAX_BYTES: usize = 200 * 1024;
/// See [`SUMMARY_MAX_BYTES`].
pub const SUMMARY_MAX_LINES: usize = 5000;

/// pi-subagents' summary of a paused (interrupted) run, word for word.
pub const PAUSED_SUMMARY: &str = "Paused after interrupt. Waiting for explicit next action.";

/// A step's output for its result entry, and pi-subagents' `outputState` of it (`present` when
/// the trimmed output is not empty, else `absent`; `unknown` when its log cannot be read). A
/// command's output is the end of its log ([`STEP_OUTPUT_TAIL_BYTES`]; a step that printed
/// nothing has no log); an external job's is its provider's last message, as the journal
/// holds it. The log is read when the result is rendered: it no longer changes once the
/// step's `StepFinished` is recorded.
fn step_output(home: &Home, state: &RunState, index: usize) -> (String, &'static str) {
    let (Some(spec), Some(step)) = (state.spec.steps.get(index), state.steps.get(index)) else {
        return (String::new(), "unknown");
    };
    if matches!(step.status, StepStatus::Pending | StepStatus::Skipped) {
        return (String::new(), "absent");
    }
    let output = if spec.is_external_job() {
        step.job
            .as_ref()
            .and_then(|job| job.message.as_deref())
            .map(str::trim)
            .unwrap_or_default()
            .to_string()
    } else {
        match crate::logs::byte_tail(
            &home.output_log_path(state.run_id, index),
            STEP_OUTPUT_TAIL_BYTES,
        ) {
            Ok(output) => output.unwrap_or_default(),
            Err(_) => return (String::new(), "unknown"),
        }
    };
    let output_state = if output.is_empty() {
        "absent"
    } else {
        "present"
    };
    (output, output_state)
}

/// The result's `summary`, as pi-subagents' runner makes it: the stop, timeout or pause
/// message for a run ended so (and the reason of a run the reconciler closed), else every
/// executed step's `agent:\noutput` (its error when it failed with no output, else
/// `(no output)`), joined by blank lines and bounded as pi-subagents bounds it.
fn result_summary(state: &RunState, terminal: &TerminalInfo, results: &[StepResultDoc]) -> Summary {
    let is_timed_out = state.has_control(crate::event::ControlAction::Timeout);
    let message = || {
        terminal
            .error
            .clone()
            .unwrap_or_else(|| terminal.summary.clone())
    };
    match terminal.state {
        TerminalState::Paused => return Summary::whole(PAUSED_SUMMARY.to_string()),
        TerminalState::Stopped => return Summary::whole(message()),
        TerminalState::Failed if is_timed_out || terminal.repaired_by.is_some() => {
            return Summary::whole(message());
        }
        _ => {}
    }
    let summary = results
        .iter()
        .zip(&state.steps)
        .filter(|(_, step)| !matches!(step.status, StepStatus::Pending | StepStatus::Skipped))
        .map(|(result, step)| {
            let text = if !result.output.is_empty() {
                result.output.as_str()
            } else if step.status != StepStatus::Complete
                && let Some(error) = result.error.as_deref().filter(|error| !error.is_empty())
            {
                error
            } else {
                "(no output)"
            };
            format!("{}:\n{text}", result.agent)
        })
        .collect::<Vec<_>>()
        .join("\n\n");
    truncate_summary(summary)
}

fn format_bytes(bytes: usize) -> String {
    match bytes {
        0..1024 => format!("{bytes}B"),
        1024..1_048_576 => format!("{:.1}KB", bytes as f64 / 1024.0),
        _ => format!("{:.1}MB", bytes as f64 / 1_048_576.0),
    }
}

/// A result's summary, and whether it was cut to its bounds (the result's `truncated`).
struct Summary {
    text: String,
    is_truncated: bool,
}

impl Summary {
    fn whole(text: String) -> Summary {
        Summary {
            text,
            is_truncated: false,
        }
    }
}

/// pi-subagents' `truncateOutput` with its default bounds: the first lines that fit, after a
/// line that says what was cut.
fn truncate_summary(summary: String) -> Summary {
    let total_lines = summary.split('\n').count();
    if summary.len() <= SUMMARY_MAX_BYTES && total_lines <= SUMMARY_MAX_LINES {
        return Summary::whole(summary);
    }
    let mut kept: String = summary
        .split('\n')
        .take(SUMMARY_MAX_LINES)
        .collect::<Vec<_>>()
        .join("\n");
    if kept.len() > SUMMARY_MAX_BYTES {
        let mut cut = SUMMARY_MAX_BYTES;
        while !kept.is_char_boundary(cut) {
            cut -= 1;
        }
        kept.truncate(cut);
    }
    let kept_lines = kept.split('\n').count();
    Summary {
        text: format!(
            "[TRUNCATED: showing first {kept_lines} of {total_lines} lines, {} of {}]\n{kept}",
            format_bytes(kept.len()),
            format_bytes(summary.len())
        ),
        is_truncated: true,
    }
}

/// The result document of a terminal run; `None` while it is not terminal.
pub fn result_doc(home: &Home, state: &RunState, records: &[Record]) -> Option<ResultDoc> {
    result_doc_at(home, state, terminal_seq(state, records))
}

/// pi-subagents' markdown log of an ended run, from its result: its mode, directory, times,
/// a table of its steps and its summary, in pi-subagents' words and layout. Pure.
pub fn run_log_md(state: &RunState, result: &ResultDoc) -> String {
    use std::fmt::Write as _;
    let started_at_ms = state
        .runner
        .as_ref()
        .map_or(state.created_at_ms, |runner| runner.started_at_ms)
        .min(result.timestamp);
    let mut log = String::new();
    // Writing into a String cannot fail.
    let _ = writeln!(log, "# Subagent run {}\n", result.id);
    let _ = writeln!(log, "- **Mode:** {}", result.mode);
    let _ = writeln!(log, "- **CWD:** {}", result.cwd.as_deref().unwrap_or("."));
    let _ = writeln!(
        log,
        "- **Started:** {}",
        crate::duration::format_time_iso(started_at_ms)
    );
    let _ = writeln!(
        log,
        "- **Ended:** {}",
        crate::duration::format_time_iso(result.timestamp)
    );
    let _ = writeln!(
        log,
        "- **Duration:** {}",
        pi_duration(result.timestamp - started_at_ms)
    );
    let _ = writeln!(log, "- **Artifacts:** {}\n", result.async_dir);
    let _ = writeln!(log, "## Steps");
    let _ = writeln!(log, "| Step | Agent | Status | Duration |");
    let _ = writeln!(log, "| --- | --- | --- | --- |");
    for (index, (step, doc)) in state.steps.iter().zip(&result.results).enumerate() {
        let duration = match (step.started_at_ms, step.ended_at_ms) {
            (Some(started), Some(ended)) => pi_duration(ended.saturating_sub(started)),
            _ => "-".to_string(),
        };
        let agent = doc.agent.replace('|', "\\|");
        let _ = writeln!(
            log,
            "| {} | {agent} | {} | {duration} |",
            index + 1,
            step.status.as_str()
        );
    }
    let _ = writeln!(log, "\n## Summary");
    if result.truncated {
        let _ = writeln!(log, "_Output truncated_\n");
    }
    let summary = result.summary.trim();
    let _ = writeln!(
        log,
        "{}",
        if summary.is_empty() {
            "(no output)"
        } else {
            summary
        }
    );
    log
}

/// A duration as pi-subagents writes one: `850ms`, `12.5s`, `3m7s`.
fn pi_duration(ms: u64) -> String {
    match ms {
        0..1_000 => format!("{ms}ms"),
        1_000..60_000 => {
            let tenths = (ms + 50) / 100;
            format!("{}.{}s", tenths / 10, tenths % 10)
        }
        _ => format!("{}m{}s", ms / 60_000, ms % 60_000 / 1_000),
    }
}

/// The result document of a terminal run whose `Terminal` record has seq `terminal_seq`
/// (what [`result_doc`] finds in the records); `None` while it is not terminal, and for a run
/// a host's repair ended: the host published its own result, and a host sees one end.
pub fn result_doc_at(home: &Home, state: &RunState, terminal_seq: u64) -> Option<ResultDoc> {
    let terminal = state.terminal.as_ref()?;
    if terminal.repaired_by == Some(Repairer::Host) {
        return None;
    }
    let names: Vec<String> = state
        .spec
        .steps
        .iter()
        .map(|step| step_agent(home, step))
        .collect();
    let agent = match state.spec.mode {
        Mode::Single => names.first().cloned().unwrap_or_default(),
        Mode::Chain => format!("chain:{}", names.join("->")),
        Mode::Parallel => format!("parallel:{}", names.join("+")),
    };
    let results: Vec<StepResultDoc> = state
        .spec
        .steps
        .iter()
        .zip(&state.steps)
        .enumerate()
        .map(|(index, (spec, step))| {
            let (output, output_state) = step_output(home, state, index);
            StepResultDoc {
                agent: step_agent(home, spec),
                output,
                output_state: output_state.to_string(),
                output_path: path_text(&home.output_log_path(state.run_id, index)),
                success: step.status == StepStatus::Complete,
                skipped: step.status == StepStatus::Skipped,
                stopped: step.status == StepStatus::Stopped && !is_interrupted(state, index),
                interrupted: is_interrupted(state, index).then_some(true),
                error: step.error.clone(),
                exit_code: step.exit_code,
                external_job: match (&spec.action, &step.job) {
                    (StepAction::ExternalJob { provider }, Some(job)) => {
                        Some(job_doc(is_pi(home), provider, job, step))
                    }
                    _ => None,
                },
            }
        })
        .collect();
    let ending = PiEnding::of(home, state, terminal);
    let summary = ending
        .message()
        .map_or_else(|| result_summary(state, terminal, &results), Summary::whole);
    Some(ResultDoc {
        lifecycle_artifact_version: LIFECYCLE_ARTIFACT_VERSION,
        id: state.run_id.to_string(),
        run_id: state.run_id.to_string(),
        agent,
        mode: state.spec.mode.as_str().to_string(),
        success: terminal.state == TerminalState::Complete,
        state: projected_state(home, state).to_string(),
        summary: summary.text,
        truncated: summary.is_truncated,
        error: ending.message().or_else(|| terminal.error.clone()),
        results,
        exit_code: ending.exit_code(terminal),
        timestamp: terminal.at_ms,
        duration_ms: terminal.at_ms.saturating_sub(state.created_at_ms),
        session_id: state.session_id.clone(),
        completion_owner_id: state.completion_owner_id.clone(),
        tool_call_id: state.tool_call_id.clone(),
        stopped: (terminal.state == TerminalState::Stopped).then_some(true),
        timed_out: state.has_control(ControlAction::Timeout).then_some(true),
        timeout_ms: state.spec.timeout_ms,
        deadline_at: deadline_at(state),
        async_dir: path_text(&home.run_dir(state.run_id)),
        cwd: state.spec.cwd.clone(),
        journal_seq: terminal_seq,
    })
}

/// How a result tells a run's end apart. In runjournal's layout the exit code is the one the
/// run ended with (a stopped run's 143, a timed-out one's 124, a failed chain's step's code);
/// in pi-subagents' layout it is what pi-subagents' runner writes, 1 for every end but a
/// completed or paused run's 0, and a stopped or timed-out run is summed up in its words.
enum PiEnding {
    /// runjournal's own layout: the run's own exit code and summary.
    Native,
    /// pi-subagents' layout, a run stopped by a host (or its runner's stop signal).
    Stopped,
    /// pi-subagents' layout, a run its timeout ended; the timeout when the run has one.
    TimedOut(Option<u64>),
    /// pi-subagents' layout, a run failed by a step a signal killed that nobody asked for
    /// (no stop, timeout or interrupt): pi-subagents' runner ends it `stopped`. The signal's
    /// name.
    Signalled(String),
    /// pi-subagents' layout, any other end.
    Other,
}

/// pi-subagents' summary and error of a stopped run, word for word.
pub const STOPPED_SUMMARY: &str = "Subagent stopped by user.";

impl PiEnding {
    fn of(home: &Home, state: &RunState, terminal: &TerminalInfo) -> PiEnding {
        if home.layout() != crate::home::Layout::PiSubagents {
            return PiEnding::Native;
        }
        if terminal.repaired_by.is_some() {
            // The reconciler's reason says what happened to a run whose runner died.
            return PiEnding::Other;
        }
        match terminal.state {
            TerminalState::Stopped => PiEnding::Stopped,
            TerminalState::Failed if state.has_control(ControlAction::Timeout) => {
                PiEnding::TimedOut(state.spec.timeout_ms)
            }
            _ => match unasked_signal(state) {
                Some(signal) => PiEnding::Signalled(signal.to_string()),
                None => PiEnding::Other,
            },
        }
    }

    /// The summary and error pi-subagents writes for this end, when it has words of its own.
    fn message(&self) -> Option<String> {
        match self {
            PiEnding::Stopped => Some(STOPPED_SUMMARY.to_string()),
            PiEnding::TimedOut(Some(timeout_ms)) => {
                Some(format!("Subagent timed out after {timeout_ms}ms."))
            }
            PiEnding::TimedOut(None) => Some("Subagent timed out.".to_string()),
            PiEnding::Signalled(signal) => {
                Some(format!("Subagent process terminated by signal {signal}."))
            }
            PiEnding::Native | PiEnding::Other => None,
        }
    }

    fn exit_code(&self, terminal: &TerminalInfo) -> i32 {
        match (self, terminal.state) {
            // A paused run ended as asked, to be carried on: 0 in both layouts.
            (_, TerminalState::Paused) => 0,
            (PiEnding::Native, _) => terminal.exit_code,
            (_, TerminalState::Complete) => 0,
            _ => 1,
        }
    }
}

fn is_pi(home: &Home) -> bool {
    home.layout() == crate::home::Layout::PiSubagents
}

/// A step's name as the home's layout shows it: whole in runjournal's, in pi-subagents' only
/// its agent's name ([`crate::spec::agent_name`]), never its task's text.
fn step_agent(home: &Home, step: &crate::event::StepSpec) -> String {
    if is_pi(home) {
        crate::spec::agent_name(step)
    } else {
        step.name.clone()
    }
}

/// The signal that killed a step of a run that failed by it with nobody asking (no control
/// recorded, its own runner's end): the end pi-subagents' runner calls `stopped`.
fn unasked_signal(state: &RunState) -> Option<&str> {
    let terminal = state.terminal.as_ref()?;
    if terminal.state != TerminalState::Failed
        || terminal.repaired_by.is_some()
        || !state.controls.is_empty()
    {
        return None;
    }
    state
        .steps
        .iter()
        .filter(|step| step.status == StepStatus::Failed)
        .find_map(|step| crate::exit::killing_signal(step.error.as_deref()?))
}

/// The run's state as its projections name it: the journal's, but in pi-subagents' layout a
/// run failed by a signal nobody asked for is `stopped`, as pi-subagents' runner ends it.
pub fn projected_state(home: &Home, state: &RunState) -> &'static str {
    match home.layout() {
        crate::home::Layout::PiSubagents => pi_state(state),
        crate::home::Layout::Runjournal => state.status.as_str(),
    }
}

/// The run's state as pi-subagents' runner names it ([`projected_state`] in its layout).
pub fn pi_state(state: &RunState) -> &'static str {
    if unasked_signal(state).is_some() {
        return crate::state::RunStatus::Stopped.as_str();
    }
    state.status.as_str()
}

/// When the run's timeout falls due: its runner's start plus its timeout.
pub fn deadline_at(state: &RunState) -> Option<UnixMs> {
    state.spec.timeout_ms.and_then(|timeout| {
        state
            .runner
            .as_ref()
            .map(|runner| runner.started_at_ms.saturating_add(timeout))
    })
}

/// One line of events.jsonl: the record's envelope, then the event's own fields.
pub fn event_line(record: &Record) -> serde_json::Value {
    let mut line = serde_json::Map::new();
    line.insert("seq".into(), record.seq.into());
    line.insert("ts".into(), record.time_ms.into());
    line.insert("runId".into(), record.run_id.to_string().into());
    line.insert("type".into(), record.event.name().into());
    line.insert("writer".into(), record.writer.to_string().into());
    line.insert("writerSeq".into(), record.writer_seq.into());
    // Externally tagged: {"<Variant>": {fields}} or "<Variant>" for a unit variant.
    let fields = match serde_json::to_value(&record.event) {
        Ok(serde_json::Value::Object(mut tagged)) => tagged.remove(record.event.name()),
        _ => None,
    };
    if let Some(serde_json::Value::Object(fields)) = fields {
        for (key, value) in fields {
            line.entry(key).or_insert(value);
        }
    }
    serde_json::Value::Object(line)
}

/// Reads back one line of events.jsonl, the inverse of [`event_line`]: the envelope's keys
/// (`seq`, `ts`, `runId`, `type`, `writer`, `writerSeq`), then the event's own fields. A line
/// is accepted only if it renders back to the very same object, so nothing in it is ignored
/// or guessed. `Err` says what is wrong with it.
pub fn parse_event_line(line: &str) -> Result<Record, String> {
    let value: serde_json::Value =
        serde_json::from_str(line).map_err(|error| format!("not JSON: {error}"))?;
    let serde_json::Value::Object(mut fields) = value.clone() else {
        return Err("not a JSON object".to_string());
    };
    let mut take = |key: &str| fields.remove(key).ok_or_else(|| format!("no \"{key}\""));
    let number = |value: serde_json::Value, key: &str| {
        value
            .as_u64()
            .ok_or_else(|| format!("\"{key}\" is not a whole number"))
    };
    let text = |value: serde_json::Value, key: &str| match value {
        serde_json::Value::String(text) => Ok(text),
        _ => Err(format!("\"{key}\" is not a string")),
    };
    let seq = number(take("seq")?, "seq")?;
    let time_ms = number(take("ts")?, "ts")?;
    let run_id: RunId = text(take("runId")?, "runId")?
        .parse()
        .map_err(|error| format!("\"runId\": {error}"))?;
    let name = text(take("type")?, "type")?;
    let writer_text = text(take("writer")?, "writer")?;
    let writer = u64::from_str_radix(&writer_text, 16)
        .ok()
        .filter(|_| writer_text.len() == 16)
        .map(crate::event::WriterId)
        .ok_or_else(|| format!("\"writer\" {writer_text:?} is not 16 hex digits"))?;
    let writer_seq = number(take("writerSeq")?, "writerSeq")?;
    let mut tagged = serde_json::Map::new();
    tagged.insert(name.clone(), serde_json::Value::Object(fields));
    let event: crate::event::Event = serde_json::from_value(serde_json::Value::Object(tagged))
        .map_err(|error| format!("not a {name} event: {error}"))?;
    let record = Record {
        format_version: crate::event::FORMAT_VERSION,
        run_id,
        seq,
        time_ms,
        writer,
        writer_seq,
        event,
    };
    if event_line(&record) != value {
        return Err(
            "it does not read back as written (a field unknown or out of place)".to_string(),
        );
    }
    Ok(record)
}

/// events.jsonl: one JSON object per record, in seq order.
pub fn events_jsonl(records: &[Record]) -> Vec<u8> {
    let mut out = Vec::new();
    for record in records {
        // Serializing a Value cannot fail.
        if serde_json::to_writer(&mut out, &event_line(record)).is_ok() {
            out.push(b'\n');
        }
    }
    out
}

/// pi-subagents' encoding: two-space indentation, no trailing newline.
pub fn to_json_bytes<T: Serialize>(document: &T) -> Vec<u8> {
    serde_json::to_vec_pretty(document).expect("documents of plain data always serialize")
}

/// The terminal marker of a run with a session.
pub fn terminal_marker(state: &RunState) -> Option<(String, UnixMs, TerminalMarkerDoc)> {
    let session_id = state.session_id.clone()?;
    let ended_at = state.ended_at_ms()?;
    Some((
        session_id.clone(),
        ended_at,
        TerminalMarkerDoc {
            version: 1,
            run_id: state.run_id.to_string(),
            session_id,
            ended_at,
        },
    ))
}

/// The session index entry of a terminal run's result.
pub fn result_index(home: &Home, state: &RunState) -> Option<(String, ResultIndexDoc)> {
    let session_id = state.session_id.clone()?;
    let ended_at = state.ended_at_ms()?;
    let run: RunId = state.run_id;
    Some((
        session_id.clone(),
        ResultIndexDoc {
            version: 1,
            run_id: run.to_string(),
            session_id,
            file: format!("{run}.json"),
            written_at: ended_at,
            async_dir: path_text(&home.run_dir(run)),
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> Record {
        Record {
            format_version: crate::event::FORMAT_VERSION,
            run_id: "01ARZ3NDEKTSV4RRFFQ69G5FAV".parse().expect("run id"),
            seq: 7,
            time_ms: 1_700_000_000_123,
            writer: crate::event::WriterId(0x00ab_cdef_0123_4567),
            writer_seq: 3,
            event: crate::event::Event::Terminal {
                state: TerminalState::Failed,
                error: Some("step 1 (exit 3) failed: \"quoted\"\nnewline".to_string()),
                summary: "1 of 2 steps complete".to_string(),
                exit_code: -3,
                repaired_by: None,
            },
        }
    }

    #[test]
    fn an_events_line_reads_back_as_the_record_it_was_written_from() {
        let record = record();
        let line = event_line(&record).to_string();
        assert_eq!(parse_event_line(&line), Ok(record));
    }

    #[test]
    fn a_resume_link_is_written_as_the_printed_run_id_and_read_back() {
        let from = RunId::from_bytes([5; 16]);
        let record = crate::event::RecordEnvelope {
            seq: 2,
            event: crate::event::Event::Resumed { from },
            ..record()
        };
        let line = event_line(&record);
        assert_eq!(line["type"], "Resumed");
        assert_eq!(line["from"], from.to_string());
        assert_eq!(parse_event_line(&line.to_string()), Ok(record));
        let mut forged = line.clone();
        forged["from"] = "../../etc".into();
        assert!(parse_event_line(&forged.to_string()).is_err());
    }

    #[test]
    fn an_events_line_that_is_not_exactly_a_record_is_refused_saying_why() {
        let line = event_line(&record());
        let edited = |edit: &dyn Fn(&mut serde_json::Map<String, serde_json::Value>)| {
            let mut line = line.clone();
            edit(line.as_object_mut().expect("an object"));
            line.to_string()
        };
        let cases: Vec<(String, &str)> = vec![
            ("[1]".to_string(), "not a JSON object"),
            ("{\"seq\": ".to_string(), "not JSON"),
            (edited(&|line| drop(line.remove("seq"))), "no \"seq\""),
            (
                edited(&|line| drop(line.insert("ts".into(), "soon".into()))),
                "\"ts\" is not a whole number",
            ),
            (
                edited(&|line| drop(line.insert("writer".into(), "abc".into()))),
                "not 16 hex digits",
            ),
            (
                edited(&|line| drop(line.insert("runId".into(), "nope".into()))),
                "\"runId\"",
            ),
            (
                edited(&|line| drop(line.insert("type".into(), "Exploded".into()))),
                "not a Exploded event",
            ),
            (
                edited(&|line| drop(line.insert("extra".into(), 1.into()))),
                "does not read back as written",
            ),
            (
                edited(&|line| drop(line.remove("exitCode"))),
                "not a Terminal event",
            ),
        ];
        for (text, expected) in cases {
            let error = parse_event_line(&text).expect_err(&text);
            assert!(error.contains(expected), "{text}: {error}");
        }
    }

    /// Regression (found by the `fold_events` fuzz target): serde_json parsed some floats one
    /// unit in the last place off, so a job's progress in status.json read back as another
    /// number than the one written.
    #[test]
    fn a_progress_value_reads_back_exactly_as_written() {
        for progress in [4.7783074660614404e-299, 0.1, 1e-300, 0.30000000000000004] {
            let job = ExternalJobDoc {
                provider: "render-farm".to_string(),
                provider_job_id: None,
                prompt_digest: String::new(),
                options: serde_json::Map::new(),
                state: "running".to_string(),
                handle_url: None,
                failure_message: None,
                message: None,
                progress: Some(progress),
                started_at: None,
                updated_at: None,
            };
            let read: ExternalJobDoc =
                serde_json::from_slice(&to_json_bytes(&job)).expect("the document parses");
            assert_eq!(read.progress, Some(progress));
        }
    }

    fn state_of(events: Vec<crate::event::Event>) -> RunState {
        let records: Vec<Record> = events
            .into_iter()
            .enumerate()
            .map(|(index, event)| Record {
                format_version: crate::event::FORMAT_VERSION,
                run_id: RunId::from_bytes([4; 16]),
                seq: index as u64 + 1,
                time_ms: 2_000 + index as u64 * 100,
                writer: crate::event::WriterId(1),
                writer_seq: index as u64 + 1,
                event,
            })
            .collect();
        crate::state::replay(&records)
            .expect("a legal life")
            .expect("records")
    }

    /// A step's process is a writer of the run's proof, with its killing signal; a group that
    /// outlived SIGKILL leaves the run's proof unknown (`process-tree-unverified`), as
    /// pi-subagents' own proof does.
    #[test]
    fn each_step_is_a_writer_of_the_proof_and_survivors_leave_it_unknown() {
        use crate::event::{Observer, Proof, StepEnd};
        use crate::testkit as kit;
        let life = |error: &str| {
            state_of(vec![
                kit::created(
                    kit::spec(Mode::Single, vec![kit::echo_step("a")]),
                    2_000,
                    crate::event::HostIds::default(),
                ),
                kit::runner_started(kit::identity(7), "i1"),
                kit::step_running(0, Some(kit::identity(8))),
                kit::step_finished(0, StepEnd::Failed, Some(137), Some(error)),
                kit::terminal(TerminalState::Failed, 1, "failed", Some(error)),
                kit::process_terminal("i1", Some(1), Proof::Observed, Observer::Launcher),
            ])
        };
        let killed = process_terminal_doc(&life("killed by signal 9 (SIGKILL)"));
        assert_eq!(killed.state, "observed");
        let instances = killed.instances.expect("the exits");
        assert_eq!(instances.len(), 2, "{instances:?}");
        assert_eq!(instances[1].kind, "pi-writer");
        assert_eq!(instances[1].signal.as_deref(), Some("SIGKILL"));
        assert_eq!(instances[1].exit_code, None);
        let tree = instances[1].process_tree.as_ref().expect("its group");
        assert_eq!(
            (tree.state.as_str(), tree.process_group_id),
            ("observed", Some(8))
        );
        let survived = process_terminal_doc(&life(&format!(
            "killed by signal 9 (SIGKILL) ({} 2s after SIGKILL)",
            crate::exit::SURVIVORS_NOTE
        )));
        assert_eq!(
            (survived.state.as_str(), survived.reason.as_deref()),
            ("unknown", Some("process-tree-unverified"))
        );
        assert_eq!(survived.instances, None);
    }

    /// pi-subagents' fields: a parallel run is one group, the current step's log is the
    /// output file, steer requests show in the steering block, a paused result's exit code is
    /// 0 and its timeout facts are there, a step that never ran has a state of pi-subagents'.
    #[test]
    fn status_and_result_carry_pi_subagents_fields() {
        use crate::event::{ControlAction, StepEnd};
        use crate::testkit as kit;
        let home = Home::in_layout("/t", crate::home::Layout::PiSubagents);
        let spec = crate::event::RunSpec {
            timeout_ms: Some(60_000),
            ..kit::spec(
                Mode::Parallel,
                vec![
                    kit::echo_step("a"),
                    kit::echo_step("b"),
                    kit::echo_step("c"),
                ],
            )
        };
        let state = state_of(vec![
            kit::created(spec, 2_000, crate::event::HostIds::default()),
            kit::runner_started(kit::identity(7), "i1"),
            kit::step_running(0, Some(kit::identity(8))),
            kit::steer_requested("m1", &[0], "first look at\n   the tests"),
            kit::steer_delivered("m1", 0),
            kit::steer_requested("m2", &[0, 2], "then the docs"),
            crate::event::Event::Dismissed { at_ms: 2_550 },
            kit::control(ControlAction::Interrupt, "cli", "later"),
            kit::step_finished(0, StepEnd::Stopped, None, Some("interrupted")),
            kit::terminal(TerminalState::Paused, 130, "paused", None),
        ]);
        let links = ResumeLinks::default();
        let status = status_doc(&home, &state, &links);
        assert_eq!(status.chain_step_count, 1);
        assert_eq!(
            status.parallel_groups,
            Some(vec![ParallelGroupDoc {
                start: 0,
                count: 3,
                step_index: 0
            }])
        );
        assert_eq!(
            status.output_file.as_deref(),
            Some(path_text(&home.output_log_path(state.run_id, 0)).as_str())
        );
        let statuses: Vec<&str> = status
            .steps
            .iter()
            .map(|step| step.status.as_str())
            .collect();
        assert_eq!(
            statuses,
            ["paused", "pending", "pending"],
            "the resume runs them"
        );
        assert_eq!(status.steps[1].skipped, Some(true));
        assert_eq!(
            status.display_dismissed_at, None,
            "dismissed before its end: the end shows it again"
        );
        let steering = &status.steering;
        assert_eq!(
            (
                steering.requested,
                steering.delivered,
                steering.scheduled,
                steering.failed
            ),
            (2, 1, 1, 1),
            "m1 delivered; m2 failed for step 0, which ended, and waits for step 2"
        );
        assert_eq!(
            steering.recent[0].message_preview,
            "first look at the tests"
        );
        assert_eq!(steering.recent[1].targets[1].state, "scheduled");
        let resumed = ResumeLinks {
            resumed_from: None,
            resumed_by: Some(RunId::from_bytes([5; 16])),
        };
        let handed_on = status_doc(&home, &state, &resumed).steering;
        assert_eq!(handed_on.recent[1].targets[1].state, "recovered");
        assert_eq!(handed_on.recovered, 1);
        assert!(
            steer_inbox_closed(&home, &state, &links).is_none(),
            "a paused run takes steering"
        );
        assert!(
            steer_inbox_closed(&home, &state, &resumed).is_some(),
            "until it is resumed"
        );

        let result = result_doc(&home, &state, &[]).expect("a result");
        assert_eq!(
            result.exit_code, 0,
            "pi-subagents' exit code of a paused run"
        );
        assert_eq!(result.timeout_ms, Some(60_000));
        assert_eq!(result.deadline_at, Some(2_100 + 60_000));
        assert_eq!(result.timed_out, None);
    }
}
