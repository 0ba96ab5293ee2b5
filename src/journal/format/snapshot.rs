//! Snapshots: a run's folded state as the `runs` table stores it, in a wire type of its own
//! ([`SnapshotV1`]), converted explicitly to and from the domain type [`RunState`].
//!
//! A snapshot is a cache of the fold of the run's records. One that does not decode — damaged
//! bytes, another layout (written by a later version, say), a state of another run — is never an
//! error for whoever reads or appends: the state is re-derived from the records
//! (`read::view::state_of`).
//! An append rewrites the snapshot in the layout of this build, in its own write transaction;
//! a reader re-derives in memory. Only records that do not decode or fold are errors.
//!
//! Layout 1 ([`SnapshotV1`]) is exactly the encoding of the first release, whose snapshot was the
//! postcard encoding of `{format_version: u16 = 1, state: RunState}`: postcard puts nothing
//! between a struct's fields, so the leading number followed by the state's fields in order is
//! the same bytes. That number now names the snapshot's layout.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::event::{
    self, ControlAction, EncodeError, ExternalJobStatus, HookOutcome, MAX_SNAPSHOT_BYTES, Observer,
    ProcessExit, ProcessIdentity, Proof, Repairer, RunId, RunSpec, SteerMode, TerminalState,
    UnixMs,
};
use crate::state::{
    AdmissionInfo, AttemptInfo, ControlInfo, DelayInfo, DependencyInfo, HookAttemptEnd, HookClaim,
    HookState, ProcessTerminalInfo, QueueInfo, RetryInfo, RunState, RunStatus, RunnerInfo,
    SteerDelivery, SteerInfo, SteerTarget, StepState, StepStatus, StepStopInfo, TerminalInfo,
    Undelivered, UniqueInfo,
};

/// The snapshot layout this build writes and reads: `SnapshotV1`.
pub const SNAPSHOT_LAYOUT: u16 = 1;

/// Why stored snapshot bytes are not a snapshot of this run that this build reads. Never an
/// error for readers or appenders, who re-derive the state from the records; `verify` reports
/// it as an inconsistency.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotError {
    #[error("it is empty")]
    Empty,
    #[error("it is {bytes} bytes, over the limit of {MAX_SNAPSHOT_BYTES}")]
    TooLarge { bytes: usize },
    #[error("it fails its checksum (the stored bytes were damaged)")]
    Checksum,
    #[error("it is in layout {found}; this build reads layout {SNAPSHOT_LAYOUT}")]
    OtherLayout { found: u16 },
    #[error("it does not decode: {reason}")]
    Malformed { reason: String },
    #[error("it holds the state of run {found}")]
    OtherRun { found: RunId },
    #[error("it has {states} step states for {steps} steps")]
    StepCount { states: usize, steps: usize },
    /// It decodes, but holds no state the reducer could have made (a forged or damaged
    /// snapshot whose checksum was made to match): never acted on.
    #[error("it is not a state a run can be in: {0}")]
    Invalid(crate::state::ShapeError),
}

/// Snapshot layout 1. Fields are in encoding order; the enums' variants too (postcard encodes a
/// variant by its index). Wire types of records (`RunSpec`, `ProcessIdentity`, ...) are used as
/// they are: they are already versioned with the record format.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SnapshotV1 {
    /// [`SNAPSHOT_LAYOUT`] (1).
    pub layout: u16,
    pub run_id: RunId,
    pub spec: Arc<RunSpec>,
    pub created_at_ms: UnixMs,
    pub session_id: Option<String>,
    pub completion_owner_id: Option<String>,
    pub tool_call_id: Option<String>,
    pub status: RunStatusV1,
    pub runner: Option<RunnerV1>,
    pub steps: Vec<StepV1>,
    pub controls: Vec<ControlV1>,
    pub terminal: Option<TerminalV1>,
    pub process_terminal: Option<ProcessTerminalV1>,
    pub dismissed_at_ms: Option<UnixMs>,
    pub head_seq: u64,
    pub updated_at_ms: UnixMs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RunStatusV1 {
    Queued,
    Running,
    Complete,
    Failed,
    Stopped,
    Paused,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum StepStatusV1 {
    Pending,
    Running,
    Complete,
    Failed,
    Stopped,
    Skipped,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepV1 {
    pub status: StepStatusV1,
    pub process: Option<ProcessIdentity>,
    pub started_at_ms: Option<UnixMs>,
    pub ended_at_ms: Option<UnixMs>,
    pub exit_code: Option<i32>,
    pub error: Option<String>,
    pub job: Option<ExternalJobStatus>,
    pub job_updated_at_ms: Option<UnixMs>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunnerV1 {
    pub identity: ProcessIdentity,
    pub instance_id: String,
    pub started_at_ms: UnixMs,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControlV1 {
    pub action: ControlAction,
    pub by: String,
    pub reason: String,
    pub at_ms: UnixMs,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TerminalV1 {
    pub state: TerminalState,
    pub error: Option<String>,
    pub summary: String,
    pub exit_code: i32,
    pub repaired_by: Option<Repairer>,
    pub at_ms: UnixMs,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessTerminalV1 {
    pub instance_id: String,
    pub exit: Option<ProcessExit>,
    pub proof: Proof,
    pub observer: Observer,
    pub at_ms: UnixMs,
}

impl From<RunStatus> for RunStatusV1 {
    fn from(status: RunStatus) -> RunStatusV1 {
        match status {
            RunStatus::Queued => RunStatusV1::Queued,
            RunStatus::Running => RunStatusV1::Running,
            RunStatus::Complete => RunStatusV1::Complete,
            RunStatus::Failed => RunStatusV1::Failed,
            RunStatus::Stopped => RunStatusV1::Stopped,
            RunStatus::Paused => RunStatusV1::Paused,
        }
    }
}

impl From<RunStatusV1> for RunStatus {
    fn from(status: RunStatusV1) -> RunStatus {
        match status {
            RunStatusV1::Queued => RunStatus::Queued,
            RunStatusV1::Running => RunStatus::Running,
            RunStatusV1::Complete => RunStatus::Complete,
            RunStatusV1::Failed => RunStatus::Failed,
            RunStatusV1::Stopped => RunStatus::Stopped,
            RunStatusV1::Paused => RunStatus::Paused,
        }
    }
}

impl From<StepStatus> for StepStatusV1 {
    fn from(status: StepStatus) -> StepStatusV1 {
        match status {
            StepStatus::Pending => StepStatusV1::Pending,
            StepStatus::Running => StepStatusV1::Running,
            StepStatus::Complete => StepStatusV1::Complete,
            StepStatus::Failed => StepStatusV1::Failed,
            StepStatus::Stopped => StepStatusV1::Stopped,
            StepStatus::Skipped => StepStatusV1::Skipped,
        }
    }
}

impl From<StepStatusV1> for StepStatus {
    fn from(status: StepStatusV1) -> StepStatus {
        match status {
            StepStatusV1::Pending => StepStatus::Pending,
            StepStatusV1::Running => StepStatus::Running,
            StepStatusV1::Complete => StepStatus::Complete,
            StepStatusV1::Failed => StepStatus::Failed,
            StepStatusV1::Stopped => StepStatus::Stopped,
            StepStatusV1::Skipped => StepStatus::Skipped,
        }
    }
}

impl SnapshotV1 {
    /// The wire form of a state, owned: what [`encode_snapshot`] encodes through borrowed
    /// twins, kept for the test that holds the two to the same bytes.
    #[cfg(test)]
    fn of(state: &RunState) -> SnapshotV1 {
        SnapshotV1 {
            layout: SNAPSHOT_LAYOUT,
            run_id: state.run_id,
            spec: Arc::clone(&state.spec),
            created_at_ms: state.created_at_ms,
            session_id: state.session_id.clone(),
            completion_owner_id: state.completion_owner_id.clone(),
            tool_call_id: state.tool_call_id.clone(),
            status: state.status.into(),
            runner: state.runner.as_ref().map(|runner| RunnerV1 {
                identity: runner.identity.clone(),
                instance_id: runner.instance_id.clone(),
                started_at_ms: runner.started_at_ms,
            }),
            steps: state
                .steps
                .iter()
                .map(|step| StepV1 {
                    status: step.status.into(),
                    process: step.process.clone(),
                    started_at_ms: step.started_at_ms,
                    ended_at_ms: step.ended_at_ms,
                    exit_code: step.exit_code,
                    error: step.error.clone(),
                    job: step.job.clone(),
                    job_updated_at_ms: step.job_updated_at_ms,
                })
                .collect(),
            controls: state
                .controls
                .iter()
                .map(|control| ControlV1 {
                    action: control.action,
                    by: control.by.clone(),
                    reason: control.reason.clone(),
                    at_ms: control.at_ms,
                })
                .collect(),
            terminal: state.terminal.as_ref().map(|terminal| TerminalV1 {
                state: terminal.state,
                error: terminal.error.clone(),
                summary: terminal.summary.clone(),
                exit_code: terminal.exit_code,
                repaired_by: terminal.repaired_by,
                at_ms: terminal.at_ms,
            }),
            process_terminal: state
                .process_terminal
                .as_ref()
                .map(|observed| ProcessTerminalV1 {
                    instance_id: observed.instance_id.clone(),
                    exit: observed.exit,
                    proof: observed.proof,
                    observer: observed.observer,
                    at_ms: observed.at_ms,
                }),
            dismissed_at_ms: state.dismissed_at_ms,
            head_seq: state.head_seq,
            updated_at_ms: state.updated_at_ms,
        }
    }

    /// The domain state this snapshot holds, if it is a snapshot of `run` that agrees with its
    /// own spec and has the shape of a state the reducer makes ([`RunState::check_shape`]):
    /// what comes from disk is checked like input.
    pub fn into_state(self, run: RunId) -> Result<RunState, SnapshotError> {
        if self.run_id != run {
            return Err(SnapshotError::OtherRun { found: self.run_id });
        }
        if self.steps.len() != self.spec.steps.len() {
            return Err(SnapshotError::StepCount {
                states: self.steps.len(),
                steps: self.spec.steps.len(),
            });
        }
        let state = RunState {
            run_id: self.run_id,
            spec: self.spec,
            created_at_ms: self.created_at_ms,
            session_id: self.session_id,
            completion_owner_id: self.completion_owner_id,
            tool_call_id: self.tool_call_id,
            status: self.status.into(),
            runner: self.runner.map(|runner| RunnerInfo {
                identity: runner.identity,
                instance_id: runner.instance_id,
                started_at_ms: runner.started_at_ms,
            }),
            steps: self
                .steps
                .into_iter()
                .map(|step| StepState {
                    status: step.status.into(),
                    process: step.process,
                    started_at_ms: step.started_at_ms,
                    ended_at_ms: step.ended_at_ms,
                    exit_code: step.exit_code,
                    error: step.error,
                    job: step.job,
                    job_updated_at_ms: step.job_updated_at_ms,
                })
                .collect(),
            controls: self
                .controls
                .into_iter()
                .map(|control| ControlInfo {
                    action: control.action,
                    by: control.by,
                    reason: control.reason,
                    at_ms: control.at_ms,
                })
                .collect(),
            terminal: self.terminal.map(|terminal| TerminalInfo {
                state: terminal.state,
                error: terminal.error,
                summary: terminal.summary,
                exit_code: terminal.exit_code,
                repaired_by: terminal.repaired_by,
                at_ms: terminal.at_ms,
            }),
            process_terminal: self.process_terminal.map(|observed| ProcessTerminalInfo {
                instance_id: observed.instance_id,
                exit: observed.exit,
                proof: observed.proof,
                observer: observed.observer,
                at_ms: observed.at_ms,
            }),
            dismissed_at_ms: self.dismissed_at_ms,
            queue: None,
            dependencies: None,
            delay: None,
            unique: None,
            retry: None,
            hooks: Vec::new(),
            steers: Vec::new(),
            step_stops: Vec::new(),
            head_seq: self.head_seq,
            updated_at_ms: self.updated_at_ms,
        };
        state.check_shape().map_err(SnapshotError::Invalid)?;
        Ok(state)
    }
}

/// What follows the fields of a layout-1 snapshot when an identity it holds has a PID
/// namespace (an extension at its end, as records have one): the runner's namespace, then one
/// per step. A snapshot without it is byte for byte a snapshot of the first release; one with
/// it is refused by the first release, which then re-derives the state from the records, as it
/// does with any snapshot it cannot read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct SnapshotNamespaces {
    runner: Option<u64>,
    steps: Vec<Option<u64>>,
}

impl SnapshotNamespaces {
    /// The namespaces of `state`'s identities; `None` when none has one.
    fn of(state: &RunState) -> Option<SnapshotNamespaces> {
        let namespaces = SnapshotNamespaces {
            runner: state
                .runner
                .as_ref()
                .and_then(|runner| runner.identity.pid_namespace),
            steps: state
                .steps
                .iter()
                .map(|step| {
                    step.process
                        .as_ref()
                        .and_then(|process| process.pid_namespace)
                })
                .collect(),
        };
        let has_any = namespaces.runner.is_some() || namespaces.steps.iter().any(Option::is_some);
        has_any.then_some(namespaces)
    }

    /// Puts the namespaces into `state`'s identities; refuses them where there is no identity
    /// to hold one.
    fn apply(self, state: &mut RunState) -> Result<(), SnapshotError> {
        let misplaced = || SnapshotError::Malformed {
            reason: "a PID namespace for a process it does not record".to_string(),
        };
        if self.steps.len() != state.steps.len() {
            return Err(SnapshotError::Malformed {
                reason: format!(
                    "PID namespaces for {} steps, not {}",
                    self.steps.len(),
                    state.steps.len()
                ),
            });
        }
        if let Some(namespace) = self.runner {
            let runner = state.runner.as_mut().ok_or_else(misplaced)?;
            runner.identity.pid_namespace = Some(namespace);
        }
        for (step, namespace) in state.steps.iter_mut().zip(self.steps) {
            if let Some(namespace) = namespace {
                let process = step.process.as_mut().ok_or_else(misplaced)?;
                process.pid_namespace = Some(namespace);
            }
        }
        if SnapshotNamespaces::of(state).is_none()
            && state.queue.is_none()
            && state.hooks.is_empty()
            && state.steers.is_empty()
            && state.dependencies.is_none()
            && state.delay.is_none()
            && state.unique.is_none()
            && state.retry.is_none()
            && state.step_stops.is_empty()
        {
            // Written all absent only before another extension (a queue, steers, hooks,
            // dependencies, a delayed start, a key, retries, steps' stops): anything else is not
            // what this build writes.
            return Err(SnapshotError::Malformed {
                reason: "PID namespaces that are all absent".to_string(),
            });
        }
        Ok(())
    }

    /// All absent, for a state of `steps` steps.
    fn none(steps: usize) -> SnapshotNamespaces {
        SnapshotNamespaces {
            runner: None,
            steps: vec![None; steps],
        }
    }
}

/// What follows the PID namespaces of a layout-1 snapshot of a run in a queue (a second
/// extension at its end): the run's queue. The namespaces are then always written, all absent
/// if need be, so each extension is found at its place. A snapshot without a queue is as
/// before; one with it is refused by builds without queues, which re-derive the state from the
/// records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct SnapshotQueue {
    name: String,
    idle_timeout_ms: Option<u64>,
    heartbeat_ms: Option<u64>,
    joined_at_ms: UnixMs,
    admitted: Option<SnapshotAdmission>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct SnapshotAdmission {
    by: String,
    at_ms: UnixMs,
}

impl SnapshotQueue {
    fn of(queue: &QueueInfo) -> SnapshotQueue {
        SnapshotQueue {
            name: queue.name.clone(),
            idle_timeout_ms: queue.idle_timeout_ms,
            heartbeat_ms: queue.heartbeat_ms,
            joined_at_ms: queue.joined_at_ms,
            admitted: queue.admitted.as_ref().map(|admitted| SnapshotAdmission {
                by: admitted.by.clone(),
                at_ms: admitted.at_ms,
            }),
        }
    }

    fn into_info(self) -> QueueInfo {
        QueueInfo {
            name: self.name,
            idle_timeout_ms: self.idle_timeout_ms,
            heartbeat_ms: self.heartbeat_ms,
            joined_at_ms: self.joined_at_ms,
            admitted: self.admitted.map(|admitted| AdmissionInfo {
                by: admitted.by,
                at_ms: admitted.at_ms,
            }),
        }
    }
}

/// The tag byte before a snapshot's hooks (the last extension at its end, after its queue or
/// its [`SnapshotExtras`] when it has them): a queue's encoding starts with its name's length
/// (1 to 64), the extras with [`EXTRAS_MARK`] (0), so the tag tells the three apart.
const HOOKS_TAG: u8 = 0xff;

/// The tag byte before a snapshot's dependencies (after its hooks when it has them): neither a
/// queue's first byte (1 to 64), [`EXTRAS_MARK`] nor [`HOOKS_TAG`].
const DEPENDENCIES_TAG: u8 = 0xfe;

/// What ends a layout-1 snapshot of a run created with dependencies: [`DEPENDENCIES_TAG`],
/// then this. A snapshot without them is as before; builds without dependencies refuse one
/// with them and re-derive the state from the records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct SnapshotDependencies {
    after: Vec<RunId>,
    after_any: Vec<RunId>,
    idle_timeout_ms: Option<u64>,
    heartbeat_ms: Option<u64>,
    met: Option<SnapshotAdmission>,
}

impl SnapshotDependencies {
    fn of(dependencies: &DependencyInfo) -> SnapshotDependencies {
        SnapshotDependencies {
            after: dependencies.after.clone(),
            after_any: dependencies.after_any.clone(),
            idle_timeout_ms: dependencies.idle_timeout_ms,
            heartbeat_ms: dependencies.heartbeat_ms,
            met: dependencies.met.as_ref().map(|met| SnapshotAdmission {
                by: met.by.clone(),
                at_ms: met.at_ms,
            }),
        }
    }

    fn into_info(self) -> DependencyInfo {
        DependencyInfo {
            after: self.after,
            after_any: self.after_any,
            idle_timeout_ms: self.idle_timeout_ms,
            heartbeat_ms: self.heartbeat_ms,
            met: self.met.map(|met| AdmissionInfo {
                by: met.by,
                at_ms: met.at_ms,
            }),
        }
    }
}

/// The tag byte before a snapshot's delayed start, the last extension (after its hooks and
/// dependencies, if any): neither a queue's first byte (1 to 64), [`EXTRAS_MARK`],
/// [`HOOKS_TAG`] nor [`DEPENDENCIES_TAG`].
const DELAY_TAG: u8 = 0xfd;

/// The tag byte before the key a run launched once holds, the last extension (after its
/// delayed start, if any): none of the tags and marks before it.
const UNIQUE_TAG: u8 = 0xfc;

/// The tag byte before a retried run's policy and ended attempts, the last extension (after
/// its key, if any): none of the tags and marks before it.
const RETRY_TAG: u8 = 0xfb;

/// The tag byte before the stops a host asked of single steps, the last extension (after its
/// retries, if any): none of the tags and marks before it.
const STEP_STOPS_TAG: u8 = 0xfa;

/// A host's stop of one step ([`crate::state::StepStopInfo`]); a snapshot holds a list of them
/// after [`STEP_STOPS_TAG`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct SnapshotStepStop {
    step: u32,
    by: String,
    reason: String,
    at_ms: UnixMs,
}

impl SnapshotStepStop {
    fn of(stop: &StepStopInfo) -> SnapshotStepStop {
        SnapshotStepStop {
            step: stop.step,
            by: stop.by.clone(),
            reason: stop.reason.clone(),
            at_ms: stop.at_ms,
        }
    }

    fn into_info(self) -> StepStopInfo {
        StepStopInfo {
            step: self.step,
            by: self.by,
            reason: self.reason,
            at_ms: self.at_ms,
        }
    }
}

/// A run's retries ([`crate::state::RetryInfo`]): [`RETRY_TAG`], then this.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct SnapshotRetry {
    retries: u32,
    backoff_ms: u64,
    backoff_max_ms: u64,
    on: event::RetryOn,
    idle_timeout_ms: Option<u64>,
    heartbeat_ms: Option<u64>,
    attempts: Vec<SnapshotAttempt>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct SnapshotAttempt {
    attempt: u32,
    cause: event::AttemptCause,
    error: Option<String>,
    summary: String,
    exit_code: i32,
    ended_at_ms: UnixMs,
    retry_at_ms: UnixMs,
    runner_instance: Option<String>,
    process_terminal: Option<ProcessTerminalV1>,
}

impl SnapshotRetry {
    fn of(retry: &RetryInfo) -> SnapshotRetry {
        SnapshotRetry {
            retries: retry.retries,
            backoff_ms: retry.backoff_ms,
            backoff_max_ms: retry.backoff_max_ms,
            on: retry.on.clone(),
            idle_timeout_ms: retry.idle_timeout_ms,
            heartbeat_ms: retry.heartbeat_ms,
            attempts: retry
                .attempts
                .iter()
                .map(|attempt| SnapshotAttempt {
                    attempt: attempt.attempt,
                    cause: attempt.cause,
                    error: attempt.error.clone(),
                    summary: attempt.summary.clone(),
                    exit_code: attempt.exit_code,
                    ended_at_ms: attempt.ended_at_ms,
                    retry_at_ms: attempt.retry_at_ms,
                    runner_instance: attempt.runner_instance.clone(),
                    process_terminal: attempt.process_terminal.as_ref().map(|observed| {
                        ProcessTerminalV1 {
                            instance_id: observed.instance_id.clone(),
                            exit: observed.exit,
                            proof: observed.proof,
                            observer: observed.observer,
                            at_ms: observed.at_ms,
                        }
                    }),
                })
                .collect(),
        }
    }

    fn into_info(self) -> RetryInfo {
        RetryInfo {
            retries: self.retries,
            backoff_ms: self.backoff_ms,
            backoff_max_ms: self.backoff_max_ms,
            on: self.on,
            idle_timeout_ms: self.idle_timeout_ms,
            heartbeat_ms: self.heartbeat_ms,
            attempts: self
                .attempts
                .into_iter()
                .map(|attempt| AttemptInfo {
                    attempt: attempt.attempt,
                    cause: attempt.cause,
                    error: attempt.error,
                    summary: attempt.summary,
                    exit_code: attempt.exit_code,
                    ended_at_ms: attempt.ended_at_ms,
                    retry_at_ms: attempt.retry_at_ms,
                    runner_instance: attempt.runner_instance,
                    process_terminal: attempt.process_terminal.map(|observed| {
                        ProcessTerminalInfo {
                            instance_id: observed.instance_id,
                            exit: observed.exit,
                            proof: observed.proof,
                            observer: observed.observer,
                            at_ms: observed.at_ms,
                        }
                    }),
                })
                .collect(),
        }
    }
}

/// The key a run holds ([`crate::state::UniqueInfo`]): [`UNIQUE_TAG`], then this.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct SnapshotUnique {
    key: String,
    hold_ms: Option<u64>,
}

/// A delayed run's start ([`crate::state::DelayInfo`]): [`DELAY_TAG`], then this.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct SnapshotDelay {
    due_at_ms: UnixMs,
    idle_timeout_ms: Option<u64>,
    heartbeat_ms: Option<u64>,
    ended: Option<SnapshotAdmission>,
}

impl SnapshotDelay {
    fn of(delay: &DelayInfo) -> SnapshotDelay {
        SnapshotDelay {
            due_at_ms: delay.due_at_ms,
            idle_timeout_ms: delay.idle_timeout_ms,
            heartbeat_ms: delay.heartbeat_ms,
            ended: delay.ended.as_ref().map(|ended| SnapshotAdmission {
                by: ended.by.clone(),
                at_ms: ended.at_ms,
            }),
        }
    }

    fn into_info(self) -> DelayInfo {
        DelayInfo {
            due_at_ms: self.due_at_ms,
            idle_timeout_ms: self.idle_timeout_ms,
            heartbeat_ms: self.heartbeat_ms,
            ended: self.ended.map(|ended| AdmissionInfo {
                by: ended.by,
                at_ms: ended.at_ms,
            }),
        }
    }
}

/// What follows a layout-1 snapshot's PID namespaces (and its queue, if any) when the run's
/// hooks were attempted: [`HOOKS_TAG`], then this. A snapshot without hooks is as before; one
/// with them is refused by builds without hooks, which re-derive the state from the records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct SnapshotHooks {
    hooks: Vec<SnapshotHook>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct SnapshotHook {
    hook: u32,
    attempts: u32,
    claim: Option<SnapshotHookClaim>,
    last: Option<SnapshotHookEnd>,
}

/// A claim, its claimant's PID namespace beside the identity (the wire identity leaves it out).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct SnapshotHookClaim {
    attempt: u32,
    claimant: ProcessIdentity,
    claimant_pid_namespace: Option<u64>,
    by: String,
    lease_ms: u64,
    at_ms: UnixMs,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct SnapshotHookEnd {
    attempt: u32,
    outcome: HookOutcome,
    retry_at_ms: Option<UnixMs>,
    at_ms: UnixMs,
}

impl SnapshotHooks {
    fn of(hooks: &[HookState]) -> SnapshotHooks {
        SnapshotHooks {
            hooks: hooks
                .iter()
                .map(|hook| SnapshotHook {
                    hook: hook.hook,
                    attempts: hook.attempts,
                    claim: hook.claim.as_ref().map(|claim| SnapshotHookClaim {
                        attempt: claim.attempt,
                        claimant: claim.claimant.clone(),
                        claimant_pid_namespace: claim.claimant.pid_namespace,
                        by: claim.by.clone(),
                        lease_ms: claim.lease_ms,
                        at_ms: claim.at_ms,
                    }),
                    last: hook.last.as_ref().map(|last| SnapshotHookEnd {
                        attempt: last.attempt,
                        outcome: last.outcome.clone(),
                        retry_at_ms: last.retry_at_ms,
                        at_ms: last.at_ms,
                    }),
                })
                .collect(),
        }
    }

    fn into_states(self) -> Vec<HookState> {
        self.hooks
            .into_iter()
            .map(|hook| HookState {
                hook: hook.hook,
                attempts: hook.attempts,
                claim: hook.claim.map(|claim| HookClaim {
                    attempt: claim.attempt,
                    claimant: ProcessIdentity {
                        pid_namespace: claim.claimant_pid_namespace,
                        ..claim.claimant
                    },
                    by: claim.by,
                    lease_ms: claim.lease_ms,
                    at_ms: claim.at_ms,
                }),
                last: hook.last.map(|last| HookAttemptEnd {
                    attempt: last.attempt,
                    outcome: last.outcome,
                    retry_at_ms: last.retry_at_ms,
                    at_ms: last.at_ms,
                }),
            })
            .collect()
    }
}

/// What follows the PID namespaces of a layout-1 snapshot of a run with steer requests (a
/// third extension at its end): [`EXTRAS_MARK`], then the run's queue if it has one, then its
/// steer requests. The mark is a byte no queue begins with (a queue's name, which comes first,
/// is at least one byte long, so its length is never 0): a snapshot without steer requests is
/// as before, and builds without steering refuse one with them and re-derive the state from
/// the records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct SnapshotExtras {
    queue: Option<SnapshotQueue>,
    steers: Vec<SteerV1>,
}

/// The byte that opens [`SnapshotExtras`] where a bare queue would otherwise begin.
const EXTRAS_MARK: u8 = 0;

/// A steer request in a snapshot (without its message, which its record holds).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SteerV1 {
    pub id: String,
    pub mode: SteerMode,
    pub source: String,
    pub preview: String,
    pub requested_at_ms: UnixMs,
    pub seq: u64,
    pub targets: Vec<SteerTargetV1>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SteerTargetV1 {
    pub step: u32,
    pub delivery: SteerDeliveryV1,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SteerDeliveryV1 {
    Queued,
    Delivered { at_ms: UnixMs },
    Undelivered { at_ms: UnixMs, why: UndeliveredV1 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum UndeliveredV1 {
    StepEnded,
    RunEnded,
}

impl SteerV1 {
    fn of(steer: &SteerInfo) -> SteerV1 {
        SteerV1 {
            id: steer.id.clone(),
            mode: steer.mode,
            source: steer.source.clone(),
            preview: steer.preview.clone(),
            requested_at_ms: steer.requested_at_ms,
            seq: steer.seq,
            targets: steer
                .targets
                .iter()
                .map(|target| SteerTargetV1 {
                    step: target.step,
                    delivery: match target.delivery {
                        SteerDelivery::Queued => SteerDeliveryV1::Queued,
                        SteerDelivery::Delivered { at_ms } => SteerDeliveryV1::Delivered { at_ms },
                        SteerDelivery::Undelivered { at_ms, why } => SteerDeliveryV1::Undelivered {
                            at_ms,
                            why: match why {
                                Undelivered::StepEnded => UndeliveredV1::StepEnded,
                                Undelivered::RunEnded => UndeliveredV1::RunEnded,
                            },
                        },
                    },
                })
                .collect(),
        }
    }

    fn into_info(self) -> SteerInfo {
        SteerInfo {
            id: self.id,
            mode: self.mode,
            source: self.source,
            preview: self.preview,
            requested_at_ms: self.requested_at_ms,
            seq: self.seq,
            targets: self
                .targets
                .into_iter()
                .map(|target| SteerTarget {
                    step: target.step,
                    delivery: match target.delivery {
                        SteerDeliveryV1::Queued => SteerDelivery::Queued,
                        SteerDeliveryV1::Delivered { at_ms } => SteerDelivery::Delivered { at_ms },
                        SteerDeliveryV1::Undelivered { at_ms, why } => SteerDelivery::Undelivered {
                            at_ms,
                            why: match why {
                                UndeliveredV1::StepEnded => Undelivered::StepEnded,
                                UndeliveredV1::RunEnded => Undelivered::RunEnded,
                            },
                        },
                    },
                })
                .collect(),
        }
    }
}

/// The stored bytes of `state`'s snapshot: postcard of [`SnapshotV1`], then — when it has any
/// of them — its PID namespaces ([`SnapshotNamespaces`]); its queue ([`SnapshotQueue`]) or, for
/// a run with steer requests, [`SnapshotExtras`] after their mark; its hooks
/// ([`SnapshotHooks`]), its dependencies ([`SnapshotDependencies`]) and its delayed start
/// ([`SnapshotDelay`]), each after its tag; then a CRC-32C of everything before. Encoded from the state
/// as it is, through borrowed twins of the wire types that encode to the same bytes where it can
/// (the append path encodes a snapshot for every batch), into one buffer.
pub(crate) fn encode_snapshot(state: &RunState) -> Result<Vec<u8>, EncodeError> {
    let serialize_error = |error: postcard::Error| EncodeError::Serialize {
        reason: error.to_string(),
    };
    let mut bytes = Vec::with_capacity(ENCODE_CAPACITY);
    bytes = postcard::to_extend(&SnapshotOf::of(state), bytes).map_err(serialize_error)?;
    let namespaces = SnapshotNamespaces::of(state);
    let has_steers = !state.steers.is_empty();
    let has_hooks = !state.hooks.is_empty();
    if namespaces.is_some()
        || state.queue.is_some()
        || has_steers
        || has_hooks
        || state.dependencies.is_some()
        || state.delay.is_some()
        || state.unique.is_some()
        || state.retry.is_some()
        || !state.step_stops.is_empty()
    {
        let namespaces = namespaces.unwrap_or_else(|| SnapshotNamespaces::none(state.steps.len()));
        bytes = postcard::to_extend(&namespaces, bytes).map_err(serialize_error)?;
        if has_steers {
            bytes.push(EXTRAS_MARK);
            let extras = SnapshotExtras {
                queue: state.queue.as_ref().map(SnapshotQueue::of),
                steers: state.steers.iter().map(SteerV1::of).collect(),
            };
            bytes = postcard::to_extend(&extras, bytes).map_err(serialize_error)?;
        } else if let Some(queue) = &state.queue {
            bytes = postcard::to_extend(&QueueOf::of(queue), bytes).map_err(serialize_error)?;
        }
        if has_hooks {
            bytes.push(HOOKS_TAG);
            bytes = postcard::to_extend(&SnapshotHooks::of(&state.hooks), bytes)
                .map_err(serialize_error)?;
        }
        if let Some(dependencies) = &state.dependencies {
            bytes.push(DEPENDENCIES_TAG);
            bytes = postcard::to_extend(&SnapshotDependencies::of(dependencies), bytes)
                .map_err(serialize_error)?;
        }
        if let Some(delay) = &state.delay {
            bytes.push(DELAY_TAG);
            bytes =
                postcard::to_extend(&SnapshotDelay::of(delay), bytes).map_err(serialize_error)?;
        }
        if let Some(unique) = &state.unique {
            bytes.push(UNIQUE_TAG);
            let unique = SnapshotUnique {
                key: unique.key.clone(),
                hold_ms: unique.hold_ms,
            };
            bytes = postcard::to_extend(&unique, bytes).map_err(serialize_error)?;
        }
        if let Some(retry) = &state.retry {
            bytes.push(RETRY_TAG);
            bytes =
                postcard::to_extend(&SnapshotRetry::of(retry), bytes).map_err(serialize_error)?;
        }
        if !state.step_stops.is_empty() {
            bytes.push(STEP_STOPS_TAG);
            let stops: Vec<SnapshotStepStop> =
                state.step_stops.iter().map(SnapshotStepStop::of).collect();
            bytes = postcard::to_extend(&stops, bytes).map_err(serialize_error)?;
        }
    }
    event::push_checksum(&mut bytes);
    if bytes.len() > MAX_SNAPSHOT_BYTES {
        return Err(EncodeError::TooLarge {
            event: "snapshot",
            bytes: bytes.len(),
        });
    }
    Ok(bytes)
}

/// What a snapshot's buffer starts with: enough for a run of a few steps without growing.
const ENCODE_CAPACITY: usize = 1024;

/// [`SnapshotV1`] of a state, borrowed: the same fields in the same order, each of a type that
/// encodes as the wire type's (a reference encodes as what it refers to, a slice as a `Vec`), so
/// its postcard bytes are [`SnapshotV1`]'s, without copying the state's texts first.
#[derive(Serialize)]
struct SnapshotOf<'a> {
    layout: u16,
    run_id: RunId,
    spec: &'a RunSpec,
    created_at_ms: UnixMs,
    session_id: &'a Option<String>,
    completion_owner_id: &'a Option<String>,
    tool_call_id: &'a Option<String>,
    status: RunStatusV1,
    runner: Option<RunnerOf<'a>>,
    steps: StepsOf<'a>,
    controls: ControlsOf<'a>,
    terminal: Option<TerminalOf<'a>>,
    process_terminal: Option<ProcessTerminalOf<'a>>,
    dismissed_at_ms: Option<UnixMs>,
    head_seq: u64,
    updated_at_ms: UnixMs,
}

/// [`RunnerV1`], borrowed.
#[derive(Serialize)]
struct RunnerOf<'a> {
    identity: &'a ProcessIdentity,
    instance_id: &'a str,
    started_at_ms: UnixMs,
}

/// [`StepV1`], borrowed.
#[derive(Serialize)]
struct StepOf<'a> {
    status: StepStatusV1,
    process: &'a Option<ProcessIdentity>,
    started_at_ms: Option<UnixMs>,
    ended_at_ms: Option<UnixMs>,
    exit_code: Option<i32>,
    error: &'a Option<String>,
    job: &'a Option<ExternalJobStatus>,
    job_updated_at_ms: Option<UnixMs>,
}

/// [`ControlV1`], borrowed.
#[derive(Serialize)]
struct ControlOf<'a> {
    action: ControlAction,
    by: &'a str,
    reason: &'a str,
    at_ms: UnixMs,
}

/// [`TerminalV1`], borrowed.
#[derive(Serialize)]
struct TerminalOf<'a> {
    state: TerminalState,
    error: &'a Option<String>,
    summary: &'a str,
    exit_code: i32,
    repaired_by: Option<Repairer>,
    at_ms: UnixMs,
}

/// [`ProcessTerminalV1`], borrowed.
#[derive(Serialize)]
struct ProcessTerminalOf<'a> {
    instance_id: &'a str,
    exit: Option<ProcessExit>,
    proof: Proof,
    observer: Observer,
    at_ms: UnixMs,
}

/// [`SnapshotQueue`], borrowed.
#[derive(Serialize)]
struct QueueOf<'a> {
    name: &'a str,
    idle_timeout_ms: Option<u64>,
    heartbeat_ms: Option<u64>,
    joined_at_ms: UnixMs,
    admitted: Option<AdmissionOf<'a>>,
}

/// [`SnapshotAdmission`], borrowed.
#[derive(Serialize)]
struct AdmissionOf<'a> {
    by: &'a str,
    at_ms: UnixMs,
}

/// A state's steps, encoded as a `Vec<StepV1>` is.
struct StepsOf<'a>(&'a [StepState]);

impl Serialize for StepsOf<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter().map(|step| StepOf {
            status: step.status.into(),
            process: &step.process,
            started_at_ms: step.started_at_ms,
            ended_at_ms: step.ended_at_ms,
            exit_code: step.exit_code,
            error: &step.error,
            job: &step.job,
            job_updated_at_ms: step.job_updated_at_ms,
        }))
    }
}

/// A state's control requests, encoded as a `Vec<ControlV1>` is.
struct ControlsOf<'a>(&'a [ControlInfo]);

impl Serialize for ControlsOf<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter().map(|control| ControlOf {
            action: control.action,
            by: &control.by,
            reason: &control.reason,
            at_ms: control.at_ms,
        }))
    }
}

impl<'a> SnapshotOf<'a> {
    fn of(state: &'a RunState) -> SnapshotOf<'a> {
        SnapshotOf {
            layout: SNAPSHOT_LAYOUT,
            run_id: state.run_id,
            spec: &state.spec,
            created_at_ms: state.created_at_ms,
            session_id: &state.session_id,
            completion_owner_id: &state.completion_owner_id,
            tool_call_id: &state.tool_call_id,
            status: state.status.into(),
            runner: state.runner.as_ref().map(|runner| RunnerOf {
                identity: &runner.identity,
                instance_id: &runner.instance_id,
                started_at_ms: runner.started_at_ms,
            }),
            steps: StepsOf(&state.steps),
            controls: ControlsOf(&state.controls),
            terminal: state.terminal.as_ref().map(|terminal| TerminalOf {
                state: terminal.state,
                error: &terminal.error,
                summary: &terminal.summary,
                exit_code: terminal.exit_code,
                repaired_by: terminal.repaired_by,
                at_ms: terminal.at_ms,
            }),
            process_terminal: state
                .process_terminal
                .as_ref()
                .map(|observed| ProcessTerminalOf {
                    instance_id: &observed.instance_id,
                    exit: observed.exit,
                    proof: observed.proof,
                    observer: observed.observer,
                    at_ms: observed.at_ms,
                }),
            dismissed_at_ms: state.dismissed_at_ms,
            head_seq: state.head_seq,
            updated_at_ms: state.updated_at_ms,
        }
    }
}

impl<'a> QueueOf<'a> {
    fn of(queue: &'a QueueInfo) -> QueueOf<'a> {
        QueueOf {
            name: &queue.name,
            idle_timeout_ms: queue.idle_timeout_ms,
            heartbeat_ms: queue.heartbeat_ms,
            joined_at_ms: queue.joined_at_ms,
            admitted: queue.admitted.as_ref().map(|admitted| AdmissionOf {
                by: &admitted.by,
                at_ms: admitted.at_ms,
            }),
        }
    }
}

/// The hooks after a snapshot's queue: none, or [`HOOKS_TAG`] and them (never an empty list);
/// what follows is nothing or its dependencies, delayed start or key.
fn decode_hooks(rest: &[u8]) -> Result<(Vec<HookState>, &[u8]), SnapshotError> {
    match rest {
        []
        | [
            DEPENDENCIES_TAG | DELAY_TAG | UNIQUE_TAG | RETRY_TAG | STEP_STOPS_TAG,
            ..,
        ] => Ok((Vec::new(), rest)),
        [HOOKS_TAG, hooks @ ..] => match postcard::take_from_bytes::<SnapshotHooks>(hooks) {
            Ok((
                hooks,
                rest @ ([]
                | [
                    DEPENDENCIES_TAG | DELAY_TAG | UNIQUE_TAG | RETRY_TAG | STEP_STOPS_TAG,
                    ..,
                ]),
            )) if !hooks.hooks.is_empty() => Ok((hooks.into_states(), rest)),
            _ => Err(SnapshotError::Malformed {
                reason: format!(
                    "{} bytes after its queue that are not its hooks",
                    rest.len()
                ),
            }),
        },
        rest => Err(SnapshotError::Malformed {
            reason: format!("{} bytes after its queue", rest.len()),
        }),
    }
}

/// The dependencies after a snapshot's hooks: none, or [`DEPENDENCIES_TAG`] and them; what
/// follows is nothing or its delayed start.
fn decode_dependencies(rest: &[u8]) -> Result<(Option<DependencyInfo>, &[u8]), SnapshotError> {
    match rest {
        [] | [DELAY_TAG | UNIQUE_TAG | RETRY_TAG | STEP_STOPS_TAG, ..] => Ok((None, rest)),
        [DEPENDENCIES_TAG, dependencies @ ..] => {
            match postcard::take_from_bytes::<SnapshotDependencies>(dependencies) {
                Ok((
                    dependencies,
                    rest @ ([] | [DELAY_TAG | UNIQUE_TAG | RETRY_TAG | STEP_STOPS_TAG, ..]),
                )) => Ok((Some(dependencies.into_info()), rest)),
                _ => Err(SnapshotError::Malformed {
                    reason: format!(
                        "{} bytes after its hooks that are not its dependencies",
                        rest.len()
                    ),
                }),
            }
        }
        rest => Err(SnapshotError::Malformed {
            reason: format!("{} bytes after its hooks", rest.len()),
        }),
    }
}

/// Decodes stored snapshot bytes of `run`: size, then checksum, then layout, then the fields,
/// then whether the state is `run`'s and agrees with its spec.
pub(crate) fn decode_snapshot(run: RunId, bytes: &[u8]) -> Result<RunState, SnapshotError> {
    if bytes.is_empty() {
        return Err(SnapshotError::Empty);
    }
    if bytes.len() > MAX_SNAPSHOT_BYTES {
        return Err(SnapshotError::TooLarge { bytes: bytes.len() });
    }
    let malformed = |error: postcard::Error| SnapshotError::Malformed {
        reason: error.to_string(),
    };
    let (payload, is_intact) = event::split_checksum(bytes).ok_or(SnapshotError::Malformed {
        reason: "shorter than its checksum".to_string(),
    })?;
    if !is_intact {
        return Err(SnapshotError::Checksum);
    }
    let (layout, _) = postcard::take_from_bytes::<u16>(payload).map_err(malformed)?;
    if layout != SNAPSHOT_LAYOUT {
        return Err(SnapshotError::OtherLayout { found: layout });
    }
    match postcard::take_from_bytes::<SnapshotV1>(payload).map_err(malformed)? {
        (snapshot, []) => snapshot.into_state(run),
        (snapshot, rest) => {
            let not_namespaces = || SnapshotError::Malformed {
                reason: format!(
                    "{} bytes after the snapshot that are not its PID namespaces",
                    rest.len()
                ),
            };
            let (namespaces, rest) = match postcard::take_from_bytes::<SnapshotNamespaces>(rest) {
                Ok(taken) => taken,
                Err(_) => return Err(not_namespaces()),
            };
            let not_extensions = |rest: &[u8]| SnapshotError::Malformed {
                reason: format!(
                    "{} bytes after its PID namespaces that are neither its queue, its steer requests nor its hooks",
                    rest.len()
                ),
            };
            let (queue, steers, rest) = match rest {
                []
                | [
                    HOOKS_TAG | DEPENDENCIES_TAG | DELAY_TAG | UNIQUE_TAG | RETRY_TAG
                    | STEP_STOPS_TAG,
                    ..,
                ] => (None, Vec::new(), rest),
                [EXTRAS_MARK, extras @ ..] => {
                    match postcard::take_from_bytes::<SnapshotExtras>(extras) {
                        // Written only for a run with steer requests.
                        Ok((extras, rest)) if !extras.steers.is_empty() => (
                            extras.queue.map(SnapshotQueue::into_info),
                            extras.steers.into_iter().map(SteerV1::into_info).collect(),
                            rest,
                        ),
                        _ => return Err(not_extensions(rest)),
                    }
                }
                rest => match postcard::take_from_bytes::<SnapshotQueue>(rest) {
                    Ok((queue, rest)) => (Some(queue.into_info()), Vec::new(), rest),
                    Err(_) => return Err(not_extensions(rest)),
                },
            };
            let (hooks, rest) = decode_hooks(rest)?;
            let (dependencies, rest) = decode_dependencies(rest)?;
            let (delay, rest) = decode_delay(rest)?;
            let (unique, rest) = decode_unique(rest)?;
            let (retry, rest) = decode_retry(rest)?;
            let step_stops = decode_step_stops(rest)?;
            let mut state = snapshot.into_state(run)?;
            if queue.is_some()
                || !steers.is_empty()
                || !hooks.is_empty()
                || dependencies.is_some()
                || delay.is_some()
                || unique.is_some()
                || retry.is_some()
                || !step_stops.is_empty()
            {
                state.queue = queue;
                state.steers = steers;
                state.hooks = hooks;
                state.dependencies = dependencies;
                state.delay = delay;
                state.unique = unique;
                state.retry = retry;
                state.step_stops = step_stops;
                state.check_shape().map_err(SnapshotError::Invalid)?;
            }
            namespaces.apply(&mut state)?;
            Ok(state)
        }
    }
}

/// The delayed start near the end of a snapshot, after its hooks and dependencies: nothing,
/// or [`DELAY_TAG`] and a [`SnapshotDelay`]; what follows is nothing or its key.
fn decode_delay(rest: &[u8]) -> Result<(Option<DelayInfo>, &[u8]), SnapshotError> {
    match rest {
        [] | [UNIQUE_TAG | RETRY_TAG | STEP_STOPS_TAG, ..] => Ok((None, rest)),
        [DELAY_TAG, delay @ ..] => match postcard::take_from_bytes::<SnapshotDelay>(delay) {
            Ok((delay, rest @ ([] | [UNIQUE_TAG | RETRY_TAG | STEP_STOPS_TAG, ..]))) => {
                Ok((Some(delay.into_info()), rest))
            }
            _ => Err(SnapshotError::Malformed {
                reason: format!(
                    "{} bytes after its hooks that are not its delayed start",
                    rest.len()
                ),
            }),
        },
        rest => Err(SnapshotError::Malformed {
            reason: format!("{} bytes after its hooks", rest.len()),
        }),
    }
}

/// The key near the end of a snapshot, after everything but its retries: nothing, or
/// [`UNIQUE_TAG`] and a [`SnapshotUnique`]; what follows is nothing or its retries.
fn decode_unique(rest: &[u8]) -> Result<(Option<UniqueInfo>, &[u8]), SnapshotError> {
    match rest {
        [] | [RETRY_TAG | STEP_STOPS_TAG, ..] => Ok((None, rest)),
        [UNIQUE_TAG, unique @ ..] => match postcard::take_from_bytes::<SnapshotUnique>(unique) {
            Ok((unique, rest @ ([] | [RETRY_TAG | STEP_STOPS_TAG, ..]))) => Ok((
                Some(UniqueInfo {
                    key: unique.key,
                    hold_ms: unique.hold_ms,
                }),
                rest,
            )),
            _ => Err(SnapshotError::Malformed {
                reason: format!(
                    "{} bytes after its delayed start that are not its key",
                    rest.len()
                ),
            }),
        },
        rest => Err(SnapshotError::Malformed {
            reason: format!("{} bytes after its delayed start", rest.len()),
        }),
    }
}

/// The retries near the end of a snapshot, after everything but its steps' stops: nothing, or
/// [`RETRY_TAG`] and a [`SnapshotRetry`]; what follows is nothing or its steps' stops.
fn decode_retry(rest: &[u8]) -> Result<(Option<RetryInfo>, &[u8]), SnapshotError> {
    match rest {
        [] | [STEP_STOPS_TAG, ..] => Ok((None, rest)),
        [RETRY_TAG, retry @ ..] => match postcard::take_from_bytes::<SnapshotRetry>(retry) {
            Ok((retry, rest @ ([] | [STEP_STOPS_TAG, ..]))) => Ok((Some(retry.into_info()), rest)),
            _ => Err(SnapshotError::Malformed {
                reason: format!(
                    "{} bytes after its key that are not its retries",
                    rest.len()
                ),
            }),
        },
        rest => Err(SnapshotError::Malformed {
            reason: format!("{} bytes after its key", rest.len()),
        }),
    }
}

/// The steps' stops at the end of a snapshot, after everything else: nothing, or
/// [`STEP_STOPS_TAG`] and a non-empty list of [`SnapshotStepStop`] that ends the bytes.
fn decode_step_stops(rest: &[u8]) -> Result<Vec<StepStopInfo>, SnapshotError> {
    match rest {
        [] => Ok(Vec::new()),
        [STEP_STOPS_TAG, stops @ ..] => {
            match postcard::take_from_bytes::<Vec<SnapshotStepStop>>(stops) {
                Ok((stops, [])) if !stops.is_empty() => {
                    Ok(stops.into_iter().map(SnapshotStepStop::into_info).collect())
                }
                _ => Err(SnapshotError::Malformed {
                    reason: format!(
                        "{} bytes after its retries that are not its steps' stops",
                        rest.len()
                    ),
                }),
            }
        }
        rest => Err(SnapshotError::Malformed {
            reason: format!("{} bytes after its retries", rest.len()),
        }),
    }
}

/// Snapshot bytes in a layout this build does not read, as a later version might write them:
/// `layout_one` (snapshot bytes of layout 1) relabelled as layout 2, with one field added at the
/// end (`last_heartbeat_ms: Option<u64>`), under a checksum that matches. For tests of what
/// readers and appenders do with a snapshot of another layout; `None` if `layout_one` is not a
/// layout-1 snapshot.
#[cfg(any(test, feature = "testkit"))]
pub(crate) fn snapshot_of_layout_two_for_tests(
    layout_one: &[u8],
    last_heartbeat_ms: Option<u64>,
) -> Option<Vec<u8>> {
    let (payload, is_intact) = event::split_checksum(layout_one)?;
    // Layout 1 is the varint 1, one byte.
    let (&1, fields) = payload.split_first()? else {
        return None;
    };
    if !is_intact {
        return None;
    }
    let mut layout_two = vec![2];
    layout_two.extend_from_slice(fields);
    layout_two.extend(postcard::to_allocvec(&last_heartbeat_ms).ok()?);
    Some(event::with_checksum(&layout_two))
}

/// [`decode_snapshot`], for tests that check what a forged snapshot decodes to.
#[cfg(any(test, feature = "testkit"))]
pub(crate) fn decode_snapshot_for_tests(
    run: RunId,
    bytes: &[u8],
) -> Result<RunState, SnapshotError> {
    decode_snapshot(run, bytes)
}

/// `payload` followed by its CRC-32C, as snapshots and records end: for tests that forge them.
#[cfg(any(test, feature = "testkit"))]
pub(crate) fn with_checksum_for_tests(payload: &[u8]) -> Vec<u8> {
    event::with_checksum(payload)
}

/// The snapshot bytes of `state`, as the `runs` table stores them. For tests that edit a
/// journal behind the library's back (to check that `verify` notices); never needed otherwise.
#[cfg(any(test, feature = "testkit"))]
pub(crate) fn encode_snapshot_for_tests(state: &RunState) -> Result<Vec<u8>, EncodeError> {
    encode_snapshot(state)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::encode_checked;
    use crate::event::{
        Event, FORMAT_VERSION, JobState, Mode, Record, StepAction, StepSpec, WriterId,
    };
    use crate::state;

    const RUN: RunId = RunId::from_bytes([3; 16]);

    /// `events` as the records of run `RUN`, numbered from 1, 1 ms apart from 10 ms.
    fn records_of(events: Vec<Event>) -> Vec<Record> {
        events
            .into_iter()
            .enumerate()
            .map(|(index, event)| Record {
                format_version: FORMAT_VERSION,
                run_id: RUN,
                seq: index as u64 + 1,
                time_ms: 10 + index as u64,
                writer: WriterId(1),
                writer_seq: 1,
                event,
            })
            .collect()
    }

    /// A run with every optional part of its state filled: a runner, a step with a process and
    /// a job, a control request, a terminal, a process terminal, a dismissal.
    fn full_state() -> RunState {
        let identity = ProcessIdentity {
            pid: 42,
            start_time: 7,
            boot_id: "boot".to_string(),
            pid_namespace: None,
        };
        let events = vec![
            Event::RunCreated {
                spec: Arc::new(RunSpec {
                    name: Some("n".to_string()),
                    mode: Mode::Chain,
                    concurrency: 1,
                    timeout_ms: Some(1000),
                    cwd: None,
                    steps: vec![
                        StepSpec {
                            name: "job".to_string(),
                            action: StepAction::ExternalJob {
                                provider: "p".to_string(),
                            },
                        },
                        StepSpec {
                            name: "after".to_string(),
                            action: StepAction::Shell {
                                script: "true".to_string(),
                            },
                        },
                    ],
                }),
                created_at_ms: 1,
                session_id: Some("s".to_string()),
                completion_owner_id: Some("o".to_string()),
                tool_call_id: Some("t".to_string()),
            },
            Event::RunnerStarted {
                runner: identity.clone(),
                instance_id: "i".to_string(),
            },
            Event::StepRunning {
                step: 0,
                process: Some(identity),
            },
            Event::ExternalJobUpdated {
                step: 0,
                job: ExternalJobStatus {
                    state: JobState::Running,
                    id: Some("j".to_string()),
                    progress: Some(0.5),
                    message: Some("m".to_string()),
                    url: Some("u".to_string()),
                },
            },
            Event::ControlRequested {
                action: ControlAction::Interrupt,
                by: "b".to_string(),
                reason: "r".to_string(),
            },
            Event::Terminal {
                state: TerminalState::Paused,
                error: Some("e".to_string()),
                summary: "s".to_string(),
                exit_code: 130,
                repaired_by: Some(Repairer::Reconciler),
            },
            Event::ProcessTerminalObserved {
                instance_id: "i".to_string(),
                exit: Some(ProcessExit {
                    code: None,
                    signal: Some(2),
                }),
                proof: Proof::Observed,
                observer: Observer::RunnerParent,
            },
            Event::Dismissed { at_ms: 99 },
        ];
        let records = records_of(events);
        state::replay(&records)
            .expect("a legal life")
            .expect("records")
    }

    #[test]
    fn a_state_round_trips_through_its_snapshot_in_layout_one() {
        let state = full_state();
        assert!(state.terminal.is_some() && state.process_terminal.is_some());
        assert_eq!(SnapshotV1::of(&state).into_state(RUN), Ok(state.clone()));
        let bytes = encode_snapshot(&state).expect("encodes");
        assert_eq!(bytes[0], 1, "the layout leads, as the varint 1");
        assert_eq!(decode_snapshot(RUN, &bytes), Ok(state));
    }

    /// A run's retries follow everything else, its key and a queue included, after their own
    /// tag: on its first attempt, while it waits for its second (a delay beside its queue), on
    /// it, and once it ended with the first runner's end kept.
    #[test]
    fn retries_round_trip_after_the_key_beside_a_queue() {
        let identity = |pid| ProcessIdentity {
            pid,
            start_time: 7,
            boot_id: "b".to_string(),
            pid_namespace: Some(4_026_531_836),
        };
        let records = records_of(vec![
            crate::testkit::created(crate::testkit::chain_spec(1), 1, Default::default()),
            Event::QueueJoined {
                queue: "q".to_string(),
                idle_timeout_ms: None,
                heartbeat_ms: Some(5),
            },
            Event::RetryPolicy {
                retries: 2,
                backoff_ms: 1,
                backoff_max_ms: 8,
                on: crate::event::RetryOn::default_causes(),
                idle_timeout_ms: None,
                heartbeat_ms: Some(5),
            },
            Event::UniqueKey {
                key: "k".to_string(),
                hold_ms: None,
            },
            Event::QueueAdmitted {
                by: "a".to_string(),
            },
            Event::RunnerStarted {
                runner: identity(40),
                instance_id: "i1".to_string(),
            },
            Event::AttemptEnded {
                attempt: 1,
                cause: crate::event::AttemptCause::Exit,
                error: Some("failed".to_string()),
                summary: "s".to_string(),
                exit_code: 3,
                retry_at_ms: 12,
            },
            Event::DelayEnded {
                by: "t".to_string(),
            },
            Event::QueueAdmitted {
                by: "a".to_string(),
            },
            Event::RunnerStarted {
                runner: identity(41),
                instance_id: "i2".to_string(),
            },
            Event::ProcessTerminalObserved {
                instance_id: "i1".to_string(),
                exit: None,
                proof: Proof::Unknown,
                observer: Observer::Reconciler,
            },
            Event::Terminal {
                state: TerminalState::Stopped,
                error: None,
                summary: "s".to_string(),
                exit_code: 143,
                repaired_by: None,
            },
        ]);
        for count in [3, 4, 6, 7, 8, 10, 12] {
            let state = state::replay(&records[..count])
                .expect("a legal life")
                .expect("records");
            assert!(state.retry.is_some());
            let bytes = encode_snapshot(&state).expect("encodes");
            assert_eq!(
                decode_snapshot(RUN, &bytes),
                Ok(state),
                "after {count} records"
            );
        }
    }

    /// Regression: a run that waits for its dependencies alone (no queue, no process yet) round
    /// trips. Its snapshot was refused as namespaces "all absent", and every read folded the
    /// run's records again in its place.
    #[test]
    fn dependencies_alone_round_trip() {
        let records = records_of(vec![
            crate::testkit::created(crate::testkit::chain_spec(1), 1, Default::default()),
            Event::DependsOn {
                after: vec![RunId::from_bytes([9; 16])],
                after_any: Vec::new(),
                idle_timeout_ms: None,
                heartbeat_ms: None,
            },
        ]);
        let state = state::replay(&records)
            .expect("a legal life")
            .expect("records");
        let bytes = encode_snapshot(&state).expect("encodes");
        assert_eq!(decode_snapshot(RUN, &bytes), Ok(state));
    }

    /// A step's stops follow everything else, after their own tag: alone, and after the
    /// retries and the key of a run in a queue; a snapshot cut inside them, or with bytes after
    /// them, is refused.
    #[test]
    fn step_stops_round_trip_after_the_retries() {
        let stop = |step| Event::StepStopRequested {
            step,
            by: "host".to_string(),
            reason: "enough".to_string(),
        };
        let runner = Event::RunnerStarted {
            runner: ProcessIdentity {
                pid: 40,
                start_time: 7,
                boot_id: "b".to_string(),
                pid_namespace: None,
            },
            instance_id: "i1".to_string(),
        };
        let plain = records_of(vec![
            crate::testkit::created(crate::testkit::chain_spec(2), 1, Default::default()),
            runner.clone(),
            stop(1),
        ]);
        let retried = records_of(vec![
            crate::testkit::created(crate::testkit::chain_spec(2), 1, Default::default()),
            Event::QueueJoined {
                queue: "q".to_string(),
                idle_timeout_ms: None,
                heartbeat_ms: Some(5),
            },
            Event::RetryPolicy {
                retries: 2,
                backoff_ms: 1,
                backoff_max_ms: 8,
                on: crate::event::RetryOn::default_causes(),
                idle_timeout_ms: None,
                heartbeat_ms: Some(5),
            },
            Event::UniqueKey {
                key: "k".to_string(),
                hold_ms: None,
            },
            stop(0),
            stop(1),
        ]);
        for records in [&plain, &retried] {
            let state = state::replay(records)
                .expect("a legal life")
                .expect("records");
            assert!(!state.step_stops.is_empty());
            let bytes = encode_snapshot(&state).expect("encodes");
            assert_eq!(decode_snapshot(RUN, &bytes), Ok(state.clone()));
            let (payload, _) = event::split_checksum(&bytes).expect("a checksum");
            for broken in [
                with_checksum_for_tests(&payload[..payload.len() - 1]),
                with_checksum_for_tests(&[payload, &[0]].concat()),
            ] {
                assert!(
                    matches!(
                        decode_snapshot(RUN, &broken),
                        Err(SnapshotError::Malformed { .. })
                    ),
                    "{:?}",
                    decode_snapshot(RUN, &broken)
                );
            }
        }
    }

    /// A run's key follows everything else, a delayed start included, after its own tag: while
    /// it waits, and once it ended.
    #[test]
    fn a_key_round_trips_after_the_delayed_start() {
        let created = crate::testkit::created(crate::testkit::chain_spec(1), 1, Default::default());
        let events = vec![
            created,
            Event::StartDelayed {
                due_at_ms: 11,
                idle_timeout_ms: None,
                heartbeat_ms: None,
            },
            Event::UniqueKey {
                key: "deploy".to_string(),
                hold_ms: Some(60_000),
            },
            Event::Terminal {
                state: TerminalState::Stopped,
                error: None,
                summary: "s".to_string(),
                exit_code: 143,
                repaired_by: None,
            },
        ];
        let records = records_of(events);
        for count in [3, 4] {
            let state = state::replay(&records[..count])
                .expect("a legal life")
                .expect("records");
            assert_eq!(
                state.unique.as_ref().map(|unique| unique.key.as_str()),
                Some("deploy")
            );
            let bytes = encode_snapshot(&state).expect("encodes");
            assert_eq!(
                decode_snapshot(RUN, &bytes),
                Ok(state),
                "after {count} records"
            );
        }
        // Without a delayed start, the key follows the PID namespaces directly.
        let mut events: Vec<Event> = records.into_iter().map(|record| record.event).collect();
        events.remove(1);
        let state = state::replay(&records_of(events)[..2])
            .expect("a legal life")
            .expect("records");
        let bytes = encode_snapshot(&state).expect("encodes");
        assert_eq!(decode_snapshot(RUN, &bytes), Ok(state));
    }

    /// A delayed run's start follows everything else, hooks included, after its own tag: while
    /// it waits, once it started, and once it ended with a hook attempted.
    #[test]
    fn a_delayed_start_round_trips_after_the_hooks() {
        let created = crate::testkit::created(crate::testkit::chain_spec(1), 1, Default::default());
        let identity = crate::testkit::identity(42);
        let events = vec![
            created,
            Event::StartDelayed {
                due_at_ms: 11,
                idle_timeout_ms: Some(5),
                heartbeat_ms: None,
            },
            Event::DelayEnded {
                by: "timer".to_string(),
            },
            Event::RunnerStarted {
                runner: identity.clone(),
                instance_id: "i".to_string(),
            },
            Event::Terminal {
                state: TerminalState::Failed,
                error: Some("e".to_string()),
                summary: "s".to_string(),
                exit_code: 1,
                repaired_by: None,
            },
            Event::HookAttempted {
                hook: 0,
                attempt: 1,
                claimant: identity,
                by: "runner".to_string(),
                lease_ms: 1000,
            },
        ];
        let records = records_of(events);
        for count in [2, 3, 4, 6] {
            let state = state::replay(&records[..count])
                .expect("a legal life")
                .expect("records");
            assert!(state.delay.is_some());
            let bytes = encode_snapshot(&state).expect("encodes");
            assert_eq!(
                decode_snapshot(RUN, &bytes),
                Ok(state),
                "after {count} records"
            );
        }
    }

    /// The borrowed twins encode to the bytes of the owned wire types, for a state with every
    /// optional part, with PID namespaces, and in a queue.
    #[test]
    fn a_snapshot_encodes_as_its_owned_wire_types_would() {
        let owned = |state: &RunState| {
            let mut payload = postcard::to_allocvec(&SnapshotV1::of(state)).expect("encodes");
            let namespaces = SnapshotNamespaces::of(state);
            if namespaces.is_some() || state.queue.is_some() {
                let namespaces =
                    namespaces.unwrap_or_else(|| SnapshotNamespaces::none(state.steps.len()));
                payload.extend(postcard::to_allocvec(&namespaces).expect("encodes"));
            }
            if let Some(queue) = &state.queue {
                payload.extend(postcard::to_allocvec(&SnapshotQueue::of(queue)).expect("encodes"));
            }
            event::with_checksum(&payload)
        };
        let full = full_state();
        let mut namespaced = full.clone();
        if let Some(runner) = namespaced.runner.as_mut() {
            runner.identity.pid_namespace = Some(11);
        }
        let mut queued = full.clone();
        queued.queue = Some(QueueInfo {
            name: "q".to_string(),
            idle_timeout_ms: Some(5),
            heartbeat_ms: None,
            joined_at_ms: 7,
            admitted: Some(crate::state::AdmissionInfo {
                by: "b".to_string(),
                at_ms: 8,
            }),
        });
        for state in [full, namespaced, queued] {
            assert_eq!(encode_snapshot(&state), Ok(owned(&state)));
        }
    }

    /// A state whose identities carry PID namespaces round-trips; its bytes are those of the
    /// same state without them (layout 1, as the first release wrote it), then the namespaces.
    #[test]
    fn pid_namespaces_follow_the_fields_of_layout_one() {
        let without = full_state();
        let mut with = without.clone();
        if let Some(runner) = with.runner.as_mut() {
            runner.identity.pid_namespace = Some(11);
        }
        if let Some(process) = with.steps[0].process.as_mut() {
            process.pid_namespace = Some(12);
        }
        let bytes = encode_snapshot(&with).expect("encodes");
        assert_eq!(decode_snapshot(RUN, &bytes), Ok(with.clone()));
        let layout_one = encode_snapshot(&without).expect("encodes");
        let fields = layout_one.len() - 4;
        assert_eq!(bytes[..fields], layout_one[..fields]);
        assert_eq!(
            &bytes[fields..bytes.len() - 4],
            // runner Some(11); two steps: Some(12), None
            &[1, 11, 2, 1, 12, 0],
            "the namespaces come after the fields"
        );

        let forged = |namespaces: &SnapshotNamespaces| {
            let mut payload = postcard::to_allocvec(&SnapshotV1::of(&without)).expect("encodes");
            payload.extend(postcard::to_allocvec(namespaces).expect("encodes"));
            event::with_checksum(&payload)
        };
        for (case, namespaces) in [
            (
                "one step too few",
                SnapshotNamespaces {
                    runner: Some(1),
                    steps: vec![None],
                },
            ),
            (
                "a namespace for a step without a process",
                SnapshotNamespaces {
                    runner: None,
                    steps: vec![None, Some(3)],
                },
            ),
            (
                "all absent",
                SnapshotNamespaces {
                    runner: None,
                    steps: vec![None, None],
                },
            ),
        ] {
            assert!(
                matches!(
                    decode_snapshot(RUN, &forged(&namespaces)),
                    Err(SnapshotError::Malformed { .. })
                ),
                "{case}"
            );
        }
    }

    /// postcard encodes an enum as its variant's index: the wire enums keep the order of the
    /// first release, whatever the domain enums become.
    #[test]
    fn status_variants_encode_as_their_first_release_indexes() {
        for (index, status) in RunStatus::ALL.into_iter().enumerate() {
            let wire = RunStatusV1::from(status);
            assert_eq!(
                postcard::to_allocvec(&wire).expect("encodes"),
                [index as u8]
            );
            assert_eq!(RunStatus::from(wire), status);
        }
        let steps = [
            StepStatus::Pending,
            StepStatus::Running,
            StepStatus::Complete,
            StepStatus::Failed,
            StepStatus::Stopped,
            StepStatus::Skipped,
        ];
        for (index, status) in steps.into_iter().enumerate() {
            let wire = StepStatusV1::from(status);
            assert_eq!(
                postcard::to_allocvec(&wire).expect("encodes"),
                [index as u8]
            );
            assert_eq!(StepStatus::from(wire), status);
        }
    }

    #[test]
    fn each_way_a_snapshot_can_fail_to_decode_is_told_apart() {
        let state = full_state();
        let bytes = encode_snapshot(&state).expect("encodes");
        assert_eq!(decode_snapshot(RUN, &[]), Err(SnapshotError::Empty));
        assert_eq!(
            decode_snapshot(RUN, &vec![0; MAX_SNAPSHOT_BYTES + 1]),
            Err(SnapshotError::TooLarge {
                bytes: MAX_SNAPSHOT_BYTES + 1
            })
        );
        assert!(matches!(
            decode_snapshot(RUN, &bytes[..3]),
            Err(SnapshotError::Malformed { .. })
        ));
        let mut flipped = bytes.clone();
        flipped[10] ^= 0x40;
        assert_eq!(decode_snapshot(RUN, &flipped), Err(SnapshotError::Checksum));
        let layout_two =
            snapshot_of_layout_two_for_tests(&bytes, Some(5)).expect("a layout-1 snapshot");
        assert_eq!(
            decode_snapshot(RUN, &layout_two),
            Err(SnapshotError::OtherLayout { found: 2 })
        );
        let payload = &bytes[..bytes.len() - 4];
        let trailing = event::with_checksum(&[payload, &[0]].concat());
        assert!(matches!(
            decode_snapshot(RUN, &trailing),
            Err(SnapshotError::Malformed { reason }) if reason.contains("1 bytes after")
        ));
        let other = RunId::from_bytes([4; 16]);
        assert_eq!(
            decode_snapshot(other, &bytes),
            Err(SnapshotError::OtherRun { found: RUN })
        );
        let mut missing_step = SnapshotV1::of(&state);
        missing_step.steps.pop();
        let missing_step = encode_checked(&missing_step).expect("encodes");
        assert_eq!(
            decode_snapshot(RUN, &missing_step),
            Err(SnapshotError::StepCount {
                states: 1,
                steps: 2
            })
        );
    }

    /// A run with steer requests (and a queue, and PID namespaces, or none of those)
    /// round-trips; one without them has the bytes it had before steering existed.
    #[test]
    fn steer_requests_follow_the_namespaces_after_their_mark() {
        let spec = crate::testkit::chain_spec(2);
        let plain = [
            crate::testkit::created(spec.clone(), 1, crate::event::HostIds::default()),
            crate::testkit::runner_started(crate::testkit::identity(42), "i"),
            crate::testkit::step_running(0, Some(crate::testkit::namespaced_identity(43))),
        ];
        let steered = [
            crate::testkit::steer_requested("s1", &[0, 1], "look"),
            crate::testkit::steer_delivered("s1", 0),
            crate::testkit::steer_requested("s2", &[1], "then this"),
        ];
        let queued = [
            crate::testkit::created(spec, 1, crate::event::HostIds::default()),
            Event::QueueJoined {
                queue: "q".to_string(),
                idle_timeout_ms: None,
                heartbeat_ms: None,
            },
            Event::QueueAdmitted {
                by: "b".to_string(),
            },
            crate::testkit::runner_started(crate::testkit::identity(42), "i"),
            crate::testkit::step_running(0, None),
        ];
        let fold = |events: Vec<Event>| {
            state::replay(&records_of(events))
                .expect("a legal life")
                .expect("records")
        };
        for (case, base) in [("namespaces", plain.to_vec()), ("queue", queued.to_vec())] {
            let before = fold(base.clone());
            let after = fold(base.into_iter().chain(steered.clone()).collect());
            assert_eq!(after.steers.len(), 2, "{case}");
            let bytes = encode_snapshot(&after).expect("encodes");
            assert_eq!(decode_snapshot(RUN, &bytes), Ok(after), "{case}");
            let unsteered = encode_snapshot(&before).expect("encodes");
            assert_eq!(
                decode_snapshot(RUN, &unsteered),
                Ok(before),
                "{case}: without steers as before"
            );
        }
        // Bytes after the mark that hold no steer request are refused, not taken for none.
        let mut state = fold(plain.to_vec());
        state.steers.clear();
        let mut payload = postcard::to_allocvec(&SnapshotV1::of(&state)).expect("encodes");
        payload.extend(
            postcard::to_allocvec(&SnapshotNamespaces::of(&state).expect("a namespace"))
                .expect("encodes"),
        );
        payload.push(EXTRAS_MARK);
        payload.extend(
            postcard::to_allocvec(&SnapshotExtras {
                queue: None,
                steers: Vec::new(),
            })
            .expect("encodes"),
        );
        assert!(matches!(
            decode_snapshot(RUN, &event::with_checksum(&payload)),
            Err(SnapshotError::Malformed { .. })
        ));
    }
}
