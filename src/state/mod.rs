//! The pure reducer: a run's state, and the one function that moves it forward.
//!
//! Invariant: nothing here does I/O or reads a clock. Every writer (launcher, runner,
//! reconciler, `job update`) and every reader that folds records calls [`apply`](fn@apply); none
//! re-implements a transition rule.

use std::fmt;
use std::sync::Arc;

use serde::Serialize;

mod apply;
mod shape;
pub use apply::{apply, replay};
pub use shape::{KeptInState, ShapeRule};

use crate::event::{
    AttemptCause, ControlAction, Event, ExternalJobStatus, HookOutcome, Observer, ProcessExit,
    ProcessIdentity, Proof, Repairer, RetryOn, RunId, RunSpec, SpecError, SteerMode, StepEnd,
    TerminalState, TextTooLong, UnixMs,
};

/// Where a run is in its lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum RunStatus {
    Queued,
    Running,
    Complete,
    Failed,
    Stopped,
    Paused,
}

impl RunStatus {
    /// `complete`, `failed`, `stopped` and `paused` are terminal: the runner is done with the run.
    pub fn is_terminal(self) -> bool {
        !matches!(self, RunStatus::Queued | RunStatus::Running)
    }

    /// The name used in status.json and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Queued => "queued",
            RunStatus::Running => "running",
            RunStatus::Complete => "complete",
            RunStatus::Failed => "failed",
            RunStatus::Stopped => "stopped",
            RunStatus::Paused => "paused",
        }
    }

    /// Every state, in lifecycle order.
    pub const ALL: [RunStatus; 6] = [
        RunStatus::Queued,
        RunStatus::Running,
        RunStatus::Complete,
        RunStatus::Failed,
        RunStatus::Stopped,
        RunStatus::Paused,
    ];
}

impl From<TerminalState> for RunStatus {
    fn from(state: TerminalState) -> RunStatus {
        match state {
            TerminalState::Complete => RunStatus::Complete,
            TerminalState::Failed => RunStatus::Failed,
            TerminalState::Stopped => RunStatus::Stopped,
            TerminalState::Paused => RunStatus::Paused,
        }
    }
}

impl std::str::FromStr for RunStatus {
    type Err = String;

    fn from_str(text: &str) -> Result<RunStatus, String> {
        RunStatus::ALL
            .into_iter()
            .find(|state| state.as_str() == text)
            .ok_or_else(|| {
                format!(
                    "unknown run state {text:?} (expected queued, running, complete, failed, stopped or paused)"
                )
            })
    }
}

impl fmt::Display for RunStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a step is in its lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum StepStatus {
    Pending,
    Running,
    Complete,
    Failed,
    Stopped,
    Skipped,
}

impl StepStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            StepStatus::Pending => "pending",
            StepStatus::Running => "running",
            StepStatus::Complete => "complete",
            StepStatus::Failed => "failed",
            StepStatus::Stopped => "stopped",
            StepStatus::Skipped => "skipped",
        }
    }

    /// Whether the step is over, whatever its outcome.
    pub fn is_done(self) -> bool {
        !matches!(self, StepStatus::Pending | StepStatus::Running)
    }
}

impl From<StepEnd> for StepStatus {
    fn from(end: StepEnd) -> StepStatus {
        match end {
            StepEnd::Complete => StepStatus::Complete,
            StepEnd::Failed => StepStatus::Failed,
            StepEnd::Stopped => StepStatus::Stopped,
            StepEnd::Skipped => StepStatus::Skipped,
        }
    }
}

impl fmt::Display for StepStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One step's folded state.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepState {
    pub status: StepStatus,
    pub process: Option<ProcessIdentity>,
    pub started_at_ms: Option<UnixMs>,
    pub ended_at_ms: Option<UnixMs>,
    pub exit_code: Option<i32>,
    pub error: Option<String>,
    /// The external job's last reported status; external-job steps only.
    pub job: Option<ExternalJobStatus>,
    pub job_updated_at_ms: Option<UnixMs>,
}

impl StepState {
    fn pending() -> StepState {
        StepState {
            status: StepStatus::Pending,
            process: None,
            started_at_ms: None,
            ended_at_ms: None,
            exit_code: None,
            error: None,
            job: None,
            job_updated_at_ms: None,
        }
    }
}

/// The runner that owns a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RunnerInfo {
    pub identity: ProcessIdentity,
    pub instance_id: String,
    pub started_at_ms: UnixMs,
}

/// A recorded control request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ControlInfo {
    pub action: ControlAction,
    pub by: String,
    pub reason: String,
    pub at_ms: UnixMs,
}

/// How the run ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TerminalInfo {
    pub state: TerminalState,
    pub error: Option<String>,
    pub summary: String,
    pub exit_code: i32,
    pub repaired_by: Option<Repairer>,
    pub at_ms: UnixMs,
}

/// Proof that the runner process is gone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProcessTerminalInfo {
    pub instance_id: String,
    pub exit: Option<ProcessExit>,
    pub proof: Proof,
    pub observer: Observer,
    pub at_ms: UnixMs,
}

/// The run's place in a queue (docs/design.md, "Queues").
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QueueInfo {
    pub name: String,
    /// The runner settings the launcher would have given, for whoever starts it later.
    pub idle_timeout_ms: Option<u64>,
    pub heartbeat_ms: Option<u64>,
    pub joined_at_ms: UnixMs,
    /// Set once the run took a slot.
    pub admitted: Option<AdmissionInfo>,
}

/// A delayed start (docs/design.md, "Delayed starts"): the run starts no sooner than its due
/// time, by whoever records its [`crate::event::Event::DelayEnded`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DelayInfo {
    pub due_at_ms: UnixMs,
    /// The runner settings its launcher would have given.
    pub idle_timeout_ms: Option<u64>,
    pub heartbeat_ms: Option<u64>,
    /// When and by whom its due time was taken to start it.
    pub ended: Option<AdmissionInfo>,
}

/// The key a run launched once holds (docs/design.md, "Launched once"): while it has not
/// ended, and with `hold_ms` until that long after its creation, no other run is created
/// with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UniqueInfo {
    pub key: String,
    pub hold_ms: Option<u64>,
}

impl UniqueInfo {
    /// Until when the key is held past its run's end, in ms: creation plus `hold_ms`.
    pub fn held_until_ms(&self, created_at_ms: UnixMs) -> Option<UnixMs> {
        self.hold_ms
            .map(|hold_ms| created_at_ms.saturating_add(hold_ms))
    }
}

/// A run's retries (docs/design.md, "Retries"): its policy, and each attempt that ended
/// without ending the run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RetryInfo {
    /// Most attempts after the first.
    pub retries: u32,
    pub backoff_ms: u64,
    pub backoff_max_ms: u64,
    pub on: RetryOn,
    /// The runner settings its launcher would have given, for whoever starts an attempt.
    pub idle_timeout_ms: Option<u64>,
    pub heartbeat_ms: Option<u64>,
    /// The attempts that ended and were tried again, first first.
    pub attempts: Vec<AttemptInfo>,
}

impl RetryInfo {
    /// The attempt the run is on (or waits for): 1, 2, ...
    pub fn current_attempt(&self) -> u32 {
        u32::try_from(self.attempts.len())
            .unwrap_or(u32::MAX)
            .saturating_add(1)
    }

    /// Whether an attempt that ends now may be tried again: the policy covers how it failed
    /// and retries are left.
    pub fn may_retry(&self, cause: AttemptCause, exit_code: i32) -> bool {
        self.attempts.len() < self.retries as usize && self.on.covers(cause, exit_code)
    }

    /// How long after attempt `attempt`'s end (1, 2, ...) the next is due, given `jitter` in
    /// [0, 1): the backoff doubles at each attempt up to its longest, and up to half of it is
    /// taken off at random, so runs that failed together do not all start again together.
    pub fn backoff_after_ms(&self, attempt: u32, jitter: f64) -> u64 {
        let doublings = attempt.saturating_sub(1).min(62);
        let full = self
            .backoff_ms
            .saturating_mul(1u64 << doublings)
            .min(self.backoff_max_ms);
        let jitter = if jitter.is_finite() {
            jitter.clamp(0.0, 1.0)
        } else {
            0.0
        };
        // Up to half of it off: at most `full / 2`, which an f64 of it holds closely enough.
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss
        )]
        let off = ((full / 2) as f64 * jitter) as u64;
        full - off.min(full / 2)
    }
}

/// How an attempt failed, as its ender tells it: what a `Terminal(failed)` would have said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptFailure {
    pub cause: AttemptCause,
    pub error: Option<String>,
    pub summary: String,
    pub exit_code: i32,
}

impl RunState {
    /// The `AttemptEnded` that ends the run's current attempt instead of the run, when its
    /// retry policy tries `failure` again: its next attempt due its backoff after `now_ms`
    /// (`jitter` in [0, 1) takes up to half of it off). `None`: the failure ends the run (so it
    /// does for a run stopped, interrupted, or one of whose steps a host stopped). Pure.
    pub fn retry_event(
        &self,
        failure: AttemptFailure,
        now_ms: UnixMs,
        jitter: f64,
    ) -> Option<Event> {
        let retry = self.retry.as_ref()?;
        if self.status != RunStatus::Running
            || !retry.may_retry(failure.cause, failure.exit_code)
            || self
                .controls
                .iter()
                .any(|control| control.action != ControlAction::Timeout)
            || !self.step_stops.is_empty()
        {
            return None;
        }
        let attempt = retry.current_attempt();
        Some(Event::AttemptEnded {
            attempt,
            cause: failure.cause,
            error: failure.error,
            summary: failure.summary,
            exit_code: failure.exit_code,
            retry_at_ms: now_ms.saturating_add(retry.backoff_after_ms(attempt, jitter)),
        })
    }
}

/// An attempt that ended and was tried again ([`crate::event::Event::AttemptEnded`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AttemptInfo {
    pub attempt: u32,
    pub cause: AttemptCause,
    pub error: Option<String>,
    pub summary: String,
    pub exit_code: i32,
    pub ended_at_ms: UnixMs,
    pub retry_at_ms: UnixMs,
    /// Its runner's instance, if one took the attempt.
    pub runner_instance: Option<String>,
    /// Its runner's process end, once recorded.
    pub process_terminal: Option<ProcessTerminalInfo>,
}

/// When and by whom a queued run took its slot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AdmissionInfo {
    pub by: String,
    pub at_ms: UnixMs,
}

/// The runs a run waits for before it starts (docs/design.md, "Dependencies").
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DependencyInfo {
    /// Each must end `complete`; one that ends otherwise ends this run without starting.
    pub after: Vec<RunId>,
    /// Each must end, however.
    pub after_any: Vec<RunId>,
    /// The runner settings the launcher would have given, for whoever starts it later.
    pub idle_timeout_ms: Option<u64>,
    pub heartbeat_ms: Option<u64>,
    /// Set once the journal found every dependency ended as asked (`DependenciesMet`).
    pub met: Option<AdmissionInfo>,
}

impl DependencyInfo {
    /// Every run waited for: `after`, then `after_any`.
    pub fn runs(&self) -> impl Iterator<Item = RunId> + '_ {
        self.after.iter().chain(&self.after_any).copied()
    }
}

/// How a run's dependencies stand (docs/design.md, "Dependencies").
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DependencyVerdict {
    /// Some have yet to end (these, in the order named).
    Waiting { pending: Vec<RunId> },
    /// Every one ended as asked: the run may start.
    Met,
    /// `dependency`, which had to end `complete`, ended `ended` (`None`: it is no longer in
    /// the journal): the run ends without starting.
    Failed {
        dependency: RunId,
        ended: Option<RunStatus>,
    },
}

impl DependencyInfo {
    /// The verdict on these dependencies, given each run's state (`None`: not in the
    /// journal). A failed `after` dependency decides at once, even while others have yet to
    /// end; an `after_any` one no longer in the journal has ended (only ended runs are
    /// pruned). Pure.
    pub fn verdict(
        &self,
        mut status_of: impl FnMut(RunId) -> Option<RunStatus>,
    ) -> DependencyVerdict {
        let mut pending = Vec::new();
        for &dependency in &self.after {
            match status_of(dependency) {
                None => {
                    return DependencyVerdict::Failed {
                        dependency,
                        ended: None,
                    };
                }
                Some(RunStatus::Complete) => {}
                Some(status) if status.is_terminal() => {
                    return DependencyVerdict::Failed {
                        dependency,
                        ended: Some(status),
                    };
                }
                Some(_) => pending.push(dependency),
            }
        }
        for &dependency in &self.after_any {
            if status_of(dependency).is_some_and(|status| !status.is_terminal()) {
                pending.push(dependency);
            }
        }
        if pending.is_empty() {
            DependencyVerdict::Met
        } else {
            DependencyVerdict::Waiting { pending }
        }
    }
}

/// One completion hook's deliveries (docs/design.md, "Hooks"): its attempts so far, the one
/// claimed now, and how the last one ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HookState {
    /// Its place in the run's hook list.
    pub hook: u32,
    /// Attempts claimed so far, the open one included (1, 2, ...).
    pub attempts: u32,
    /// The attempt claimed and not yet ended.
    pub claim: Option<HookClaim>,
    /// How the last attempt that ended went.
    pub last: Option<HookAttemptEnd>,
}

/// An attempt claimed: who runs it, and for how long the claim holds while that process lives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HookClaim {
    pub attempt: u32,
    pub claimant: ProcessIdentity,
    pub by: String,
    pub lease_ms: u64,
    pub at_ms: UnixMs,
}

/// How an attempt ended, and when the next one is due (`None`: none follows).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HookAttemptEnd {
    pub attempt: u32,
    pub outcome: HookOutcome,
    pub retry_at_ms: Option<UnixMs>,
    pub at_ms: UnixMs,
}

impl HookState {
    /// An attempt exited 0: the hook is never run again.
    pub fn is_delivered(&self) -> bool {
        self.last
            .as_ref()
            .is_some_and(|last| last.outcome.is_delivered())
    }

    /// Its last attempt failed and none follows.
    pub fn is_given_up(&self) -> bool {
        self.last
            .as_ref()
            .is_some_and(|last| !last.outcome.is_delivered() && last.retry_at_ms.is_none())
    }

    /// Delivered or given up: no attempt follows.
    pub fn is_settled(&self) -> bool {
        self.is_delivered() || self.is_given_up()
    }
}
/// A steer request of the run (docs/design.md, "Steering"): its message stays in its record
/// (at [`SteerInfo::seq`]), so a state of many requests stays small.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SteerInfo {
    pub id: String,
    pub mode: SteerMode,
    pub source: String,
    /// The start of its message ([`crate::event::steer_preview`]).
    pub preview: String,
    pub requested_at_ms: UnixMs,
    /// The seq of its `SteerRequested` record, which holds the message.
    pub seq: u64,
    /// One per target step, in the order requested.
    pub targets: Vec<SteerTarget>,
}

impl SteerInfo {
    /// Whether some target has yet to take it.
    pub fn is_queued(&self) -> bool {
        self.targets
            .iter()
            .any(|target| target.delivery == SteerDelivery::Queued)
    }
}

/// A steer request's target step and how far its message got there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SteerTarget {
    pub step: u32,
    pub delivery: SteerDelivery,
}

/// How far a steer message got to one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum SteerDelivery {
    /// Not taken yet: it is in the step's inbox, or will be once the step starts.
    Queued,
    /// The step took it (`SteerDelivered`).
    Delivered { at_ms: UnixMs },
    /// The step, or the run, ended before the step took it.
    Undelivered { at_ms: UnixMs, why: Undelivered },
}

/// Why a steer message never reached its step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum Undelivered {
    /// The step ended first.
    StepEnded,
    /// The run ended first (but by a pause, which keeps its messages for its resume).
    RunEnded,
}

/// A host's request that one step end ([`crate::event::Event::StepStopRequested`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StepStopInfo {
    pub step: u32,
    pub by: String,
    pub reason: String,
    pub at_ms: UnixMs,
}

/// A run's state: the fold of its records.
///
/// The domain type, never stored as it is: the journal stores it as a snapshot of a wire type
/// of its own (`journal::format::snapshot::SnapshotV1`), converted explicitly, so this type can change
/// freely. It (and its parts) serializes only to be shown as JSON (`verify`'s differences,
/// `journal-tools inspect run --json`), and deserializes from nothing.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunState {
    pub run_id: RunId,
    pub spec: Arc<RunSpec>,
    pub created_at_ms: UnixMs,
    pub session_id: Option<String>,
    pub completion_owner_id: Option<String>,
    pub tool_call_id: Option<String>,
    pub status: RunStatus,
    pub runner: Option<RunnerInfo>,
    pub steps: Vec<StepState>,
    /// At most one request per action, in the order they were recorded.
    pub controls: Vec<ControlInfo>,
    pub terminal: Option<TerminalInfo>,
    pub process_terminal: Option<ProcessTerminalInfo>,
    pub dismissed_at_ms: Option<UnixMs>,
    /// Its queue, when it was created in one.
    pub queue: Option<QueueInfo>,
    /// The runs it waits for, when it was created with some.
    pub dependencies: Option<DependencyInfo>,
    /// Its delayed start, when it was created with one.
    pub delay: Option<DelayInfo>,
    /// The key it holds, when it was launched once by one ([`crate::event::Event::UniqueKey`]).
    pub unique: Option<UniqueInfo>,
    /// Its retry policy and the attempts that ended without ending it, when it was created
    /// with retries ([`crate::event::Event::RetryPolicy`]).
    pub retry: Option<RetryInfo>,
    /// Its completion hooks that were attempted, by hook (only once the run is terminal).
    pub hooks: Vec<HookState>,
    /// Its steer requests, in the order they were recorded.
    pub steers: Vec<SteerInfo>,
    /// The requests that one step end, at most one per step, in the order recorded.
    pub step_stops: Vec<StepStopInfo>,
    /// Sequence number of the last record applied.
    pub head_seq: u64,
    /// Time of the last record applied.
    pub updated_at_ms: UnixMs,
}

/// Why a state read from disk (a snapshot) is not one the reducer could have made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ShapeError {
    #[error("its spec is not one a run may have: {0}")]
    Spec(#[from] SpecError),
    #[error("it has {states} step states for {steps} steps")]
    StepCount { states: usize, steps: usize },
    /// Another [`ShapeRule`] broken.
    #[error("{}", .0.broken_text())]
    Broken(ShapeRule),
}

impl ShapeError {
    /// The rule broken.
    pub fn rule(&self) -> ShapeRule {
        match self {
            ShapeError::Spec(_) => ShapeRule::SpecChecks,
            ShapeError::StepCount { .. } => ShapeRule::StepPerSpecStep,
            ShapeError::Broken(rule) => *rule,
        }
    }
}

impl RunState {
    /// Checks every rule that each state [`apply`](fn@apply) makes keeps ([`ShapeRule::ALL`], in its
    /// order; the first broken is returned): among them what the runner, the reconciler and
    /// the projector rely on — a spec that passes [`RunSpec::check`] (so a runner never meets
    /// an empty command or a parallel run of concurrency 0), one step state per step, a
    /// terminal record exactly when the state is terminal, a runner once running, no step
    /// running outside a running run, a job's progress a finite number. The reducer's rules
    /// and these are tied by one table ([`TransitionError::kept_in_state`]). Pure. A snapshot
    /// read from disk passes it before anyone acts on it.
    pub fn check_shape(&self) -> Result<(), ShapeError> {
        ShapeRule::ALL
            .into_iter()
            .try_for_each(|rule| rule.check(self))
    }

    /// [`RunState::check_shape`] without [`ShapeRule::SpecChecks`]: what the journal checks,
    /// in every build, of the state each batch folds to before it stores it. A spec is checked
    /// by the reducer when `RunCreated` records it, and by `check_shape` when a snapshot is
    /// read, and no event changes it after; checking it again for every batch would walk every
    /// step's command and environment for nothing.
    pub fn check_folded_shape(&self) -> Result<(), ShapeError> {
        ShapeRule::ALL
            .into_iter()
            .filter(|rule| *rule != ShapeRule::SpecChecks)
            .try_for_each(|rule| rule.check(self))
    }

    /// Terminal: the runner is done with the run.
    pub fn is_terminal(&self) -> bool {
        self.status.is_terminal()
    }

    /// Closed: terminal, and the runner process is known to be gone.
    pub fn is_closed(&self) -> bool {
        self.is_terminal() && self.process_terminal.is_some()
    }

    /// Stale: the runner is gone but nobody has recorded how the run ended.
    pub fn is_stale(&self) -> bool {
        !self.is_terminal() && self.process_terminal.is_some()
    }

    /// Ended before any runner took it (the launcher gave up on it, or it was ended while
    /// queued): none of its steps ran.
    pub fn ended_unstarted(&self) -> bool {
        self.is_terminal() && self.runner.is_none()
    }

    /// Whether a control request of this kind has been recorded.
    pub fn has_control(&self, action: ControlAction) -> bool {
        self.controls.iter().any(|control| control.action == action)
    }

    /// The request that step `step` end, if one was recorded.
    pub fn step_stop(&self, step: u32) -> Option<&StepStopInfo> {
        self.step_stops.iter().find(|stop| stop.step == step)
    }

    /// The number of steps that are over.
    pub fn steps_done(&self) -> usize {
        self.steps
            .iter()
            .filter(|step| step.status.is_done())
            .count()
    }

    /// Waiting in a queue for a slot: in a queue, not admitted, not terminal, and waiting for
    /// no dependency (a run takes its place among its queue's waiting runs only once its
    /// dependencies are met).
    pub fn is_waiting_for_slot(&self) -> bool {
        !self.is_terminal()
            && !self.is_waiting_for_dependencies()
            && !self.is_waiting_for_due()
            && self
                .queue
                .as_ref()
                .is_some_and(|queue| queue.admitted.is_none())
    }

    /// Waiting for its dependencies: it has some, they are not met, and it is not terminal.
    pub fn is_waiting_for_dependencies(&self) -> bool {
        !self.is_terminal()
            && self
                .dependencies
                .as_ref()
                .is_some_and(|dependencies| dependencies.met.is_none())
    }

    /// Waiting for something before its runner may start: its dependencies, a slot of its
    /// queue or its due time. No runner is due yet, and a stop ends it without one.
    pub fn is_waiting(&self) -> bool {
        self.is_waiting_for_dependencies()
            || self.is_waiting_for_slot()
            || self.is_waiting_for_due()
    }

    /// Holding a slot of its queue: admitted and not terminal. The slot frees with the run's
    /// `Terminal`.
    pub fn holds_slot(&self) -> bool {
        !self.is_terminal()
            && self
                .queue
                .as_ref()
                .is_some_and(|queue| queue.admitted.is_some())
    }

    /// Waiting for its due time: delayed, its delay not ended, not terminal.
    pub fn is_waiting_for_due(&self) -> bool {
        !self.is_terminal()
            && self
                .delay
                .as_ref()
                .is_some_and(|delay| delay.ended.is_none())
    }

    /// When the run became startable: its admission in a queue, the end of its delay, else its
    /// creation. The start grace counts from here.
    ///
    /// A retried run's wait for its next attempt is a delay: after an attempt ended, it counts
    /// from that delay's end (or, in a queue, from its admission again).
    pub fn startable_at_ms(&self) -> Option<UnixMs> {
        match (&self.queue, &self.delay, &self.dependencies) {
            (Some(queue), _, _) => queue.admitted.as_ref().map(|admitted| admitted.at_ms),
            (None, Some(delay), _) => delay.ended.as_ref().map(|ended| ended.at_ms),
            (None, None, Some(dependencies)) => dependencies.met.as_ref().map(|met| met.at_ms),
            (None, None, None) => Some(self.created_at_ms),
        }
    }

    /// The runner settings its launcher kept for a later starter: its queue's, else its
    /// dependencies', else its delayed start's, else its retry policy's. `(idle_timeout_ms,
    /// heartbeat_ms)`.
    pub fn kept_runner_settings(&self) -> (Option<u64>, Option<u64>) {
        match (&self.queue, &self.dependencies, &self.delay, &self.retry) {
            (Some(queue), ..) => (queue.idle_timeout_ms, queue.heartbeat_ms),
            (None, Some(dependencies), ..) => {
                (dependencies.idle_timeout_ms, dependencies.heartbeat_ms)
            }
            (None, None, Some(delay), _) => (delay.idle_timeout_ms, delay.heartbeat_ms),
            (None, None, None, Some(retry)) => (retry.idle_timeout_ms, retry.heartbeat_ms),
            (None, None, None, None) => (None, None),
        }
    }

    /// How many of its attempts ended and were tried again.
    pub fn ended_attempts(&self) -> usize {
        self.retry.as_ref().map_or(0, |retry| retry.attempts.len())
    }

    /// The attempt that ended and was tried again whose runner was `instance_id`.
    pub fn attempt_of_runner(&self, instance_id: &str) -> Option<&AttemptInfo> {
        self.retry
            .as_ref()?
            .attempts
            .iter()
            .find(|attempt| attempt.runner_instance.as_deref() == Some(instance_id))
    }

    /// Waiting for its next attempt: an attempt ended and was tried again, and no runner took
    /// the next yet.
    pub fn is_between_attempts(&self) -> bool {
        self.status == RunStatus::Queued
            && self
                .retry
                .as_ref()
                .is_some_and(|retry| !retry.attempts.is_empty())
    }

    /// The delivery state of hook `hook`, once an attempt of it was claimed.
    pub fn hook(&self, hook: u32) -> Option<&HookState> {
        self.hooks.iter().find(|state| state.hook == hook)
    }

    /// End time: the `Terminal` record's time, once there is one.
    pub fn ended_at_ms(&self) -> Option<UnixMs> {
        self.terminal.as_ref().map(|terminal| terminal.at_ms)
    }

    /// The steer requests some target has yet to take.
    pub fn queued_steers(&self) -> impl Iterator<Item = &SteerInfo> {
        self.steers.iter().filter(|steer| steer.is_queued())
    }

    /// The steer request of this id.
    pub fn steer(&self, id: &str) -> Option<&SteerInfo> {
        self.steers.iter().find(|steer| steer.id == id)
    }

    /// Whether a host's repair ended the run ([`crate::event::Event::HostEnded`]).
    pub fn is_ended_by_host(&self) -> bool {
        self.terminal
            .as_ref()
            .is_some_and(|terminal| terminal.repaired_by == Some(Repairer::Host))
    }
}

/// A rule of the lifecycle that a record breaks. The journal is left unchanged.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum TransitionError {
    #[error("run {run}: {event} comes before RunCreated; a run's first record must be RunCreated")]
    NotCreated { run: RunId, event: &'static str },
    #[error("run {run} already exists; RunCreated may only be its first record")]
    AlreadyCreated { run: RunId },
    #[error("run {run}: RunCreated must have seq 1, not {found}")]
    CreatedNotFirst { run: RunId, found: u64 },
    #[error("run {run}: record seq {found} does not follow head {head}")]
    SequenceGap { run: RunId, head: u64, found: u64 },
    #[error("run {run}: a record of run {found} cannot be applied to it")]
    WrongRun { run: RunId, found: RunId },
    #[error("run {run}: invalid spec: {source}")]
    InvalidSpec { run: RunId, source: SpecError },
    #[error("run {run}: {source}")]
    TextTooLong { run: RunId, source: TextTooLong },
    #[error("run {run}: RunnerStarted needs the run queued, but it is {state}")]
    RunnerNotQueued { run: RunId, state: RunStatus },
    #[error(
        "run {run}: RunnerStarted after the run's process terminal was observed ({proof}); the launcher gave up on this run"
    )]
    RunnerAfterProcessTerminal { run: RunId, proof: &'static str },
    #[error("run {run}: {event} names step {step}, but the run has {count} steps")]
    NoSuchStep {
        run: RunId,
        event: &'static str,
        step: u32,
        count: usize,
    },
    #[error("run {run}: StepRunning({step}) needs the run running, but it is {state}")]
    StepStartWhileNotRunning {
        run: RunId,
        step: u32,
        state: RunStatus,
    },
    #[error("run {run}: StepRunning({step}) needs step {step} pending, but it is {status}")]
    StepNotPending {
        run: RunId,
        step: u32,
        status: StepStatus,
    },
    #[error("run {run}: chain step {step} cannot start while earlier step {earlier} is {status}")]
    ChainOrder {
        run: RunId,
        step: u32,
        earlier: usize,
        status: StepStatus,
    },
    #[error(
        "run {run}: parallel step {step} cannot start: {running} steps are running and the concurrency is {concurrency}"
    )]
    ConcurrencyExceeded {
        run: RunId,
        step: u32,
        running: usize,
        concurrency: u32,
    },
    #[error("run {run}: {event}({step}) needs step {step} running, but it is {status}")]
    StepNotRunning {
        run: RunId,
        event: &'static str,
        step: u32,
        status: StepStatus,
    },
    #[error(
        "run {run}: StepFinished({step}, skipped) needs step {step} pending, but it is {status}"
    )]
    SkipNotPending {
        run: RunId,
        step: u32,
        status: StepStatus,
    },
    #[error("run {run}: step {step} ({name}) is not an external-job step")]
    NotExternalJob { run: RunId, step: u32, name: String },
    #[error(
        "run {run}: ExternalJobUpdated({step}) has progress {progress}, which is not a finite number"
    )]
    NonFiniteProgress {
        run: RunId,
        step: u32,
        progress: f64,
    },
    #[error(
        "run {run}: {event} after the run ended {state}; only ProcessTerminalObserved and Dismissed may follow Terminal"
    )]
    AfterTerminal {
        run: RunId,
        event: &'static str,
        state: RunStatus,
    },
    #[error("run {run}: a {} was already requested", action.as_str())]
    ControlAlreadyRequested { run: RunId, action: ControlAction },
    #[error(
        "run {run}: Terminal(complete) while step {step} is {status}; a complete run has every step complete"
    )]
    CompleteWithUnfinishedStep {
        run: RunId,
        step: u32,
        status: StepStatus,
    },
    #[error("run {run}: the process terminal of runner instance {instance} was already observed")]
    ProcessTerminalAlreadyObserved { run: RunId, instance: String },
    #[error(
        "run {run}: ProcessTerminalObserved names runner instance {found}, but the run's runner is instance {expected}"
    )]
    InstanceMismatch {
        run: RunId,
        expected: String,
        found: String,
    },
    #[error("run {run}: ProcessTerminalObserved with proof {proof}, but {why}")]
    ProofMismatch {
        run: RunId,
        proof: &'static str,
        why: &'static str,
    },
    #[error("run {run} was already dismissed")]
    AlreadyDismissed { run: RunId },
    #[error(
        "run {run}: Resumed must be the record right after RunCreated (seq 2), but the head is {head}"
    )]
    ResumedNotAtCreation { run: RunId, head: u64 },
    #[error("run {run}: Resumed names the run itself; a run resumes another, paused run")]
    ResumedFromItself { run: RunId },
    #[error(
        "run {run}: QueueJoined at seq {found}; a run joins a queue only in its creation batch, right after RunCreated"
    )]
    QueueJoinedLate { run: RunId, found: u64 },
    #[error("run {run}: {source}")]
    InvalidQueueName {
        run: RunId,
        source: crate::event::QueueNameError,
    },
    #[error("run {run}: QueueAdmitted, but the run is in no queue")]
    NotInQueue { run: RunId },
    #[error("run {run} was already admitted by its queue {queue}")]
    AlreadyAdmitted { run: RunId, queue: String },
    #[error(
        "run {run}: RunnerStarted while the run waits in queue {queue}; a queued run starts only once admitted"
    )]
    RunnerBeforeAdmission { run: RunId, queue: String },
    #[error(
        "run {run}: DependsOn at seq {found}; a run's dependencies are recorded only in its creation batch, right after RunCreated or its QueueJoined"
    )]
    DependsOnLate { run: RunId, found: u64 },
    #[error("run {run}: its dependencies {flaw}")]
    InvalidDependencies { run: RunId, flaw: &'static str },
    #[error("run {run}: DependenciesMet, but the run waits for no run")]
    NoDependencies { run: RunId },
    #[error("run {run}: its dependencies were already met")]
    DependenciesAlreadyMet { run: RunId },
    #[error(
        "run {run}: {event} while the run waits for its dependencies; it starts or takes a slot only once they are met"
    )]
    BeforeDependencies { run: RunId, event: &'static str },
    #[error(
        "run {run}: StartDelayed at seq {found}; a run is delayed only in its creation batch, right after RunCreated"
    )]
    StartDelayedLate { run: RunId, found: u64 },
    #[error(
        "run {run}: UniqueKey at seq {found}; a run holds a key only from its creation batch, as its last event, once"
    )]
    UniqueKeyLate { run: RunId, found: u64 },
    #[error(
        "run {run}: RetryPolicy at seq {found}; a run gets its retries only in its creation batch, after its other events and before its key, once"
    )]
    RetryPolicyLate { run: RunId, found: u64 },
    #[error("run {run}: its retry policy: {flaw}")]
    InvalidRetryPolicy { run: RunId, flaw: String },
    #[error("run {run}: AttemptEnded, but the run has no retries")]
    NoRetries { run: RunId },
    #[error(
        "run {run}: AttemptEnded({found}), but the run is on attempt {current}, and only a runner's attempt ends"
    )]
    AttemptNotCurrent {
        run: RunId,
        current: u32,
        found: u32,
    },
    #[error("run {run}: AttemptEnded({attempt}), but its {retries} retries are spent")]
    RetriesSpent {
        run: RunId,
        attempt: u32,
        retries: u32,
    },
    #[error(
        "run {run}: AttemptEnded after a {} was requested; a stopped or interrupted run is not tried again", action.as_str()
    )]
    AttemptAfterControl { run: RunId, action: ControlAction },
    #[error("run {run}: DelayEnded, but the run has no delayed start")]
    NotDelayed { run: RunId },
    #[error("run {run}: its delay already ended")]
    DelayAlreadyEnded { run: RunId },
    #[error("run {run}: DelayEnded at {at_ms} ms, before its due time {due_at_ms} ms")]
    NotYetDue {
        run: RunId,
        due_at_ms: UnixMs,
        at_ms: UnixMs,
    },
    #[error(
        "run {run}: RunnerStarted while the run waits for its due time {due_at_ms} ms; a delayed run starts only once its delay ended"
    )]
    RunnerBeforeDue { run: RunId, due_at_ms: UnixMs },
    #[error("run {run}: {event} while the run is {state}; hooks run only once the run has ended")]
    HookBeforeEnd {
        run: RunId,
        event: &'static str,
        state: RunStatus,
    },
    #[error(
        "run {run}: {event} names hook {hook}, but a run has at most {} hooks",
        crate::event::MAX_HOOKS
    )]
    HookOutOfRange {
        run: RunId,
        event: &'static str,
        hook: u32,
    },
    #[error(
        "run {run}: attempt {found} of hook {hook} claimed, but the next attempt is {expected}"
    )]
    HookAttemptNotNext {
        run: RunId,
        hook: u32,
        expected: u32,
        found: u32,
    },
    #[error("run {run}: hook {hook} has attempt {attempt} claimed and not ended")]
    HookAttemptOpen { run: RunId, hook: u32, attempt: u32 },
    #[error("run {run}: hook {hook} was {how}; no attempt follows")]
    HookSettled {
        run: RunId,
        hook: u32,
        how: &'static str,
    },
    #[error(
        "run {run}: HookEnded for attempt {attempt} of hook {hook}, which is not the attempt claimed"
    )]
    HookNotClaimed { run: RunId, hook: u32, attempt: u32 },
    #[error("run {run}: attempt {attempt} of hook {hook} sets a retry, but {why}")]
    HookRetryNotAllowed {
        run: RunId,
        hook: u32,
        attempt: u32,
        why: &'static str,
    },
    #[error("run {run}: steer request {id:?}: {flaw}")]
    InvalidSteer {
        run: RunId,
        id: String,
        flaw: &'static str,
    },
    #[error(
        "run {run}: steer request {id:?} names step {step}, which is {status}; a message goes only to a step that has yet to end"
    )]
    SteerToEndedStep {
        run: RunId,
        id: String,
        step: u32,
        status: StepStatus,
    },
    #[error("run {run} already has a steer request {id:?}")]
    SteerIdReused { run: RunId, id: String },
    #[error(
        "run {run} already has {} steer requests waiting to be taken; no more are taken until one is",
        crate::event::MAX_PENDING_STEERS
    )]
    SteerQueueFull { run: RunId },
    #[error(
        "run {run} has taken {} steer requests, all one run may",
        crate::event::MAX_STEERS_PER_RUN
    )]
    TooManySteers { run: RunId },
    #[error("run {run}: SteerDelivered names steer request {id:?}, which the run does not have")]
    NoSuchSteer { run: RunId, id: String },
    #[error(
        "run {run}: SteerDelivered({id:?}, step {step}), but that message is not waiting for that step"
    )]
    SteerNotQueued { run: RunId, id: String, step: u32 },
    #[error("run {run}: step {step} is {status}; only a pending or running step is stopped")]
    StepNotStoppable {
        run: RunId,
        step: u32,
        status: StepStatus,
    },
    #[error("run {run}: a stop of step {step} is already requested")]
    StepStopAlreadyRequested { run: RunId, step: u32 },
    #[error(
        "run {run}: AttemptEnded after a stop of step {step} was requested; a run a host stopped a step of is not tried again"
    )]
    AttemptAfterStepStop { run: RunId, step: u32 },
}

#[cfg(test)]
mod tests;
