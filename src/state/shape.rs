//! The shape of a state the reducer makes: [`ShapeRule`], every rule that each state [`apply`]
//! returns keeps, which [`RunState::check_shape`] checks of a state read from disk (a
//! snapshot), and [`TransitionError::kept_in_state`], the table that names, for each rule the
//! reducer refuses a record by, the shape rules that its states keep because of it.
//!
//! [`ShapeRule::ALL`] is declared with the rules themselves (`shape_rules!`), so no rule is
//! left out of the check. The table is an exhaustive match: a new [`TransitionError`] does not compile until it says
//! which shape rules keep it in every state, or why no state can show it. The tests break each
//! rule alone on states the reducer made and check that `check_shape` refuses each.
//!
//! [`apply`]: fn@super::apply

use super::{
    RunState, RunStatus, ShapeError, SteerDelivery, StepState, StepStatus, TransitionError,
};
use crate::event::{
    HookOutcome, MAX_HOOK_ATTEMPTS, MAX_HOOKS, MAX_PENDING_STEERS, MAX_STEER_ID_BYTES,
    MAX_STEERS_PER_RUN, MAX_TEXT_BYTES, Mode, Proof, STEER_PREVIEW_CHARS, check_queue_name,
    dependencies_flaw, retry_policy_flaw,
};

/// Whether an attempt of the run ended and was tried again.
fn is_retried(state: &RunState) -> bool {
    state
        .retry
        .as_ref()
        .is_some_and(|retry| !retry.attempts.is_empty())
}

/// Declares [`ShapeRule`] and [`ShapeRule::ALL`] from one list, so that every rule declared
/// is checked, in the order declared.
macro_rules! shape_rules {
    ($($(#[$doc:meta])* $rule:ident,)*) => {
        /// A rule that every state the reducer makes keeps. [`RunState::check_shape`] checks
        /// them in the order of [`ShapeRule::ALL`] and reports the first one broken.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum ShapeRule {
            $($(#[$doc])* $rule,)*
        }

        impl ShapeRule {
            /// Every rule, in the order they are checked (the order declared): the spec and
            /// the step count first, as the step rules read the spec's steps.
            pub const ALL: [ShapeRule; [$(ShapeRule::$rule),*].len()] = [$(ShapeRule::$rule),*];
        }
    };
}

shape_rules! {
    /// The spec passes [`crate::event::RunSpec::check`], as `RunCreated`'s must.
    SpecChecks,
    /// One step state per step of the spec.
    StepPerSpecStep,
    /// A head: a run's state begins with `RunCreated` at seq 1.
    HasHead,
    /// Every text within a record's limit ([`MAX_TEXT_BYTES`]): each came from a record.
    TextsWithinLimits,
    /// A terminal run has its `Terminal` record's facts.
    TerminalHasEnd,
    /// Only a terminal run has them.
    EndOnlyWhenTerminal,
    /// And they name the run's state.
    EndAgreesWithStatus,
    /// A running run has the runner that started it.
    RunningHasRunner,
    /// A queued run has no runner yet.
    QueuedHasNoRunner,
    /// A step runs only in a running run (`Terminal` ends the running steps).
    StepRunsOnlyInRunningRun,
    /// No step has started in a queued run.
    QueuedHasNoStartedStep,
    /// `Terminal` skips every pending step.
    TerminalLeavesNoPendingStep,
    /// A complete run has every step complete.
    CompleteHasEveryStepComplete,
    /// A pending step has nothing yet: no process, times, outcome or job.
    PendingStepUntouched,
    /// A running step has its start, and no end, exit code or error yet.
    RunningStepStartedNotEnded,
    /// A step that ran and ended (complete, failed, stopped) has its start and its end.
    RanStepStartedAndEnded,
    /// A skipped step never started: no start, process or job.
    SkippedStepNeverStarted,
    /// Only an external-job step has a job status.
    JobOnlyOnExternalJobStep,
    /// A job status and its time come together.
    JobHasItsTime,
    /// A job's progress is a finite number.
    JobProgressFinite,
    /// In a chain, a step that started did so after every earlier step completed.
    ChainStepsInOrder,
    /// In parallel, no more steps run than the concurrency.
    ParallelWithinConcurrency,
    /// At most one control request per action.
    ControlActionsDistinct,
    /// A process terminal names the run's runner instance.
    ProcessTerminalOfTheRunner,
    /// A process terminal's proof is `not-started` exactly when no runner started.
    ProcessTerminalProofFitsRunner,
    /// A queue's name is one a `QueueJoined` may hold.
    QueueNameValid,
    /// A run in a queue has a runner only once admitted.
    RunnerOnlyAfterAdmission,
    /// A run joined its queue at its creation: a queued state holds at least the creation
    /// batch's two records. Times are not ordered: they are writers' clocks, which may step back
    /// between the join and the admission, and the reducer takes each record's time as given.
    QueueJoinedAtCreation,
    /// A run's dependencies name some run, none twice, not the run itself, no more than
    /// [`crate::event::MAX_DEPENDENCIES`].
    DependenciesWellFormed,
    /// A run's dependencies were recorded at its creation: a state with them holds at least
    /// the creation batch's records.
    DependenciesAtCreation,
    /// A run that waits for its dependencies has no runner and no slot of its queue yet.
    NothingStartedBeforeDependencies,
    /// A delayed run has a runner only once its delay ended.
    RunnerOnlyAfterDue,
    /// A run was delayed at its creation: a delayed state holds at least the creation batch's
    /// two records, and is in no queue (both take the record after `RunCreated`).
    DelayedAtCreation,
    /// A delay ended at or past its due time.
    DelayEndedWhenDue,
    /// A retry policy has 1 to [`crate::event::MAX_RETRIES`] retries and a longest backoff no
    /// shorter than its first.
    RetryPolicyWellFormed,
    /// The attempts that ended are numbered 1, 2, ... and no more than the retries; after one,
    /// the run waits for the next as a delayed run does.
    AttemptsCounted,
    /// Hooks are attempted only once the run has ended.
    HooksOnlyAfterEnd,
    /// One state per hook, in hook order, each naming a hook a run may have.
    HooksInOrder,
    /// A hook's attempts are counted: at least one, at most the limit; the open one is the
    /// last claimed, and the last ended one is the one before it (or the last, with none open).
    HookAttemptsCounted,
    /// A hook delivered or given up has no attempt open.
    HookNoClaimOnceSettled,
    /// A retry follows only an attempt that failed and was not the last.
    HookRetryFits,
    /// A steer request has an id (without white space), a source and one target per step it
    /// named, each a step of the run, none twice; its id and source within their limit.
    SteerWellFormed,
    /// No two steer requests have one id.
    SteerIdsDistinct,
    /// At most [`MAX_PENDING_STEERS`] steer requests wait, and at most [`MAX_STEERS_PER_RUN`]
    /// are held.
    SteerQueueBounded,
    /// A message waits only for a step that has yet to end (in a paused run, one that did not
    /// complete: its resume runs it).
    SteerWaitsOnlyForOpenStep,
    /// A message was delivered only to a step that started.
    SteerDeliveredOnlyToStartedStep,
    /// A step's stop names a step of the run, and no step has two.
    StepStopsDistinct,
}

impl ShapeRule {
    /// What a state that breaks the rule has, as a refusal says it.
    pub fn broken_text(self) -> &'static str {
        match self {
            ShapeRule::SpecChecks => "its spec is not one a run may have",
            ShapeRule::StepPerSpecStep => "its step states do not match its spec's steps",
            ShapeRule::HasHead => "it has no head",
            ShapeRule::TextsWithinLimits => "a text of it is longer than a record may hold",
            ShapeRule::TerminalHasEnd => "it is terminal without an end",
            ShapeRule::EndOnlyWhenTerminal => "it has an end but is not terminal",
            ShapeRule::EndAgreesWithStatus => "its end disagrees with its state",
            ShapeRule::RunningHasRunner => "it is running without a runner",
            ShapeRule::QueuedHasNoRunner => "it is queued with a runner",
            ShapeRule::StepRunsOnlyInRunningRun => "a step is running in a run that is not",
            ShapeRule::QueuedHasNoStartedStep => "it is queued with a step that started",
            ShapeRule::TerminalLeavesNoPendingStep => "it has ended with a step still pending",
            ShapeRule::CompleteHasEveryStepComplete => "it is complete with a step that is not",
            ShapeRule::PendingStepUntouched => {
                "a pending step has a process, a time, an outcome or a job"
            }
            ShapeRule::RunningStepStartedNotEnded => {
                "a running step has no start, or has an end, an exit code or an error"
            }
            ShapeRule::RanStepStartedAndEnded => "a step that ran and ended has no start or no end",
            ShapeRule::SkippedStepNeverStarted => "a skipped step has a start, a process or a job",
            ShapeRule::JobOnlyOnExternalJobStep => "a step that is not an external job has a job",
            ShapeRule::JobHasItsTime => "a step's job status and its time are not both there",
            ShapeRule::JobProgressFinite => "a job's progress is not a finite number",
            ShapeRule::ChainStepsInOrder => "a chain step started before an earlier one completed",
            ShapeRule::ParallelWithinConcurrency => {
                "more steps are running than its concurrency allows"
            }
            ShapeRule::ControlActionsDistinct => "an action was requested twice",
            ShapeRule::ProcessTerminalOfTheRunner => {
                "its process terminal names another runner instance than its runner's"
            }
            ShapeRule::ProcessTerminalProofFitsRunner => {
                "its process terminal's proof disagrees with whether a runner started"
            }
            ShapeRule::QueueNameValid => "its queue's name is not one a queue may have",
            ShapeRule::RunnerOnlyAfterAdmission => {
                "it has a runner while it waits in its queue unadmitted"
            }
            ShapeRule::QueueJoinedAtCreation => {
                "it is in a queue but holds fewer records than its creation batch"
            }
            ShapeRule::DependenciesWellFormed => {
                "its dependencies name no run, the run itself, a run twice, or too many runs"
            }
            ShapeRule::DependenciesAtCreation => {
                "it has dependencies but holds fewer records than its creation batch"
            }
            ShapeRule::NothingStartedBeforeDependencies => {
                "it has a runner or a slot while it waits for its dependencies"
            }
            ShapeRule::RetryPolicyWellFormed => "its retry policy is not one a run may have",
            ShapeRule::AttemptsCounted => {
                "its ended attempts are not numbered 1, 2, ..., outnumber its retries, or leave no wait for the next"
            }
            ShapeRule::RunnerOnlyAfterDue => "it has a runner while it waits for its due time",
            ShapeRule::DelayedAtCreation => {
                "it is delayed but holds fewer records than its creation batch, or is in a queue too"
            }
            ShapeRule::DelayEndedWhenDue => "its delay ended before its due time",
            ShapeRule::HooksOnlyAfterEnd => "a hook was attempted before it ended",
            ShapeRule::HooksInOrder => {
                "its hooks are out of order, twice there, or beyond the most a run has"
            }
            ShapeRule::HookAttemptsCounted => "a hook's attempts do not add up",
            ShapeRule::HookNoClaimOnceSettled => "a hook delivered or given up has an attempt open",
            ShapeRule::HookRetryFits => {
                "a hook has a retry after a delivery or after its last attempt"
            }
            ShapeRule::SteerWellFormed => "a steer request of it is not one a run takes",
            ShapeRule::SteerIdsDistinct => "two steer requests of it have one id",
            ShapeRule::SteerQueueBounded => "it holds more steer requests than a run may",
            ShapeRule::SteerWaitsOnlyForOpenStep => {
                "a steer message waits for a step that has ended"
            }
            ShapeRule::SteerDeliveredOnlyToStartedStep => {
                "a steer message was delivered to a step that never started"
            }
            ShapeRule::StepStopsDistinct => "a stop names no step of it, or a step twice",
        }
    }

    /// Checks the rule of `state`. Pure. The step rules read the spec's steps beside the
    /// states, so a state of the wrong step count is judged by [`ShapeRule::StepPerSpecStep`].
    pub fn check(self, state: &RunState) -> Result<(), ShapeError> {
        match self {
            ShapeRule::SpecChecks => state.spec.check().map_err(ShapeError::Spec),
            ShapeRule::StepPerSpecStep if state.steps.len() != state.spec.steps.len() => {
                Err(ShapeError::StepCount {
                    states: state.steps.len(),
                    steps: state.spec.steps.len(),
                })
            }
            _ if self.holds(state) => Ok(()),
            _ => Err(ShapeError::Broken(self)),
        }
    }

    /// Whether `state` keeps this rule: the rules about the run as a whole here, those about
    /// its steps in [`ShapeRule::steps_hold`]. The spec's own checks and the step count are
    /// judged by [`ShapeRule::check`] first, with errors of their own.
    fn holds(self, state: &RunState) -> bool {
        match self {
            ShapeRule::SpecChecks | ShapeRule::StepPerSpecStep => true,
            ShapeRule::PendingStepUntouched
            | ShapeRule::RunningStepStartedNotEnded
            | ShapeRule::RanStepStartedAndEnded
            | ShapeRule::SkippedStepNeverStarted
            | ShapeRule::JobOnlyOnExternalJobStep
            | ShapeRule::JobHasItsTime
            | ShapeRule::JobProgressFinite
            | ShapeRule::ChainStepsInOrder
            | ShapeRule::ParallelWithinConcurrency => self.steps_hold(state),
            ShapeRule::HasHead => state.head_seq >= 1,
            ShapeRule::TextsWithinLimits => texts(state).all(|text| text.len() <= MAX_TEXT_BYTES),
            ShapeRule::TerminalHasEnd => !state.is_terminal() || state.terminal.is_some(),
            ShapeRule::EndOnlyWhenTerminal => state.is_terminal() || state.terminal.is_none(),
            ShapeRule::EndAgreesWithStatus => state
                .terminal
                .as_ref()
                .is_none_or(|terminal| RunStatus::from(terminal.state) == state.status),
            ShapeRule::RunningHasRunner => {
                state.status != RunStatus::Running || state.runner.is_some()
            }
            ShapeRule::QueuedHasNoRunner => {
                state.status != RunStatus::Queued || state.runner.is_none()
            }
            ShapeRule::StepRunsOnlyInRunningRun => {
                state.status == RunStatus::Running || !any_step(state, StepStatus::Running)
            }
            ShapeRule::QueuedHasNoStartedStep => {
                state.status != RunStatus::Queued
                    || state.steps.iter().all(|step| step.started_at_ms.is_none())
            }
            ShapeRule::TerminalLeavesNoPendingStep => {
                !state.is_terminal() || !any_step(state, StepStatus::Pending)
            }
            ShapeRule::CompleteHasEveryStepComplete => {
                state.status != RunStatus::Complete
                    || state
                        .steps
                        .iter()
                        .all(|step| step.status == StepStatus::Complete)
            }
            ShapeRule::StepStopsDistinct => {
                state.step_stops.iter().enumerate().all(|(index, stop)| {
                    (stop.step as usize) < state.steps.len()
                        && state.step_stops[..index]
                            .iter()
                            .all(|earlier| earlier.step != stop.step)
                })
            }
            ShapeRule::ControlActionsDistinct => {
                state.controls.iter().enumerate().all(|(index, control)| {
                    state.controls[..index]
                        .iter()
                        .all(|earlier| earlier.action != control.action)
                })
            }
            ShapeRule::ProcessTerminalOfTheRunner => {
                match (&state.runner, &state.process_terminal) {
                    (Some(runner), Some(observed)) => runner.instance_id == observed.instance_id,
                    _ => true,
                }
            }
            ShapeRule::ProcessTerminalProofFitsRunner => {
                state.process_terminal.as_ref().is_none_or(|observed| {
                    (observed.proof == Proof::NotStarted) == state.runner.is_none()
                })
            }
            ShapeRule::QueueNameValid => state
                .queue
                .as_ref()
                .is_none_or(|queue| check_queue_name(&queue.name).is_ok()),
            ShapeRule::RunnerOnlyAfterAdmission => {
                state.runner.is_none()
                    || state
                        .queue
                        .as_ref()
                        .is_none_or(|queue| queue.admitted.is_some())
            }
            ShapeRule::QueueJoinedAtCreation => state.queue.is_none() || state.head_seq >= 2,
            ShapeRule::DependenciesWellFormed
            | ShapeRule::DependenciesAtCreation
            | ShapeRule::NothingStartedBeforeDependencies => self.dependencies_hold(state),
            ShapeRule::RunnerOnlyAfterDue
            | ShapeRule::DelayedAtCreation
            | ShapeRule::DelayEndedWhenDue => self.delay_holds(state),
            ShapeRule::RetryPolicyWellFormed | ShapeRule::AttemptsCounted => {
                self.retry_holds(state)
            }
            ShapeRule::SteerWellFormed
            | ShapeRule::SteerIdsDistinct
            | ShapeRule::SteerQueueBounded
            | ShapeRule::SteerWaitsOnlyForOpenStep
            | ShapeRule::SteerDeliveredOnlyToStartedStep => self.steers_hold(state),
            ShapeRule::HooksOnlyAfterEnd
            | ShapeRule::HooksInOrder
            | ShapeRule::HookAttemptsCounted
            | ShapeRule::HookNoClaimOnceSettled
            | ShapeRule::HookRetryFits => self.hooks_hold(state),
        }
    }

    /// Whether `state`'s hooks keep this rule, one of those about hooks.
    fn hooks_hold(self, state: &RunState) -> bool {
        match self {
            ShapeRule::HooksOnlyAfterEnd => state.hooks.is_empty() || state.is_terminal(),
            ShapeRule::HooksInOrder => {
                state.hooks.iter().all(|hook| hook.hook < MAX_HOOKS)
                    && state
                        .hooks
                        .windows(2)
                        .all(|pair| pair[0].hook < pair[1].hook)
            }
            ShapeRule::HookAttemptsCounted => state.hooks.iter().all(|hook| {
                let ended = match &hook.claim {
                    Some(claim) => {
                        if claim.attempt != hook.attempts {
                            return false;
                        }
                        hook.attempts.saturating_sub(1)
                    }
                    None => hook.attempts,
                };
                (1..=MAX_HOOK_ATTEMPTS).contains(&hook.attempts)
                    && hook.last.as_ref().map_or(0, |last| last.attempt) == ended
            }),
            ShapeRule::HookNoClaimOnceSettled => state
                .hooks
                .iter()
                .all(|hook| !hook.is_settled() || hook.claim.is_none()),
            ShapeRule::HookRetryFits => state.hooks.iter().all(|hook| {
                hook.last.as_ref().is_none_or(|last| {
                    last.retry_at_ms.is_none()
                        || (!last.outcome.is_delivered() && last.attempt < MAX_HOOK_ATTEMPTS)
                })
            }),
            _ => unreachable!("{self:?} is not a rule about hooks; holds() judges it"),
        }
    }

    /// Whether `state`'s steer requests keep this rule, one of those about them.
    /// The rules of a run's dependencies.
    fn dependencies_hold(self, state: &RunState) -> bool {
        let Some(dependencies) = &state.dependencies else {
            return true;
        };
        match self {
            ShapeRule::DependenciesWellFormed => {
                dependencies_flaw(&dependencies.after, &dependencies.after_any).is_none()
                    && dependencies.runs().all(|run| run != state.run_id)
            }
            ShapeRule::DependenciesAtCreation => state.head_seq >= 2,
            ShapeRule::NothingStartedBeforeDependencies => {
                dependencies.met.is_some()
                    || (state.runner.is_none()
                        && state
                            .queue
                            .as_ref()
                            .is_none_or(|queue| queue.admitted.is_none()))
            }
            _ => true,
        }
    }

    /// The rules of a delayed start.
    fn delay_holds(self, state: &RunState) -> bool {
        let Some(delay) = &state.delay else {
            return true;
        };
        match self {
            ShapeRule::RunnerOnlyAfterDue => state.runner.is_none() || delay.ended.is_some(),
            // A retried run waits for its next attempt as a delayed run, in its queue too.
            ShapeRule::DelayedAtCreation => {
                state.head_seq >= 2 && (state.queue.is_none() || is_retried(state))
            }
            ShapeRule::DelayEndedWhenDue => delay
                .ended
                .as_ref()
                .is_none_or(|ended| ended.at_ms >= delay.due_at_ms),
            _ => true,
        }
    }

    /// The rules of a run's retries.
    fn retry_holds(self, state: &RunState) -> bool {
        let Some(retry) = &state.retry else {
            return true;
        };
        match self {
            ShapeRule::RetryPolicyWellFormed => {
                retry_policy_flaw(retry.retries, retry.backoff_ms, retry.backoff_max_ms).is_none()
                    && state.head_seq >= 2
            }
            ShapeRule::AttemptsCounted => {
                retry.attempts.len() <= retry.retries as usize
                    && retry
                        .attempts
                        .iter()
                        .zip(1u32..)
                        .all(|(attempt, number)| attempt.attempt == number)
                    && (retry.attempts.is_empty() || state.delay.is_some())
            }
            _ => true,
        }
    }

    fn steers_hold(self, state: &RunState) -> bool {
        match self {
            ShapeRule::SteerWellFormed => state.steers.iter().all(|steer| {
                let steps: Vec<u32> = steer.targets.iter().map(|target| target.step).collect();
                !steer.id.is_empty()
                    && !steer.id.chars().any(char::is_whitespace)
                    && steer.id.len() <= MAX_STEER_ID_BYTES
                    && steer.source.len() <= MAX_STEER_ID_BYTES
                    && steer.preview.chars().count() <= STEER_PREVIEW_CHARS
                    && !steps.is_empty()
                    && steps.iter().enumerate().all(|(index, step)| {
                        (*step as usize) < state.steps.len() && !steps[..index].contains(step)
                    })
            }),
            ShapeRule::SteerIdsDistinct => state.steers.iter().enumerate().all(|(index, steer)| {
                state.steers[..index]
                    .iter()
                    .all(|earlier| earlier.id != steer.id)
            }),
            ShapeRule::SteerQueueBounded => {
                state.steers.len() <= MAX_STEERS_PER_RUN
                    && state.queued_steers().count() <= MAX_PENDING_STEERS
            }
            ShapeRule::SteerWaitsOnlyForOpenStep => {
                let is_paused = state.status == RunStatus::Paused;
                state
                    .steers
                    .iter()
                    .flat_map(|steer| &steer.targets)
                    .filter(|target| target.delivery == SteerDelivery::Queued)
                    .all(|target| {
                        state.steps.get(target.step as usize).is_some_and(|step| {
                            if is_paused {
                                step.status != StepStatus::Complete
                            } else {
                                !step.status.is_done()
                            }
                        })
                    })
            }
            ShapeRule::SteerDeliveredOnlyToStartedStep => state
                .steers
                .iter()
                .flat_map(|steer| &steer.targets)
                .filter(|target| matches!(target.delivery, SteerDelivery::Delivered { .. }))
                .all(|target| {
                    state
                        .steps
                        .get(target.step as usize)
                        .is_some_and(|step| step.started_at_ms.is_some())
                }),
            _ => unreachable!("{self:?} is not a rule about steer requests; holds() judges it"),
        }
    }

    /// Whether `state`'s steps keep this rule, one of those about steps.
    fn steps_hold(self, state: &RunState) -> bool {
        match self {
            ShapeRule::PendingStepUntouched => steps_with(state, StepStatus::Pending).all(|step| {
                step.process.is_none()
                    && step.started_at_ms.is_none()
                    && step.ended_at_ms.is_none()
                    && step.exit_code.is_none()
                    && step.error.is_none()
                    && step.job.is_none()
                    && step.job_updated_at_ms.is_none()
            }),
            ShapeRule::RunningStepStartedNotEnded => {
                steps_with(state, StepStatus::Running).all(|step| {
                    step.started_at_ms.is_some()
                        && step.ended_at_ms.is_none()
                        && step.exit_code.is_none()
                        && step.error.is_none()
                })
            }
            ShapeRule::RanStepStartedAndEnded => state
                .steps
                .iter()
                .filter(|step| {
                    matches!(
                        step.status,
                        StepStatus::Complete | StepStatus::Failed | StepStatus::Stopped
                    )
                })
                .all(|step| step.started_at_ms.is_some() && step.ended_at_ms.is_some()),
            ShapeRule::SkippedStepNeverStarted => {
                steps_with(state, StepStatus::Skipped).all(|step| {
                    step.started_at_ms.is_none()
                        && step.process.is_none()
                        && step.job.is_none()
                        && step.job_updated_at_ms.is_none()
                })
            }
            ShapeRule::JobOnlyOnExternalJobStep => state
                .steps
                .iter()
                .zip(&state.spec.steps)
                .all(|(step, spec)| step.job.is_none() || spec.is_external_job()),
            ShapeRule::JobHasItsTime => state
                .steps
                .iter()
                .all(|step| step.job.is_some() == step.job_updated_at_ms.is_some()),
            ShapeRule::JobProgressFinite => state
                .steps
                .iter()
                .filter_map(|step| step.job.as_ref()?.progress)
                .all(f64::is_finite),
            ShapeRule::ChainStepsInOrder => {
                state.spec.mode != Mode::Chain
                    || state.steps.iter().enumerate().all(|(index, step)| {
                        step.started_at_ms.is_none()
                            || state.steps[..index]
                                .iter()
                                .all(|earlier| earlier.status == StepStatus::Complete)
                    })
            }
            ShapeRule::ParallelWithinConcurrency => {
                state.spec.mode != Mode::Parallel
                    || steps_with(state, StepStatus::Running).count()
                        <= state.spec.concurrency as usize
            }
            _ => unreachable!("{self:?} is not a rule about steps; holds() judges it"),
        }
    }
}

fn any_step(state: &RunState, status: StepStatus) -> bool {
    state.steps.iter().any(|step| step.status == status)
}

fn steps_with(state: &RunState, status: StepStatus) -> impl Iterator<Item = &StepState> {
    state.steps.iter().filter(move |step| step.status == status)
}

/// Every text of a state that came from a record's text field
/// ([`crate::event::Event::check_text_limits`] names the same fields).
fn texts(state: &RunState) -> impl Iterator<Item = &str> {
    let run = [
        state.session_id.as_deref(),
        state.completion_owner_id.as_deref(),
        state.tool_call_id.as_deref(),
        state
            .runner
            .as_ref()
            .map(|runner| runner.identity.boot_id.as_str()),
        state
            .runner
            .as_ref()
            .map(|runner| runner.instance_id.as_str()),
        state
            .terminal
            .as_ref()
            .map(|terminal| terminal.summary.as_str()),
        state
            .terminal
            .as_ref()
            .and_then(|terminal| terminal.error.as_deref()),
        state
            .process_terminal
            .as_ref()
            .map(|observed| observed.instance_id.as_str()),
        state.queue.as_ref().map(|queue| queue.name.as_str()),
        state
            .queue
            .as_ref()
            .and_then(|queue| queue.admitted.as_ref())
            .map(|admitted| admitted.by.as_str()),
        state
            .dependencies
            .as_ref()
            .and_then(|dependencies| dependencies.met.as_ref())
            .map(|met| met.by.as_str()),
        state
            .delay
            .as_ref()
            .and_then(|delay| delay.ended.as_ref())
            .map(|ended| ended.by.as_str()),
    ];
    let steps = state.steps.iter().flat_map(|step| {
        let job = step.job.as_ref();
        [
            step.process
                .as_ref()
                .map(|process| process.boot_id.as_str()),
            step.error.as_deref(),
            job.and_then(|job| job.id.as_deref()),
            job.and_then(|job| job.message.as_deref()),
            job.and_then(|job| job.url.as_deref()),
        ]
    });
    let controls = state
        .controls
        .iter()
        .flat_map(|control| [Some(control.by.as_str()), Some(control.reason.as_str())])
        .chain(
            state
                .step_stops
                .iter()
                .flat_map(|stop| [Some(stop.by.as_str()), Some(stop.reason.as_str())]),
        );
    let hooks = state.hooks.iter().flat_map(|hook| {
        let claim = hook.claim.as_ref();
        let outcome = hook.last.as_ref().and_then(|last| match &last.outcome {
            HookOutcome::NotStarted { error: text } | HookOutcome::Abandoned { reason: text } => {
                Some(text.as_str())
            }
            HookOutcome::Delivered | HookOutcome::Failed { .. } | HookOutcome::TimedOut => None,
        });
        [
            claim.map(|claim| claim.by.as_str()),
            claim.map(|claim| claim.claimant.boot_id.as_str()),
            outcome,
        ]
    });
    run.into_iter()
        .chain(steps)
        .chain(controls)
        .chain(hooks)
        .flatten()
}

/// Where a rule the reducer refuses records by shows in the states it makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeptInState {
    /// Every state keeps these shape rules because of it.
    Rules(&'static [ShapeRule]),
    /// It is a rule of the sequence of records that no state can show; says why.
    RecordsOnly(&'static str),
}

impl TransitionError {
    /// The table of the reducer's rules against the shape rules of its states (the module
    /// docs).
    pub fn kept_in_state(&self) -> KeptInState {
        use KeptInState::{RecordsOnly, Rules};
        use ShapeRule as R;
        match self {
            TransitionError::NotCreated { .. } | TransitionError::CreatedNotFirst { .. } => {
                Rules(&[R::HasHead])
            }
            TransitionError::AlreadyCreated { .. } => RecordsOnly(
                "a second RunCreated is refused by its place among the records; a state has one creation",
            ),
            TransitionError::SequenceGap { .. } => {
                RecordsOnly("a state keeps its head, not the seqs that led to it")
            }
            TransitionError::WrongRun { .. } => RecordsOnly(
                "a state names its run; a snapshot is checked against the run it is stored under",
            ),
            TransitionError::InvalidSpec { .. } => Rules(&[R::SpecChecks]),
            TransitionError::TextTooLong { .. } => Rules(&[R::TextsWithinLimits]),
            TransitionError::RunnerNotQueued { .. } => {
                Rules(&[R::RunningHasRunner, R::QueuedHasNoRunner])
            }
            TransitionError::RunnerAfterProcessTerminal { .. } => {
                Rules(&[R::ProcessTerminalProofFitsRunner])
            }
            TransitionError::NoSuchStep { .. } => Rules(&[R::StepPerSpecStep]),
            TransitionError::StepStartWhileNotRunning { .. } => {
                Rules(&[R::StepRunsOnlyInRunningRun, R::QueuedHasNoStartedStep])
            }
            TransitionError::StepNotPending { .. } => Rules(&[R::RunningStepStartedNotEnded]),
            TransitionError::ChainOrder { .. } => Rules(&[R::ChainStepsInOrder]),
            TransitionError::ConcurrencyExceeded { .. } => Rules(&[R::ParallelWithinConcurrency]),
            TransitionError::StepNotRunning { .. } => {
                Rules(&[R::RanStepStartedAndEnded, R::PendingStepUntouched])
            }
            TransitionError::SkipNotPending { .. } => Rules(&[R::SkippedStepNeverStarted]),
            TransitionError::NotExternalJob { .. } => Rules(&[R::JobOnlyOnExternalJobStep]),
            TransitionError::NonFiniteProgress { .. } => Rules(&[R::JobProgressFinite]),
            TransitionError::AfterTerminal { .. } => {
                Rules(&[R::StepRunsOnlyInRunningRun, R::TerminalLeavesNoPendingStep])
            }
            TransitionError::ControlAlreadyRequested { .. } => Rules(&[R::ControlActionsDistinct]),
            TransitionError::CompleteWithUnfinishedStep { .. } => {
                Rules(&[R::CompleteHasEveryStepComplete])
            }
            TransitionError::ProcessTerminalAlreadyObserved { .. } => {
                RecordsOnly("a state holds at most one process terminal, by its type")
            }
            TransitionError::InstanceMismatch { .. } => Rules(&[R::ProcessTerminalOfTheRunner]),
            TransitionError::ProofMismatch { .. } => Rules(&[R::ProcessTerminalProofFitsRunner]),
            TransitionError::AlreadyDismissed { .. } => {
                RecordsOnly("a state holds at most one dismissal, by its type")
            }
            TransitionError::ResumedNotAtCreation { .. } => RecordsOnly(
                "a state does not keep where its resume link was recorded; the link lives in the journal's resume index",
            ),
            TransitionError::ResumedFromItself { .. } => RecordsOnly(
                "a state does not hold its resume link; the journal's resume index does",
            ),
            TransitionError::QueueJoinedLate { .. }
            | TransitionError::InvalidQueueName { .. }
            | TransitionError::NotInQueue { .. }
            | TransitionError::AlreadyAdmitted { .. }
            | TransitionError::RunnerBeforeAdmission { .. } => self.kept_in_queued_state(),
            TransitionError::DependsOnLate { .. }
            | TransitionError::InvalidDependencies { .. }
            | TransitionError::NoDependencies { .. }
            | TransitionError::DependenciesAlreadyMet { .. }
            | TransitionError::BeforeDependencies { .. } => self.kept_in_dependency_state(),
            TransitionError::StartDelayedLate { .. }
            | TransitionError::NotDelayed { .. }
            | TransitionError::DelayAlreadyEnded { .. }
            | TransitionError::NotYetDue { .. }
            | TransitionError::RunnerBeforeDue { .. } => self.kept_in_delayed_state(),
            TransitionError::UniqueKeyLate { .. }
            | TransitionError::RetryPolicyLate { .. }
            | TransitionError::InvalidRetryPolicy { .. }
            | TransitionError::NoRetries { .. }
            | TransitionError::AttemptNotCurrent { .. }
            | TransitionError::RetriesSpent { .. } => self.kept_in_retried_state(),
            TransitionError::HookBeforeEnd { .. }
            | TransitionError::HookOutOfRange { .. }
            | TransitionError::HookAttemptNotNext { .. }
            | TransitionError::HookAttemptOpen { .. }
            | TransitionError::HookNotClaimed { .. }
            | TransitionError::HookSettled { .. }
            | TransitionError::HookRetryNotAllowed { .. } => self.kept_in_hooked_state(),
            TransitionError::InvalidSteer { .. }
            | TransitionError::SteerToEndedStep { .. }
            | TransitionError::SteerIdReused { .. }
            | TransitionError::SteerQueueFull { .. }
            | TransitionError::TooManySteers { .. }
            | TransitionError::NoSuchSteer { .. }
            | TransitionError::SteerNotQueued { .. } => self.kept_in_steered_state(),
            TransitionError::StepNotStoppable { .. }
            | TransitionError::StepStopAlreadyRequested { .. }
            | TransitionError::AttemptAfterStepStop { .. }
            | TransitionError::AttemptAfterControl { .. } => self.kept_in_stopped_state(),
        }
    }

    /// [`TransitionError::kept_in_state`] of the refusals of a run's queue.
    fn kept_in_queued_state(&self) -> KeptInState {
        use KeptInState::{RecordsOnly, Rules};
        use ShapeRule as R;
        match self {
            TransitionError::QueueJoinedLate { .. } => Rules(&[R::QueueJoinedAtCreation]),
            TransitionError::InvalidQueueName { .. } => Rules(&[R::QueueNameValid]),
            TransitionError::NotInQueue { .. } => {
                RecordsOnly("a state holds an admission only inside its queue, by its type")
            }
            TransitionError::AlreadyAdmitted { .. } => {
                RecordsOnly("a state holds at most one admission, by its type")
            }
            _ => Rules(&[R::RunnerOnlyAfterAdmission]),
        }
    }

    /// [`TransitionError::kept_in_state`] of the refusals of a run's hooks.
    fn kept_in_hooked_state(&self) -> KeptInState {
        use ShapeRule as R;
        KeptInState::Rules(match self {
            TransitionError::HookBeforeEnd { .. } => &[R::HooksOnlyAfterEnd],
            TransitionError::HookOutOfRange { .. } => &[R::HooksInOrder],
            TransitionError::HookSettled { .. } => &[R::HookNoClaimOnceSettled],
            TransitionError::HookRetryNotAllowed { .. } => &[R::HookRetryFits],
            _ => &[R::HookAttemptsCounted],
        })
    }

    /// [`TransitionError::kept_in_state`] of the refusals of a step's stop, and of a retry
    /// after a stop.
    fn kept_in_stopped_state(&self) -> KeptInState {
        use KeptInState::{RecordsOnly, Rules};
        match self {
            TransitionError::AttemptAfterControl { .. } => RecordsOnly(
                "an attempt's end clears its control requests; a stop or interrupt before it is refused by the records alone",
            ),
            TransitionError::StepNotStoppable { .. } => RecordsOnly(
                "a step's stop is judged by its status when it is recorded; the step may end otherwise after it",
            ),
            TransitionError::StepStopAlreadyRequested { .. } => {
                Rules(&[ShapeRule::StepStopsDistinct])
            }
            _ => RecordsOnly(
                "a state keeps a step's stop, not whether it came before or after an attempt's end",
            ),
        }
    }

    /// [`TransitionError::kept_in_state`] of the refusals of a run's dependencies.
    fn kept_in_dependency_state(&self) -> KeptInState {
        use KeptInState::{RecordsOnly, Rules};
        use ShapeRule as R;
        match self {
            TransitionError::DependsOnLate { .. } => Rules(&[R::DependenciesAtCreation]),
            TransitionError::InvalidDependencies { .. } => Rules(&[R::DependenciesWellFormed]),
            TransitionError::NoDependencies { .. } => RecordsOnly(
                "a state holds a dependencies' end only inside its dependencies, by its type",
            ),
            TransitionError::DependenciesAlreadyMet { .. } => {
                RecordsOnly("a state holds at most one dependencies' end, by its type")
            }
            _ => Rules(&[R::NothingStartedBeforeDependencies]),
        }
    }

    /// [`TransitionError::kept_in_state`] of the refusals of a run's steer requests.
    fn kept_in_steered_state(&self) -> KeptInState {
        use KeptInState::{RecordsOnly, Rules};
        use ShapeRule as R;
        match self {
            TransitionError::InvalidSteer { .. } => Rules(&[R::SteerWellFormed]),
            TransitionError::SteerToEndedStep { .. } => Rules(&[R::SteerWaitsOnlyForOpenStep]),
            TransitionError::SteerIdReused { .. } => Rules(&[R::SteerIdsDistinct]),
            TransitionError::SteerQueueFull { .. } | TransitionError::TooManySteers { .. } => {
                Rules(&[R::SteerQueueBounded])
            }
            TransitionError::NoSuchSteer { .. } => RecordsOnly(
                "a state holds the steer requests it took; a delivery of another is refused by the records alone",
            ),
            TransitionError::SteerNotQueued { .. } => RecordsOnly(
                "a target's delivery is settled once, and a state holds only how it was settled",
            ),
            _ => unreachable!("kept_in_state hands only a steer's refusals here"),
        }
    }

    /// [`TransitionError::kept_in_state`] of the refusals of a run's key and retries.
    fn kept_in_retried_state(&self) -> KeptInState {
        use KeptInState::{RecordsOnly, Rules};
        use ShapeRule as R;
        match self {
            TransitionError::UniqueKeyLate { .. } => RecordsOnly(
                "a state does not keep where its key was recorded; a second key is refused by the records alone",
            ),
            TransitionError::RetryPolicyLate { .. } => RecordsOnly(
                "a state does not keep where its retry policy was recorded; a second one is refused by the records alone",
            ),
            TransitionError::InvalidRetryPolicy { .. } => Rules(&[R::RetryPolicyWellFormed]),
            TransitionError::NoRetries { .. } => RecordsOnly(
                "a state holds ended attempts only inside its retry policy, by its type",
            ),
            _ => Rules(&[R::AttemptsCounted]),
        }
    }

    /// [`TransitionError::kept_in_state`] of the refusals of a delayed start.
    fn kept_in_delayed_state(&self) -> KeptInState {
        use KeptInState::{RecordsOnly, Rules};
        use ShapeRule as R;
        match self {
            TransitionError::StartDelayedLate { .. } => Rules(&[R::DelayedAtCreation]),
            TransitionError::NotDelayed { .. } => {
                RecordsOnly("a state holds a delay's end only inside its delay, by its type")
            }
            TransitionError::DelayAlreadyEnded { .. } => {
                RecordsOnly("a state holds at most one end of its delay, by its type")
            }
            TransitionError::NotYetDue { .. } => Rules(&[R::DelayEndedWhenDue]),
            _ => Rules(&[R::RunnerOnlyAfterDue]),
        }
    }
}
