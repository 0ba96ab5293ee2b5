//! The reducer: [`apply`] and [`replay`], with one handler per event. The checks every record
//! meets (its run, its seq, its texts, nothing after `Terminal` but what may follow it) are made
//! once in [`RunState::apply_mut`]; each handler then checks its event's own rules, all of them
//! before it changes anything, so a refused record leaves the state exactly as it was.

use std::sync::Arc;

use super::{
    AdmissionInfo, AttemptInfo, ControlInfo, DelayInfo, DependencyInfo, HookAttemptEnd, HookClaim,
    HookState, ProcessTerminalInfo, QueueInfo, RetryInfo, RunState, RunStatus, RunnerInfo,
    SteerDelivery, SteerInfo, SteerTarget, StepState, StepStatus, StepStopInfo, TerminalInfo,
    TransitionError, Undelivered, UniqueInfo,
};
use crate::event::{
    ControlAction, Event, ExternalJobStatus, HookOutcome, MAX_HOOK_ATTEMPTS, MAX_HOOKS,
    MAX_PENDING_STEERS, MAX_STEERS_PER_RUN, Mode, Observer, ProcessExit, ProcessIdentity, Proof,
    Record, Repairer, RunId, SteerMode, StepEnd, StepOutcome, TerminalState, UnixMs,
    check_queue_name, dependencies_flaw, steer_preview, steer_request_flaw,
};

/// Applies one record to a run's state. `None` is a run that does not exist yet, which only
/// `RunCreated` at seq 1 may start. On error the state is unchanged.
pub fn apply(state: Option<&RunState>, record: &Record) -> Result<RunState, TransitionError> {
    match state {
        None => create(record),
        Some(state) => {
            let mut next = state.clone();
            next.apply_mut(record)?;
            Ok(next)
        }
    }
}

/// Folds a run's records from the first. `Ok(None)` for no records.
pub fn replay<'a>(
    records: impl IntoIterator<Item = &'a Record>,
) -> Result<Option<RunState>, TransitionError> {
    let mut state: Option<RunState> = None;
    for record in records {
        match &mut state {
            None => state = Some(create(record)?),
            Some(state) => state.apply_mut(record)?,
        }
    }
    Ok(state)
}

/// `RunCreated`: the run's first record, at seq 1, with a valid spec.
fn create(record: &Record) -> Result<RunState, TransitionError> {
    let run = record.run_id;
    let Event::RunCreated {
        spec,
        created_at_ms,
        session_id,
        completion_owner_id,
        tool_call_id,
    } = &record.event
    else {
        return Err(TransitionError::NotCreated {
            run,
            event: record.event.name(),
        });
    };
    if record.seq != 1 {
        return Err(TransitionError::CreatedNotFirst {
            run,
            found: record.seq,
        });
    }
    spec.check()
        .map_err(|source| TransitionError::InvalidSpec { run, source })?;
    record
        .event
        .check_text_limits()
        .map_err(|source| TransitionError::TextTooLong { run, source })?;
    let state = RunState {
        run_id: run,
        spec: Arc::clone(spec),
        created_at_ms: *created_at_ms,
        session_id: session_id.clone(),
        completion_owner_id: completion_owner_id.clone(),
        tool_call_id: tool_call_id.clone(),
        status: RunStatus::Queued,
        runner: None,
        steps: vec![StepState::pending(); spec.steps.len()],
        controls: Vec::new(),
        terminal: None,
        process_terminal: None,
        dismissed_at_ms: None,
        queue: None,
        dependencies: None,
        delay: None,
        unique: None,
        retry: None,
        hooks: Vec::new(),
        steers: Vec::new(),
        step_stops: Vec::new(),
        head_seq: 1,
        updated_at_ms: record.time_ms,
    };
    debug_assert_eq!(
        state.check_shape(),
        Ok(()),
        "a created run has a snapshot's shape"
    );
    Ok(state)
}

impl RunState {
    /// Applies one record in place. The checks every record meets come first; then the
    /// record's handler, which checks all its rules before it changes anything, so on error the
    /// state is exactly as before.
    pub fn apply_mut(&mut self, record: &Record) -> Result<(), TransitionError> {
        let run = self.run_id;
        if record.run_id != run {
            return Err(TransitionError::WrongRun {
                run,
                found: record.run_id,
            });
        }
        let event = &record.event;
        if let Event::RunCreated { .. } = event {
            return Err(TransitionError::AlreadyCreated { run });
        }
        // Debug builds check every state made from a state of a snapshot's shape (every state a
        // fold starts from has one: it was created by `apply`, or read from a snapshot that
        // passed `check_shape`). The journal checks the state each batch folds to in every
        // build, and refuses the batch (`journal::write::append::judge`); this costs a full
        // check twice per record, so it stays in debug builds.
        let was_shaped = cfg!(debug_assertions) && self.check_shape().is_ok();
        if record.seq != self.head_seq.saturating_add(1) {
            return Err(TransitionError::SequenceGap {
                run,
                head: self.head_seq,
                found: record.seq,
            });
        }
        event
            .check_text_limits()
            .map_err(|source| TransitionError::TextTooLong { run, source })?;
        // A run's hooks are attempted once it has ended; a paused run still takes messages for
        // its resume, and the refusals of files that asked for them.
        let is_allowed_after_terminal = match event {
            Event::ProcessTerminalObserved { .. }
            | Event::Dismissed { .. }
            | Event::HookAttempted { .. }
            | Event::HookEnded { .. } => true,
            Event::SteerRequested { .. } | Event::ControlRefused { .. } => {
                self.status == RunStatus::Paused
            }
            _ => false,
        };
        if self.is_terminal() && !is_allowed_after_terminal {
            return Err(TransitionError::AfterTerminal {
                run,
                event: event.name(),
                state: self.status,
            });
        }
        self.dispatch(record)?;
        self.head_seq = record.seq;
        self.updated_at_ms = record.time_ms;
        debug_assert!(
            !was_shaped || self.check_shape().is_ok(),
            "every state a fold makes from one of a snapshot's shape has that shape: {:?}",
            self.check_shape()
        );
        Ok(())
    }

    /// Hands the record to its event's handler, which checks the event's own rules.
    fn dispatch(&mut self, record: &Record) -> Result<(), TransitionError> {
        let event = &record.event;
        let at_ms = record.time_ms;
        // Each arm only dispatches: the rules of an event live in its handler.
        match event {
            Event::RunCreated { .. } => unreachable!("RunCreated was refused above"),
            Event::RunnerStarted {
                runner,
                instance_id,
            } => self.runner_started(runner, instance_id, at_ms),
            Event::StepRunning { step, process } => {
                self.step_running(event, *step, process.as_ref(), at_ms)
            }
            Event::ExternalJobUpdated { step, job } => {
                self.external_job_updated(event, *step, job, at_ms)
            }
            Event::StepFinished { step, outcome } => {
                self.step_finished(event, *step, outcome, at_ms)
            }
            Event::ControlRequested { action, by, reason } => {
                self.control_requested(*action, by, reason, at_ms)
            }
            Event::Terminal {
                state,
                error,
                summary,
                exit_code,
                repaired_by,
            } => self.terminal(
                *state,
                error.as_deref(),
                summary,
                *exit_code,
                *repaired_by,
                at_ms,
            ),
            Event::ProcessTerminalObserved {
                instance_id,
                exit,
                proof,
                observer,
            } => self.process_terminal_observed(instance_id, *exit, *proof, *observer, at_ms),
            Event::Dismissed { at_ms: dismissed } => self.dismissed(*dismissed),
            Event::Resumed { from } => self.resumed(*from),
            Event::QueueJoined {
                queue,
                idle_timeout_ms,
                heartbeat_ms,
            } => self.queue_joined(queue, *idle_timeout_ms, *heartbeat_ms, record.seq, at_ms),
            Event::QueueAdmitted { by } => self.queue_admitted(by, at_ms),
            Event::DependsOn {
                after,
                after_any,
                idle_timeout_ms,
                heartbeat_ms,
            } => self.depends_on(
                DependencyInfo {
                    after: after.clone(),
                    after_any: after_any.clone(),
                    idle_timeout_ms: *idle_timeout_ms,
                    heartbeat_ms: *heartbeat_ms,
                    met: None,
                },
                record.seq,
            ),
            Event::DependenciesMet { by } => self.dependencies_met(by, at_ms),
            Event::HookAttempted { .. } | Event::HookEnded { .. } => self.hook_event(event, at_ms),
            Event::SteerRequested {
                id,
                steps,
                mode,
                message,
                source,
            } => self.steer_requested(id, steps, *mode, message, source, record.seq, at_ms),
            Event::SteerDelivered { id, step } => self.steer_delivered(event, id, *step, at_ms),
            // A refusal is its record: nothing of the run changes.
            Event::ControlRefused { .. } => Ok(()),
            Event::HostEnded {
                state,
                exit_code,
                message,
                ended_at_ms,
                ..
            } => self.terminal(
                *state,
                Some(message),
                message,
                *exit_code,
                Some(Repairer::Host),
                *ended_at_ms,
            ),
            Event::StartDelayed {
                due_at_ms,
                idle_timeout_ms,
                heartbeat_ms,
            } => self.start_delayed(*due_at_ms, *idle_timeout_ms, *heartbeat_ms, record.seq),
            Event::DelayEnded { by } => self.delay_ended(by, at_ms),
            Event::UniqueKey { key, hold_ms } => self.unique_key(key, *hold_ms, record.seq),
            Event::RetryPolicy { .. } | Event::AttemptEnded { .. } => {
                self.apply_retry_event(event, record.seq, at_ms)
            }
            Event::StepStopRequested { .. } => self.step_stop_requested(event, at_ms),
        }
    }

    /// `StepStopRequested(i)`: step `i` is pending or running, and has no stop requested yet.
    fn step_stop_requested(&mut self, event: &Event, at_ms: UnixMs) -> Result<(), TransitionError> {
        let Event::StepStopRequested { step, by, reason } = event else {
            unreachable!("dispatch hands only a step's stop here");
        };
        let (step, run) = (*step, self.run_id);
        let index = self.step_index(event, step)?;
        let status = self.steps[index].status;
        if !matches!(status, StepStatus::Pending | StepStatus::Running) {
            return Err(TransitionError::StepNotStoppable { run, step, status });
        }
        if self.step_stop(step).is_some() {
            return Err(TransitionError::StepStopAlreadyRequested { run, step });
        }
        self.step_stops.push(StepStopInfo {
            step,
            by: by.to_string(),
            reason: reason.to_string(),
            at_ms,
        });
        Ok(())
    }

    /// Hands a retry's event to its handler: `RetryPolicy`, `AttemptEnded`.
    fn apply_retry_event(
        &mut self,
        event: &Event,
        seq: u64,
        at_ms: UnixMs,
    ) -> Result<(), TransitionError> {
        match event {
            Event::RetryPolicy {
                retries,
                backoff_ms,
                backoff_max_ms,
                on,
                idle_timeout_ms,
                heartbeat_ms,
            } => self.retry_policy(
                RetryInfo {
                    retries: *retries,
                    backoff_ms: *backoff_ms,
                    backoff_max_ms: *backoff_max_ms,
                    on: on.clone(),
                    idle_timeout_ms: *idle_timeout_ms,
                    heartbeat_ms: *heartbeat_ms,
                    attempts: Vec::new(),
                },
                seq,
            ),
            Event::AttemptEnded {
                attempt,
                cause,
                error,
                summary,
                exit_code,
                retry_at_ms,
            } => self.attempt_ended(
                AttemptInfo {
                    attempt: *attempt,
                    cause: *cause,
                    error: error.clone(),
                    summary: summary.clone(),
                    exit_code: *exit_code,
                    ended_at_ms: at_ms,
                    retry_at_ms: *retry_at_ms,
                    runner_instance: None,
                    process_terminal: None,
                },
                at_ms,
            ),
            _ => unreachable!("dispatch hands only a retry's events here"),
        }
    }

    /// The seq the creation batch's next event takes after `RunCreated` and the events that
    /// come before a key: its `QueueJoined` or `StartDelayed`, its `DependsOn`, its
    /// `RetryPolicy`.
    fn creation_tail(&self) -> u64 {
        2 + u64::from(self.queue.is_some())
            + u64::from(self.delay.is_some())
            + u64::from(self.dependencies.is_some())
            + u64::from(self.retry.is_some())
    }

    /// `RetryPolicy`: once, in the creation batch after its other events and before its key,
    /// with 1 to `MAX_RETRIES` retries and a longest backoff no shorter than the first.
    fn retry_policy(&mut self, retry: RetryInfo, seq: u64) -> Result<(), TransitionError> {
        let run = self.run_id;
        if self.retry.is_some() || self.unique.is_some() || seq != self.creation_tail() {
            return Err(TransitionError::RetryPolicyLate { run, found: seq });
        }
        if let Some(flaw) =
            crate::event::retry_policy_flaw(retry.retries, retry.backoff_ms, retry.backoff_max_ms)
        {
            return Err(TransitionError::InvalidRetryPolicy { run, flaw });
        }
        self.retry = Some(retry);
        Ok(())
    }

    /// `AttemptEnded(k)`: the run has retries left, its runner's attempt `k` is the current
    /// one, and no stop or interrupt was asked, of the run or of one of its steps. The attempt, its runner and that runner's
    /// process end (if recorded) are kept; the run is `queued` again with every step
    /// `pending`, no runner and no control request, waiting for `retry_at_ms` as a delayed run
    /// does; in a queue, it gives its slot back and takes one again once due. Messages still
    /// waiting are undelivered, as at a run's end.
    fn attempt_ended(
        &mut self,
        mut ended: AttemptInfo,
        at_ms: UnixMs,
    ) -> Result<(), TransitionError> {
        let run = self.run_id;
        let (idle_timeout_ms, heartbeat_ms) = self.kept_runner_settings();
        let Some(retry) = &self.retry else {
            return Err(TransitionError::NoRetries { run });
        };
        let current = retry.current_attempt();
        if ended.attempt != current || self.runner.is_none() || self.status != RunStatus::Running {
            return Err(TransitionError::AttemptNotCurrent {
                run,
                current,
                found: ended.attempt,
            });
        }
        if retry.attempts.len() >= retry.retries as usize {
            return Err(TransitionError::RetriesSpent {
                run,
                attempt: ended.attempt,
                retries: retry.retries,
            });
        }
        if let Some(control) = self
            .controls
            .iter()
            .find(|control| control.action != ControlAction::Timeout)
        {
            return Err(TransitionError::AttemptAfterControl {
                run,
                action: control.action,
            });
        }
        if let Some(stop) = self.step_stops.first() {
            return Err(TransitionError::AttemptAfterStepStop {
                run,
                step: stop.step,
            });
        }
        ended.runner_instance = self.runner.take().map(|runner| runner.instance_id);
        ended.process_terminal = self.process_terminal.take();
        let due_at_ms = ended.retry_at_ms;
        self.give_up_steers(None, at_ms, Undelivered::RunEnded);
        self.status = RunStatus::Queued;
        self.steps = vec![StepState::pending(); self.steps.len()];
        self.controls.clear();
        if let Some(queue) = &mut self.queue {
            queue.admitted = None;
        }
        self.delay = Some(DelayInfo {
            due_at_ms,
            idle_timeout_ms,
            heartbeat_ms,
            ended: None,
        });
        if let Some(retry) = &mut self.retry {
            retry.attempts.push(ended);
        }
        Ok(())
    }

    /// `UniqueKey`: once, in the creation batch right after its other events (`RunCreated`,
    /// then its `QueueJoined` or `StartDelayed`, then its `DependsOn`). Whether another run
    /// holds the key is the journal's check, across runs.
    fn unique_key(
        &mut self,
        key: &str,
        hold_ms: Option<u64>,
        seq: u64,
    ) -> Result<(), TransitionError> {
        let run = self.run_id;
        if self.unique.is_some() || seq != self.creation_tail() {
            return Err(TransitionError::UniqueKeyLate { run, found: seq });
        }
        self.unique = Some(UniqueInfo {
            key: key.to_string(),
            hold_ms,
        });
        Ok(())
    }

    /// `RunnerStarted`: only from `queued`, once, and never after the launcher gave up on the
    /// run (its process terminal is recorded).
    fn runner_started(
        &mut self,
        runner: &ProcessIdentity,
        instance_id: &str,
        at_ms: UnixMs,
    ) -> Result<(), TransitionError> {
        let run = self.run_id;
        if self.status != RunStatus::Queued {
            return Err(TransitionError::RunnerNotQueued {
                run,
                state: self.status,
            });
        }
        if let Some(observed) = &self.process_terminal {
            return Err(TransitionError::RunnerAfterProcessTerminal {
                run,
                proof: observed.proof.as_str(),
            });
        }
        if self.is_waiting_for_dependencies() {
            return Err(TransitionError::BeforeDependencies {
                run,
                event: "RunnerStarted",
            });
        }
        if let Some(queue) = self.queue.as_ref().filter(|queue| queue.admitted.is_none()) {
            return Err(TransitionError::RunnerBeforeAdmission {
                run,
                queue: queue.name.clone(),
            });
        }
        if let Some(delay) = self.delay.as_ref().filter(|delay| delay.ended.is_none()) {
            return Err(TransitionError::RunnerBeforeDue {
                run,
                due_at_ms: delay.due_at_ms,
            });
        }
        self.status = RunStatus::Running;
        self.runner = Some(RunnerInfo {
            identity: runner.clone(),
            instance_id: instance_id.to_string(),
            started_at_ms: at_ms,
        });
        Ok(())
    }

    /// `StepRunning(i)`: the run running, step `i` pending; in a chain every earlier step
    /// complete; in parallel mode, room under the concurrency.
    fn step_running(
        &mut self,
        event: &Event,
        step: u32,
        process: Option<&ProcessIdentity>,
        at_ms: UnixMs,
    ) -> Result<(), TransitionError> {
        let run = self.run_id;
        let index = self.step_index(event, step)?;
        if self.status != RunStatus::Running {
            return Err(TransitionError::StepStartWhileNotRunning {
                run,
                step,
                state: self.status,
            });
        }
        let status = self.steps[index].status;
        if status != StepStatus::Pending {
            return Err(TransitionError::StepNotPending { run, step, status });
        }
        match self.spec.mode {
            Mode::Chain => {
                if let Some((earlier, state)) = self.steps[..index]
                    .iter()
                    .enumerate()
                    .find(|(_, state)| state.status != StepStatus::Complete)
                {
                    return Err(TransitionError::ChainOrder {
                        run,
                        step,
                        earlier,
                        status: state.status,
                    });
                }
            }
            Mode::Parallel => {
                let running = self
                    .steps
                    .iter()
                    .filter(|state| state.status == StepStatus::Running)
                    .count();
                if running >= self.spec.concurrency as usize {
                    return Err(TransitionError::ConcurrencyExceeded {
                        run,
                        step,
                        running,
                        concurrency: self.spec.concurrency,
                    });
                }
            }
            Mode::Single => {}
        }
        let state = &mut self.steps[index];
        state.status = StepStatus::Running;
        state.process = process.cloned();
        state.started_at_ms = Some(at_ms);
        Ok(())
    }

    /// `ExternalJobUpdated(i)`: step `i` is an external-job step and running; the status is
    /// replaced whole.
    fn external_job_updated(
        &mut self,
        event: &Event,
        step: u32,
        job: &ExternalJobStatus,
        at_ms: UnixMs,
    ) -> Result<(), TransitionError> {
        let run = self.run_id;
        let index = self.step_index(event, step)?;
        let spec = &self.spec.steps[index];
        if !spec.is_external_job() {
            return Err(TransitionError::NotExternalJob {
                run,
                step,
                name: spec.name.clone(),
            });
        }
        self.require_running_step(event, step, index)?;
        if let Some(progress) = job.progress.filter(|progress| !progress.is_finite()) {
            return Err(TransitionError::NonFiniteProgress {
                run,
                step,
                progress,
            });
        }
        let state = &mut self.steps[index];
        state.job = Some(job.clone());
        state.job_updated_at_ms = Some(at_ms);
        Ok(())
    }

    /// `StepFinished(i)`: step `i` running, or pending when it is skipped.
    fn step_finished(
        &mut self,
        event: &Event,
        step: u32,
        outcome: &StepOutcome,
        at_ms: UnixMs,
    ) -> Result<(), TransitionError> {
        let run = self.run_id;
        let index = self.step_index(event, step)?;
        if outcome.end == StepEnd::Skipped {
            let status = self.steps[index].status;
            if status != StepStatus::Pending {
                return Err(TransitionError::SkipNotPending { run, step, status });
            }
        } else {
            self.require_running_step(event, step, index)?;
        }
        let state = &mut self.steps[index];
        state.status = outcome.end.into();
        state.ended_at_ms = Some(at_ms);
        state.exit_code = outcome.exit_code;
        state.error = outcome.error.clone();
        self.give_up_steers(Some(step), at_ms, Undelivered::StepEnded);
        Ok(())
    }

    /// Marks the messages still waiting for `step` (every step: `None`) undelivered.
    fn give_up_steers(&mut self, step: Option<u32>, at_ms: UnixMs, why: Undelivered) {
        for target in self.steers.iter_mut().flat_map(|steer| &mut steer.targets) {
            if target.delivery == SteerDelivery::Queued
                && step.is_none_or(|step| target.step == step)
            {
                target.delivery = SteerDelivery::Undelivered { at_ms, why };
            }
        }
    }

    /// `ControlRequested`: at most one request per action.
    fn control_requested(
        &mut self,
        action: ControlAction,
        by: &str,
        reason: &str,
        at_ms: UnixMs,
    ) -> Result<(), TransitionError> {
        if self.has_control(action) {
            return Err(TransitionError::ControlAlreadyRequested {
                run: self.run_id,
                action,
            });
        }
        self.controls.push(ControlInfo {
            action,
            by: by.to_string(),
            reason: reason.to_string(),
            at_ms,
        });
        Ok(())
    }

    /// `Terminal`: `complete` needs every step complete. Running steps end `failed` (`stopped`
    /// when the run is stopped) with the run's error; pending steps are skipped.
    fn terminal(
        &mut self,
        state: TerminalState,
        error: Option<&str>,
        summary: &str,
        exit_code: i32,
        repaired_by: Option<Repairer>,
        at_ms: UnixMs,
    ) -> Result<(), TransitionError> {
        let unfinished = self
            .steps
            .iter()
            .enumerate()
            .find(|(_, step)| step.status != StepStatus::Complete);
        if let (TerminalState::Complete, Some((step, unfinished))) = (state, unfinished) {
            return Err(TransitionError::CompleteWithUnfinishedStep {
                run: self.run_id,
                step: step as u32,
                status: unfinished.status,
            });
        }
        let running_becomes = if state == TerminalState::Stopped {
            StepStatus::Stopped
        } else {
            StepStatus::Failed
        };
        for step in &mut self.steps {
            match step.status {
                StepStatus::Running => {
                    step.status = running_becomes;
                    step.ended_at_ms = Some(at_ms);
                    if step.error.is_none() {
                        step.error = error.map(str::to_string);
                    }
                }
                StepStatus::Pending => step.status = StepStatus::Skipped,
                _ => {}
            }
        }
        // A pause keeps the messages still waiting: its resume takes them on.
        if state != TerminalState::Paused {
            self.give_up_steers(None, at_ms, Undelivered::RunEnded);
        }
        self.status = state.into();
        self.terminal = Some(TerminalInfo {
            state,
            error: error.map(str::to_string),
            summary: summary.to_string(),
            exit_code,
            repaired_by,
            at_ms,
        });
        Ok(())
    }

    /// `ProcessTerminalObserved`: once per run, naming the run's runner instance; proof
    /// `not-started` exactly when no runner ever started.
    fn process_terminal_observed(
        &mut self,
        instance_id: &str,
        exit: Option<ProcessExit>,
        proof: Proof,
        observer: Observer,
        at_ms: UnixMs,
    ) -> Result<(), TransitionError> {
        let run = self.run_id;
        let observed = ProcessTerminalInfo {
            instance_id: instance_id.to_string(),
            exit,
            proof,
            observer,
            at_ms,
        };
        // The runner of the attempt that ended last, seen gone after the run moved on: its end
        // is kept with its attempt.
        let is_current = self
            .runner
            .as_ref()
            .is_some_and(|runner| runner.instance_id == instance_id);
        if let Some(attempt) = self
            .retry
            .as_mut()
            .and_then(|retry| retry.attempts.last_mut())
            .filter(|attempt| {
                !is_current
                    && proof != Proof::NotStarted
                    && attempt.runner_instance.as_deref() == Some(instance_id)
            })
        {
            if let Some(earlier) = &attempt.process_terminal {
                return Err(TransitionError::ProcessTerminalAlreadyObserved {
                    run,
                    instance: earlier.instance_id.clone(),
                });
            }
            attempt.process_terminal = Some(observed);
            return Ok(());
        }
        if let Some(observed) = &self.process_terminal {
            return Err(TransitionError::ProcessTerminalAlreadyObserved {
                run,
                instance: observed.instance_id.clone(),
            });
        }
        match &self.runner {
            Some(runner) => {
                if runner.instance_id != instance_id {
                    return Err(TransitionError::InstanceMismatch {
                        run,
                        expected: runner.instance_id.clone(),
                        found: instance_id.to_string(),
                    });
                }
                if proof == Proof::NotStarted {
                    return Err(TransitionError::ProofMismatch {
                        run,
                        proof: proof.as_str(),
                        why: "the run has a runner that started",
                    });
                }
            }
            None => {
                if proof != Proof::NotStarted {
                    return Err(TransitionError::ProofMismatch {
                        run,
                        proof: proof.as_str(),
                        why: "no runner ever started for the run",
                    });
                }
            }
        }
        self.process_terminal = Some(observed);
        Ok(())
    }

    /// `Dismissed`: once.
    fn dismissed(&mut self, dismissed_at_ms: UnixMs) -> Result<(), TransitionError> {
        if self.dismissed_at_ms.is_some() {
            return Err(TransitionError::AlreadyDismissed { run: self.run_id });
        }
        self.dismissed_at_ms = Some(dismissed_at_ms);
        Ok(())
    }

    /// `Resumed`: the record right after `RunCreated` (so once, in the creation batch, before a
    /// runner could take the run), naming another run. The link is the journal's resume index,
    /// not the state: the state only moves its head.
    fn resumed(&mut self, from: RunId) -> Result<(), TransitionError> {
        let run = self.run_id;
        if self.head_seq != 1 {
            return Err(TransitionError::ResumedNotAtCreation {
                run,
                head: self.head_seq,
            });
        }
        if from == run {
            return Err(TransitionError::ResumedFromItself { run });
        }
        Ok(())
    }

    /// `QueueJoined`: only as the run's second record, in its creation batch, with a valid
    /// queue name.
    fn queue_joined(
        &mut self,
        queue: &str,
        idle_timeout_ms: Option<u64>,
        heartbeat_ms: Option<u64>,
        seq: u64,
        at_ms: UnixMs,
    ) -> Result<(), TransitionError> {
        let run = self.run_id;
        if seq != 2 {
            return Err(TransitionError::QueueJoinedLate { run, found: seq });
        }
        check_queue_name(queue)
            .map_err(|source| TransitionError::InvalidQueueName { run, source })?;
        self.queue = Some(QueueInfo {
            name: queue.to_string(),
            idle_timeout_ms,
            heartbeat_ms,
            joined_at_ms: at_ms,
            admitted: None,
        });
        Ok(())
    }

    /// `QueueAdmitted`: the run is in a queue and not yet admitted. Whether its queue has a
    /// free slot and the run is first in it is the journal's check, across runs.
    fn queue_admitted(&mut self, by: &str, at_ms: UnixMs) -> Result<(), TransitionError> {
        let run = self.run_id;
        let Some(queue) = self.queue.as_mut() else {
            return Err(TransitionError::NotInQueue { run });
        };
        if queue.admitted.is_some() {
            return Err(TransitionError::AlreadyAdmitted {
                run,
                queue: queue.name.clone(),
            });
        }
        let is_waiting_for_dependencies = self
            .dependencies
            .as_ref()
            .is_some_and(|dependencies| dependencies.met.is_none());
        if is_waiting_for_dependencies {
            return Err(TransitionError::BeforeDependencies {
                run,
                event: "QueueAdmitted",
            });
        }
        queue.admitted = Some(AdmissionInfo {
            by: by.to_string(),
            at_ms,
        });
        Ok(())
    }

    /// `DependsOn`: only in the creation batch, right after `RunCreated` (seq 2) or its
    /// `QueueJoined` (seq 3), once; lists that name some run, none twice, not the run itself,
    /// no more than the limit. Whether the runs exist is the journal's check, across runs.
    fn depends_on(
        &mut self,
        dependencies: DependencyInfo,
        seq: u64,
    ) -> Result<(), TransitionError> {
        let run = self.run_id;
        let at_creation = match seq {
            2 => true,
            3 => self.queue.is_some() && self.dependencies.is_none(),
            _ => false,
        };
        if !at_creation {
            return Err(TransitionError::DependsOnLate { run, found: seq });
        }
        if let Some(flaw) = dependencies_flaw(&dependencies.after, &dependencies.after_any) {
            return Err(TransitionError::InvalidDependencies { run, flaw });
        }
        if dependencies.runs().any(|dependency| dependency == run) {
            return Err(TransitionError::InvalidDependencies {
                run,
                flaw: "name the run itself",
            });
        }
        self.dependencies = Some(dependencies);
        Ok(())
    }

    /// `DependenciesMet`: the run has dependencies, not yet met. Whether each ended as asked
    /// is the journal's check, across runs.
    fn dependencies_met(&mut self, by: &str, at_ms: UnixMs) -> Result<(), TransitionError> {
        let run = self.run_id;
        let Some(dependencies) = self.dependencies.as_mut() else {
            return Err(TransitionError::NoDependencies { run });
        };
        if dependencies.met.is_some() {
            return Err(TransitionError::DependenciesAlreadyMet { run });
        }
        dependencies.met = Some(AdmissionInfo {
            by: by.to_string(),
            at_ms,
        });
        Ok(())
    }

    /// `StartDelayed`: only as the run's second record, in its creation batch (so never beside
    /// a queue or a resume, which take that place too).
    fn start_delayed(
        &mut self,
        due_at_ms: UnixMs,
        idle_timeout_ms: Option<u64>,
        heartbeat_ms: Option<u64>,
        seq: u64,
    ) -> Result<(), TransitionError> {
        let run = self.run_id;
        if seq != 2 {
            return Err(TransitionError::StartDelayedLate { run, found: seq });
        }
        self.delay = Some(DelayInfo {
            due_at_ms,
            idle_timeout_ms,
            heartbeat_ms,
            ended: None,
        });
        Ok(())
    }

    /// `DelayEnded`: the run is delayed, its delay has not ended, and the record's time is at
    /// or past its due time. The record's time is its writer's clock when it made the batch,
    /// judged inside the transaction that commits it: no runner starts before the due time.
    fn delay_ended(&mut self, by: &str, at_ms: UnixMs) -> Result<(), TransitionError> {
        let run = self.run_id;
        let Some(delay) = self.delay.as_mut() else {
            return Err(TransitionError::NotDelayed { run });
        };
        if delay.ended.is_some() {
            return Err(TransitionError::DelayAlreadyEnded { run });
        }
        if at_ms < delay.due_at_ms {
            return Err(TransitionError::NotYetDue {
                run,
                due_at_ms: delay.due_at_ms,
                at_ms,
            });
        }
        delay.ended = Some(AdmissionInfo {
            by: by.to_string(),
            at_ms,
        });
        Ok(())
    }

    /// Dispatches a hook's event to its handler.
    fn hook_event(&mut self, event: &Event, at_ms: UnixMs) -> Result<(), TransitionError> {
        match event {
            Event::HookAttempted {
                hook,
                attempt,
                claimant,
                by,
                lease_ms,
            } => self.hook_attempted(
                event,
                *hook,
                HookClaim {
                    attempt: *attempt,
                    claimant: claimant.clone(),
                    by: by.clone(),
                    lease_ms: *lease_ms,
                    at_ms,
                },
            ),
            Event::HookEnded {
                hook,
                attempt,
                outcome,
                retry_at_ms,
            } => self.hook_ended(event, *hook, *attempt, outcome, *retry_at_ms, at_ms),
            _ => unreachable!("only hook events are dispatched here"),
        }
    }

    /// `HookAttempted`: once the run is terminal, for a hook in range that is neither
    /// delivered nor given up and has no attempt open, as its next attempt.
    fn hook_attempted(
        &mut self,
        event: &Event,
        hook: u32,
        claim: HookClaim,
    ) -> Result<(), TransitionError> {
        let run = self.run_id;
        let attempt = claim.attempt;
        self.require_hook_place(event, hook)?;
        let current = self.hook(hook);
        if let Some(current) = current {
            if current.is_settled() {
                let how = if current.is_delivered() {
                    "delivered"
                } else {
                    "given up"
                };
                return Err(TransitionError::HookSettled { run, hook, how });
            }
            if let Some(claim) = &current.claim {
                return Err(TransitionError::HookAttemptOpen {
                    run,
                    hook,
                    attempt: claim.attempt,
                });
            }
        }
        let expected = current.map_or(0, |current| current.attempts) + 1;
        if attempt != expected {
            return Err(TransitionError::HookAttemptNotNext {
                run,
                hook,
                expected,
                found: attempt,
            });
        }
        match self.hooks.iter_mut().find(|state| state.hook == hook) {
            Some(state) => {
                state.attempts = attempt;
                state.claim = Some(claim);
            }
            None => {
                let place = self.hooks.partition_point(|state| state.hook < hook);
                self.hooks.insert(
                    place,
                    HookState {
                        hook,
                        attempts: attempt,
                        claim: Some(claim),
                        last: None,
                    },
                );
            }
        }
        Ok(())
    }

    /// `HookEnded`: once the run is terminal, for the attempt claimed; a retry only after an
    /// attempt that failed and was not the last.
    fn hook_ended(
        &mut self,
        event: &Event,
        hook: u32,
        attempt: u32,
        outcome: &HookOutcome,
        retry_at_ms: Option<UnixMs>,
        at_ms: UnixMs,
    ) -> Result<(), TransitionError> {
        let run = self.run_id;
        self.require_hook_place(event, hook)?;
        let is_claimed = self
            .hook(hook)
            .and_then(|state| state.claim.as_ref())
            .is_some_and(|claim| claim.attempt == attempt);
        if !is_claimed {
            return Err(TransitionError::HookNotClaimed { run, hook, attempt });
        }
        if retry_at_ms.is_some() {
            let why = if outcome.is_delivered() {
                Some("it was delivered")
            } else if attempt >= MAX_HOOK_ATTEMPTS {
                Some("it was the last attempt")
            } else {
                None
            };
            if let Some(why) = why {
                return Err(TransitionError::HookRetryNotAllowed {
                    run,
                    hook,
                    attempt,
                    why,
                });
            }
        }
        let state = self
            .hooks
            .iter_mut()
            .find(|state| state.hook == hook)
            .expect("a claimed hook has a state");
        state.claim = None;
        state.last = Some(HookAttemptEnd {
            attempt,
            outcome: outcome.clone(),
            retry_at_ms,
            at_ms,
        });
        Ok(())
    }

    /// A hook event is for a run that has ended, naming a hook a run may have.
    fn require_hook_place(&self, event: &Event, hook: u32) -> Result<(), TransitionError> {
        let run = self.run_id;
        if !self.is_terminal() {
            return Err(TransitionError::HookBeforeEnd {
                run,
                event: event.name(),
                state: self.status,
            });
        }
        if hook >= MAX_HOOKS {
            return Err(TransitionError::HookOutOfRange {
                run,
                event: event.name(),
                hook,
            });
        }
        Ok(())
    }

    /// `SteerRequested`: well formed; a new id; each target a step of the run that has yet to
    /// end (in a paused run, one that did not complete: its resume runs it); fewer than
    /// [`MAX_PENDING_STEERS`] requests waiting and [`MAX_STEERS_PER_RUN`] in all.
    #[allow(clippy::too_many_arguments)]
    fn steer_requested(
        &mut self,
        id: &str,
        steps: &[u32],
        mode: SteerMode,
        message: &str,
        source: &str,
        seq: u64,
        at_ms: UnixMs,
    ) -> Result<(), TransitionError> {
        let run = self.run_id;
        if let Some(flaw) = steer_request_flaw(id, steps, message) {
            return Err(TransitionError::InvalidSteer {
                run,
                id: id.to_string(),
                flaw,
            });
        }
        let is_paused = self.status == RunStatus::Paused;
        for &step in steps {
            let index = step as usize;
            let Some(state) = self.steps.get(index) else {
                return Err(TransitionError::NoSuchStep {
                    run,
                    event: "SteerRequested",
                    step,
                    count: self.steps.len(),
                });
            };
            let is_open = if is_paused {
                state.status != StepStatus::Complete
            } else {
                !state.status.is_done()
            };
            if !is_open {
                return Err(TransitionError::SteerToEndedStep {
                    run,
                    id: id.to_string(),
                    step,
                    status: state.status,
                });
            }
        }
        if self.steer(id).is_some() {
            return Err(TransitionError::SteerIdReused {
                run,
                id: id.to_string(),
            });
        }
        if self.queued_steers().count() >= MAX_PENDING_STEERS {
            return Err(TransitionError::SteerQueueFull { run });
        }
        if self.steers.len() >= MAX_STEERS_PER_RUN {
            return Err(TransitionError::TooManySteers { run });
        }
        self.steers.push(SteerInfo {
            id: id.to_string(),
            mode,
            source: source.to_string(),
            preview: steer_preview(message),
            requested_at_ms: at_ms,
            seq,
            targets: steps
                .iter()
                .map(|&step| SteerTarget {
                    step,
                    delivery: SteerDelivery::Queued,
                })
                .collect(),
        });
        Ok(())
    }

    /// `SteerDelivered(id, i)`: request `id` waits for step `i`, which is running.
    fn steer_delivered(
        &mut self,
        event: &Event,
        id: &str,
        step: u32,
        at_ms: UnixMs,
    ) -> Result<(), TransitionError> {
        let run = self.run_id;
        let index = self.step_index(event, step)?;
        let Some(position) = self.steers.iter().position(|steer| steer.id == id) else {
            return Err(TransitionError::NoSuchSteer {
                run,
                id: id.to_string(),
            });
        };
        let target = self.steers[position]
            .targets
            .iter()
            .position(|target| target.step == step && target.delivery == SteerDelivery::Queued)
            .ok_or_else(|| TransitionError::SteerNotQueued {
                run,
                id: id.to_string(),
                step,
            })?;
        self.require_running_step(event, step, index)?;
        self.steers[position].targets[target].delivery = SteerDelivery::Delivered { at_ms };
        Ok(())
    }

    fn step_index(&self, event: &Event, step: u32) -> Result<usize, TransitionError> {
        let index = step as usize;
        if index >= self.steps.len() {
            return Err(TransitionError::NoSuchStep {
                run: self.run_id,
                event: event.name(),
                step,
                count: self.steps.len(),
            });
        }
        Ok(index)
    }

    fn require_running_step(
        &self,
        event: &Event,
        step: u32,
        index: usize,
    ) -> Result<(), TransitionError> {
        let status = self.steps[index].status;
        if status != StepStatus::Running {
            return Err(TransitionError::StepNotRunning {
                run: self.run_id,
                event: event.name(),
                step,
                status,
            });
        }
        Ok(())
    }
}
