//! Tests of the reducer: one unit test per lifecycle rule (docs/design.md, "Rules") and per
//! [`TransitionError`] variant, then a property test folding arbitrary event sequences.

use std::sync::Arc;

use proptest::prelude::*;

use super::*;
use crate::event::{
    Event, ExternalJobStatus, FORMAT_VERSION, JobState, MAX_PENDING_STEERS,
    MAX_STEER_MESSAGE_BYTES, MAX_STEERS_PER_RUN, MAX_TEXT_BYTES, Mode, Record, StepAction,
    StepOutcome, StepSpec, WriterId,
};
use crate::testkit::{
    self as kit, echo_step as shell, farm_step as external, job_updated, make_step as command,
};

const RUN: RunId = RunId::from_bytes([7; 16]);
const OTHER_RUN: RunId = RunId::from_bytes([8; 16]);
const CREATED_AT_MS: UnixMs = 1_700_000_000_000;

// Builders: each test reads as the story of one run.

/// The time of the record at `seq`: one second per record after creation.
fn time_of(seq: u64) -> UnixMs {
    CREATED_AT_MS + seq * 1000
}

/// A record of the test run, written at [`time_of`] its seq.
fn record(seq: u64, event: Event) -> Record {
    Record {
        format_version: FORMAT_VERSION,
        run_id: RUN,
        seq,
        time_ms: time_of(seq),
        writer: WriterId(1),
        writer_seq: seq,
        event,
    }
}

fn spec(mode: Mode, concurrency: u32, steps: Vec<StepSpec>) -> RunSpec {
    RunSpec {
        name: Some("story".to_string()),
        concurrency,
        ..kit::spec(mode, steps)
    }
}

fn single_spec(step: StepSpec) -> RunSpec {
    spec(Mode::Single, 1, vec![step])
}

/// A chain of command steps named `step-0`, `step-1`, ...
fn chain_spec(step_count: usize) -> RunSpec {
    let steps = (0..step_count)
        .map(|index| command(&format!("step-{index}")))
        .collect();
    spec(Mode::Chain, 1, steps)
}

/// Parallel command steps named `step-0`, `step-1`, ...
fn parallel_spec(concurrency: u32, step_count: usize) -> RunSpec {
    let steps = (0..step_count)
        .map(|index| command(&format!("step-{index}")))
        .collect();
    spec(Mode::Parallel, concurrency, steps)
}

fn created(spec: RunSpec) -> Event {
    let hosts = kit::hosts(Some("session"), Some("owner"), Some("tool-call"));
    kit::created(spec, CREATED_AT_MS, hosts)
}

fn runner_identity() -> ProcessIdentity {
    kit::identity(4242)
}

fn runner_started(instance_id: &str) -> Event {
    kit::runner_started(runner_identity(), instance_id)
}

fn step_running(step: u32) -> Event {
    kit::step_running(step, Some(kit::identity(5000 + step)))
}

fn step_finished(step: u32, end: StepEnd) -> Event {
    match end {
        StepEnd::Complete => kit::step_complete(step),
        StepEnd::Failed => {
            let error = format!("step {step} exited 1");
            kit::step_finished(step, end, Some(1), Some(&error))
        }
        StepEnd::Stopped => kit::step_finished(step, end, None, Some("stopped")),
        StepEnd::Skipped => kit::step_finished(step, end, None, None),
    }
}

fn job(state: JobState, progress: Option<f64>, message: Option<&str>) -> ExternalJobStatus {
    ExternalJobStatus {
        message: message.map(str::to_string),
        url: Some("https://farm.example/job-1".to_string()),
        ..kit::job(state, "job-1", progress)
    }
}

fn control(action: ControlAction) -> Event {
    kit::control(action, "user", "asked to")
}

fn terminal(state: TerminalState, error: Option<&str>) -> Event {
    let exit_code = if state == TerminalState::Complete {
        0
    } else {
        1
    };
    kit::terminal(state, exit_code, &format!("run {}", state.as_str()), error)
}

fn process_terminal(instance_id: &str, proof: Proof) -> Event {
    kit::process_terminal(instance_id, Some(0), proof, Observer::RunnerParent)
}

fn joined(queue: &str) -> Event {
    Event::QueueJoined {
        queue: queue.to_string(),
        idle_timeout_ms: None,
        heartbeat_ms: Some(60_000),
    }
}

fn admitted() -> Event {
    Event::QueueAdmitted {
        by: "reconciler".to_string(),
    }
}

fn delayed(due_at_ms: UnixMs) -> Event {
    Event::StartDelayed {
        due_at_ms,
        idle_timeout_ms: Some(30_000),
        heartbeat_ms: None,
    }
}

fn delay_ended() -> Event {
    Event::DelayEnded {
        by: "timer".to_string(),
    }
}

fn dismissed() -> Event {
    Event::Dismissed { at_ms: 42 }
}

fn hook_attempted(hook: u32, attempt: u32) -> Event {
    Event::HookAttempted {
        hook,
        attempt,
        claimant: runner_identity(),
        by: "runner".to_string(),
        lease_ms: 60_000,
    }
}

fn hook_ended(
    hook: u32,
    attempt: u32,
    outcome: crate::event::HookOutcome,
    retry_at_ms: Option<UnixMs>,
) -> Event {
    Event::HookEnded {
        hook,
        attempt,
        outcome,
        retry_at_ms,
    }
}

fn hook_failed() -> crate::event::HookOutcome {
    crate::event::HookOutcome::Failed {
        exit: crate::event::ProcessExit {
            code: Some(1),
            signal: None,
        },
    }
}

/// A run that ended before a runner took it: its hooks may be attempted.
fn ended() -> Story {
    Story::new(chain_spec(1)).then(terminal(TerminalState::Failed, Some("gave up")))
}

// Hooks: attempted only once the run has ended, one attempt at a time, numbered in turn; never
// again once delivered or given up; a retry only after a failure that was not the last.

#[test]
fn a_hook_is_attempted_only_once_the_run_has_ended() {
    let error = Story::running(chain_spec(1)).rejects(hook_attempted(0, 1));
    assert!(
        matches!(error, TransitionError::HookBeforeEnd { .. }),
        "{error}"
    );
    let story = ended().then(hook_attempted(0, 1));
    let hook = story.state.hook(0).expect("attempted");
    assert_eq!(hook.attempts, 1);
    assert!(hook.claim.is_some());
}

#[test]
fn hook_attempts_come_one_at_a_time_in_turn() {
    let error = ended().rejects(hook_attempted(0, 2));
    assert!(
        matches!(
            error,
            TransitionError::HookAttemptNotNext { expected: 1, .. }
        ),
        "{error}"
    );
    let claimed = ended().then(hook_attempted(0, 1));
    let error = claimed.rejects(hook_attempted(0, 2));
    assert!(
        matches!(error, TransitionError::HookAttemptOpen { attempt: 1, .. }),
        "{error}"
    );
    let error = claimed.rejects(hook_ended(0, 2, hook_failed(), None));
    assert!(
        matches!(error, TransitionError::HookNotClaimed { attempt: 2, .. }),
        "{error}"
    );
    let retried = claimed
        .then(hook_ended(0, 1, hook_failed(), Some(5)))
        .then(hook_attempted(0, 2));
    assert_eq!(retried.state.hook(0).map(|hook| hook.attempts), Some(2));
    let error = ended().rejects(hook_attempted(crate::event::MAX_HOOKS, 1));
    assert!(
        matches!(error, TransitionError::HookOutOfRange { .. }),
        "{error}"
    );
}

#[test]
fn a_delivered_hook_is_never_attempted_again() {
    let delivered = ended().then(hook_attempted(0, 1)).then(hook_ended(
        0,
        1,
        crate::event::HookOutcome::Delivered,
        None,
    ));
    assert!(delivered.state.hook(0).is_some_and(HookState::is_delivered));
    let error = delivered.rejects(hook_attempted(0, 2));
    assert!(
        matches!(
            error,
            TransitionError::HookSettled {
                how: "delivered",
                ..
            }
        ),
        "{error}"
    );
    let error = ended().then(hook_attempted(0, 1)).rejects(hook_ended(
        0,
        1,
        crate::event::HookOutcome::Delivered,
        Some(5),
    ));
    assert!(
        matches!(error, TransitionError::HookRetryNotAllowed { .. }),
        "{error}"
    );
}

#[test]
fn a_hook_is_given_up_after_its_last_attempt() {
    let mut story = ended();
    for attempt in 1..crate::event::MAX_HOOK_ATTEMPTS {
        story = story.then(hook_attempted(0, attempt)).then(hook_ended(
            0,
            attempt,
            hook_failed(),
            Some(5),
        ));
    }
    let last = crate::event::MAX_HOOK_ATTEMPTS;
    let story = story.then(hook_attempted(0, last));
    let error = story.rejects(hook_ended(0, last, hook_failed(), Some(5)));
    assert!(
        matches!(error, TransitionError::HookRetryNotAllowed { .. }),
        "{error}"
    );
    let given_up = story.then(hook_ended(
        0,
        last,
        crate::event::HookOutcome::TimedOut,
        None,
    ));
    assert!(given_up.state.hook(0).is_some_and(HookState::is_given_up));
    let error = given_up.rejects(hook_attempted(0, last + 1));
    assert!(
        matches!(
            error,
            TransitionError::HookSettled {
                how: "given up",
                ..
            }
        ),
        "{error}"
    );
}

/// A run under construction: every `then` must be accepted, at the next seq.
#[derive(Debug, Clone)]
struct Story {
    state: RunState,
}

impl Story {
    /// `RunCreated` at seq 1.
    fn new(spec: RunSpec) -> Story {
        let state = apply(None, &record(1, created(spec))).expect("a valid spec creates the run");
        Story { state }
    }

    /// Created, then `RunnerStarted` by instance `i1`.
    fn running(spec: RunSpec) -> Story {
        Story::new(spec).then(runner_started("i1"))
    }

    fn then(mut self, event: Event) -> Story {
        let record = self.next(event);
        if let Err(error) = self.state.apply_mut(&record) {
            panic!(
                "{} at seq {} was refused: {error}",
                record.event.name(),
                record.seq
            );
        }
        self
    }

    /// The record of `event` at the next seq.
    fn next(&self, event: Event) -> Record {
        record(self.state.head_seq + 1, event)
    }

    /// Applies `event` at the next seq, expecting a refusal; checks that `apply_mut` left the
    /// state exactly as it was and that `apply` refuses it the same way.
    fn rejects(&self, event: Event) -> TransitionError {
        self.rejects_record(&self.next(event))
    }

    fn rejects_record(&self, record: &Record) -> TransitionError {
        let mut after = self.state.clone();
        let error = after
            .apply_mut(record)
            .expect_err("the record breaks a lifecycle rule");
        assert_eq!(
            after,
            self.state,
            "a refused {} changed the state",
            record.event.name()
        );
        // Compared through Debug: a NaN progress in the error is never equal to itself.
        let by_value = apply(Some(&self.state), record).expect_err("apply refuses it too");
        assert_eq!(format!("{by_value:?}"), format!("{error:?}"));
        error
    }

    fn step(&self, index: usize) -> &StepState {
        &self.state.steps[index]
    }

    fn step_statuses(&self) -> Vec<StepStatus> {
        self.state.steps.iter().map(|step| step.status).collect()
    }
}

/// The error's message names the test run and every fragment (a step, an event, a state).
fn assert_message_names(error: &TransitionError, fragments: &[&str]) {
    let message = error.to_string();
    assert!(
        message.contains(&RUN.to_string()),
        "{message:?} does not name run {RUN}"
    );
    for fragment in fragments {
        assert!(
            message.contains(fragment),
            "{message:?} does not name {fragment:?}"
        );
    }
}

// RunCreated: exactly the first record.

#[test]
fn run_created_at_seq_1_starts_a_queued_run() {
    let story = Story::new(chain_spec(3));
    let state = &story.state;
    assert_eq!(state.run_id, RUN);
    assert_eq!(state.status, RunStatus::Queued);
    assert_eq!(state.head_seq, 1);
    assert_eq!(state.updated_at_ms, time_of(1));
    assert_eq!(state.created_at_ms, CREATED_AT_MS);
    assert_eq!(state.session_id.as_deref(), Some("session"));
    assert_eq!(state.completion_owner_id.as_deref(), Some("owner"));
    assert_eq!(state.tool_call_id.as_deref(), Some("tool-call"));
    assert_eq!(story.step_statuses(), vec![StepStatus::Pending; 3]);
    assert!(state.runner.is_none() && state.terminal.is_none());
    assert!(!state.is_terminal() && !state.is_stale() && !state.is_closed());
}

#[test]
fn a_record_before_run_created_is_refused() {
    let error = apply(None, &record(1, runner_started("i1"))).unwrap_err();
    assert!(matches!(
        error,
        TransitionError::NotCreated {
            run: RUN,
            event: "RunnerStarted"
        }
    ));
    assert_message_names(&error, &["RunnerStarted"]);

    let records = [record(1, dismissed()), record(2, created(chain_spec(1)))];
    assert!(matches!(
        replay(&records),
        Err(TransitionError::NotCreated {
            run: RUN,
            event: "Dismissed"
        })
    ));
}

#[test]
fn a_second_run_created_is_refused() {
    let story = Story::running(chain_spec(2));
    let error = story.rejects(created(chain_spec(2)));
    assert!(matches!(
        error,
        TransitionError::AlreadyCreated { run: RUN }
    ));
    assert_message_names(&error, &[]);
}

#[test]
fn run_created_at_a_seq_other_than_1_is_refused() {
    let error = apply(None, &record(2, created(chain_spec(1)))).unwrap_err();
    assert!(matches!(
        error,
        TransitionError::CreatedNotFirst { run: RUN, found: 2 }
    ));
    assert_message_names(&error, &["seq 1", "not 2"]);
}

#[test]
fn run_created_with_an_invalid_spec_is_refused() {
    let zero_concurrency = apply(None, &record(1, created(parallel_spec(0, 2)))).unwrap_err();
    assert!(matches!(
        zero_concurrency,
        TransitionError::InvalidSpec {
            run: RUN,
            source: SpecError::ZeroConcurrency
        }
    ));
    assert_message_names(&zero_concurrency, &["concurrency"]);

    let two_step_single = spec(Mode::Single, 1, vec![command("a"), command("b")]);
    assert!(matches!(
        apply(None, &record(1, created(two_step_single))),
        Err(TransitionError::InvalidSpec {
            run: RUN,
            source: SpecError::SingleNeedsOneStep { count: 2 }
        })
    ));

    assert!(matches!(
        apply(None, &record(1, created(spec(Mode::Chain, 1, Vec::new())))),
        Err(TransitionError::InvalidSpec {
            run: RUN,
            source: SpecError::NoSteps
        })
    ));
}

#[test]
fn an_over_long_text_is_refused_at_creation_and_later() {
    let too_long = "x".repeat(MAX_TEXT_BYTES + 1);
    let mut event = created(chain_spec(1));
    if let Event::RunCreated { session_id, .. } = &mut event {
        *session_id = Some(too_long.clone());
    }
    let error = apply(None, &record(1, event)).unwrap_err();
    assert!(matches!(
        error,
        TransitionError::TextTooLong {
            run: RUN,
            source: TextTooLong {
                event: "RunCreated",
                field: "session_id",
                bytes,
                ..
            },
        } if bytes == MAX_TEXT_BYTES + 1
    ));
    assert_message_names(&error, &["RunCreated.session_id"]);

    let story = Story::running(chain_spec(1));
    let error = story.rejects(Event::Terminal {
        state: TerminalState::Failed,
        error: None,
        summary: too_long,
        exit_code: 1,
        repaired_by: None,
    });
    assert!(matches!(
        error,
        TransitionError::TextTooLong {
            run: RUN,
            source: TextTooLong {
                event: "Terminal",
                field: "summary",
                bytes,
                ..
            },
        } if bytes == MAX_TEXT_BYTES + 1
    ));
}

// The envelope: the right run, the next seq.

#[test]
fn a_record_that_does_not_follow_the_head_is_refused() {
    let story = Story::running(chain_spec(2));
    assert_eq!(story.state.head_seq, 2);

    let skipped_ahead = story.rejects_record(&record(4, step_running(0)));
    assert!(matches!(
        skipped_ahead,
        TransitionError::SequenceGap {
            run: RUN,
            head: 2,
            found: 4
        }
    ));
    assert_message_names(&skipped_ahead, &["seq 4", "head 2"]);

    let applied_again = story.rejects_record(&record(2, runner_started("i1")));
    assert!(matches!(
        applied_again,
        TransitionError::SequenceGap {
            run: RUN,
            head: 2,
            found: 2
        }
    ));
}

#[test]
fn a_record_of_another_run_is_refused() {
    let story = Story::new(chain_spec(2));
    let mut stranger = story.next(runner_started("i1"));
    stranger.run_id = OTHER_RUN;
    let error = story.rejects_record(&stranger);
    assert!(matches!(
        error,
        TransitionError::WrongRun {
            run: RUN,
            found: OTHER_RUN
        }
    ));
    assert_message_names(&error, &[&OTHER_RUN.to_string()]);
}

// RunnerStarted: from queued, once.

#[test]
fn a_run_in_a_queue_waits_until_admitted_then_holds_a_slot_until_its_end() {
    let waiting = Story::new(chain_spec(1)).then(joined("q"));
    assert!(waiting.state.is_waiting_for_slot());
    assert!(!waiting.state.holds_slot());
    assert_eq!(
        waiting.state.startable_at_ms(),
        None,
        "not startable until admitted"
    );
    assert!(matches!(
        waiting.rejects(runner_started("i1")),
        TransitionError::RunnerBeforeAdmission { .. }
    ));
    let admitted = waiting.then(admitted());
    assert!(!admitted.state.is_waiting_for_slot());
    assert!(admitted.state.holds_slot());
    assert_eq!(admitted.state.startable_at_ms(), Some(time_of(3)));
    let running = admitted.then(runner_started("i1"));
    assert_eq!(running.state.status, RunStatus::Running);
    assert!(running.state.holds_slot());
    let ended = running.then(terminal(TerminalState::Failed, Some("x")));
    assert!(!ended.state.holds_slot(), "a Terminal frees the slot");
    assert!(!ended.state.is_waiting_for_slot());
}

#[test]
fn a_waiting_run_that_ends_never_held_a_slot() {
    let stopped = Story::new(chain_spec(1))
        .then(joined("q"))
        .then(control(ControlAction::Stop))
        .then(terminal(TerminalState::Stopped, None));
    assert!(!stopped.state.is_waiting_for_slot());
    assert!(!stopped.state.holds_slot());
    assert_eq!(stopped.state.status, RunStatus::Stopped);
}

#[test]
fn a_run_joins_a_queue_only_right_after_its_creation() {
    let late = Story::new(chain_spec(1))
        .then(control(ControlAction::Stop))
        .rejects(joined("q"));
    assert!(matches!(
        late,
        TransitionError::QueueJoinedLate { found: 3, .. }
    ));
    assert!(matches!(
        Story::new(chain_spec(1)).rejects(joined("")),
        TransitionError::InvalidQueueName { .. }
    ));
}

#[test]
fn runner_started_makes_a_queued_run_running() {
    let story = Story::running(chain_spec(2));
    assert_eq!(story.state.status, RunStatus::Running);
    assert_eq!(
        story.state.runner,
        Some(RunnerInfo {
            identity: runner_identity(),
            instance_id: "i1".to_string(),
            started_at_ms: time_of(2),
        })
    );
}

#[test]
fn a_second_runner_started_is_refused() {
    let story = Story::running(chain_spec(2));
    let error = story.rejects(runner_started("i2"));
    assert!(matches!(
        error,
        TransitionError::RunnerNotQueued {
            run: RUN,
            state: RunStatus::Running
        }
    ));
    assert_message_names(&error, &["running"]);
}

#[test]
fn runner_started_after_the_launcher_gave_up_is_refused() {
    let story = Story::new(chain_spec(2)).then(process_terminal("i1", Proof::NotStarted));
    assert!(story.state.is_stale());
    let error = story.rejects(runner_started("i1"));
    assert!(matches!(
        error,
        TransitionError::RunnerAfterProcessTerminal {
            run: RUN,
            proof: "not-started"
        }
    ));
    assert_message_names(&error, &["not-started"]);
}

// StepRunning: run running, step exists and pending, chain order, parallel concurrency.

#[test]
fn an_event_naming_a_step_out_of_range_is_refused() {
    let story = Story::running(chain_spec(3));
    let error = story.rejects(step_running(3));
    assert!(matches!(
        error,
        TransitionError::NoSuchStep {
            run: RUN,
            event: "StepRunning",
            step: 3,
            count: 3
        }
    ));
    assert_message_names(&error, &["StepRunning", "step 3", "3 steps"]);

    assert!(matches!(
        story.rejects(step_finished(7, StepEnd::Complete)),
        TransitionError::NoSuchStep {
            event: "StepFinished",
            step: 7,
            count: 3,
            ..
        }
    ));
    assert!(matches!(
        story.rejects(job_updated(u32::MAX, job(JobState::Running, None, None))),
        TransitionError::NoSuchStep {
            event: "ExternalJobUpdated",
            step: u32::MAX,
            count: 3,
            ..
        }
    ));
}

#[test]
fn step_running_before_the_runner_started_is_refused() {
    let story = Story::new(chain_spec(3));
    let error = story.rejects(step_running(0));
    assert!(matches!(
        error,
        TransitionError::StepStartWhileNotRunning {
            run: RUN,
            step: 0,
            state: RunStatus::Queued
        }
    ));
    assert_message_names(&error, &["StepRunning(0)", "queued"]);
}

#[test]
fn step_running_on_a_step_that_is_not_pending_is_refused() {
    let story = Story::running(parallel_spec(3, 3)).then(step_running(2));
    let error = story.rejects(step_running(2));
    assert!(matches!(
        error,
        TransitionError::StepNotPending {
            run: RUN,
            step: 2,
            status: StepStatus::Running
        }
    ));
    assert_message_names(&error, &["StepRunning(2)", "step 2 pending", "running"]);

    let finished = story.then(step_finished(2, StepEnd::Complete));
    assert!(matches!(
        finished.rejects(step_running(2)),
        TransitionError::StepNotPending {
            step: 2,
            status: StepStatus::Complete,
            ..
        }
    ));
}

#[test]
fn chain_steps_run_in_order_to_a_complete_run() {
    let mut story = Story::running(chain_spec(3));
    for step in 0..3 {
        story = story
            .then(step_running(step))
            .then(step_finished(step, StepEnd::Complete));
    }
    let story = story.then(terminal(TerminalState::Complete, None));
    assert_eq!(story.state.status, RunStatus::Complete);
    assert_eq!(story.step_statuses(), vec![StepStatus::Complete; 3]);
    assert_eq!(story.step(1).started_at_ms, Some(time_of(5)));
    assert_eq!(story.step(1).ended_at_ms, Some(time_of(6)));
    assert_eq!(story.step(1).exit_code, Some(0));
    assert_eq!(story.state.steps_done(), 3);
}

#[test]
fn a_chain_step_waits_for_every_earlier_step_to_complete() {
    let story = Story::running(chain_spec(3));
    let error = story.rejects(step_running(2));
    assert!(matches!(
        error,
        TransitionError::ChainOrder {
            run: RUN,
            step: 2,
            earlier: 0,
            status: StepStatus::Pending
        }
    ));
    assert_message_names(&error, &["chain step 2", "step 0", "pending"]);

    let first_running = story.then(step_running(0));
    assert!(matches!(
        first_running.rejects(step_running(1)),
        TransitionError::ChainOrder {
            step: 1,
            earlier: 0,
            status: StepStatus::Running,
            ..
        }
    ));

    let first_failed = first_running
        .clone()
        .then(step_finished(0, StepEnd::Failed));
    assert!(matches!(
        first_failed.rejects(step_running(1)),
        TransitionError::ChainOrder {
            step: 1,
            earlier: 0,
            status: StepStatus::Failed,
            ..
        }
    ));

    let middle_skipped = first_running
        .then(step_finished(1, StepEnd::Skipped))
        .then(step_finished(0, StepEnd::Complete));
    assert!(matches!(
        middle_skipped.rejects(step_running(2)),
        TransitionError::ChainOrder {
            step: 2,
            earlier: 1,
            status: StepStatus::Skipped,
            ..
        }
    ));
}

#[test]
fn parallel_steps_run_up_to_the_concurrency() {
    let story = Story::running(parallel_spec(2, 3))
        .then(step_running(0))
        .then(step_running(2));
    let error = story.rejects(step_running(1));
    assert!(matches!(
        error,
        TransitionError::ConcurrencyExceeded {
            run: RUN,
            step: 1,
            running: 2,
            concurrency: 2
        }
    ));
    assert_message_names(&error, &["parallel step 1", "concurrency is 2"]);

    let slot_freed = story
        .then(step_finished(2, StepEnd::Failed))
        .then(step_running(1));
    assert_eq!(
        slot_freed.step_statuses(),
        vec![StepStatus::Running, StepStatus::Running, StepStatus::Failed]
    );
}

#[test]
fn a_single_run_runs_its_one_step() {
    let story = Story::running(single_spec(shell("only")))
        .then(step_running(0))
        .then(step_finished(0, StepEnd::Complete))
        .then(terminal(TerminalState::Complete, None));
    assert_eq!(story.state.status, RunStatus::Complete);
    assert_eq!(story.step_statuses(), vec![StepStatus::Complete]);
}

// StepFinished: from running; skipped only from pending.

#[test]
fn step_finished_records_the_outcome() {
    let story = Story::running(chain_spec(2))
        .then(step_running(0))
        .then(step_finished(0, StepEnd::Failed));
    let step = story.step(0);
    assert_eq!(step.status, StepStatus::Failed);
    assert_eq!(step.exit_code, Some(1));
    assert_eq!(step.error.as_deref(), Some("step 0 exited 1"));
    assert_eq!(step.ended_at_ms, Some(time_of(4)));
}

#[test]
fn step_finished_needs_the_step_running() {
    let story = Story::running(chain_spec(2));
    let error = story.rejects(step_finished(1, StepEnd::Complete));
    assert!(matches!(
        error,
        TransitionError::StepNotRunning {
            run: RUN,
            event: "StepFinished",
            step: 1,
            status: StepStatus::Pending
        }
    ));
    assert_message_names(&error, &["StepFinished(1)", "step 1 running", "pending"]);

    let finished = story
        .then(step_running(0))
        .then(step_finished(0, StepEnd::Complete));
    assert!(matches!(
        finished.rejects(step_finished(0, StepEnd::Stopped)),
        TransitionError::StepNotRunning {
            event: "StepFinished",
            step: 0,
            status: StepStatus::Complete,
            ..
        }
    ));
}

#[test]
fn a_step_is_skipped_only_while_pending() {
    let story = Story::running(parallel_spec(2, 3)).then(step_finished(1, StepEnd::Skipped));
    assert_eq!(story.step(1).status, StepStatus::Skipped);
    assert_eq!(story.step(1).ended_at_ms, Some(time_of(3)));

    let running = story.then(step_running(0));
    let error = running.rejects(step_finished(0, StepEnd::Skipped));
    assert!(matches!(
        error,
        TransitionError::SkipNotPending {
            run: RUN,
            step: 0,
            status: StepStatus::Running
        }
    ));
    assert_message_names(&error, &["StepFinished(0, skipped)", "running"]);

    let complete = running.then(step_finished(0, StepEnd::Complete));
    assert!(matches!(
        complete.rejects(step_finished(0, StepEnd::Skipped)),
        TransitionError::SkipNotPending {
            step: 0,
            status: StepStatus::Complete,
            ..
        }
    ));
    assert!(matches!(
        complete.rejects(step_finished(1, StepEnd::Skipped)),
        TransitionError::SkipNotPending {
            step: 1,
            status: StepStatus::Skipped,
            ..
        }
    ));
}

// ExternalJobUpdated: an external-job step, running; the status replaced whole.

/// A chain: a command step, then an external-job step.
fn build_then_render() -> RunSpec {
    spec(Mode::Chain, 1, vec![command("build"), external("render")])
}

#[test]
fn a_job_update_on_a_step_that_is_not_an_external_job_is_refused() {
    let story = Story::running(build_then_render()).then(step_running(0));
    let error = story.rejects(job_updated(0, job(JobState::Running, None, None)));
    assert!(matches!(
        error,
        TransitionError::NotExternalJob {
            run: RUN,
            step: 0,
            ref name
        } if name == "build"
    ));
    assert_message_names(&error, &["step 0", "build"]);
}

#[test]
fn a_job_update_needs_the_step_running() {
    let story = Story::running(build_then_render());
    let error = story.rejects(job_updated(1, job(JobState::Queued, None, None)));
    assert!(matches!(
        error,
        TransitionError::StepNotRunning {
            run: RUN,
            event: "ExternalJobUpdated",
            step: 1,
            status: StepStatus::Pending
        }
    ));
    assert_message_names(&error, &["ExternalJobUpdated(1)", "pending"]);

    let finished = story
        .then(step_running(0))
        .then(step_finished(0, StepEnd::Complete))
        .then(step_running(1))
        .then(step_finished(1, StepEnd::Complete));
    assert!(matches!(
        finished.rejects(job_updated(1, job(JobState::Succeeded, None, None))),
        TransitionError::StepNotRunning {
            step: 1,
            status: StepStatus::Complete,
            ..
        }
    ));
}

#[test]
fn a_job_update_replaces_the_status_whole() {
    let story = Story::running(build_then_render())
        .then(step_running(0))
        .then(step_finished(0, StepEnd::Complete))
        .then(step_running(1))
        .then(job_updated(
            1,
            job(JobState::Running, Some(0.25), Some("rendering frames")),
        ));
    assert_eq!(
        story.step(1).job,
        Some(job(JobState::Running, Some(0.25), Some("rendering frames")))
    );
    assert_eq!(story.step(1).job_updated_at_ms, Some(time_of(6)));

    let second = ExternalJobStatus {
        state: JobState::Running,
        id: None,
        progress: None,
        message: None,
        url: None,
    };
    let story = story.then(job_updated(1, second.clone()));
    let status = story.step(1).job.as_ref().expect("the job has a status");
    assert_eq!(status, &second);
    assert_eq!(status.message, None, "the old message is not kept");
    assert_eq!(status.progress, None, "the old progress is not kept");
    assert_eq!(story.step(1).job_updated_at_ms, Some(time_of(7)));
    assert_eq!(story.step(1).status, StepStatus::Running);
}

#[test]
fn a_job_update_with_non_finite_progress_is_refused() {
    let story = Story::running(build_then_render())
        .then(step_running(0))
        .then(step_finished(0, StepEnd::Complete))
        .then(step_running(1));
    let error = story.rejects(job_updated(1, job(JobState::Running, Some(f64::NAN), None)));
    assert!(matches!(
        error,
        TransitionError::NonFiniteProgress {
            run: RUN,
            step: 1,
            progress
        } if progress.is_nan()
    ));
    assert_message_names(&error, &["ExternalJobUpdated(1)", "NaN"]);

    for infinite in [f64::INFINITY, f64::NEG_INFINITY] {
        assert!(matches!(
            story.rejects(job_updated(1, job(JobState::Running, Some(infinite), None))),
            TransitionError::NonFiniteProgress { step: 1, progress, .. } if progress == infinite
        ));
    }
}

// ControlRequested: run not terminal, once per action.

#[test]
fn control_requests_are_recorded_once_per_action() {
    let story = Story::new(chain_spec(1))
        .then(control(ControlAction::Timeout))
        .then(runner_started("i1"))
        .then(control(ControlAction::Stop));
    assert!(story.state.has_control(ControlAction::Timeout));
    assert!(story.state.has_control(ControlAction::Stop));
    assert!(!story.state.has_control(ControlAction::Interrupt));
    let actions: Vec<ControlAction> = story
        .state
        .controls
        .iter()
        .map(|control| control.action)
        .collect();
    assert_eq!(actions, [ControlAction::Timeout, ControlAction::Stop]);
    assert_eq!(story.state.controls[1].at_ms, time_of(4));
    assert_eq!(
        story.state.status,
        RunStatus::Running,
        "a request stops nothing"
    );

    let error = story.rejects(control(ControlAction::Stop));
    assert!(matches!(
        error,
        TransitionError::ControlAlreadyRequested {
            run: RUN,
            action: ControlAction::Stop
        }
    ));
    assert_message_names(&error, &["a stop was already requested"]);
}

// Terminal: from queued or running; running steps fail (or stop), pending steps are skipped.

#[test]
fn terminal_failed_fails_running_steps_with_the_run_error_and_skips_pending_ones() {
    let story = Story::running(parallel_spec(2, 4))
        .then(step_running(0))
        .then(step_finished(0, StepEnd::Complete))
        .then(step_running(1))
        .then(step_running(2))
        .then(step_finished(2, StepEnd::Failed))
        .then(terminal(
            TerminalState::Failed,
            Some("runner 4242 was killed"),
        ));
    assert_eq!(story.state.status, RunStatus::Failed);
    assert_eq!(
        story.step_statuses(),
        vec![
            StepStatus::Complete,
            StepStatus::Failed,
            StepStatus::Failed,
            StepStatus::Skipped
        ]
    );
    let terminal_at_ms = time_of(8);
    assert_eq!(
        story.step(1).error.as_deref(),
        Some("runner 4242 was killed")
    );
    assert_eq!(story.step(1).ended_at_ms, Some(terminal_at_ms));
    assert_eq!(
        story.step(2).error.as_deref(),
        Some("step 2 exited 1"),
        "a step that already ended keeps its own error"
    );
    assert_eq!(story.step(0).error, None);
    assert_eq!(
        story.state.terminal,
        Some(TerminalInfo {
            state: TerminalState::Failed,
            error: Some("runner 4242 was killed".to_string()),
            summary: "run failed".to_string(),
            exit_code: 1,
            repaired_by: None,
            at_ms: terminal_at_ms,
        })
    );
    assert_eq!(story.state.ended_at_ms(), Some(terminal_at_ms));
}

#[test]
fn terminal_stopped_stops_running_steps() {
    let story = Story::running(parallel_spec(2, 3))
        .then(step_running(0))
        .then(step_running(1))
        .then(terminal(TerminalState::Stopped, Some("stopped by user")));
    assert_eq!(story.state.status, RunStatus::Stopped);
    assert_eq!(
        story.step_statuses(),
        vec![
            StepStatus::Stopped,
            StepStatus::Stopped,
            StepStatus::Skipped
        ]
    );
    assert_eq!(story.step(0).error.as_deref(), Some("stopped by user"));
}

#[test]
fn terminal_paused_fails_running_steps_and_is_terminal() {
    let story = Story::running(chain_spec(2))
        .then(step_running(0))
        .then(terminal(TerminalState::Paused, None));
    assert_eq!(story.state.status, RunStatus::Paused);
    assert!(story.state.is_terminal());
    assert_eq!(
        story.step_statuses(),
        vec![StepStatus::Failed, StepStatus::Skipped]
    );
    assert_eq!(story.step(0).error, None, "the run had no error to give");
}

#[test]
fn terminal_of_a_queued_run_is_accepted() {
    let story = Story::new(chain_spec(2)).then(terminal(
        TerminalState::Failed,
        Some("runner never started"),
    ));
    assert_eq!(story.state.status, RunStatus::Failed);
    assert_eq!(story.step_statuses(), vec![StepStatus::Skipped; 2]);
    assert!(story.state.runner.is_none());
}

#[test]
fn terminal_complete_needs_every_step_complete() {
    let story = Story::running(chain_spec(3))
        .then(step_running(0))
        .then(step_finished(0, StepEnd::Complete))
        .then(step_running(1));
    let error = story.rejects(terminal(TerminalState::Complete, None));
    assert!(matches!(
        error,
        TransitionError::CompleteWithUnfinishedStep {
            run: RUN,
            step: 1,
            status: StepStatus::Running
        }
    ));
    assert_message_names(&error, &["step 1", "running"]);

    let parallel_skip = Story::running(parallel_spec(1, 2))
        .then(step_finished(0, StepEnd::Skipped))
        .then(step_running(1))
        .then(step_finished(1, StepEnd::Complete));
    assert!(matches!(
        parallel_skip.rejects(terminal(TerminalState::Complete, None)),
        TransitionError::CompleteWithUnfinishedStep {
            step: 0,
            status: StepStatus::Skipped,
            ..
        }
    ));
}

// After Terminal: only ProcessTerminalObserved and Dismissed.

#[test]
fn after_terminal_only_process_terminal_and_dismissed_are_accepted() {
    let story = Story::running(spec(
        Mode::Parallel,
        2,
        vec![command("build"), external("render")],
    ))
    .then(step_running(1))
    .then(terminal(TerminalState::Stopped, None));
    let refused = [
        runner_started("i2"),
        step_running(0),
        job_updated(1, job(JobState::Running, None, None)),
        step_finished(1, StepEnd::Complete),
        step_finished(0, StepEnd::Skipped),
        control(ControlAction::Stop),
        terminal(TerminalState::Failed, None),
    ];
    for event in refused {
        let name = event.name();
        let error = story.rejects(event);
        assert!(
            matches!(
                error,
                TransitionError::AfterTerminal {
                    run: RUN,
                    event,
                    state: RunStatus::Stopped
                } if event == name
            ),
            "{name}: {error:?}"
        );
        assert_message_names(&error, &[name, "stopped"]);
    }

    let closed = story
        .then(process_terminal("i1", Proof::Observed))
        .then(dismissed());
    assert!(closed.state.is_closed());
    assert_eq!(closed.state.dismissed_at_ms, Some(42));
}

#[test]
fn paused_counts_as_terminal() {
    let story = Story::running(chain_spec(1)).then(terminal(TerminalState::Paused, None));
    // `paused` is terminal and resuming is a new run, so a paused run cannot be ended again,
    // though an early statement of the design listed it among the states Terminal may leave.
    assert!(matches!(
        story.rejects(terminal(TerminalState::Failed, None)),
        TransitionError::AfterTerminal {
            event: "Terminal",
            state: RunStatus::Paused,
            ..
        }
    ));
    assert!(matches!(
        story.rejects(runner_started("i2")),
        TransitionError::AfterTerminal {
            event: "RunnerStarted",
            state: RunStatus::Paused,
            ..
        }
    ));
}

// ProcessTerminalObserved: once, naming the runner, with a proof that fits; closes the run.

#[test]
fn process_terminal_before_terminal_makes_the_run_stale_until_terminal() {
    let story = Story::running(chain_spec(2))
        .then(step_running(0))
        .then(process_terminal("i1", Proof::Unknown));
    assert!(story.state.is_stale());
    assert!(!story.state.is_terminal() && !story.state.is_closed());
    assert_eq!(story.state.status, RunStatus::Running);

    let repaired = story.then(Event::Terminal {
        state: TerminalState::Failed,
        error: Some("runner 4242 exited without recording an outcome".to_string()),
        summary: "runner lost".to_string(),
        exit_code: 1,
        repaired_by: Some(Repairer::Reconciler),
    });
    assert!(repaired.state.is_closed());
    assert!(!repaired.state.is_stale());
    assert_eq!(repaired.step(0).status, StepStatus::Failed);
}

#[test]
fn a_run_is_closed_only_once_terminal_and_process_terminal_are_both_in() {
    let running = Story::running(single_spec(command("only")));
    assert!(!running.state.is_closed());

    let terminal_only = running
        .clone()
        .then(terminal(TerminalState::Failed, Some("boom")));
    assert!(terminal_only.state.is_terminal());
    assert!(!terminal_only.state.is_closed() && !terminal_only.state.is_stale());
    let closed = terminal_only.then(process_terminal("i1", Proof::Observed));
    assert!(closed.state.is_closed());
    assert_eq!(
        closed.state.process_terminal,
        Some(ProcessTerminalInfo {
            instance_id: "i1".to_string(),
            exit: Some(ProcessExit {
                code: Some(0),
                signal: None
            }),
            proof: Proof::Observed,
            observer: Observer::RunnerParent,
            at_ms: time_of(4),
        })
    );

    let process_only = running.then(process_terminal("i1", Proof::Observed));
    assert!(!process_only.state.is_closed());
    let closed = process_only.then(terminal(TerminalState::Failed, Some("runner lost")));
    assert!(closed.state.is_closed());
}

#[test]
fn a_queued_run_whose_runner_never_started_closes() {
    let story = Story::new(chain_spec(1)).then(process_terminal("i1", Proof::NotStarted));
    assert!(story.state.is_stale());
    let story = story.then(terminal(
        TerminalState::Failed,
        Some("runner never started"),
    ));
    assert!(story.state.is_closed());
}

#[test]
fn process_terminal_is_observed_once() {
    let stale = Story::running(chain_spec(1)).then(process_terminal("i1", Proof::Observed));
    let error = stale.rejects(process_terminal("i1", Proof::Unknown));
    assert!(matches!(
        error,
        TransitionError::ProcessTerminalAlreadyObserved {
            run: RUN,
            ref instance
        } if instance == "i1"
    ));
    assert_message_names(&error, &["i1"]);

    let closed = stale.then(terminal(TerminalState::Failed, None));
    assert!(matches!(
        closed.rejects(process_terminal("i1", Proof::Observed)),
        TransitionError::ProcessTerminalAlreadyObserved { ref instance, .. } if instance == "i1"
    ));
}

#[test]
fn process_terminal_must_name_the_runner_instance() {
    let story = Story::running(chain_spec(1)).then(terminal(TerminalState::Failed, None));
    let error = story.rejects(process_terminal("i2", Proof::Observed));
    assert!(matches!(
        error,
        TransitionError::InstanceMismatch {
            run: RUN,
            ref expected,
            ref found
        } if expected == "i1" && found == "i2"
    ));
    assert_message_names(&error, &["i1", "i2"]);
}

#[test]
fn process_terminal_proof_must_fit_whether_a_runner_started() {
    let started = Story::running(chain_spec(1));
    let error = started.rejects(process_terminal("i1", Proof::NotStarted));
    assert!(matches!(
        error,
        TransitionError::ProofMismatch {
            run: RUN,
            proof: "not-started",
            why: "the run has a runner that started"
        }
    ));
    assert_message_names(&error, &["not-started"]);

    let never_started = Story::new(chain_spec(1));
    for proof in [Proof::Observed, Proof::Unknown] {
        assert!(matches!(
            never_started.rejects(process_terminal("i1", proof)),
            TransitionError::ProofMismatch {
                run: RUN,
                proof: found,
                why: "no runner ever started for the run"
            } if found == proof.as_str()
        ));
    }
}

// Dismissed: once, before or after Terminal; it stops nothing.

#[test]
fn dismissed_hides_the_run_once_and_stops_nothing() {
    let story = Story::running(chain_spec(1))
        .then(step_running(0))
        .then(dismissed());
    assert_eq!(story.state.dismissed_at_ms, Some(42));
    assert_eq!(story.state.status, RunStatus::Running);
    assert_eq!(story.step(0).status, StepStatus::Running);

    let error = story.rejects(dismissed());
    assert!(matches!(
        error,
        TransitionError::AlreadyDismissed { run: RUN }
    ));
    assert_message_names(&error, &["dismissed"]);

    let ended = story.then(terminal(TerminalState::Failed, None));
    assert!(matches!(
        ended.rejects(dismissed()),
        TransitionError::AlreadyDismissed { run: RUN }
    ));
}

// Resumed: right after RunCreated, naming another run; it changes nothing but the head.

fn resumed(from: RunId) -> Event {
    Event::Resumed { from }
}

#[test]
fn resumed_right_after_run_created_only_moves_the_head() {
    let created = Story::new(chain_spec(2));
    let story = created.clone().then(resumed(OTHER_RUN));
    let mut expected = created.state.clone();
    expected.head_seq = 2;
    expected.updated_at_ms = time_of(2);
    assert_eq!(story.state, expected);
    // The run goes on as any other.
    let story = story.then(runner_started("i1")).then(step_running(0));
    assert_eq!(story.state.status, RunStatus::Running);
}

#[test]
fn resumed_anywhere_but_right_after_run_created_is_refused() {
    let story = Story::new(chain_spec(1)).then(resumed(OTHER_RUN));
    let error = story.rejects(resumed(OTHER_RUN));
    assert!(matches!(
        error,
        TransitionError::ResumedNotAtCreation { run: RUN, head: 2 }
    ));
    assert_message_names(&error, &["Resumed", "RunCreated"]);
    let running = Story::running(chain_spec(1));
    assert!(matches!(
        running.rejects(resumed(OTHER_RUN)),
        TransitionError::ResumedNotAtCreation { head: 2, .. }
    ));
    let ended = Story::new(chain_spec(1)).then(terminal(TerminalState::Failed, Some("gave up")));
    assert!(matches!(
        ended.rejects(resumed(OTHER_RUN)),
        TransitionError::AfterTerminal { .. }
    ));
    assert!(matches!(
        apply(None, &record(1, resumed(OTHER_RUN))),
        Err(TransitionError::NotCreated { .. })
    ));
}

#[test]
fn a_run_cannot_resume_itself() {
    let error = Story::new(chain_spec(1)).rejects(resumed(RUN));
    assert!(matches!(
        error,
        TransitionError::ResumedFromItself { run: RUN }
    ));
    assert_message_names(&error, &["itself"]);
}

// SteerRequested, SteerDelivered: messages for steps that have yet to end, at most 20
// waiting; a step's end gives up on what it did not take, and so does the run's (not a pause).

fn delivery_of(story: &Story, id: &str, step: u32) -> SteerDelivery {
    story
        .state
        .steer(id)
        .and_then(|steer| steer.targets.iter().find(|target| target.step == step))
        .map(|target| target.delivery)
        .expect("the request has that target")
}

#[test]
fn a_steer_waits_for_its_steps_and_a_step_that_ends_gives_up_what_it_did_not_take() {
    let story = Story::running(parallel_spec(2, 2))
        .then(step_running(0))
        .then(steer("both", &[0, 1]))
        .then(steer("first-only", &[0]));
    assert_eq!(story.state.queued_steers().count(), 2);
    let both = story.state.steer("both").expect("recorded");
    assert_eq!(both.seq, 4, "the record holding the message");
    assert_eq!(both.requested_at_ms, time_of(4));
    assert_eq!(both.source, "cli");

    // Step 1 has not started: it cannot take a message yet.
    assert!(matches!(
        story.rejects(kit::steer_delivered("both", 1)),
        TransitionError::StepNotRunning { step: 1, .. }
    ));
    let story = story
        .then(kit::steer_delivered("both", 0))
        .then(step_finished(0, StepEnd::Complete));
    assert_eq!(
        delivery_of(&story, "both", 0),
        SteerDelivery::Delivered { at_ms: time_of(6) }
    );
    assert_eq!(
        delivery_of(&story, "first-only", 0),
        SteerDelivery::Undelivered {
            at_ms: time_of(7),
            why: Undelivered::StepEnded
        },
        "step 0 ended without taking it"
    );
    assert_eq!(delivery_of(&story, "both", 1), SteerDelivery::Queued);
    assert!(matches!(
        story.rejects(kit::steer_delivered("first-only", 0)),
        TransitionError::SteerNotQueued { step: 0, .. }
    ));
    assert!(matches!(
        story.rejects(steer("late", &[0])),
        TransitionError::SteerToEndedStep {
            step: 0,
            status: StepStatus::Complete,
            ..
        }
    ));
    assert!(matches!(
        story.rejects(steer("nowhere", &[5])),
        TransitionError::NoSuchStep { step: 5, .. }
    ));
    // The run's end gives up on the rest.
    let ended = story.then(terminal(TerminalState::Failed, Some("gave up")));
    assert_eq!(
        delivery_of(&ended, "both", 1),
        SteerDelivery::Undelivered {
            at_ms: time_of(8),
            why: Undelivered::RunEnded
        }
    );
    assert_eq!(ended.state.queued_steers().count(), 0);
}

#[test]
fn at_most_twenty_steers_wait_and_a_run_takes_a_bounded_number_in_all() {
    let full = full_of_steers(MAX_PENDING_STEERS);
    let error = full.rejects(steer("one-more", &[0]));
    assert!(matches!(error, TransitionError::SteerQueueFull { .. }));
    assert_message_names(&error, &["20 steer requests waiting"]);
    // Taking one makes room for one.
    let story = full
        .then(kit::steer_delivered("s0", 0))
        .then(steer("one-more", &[0]));
    assert_eq!(story.state.queued_steers().count(), MAX_PENDING_STEERS);

    let error = steered_to_the_limit().rejects(steer("one-more", &[0]));
    assert!(matches!(error, TransitionError::TooManySteers { .. }));
}

#[test]
fn a_malformed_steer_request_is_refused_saying_what_is_wrong() {
    let story = Story::running(chain_spec(2)).then(step_running(0));
    for (id, steps, message, flaw) in [
        ("", vec![0], "go", "id is empty"),
        ("a b", vec![0], "go", "white space"),
        ("s", vec![], "go", "names no step"),
        ("s", vec![0, 0], "go", "a step twice"),
        ("s", vec![0], "  \n", "message is empty"),
    ] {
        let error = story.rejects(kit::steer_requested(id, &steps, message));
        assert!(
            matches!(error, TransitionError::InvalidSteer { .. }),
            "{error:?}"
        );
        assert_message_names(&error, &[flaw]);
    }
    let long = "x".repeat(MAX_STEER_MESSAGE_BYTES + 1);
    let error = story.rejects(kit::steer_requested("s", &[0], &long));
    assert!(
        matches!(
            &error,
            TransitionError::TextTooLong { source, .. }
                if source.field == "message" && source.limit == MAX_STEER_MESSAGE_BYTES
        ),
        "{error:?}"
    );
    // A message as long as pi-subagents takes is taken.
    let longest = "x".repeat(MAX_STEER_MESSAGE_BYTES);
    story.then(kit::steer_requested("s", &[0], &longest));
}

#[test]
fn a_paused_run_keeps_its_waiting_steers_and_takes_more_for_its_resume() {
    let story = Story::running(chain_spec(3))
        .then(step_running(0))
        .then(step_finished(0, StepEnd::Complete))
        .then(step_running(1))
        .then(steer("for-the-next", &[2]))
        .then(control(ControlAction::Interrupt))
        .then(step_finished(1, StepEnd::Stopped))
        .then(terminal(TerminalState::Paused, None));
    assert_eq!(
        delivery_of(&story, "for-the-next", 2),
        SteerDelivery::Queued
    );
    // Steps 1 and 2 run again in the resume; step 0 completed and does not.
    let story = story.then(steer("after-the-pause", &[1]));
    assert_eq!(story.state.queued_steers().count(), 2);
    assert!(matches!(
        story.rejects(steer("to-a-done-step", &[0])),
        TransitionError::SteerToEndedStep { step: 0, .. }
    ));
    let story = story.then(Event::ControlRefused {
        file: "control/steer-requests/x.json".to_string(),
        reason: "not JSON".to_string(),
    });
    assert_eq!(
        story.state.head_seq, 11,
        "a refusal is recorded, and changes nothing else"
    );

    // A stopped run takes neither.
    let stopped = Story::running(chain_spec(1)).then(terminal(TerminalState::Stopped, None));
    for event in [
        steer("s", &[0]),
        Event::ControlRefused {
            file: "control/interrupt.json".to_string(),
            reason: "not JSON".to_string(),
        },
    ] {
        assert!(matches!(
            stopped.rejects(event),
            TransitionError::AfterTerminal {
                state: RunStatus::Stopped,
                ..
            }
        ));
    }
}

// StartDelayed, DelayEnded: a delayed run waits, queued and without a runner, until a record at
// or past its due time ends its delay.

#[test]
fn a_delayed_run_takes_a_runner_only_after_its_delay_ended_at_its_due_time() {
    let waiting = Story::new(chain_spec(1)).then(delayed(time_of(4)));
    assert!(waiting.state.is_waiting_for_due());
    assert!(waiting.state.is_waiting());
    assert_eq!(waiting.state.startable_at_ms(), None);
    assert!(matches!(
        waiting.rejects(runner_started("i1")),
        TransitionError::RunnerBeforeDue { due_at_ms, .. } if due_at_ms == time_of(4)
    ));
    // Seq 3 is written at time_of(3), before the due time.
    assert!(matches!(
        waiting.rejects(delay_ended()),
        TransitionError::NotYetDue { .. }
    ));
    let due = waiting
        .then(dismissed())
        .then(delay_ended())
        .then(runner_started("i1"));
    assert_eq!(due.state.status, RunStatus::Running);
    assert!(!due.state.is_waiting_for_due());
    let ended = due
        .state
        .delay
        .as_ref()
        .and_then(|delay| delay.ended.as_ref());
    assert_eq!(ended.map(|ended| ended.at_ms), Some(time_of(4)));
    assert_eq!(due.state.startable_at_ms(), Some(time_of(4)));
}

#[test]
fn a_run_is_delayed_only_in_its_creation_batch_and_never_in_a_queue_too() {
    assert!(matches!(
        Story::new(chain_spec(1))
            .then(joined("q"))
            .rejects(delayed(time_of(9))),
        TransitionError::StartDelayedLate { found: 3, .. }
    ));
    assert!(matches!(
        Story::new(chain_spec(1))
            .then(delayed(time_of(9)))
            .rejects(joined("q")),
        TransitionError::QueueJoinedLate { found: 3, .. }
    ));
}

#[test]
fn a_stop_ends_a_delayed_run_that_waits_and_its_delay_never_ends_after() {
    let stopped = Story::new(chain_spec(1))
        .then(delayed(time_of(9)))
        .then(control(ControlAction::Stop))
        .then(terminal(TerminalState::Stopped, None));
    assert!(!stopped.state.is_waiting_for_due());
    assert!(matches!(
        stopped.rejects(delay_ended()),
        TransitionError::AfterTerminal { .. }
    ));
}

// HostEnded: a host's repair is the run's end, at the host's time, by the host.

#[test]
fn a_hosts_repair_ends_the_run_at_the_hosts_time_and_the_host_is_named() {
    let story = Story::running(chain_spec(2))
        .then(step_running(0))
        .then(steer("s", &[1]));
    let host_time = time_of(1);
    let ended = story.then(kit::host_ended(
        "Async runner process 4242 exited or disappeared",
        host_time,
        Some("/r/run.json"),
    ));
    let terminal = ended.state.terminal.as_ref().expect("ended");
    assert_eq!(ended.state.status, RunStatus::Failed);
    assert_eq!(
        terminal.at_ms, host_time,
        "the host's time, not the record's"
    );
    assert_eq!(terminal.repaired_by, Some(Repairer::Host));
    assert!(ended.state.is_ended_by_host());
    assert_eq!(
        terminal.summary,
        "Async runner process 4242 exited or disappeared"
    );
    assert_eq!(
        ended.step_statuses(),
        vec![StepStatus::Failed, StepStatus::Skipped]
    );
    assert!(matches!(
        delivery_of(&ended, "s", 1),
        SteerDelivery::Undelivered {
            why: Undelivered::RunEnded,
            ..
        }
    ));
    // One end: neither a second host verdict nor a Terminal follows it.
    assert!(matches!(
        ended.rejects(kit::host_ended("again", host_time, None)),
        TransitionError::AfterTerminal { .. }
    ));
    assert!(matches!(
        ended.rejects(terminal_event()),
        TransitionError::AfterTerminal { .. }
    ));
}

fn terminal_event() -> Event {
    terminal(TerminalState::Failed, Some("runner died"))
}

// Atomicity and folding.

#[test]
fn a_refused_record_leaves_the_state_unchanged() {
    // A state with a control request, a job status, two running steps and a dismissal, so
    // that a partial write by any arm would show.
    let story = Story::running(spec(
        Mode::Parallel,
        2,
        vec![command("build"), external("render"), shell("report")],
    ))
    .then(control(ControlAction::Interrupt))
    .then(step_running(1))
    .then(job_updated(
        1,
        job(JobState::Running, Some(0.5), Some("half")),
    ))
    .then(step_running(0))
    .then(dismissed());
    let refused = [
        step_running(2),
        step_running(1),
        job_updated(1, job(JobState::Failed, Some(f64::NAN), Some("gone"))),
        job_updated(0, job(JobState::Failed, None, None)),
        step_finished(1, StepEnd::Skipped),
        step_finished(2, StepEnd::Complete),
        terminal(TerminalState::Complete, None),
        process_terminal("i2", Proof::Observed),
        process_terminal("i1", Proof::NotStarted),
        control(ControlAction::Interrupt),
        runner_started("i1"),
        dismissed(),
    ];
    for event in refused {
        let before = story.state.clone();
        let mut state = story.state.clone();
        let name = event.name();
        let result = state.apply_mut(&story.next(event));
        assert!(result.is_err(), "{name} should be refused");
        assert_eq!(state, before, "a refused {name} changed the state");
    }
}

#[test]
fn replay_folds_records_to_the_state_built_one_by_one() {
    assert_eq!(replay(&[]), Ok(None));

    let events = vec![
        created(build_then_render()),
        runner_started("i1"),
        step_running(0),
        step_finished(0, StepEnd::Complete),
        step_running(1),
        job_updated(1, job(JobState::Succeeded, Some(1.0), None)),
        step_finished(1, StepEnd::Complete),
        terminal(TerminalState::Complete, None),
        process_terminal("i1", Proof::Observed),
    ];
    let records: Vec<Record> = events
        .into_iter()
        .enumerate()
        .map(|(index, event)| record(index as u64 + 1, event))
        .collect();
    let mut state: Option<RunState> = None;
    for record in &records {
        state = Some(apply(state.as_ref(), record).expect("every record is legal"));
    }
    let replayed = replay(&records).expect("every record is legal");
    assert_eq!(replayed, state);
    let replayed = replayed.expect("nine records make a run");
    assert!(replayed.is_closed());
    assert_eq!(replayed.head_seq, 9);
    assert_eq!(replayed.updated_at_ms, time_of(9));

    let mut broken = records.clone();
    broken.insert(3, record(4, step_running(1)));
    assert!(matches!(
        replay(&broken),
        Err(TransitionError::ChainOrder { step: 1, .. })
    ));
}

// Property test: arbitrary sequences of all nine events for one run.

/// One generated record: the event, how far its seq is from the next one, and whether it
/// carries another run's id.
#[derive(Debug, Clone)]
struct Op {
    event: Event,
    seq_offset: i64,
    is_other_run: bool,
}

fn arb_name() -> impl Strategy<Value = String> {
    prop_oneof![30 => "[a-z]{1,6}", 1 => Just(String::new())]
}

fn arb_step_spec() -> impl Strategy<Value = StepSpec> {
    let action = prop_oneof![
        Just(StepAction::Command {
            argv: vec!["true".to_string()]
        }),
        Just(StepAction::Shell {
            script: "exit 0".to_string()
        }),
        Just(StepAction::ExternalJob {
            provider: "farm".to_string()
        }),
    ];
    (arb_name(), action).prop_map(|(name, action)| StepSpec { name, action })
}

fn arb_mode() -> impl Strategy<Value = Mode> {
    prop_oneof![Just(Mode::Single), Just(Mode::Chain), Just(Mode::Parallel)]
}

/// Mostly valid specs, and now and then anything (no steps, two-step single, zero concurrency).
fn arb_spec() -> impl Strategy<Value = RunSpec> {
    let fitting = (
        arb_mode(),
        1..=3u32,
        prop::collection::vec(arb_step_spec(), 1..=4),
    )
        .prop_map(|(mode, concurrency, mut steps)| {
            if mode == Mode::Single {
                steps.truncate(1);
            }
            spec(mode, concurrency, steps)
        });
    let anything = (
        arb_mode(),
        0..=3u32,
        prop::collection::vec(arb_step_spec(), 0..=5),
    )
        .prop_map(|(mode, concurrency, steps)| spec(mode, concurrency, steps));
    prop_oneof![9 => fitting, 1 => anything]
}

/// Short text, and rarely one over the limit.
fn arb_text() -> impl Strategy<Value = String> {
    prop_oneof![40 => "[a-z]{0,6}", 1 => Just("x".repeat(MAX_TEXT_BYTES + 1))]
}

fn arb_instance() -> impl Strategy<Value = String> {
    prop_oneof![Just("i1".to_string()), Just("i2".to_string())]
}

/// Mostly a step of the run (it has `step_count` steps), sometimes any of 0..5, so that
/// out-of-range steps occur too.
fn arb_step_index(step_count: u32) -> impl Strategy<Value = u32> {
    prop_oneof![5 => 0..step_count.max(1), 1 => 0..5u32]
}

fn arb_created(spec: impl Strategy<Value = RunSpec>) -> impl Strategy<Value = Event> {
    (
        spec,
        any::<u64>(),
        proptest::option::of(arb_text()),
        proptest::option::of(arb_text()),
        proptest::option::of(arb_text()),
    )
        .prop_map(
            |(spec, created_at_ms, session_id, completion_owner_id, tool_call_id)| {
                Event::RunCreated {
                    spec: Arc::new(spec),
                    created_at_ms,
                    session_id,
                    completion_owner_id,
                    tool_call_id,
                }
            },
        )
}

fn arb_job() -> impl Strategy<Value = ExternalJobStatus> {
    let state = prop_oneof![
        Just(JobState::Queued),
        Just(JobState::Running),
        Just(JobState::Succeeded),
        Just(JobState::Failed),
        Just(JobState::Cancelled),
        Just(JobState::Blocked),
    ];
    // Finite progress only: NaN is never equal to itself, which would break the comparisons.
    (
        state,
        proptest::option::of(arb_text()),
        proptest::option::of(-1.0f64..2.0),
        proptest::option::of(arb_text()),
        proptest::option::of(arb_text()),
    )
        .prop_map(|(state, id, progress, message, url)| ExternalJobStatus {
            state,
            id,
            progress,
            message,
            url,
        })
}

fn arb_step_end() -> impl Strategy<Value = StepEnd> {
    prop_oneof![
        5 => Just(StepEnd::Complete),
        1 => Just(StepEnd::Failed),
        1 => Just(StepEnd::Stopped),
        1 => Just(StepEnd::Skipped),
    ]
}

/// Any of the nine events, its step (if any) drawn for a run of `step_count` steps.
fn arb_event(step_count: u32) -> impl Strategy<Value = Event> {
    let started = arb_instance().prop_map(|instance_id| Event::RunnerStarted {
        runner: runner_identity(),
        instance_id,
    });
    let step_started =
        (arb_step_index(step_count), any::<bool>()).prop_map(|(step, has_process)| {
            Event::StepRunning {
                step,
                process: has_process.then(runner_identity),
            }
        });
    let job_update = (arb_step_index(step_count), arb_job())
        .prop_map(|(step, job)| Event::ExternalJobUpdated { step, job });
    let finished = (
        arb_step_index(step_count),
        arb_step_end(),
        proptest::option::of(-2..3i32),
        proptest::option::of(arb_text()),
    )
        .prop_map(|(step, end, exit_code, error)| Event::StepFinished {
            step,
            outcome: StepOutcome {
                end,
                exit_code,
                error,
            },
        });
    let action = prop_oneof![
        Just(ControlAction::Stop),
        Just(ControlAction::Timeout),
        Just(ControlAction::Interrupt),
    ];
    let control = (action, arb_text(), arb_text())
        .prop_map(|(action, by, reason)| Event::ControlRequested { action, by, reason });
    let terminal_state = prop_oneof![
        Just(TerminalState::Complete),
        Just(TerminalState::Failed),
        Just(TerminalState::Stopped),
        Just(TerminalState::Paused),
    ];
    let repairer = prop_oneof![Just(Repairer::Reconciler), Just(Repairer::Launcher)];
    let ended = (
        terminal_state,
        proptest::option::of(arb_text()),
        arb_text(),
        -1..3i32,
        proptest::option::of(repairer),
    )
        .prop_map(
            |(state, error, summary, exit_code, repaired_by)| Event::Terminal {
                state,
                error,
                summary,
                exit_code,
                repaired_by,
            },
        );
    let proof = prop_oneof![
        Just(Proof::Observed),
        Just(Proof::Unknown),
        Just(Proof::NotStarted),
    ];
    let observer = prop_oneof![
        Just(Observer::RunnerParent),
        Just(Observer::Launcher),
        Just(Observer::Reconciler),
    ];
    let exit = proptest::option::of(
        (
            proptest::option::of(0..3i32),
            proptest::option::of(1..16i32),
        )
            .prop_map(|(code, signal)| ProcessExit { code, signal }),
    );
    let process_ended =
        (arb_instance(), exit, proof, observer).prop_map(|(instance_id, exit, proof, observer)| {
            Event::ProcessTerminalObserved {
                instance_id,
                exit,
                proof,
                observer,
            }
        });
    let hidden = any::<u64>().prop_map(|at_ms| Event::Dismissed { at_ms });
    prop_oneof![
        1 => arb_created(arb_spec()),
        3 => started,
        8 => step_started,
        3 => job_update,
        8 => finished,
        1 => control,
        1 => ended,
        1 => process_ended,
        1 => hidden,
    ]
}

fn arb_op_from(event: impl Strategy<Value = Event>) -> impl Strategy<Value = Op> {
    let seq_offset = prop_oneof![15 => Just(0i64), 1 => -3..=3i64];
    (event, seq_offset, proptest::bool::weighted(0.03)).prop_map(
        |(event, seq_offset, is_other_run)| Op {
            event,
            seq_offset,
            is_other_run,
        },
    )
}

/// The events of a run that goes right, after its creation: started, every step run to
/// completion in order, Terminal(complete), its process observed, dismissed.
fn happy_path(step_count: u32) -> Vec<Event> {
    let mut events = vec![runner_started("i1")];
    for step in 0..step_count {
        events.push(step_running(step));
        events.push(step_finished(step, StepEnd::Complete));
    }
    events.push(terminal(TerminalState::Complete, None));
    events.push(process_terminal("i1", Proof::Observed));
    events.push(dismissed());
    events
}

/// Up to 40 records for one run. Most start with a `RunCreated` and draw their steps among
/// those of its spec. Some are plain noise; the others weave noise into [`happy_path`], so that
/// deep states (a complete parallel run, a closed chain) are reached as well as early refusals.
fn arb_ops() -> impl Strategy<Value = Vec<Op>> {
    const MAX_OPS: usize = 40;
    arb_spec().prop_flat_map(|spec| {
        let step_count = spec.steps.len() as u32;
        let happy: Vec<Op> = happy_path(step_count)
            .into_iter()
            .map(|event| Op {
                event,
                seq_offset: 0,
                is_other_run: false,
            })
            .collect();
        (
            proptest::bool::weighted(0.9),
            arb_op_from(arb_created(Just(spec))),
            prop::collection::vec(arb_op_from(arb_event(step_count)), 0..MAX_OPS),
            proptest::option::weighted(0.4, prop::collection::vec(any::<bool>(), 0..MAX_OPS)),
        )
            .prop_map(move |(starts_with_created, first, noise, weave)| {
                let mut ops: Vec<Op> = Vec::with_capacity(MAX_OPS);
                if starts_with_created {
                    ops.push(first);
                }
                match weave {
                    None => ops.extend(noise),
                    Some(takes_happy) => {
                        // Each flag picks the next record from the happy path (true) or the
                        // noise (false); what is left of the happy path comes last.
                        let mut happy = happy.clone().into_iter();
                        let mut noise = noise.into_iter();
                        for take_happy in takes_happy {
                            let next = if take_happy {
                                happy.next()
                            } else {
                                noise.next()
                            };
                            ops.extend(next);
                        }
                        ops.extend(happy);
                    }
                }
                ops.truncate(MAX_OPS);
                ops
            })
    })
}

/// The invariants of every state the reducer can reach.
fn check_invariants(state: &RunState, accepted_count: usize) -> Result<(), TestCaseError> {
    prop_assert_eq!(state.head_seq, accepted_count as u64);
    prop_assert_eq!(state.steps.len(), state.spec.steps.len());
    let running = state
        .steps
        .iter()
        .filter(|step| step.status == StepStatus::Running)
        .count();
    match state.spec.mode {
        Mode::Parallel => prop_assert!(
            running <= state.spec.concurrency as usize,
            "{} steps running, concurrency {}",
            running,
            state.spec.concurrency
        ),
        Mode::Chain | Mode::Single => {
            prop_assert!(
                running <= 1,
                "{} steps running in {:?}",
                running,
                state.spec.mode
            )
        }
    }
    if state.spec.mode == Mode::Chain {
        for (index, step) in state.steps.iter().enumerate() {
            if step.status != StepStatus::Pending && step.status != StepStatus::Skipped {
                prop_assert!(
                    state.steps[..index]
                        .iter()
                        .all(|earlier| earlier.status == StepStatus::Complete),
                    "chain step {} ran before its earlier steps completed",
                    index
                );
            }
        }
    }
    if running > 0 {
        prop_assert_eq!(state.status, RunStatus::Running);
    }
    if state.is_terminal() {
        prop_assert!(
            state.steps.iter().all(|step| step.status.is_done()),
            "terminal run with a running or pending step: {:?}",
            state.steps
        );
        let terminal = state.terminal.as_ref();
        prop_assert_eq!(
            terminal.map(|terminal| terminal.state.into()),
            Some(state.status)
        );
    } else {
        prop_assert!(state.terminal.is_none());
    }
    if state.status == RunStatus::Complete {
        prop_assert!(
            state
                .steps
                .iter()
                .all(|step| step.status == StepStatus::Complete)
        );
    }
    match state.status {
        RunStatus::Queued => prop_assert!(state.runner.is_none()),
        RunStatus::Running => prop_assert!(state.runner.is_some()),
        _ => {}
    }
    prop_assert!(!(state.is_stale() && state.is_closed()));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn any_sequence_folds_to_a_legal_state(ops in arb_ops()) {
        let mut state: Option<RunState> = None;
        let mut accepted: Vec<Record> = Vec::new();
        for (index, op) in ops.into_iter().enumerate() {
            let head = state.as_ref().map_or(0, |state| state.head_seq);
            let record = Record {
                format_version: FORMAT_VERSION,
                run_id: if op.is_other_run { OTHER_RUN } else { RUN },
                seq: (head + 1).saturating_add_signed(op.seq_offset),
                time_ms: CREATED_AT_MS + index as u64,
                writer: WriterId(1),
                writer_seq: index as u64,
                event: op.event,
            };
            match &mut state {
                None => {
                    if let Ok(created) = apply(None, &record) {
                        state = Some(created);
                        accepted.push(record);
                    }
                }
                Some(current) => {
                    let before = current.clone();
                    let by_value = apply(Some(&before), &record);
                    match current.apply_mut(&record) {
                        Ok(()) => {
                            prop_assert_eq!(by_value, Ok(current.clone()));
                            accepted.push(record);
                        }
                        Err(error) => {
                            prop_assert_eq!(&*current, &before, "refused by {}", error);
                            prop_assert_eq!(by_value, Err(error));
                        }
                    }
                }
            }
            prop_assert_eq!(replay(&accepted), Ok(state.clone()));
            if let Some(state) = &state {
                check_invariants(state, accepted.len())?;
            }
        }
    }
}

/// Found by mutation testing: nothing checked that a state's name reads back as that state
/// (`list --state S`), nor that only pending and running steps are not done.
#[test]
fn every_run_state_reads_back_from_its_name_and_nothing_else_does() {
    for state in RunStatus::ALL {
        assert_eq!(state.as_str().parse::<RunStatus>(), Ok(state));
    }
    let error = "sleeping".parse::<RunStatus>().expect_err("not a state");
    assert!(
        error.contains("\"sleeping\"") && error.contains("queued"),
        "{error}"
    );
}

#[test]
fn only_pending_and_running_steps_are_not_done() {
    let done: Vec<(StepStatus, bool)> = [
        StepStatus::Pending,
        StepStatus::Running,
        StepStatus::Complete,
        StepStatus::Failed,
        StepStatus::Stopped,
        StepStatus::Skipped,
    ]
    .into_iter()
    .map(|status| (status, status.is_done()))
    .collect();
    assert_eq!(
        done,
        vec![
            (StepStatus::Pending, false),
            (StepStatus::Running, false),
            (StepStatus::Complete, true),
            (StepStatus::Failed, true),
            (StepStatus::Stopped, true),
            (StepStatus::Skipped, true),
        ]
    );
}

/// Survivors of mutation testing: the reducer's own states pass `check_shape` at every
/// status, and each of its rules, broken alone on such a state, is refused with its reason.
#[test]
fn check_shape_passes_the_reducers_states_and_refuses_each_broken_rule() {
    let queued = Story::new(chain_spec(2)).state;
    let running = Story::running(chain_spec(2)).then(step_running(0)).state;
    let complete = Story::running(chain_spec(1))
        .then(step_running(0))
        .then(step_finished(0, StepEnd::Complete))
        .then(terminal(TerminalState::Complete, None))
        .state;
    let failed = Story::running(chain_spec(2))
        .then(step_running(0))
        .then(step_finished(0, StepEnd::Failed))
        .then(terminal(TerminalState::Failed, Some("step 0 failed")))
        .state;
    for state in [&queued, &running, &complete, &failed] {
        assert_eq!(state.check_shape(), Ok(()), "{}", state.status);
    }

    let broken = |state: &RunState, change: &dyn Fn(&mut RunState)| {
        let mut state = state.clone();
        change(&mut state);
        state.check_shape().expect_err("a broken rule").to_string()
    };
    let cases: Vec<(String, &str)> = vec![
        (
            broken(&queued, &|state| state.spec = Arc::new(parallel_spec(0, 2))),
            "its spec is not one a run may have",
        ),
        (
            broken(&queued, &|state| {
                state.steps.pop();
            }),
            "it has 1 step states for 2 steps",
        ),
        (
            broken(&queued, &|state| state.head_seq = 0),
            "it has no head",
        ),
        (
            broken(&complete, &|state| state.terminal = None),
            "it is terminal without an end",
        ),
        (
            broken(&running, &|state| state.terminal = failed.terminal.clone()),
            "it has an end but is not terminal",
        ),
        (
            broken(&failed, &|state| state.status = RunStatus::Complete),
            "its end disagrees with its state",
        ),
        (
            broken(&running, &|state| state.runner = None),
            "it is running without a runner",
        ),
        (
            broken(&queued, &|state| state.runner = running.runner.clone()),
            "it is queued with a runner",
        ),
        (
            broken(&queued, &|state| {
                state.steps[0].status = StepStatus::Running
            }),
            "a step is running in a run that is not",
        ),
        (
            broken(&complete, &|state| {
                state.steps[0].status = StepStatus::Failed
            }),
            "it is complete with a step that is not",
        ),
    ];
    for (error, reason) in cases {
        assert!(error.starts_with(reason), "{error:?} should say {reason:?}");
    }
}

// The shape rules against the reducer's rules (`shape.rs`).

/// A position per [`TransitionError`] kind. Exhaustive: a new kind does not compile until it
/// has one, and [`every_reducer_rule_names_its_shape_rules_or_why_a_state_cannot_show_it`]
/// fails until it has an example.
fn transition_kind(error: &TransitionError) -> usize {
    match error {
        TransitionError::NotCreated { .. } => 0,
        TransitionError::AlreadyCreated { .. } => 1,
        TransitionError::CreatedNotFirst { .. } => 2,
        TransitionError::SequenceGap { .. } => 3,
        TransitionError::WrongRun { .. } => 4,
        TransitionError::InvalidSpec { .. } => 5,
        TransitionError::TextTooLong { .. } => 6,
        TransitionError::RunnerNotQueued { .. } => 7,
        TransitionError::RunnerAfterProcessTerminal { .. } => 8,
        TransitionError::NoSuchStep { .. } => 9,
        TransitionError::StepStartWhileNotRunning { .. } => 10,
        TransitionError::StepNotPending { .. } => 11,
        TransitionError::ChainOrder { .. } => 12,
        TransitionError::ConcurrencyExceeded { .. } => 13,
        TransitionError::StepNotRunning { .. } => 14,
        TransitionError::SkipNotPending { .. } => 15,
        TransitionError::NotExternalJob { .. } => 16,
        TransitionError::NonFiniteProgress { .. } => 17,
        TransitionError::AfterTerminal { .. } => 18,
        TransitionError::ControlAlreadyRequested { .. } => 19,
        TransitionError::CompleteWithUnfinishedStep { .. } => 20,
        TransitionError::ProcessTerminalAlreadyObserved { .. } => 21,
        TransitionError::InstanceMismatch { .. } => 22,
        TransitionError::ProofMismatch { .. } => 23,
        TransitionError::AlreadyDismissed { .. } => 24,
        TransitionError::ResumedNotAtCreation { .. } => 25,
        TransitionError::ResumedFromItself { .. } => 26,
        TransitionError::QueueJoinedLate { .. } => 27,
        TransitionError::InvalidQueueName { .. } => 28,
        TransitionError::NotInQueue { .. } => 29,
        TransitionError::AlreadyAdmitted { .. } => 30,
        TransitionError::RunnerBeforeAdmission { .. } => 31,
        TransitionError::HookBeforeEnd { .. } => 32,
        TransitionError::HookOutOfRange { .. } => 33,
        TransitionError::HookAttemptNotNext { .. } => 34,
        TransitionError::HookAttemptOpen { .. } => 35,
        TransitionError::HookSettled { .. } => 36,
        TransitionError::HookNotClaimed { .. } => 37,
        TransitionError::HookRetryNotAllowed { .. } => 38,
        TransitionError::InvalidSteer { .. } => 39,
        TransitionError::SteerToEndedStep { .. } => 40,
        TransitionError::SteerIdReused { .. } => 41,
        TransitionError::SteerQueueFull { .. } => 42,
        TransitionError::TooManySteers { .. } => 43,
        TransitionError::NoSuchSteer { .. } => 44,
        TransitionError::SteerNotQueued { .. } => 45,
        TransitionError::DependsOnLate { .. } => 46,
        TransitionError::InvalidDependencies { .. } => 47,
        TransitionError::NoDependencies { .. } => 48,
        TransitionError::DependenciesAlreadyMet { .. } => 49,
        TransitionError::BeforeDependencies { .. } => 50,
        TransitionError::StartDelayedLate { .. } => 51,
        TransitionError::NotDelayed { .. } => 52,
        TransitionError::DelayAlreadyEnded { .. } => 53,
        TransitionError::NotYetDue { .. } => 54,
        TransitionError::RunnerBeforeDue { .. } => 55,
        TransitionError::UniqueKeyLate { .. } => 56,
        TransitionError::RetryPolicyLate { .. } => 57,
        TransitionError::InvalidRetryPolicy { .. } => 58,
        TransitionError::NoRetries { .. } => 59,
        TransitionError::AttemptNotCurrent { .. } => 60,
        TransitionError::RetriesSpent { .. } => 61,
        TransitionError::AttemptAfterControl { .. } => 62,
        TransitionError::StepNotStoppable { .. } => 63,
        TransitionError::StepStopAlreadyRequested { .. } => 64,
        TransitionError::AttemptAfterStepStop { .. } => 65,
    }
}

const TRANSITION_KINDS: usize = 66;

fn running_job() -> Story {
    Story::running(single_spec(external("render")))
        .then(step_running(0))
        .then(job_updated(
            0,
            job(JobState::Running, Some(0.5), Some("half way")),
        ))
}

/// One refusal of each kind, each made by the reducer.
fn every_kind_of_refusal() -> Vec<TransitionError> {
    let queued = || Story::new(chain_spec(1));
    let running = || Story::running(chain_spec(1));
    let with_other_run = {
        let story = running();
        let mut record = story.next(step_running(0));
        record.run_id = OTHER_RUN;
        story.rejects_record(&record)
    };
    let long = "x".repeat(MAX_TEXT_BYTES + 1);
    vec![
        apply(None, &record(1, runner_started("i1"))).expect_err("not created"),
        queued().rejects(created(chain_spec(1))),
        apply(None, &record(2, created(chain_spec(1)))).expect_err("created at 2"),
        running().rejects_record(&record(9, step_running(0))),
        with_other_run,
        apply(None, &record(1, created(parallel_spec(0, 2)))).expect_err("concurrency 0"),
        running().rejects(Event::ControlRequested {
            action: ControlAction::Stop,
            by: long.clone(),
            reason: "asked to".to_string(),
        }),
        running().rejects(runner_started("i2")),
        queued()
            .then(process_terminal("i1", Proof::NotStarted))
            .rejects(runner_started("i1")),
        running().rejects(step_running(9)),
        queued().rejects(step_running(0)),
        running().then(step_running(0)).rejects(step_running(0)),
        Story::running(chain_spec(2)).rejects(step_running(1)),
        Story::running(parallel_spec(1, 2))
            .then(step_running(0))
            .rejects(step_running(1)),
        running().rejects(step_finished(0, StepEnd::Complete)),
        running()
            .then(step_running(0))
            .rejects(step_finished(0, StepEnd::Skipped)),
        running()
            .then(step_running(0))
            .rejects(job_updated(0, job(JobState::Running, None, None))),
        Story::running(single_spec(external("render")))
            .then(step_running(0))
            .rejects(job_updated(0, job(JobState::Running, Some(f64::NAN), None))),
        queued()
            .then(terminal(TerminalState::Failed, Some("gave up")))
            .rejects(runner_started("i1")),
        running()
            .then(control(ControlAction::Stop))
            .rejects(control(ControlAction::Stop)),
        running().rejects(terminal(TerminalState::Complete, None)),
        running()
            .then(process_terminal("i1", Proof::Unknown))
            .rejects(process_terminal("i1", Proof::Unknown)),
        running().rejects(process_terminal("i2", Proof::Unknown)),
        running().rejects(process_terminal("i1", Proof::NotStarted)),
        queued()
            .then(terminal(TerminalState::Failed, Some("gave up")))
            .then(dismissed())
            .rejects(dismissed()),
        running().rejects(resumed(OTHER_RUN)),
        queued().rejects(resumed(RUN)),
        running().rejects(joined("q")),
        queued().rejects(joined("a b")),
        queued().rejects(admitted()),
        queued()
            .then(joined("q"))
            .then(admitted())
            .rejects(admitted()),
        queued().then(joined("q")).rejects(runner_started("i1")),
        running().rejects(hook_attempted(0, 1)),
        ended().rejects(hook_attempted(crate::event::MAX_HOOKS, 1)),
        ended().rejects(hook_attempted(0, 2)),
        ended()
            .then(hook_attempted(0, 1))
            .rejects(hook_attempted(0, 2)),
        ended()
            .then(hook_attempted(0, 1))
            .then(hook_ended(0, 1, crate::event::HookOutcome::Delivered, None))
            .rejects(hook_attempted(0, 2)),
        ended().rejects(hook_ended(0, 1, hook_failed(), None)),
        ended().then(hook_attempted(0, 1)).rejects(hook_ended(
            0,
            1,
            crate::event::HookOutcome::Delivered,
            Some(5),
        )),
        running().rejects(steer("a b", &[0])),
        Story::running(chain_spec(2))
            .then(step_running(0))
            .then(step_finished(0, StepEnd::Complete))
            .rejects(steer("late", &[0])),
        running().then(steer("s", &[0])).rejects(steer("s", &[0])),
        full_of_steers(MAX_PENDING_STEERS).rejects(steer("one-more", &[0])),
        steered_to_the_limit().rejects(steer("one-more", &[0])),
        running()
            .then(step_running(0))
            .rejects(kit::steer_delivered("nobody", 0)),
        running()
            .then(step_running(0))
            .then(steer("s", &[0]))
            .then(kit::steer_delivered("s", 0))
            .rejects(kit::steer_delivered("s", 0)),
        running().rejects(depends_on(&[OTHER_RUN], &[])),
        queued().rejects(depends_on(&[OTHER_RUN], &[OTHER_RUN])),
        queued().rejects(dependencies_met()),
        queued()
            .then(depends_on(&[OTHER_RUN], &[]))
            .then(dependencies_met())
            .rejects(dependencies_met()),
        queued()
            .then(depends_on(&[OTHER_RUN], &[]))
            .rejects(runner_started("i1")),
        running().rejects(delayed(time_of(5))),
        queued().rejects(delay_ended()),
        queued()
            .then(delayed(time_of(3)))
            .then(delay_ended())
            .rejects(delay_ended()),
        queued().then(delayed(time_of(9))).rejects(delay_ended()),
        queued()
            .then(delayed(time_of(9)))
            .rejects(runner_started("i1")),
        running().rejects(unique_key("k")),
        running().rejects(retry_policy(1)),
        queued().rejects(retry_policy(0)),
        running().rejects(attempt_ended(1)),
        retried(1).rejects(attempt_ended(2)),
        retried(1)
            .then(attempt_ended(1))
            .then(delay_ended())
            .then(runner_started("i2"))
            .rejects(attempt_ended(2)),
        retried(1)
            .then(control(ControlAction::Stop))
            .rejects(attempt_ended(1)),
        Story::running(chain_spec(2))
            .then(step_running(0))
            .then(step_finished(0, StepEnd::Complete))
            .rejects(step_stop(0)),
        running().then(step_stop(0)).rejects(step_stop(0)),
        retried(1).then(step_stop(0)).rejects(attempt_ended(1)),
    ]
}

fn step_stop(step: u32) -> Event {
    Event::StepStopRequested {
        step,
        by: "host".to_string(),
        reason: "enough".to_string(),
    }
}

fn retry_policy(retries: u32) -> Event {
    Event::RetryPolicy {
        retries,
        backoff_ms: 1,
        backoff_max_ms: 10,
        on: crate::event::RetryOn::default_causes(),
        idle_timeout_ms: None,
        heartbeat_ms: Some(7),
    }
}

fn attempt_ended(attempt: u32) -> Event {
    Event::AttemptEnded {
        attempt,
        cause: crate::event::AttemptCause::Exit,
        error: Some("step 0 (s0) failed: exit 3".to_string()),
        summary: "exit 3".to_string(),
        exit_code: 3,
        // Due at once: every record's time (`time_of`) is past it.
        retry_at_ms: 0,
    }
}

/// A run with `retries` retries, its first runner running its first step.
fn retried(retries: u32) -> Story {
    Story::new(chain_spec(2))
        .then(retry_policy(retries))
        .then(runner_started("i1"))
        .then(step_running(0))
}

/// An attempt's end takes the run back to `queued` with every step pending, no runner and no
/// request, waiting for its due time as a delayed run does; the next runner takes it once the
/// delay ended, and its last attempt's failure ends the run.
#[test]
fn an_ended_attempt_waits_for_its_due_time_and_the_next_runner_takes_it() {
    let waiting = retried(1)
        .then(control(ControlAction::Timeout))
        .then(attempt_ended(1));
    let state = &waiting.state;
    assert_eq!(state.status, RunStatus::Queued);
    assert!(state.runner.is_none() && state.controls.is_empty());
    assert!(state.is_between_attempts() && state.is_waiting_for_due());
    assert_eq!(
        state
            .steps
            .iter()
            .map(|step| step.status)
            .collect::<Vec<_>>(),
        vec![StepStatus::Pending; 2]
    );
    let retry = state.retry.as_ref().expect("a retried run");
    assert_eq!(retry.current_attempt(), 2);
    assert_eq!(retry.attempts[0].runner_instance.as_deref(), Some("i1"));
    // The settings its next runner gets are the policy's.
    assert_eq!(state.kept_runner_settings(), (None, Some(7)));
    waiting.rejects(runner_started("i2"));
    let second = waiting
        .then(delay_ended())
        .then(runner_started("i2"))
        .then(step_running(0));
    // The first runner, seen gone after the run moved on, is kept with its attempt; the second
    // is the run's own.
    let second = second.then(process_terminal("i1", Proof::Observed));
    let retry = second.state.retry.as_ref().expect("a retried run");
    assert!(retry.attempts[0].process_terminal.is_some());
    assert!(second.state.process_terminal.is_none());
    second.rejects(process_terminal("i1", Proof::Observed));
    let ended = second
        .then(step_finished(0, StepEnd::Failed))
        .then(terminal(TerminalState::Failed, Some("again")))
        .then(process_terminal("i2", Proof::Observed));
    assert!(ended.state.is_closed());
}

/// A stopped attempt is not tried again, and a retry's wait is ended by a stop as a delayed
/// run's is.
#[test]
fn a_stop_ends_a_retried_run_and_its_wait() {
    let waiting = retried(2).then(attempt_ended(1));
    let stopped = waiting.then(terminal(TerminalState::Stopped, Some("stop")));
    assert_eq!(stopped.state.status, RunStatus::Stopped);
    assert!(!stopped.state.is_waiting_for_due());
}

/// The policy is taken only in the creation batch, after the queue, delay or dependencies and
/// before the key, once.
#[test]
fn a_retry_policy_is_taken_only_in_the_creation_batch_before_the_key() {
    queued_story().then(retry_policy(2)).then(unique_key("k"));
    queued_story()
        .then(joined("q"))
        .then(depends_on(&[OTHER_RUN], &[]))
        .then(retry_policy(2));
    queued_story()
        .then(delayed(time_of(9)))
        .then(retry_policy(2));
    queued_story()
        .then(unique_key("k"))
        .rejects(retry_policy(2));
    queued_story()
        .then(retry_policy(2))
        .rejects(retry_policy(2));
    queued_story().then(retry_policy(2)).rejects(joined("q"));
}

/// A retried run in a queue gives its slot back at its attempt's end, and waits for its due
/// time and then a slot again.
#[test]
fn a_retried_run_in_a_queue_gives_its_slot_back_and_waits_again() {
    let running = Story::new(chain_spec(1))
        .then(joined("q"))
        .then(retry_policy(1))
        .then(admitted())
        .then(runner_started("i1"))
        .then(step_running(0));
    assert!(running.state.holds_slot());
    let waiting = running.then(attempt_ended(1));
    assert!(!waiting.state.holds_slot() && !waiting.state.is_waiting_for_slot());
    let due = waiting.then(delay_ended());
    assert!(due.state.is_waiting_for_slot());
    due.rejects(runner_started("i2"));
    let again = due.then(admitted()).then(runner_started("i2"));
    assert!(again.state.holds_slot());
}

/// The backoff doubles from its first wait to its longest, and jitter takes up to half off.
#[test]
fn the_backoff_doubles_up_to_its_longest_and_jitter_takes_at_most_half() {
    let retry = Story::new(chain_spec(1))
        .then(Event::RetryPolicy {
            retries: 10,
            backoff_ms: 1_000,
            backoff_max_ms: 5_000,
            on: crate::event::RetryOn::default_causes(),
            idle_timeout_ms: None,
            heartbeat_ms: None,
        })
        .state
        .retry
        .expect("a policy");
    let waits: Vec<u64> = (1..=5)
        .map(|attempt| retry.backoff_after_ms(attempt, 0.0))
        .collect();
    assert_eq!(waits, [1_000, 2_000, 4_000, 5_000, 5_000]);
    assert_eq!(retry.backoff_after_ms(2, 0.999_999), 1_001);
    assert_eq!(retry.backoff_after_ms(2, f64::NAN), 2_000);
    assert_eq!(retry.backoff_after_ms(64, 0.0), 5_000);
}

fn unique_key(key: &str) -> Event {
    Event::UniqueKey {
        key: key.to_string(),
        hold_ms: None,
    }
}

/// A run takes its key only as the last event of its creation batch, once: right after
/// `RunCreated`, or after its queue, delay or dependencies.
#[test]
fn a_unique_key_is_taken_only_at_the_end_of_the_creation_batch_and_once() {
    let taken = queued_story().then(unique_key("k"));
    assert_eq!(
        taken
            .state
            .unique
            .as_ref()
            .map(|unique| unique.key.as_str()),
        Some("k")
    );
    taken.rejects(unique_key("k"));
    queued_story().then(joined("q")).then(unique_key("k"));
    queued_story()
        .then(depends_on(&[OTHER_RUN], &[]))
        .then(unique_key("k"));
    queued_story()
        .then(delayed(time_of(9)))
        .then(unique_key("k"));
    queued_story()
        .then(joined("q"))
        .then(depends_on(&[OTHER_RUN], &[]))
        .then(unique_key("k"));
    queued_story()
        .then(resumed(OTHER_RUN))
        .rejects(unique_key("k"));
    queued_story().then(unique_key("k")).rejects(joined("q"));
}

fn queued_story() -> Story {
    Story::new(chain_spec(1))
}

fn depends_on(after: &[RunId], after_any: &[RunId]) -> Event {
    Event::DependsOn {
        after: after.to_vec(),
        after_any: after_any.to_vec(),
        idle_timeout_ms: None,
        heartbeat_ms: None,
    }
}

fn dependencies_met() -> Event {
    Event::DependenciesMet {
        by: "runner of a dependency".to_string(),
    }
}

#[test]
fn a_run_with_dependencies_starts_only_once_they_are_met() {
    let waiting = Story::new(chain_spec(1)).then(depends_on(&[OTHER_RUN], &[]));
    assert!(waiting.state.is_waiting_for_dependencies());
    assert!(waiting.state.is_waiting());
    assert!(matches!(
        waiting.rejects(runner_started("i1")),
        TransitionError::BeforeDependencies { .. }
    ));
    let met = waiting.then(dependencies_met());
    assert!(!met.state.is_waiting());
    let started = met.then(runner_started("i1"));
    assert_eq!(started.state.status, RunStatus::Running);
}

#[test]
fn a_queued_run_with_dependencies_takes_no_slot_and_joins_the_waiting_runs_only_once_met() {
    let waiting = Story::new(chain_spec(1))
        .then(joined("q"))
        .then(depends_on(&[OTHER_RUN], &[]));
    assert!(
        !waiting.state.is_waiting_for_slot(),
        "not among the queue's waiting runs yet"
    );
    assert!(matches!(
        waiting.rejects(admitted()),
        TransitionError::BeforeDependencies { .. }
    ));
    let met = waiting.then(dependencies_met());
    assert!(met.state.is_waiting_for_slot());
    let admitted = met.then(admitted());
    assert!(admitted.state.holds_slot());
}

#[test]
fn dependencies_are_recorded_only_at_creation_and_never_name_the_run_itself() {
    let queued = Story::new(chain_spec(1));
    assert!(matches!(
        queued.rejects(depends_on(&[RUN], &[])),
        TransitionError::InvalidDependencies { .. }
    ));
    assert!(matches!(
        queued.rejects(depends_on(&[], &[])),
        TransitionError::InvalidDependencies { .. }
    ));
    let late = queued.then(dismissed());
    assert!(matches!(
        late.rejects(depends_on(&[OTHER_RUN], &[])),
        TransitionError::DependsOnLate { .. }
    ));
}

#[test]
fn a_run_waiting_for_dependencies_ends_with_its_steps_skipped() {
    let ended = Story::new(chain_spec(2))
        .then(depends_on(&[OTHER_RUN], &[]))
        .then(terminal(TerminalState::Failed, Some("dependency failed")));
    assert!(!ended.state.is_waiting());
    assert!(
        ended
            .state
            .steps
            .iter()
            .all(|step| step.status == StepStatus::Skipped)
    );
}

fn steer(id: &str, steps: &[u32]) -> Event {
    kit::steer_requested(id, steps, "look at the tests first")
}

/// A running chain of one step with `count` steer requests waiting for it.
fn full_of_steers(count: usize) -> Story {
    (0..count).fold(
        Story::running(chain_spec(1)).then(step_running(0)),
        |story, index| story.then(steer(&format!("s{index}"), &[0])),
    )
}

/// A running chain whose one step took every steer request a run may have.
fn steered_to_the_limit() -> Story {
    (0..MAX_STEERS_PER_RUN).fold(
        Story::running(chain_spec(1)).then(step_running(0)),
        |story, index| {
            let id = format!("s{index}");
            story
                .then(steer(&id, &[0]))
                .then(kit::steer_delivered(&id, 0))
        },
    )
}

/// A change to a state that breaks one shape rule.
type Breach = Box<dyn Fn(&mut RunState)>;

/// A state the reducer made, and the same state with `rule`, and only it, broken.
/// Exhaustive: a new rule does not compile until it has a way to be broken.
fn broken_alone(rule: ShapeRule) -> (RunState, RunState) {
    let queued = Story::new(chain_spec(2)).state;
    let running = Story::running(chain_spec(2)).then(step_running(0)).state;
    let complete = Story::running(chain_spec(1))
        .then(step_running(0))
        .then(step_finished(0, StepEnd::Complete))
        .then(terminal(TerminalState::Complete, None))
        .state;
    let failed_and_closed = Story::running(chain_spec(2))
        .then(step_running(0))
        .then(step_finished(0, StepEnd::Failed))
        .then(terminal(TerminalState::Failed, Some("step 0 failed")))
        .then(process_terminal("i1", Proof::Observed))
        .state;
    let parallel = Story::running(parallel_spec(1, 2))
        .then(step_running(0))
        .state;
    let stop_requested = Story::running(chain_spec(1))
        .then(control(ControlAction::Stop))
        .state;
    let job = running_job().state;
    let admitted_waiting = Story::new(chain_spec(1))
        .then(joined("q"))
        .then(admitted())
        .state;
    let running_in_queue = Story::new(chain_spec(1))
        .then(joined("q"))
        .then(admitted())
        .then(runner_started("i1"))
        .state;
    let hook_failing = ended()
        .then(hook_attempted(0, 1))
        .then(hook_ended(0, 1, hook_failed(), Some(time_of(9))))
        .state;
    let hook_delivered = ended()
        .then(hook_attempted(0, 1))
        .then(hook_ended(0, 1, crate::event::HookOutcome::Delivered, None))
        .state;
    let steered = Story::running(chain_spec(2))
        .then(step_running(0))
        .then(steer("s0", &[0, 1]))
        .then(kit::steer_delivered("s0", 0))
        .state;
    let waiting_for_dependencies = Story::new(chain_spec(1))
        .then(joined("q"))
        .then(depends_on(&[OTHER_RUN], &[]))
        .state;
    let (base, change): (RunState, Breach) = match rule {
        ShapeRule::DependenciesWellFormed => (
            waiting_for_dependencies,
            Box::new(|state| {
                if let Some(dependencies) = &mut state.dependencies {
                    dependencies.after.push(state.run_id);
                }
            }),
        ),
        ShapeRule::DependenciesAtCreation => {
            let base = Story::new(chain_spec(1))
                .then(depends_on(&[OTHER_RUN], &[]))
                .state;
            (base, Box::new(|state| state.head_seq = 1))
        }
        ShapeRule::NothingStartedBeforeDependencies => (
            waiting_for_dependencies,
            Box::new(|state| {
                if let Some(queue) = &mut state.queue {
                    queue.admitted = Some(crate::state::AdmissionInfo {
                        by: "x".to_string(),
                        at_ms: 1,
                    });
                }
            }),
        ),
        ShapeRule::HooksOnlyAfterEnd => {
            let hooks = hook_failing.hooks.clone();
            (running, Box::new(move |state| state.hooks = hooks.clone()))
        }
        ShapeRule::HooksInOrder => (
            hook_failing,
            Box::new(|state| state.hooks.push(state.hooks[0].clone())),
        ),
        ShapeRule::HookAttemptsCounted => {
            (hook_failing, Box::new(|state| state.hooks[0].attempts = 3))
        }
        ShapeRule::HookNoClaimOnceSettled => (
            hook_delivered,
            Box::new(|state| {
                let hook = &mut state.hooks[0];
                hook.attempts = 2;
                hook.claim = Some(HookClaim {
                    attempt: 2,
                    claimant: runner_identity(),
                    by: "runner".to_string(),
                    lease_ms: 60_000,
                    at_ms: time_of(9),
                });
            }),
        ),
        ShapeRule::HookRetryFits => (
            hook_delivered,
            Box::new(|state| {
                if let Some(last) = &mut state.hooks[0].last {
                    last.retry_at_ms = Some(time_of(9));
                }
            }),
        ),
        ShapeRule::StepStopsDistinct => (
            Story::running(chain_spec(2)).then(step_stop(1)).state,
            Box::new(|state| state.step_stops.push(state.step_stops[0].clone())),
        ),
        ShapeRule::SteerWellFormed => (
            steered,
            Box::new(|state| state.steers[0].targets[1].step = 0),
        ),
        ShapeRule::SteerIdsDistinct => (
            steered,
            Box::new(|state| {
                let mut again = state.steers[0].clone();
                again.targets = vec![SteerTarget {
                    step: 1,
                    delivery: SteerDelivery::Undelivered {
                        at_ms: time_of(9),
                        why: Undelivered::StepEnded,
                    },
                }];
                state.steers.push(again);
            }),
        ),
        ShapeRule::SteerQueueBounded => (
            steered,
            Box::new(|state| {
                for index in 0..MAX_PENDING_STEERS {
                    let mut more = state.steers[0].clone();
                    more.id = format!("more-{index}");
                    state.steers.push(more);
                }
            }),
        ),
        ShapeRule::SteerWaitsOnlyForOpenStep => (
            steered,
            Box::new(|state| {
                state.steers[0].targets[0].delivery = SteerDelivery::Queued;
                state.steps[0].status = StepStatus::Complete;
                state.steps[0].ended_at_ms = Some(time_of(9));
                state.steps[1].status = StepStatus::Running;
                state.steps[1].started_at_ms = Some(time_of(9));
            }),
        ),
        ShapeRule::SteerDeliveredOnlyToStartedStep => (
            steered,
            Box::new(|state| {
                state.steers[0].targets[1].delivery = SteerDelivery::Delivered { at_ms: 9 };
            }),
        ),
        ShapeRule::QueueNameValid => (
            admitted_waiting,
            Box::new(|state| {
                if let Some(queue) = &mut state.queue {
                    queue.name = "a b".to_string();
                }
            }),
        ),
        ShapeRule::RunnerOnlyAfterAdmission => (
            running_in_queue,
            Box::new(|state| {
                if let Some(queue) = &mut state.queue {
                    queue.admitted = None;
                }
            }),
        ),
        ShapeRule::QueueJoinedAtCreation => {
            (admitted_waiting, Box::new(|state| state.head_seq = 1))
        }
        ShapeRule::RunnerOnlyAfterDue => (
            Story::new(chain_spec(2))
                .then(delayed(time_of(3)))
                .then(delay_ended())
                .then(runner_started("i1"))
                .state,
            Box::new(|state| {
                if let Some(delay) = &mut state.delay {
                    delay.ended = None;
                }
            }),
        ),
        ShapeRule::DelayedAtCreation => (
            Story::new(chain_spec(2)).then(delayed(time_of(9))).state,
            Box::new(|state| state.head_seq = 1),
        ),
        ShapeRule::RetryPolicyWellFormed => (
            retried(1).state,
            Box::new(|state| {
                if let Some(retry) = &mut state.retry {
                    retry.retries = 0;
                }
            }),
        ),
        ShapeRule::AttemptsCounted => (
            retried(1).then(attempt_ended(1)).state,
            Box::new(|state| {
                if let Some(retry) = &mut state.retry {
                    retry.attempts[0].attempt = 2;
                }
            }),
        ),
        ShapeRule::DelayEndedWhenDue => (
            Story::new(chain_spec(2))
                .then(delayed(time_of(3)))
                .then(delay_ended())
                .state,
            Box::new(|state| {
                if let Some(delay) = &mut state.delay {
                    delay.due_at_ms = time_of(4);
                }
            }),
        ),
        ShapeRule::SpecChecks => (
            queued,
            Box::new(|state| state.spec = Arc::new(parallel_spec(0, 2))),
        ),
        ShapeRule::StepPerSpecStep => (
            queued,
            Box::new(|state| {
                state.steps.pop();
            }),
        ),
        ShapeRule::HasHead => (queued, Box::new(|state| state.head_seq = 0)),
        ShapeRule::TextsWithinLimits => (
            running,
            Box::new(|state| state.session_id = Some("x".repeat(MAX_TEXT_BYTES + 1))),
        ),
        ShapeRule::TerminalHasEnd => (complete, Box::new(|state| state.terminal = None)),
        ShapeRule::EndOnlyWhenTerminal => {
            let end = failed_and_closed.terminal.clone();
            (running, Box::new(move |state| state.terminal = end.clone()))
        }
        ShapeRule::EndAgreesWithStatus => (
            failed_and_closed,
            Box::new(|state| state.status = RunStatus::Stopped),
        ),
        ShapeRule::RunningHasRunner => (running, Box::new(|state| state.runner = None)),
        ShapeRule::QueuedHasNoRunner => {
            let runner = running.runner.clone();
            (queued, Box::new(move |state| state.runner = runner.clone()))
        }
        ShapeRule::StepRunsOnlyInRunningRun => (
            queued,
            Box::new(|state| state.steps[0].status = StepStatus::Running),
        ),
        ShapeRule::QueuedHasNoStartedStep => (
            queued,
            Box::new(|state| state.steps[0].started_at_ms = Some(CREATED_AT_MS)),
        ),
        ShapeRule::TerminalLeavesNoPendingStep => (
            failed_and_closed,
            Box::new(|state| state.steps[1].status = StepStatus::Pending),
        ),
        ShapeRule::CompleteHasEveryStepComplete => (
            complete,
            Box::new(|state| state.steps[0].status = StepStatus::Failed),
        ),
        ShapeRule::PendingStepUntouched => (
            running,
            Box::new(|state| state.steps[1].exit_code = Some(0)),
        ),
        // What fuzzing found beside the NaN progress: a running step with an end time and an
        // exit code.
        ShapeRule::RunningStepStartedNotEnded => (
            running,
            Box::new(|state| {
                state.steps[0].ended_at_ms = Some(time_of(9));
                state.steps[0].exit_code = Some(1);
            }),
        ),
        ShapeRule::RanStepStartedAndEnded => (
            complete,
            Box::new(|state| state.steps[0].ended_at_ms = None),
        ),
        ShapeRule::SkippedStepNeverStarted => (
            failed_and_closed,
            Box::new(|state| state.steps[1].started_at_ms = Some(time_of(9))),
        ),
        ShapeRule::JobOnlyOnExternalJobStep => {
            let (status, at) = (job.steps[0].job.clone(), job.steps[0].job_updated_at_ms);
            (
                running,
                Box::new(move |state| {
                    state.steps[0].job = status.clone();
                    state.steps[0].job_updated_at_ms = at;
                }),
            )
        }
        ShapeRule::JobHasItsTime => (
            job,
            Box::new(|state| state.steps[0].job_updated_at_ms = None),
        ),
        // What fuzzing found: a running external job whose progress is NaN.
        ShapeRule::JobProgressFinite => (
            job,
            Box::new(|state| {
                if let Some(job) = &mut state.steps[0].job {
                    job.progress = Some(f64::NAN);
                }
            }),
        ),
        ShapeRule::ChainStepsInOrder => (
            running,
            Box::new(|state| {
                let step = &mut state.steps[1];
                step.status = StepStatus::Complete;
                step.started_at_ms = Some(time_of(8));
                step.ended_at_ms = Some(time_of(9));
            }),
        ),
        ShapeRule::ParallelWithinConcurrency => (
            parallel,
            Box::new(|state| state.steps[1] = state.steps[0].clone()),
        ),
        ShapeRule::ControlActionsDistinct => (
            stop_requested,
            Box::new(|state| state.controls.push(state.controls[0].clone())),
        ),
        ShapeRule::ProcessTerminalOfTheRunner => (
            failed_and_closed,
            Box::new(|state| {
                if let Some(observed) = &mut state.process_terminal {
                    observed.instance_id = "i2".to_string();
                }
            }),
        ),
        ShapeRule::ProcessTerminalProofFitsRunner => (
            failed_and_closed,
            Box::new(|state| {
                if let Some(observed) = &mut state.process_terminal {
                    observed.proof = Proof::NotStarted;
                }
            }),
        ),
    };
    let mut broken = base.clone();
    change(&mut broken);
    (base, broken)
}

#[test]
fn check_shape_refuses_every_shape_rule_broken_alone_on_a_reducers_state() {
    for rule in ShapeRule::ALL {
        let (base, broken) = broken_alone(rule);
        assert_eq!(base.check_shape(), Ok(()), "{rule:?}: the reducer's state");
        assert!(rule.check(&base).is_ok(), "{rule:?}");
        let error = broken.check_shape().expect_err("a broken rule is refused");
        assert_eq!(error.rule(), rule, "{rule:?} alone is broken: {error}");
        assert!(
            rule.check(&broken).is_err(),
            "{rule:?} judges its own breach"
        );
        if let ShapeError::Broken(_) = error {
            assert_eq!(error.to_string(), rule.broken_text());
        }
    }
}

#[test]
fn every_reducer_rule_names_its_shape_rules_or_why_a_state_cannot_show_it() {
    let refusals = every_kind_of_refusal();
    let mut seen = [false; TRANSITION_KINDS];
    for refusal in &refusals {
        seen[transition_kind(refusal)] = true;
        match refusal.kept_in_state() {
            KeptInState::Rules(rules) => {
                assert!(!rules.is_empty(), "{refusal:?}");
                for rule in rules {
                    assert!(ShapeRule::ALL.contains(rule), "{rule:?} is checked");
                    let (_, broken) = broken_alone(*rule);
                    assert_eq!(
                        broken.check_shape().map_err(|error| error.rule()),
                        Err(*rule),
                        "{refusal}: a state breaking {rule:?} is refused"
                    );
                }
            }
            KeptInState::RecordsOnly(why) => assert!(!why.is_empty(), "{refusal:?}"),
        }
    }
    let missing: Vec<usize> = (0..TRANSITION_KINDS).filter(|kind| !seen[*kind]).collect();
    assert!(missing.is_empty(), "kinds without an example: {missing:?}");
}

/// The snapshot fuzzing found: a running external job with a NaN progress, in a run whose
/// other step is running with an end time and an exit code. Each defect alone is refused.
#[test]
fn a_nan_progress_and_a_running_step_that_ended_are_refused_as_shapes() {
    let (_, nan) = broken_alone(ShapeRule::JobProgressFinite);
    assert_eq!(
        nan.check_shape().map_err(|error| error.rule()),
        Err(ShapeRule::JobProgressFinite)
    );
    let (_, ended) = broken_alone(ShapeRule::RunningStepStartedNotEnded);
    assert_eq!(
        ended.check_shape().map_err(|error| error.rule()),
        Err(ShapeRule::RunningStepStartedNotEnded)
    );
}

/// What fuzzing `fold_events` found: a run admitted to its queue at a time before it joined
/// (the admitting writer's clock was behind the creating one's). The reducer takes each
/// record's time as given, so it accepts that; the shape check once refused it, so the
/// reducer made a state its own snapshot check called impossible. The fuzz input is kept as
/// `fuzz/corpus/fold_events/queue_admitted_before_it_joined_by_the_clock`, which
/// `tests/it/fuzz_corpus.rs` replays.
#[test]
fn queue_admitted_before_it_joined_by_the_clock() {
    let created = Story::new(chain_spec(1)).then(joined("q"));
    let mut admitted = created.next(admitted());
    admitted.time_ms = created.state.queue.as_ref().expect("queued").joined_at_ms - 1_000;
    let state = apply(Some(&created.state), &admitted).expect("a clock behind is no refusal");
    assert_eq!(state.check_shape(), Ok(()));
}
