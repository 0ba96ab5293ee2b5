//! A reference specification of a run's lifecycle (docs/design.md, "Lifecycle") and of the
//! reconciler's decisions ("Reconciler"), written for the model test and sharing no code with the library's
//! `state` (the reducer) or `reconcile` (the decision table): the model's oracle.
//!
//! It is meant to be read against the design, rule by rule: plain data, one `match` per event,
//! every rule a line. Written first from the design's words alone, it disagreed with the
//! library's reducer in seven places, each a rule the design does not state (or states
//! loosely) and the library documents; each was judged and the reducer kept (see [`Rule`],
//! the rules marked "refinement"): a second dismissal or a second request of one control
//! action, a process terminal naming another runner instance or a proof that contradicts
//! whether a runner started, a runner starting after the launcher recorded that none did, a
//! job progress that is not a finite number, and `StepFinished(skipped)` for a step that is
//! pending rather than running.
//!
//! [`apply`] answers with the new state, or with every rule the event breaks: the library must
//! refuse the same events, naming one of those rules.

use runjournal::event::{
    AttemptCause, ControlAction, Event, ExternalJobStatus, HookOutcome, MAX_TEXT_BYTES, Mode,
    Observer, ProcessExit, ProcessIdentity, Proof, Repairer, RunId, RunSpec, StepAction, StepEnd,
    TerminalState, UnixMs,
};

/// "Hooks": a run has at most this many hooks (sixteen of its own and the home's), each
/// tried at most this many times.
const HOOKS_PER_RUN: u32 = 17;
const ATTEMPTS_PER_HOOK: u32 = 5;
/// "Steering": a message is at most 128 KiB, its id and its source 256 bytes (pi-subagents'
/// limits).
const STEER_MESSAGE_LIMIT: usize = 128 * 1024;
const STEER_ID_LIMIT: usize = 256;
/// "Steering": at most 20 requests wait at once; a run takes at most 128 in its life.
const STEERS_WAITING_LIMIT: usize = 20;
const STEERS_LIMIT: usize = 128;

/// Run states ("Lifecycle"): `queued`, `running` are active; the rest terminal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Queued,
    Running,
    Complete,
    Failed,
    Stopped,
    Paused,
}

impl Status {
    /// "`paused` counts as terminal for the journal."
    pub fn is_terminal(self) -> bool {
        match self {
            Status::Queued | Status::Running => false,
            Status::Complete | Status::Failed | Status::Stopped | Status::Paused => true,
        }
    }
}

fn status_of(state: TerminalState) -> Status {
    match state {
        TerminalState::Complete => Status::Complete,
        TerminalState::Failed => Status::Failed,
        TerminalState::Stopped => Status::Stopped,
        TerminalState::Paused => Status::Paused,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepStatus {
    Pending,
    Running,
    Complete,
    Failed,
    Stopped,
    Skipped,
}

fn step_status_of(end: StepEnd) -> StepStatus {
    match end {
        StepEnd::Complete => StepStatus::Complete,
        StepEnd::Failed => StepStatus::Failed,
        StepEnd::Stopped => StepStatus::Stopped,
        StepEnd::Skipped => StepStatus::Skipped,
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub status: StepStatus,
    pub process: Option<ProcessIdentity>,
    pub exit_code: Option<i32>,
    pub error: Option<String>,
    pub job: Option<ExternalJobStatus>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ending {
    pub state: TerminalState,
    pub error: Option<String>,
    pub summary: String,
    pub exit_code: i32,
    pub repaired_by: Option<Repairer>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    pub instance_id: String,
    pub exit: Option<ProcessExit>,
    pub proof: Proof,
    pub observer: Observer,
}

/// A run as the design describes it: what each event sets. Times are left out (the model
/// cannot know the journal's clock; the fold comparison checks them).
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    pub spec: RunSpec,
    pub created_at_ms: UnixMs,
    pub session_id: Option<String>,
    pub completion_owner_id: Option<String>,
    pub tool_call_id: Option<String>,
    /// The number of records: the run's head.
    pub head: u64,
    pub status: Status,
    /// The runner's identity and instance id.
    pub runner: Option<(ProcessIdentity, String)>,
    pub steps: Vec<Step>,
    /// Control requests: action, by, reason.
    pub controls: Vec<(ControlAction, String, String)>,
    pub ending: Option<Ending>,
    pub observed: Option<Observed>,
    pub dismissed_at_ms: Option<UnixMs>,
    /// "Queues": the queue the run waits in, and whether it was admitted.
    pub queue: Option<(String, bool)>,
    /// "Dependencies": the runs it waits for (`--after`, then `--after-any`), and whether
    /// they were found met.
    pub dependencies: Option<(Vec<RunId>, Vec<RunId>, bool)>,
    /// "Delayed starts": the due time, and whether the delay ended.
    pub delay: Option<(UnixMs, bool)>,
    /// "Launched once": the key it holds, and its hold.
    pub unique: Option<(String, Option<u64>)>,
    /// "Retries": how many it may have, whether a crash is tried again, and each attempt that
    /// ended and was tried again.
    pub retry: Option<(u32, bool, Vec<Attempt>)>,
    /// "Hooks": each hook attempted, by number, in order.
    pub hooks: Vec<Hook>,
    /// "Steering": each request's id, and where its message is for each target step.
    pub steers: Vec<(String, Vec<(u32, Delivery)>)>,
    /// "Stopping one step": the steps a host stopped: step, by, reason.
    pub step_stops: Vec<(u32, String, String)>,
}

/// "Retries": an attempt that ended and was tried again, with its runner and that runner's
/// end once seen.
#[derive(Debug, Clone, PartialEq)]
pub struct Attempt {
    pub attempt: u32,
    pub cause: AttemptCause,
    pub exit_code: i32,
    pub retry_at_ms: UnixMs,
    pub instance: Option<String>,
    pub observed: Option<Observed>,
}

/// "Hooks": one hook's deliveries, times left out.
#[derive(Debug, Clone, PartialEq)]
pub struct Hook {
    pub hook: u32,
    /// Attempts claimed so far.
    pub attempts: u32,
    /// The attempt claimed and not ended, and who claimed it.
    pub open: Option<(u32, ProcessIdentity, String, u64)>,
    /// The last attempt that ended: its number, how, and when the next is due.
    pub last: Option<(u32, HookOutcome, Option<UnixMs>)>,
}

impl Hook {
    /// "never again once a success is journaled", and given up after a failure with no
    /// retry.
    fn is_settled(&self) -> bool {
        self.last.as_ref().is_some_and(|(_, outcome, retry)| {
            *outcome == HookOutcome::Delivered || retry.is_none()
        })
    }
}

/// "Steering": where a message is for one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// Not taken yet.
    Waiting,
    /// "the step takes a message by removing its file; the runner journals the delivery".
    Taken,
    /// "messages it never took are recorded as undelivered".
    Lost,
}

impl Run {
    /// "A run is closed when it is terminal and its process terminal has been observed."
    pub fn is_closed(&self) -> bool {
        self.status.is_terminal() && self.observed.is_some()
    }

    pub fn instance(&self) -> Option<&str> {
        self.runner.as_ref().map(|(_, instance)| instance.as_str())
    }
}

/// A rule an event breaks. Each quotes the design's first wording of it (or the library's
/// docs); docs/design.md, "Rules", states them all as they hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Rule {
    /// "`RunCreated` is exactly the first record of a run; nothing comes before it."
    CreatedFirst,
    /// The same sentence: no second `RunCreated`.
    CreatedOnce,
    /// "Failures and guarantees", bad input: a malformed spec is refused.
    ValidSpec,
    /// Texts are bounded, as every input is (`MAX_TEXT_BYTES`).
    TextBounded,
    /// "After `Terminal`, only `ProcessTerminalObserved` and `Dismissed` are accepted."
    NothingAfterTerminal,
    /// "`RunnerStarted` only from `queued`, once."
    RunnerFromQueued,
    /// "`StepRunning(i)` ... step `i` exists" (and so for every event naming a step).
    StepExists,
    /// "`StepRunning(i)`: run `running`."
    StepStartsInRunningRun,
    /// "step `i` ... is `pending`."
    StepStartsPending,
    /// "in `chain` mode every earlier step is `complete`."
    ChainOrder,
    /// "Words": `parallel` runs steps at once, up to a concurrency.
    Concurrency,
    /// "`StepFinished(i)`: step `i` is `running`." (and `ExternalJobUpdated(i)`.)
    StepIsRunning,
    /// "`ExternalJobUpdated(i)`: step `i` is an external-job step."
    ExternalJobStep,
    /// "`Terminal(complete)` needs every step complete."
    CompleteNeedsEveryStep,
    /// "`ProcessTerminalObserved`: at most once per runner instance." A run has at most one
    /// runner instance ("`RunnerStarted` ... once"), so at most once per run.
    ObservedOnce,
    /// Refinement: a process terminal names the run's runner instance, when one started (the
    /// reducer's `InstanceMismatch`): a process that never ran the run cannot have ended it.
    ObservedNamesTheRunner,
    /// Refinement: proof `not-started` exactly when no runner ever started (`Proof::NotStarted`:
    /// "No runner ever took the run"; the reducer's `ProofMismatch`).
    ProofMatchesRunner,
    /// Refinement: no `RunnerStarted` after a process terminal was recorded (the launcher gave
    /// up on the run, "Runner and launch"; the reducer's `RunnerAfterProcessTerminal`).
    RunnerNotAfterGivenUp,
    /// Refinement: a job's progress is a finite number (`ExternalJobStatus::progress`: "must
    /// be finite"; bad input).
    ProgressFinite,
    /// Refinement: `StepFinished(skipped)` is for a step still `pending` (`StepEnd::Skipped`:
    /// "Never ran; recorded for a step that is still pending"); every other outcome needs the
    /// step `running`.
    SkipOnlyPending,
    /// Refinement: at most one request per action (`RunState::controls`): the runner acts on
    /// the first; a repeat would only grow the run.
    ControlOncePerAction,
    /// Refinement: `Dismissed` once; the first dismissal's time stays.
    DismissedOnce,
    /// "`Resumed{from}`: in the new run's creation batch, right after `RunCreated`."
    ResumedAtCreation,
    /// "... naming the paused run it carries on": another run than itself.
    ResumesAnotherRun,
    /// "Queues": a run joins a queue only in its creation batch, right after `RunCreated`.
    QueueJoinedAtCreation,
    /// "Queues": a queue's name is 1 to 64 letters, digits, '.', '_' or '-'.
    QueueNameValid,
    /// "Queues": only a run in a queue is admitted, and once.
    AdmittedOnceInQueue,
    /// "Queues": a run in a queue starts its runner only once admitted.
    RunnerAfterAdmission,
    /// "Dependencies": recorded in the creation batch, right after `RunCreated` or its
    /// `QueueJoined`.
    DependenciesAtCreation,
    /// "Dependencies": they name some run, none twice, not the run itself, at most 64.
    DependenciesWellFormed,
    /// "Dependencies": only a run with dependencies has them met, and once.
    MetOnceWithDependencies,
    /// "Dependencies": a run starts, or takes its queue's slot, only once they are met.
    NothingBeforeDependencies,
    /// "Delayed starts": a run is delayed only in its creation batch, right after
    /// `RunCreated` — never beside a queue or a resume, which take that place.
    DelayedAtCreation,
    /// "Delayed starts": only a delayed run's delay ends, and once.
    DelayEndsOnce,
    /// "Delayed starts": "accepted only in a record whose time is at or past the due time".
    DelayEndsWhenDue,
    /// "Delayed starts": a delayed run starts its runner only once its delay ended.
    RunnerAfterDue,
    /// "Launched once": a run takes its key only in its creation batch, as its last event,
    /// once.
    UniqueKeyAtCreation,
    /// "Retries": a run gets its policy only in its creation batch, after its other events
    /// and before its key, once.
    RetryPolicyAtCreation,
    /// "Retries": 1 to 100 retries, and a longest backoff no shorter than the first.
    RetryPolicyWellFormed,
    /// "Retries": only a run with retries has an attempt end without ending, and only the
    /// attempt a runner is on: `running`, numbered after the attempts that ended.
    AttemptEndsTheCurrentOne,
    /// "Retries": no more attempts end than it has retries.
    RetriesBounded,
    /// "Retries": a stopped or interrupted run is not tried again.
    NoRetryAfterStop,
    /// "Hooks": "A hook runs once the run's end is journaled."
    HookAfterEnd,
    /// "Hooks": a run has at most its own sixteen hooks and the home's.
    HookInRange,
    /// "Hooks": attempts are claimed one at a time, numbered in turn.
    HookAttemptsInTurn,
    /// "Hooks": an attempt's end is recorded for the attempt claimed.
    HookEndsItsAttempt,
    /// "Hooks": "never again once a success is journaled"; none after it is given up.
    HookNeverAgainOnceSettled,
    /// "Hooks": "bounded attempts, then recorded as given up": no retry after a delivery or
    /// after the last attempt.
    HookRetryFits,
    /// "Steering": a request has an id without white space, a message, and names steps, each
    /// once.
    SteerWellFormed,
    /// "Steering": a message goes to a step that has yet to end; to a paused run, for a step
    /// its resume runs (one that did not complete).
    SteerToOpenStep,
    /// "Steering": one request per id.
    SteerIdOnce,
    /// "Steering": 20 waiting per run, pi-subagents' limit.
    SteerWaitingBounded,
    /// "Steering": a run keeps each request it took, so it takes a bounded number.
    SteerTotalBounded,
    /// "Steering": a step takes a message that waits for it.
    SteerTakenWhileWaiting,
    /// "Stopping one step": only a step that is pending or running is stopped.
    StepStopOfOpenStep,
    /// "Stopping one step": once per step.
    StepStopOnce,
    /// "Stopping one step": a run a host stopped a step of is not tried again.
    NoRetryAfterStepStop,
}

impl Rule {
    /// Every rule, for a test that checks each is met.
    pub const ALL: [Rule; 57] = [
        Rule::CreatedFirst,
        Rule::CreatedOnce,
        Rule::ValidSpec,
        Rule::TextBounded,
        Rule::NothingAfterTerminal,
        Rule::RunnerFromQueued,
        Rule::StepExists,
        Rule::StepStartsInRunningRun,
        Rule::StepStartsPending,
        Rule::ChainOrder,
        Rule::Concurrency,
        Rule::StepIsRunning,
        Rule::ExternalJobStep,
        Rule::CompleteNeedsEveryStep,
        Rule::ObservedOnce,
        Rule::ObservedNamesTheRunner,
        Rule::ProofMatchesRunner,
        Rule::RunnerNotAfterGivenUp,
        Rule::ProgressFinite,
        Rule::SkipOnlyPending,
        Rule::ControlOncePerAction,
        Rule::DismissedOnce,
        Rule::ResumedAtCreation,
        Rule::ResumesAnotherRun,
        Rule::QueueJoinedAtCreation,
        Rule::QueueNameValid,
        Rule::AdmittedOnceInQueue,
        Rule::RunnerAfterAdmission,
        Rule::DependenciesAtCreation,
        Rule::DependenciesWellFormed,
        Rule::MetOnceWithDependencies,
        Rule::NothingBeforeDependencies,
        Rule::DelayedAtCreation,
        Rule::DelayEndsOnce,
        Rule::DelayEndsWhenDue,
        Rule::RunnerAfterDue,
        Rule::UniqueKeyAtCreation,
        Rule::RetryPolicyAtCreation,
        Rule::RetryPolicyWellFormed,
        Rule::AttemptEndsTheCurrentOne,
        Rule::RetriesBounded,
        Rule::NoRetryAfterStop,
        Rule::HookAfterEnd,
        Rule::HookInRange,
        Rule::HookAttemptsInTurn,
        Rule::HookEndsItsAttempt,
        Rule::HookNeverAgainOnceSettled,
        Rule::HookRetryFits,
        Rule::SteerWellFormed,
        Rule::SteerToOpenStep,
        Rule::SteerIdOnce,
        Rule::SteerWaitingBounded,
        Rule::SteerTotalBounded,
        Rule::SteerTakenWhileWaiting,
        Rule::StepStopOfOpenStep,
        Rule::StepStopOnce,
        Rule::NoRetryAfterStepStop,
    ];
}

/// "Queues": the names a queue may have.
fn is_valid_queue_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '_' || c == '-')
}

/// Whether a spec is one the design accepts (`RunSpec::check`), as far as the model's specs go: steps to run, one
/// for `single`, room for one at a time in `parallel`, named, each with something to run.
fn is_valid_spec(spec: &RunSpec) -> bool {
    let has_steps = !spec.steps.is_empty();
    let single_has_one = spec.mode != Mode::Single || spec.steps.len() == 1;
    let parallel_has_room = spec.mode != Mode::Parallel || spec.concurrency >= 1;
    let steps_are_whole = spec.steps.iter().all(|step| {
        let action_is_empty = match &step.action {
            StepAction::Command { argv } => argv.first().is_none_or(String::is_empty),
            StepAction::Shell { script } => script.trim().is_empty(),
            StepAction::ExternalJob { provider } => provider.trim().is_empty(),
        };
        !step.name.trim().is_empty() && !action_is_empty
    });
    has_steps && single_has_one && parallel_has_room && steps_are_whole
}

/// Whether an event's texts are within their bounds: a steer request's by its own, every
/// other text by `MAX_TEXT_BYTES`.
fn texts_are_bounded(event: &Event) -> bool {
    match event {
        Event::SteerRequested {
            id,
            message,
            source,
            ..
        } => {
            id.len() <= STEER_ID_LIMIT
                && source.len() <= STEER_ID_LIMIT
                && message.len() <= STEER_MESSAGE_LIMIT
        }
        Event::SteerDelivered { id, .. } => id.len() <= STEER_ID_LIMIT,
        other => texts(other).iter().all(|text| text.len() <= MAX_TEXT_BYTES),
    }
}

/// Every free text an event carries, outside the spec (which [`is_valid_spec`] covers).
fn texts(event: &Event) -> Vec<&str> {
    let mut texts: Vec<&str> = Vec::new();
    match event {
        Event::RunCreated {
            session_id,
            completion_owner_id,
            tool_call_id,
            ..
        } => texts.extend(
            [session_id, completion_owner_id, tool_call_id]
                .into_iter()
                .flatten()
                .map(String::as_str),
        ),
        Event::RunnerStarted {
            runner,
            instance_id,
        } => texts.extend([runner.boot_id.as_str(), instance_id.as_str()]),
        Event::StepRunning { process, .. } => {
            texts.extend(process.iter().map(|process| process.boot_id.as_str()));
        }
        Event::ExternalJobUpdated { job, .. } => texts.extend(
            [&job.id, &job.message, &job.url]
                .into_iter()
                .flatten()
                .map(String::as_str),
        ),
        Event::StepFinished { outcome, .. } => texts.extend(outcome.error.as_deref()),
        Event::ControlRequested { by, reason, .. } => texts.extend([by.as_str(), reason.as_str()]),
        Event::Terminal { error, summary, .. } => {
            texts.push(summary);
            texts.extend(error.as_deref());
        }
        Event::ProcessTerminalObserved { instance_id, .. } => texts.push(instance_id),
        Event::Dismissed { .. } | Event::Resumed { .. } => {}
        Event::QueueJoined { queue, .. } => texts.push(queue),
        Event::QueueAdmitted { by } | Event::DependenciesMet { by } => texts.push(by),
        Event::DependsOn { .. } => {}
        Event::HookAttempted { claimant, by, .. } => {
            texts.extend([claimant.boot_id.as_str(), by.as_str()]);
        }
        Event::HookEnded { outcome, .. } => match outcome {
            HookOutcome::NotStarted { error: text } | HookOutcome::Abandoned { reason: text } => {
                texts.push(text);
            }
            HookOutcome::Delivered | HookOutcome::Failed { .. } | HookOutcome::TimedOut => {}
        },
        Event::SteerRequested { .. } | Event::SteerDelivered { .. } => {}
        Event::ControlRefused { file, reason } => texts.extend([file.as_str(), reason.as_str()]),
        Event::HostEnded {
            message,
            result_path,
            ..
        } => {
            texts.push(message);
            texts.extend(result_path.as_deref());
        }
        Event::StartDelayed { .. } => {}
        Event::DelayEnded { by } => texts.push(by),
        Event::UniqueKey { key, .. } => texts.push(key),
        Event::RetryPolicy { .. } => {}
        Event::AttemptEnded { error, summary, .. } => {
            texts.push(summary);
            texts.extend(error.as_deref());
        }
        Event::StepStopRequested { by, reason, .. } => texts.extend([by.as_str(), reason.as_str()]),
    }
    texts
}

/// "`Terminal` ... running steps end failed (stopped when the run is stopped) with its error,
/// pending steps are skipped"; the end gives up on the messages still waiting, but a pause,
/// which keeps them for its resume.
fn end(run: &Run, next: &mut Run, ending: Ending, broken: &mut Vec<Rule>) {
    let is_every_step_complete = run
        .steps
        .iter()
        .all(|step| step.status == StepStatus::Complete);
    if ending.state == TerminalState::Complete && !is_every_step_complete {
        broken.push(Rule::CompleteNeedsEveryStep);
    }
    for step in &mut next.steps {
        match step.status {
            StepStatus::Running => {
                step.status = if ending.state == TerminalState::Stopped {
                    StepStatus::Stopped
                } else {
                    StepStatus::Failed
                };
                step.error = ending.error.clone();
            }
            StepStatus::Pending => step.status = StepStatus::Skipped,
            _ => {}
        }
    }
    if ending.state != TerminalState::Paused {
        lose_waiting(next, None);
    }
    next.status = status_of(ending.state);
    next.ending = Some(ending);
}

/// The messages waiting for `step` (for every step: `None`) are lost.
fn lose_waiting(run: &mut Run, step: Option<u32>) {
    for (target, delivery) in run.steers.iter_mut().flat_map(|(_, targets)| targets) {
        if *delivery == Delivery::Waiting && step.is_none_or(|step| *target == step) {
            *delivery = Delivery::Lost;
        }
    }
}

/// The run `id` after `event`, recorded at `at_ms`, or every rule it breaks (then the run is
/// as it was).
pub fn apply(id: RunId, run: Option<&Run>, event: &Event, at_ms: UnixMs) -> Result<Run, Vec<Rule>> {
    let mut broken = Vec::new();
    if !texts_are_bounded(event) {
        broken.push(Rule::TextBounded);
    }
    let Some(run) = run else {
        return create(event, broken);
    };
    if let Event::RunCreated { .. } = event {
        broken.push(Rule::CreatedOnce);
    }
    // "Hooks": a hook's attempts come after the run's end. "Steering": a paused run takes
    // messages for its resume, and refusals of the files that asked for them.
    let may_follow_terminal = match event {
        Event::ProcessTerminalObserved { .. }
        | Event::Dismissed { .. }
        | Event::HookAttempted { .. }
        | Event::HookEnded { .. } => true,
        Event::SteerRequested { .. } | Event::ControlRefused { .. } => run.status == Status::Paused,
        _ => false,
    };
    if run.status.is_terminal() && !may_follow_terminal {
        broken.push(Rule::NothingAfterTerminal);
    }
    let mut next = run.clone();
    next.head += 1;
    let step_of = |step: u32, broken: &mut Vec<Rule>| -> Option<usize> {
        let index = step as usize;
        if index < run.steps.len() {
            Some(index)
        } else {
            broken.push(Rule::StepExists);
            None
        }
    };
    match event {
        Event::RunCreated { .. } => {}
        Event::RunnerStarted {
            runner,
            instance_id,
        } => {
            if run.status != Status::Queued {
                broken.push(Rule::RunnerFromQueued);
            }
            if run.observed.is_some() {
                broken.push(Rule::RunnerNotAfterGivenUp);
            }
            if matches!(run.queue, Some((_, false))) {
                broken.push(Rule::RunnerAfterAdmission);
            }
            if matches!(run.dependencies, Some((_, _, false))) {
                broken.push(Rule::NothingBeforeDependencies);
            }
            if matches!(run.delay, Some((_, false))) {
                broken.push(Rule::RunnerAfterDue);
            }
            next.status = Status::Running;
            next.runner = Some((runner.clone(), instance_id.clone()));
        }
        Event::StepRunning { step, process } => {
            if run.status != Status::Running {
                broken.push(Rule::StepStartsInRunningRun);
            }
            if let Some(index) = step_of(*step, &mut broken) {
                if run.steps[index].status != StepStatus::Pending {
                    broken.push(Rule::StepStartsPending);
                }
                let earlier_all_complete = run.steps[..index]
                    .iter()
                    .all(|earlier| earlier.status == StepStatus::Complete);
                if run.spec.mode == Mode::Chain && !earlier_all_complete {
                    broken.push(Rule::ChainOrder);
                }
                let running = run
                    .steps
                    .iter()
                    .filter(|step| step.status == StepStatus::Running)
                    .count();
                if run.spec.mode == Mode::Parallel && running >= run.spec.concurrency as usize {
                    broken.push(Rule::Concurrency);
                }
                next.steps[index].status = StepStatus::Running;
                next.steps[index].process = process.clone();
            }
        }
        Event::ExternalJobUpdated { step, job } => {
            if let Some(index) = step_of(*step, &mut broken) {
                if !matches!(run.spec.steps[index].action, StepAction::ExternalJob { .. }) {
                    broken.push(Rule::ExternalJobStep);
                }
                if run.steps[index].status != StepStatus::Running {
                    broken.push(Rule::StepIsRunning);
                }
                if job.progress.is_some_and(|progress| !progress.is_finite()) {
                    broken.push(Rule::ProgressFinite);
                }
                // "The status is replaced whole, never merged field by field."
                next.steps[index].job = Some(job.clone());
            }
        }
        Event::StepFinished { step, outcome } => {
            if let Some(index) = step_of(*step, &mut broken) {
                let status = run.steps[index].status;
                if outcome.end == StepEnd::Skipped && status != StepStatus::Pending {
                    broken.push(Rule::SkipOnlyPending);
                }
                if outcome.end != StepEnd::Skipped && status != StepStatus::Running {
                    broken.push(Rule::StepIsRunning);
                }
                let finished = &mut next.steps[index];
                finished.status = step_status_of(outcome.end);
                finished.exit_code = outcome.exit_code;
                finished.error = outcome.error.clone();
                // "When the step ends, messages it never took are recorded as undelivered."
                lose_waiting(&mut next, Some(*step));
            }
        }
        Event::ControlRequested { action, by, reason } => {
            // "`ControlRequested`: run not terminal": the rule every event but two meets.
            if run
                .controls
                .iter()
                .any(|(recorded, _, _)| recorded == action)
            {
                broken.push(Rule::ControlOncePerAction);
            }
            next.controls.push((*action, by.clone(), reason.clone()));
        }
        Event::Terminal {
            state,
            error,
            summary,
            exit_code,
            repaired_by,
        } => {
            let ending = Ending {
                state: *state,
                error: error.clone(),
                summary: summary.clone(),
                exit_code: *exit_code,
                repaired_by: *repaired_by,
            };
            end(run, &mut next, ending, &mut broken);
        }
        // "One end per run": a host's verdict is the run's end, by the host.
        Event::HostEnded {
            state,
            exit_code,
            message,
            ..
        } => {
            let ending = Ending {
                state: *state,
                error: Some(message.clone()),
                summary: message.clone(),
                exit_code: *exit_code,
                repaired_by: Some(Repairer::Host),
            };
            end(run, &mut next, ending, &mut broken);
        }
        // "refused with a journaled reason": the record is all of it.
        Event::ControlRefused { .. } => {}
        // "Stopping one step": a pending or running step, once; the runner acts on it.
        Event::StepStopRequested { step, by, reason } => {
            if let Some(index) = step_of(*step, &mut broken)
                && !matches!(
                    run.steps[index].status,
                    StepStatus::Pending | StepStatus::Running
                )
            {
                broken.push(Rule::StepStopOfOpenStep);
            }
            if run.step_stops.iter().any(|(stopped, _, _)| stopped == step) {
                broken.push(Rule::StepStopOnce);
            }
            next.step_stops.push((*step, by.clone(), reason.clone()));
        }
        Event::SteerRequested {
            id, steps, message, ..
        } => {
            let mut seen = Vec::new();
            let is_well_formed = !id.is_empty()
                && !id.chars().any(char::is_whitespace)
                && !message.trim().is_empty()
                && !steps.is_empty()
                && steps.iter().all(|step| {
                    let is_new = !seen.contains(step);
                    seen.push(*step);
                    is_new
                });
            if !is_well_formed {
                broken.push(Rule::SteerWellFormed);
            }
            for step in steps {
                if let Some(index) = step_of(*step, &mut broken) {
                    let status = run.steps[index].status;
                    let is_open = if run.status == Status::Paused {
                        status != StepStatus::Complete
                    } else {
                        matches!(status, StepStatus::Pending | StepStatus::Running)
                    };
                    if !is_open {
                        broken.push(Rule::SteerToOpenStep);
                    }
                }
            }
            if run.steers.iter().any(|(known, _)| known == id) {
                broken.push(Rule::SteerIdOnce);
            }
            let waiting = run
                .steers
                .iter()
                .filter(|(_, targets)| {
                    targets
                        .iter()
                        .any(|(_, delivery)| *delivery == Delivery::Waiting)
                })
                .count();
            if waiting >= STEERS_WAITING_LIMIT {
                broken.push(Rule::SteerWaitingBounded);
            }
            if run.steers.len() >= STEERS_LIMIT {
                broken.push(Rule::SteerTotalBounded);
            }
            next.steers.push((
                id.clone(),
                steps
                    .iter()
                    .map(|step| (*step, Delivery::Waiting))
                    .collect(),
            ));
        }
        Event::SteerDelivered { id, step } => {
            if let Some(index) = step_of(*step, &mut broken) {
                if run.steps[index].status != StepStatus::Running {
                    broken.push(Rule::StepIsRunning);
                }
                let waiting = next
                    .steers
                    .iter_mut()
                    .filter(|(known, _)| known == id)
                    .flat_map(|(_, targets)| targets)
                    .find(|(target, delivery)| target == step && *delivery == Delivery::Waiting);
                match waiting {
                    Some((_, delivery)) => *delivery = Delivery::Taken,
                    None => broken.push(Rule::SteerTakenWhileWaiting),
                }
            }
        }
        Event::ProcessTerminalObserved {
            instance_id,
            exit,
            proof,
            observer,
        } => {
            // "Retries": the runner of the attempt that ended last, seen gone once the run moved
            // on, is kept with its attempt, once.
            let last_attempt = run
                .retry
                .as_ref()
                .and_then(|(_, _, attempts)| attempts.last());
            let is_of_last_attempt = run.instance() != Some(instance_id.as_str())
                && *proof != Proof::NotStarted
                && last_attempt
                    .is_some_and(|attempt| attempt.instance.as_ref() == Some(instance_id));
            if is_of_last_attempt {
                if last_attempt.is_some_and(|attempt| attempt.observed.is_some()) {
                    broken.push(Rule::ObservedOnce);
                }
                if let Some(attempt) = next
                    .retry
                    .as_mut()
                    .and_then(|(_, _, attempts)| attempts.last_mut())
                {
                    attempt.observed = Some(Observed {
                        instance_id: instance_id.clone(),
                        exit: *exit,
                        proof: *proof,
                        observer: *observer,
                    });
                }
                return finish(next, broken);
            }
            // "At most once per runner instance; allowed before `Terminal`."
            if run.observed.is_some() {
                broken.push(Rule::ObservedOnce);
            }
            match run.instance() {
                Some(runner) if runner != instance_id => {
                    broken.push(Rule::ObservedNamesTheRunner);
                }
                _ => {}
            }
            if (*proof == Proof::NotStarted) != run.runner.is_none() {
                broken.push(Rule::ProofMatchesRunner);
            }
            next.observed = Some(Observed {
                instance_id: instance_id.clone(),
                exit: *exit,
                proof: *proof,
                observer: *observer,
            });
        }
        Event::Dismissed { at_ms } => {
            // "Hidden from default listings; nothing is stopped."
            if run.dismissed_at_ms.is_some() {
                broken.push(Rule::DismissedOnce);
            }
            next.dismissed_at_ms = Some(*at_ms);
        }
        Event::Resumed { from } => {
            // A link, not a change of the run: only its place and what it names are ruled.
            if run.head != 1 {
                broken.push(Rule::ResumedAtCreation);
            }
            if *from == id {
                broken.push(Rule::ResumesAnotherRun);
            }
        }
        Event::QueueJoined { queue, .. } => {
            if run.head != 1 {
                broken.push(Rule::QueueJoinedAtCreation);
            }
            if !is_valid_queue_name(queue) {
                broken.push(Rule::QueueNameValid);
            }
            next.queue = Some((queue.clone(), false));
        }
        Event::QueueAdmitted { .. } => {
            match &run.queue {
                Some((name, false)) => next.queue = Some((name.clone(), true)),
                _ => broken.push(Rule::AdmittedOnceInQueue),
            }
            if run.queue.is_some() && matches!(run.dependencies, Some((_, _, false))) {
                broken.push(Rule::NothingBeforeDependencies);
            }
        }
        Event::DependsOn {
            after, after_any, ..
        } => {
            let right_after_join = run.head == 2 && run.queue.is_some();
            if run.dependencies.is_some() || !(run.head == 1 || right_after_join) {
                broken.push(Rule::DependenciesAtCreation);
            }
            let mut named: Vec<RunId> = after.iter().chain(after_any).copied().collect();
            let count = named.len();
            named.sort();
            named.dedup();
            if count == 0 || count > 64 || named.len() != count || named.contains(&id) {
                broken.push(Rule::DependenciesWellFormed);
            }
            next.dependencies = Some((after.clone(), after_any.clone(), false));
        }
        Event::DependenciesMet { .. } => match &run.dependencies {
            Some((after, after_any, false)) => {
                next.dependencies = Some((after.clone(), after_any.clone(), true));
            }
            _ => broken.push(Rule::MetOnceWithDependencies),
        },
        Event::StartDelayed { due_at_ms, .. } => {
            if run.head != 1 {
                broken.push(Rule::DelayedAtCreation);
            }
            next.delay = Some((*due_at_ms, false));
        }
        Event::DelayEnded { .. } => match run.delay {
            Some((due_at_ms, false)) => {
                if at_ms < due_at_ms {
                    broken.push(Rule::DelayEndsWhenDue);
                }
                next.delay = Some((due_at_ms, true));
            }
            _ => broken.push(Rule::DelayEndsOnce),
        },
        Event::UniqueKey { key, hold_ms } => {
            // Right after the creation batch's other events: `RunCreated`, its queue or its
            // delay, its dependencies.
            if run.unique.is_some() || run.head != creation_events(run) {
                broken.push(Rule::UniqueKeyAtCreation);
            }
            next.unique = Some((key.clone(), *hold_ms));
        }
        Event::RetryPolicy {
            retries,
            backoff_ms,
            backoff_max_ms,
            on,
            ..
        } => {
            if run.retry.is_some() || run.unique.is_some() || run.head != creation_events(run) {
                broken.push(Rule::RetryPolicyAtCreation);
            }
            if !(1..=100).contains(retries) || backoff_max_ms < backoff_ms {
                broken.push(Rule::RetryPolicyWellFormed);
            }
            next.retry = Some((*retries, on.crash, Vec::new()));
        }
        Event::AttemptEnded {
            attempt,
            cause,
            exit_code,
            retry_at_ms,
            ..
        } => {
            match &run.retry {
                None => broken.push(Rule::AttemptEndsTheCurrentOne),
                Some((retries, _, attempts)) => {
                    let current = attempts.len() as u32 + 1;
                    if run.status != Status::Running || *attempt != current {
                        broken.push(Rule::AttemptEndsTheCurrentOne);
                    }
                    if attempts.len() >= *retries as usize {
                        broken.push(Rule::RetriesBounded);
                    }
                }
            }
            let stopped = run.controls.iter().any(|(action, _, _)| {
                matches!(action, ControlAction::Stop | ControlAction::Interrupt)
            });
            if stopped {
                broken.push(Rule::NoRetryAfterStop);
            }
            if !run.step_stops.is_empty() {
                broken.push(Rule::NoRetryAfterStepStop);
            }
            // The run waits for its next attempt as a delayed run, afresh: its steps pending, no
            // runner nor request, its queue's slot given back; what waited for its steps is lost.
            lose_waiting(&mut next, None);
            let ended = Attempt {
                attempt: *attempt,
                cause: *cause,
                exit_code: *exit_code,
                retry_at_ms: *retry_at_ms,
                instance: run.instance().map(str::to_string),
                observed: run.observed.clone(),
            };
            if let Some((_, _, attempts)) = &mut next.retry {
                attempts.push(ended);
            }
            next.status = Status::Queued;
            next.runner = None;
            next.observed = None;
            next.controls.clear();
            next.steps = fresh_steps(run.steps.len());
            if let Some((_, admitted)) = &mut next.queue {
                *admitted = false;
            }
            next.delay = Some((*retry_at_ms, false));
        }
        Event::HookAttempted {
            hook,
            attempt,
            claimant,
            by,
            lease_ms,
        } => {
            hook_place(run, *hook, &mut broken);
            let current = run.hooks.iter().find(|state| state.hook == *hook);
            if current.is_some_and(Hook::is_settled) {
                broken.push(Rule::HookNeverAgainOnceSettled);
            }
            let is_open = current.is_some_and(|state| state.open.is_some());
            let next_attempt = current.map_or(0, |state| state.attempts) + 1;
            if is_open || *attempt != next_attempt {
                broken.push(Rule::HookAttemptsInTurn);
            }
            let open = Some((*attempt, claimant.clone(), by.clone(), *lease_ms));
            match next.hooks.iter_mut().find(|state| state.hook == *hook) {
                Some(state) => {
                    state.attempts = *attempt;
                    state.open = open;
                }
                None => {
                    next.hooks.push(Hook {
                        hook: *hook,
                        attempts: *attempt,
                        open,
                        last: None,
                    });
                    next.hooks.sort_by_key(|state| state.hook);
                }
            }
        }
        Event::HookEnded {
            hook,
            attempt,
            outcome,
            retry_at_ms,
        } => {
            hook_place(run, *hook, &mut broken);
            let open = run
                .hooks
                .iter()
                .find(|state| state.hook == *hook)
                .and_then(|state| state.open.as_ref());
            if open.is_none_or(|(claimed, ..)| claimed != attempt) {
                broken.push(Rule::HookEndsItsAttempt);
            }
            let is_last = *attempt >= ATTEMPTS_PER_HOOK;
            if retry_at_ms.is_some() && (*outcome == HookOutcome::Delivered || is_last) {
                broken.push(Rule::HookRetryFits);
            }
            if let Some(state) = next.hooks.iter_mut().find(|state| state.hook == *hook) {
                state.open = None;
                state.last = Some((*attempt, outcome.clone(), *retry_at_ms));
            }
        }
    }
    finish(next, broken)
}

/// The run after an event, or every rule it broke.
fn finish(next: Run, mut broken: Vec<Rule>) -> Result<Run, Vec<Rule>> {
    if broken.is_empty() {
        Ok(next)
    } else {
        broken.sort();
        broken.dedup();
        Err(broken)
    }
}

/// How many records a run's creation batch holds before its key (and its retry policy):
/// `RunCreated`, its queue or its delay, its dependencies, its retry policy.
fn creation_events(run: &Run) -> u64 {
    1 + u64::from(run.queue.is_some())
        + u64::from(run.delay.is_some())
        + u64::from(run.dependencies.is_some())
        + u64::from(run.retry.is_some())
}

/// `count` steps, none started.
fn fresh_steps(count: usize) -> Vec<Step> {
    vec![
        Step {
            status: StepStatus::Pending,
            process: None,
            exit_code: None,
            error: None,
            job: None,
        };
        count
    ]
}

/// "Hooks": hook events are for a run that has ended, naming a hook a run may have.
fn hook_place(run: &Run, hook: u32, broken: &mut Vec<Rule>) {
    if !run.status.is_terminal() {
        broken.push(Rule::HookAfterEnd);
    }
    if hook >= HOOKS_PER_RUN {
        broken.push(Rule::HookInRange);
    }
}

/// "`RunCreated` ... run exists, state `queued`."
fn create(event: &Event, mut broken: Vec<Rule>) -> Result<Run, Vec<Rule>> {
    let Event::RunCreated {
        spec,
        created_at_ms,
        session_id,
        completion_owner_id,
        tool_call_id,
    } = event
    else {
        broken.push(Rule::CreatedFirst);
        return Err(broken);
    };
    if !is_valid_spec(spec) {
        broken.push(Rule::ValidSpec);
    }
    if !broken.is_empty() {
        return Err(broken);
    }
    Ok(Run {
        spec: RunSpec::clone(spec),
        created_at_ms: *created_at_ms,
        session_id: session_id.clone(),
        completion_owner_id: completion_owner_id.clone(),
        tool_call_id: tool_call_id.clone(),
        head: 1,
        status: Status::Queued,
        runner: None,
        steps: fresh_steps(spec.steps.len()),
        controls: Vec::new(),
        ending: None,
        observed: None,
        dismissed_at_ms: None,
        queue: None,
        dependencies: None,
        delay: None,
        unique: None,
        retry: None,
        hooks: Vec::new(),
        steers: Vec::new(),
        step_stops: Vec::new(),
    })
}

// ---------------------------------------------------------------------------------------------
// The reconciler ("Reconciler")
// ---------------------------------------------------------------------------------------------

/// What the reconciler finds of a run's runner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runner {
    /// No runner ever recorded `RunnerStarted`.
    None,
    Alive,
    Dead,
    /// Recorded in an older boot: "runner dead (or older boot)".
    OlderBoot,
}

/// One event a reconcile pass must append, with what its reason must say.
#[derive(Debug, Clone, PartialEq)]
pub struct Repair {
    /// The event, with an empty reason where it carries one (the text is the journal's).
    pub event: Event,
    /// Words the recorded reason must contain.
    pub reason_says: Vec<String>,
}

/// How the design words a recorded exit in a reason ("pid, exit or signal when known").
fn exit_words(exit: Option<ProcessExit>) -> String {
    match exit {
        Some(ProcessExit {
            code: Some(code), ..
        }) => format!("exited with code {code}"),
        Some(ProcessExit {
            code: None,
            signal: Some(signal),
        }) => format!("killed by signal {signal}"),
        _ => "exit status unknown".to_string(),
    }
}

/// The events a reconcile pass appends for a run that is not closed, by the table of
/// "Reconciler": whether it is terminal, whether its process terminal was observed, its runner, and
/// whether it has been queued longer than the start grace.
pub fn reconcile(run: &Run, runner: Runner, is_past_start_grace: bool) -> Vec<Repair> {
    let pid = run.runner.as_ref().map(|(identity, _)| identity.pid);
    let failed = |says: Vec<String>| Repair {
        event: Event::Terminal {
            state: TerminalState::Failed,
            error: Some(String::new()),
            summary: String::new(),
            exit_code: 1,
            repaired_by: Some(Repairer::Reconciler),
        },
        reason_says: says,
    };
    let gone = |proof| Repair {
        event: Event::ProcessTerminalObserved {
            instance_id: run.instance().unwrap_or_default().to_string(),
            exit: None,
            proof,
            observer: Observer::Reconciler,
        },
        reason_says: Vec::new(),
    };
    let runner_named = |words: String| {
        vec![
            format!("runner {}", pid.unwrap_or_default()),
            "without recording an outcome".to_string(),
            words,
        ]
    };
    let is_terminal = run.status.is_terminal();
    // "Queues": a run waiting for a slot has no runner due, however long it waits. "Reconciler":
    // nor has a delayed run whose delay has not ended ("it waits for its due time, however
    // long"), nor a run waiting for its dependencies.
    let is_waiting = matches!(run.queue, Some((_, false)))
        || matches!(run.delay, Some((_, false)))
        || matches!(run.dependencies, Some((_, _, false)));
    if !is_terminal && run.observed.is_none() && is_waiting {
        return Vec::new();
    }
    // "Retries": a runner that died is a crash, which a policy that covers it, with a retry
    // left, tries again: the runner's end, then the attempt's.
    let crashed = |says: Vec<String>, gone: Option<Repair>| -> Vec<Repair> {
        let stopped = run
            .controls
            .iter()
            .any(|(action, _, _)| matches!(action, ControlAction::Stop | ControlAction::Interrupt));
        match &run.retry {
            Some((retries, true, attempts))
                if attempts.len() < *retries as usize
                    && !stopped
                    && run.status == Status::Running =>
            {
                let attempt_ended = Repair {
                    event: Event::AttemptEnded {
                        attempt: attempts.len() as u32 + 1,
                        cause: AttemptCause::Crash,
                        error: Some(String::new()),
                        summary: String::new(),
                        exit_code: 1,
                        retry_at_ms: 0,
                    },
                    reason_says: says,
                };
                gone.into_iter().chain([attempt_ended]).collect()
            }
            _ => [failed(says)].into_iter().chain(gone).collect(),
        }
    };
    match (is_terminal, &run.observed, runner) {
        // "Rules": a process terminal "allowed before `Terminal` (the runner died first — the
        // run is then *stale* until the reconciler records `Terminal`)": failed, with what was
        // observed of the runner's end, and no second process terminal. The recorded
        // observation is a fact; a liveness look that says "alive" cannot undo it (a table
        // that looked only at liveness would leave such a run open forever).
        (false, Some(observed), Runner::None) => {
            assert_eq!(observed.proof, Proof::NotStarted, "the proof rule");
            vec![failed(vec!["runner never started".to_string()])]
        }
        (false, Some(observed), _) => crashed(runner_named(exit_words(observed.exit)), None),
        // "not terminal, runner alive: nothing".
        (false, None, Runner::Alive) => vec![],
        // "not terminal, runner recorded, runner dead (or older boot)": failed, naming the
        // runner, + observed gone (unknown).
        (false, None, Runner::Dead) => {
            crashed(runner_named(exit_words(None)), Some(gone(Proof::Unknown)))
        }
        (false, None, Runner::OlderBoot) => crashed(
            vec![
                format!("runner {}", pid.unwrap_or_default()),
                "host restarted".to_string(),
            ],
            Some(gone(Proof::Unknown)),
        ),
        // "`queued`, no runner, older than the start grace": failed, never started, +
        // observed not started. "younger than the grace: nothing."
        (false, None, Runner::None) if is_past_start_grace => vec![
            failed(vec!["runner never started".to_string()]),
            gone(Proof::NotStarted),
        ],
        (false, None, Runner::None) => vec![],
        // Closed: not the reconciler's work.
        (true, Some(_), _) => vec![],
        // "terminal, process not observed, runner alive: nothing (it is finishing)."
        (true, None, Runner::Alive) => vec![],
        // "terminal, process not observed, runner dead: observed gone (unknown)"; with no
        // runner ever started, the proof can only be `not-started`.
        (true, None, Runner::Dead | Runner::OlderBoot) => vec![gone(Proof::Unknown)],
        (true, None, Runner::None) => vec![gone(Proof::NotStarted)],
    }
}
