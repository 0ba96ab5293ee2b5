//! What anyone may do to a run from outside its runner: ask it to stop, push an external job's
//! status, dismiss it. Each is an append through the reducer, made before anything is acted on.
//!
//! Invariant: the runner is signalled only after the request is durable and only if the
//! process recorded as its runner is alive by its full identity (pid, start time, boot id, PID
//! namespace), through [`process_group::signal_process`], so a stranger that reused the pid is
//! never signalled, and a runner of another PID namespace is left to see the request itself.

use nix::sys::signal::Signal;

use crate::control_inbox;
use crate::event::{ControlAction, Event, ExternalJobStatus, RunId, SteerMode, now_ms};
use crate::journal::{AppendError, Appended, Condition, ReadError};
use crate::liveness::{self, Liveness};
use crate::process_group;
use crate::state::{RunState, RunStatus, StepStatus, TransitionError};
use crate::store::Store;

/// The signal `stop` sends the runner. The runner treats it (and SIGINT) as a stop request,
/// recording one itself if nobody has.
pub const STOP_SIGNAL: Signal = Signal::SIGTERM;

/// Why a control operation was refused or failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ControlError {
    #[error("run {run} is not in the journal")]
    UnknownRun { run: RunId },
    #[error("run {run} has no step {step} (it has {count} steps, numbered from 0)")]
    NoSuchStep { run: RunId, step: u32, count: usize },
    #[error("run {run}: step {step} ({name}) is not an external-job step")]
    NotExternalJob { run: RunId, step: u32, name: String },
    #[error("{0}")]
    Refused(#[source] TransitionError),
    #[error(transparent)]
    Append(AppendError),
    #[error(transparent)]
    Read(#[from] ReadError),
}

impl ControlError {
    /// Whether the caller asked for something the run cannot take (as opposed to a failure of
    /// the journal): the CLI's exit code 2.
    pub fn is_bad_input(&self) -> bool {
        matches!(
            self,
            ControlError::UnknownRun { .. }
                | ControlError::NoSuchStep { .. }
                | ControlError::NotExternalJob { .. }
                | ControlError::Refused(_)
        )
    }
}

impl From<AppendError> for ControlError {
    fn from(error: AppendError) -> ControlError {
        match error {
            AppendError::Transition { source, .. } => ControlError::Refused(source),
            AppendError::UnknownRun { run } => ControlError::UnknownRun { run },
            other => ControlError::Append(other),
        }
    }
}

fn snapshot(store: &Store, run: RunId) -> Result<RunState, ControlError> {
    store
        .journal()
        .view()?
        .snapshot(run)?
        .ok_or(ControlError::UnknownRun { run })
}

/// The outcome of a stop request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopOutcome {
    /// The stop is recorded now. `signalled`: the runner was alive and was sent
    /// [`STOP_SIGNAL`]; otherwise it will see the request when it polls or starts.
    Requested { signalled: bool },
    /// A stop was already recorded; the runner was signalled again if alive.
    AlreadyRequested { signalled: bool },
    /// The run had already ended; nothing was written.
    AlreadyEnded { state: RunStatus },
    /// The run waited (`waiting`: `in queue NAME`, or `for its dependencies`): it is ended
    /// `stopped` with its request, and no runner will ever start for it.
    StoppedWaiting { waiting: String },
}

/// Most attempts to record a stop while the run's head keeps moving.
const MAX_STOP_ATTEMPTS: u32 = 64;

/// Records a stop on the head read, then signals the run's runner if it is alive. A run that
/// waits (in its queue, for its dependencies or its due time) is ended `stopped` with the
/// request in one batch: no runner will ever start for it. A run that still has a runner gets
/// `ControlRequested(stop)` alone. Each is appended on the head its decision read, so a run
/// whose attempt ended meanwhile (and now waits for its next one) is judged again as the
/// waiting run it has become, not left waiting with a request no runner will take.
pub fn request_stop(
    store: &Store,
    run: RunId,
    by: &str,
    reason: &str,
) -> Result<StopOutcome, ControlError> {
    for _ in 0..MAX_STOP_ATTEMPTS {
        let state = snapshot(store, run)?;
        if state.is_terminal() {
            return Ok(StopOutcome::AlreadyEnded {
                state: state.status,
            });
        }
        let waiting = control_inbox::waiting_text(&state);
        let already = state.has_control(ControlAction::Stop);
        if waiting.is_none() && already {
            let signalled = signal_runner(&state);
            return Ok(StopOutcome::AlreadyRequested { signalled });
        }
        let events = control_inbox::stop_events(&state, by, reason);
        match store.append(run, events, Condition::expect_head(state.head_seq)) {
            Ok(_) => {}
            Err(AppendError::HeadMismatch { .. }) => continue,
            Err(error) => return Err(error.into()),
        }
        if let Some(waiting) = waiting {
            return Ok(StopOutcome::StoppedWaiting { waiting });
        }
        let signalled = signal_runner(&snapshot(store, run)?);
        return Ok(StopOutcome::Requested { signalled });
    }
    // The head moved on every read: the run is busy recording. Its runner takes a request
    // appended on whatever head it has.
    request_control(store, run, ControlAction::Stop, by, reason)
}

/// The outcome of a request that one step stop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepStopOutcome {
    /// The stop is recorded now: the runner ends the step at its next look (every 250 ms), or
    /// skips it when its turn comes.
    Requested,
    /// A stop of that step was already recorded.
    AlreadyRequested,
    /// The step had already ended (`status`); nothing was written.
    StepEnded { status: StepStatus },
    /// The run had already ended; nothing was written.
    AlreadyEnded { state: RunStatus },
}

/// Records `StepStopRequested` of step `step` on the head read (docs/design.md, "Stopping one
/// step"). The runner is not signalled: its signals mean a stop of the whole run. A paused run
/// is ended: it stops no step.
pub fn request_step_stop(
    store: &Store,
    run: RunId,
    step: u32,
    by: &str,
    reason: &str,
) -> Result<StepStopOutcome, ControlError> {
    loop {
        let state = snapshot(store, run)?;
        if state.is_terminal() {
            return Ok(StepStopOutcome::AlreadyEnded {
                state: state.status,
            });
        }
        let Some(status) = state.steps.get(step as usize).map(|step| step.status) else {
            return Err(ControlError::NoSuchStep {
                run,
                step,
                count: state.steps.len(),
            });
        };
        if state.step_stop(step).is_some() {
            return Ok(StepStopOutcome::AlreadyRequested);
        }
        if !matches!(status, StepStatus::Pending | StepStatus::Running) {
            return Ok(StepStopOutcome::StepEnded { status });
        }
        let event = Event::StepStopRequested {
            step,
            by: by.to_string(),
            reason: reason.to_string(),
        };
        match store.append(run, vec![event], Condition::expect_head(state.head_seq)) {
            Ok(_) => return Ok(StepStopOutcome::Requested),
            // Judged again on what landed meanwhile: the step's end, the run's, another stop.
            Err(AppendError::HeadMismatch { .. }) => {}
            Err(error) => return Err(error.into()),
        }
    }
}

/// Records `ControlRequested(interrupt)`: the runner, at its next poll (every 250 ms), sends
/// each running step's process group SIGINT, waits its grace, then ends the group as a stop
/// does, and the run ends `paused` (exit 130). The runner is not signalled: its signals mean stop. A control already recorded (a stop, a
/// timeout) wins; the outcome says so.
pub fn request_interrupt(
    store: &Store,
    run: RunId,
    by: &str,
    reason: &str,
) -> Result<StopOutcome, ControlError> {
    request_control(store, run, ControlAction::Interrupt, by, reason)
}

fn request_control(
    store: &Store,
    run: RunId,
    action: ControlAction,
    by: &str,
    reason: &str,
) -> Result<StopOutcome, ControlError> {
    let event = Event::ControlRequested {
        action,
        by: by.to_string(),
        reason: reason.to_string(),
    };
    let is_new = match store.append(run, vec![event], Condition::expect_not_terminal()) {
        Ok(_) => true,
        Err(AppendError::AlreadyTerminal { state, .. }) => {
            return Ok(StopOutcome::AlreadyEnded { state });
        }
        Err(AppendError::Transition {
            source: TransitionError::ControlAlreadyRequested { .. },
            ..
        }) => false,
        Err(error) => return Err(error.into()),
    };
    let state = snapshot(store, run)?;
    let signalled = action == ControlAction::Stop && signal_runner(&state);
    Ok(if is_new {
        StopOutcome::Requested { signalled }
    } else {
        StopOutcome::AlreadyRequested { signalled }
    })
}

/// Sends [`STOP_SIGNAL`] to the run's runner if the process recorded as its runner is alive by
/// its identity. Signalling only hurries the runner: it polls the journal for the request.
fn signal_runner(state: &RunState) -> bool {
    let Some(runner) = &state.runner else {
        return false;
    };
    if state.is_terminal() {
        return false;
    }
    process_group::signal_process(&runner.identity, STOP_SIGNAL).unwrap_or(false)
}

/// A steer request just recorded, as `runjournal steer --json` prints it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Steered {
    pub run_id: String,
    pub request_id: String,
    /// The steps it waits for.
    pub steps: Vec<u32>,
    /// `steer` or `follow-up`.
    pub mode: &'static str,
    /// Whether the run is paused: the message waits for its resume.
    pub is_for_resume: bool,
    /// The seq of its record.
    pub journal_seq: u64,
}

/// Why a steer request cannot be taken.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SteerError {
    #[error(
        "run {run} was resumed by run {by}, which carries its steps on: steer run {by} instead"
    )]
    Resumed { run: RunId, by: RunId },
    #[error("run {run} has no step that has yet to end: there is nobody to steer")]
    NothingToSteer { run: RunId },
    /// The run's runner is gone without recording an outcome: nobody would write the message
    /// into a step's inbox, so it is not recorded.
    #[error(
        "run {run}: its runner (pid {pid}) is gone without recording an outcome: no runner is left to hand the message to a step, so it was not recorded; `runjournal reconcile` records the run's end"
    )]
    NoRunner { run: RunId, pid: u32 },

    #[error(transparent)]
    Control(#[from] ControlError),
}

impl SteerError {
    /// Whether the caller asked for something the run cannot take: the CLI's exit code 2.
    pub fn is_bad_input(&self) -> bool {
        match self {
            SteerError::Resumed { .. } | SteerError::NothingToSteer { .. } => true,
            SteerError::NoRunner { .. } => false,
            SteerError::Control(error) => error.is_bad_input(),
        }
    }
}

/// Records a steer request for `run`: `message` for step `step`, or for the steps the run is
/// at ([`control_inbox::steer_targets`]). The runner hands it to each target step through the
/// step's inbox once the step runs; a paused run keeps it for its resume. `source` says who
/// sent it. The reducer refuses a full queue (20 waiting), a step that ended and the limits.
/// A running run whose runner is dead (by its recorded identity, as the reconciler judges it) is
/// refused before anything is recorded ([`SteerError::NoRunner`]): nobody would hand the
/// message over. A runner that dies after that look leaves its message to the reconciler,
/// which records it undelivered unless a step took it.
pub fn steer(
    store: &Store,
    run: RunId,
    step: Option<u32>,
    mode: SteerMode,
    message: &str,
    source: &str,
) -> Result<Steered, SteerError> {
    let view = store.journal().view().map_err(ControlError::from)?;
    let state = view
        .snapshot(run)
        .map_err(ControlError::from)?
        .ok_or(ControlError::UnknownRun { run })?;
    if let Some(by) = view
        .resume_links(run)
        .map_err(ControlError::from)?
        .resumed_by
    {
        return Err(SteerError::Resumed { run, by });
    }
    drop(view);
    if let Some(pid) = dead_runner(&state) {
        return Err(SteerError::NoRunner { run, pid });
    }
    let steps = match step {
        Some(step) => vec![step],
        None => control_inbox::steer_targets(&state),
    };
    if steps.is_empty() {
        return Err(SteerError::NothingToSteer { run });
    }
    let id = ulid::Ulid::generate().to_string();
    let event = Event::SteerRequested {
        id: id.clone(),
        steps: steps.clone(),
        mode,
        message: message.to_string(),
        source: crate::event::truncate_text(source, crate::event::MAX_STEER_ID_BYTES),
    };
    let appended = store
        .append(run, vec![event], Condition::none())
        .map_err(ControlError::from)?;
    Ok(Steered {
        run_id: run.to_string(),
        request_id: id,
        steps,
        mode: mode.as_str(),
        is_for_resume: appended.state.status == RunStatus::Paused,
        journal_seq: appended.last_seq,
    })
}

/// The pid of `state`'s runner when the run has not ended and that runner is gone, in this
/// boot or an earlier one, as the reconciler judges it: never dead on a look that failed, nor
/// across PID namespaces.
fn dead_runner(state: &RunState) -> Option<u32> {
    let runner = state.runner.as_ref().filter(|_| !state.is_terminal())?;
    match liveness::check(&runner.identity) {
        Ok(Liveness::Dead | Liveness::OtherBoot) => Some(runner.identity.pid),
        Ok(Liveness::Alive | Liveness::OtherNamespace) | Err(_) => None,
    }
}

/// Pushes an external job's status for step `step`: checked against the run's spec first, then
/// appended through the reducer (which also requires the step to be running).
pub fn push_job_update(
    store: &Store,
    run: RunId,
    step: u32,
    job: ExternalJobStatus,
) -> Result<Appended, ControlError> {
    let state = snapshot(store, run)?;
    let spec = state
        .spec
        .steps
        .get(step as usize)
        .ok_or(ControlError::NoSuchStep {
            run,
            step,
            count: state.spec.steps.len(),
        })?;
    if !spec.is_external_job() {
        return Err(ControlError::NotExternalJob {
            run,
            step,
            name: spec.name.clone(),
        });
    }
    Ok(store.append(
        run,
        vec![Event::ExternalJobUpdated { step, job }],
        Condition::none(),
    )?)
}

/// The outcome of a dismissal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DismissOutcome {
    Dismissed,
    AlreadyDismissed,
}

/// Hides the run from default listings. Nothing is stopped.
pub fn dismiss(store: &Store, run: RunId) -> Result<DismissOutcome, ControlError> {
    match store.append(
        run,
        vec![Event::Dismissed { at_ms: now_ms() }],
        Condition::none(),
    ) {
        Ok(_) => Ok(DismissOutcome::Dismissed),
        Err(AppendError::Transition {
            source: TransitionError::AlreadyDismissed { .. },
            ..
        }) => Ok(DismissOutcome::AlreadyDismissed),
        Err(error) => Err(error.into()),
    }
}

/// The messages still waiting in `state`, a paused run, for the steps its resume runs: each
/// as a `SteerRequested` of the new run (same id, mode, message and source), its targets
/// renumbered as the new run numbers its steps (`steps[i]`, the paused run's step that the
/// new run's step `i` runs). For the resume's creation batch.
pub fn carried_steers(
    store: &Store,
    state: &RunState,
    steps: &[u32],
) -> Result<Vec<Event>, ReadError> {
    let new_step = |old: u32| {
        steps
            .iter()
            .position(|&step| step == old)
            .and_then(|index| u32::try_from(index).ok())
    };
    let mut carried = Vec::new();
    for steer in &state.steers {
        let targets: Vec<u32> = steer
            .targets
            .iter()
            .filter(|target| target.delivery == crate::state::SteerDelivery::Queued)
            .filter_map(|target| new_step(target.step))
            .collect();
        if targets.is_empty() {
            continue;
        }
        let record = store.journal().read_retrying(|view| {
            Ok(view
                .records_between(state.run_id, steer.seq.saturating_sub(1), steer.seq)?
                .into_iter()
                .next())
        })?;
        if let Some(Event::SteerRequested {
            id,
            mode,
            message,
            source,
            ..
        }) = record.map(|record| record.event)
        {
            carried.push(Event::SteerRequested {
                id,
                steps: targets,
                mode,
                message,
                source,
            });
        }
    }
    Ok(carried)
}
