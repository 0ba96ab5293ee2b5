//! Model-based test of the journal (proptest-state-machine).
//!
//! The system under test is a real [`Journal`] on a temporary redb file, driven through the
//! library only: appends of any of the nine events, legal or not, with and without
//! `expect_head` / `expect_not_terminal` (right and wrong); batches of a writer of the test's
//! own, committed and then committed again under the same writer seqs, as the writer thread
//! retries a group after a reopen; the journal dropped and opened again; and reconcile passes
//! (through a [`Store`] on the same home) over runs whose runners are dead, alive, or of
//! another boot.
//!
//! The reference model is a plain list of accepted records per run, folded by
//! [`state::replay`]. It predicts every answer (accepted with which seqs, a duplicate, or which
//! refusal), and after every step the journal must hold exactly the model's records, each
//! run's snapshot must equal their fold, the indexes (active, terminal, aliases, log, writer
//! marks) must be what the records imply, per-run and global seqs must be gap-free, and a step
//! the model says writes nothing must leave everything readable unchanged.
//!
//! The model cannot know the clock: it takes each batch's `time_ms`, the handle's writer seqs
//! and the text of the reconciler's reasons from the journal, after checking everything else
//! about those records.
//!
//! `RUNJOURNAL_MODEL_CASES` (default 64) and `RUNJOURNAL_MODEL_STEPS` (default 50) scale it.

use std::collections::BTreeMap;
use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use proptest::prelude::*;
use proptest::sample::select;
use proptest::strategy::Union;
use proptest::test_runner::Config;
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest, prop_state_machine};

use runjournal::event::{
    ControlAction, Event, ExternalJobStatus, FORMAT_VERSION, JobState, MAX_TEXT_BYTES, Mode,
    Observer, ProcessExit, ProcessIdentity, Proof, Record, Repairer, RunSpec, StepAction, StepEnd,
    StepOutcome, StepSpec, TerminalState, UnixMs, WriterId,
};
use runjournal::journal::{AppendError, Appended, Batch, View, name_alias, tool_call_alias};
use runjournal::reconcile::{self, Action, Inputs, RunnerLiveness};
use runjournal::state::{self, RunState, RunStatus, StepStatus, TransitionError};
use runjournal::store::{Store, StoreOptions};
use runjournal::{Condition, Home, Journal, RunId, liveness};

/// Runs the model knows; each is a fixed id, so a step names its run without depending on
/// earlier steps (deleting steps while shrinking keeps the rest meaningful).
const SLOTS: usize = 6;

/// The test's own writer, whose batches it commits (and commits again) itself.
const TEST_WRITER: WriterId = WriterId(0x7e57_7e57_7e57_7e57);

/// Time stamped on the test writer's batches (plus their writer seq).
const TEST_BATCH_TIME_MS: UnixMs = 1_750_000_000_000;

/// `created_at_ms` of a run created long ago: past the reconciler's start grace.
const ANCIENT_MS: UnixMs = 1_000_000;
/// `created_at_ms` in the far future: within the start grace, whatever the clock says.
const FUTURE_MS: UnixMs = 4_000_000_000_000;

fn run_id(slot: usize) -> RunId {
    RunId::from_bytes([slot as u8 + 1; 16])
}

fn slot_of(run: RunId) -> usize {
    (0..SLOTS)
        .find(|&slot| run_id(slot) == run)
        .expect("every run of the test is one of its slots")
}

fn env_number(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(text) => text
            .parse()
            .unwrap_or_else(|_| panic!("{name}={text:?} is not a number")),
        Err(_) => default,
    }
}

// ---------------------------------------------------------------------------------------------
// Runners and step processes
// ---------------------------------------------------------------------------------------------

struct Identities {
    /// A process that has exited (and been reaped): the reconciler finds it dead.
    dead: ProcessIdentity,
    /// This test process.
    alive: ProcessIdentity,
    /// A process of another boot.
    other_boot: ProcessIdentity,
}

fn identities() -> &'static Identities {
    static IDENTITIES: OnceLock<Identities> = OnceLock::new();
    IDENTITIES.get_or_init(|| {
        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("`true` starts");
        let dead = liveness::identity_of(child.id())
            .expect("/proc reads")
            .expect("the child is in /proc until it is reaped");
        child.wait().expect("the child is reaped");
        Identities {
            dead,
            alive: liveness::current().expect("this process is in /proc"),
            other_boot: ProcessIdentity {
                pid: 4242,
                start_time: 17,
                boot_id: "another-boot".to_string(),
                pid_namespace: None,
            },
        }
    })
}

fn runner_pool() -> [ProcessIdentity; 3] {
    let ids = identities();
    [ids.dead.clone(), ids.other_boot.clone(), ids.alive.clone()]
}

/// The process of a running step. It is of another boot, so a reconciler that ends a dead
/// runner's orphaned steps never signals anything on this machine.
fn step_process() -> ProcessIdentity {
    ProcessIdentity {
        pid: 4343,
        start_time: 18,
        boot_id: "another-boot".to_string(),
        pid_namespace: None,
    }
}

/// What the reconciler will find of a run's runner (the model knows which identity it is).
fn liveness_of(state: &RunState) -> RunnerLiveness {
    let Some(runner) = &state.runner else {
        return RunnerLiveness::None;
    };
    let ids = identities();
    if runner.identity == ids.dead {
        RunnerLiveness::Dead
    } else if runner.identity == ids.alive {
        RunnerLiveness::Alive
    } else if runner.identity == ids.other_boot {
        RunnerLiveness::OtherBoot
    } else {
        panic!("runner {:?} is not one of the test's", runner.identity)
    }
}

// ---------------------------------------------------------------------------------------------
// Events
// ---------------------------------------------------------------------------------------------

fn command(name: &str) -> StepSpec {
    StepSpec {
        name: name.to_string(),
        action: StepAction::Command {
            argv: vec!["make".to_string(), name.to_string()],
        },
    }
}

fn shell(name: &str) -> StepSpec {
    StepSpec {
        name: name.to_string(),
        action: StepAction::Shell {
            script: format!("echo {name}"),
        },
    }
}

fn external(name: &str) -> StepSpec {
    StepSpec {
        name: name.to_string(),
        action: StepAction::ExternalJob {
            provider: "render-farm".to_string(),
        },
    }
}

/// Specs of every mode, named and unnamed (two share a name, so the later run takes the
/// alias), and one that `RunSpec::check` refuses.
fn spec_pool() -> [RunSpec; 5] {
    let spec = |name: Option<&str>, mode, concurrency, steps| RunSpec {
        name: name.map(str::to_string),
        mode,
        concurrency,
        timeout_ms: None,
        cwd: None,
        steps,
    };
    [
        spec(Some("nightly"), Mode::Single, 1, vec![command("build")]),
        spec(
            Some("deploy"),
            Mode::Chain,
            1,
            vec![command("fetch"), shell("build"), external("ship")],
        ),
        spec(
            None,
            Mode::Parallel,
            2,
            vec![external("render"), shell("test"), command("lint")],
        ),
        spec(
            Some("nightly"),
            Mode::Chain,
            1,
            vec![external("wait"), command("report")],
        ),
        spec(None, Mode::Chain, 1, vec![]),
    ]
}

fn created(spec_index: usize, created_at_ms: UnixMs, tool_call: Option<u8>) -> Event {
    Event::RunCreated {
        spec: Arc::new(spec_pool()[spec_index].clone()),
        created_at_ms,
        session_id: tool_call.map(|_| "session-1".to_string()),
        completion_owner_id: None,
        tool_call_id: tool_call.map(|call| format!("call-{call}")),
    }
}

fn arb_created() -> BoxedStrategy<Event> {
    (
        prop_oneof![9 => 0..4usize, 1 => Just(4usize)],
        prop_oneof![Just(ANCIENT_MS), Just(FUTURE_MS)],
        proptest::option::of(0..2u8),
    )
        .prop_map(|(spec, created_at_ms, tool_call)| created(spec, created_at_ms, tool_call))
        .boxed()
}

/// Short text, and rarely one over the limit.
fn arb_text() -> BoxedStrategy<String> {
    prop_oneof![
        20 => Just("r".to_string()),
        1 => Just("x".repeat(MAX_TEXT_BYTES + 1)),
    ]
    .boxed()
}

fn arb_instance() -> BoxedStrategy<String> {
    prop_oneof![
        Just("runner-a".to_string()),
        Just("runner-b".to_string()),
        Just(String::new()),
    ]
    .boxed()
}

fn arb_job() -> BoxedStrategy<ExternalJobStatus> {
    let state = prop_oneof![
        Just(JobState::Queued),
        Just(JobState::Running),
        Just(JobState::Succeeded),
        Just(JobState::Failed),
        Just(JobState::Cancelled),
    ];
    // Infinity is refused by the reducer, and unlike NaN it equals itself.
    let progress = prop_oneof![Just(None), Just(Some(0.5)), Just(Some(f64::INFINITY)),];
    (state, progress, proptest::option::of(Just("m".to_string())))
        .prop_map(|(state, progress, message)| ExternalJobStatus {
            state,
            id: Some("job-1".to_string()),
            progress,
            message,
            url: None,
        })
        .boxed()
}

/// Any of the nine events, with small step indexes and small pools of values.
fn arb_event() -> BoxedStrategy<Event> {
    let started =
        (0..3usize, arb_instance()).prop_map(|(runner, instance_id)| Event::RunnerStarted {
            runner: runner_pool()[runner].clone(),
            instance_id,
        });
    let step_running =
        (0..4u32, any::<bool>()).prop_map(|(step, has_process)| Event::StepRunning {
            step,
            process: has_process.then(step_process),
        });
    let job_updated =
        (0..4u32, arb_job()).prop_map(|(step, job)| Event::ExternalJobUpdated { step, job });
    let end = prop_oneof![
        Just(StepEnd::Complete),
        Just(StepEnd::Failed),
        Just(StepEnd::Stopped),
        Just(StepEnd::Skipped),
    ];
    let step_finished = (
        0..4u32,
        end,
        proptest::option::of(0..2i32),
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
    let control = (action, arb_text()).prop_map(|(action, reason)| Event::ControlRequested {
        action,
        by: "model".to_string(),
        reason,
    });
    let terminal_state = prop_oneof![
        Just(TerminalState::Complete),
        Just(TerminalState::Failed),
        Just(TerminalState::Stopped),
        Just(TerminalState::Paused),
    ];
    let repairer = prop_oneof![Just(Repairer::Reconciler), Just(Repairer::Launcher)];
    let terminal = (
        terminal_state,
        proptest::option::of(Just("e".to_string())),
        arb_text(),
        0..2i32,
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
    let exit = proptest::option::of(Just(ProcessExit {
        code: Some(0),
        signal: None,
    }));
    let observed =
        (arb_instance(), exit, proof, observer).prop_map(|(instance_id, exit, proof, observer)| {
            Event::ProcessTerminalObserved {
                instance_id,
                exit,
                proof,
                observer,
            }
        });
    let dismissed = (0..3u64).prop_map(|at_ms| Event::Dismissed { at_ms });
    prop_oneof![
        arb_created(),
        started,
        step_running,
        job_updated,
        step_finished,
        control,
        terminal,
        observed,
        dismissed,
    ]
    .boxed()
}

/// The event that takes a run one step further along a successful life; `variant` picks
/// among equally good choices (which runner, which spec, whether a step has a process).
fn happy_next(state: Option<&RunState>, variant: u8) -> Option<Event> {
    let Some(state) = state else {
        let created_at_ms = if variant & 4 == 0 {
            ANCIENT_MS
        } else {
            FUTURE_MS
        };
        return Some(created(
            usize::from(variant % 4),
            created_at_ms,
            (variant & 8 != 0).then_some(variant % 2),
        ));
    };
    let instance = |state: &RunState| {
        state
            .runner
            .as_ref()
            .map(|runner| runner.instance_id.clone())
    };
    match state.status {
        RunStatus::Queued if state.process_terminal.is_some() => Some(Event::Terminal {
            state: TerminalState::Failed,
            error: Some("runner never started".to_string()),
            summary: "runner never started".to_string(),
            exit_code: 1,
            repaired_by: Some(Repairer::Launcher),
        }),
        RunStatus::Queued => Some(Event::RunnerStarted {
            runner: runner_pool()[usize::from(variant % 3)].clone(),
            instance_id: "runner-a".to_string(),
        }),
        RunStatus::Running => {
            let running = state
                .steps
                .iter()
                .position(|step| step.status == StepStatus::Running);
            let pending = state
                .steps
                .iter()
                .position(|step| step.status == StepStatus::Pending);
            if let Some(index) = running {
                let step = index as u32;
                let job = |job_state| Event::ExternalJobUpdated {
                    step,
                    job: ExternalJobStatus {
                        state: job_state,
                        id: Some("job-1".to_string()),
                        progress: Some(0.5),
                        message: None,
                        url: None,
                    },
                };
                let is_external = state.spec.steps[index].is_external_job();
                match &state.steps[index].job {
                    None if is_external => Some(job(JobState::Running)),
                    Some(status) if !status.state.is_terminal() => Some(job(JobState::Succeeded)),
                    _ => Some(Event::StepFinished {
                        step,
                        outcome: StepOutcome {
                            end: StepEnd::Complete,
                            exit_code: Some(0),
                            error: None,
                        },
                    }),
                }
            } else if let Some(index) = pending {
                Some(Event::StepRunning {
                    step: index as u32,
                    process: (variant & 1 == 0).then(step_process),
                })
            } else {
                Some(Event::Terminal {
                    state: TerminalState::Complete,
                    error: None,
                    summary: "done".to_string(),
                    exit_code: 0,
                    repaired_by: None,
                })
            }
        }
        _ if state.process_terminal.is_none() => Some(Event::ProcessTerminalObserved {
            instance_id: instance(state).unwrap_or_default(),
            exit: Some(ProcessExit {
                code: Some(0),
                signal: None,
            }),
            proof: if state.runner.is_some() {
                Proof::Observed
            } else {
                Proof::NotStarted
            },
            observer: Observer::RunnerParent,
        }),
        _ if state.dismissed_at_ms.is_none() => Some(Event::Dismissed { at_ms: 1 }),
        _ => None,
    }
}

/// Applies `event` as the next record of a run, for the model's own look-ahead.
fn look_ahead(state: Option<&RunState>, run: RunId, event: &Event) -> Option<RunState> {
    let record = Record {
        format_version: FORMAT_VERSION,
        run_id: run,
        seq: state.map_or(1, |state| state.head_seq + 1),
        time_ms: 0,
        writer: WriterId(0),
        writer_seq: 0,
        event: event.clone(),
    };
    state::apply(state, &record).ok()
}

/// Up to `len` events along a successful life (at least one: past its end, an illegal
/// second `Dismissed`).
fn happy_path(state: Option<RunState>, run: RunId, variant: u8, len: usize) -> Vec<Event> {
    let mut state = state;
    let mut events = Vec::new();
    while events.len() < len {
        let Some(event) = happy_next(state.as_ref(), variant) else {
            break;
        };
        state = look_ahead(state.as_ref(), run, &event);
        events.push(event);
        if state.is_none() {
            break;
        }
    }
    if events.is_empty() {
        events.push(Event::Dismissed { at_ms: 2 });
    }
    events
}

/// The events along a successful life that the run could take next, in every variant.
fn happy_choices(state: Option<&RunState>) -> Vec<Event> {
    let mut events: Vec<Event> = Vec::new();
    for variant in 0..16 {
        if let Some(event) = happy_next(state, variant)
            && !events.contains(&event)
        {
            events.push(event);
        }
    }
    if events.is_empty() {
        // Closed and dismissed: nothing is legal any more.
        events.push(Event::Dismissed { at_ms: 0 });
    }
    events
}

/// The ways a run's life goes wrong from where it is: failure, stop, pause, a control
/// request, a step failing, a runner seen gone early, a launcher giving up, a dismissal.
fn detours(state: Option<&RunState>) -> Vec<Event> {
    let mut events = vec![Event::Dismissed { at_ms: 0 }];
    let Some(state) = state else {
        return events;
    };
    if !state.is_terminal() {
        for (terminal_state, error) in [
            (TerminalState::Failed, Some("it broke")),
            (TerminalState::Stopped, Some("stopped")),
            (TerminalState::Paused, None),
        ] {
            events.push(Event::Terminal {
                state: terminal_state,
                error: error.map(str::to_string),
                summary: terminal_state.as_str().to_string(),
                exit_code: 1,
                repaired_by: None,
            });
        }
        events.push(Event::ControlRequested {
            action: ControlAction::Stop,
            by: "model".to_string(),
            reason: "enough".to_string(),
        });
    }
    if let Some(index) = state
        .steps
        .iter()
        .position(|step| step.status == StepStatus::Running)
    {
        events.push(Event::StepFinished {
            step: index as u32,
            outcome: StepOutcome {
                end: StepEnd::Failed,
                exit_code: Some(2),
                error: Some("exit 2".to_string()),
            },
        });
    }
    match (&state.runner, &state.process_terminal) {
        (Some(runner), None) => events.push(Event::ProcessTerminalObserved {
            instance_id: runner.instance_id.clone(),
            exit: Some(ProcessExit {
                code: None,
                signal: Some(9),
            }),
            proof: Proof::Observed,
            observer: Observer::Launcher,
        }),
        (None, None) => events.push(Event::ProcessTerminalObserved {
            instance_id: String::new(),
            exit: None,
            proof: Proof::NotStarted,
            observer: Observer::Launcher,
        }),
        (_, Some(_)) => {}
    }
    events
}

// ---------------------------------------------------------------------------------------------
// The reference model
// ---------------------------------------------------------------------------------------------

/// One step of a test case.
#[derive(Clone, Debug)]
enum Step {
    /// `Journal::append`, numbered by the handle's own writer.
    Append {
        slot: usize,
        events: Vec<Event>,
        condition: Condition,
    },
    /// New batches of the test's writer, committed in one write transaction.
    CommitGroup {
        batches: Vec<(usize, Vec<Event>, Condition)>,
    },
    /// Batches of the test's writer (committed or refused before) committed again in one
    /// transaction, under the writer seqs they had.
    Recommit { picks: Vec<usize> },
    /// Drop the journal and open it again.
    Reopen,
    /// Drop the journal, open a store on its home, reconcile once, and open the journal again.
    Reconcile,
}

/// How the journal must answer one batch.
#[derive(Clone, Debug, PartialEq)]
enum Outcome {
    Accepted { first_seq: u64, last_seq: u64 },
    Duplicate { first_seq: u64, last_seq: u64 },
    Refused(Refusal),
}

#[derive(Clone, Debug, PartialEq)]
enum Refusal {
    EmptyBatch,
    UnknownRun,
    HeadMismatch {
        expected: u64,
        found: u64,
    },
    AlreadyTerminal {
        state: RunStatus,
    },
    Transition {
        index: usize,
        source: TransitionError,
    },
    WriterSeqReused {
        writer_seq: u64,
    },
}

impl Outcome {
    fn writes(&self) -> bool {
        matches!(self, Outcome::Accepted { .. })
    }
}

/// A repair the reconciler must make: the row that decides the run, and the events it appends
/// (the text of a `Terminal`'s reason is left empty: the journal's is taken).
#[derive(Clone, Debug)]
struct Repair {
    run: RunId,
    row: &'static str,
    events: Vec<Event>,
}

/// What the last step must have done.
#[derive(Clone, Debug)]
enum Expected {
    Nothing,
    /// Each batch with its answer. A batch of `Step::Append` goes through `Journal::append`:
    /// its writer id, writer seq and time are then the handle's, not those of the batch.
    Batches {
        answers: Vec<(Batch, Outcome)>,
    },
    Reopened,
    Reconciled(Vec<Repair>),
}

impl Expected {
    fn writes(&self) -> bool {
        match self {
            Expected::Nothing | Expected::Reopened => false,
            Expected::Batches { answers } => answers.iter().any(|(_, outcome)| outcome.writes()),
            Expected::Reconciled(repairs) => repairs.iter().any(|repair| !repair.events.is_empty()),
        }
    }
}

#[derive(Clone, Debug)]
struct TestBatch {
    batch: Batch,
    /// The seqs it was committed at.
    committed: Option<(u64, u64)>,
}

/// The reference: each run's state as the fold of the records the model accepted (with
/// placeholder times), the test writer's batches and mark, and the expected answer of the last
/// step.
#[derive(Clone, Debug)]
struct Model {
    runs: Vec<Option<RunState>>,
    test_batches: Vec<TestBatch>,
    test_mark: Option<u64>,
    expected: Expected,
}

impl Model {
    /// Predicts the answer to one batch, as DESIGN.md section 4 and docs/journal-format.md
    /// describe an append, and takes its records if it is accepted.
    fn commit(&mut self, batch: &Batch, is_test_writer: bool) -> Outcome {
        if batch.events.is_empty() {
            return Outcome::Refused(Refusal::EmptyBatch);
        }
        if is_test_writer && self.test_mark.is_some_and(|mark| batch.writer_seq <= mark) {
            let committed = self
                .test_batches
                .iter()
                .find(|test| test.batch.writer_seq == batch.writer_seq)
                .and_then(|test| test.committed);
            return match committed {
                Some((first_seq, last_seq)) => Outcome::Duplicate {
                    first_seq,
                    last_seq,
                },
                None => Outcome::Refused(Refusal::WriterSeqReused {
                    writer_seq: batch.writer_seq,
                }),
            };
        }
        let slot = slot_of(batch.run);
        let before = self.runs[slot].clone();
        let head = before.as_ref().map_or(0, |state| state.head_seq);
        if before.is_none() && !matches!(batch.events[0], Event::RunCreated { .. }) {
            return Outcome::Refused(Refusal::UnknownRun);
        }
        if let Some(expected) = batch.condition.expect_head.filter(|&e| e != head) {
            return Outcome::Refused(Refusal::HeadMismatch {
                expected,
                found: head,
            });
        }
        if let Some(state) = before.as_ref().filter(|state| state.is_terminal())
            && batch.condition.expect_not_terminal
        {
            return Outcome::Refused(Refusal::AlreadyTerminal {
                state: state.status,
            });
        }
        let mut state = before;
        for (index, event) in batch.events.iter().enumerate() {
            let record = Record {
                format_version: FORMAT_VERSION,
                run_id: batch.run,
                seq: head + 1 + index as u64,
                time_ms: batch.time_ms,
                writer: batch.writer,
                writer_seq: batch.writer_seq,
                event: event.clone(),
            };
            match state::apply(state.as_ref(), &record) {
                Ok(next) => state = Some(next),
                Err(source) => return Outcome::Refused(Refusal::Transition { index, source }),
            }
        }
        self.runs[slot] = state;
        if is_test_writer {
            self.test_mark = Some(batch.writer_seq);
        }
        Outcome::Accepted {
            first_seq: head + 1,
            last_seq: head + batch.events.len() as u64,
        }
    }

    /// Commits test-writer batches in one transaction: by index into `test_batches`.
    fn commit_test_batches(&mut self, indexes: &[usize]) -> Vec<(Batch, Outcome)> {
        indexes
            .iter()
            .map(|&index| {
                let batch = self.test_batches[index].batch.clone();
                let outcome = self.commit(&batch, true);
                if let Outcome::Accepted {
                    first_seq,
                    last_seq,
                } = outcome
                {
                    self.test_batches[index].committed = Some((first_seq, last_seq));
                }
                (batch, outcome)
            })
            .collect()
    }

    /// The repairs of one reconcile pass: for each run not closed, in id order, the row of
    /// the decision table its facts select, and that row's events.
    fn reconcile(&mut self) -> Vec<Repair> {
        let mut repairs = Vec::new();
        for slot in 0..SLOTS {
            let Some(state) = self.runs[slot].clone() else {
                continue;
            };
            if state.is_closed() {
                continue;
            }
            assert!(
                [ANCIENT_MS, FUTURE_MS].contains(&state.created_at_ms),
                "the model creates runs long ago or in the future only"
            );
            let inputs = Inputs {
                is_terminal: state.is_terminal(),
                is_process_observed: state.process_terminal.is_some(),
                runner: liveness_of(&state),
                is_past_start_grace: state.created_at_ms == ANCIENT_MS,
            };
            let row = reconcile::decide(&inputs);
            let failed = Event::Terminal {
                state: TerminalState::Failed,
                error: Some(String::new()),
                summary: String::new(),
                exit_code: 1,
                repaired_by: Some(Repairer::Reconciler),
            };
            let gone = |proof| Event::ProcessTerminalObserved {
                instance_id: state
                    .runner
                    .as_ref()
                    .map(|runner| runner.instance_id.clone())
                    .unwrap_or_default(),
                exit: None,
                proof,
                observer: Observer::Reconciler,
            };
            let events = match row.action {
                Action::Nothing => vec![],
                Action::FailRunnerDied | Action::FailHostRestarted => {
                    vec![failed, gone(Proof::Unknown)]
                }
                Action::FailAfterObservedExit => vec![failed],
                Action::FailNeverStarted if state.process_terminal.is_some() => vec![failed],
                Action::FailNeverStarted => vec![failed, gone(Proof::NotStarted)],
                Action::ObserveGone => vec![gone(Proof::Unknown)],
                Action::ObserveNeverStarted => vec![gone(Proof::NotStarted)],
            };
            if !events.is_empty() {
                let batch = Batch {
                    run: state.run_id,
                    events: events.clone(),
                    condition: Condition::expect_head(state.head_seq),
                    writer: WriterId(0),
                    writer_seq: 0,
                    time_ms: 0,
                };
                let outcome = self.commit(&batch, false);
                assert!(
                    outcome.writes(),
                    "row {} of the decision table makes a legal repair: {outcome:?}",
                    row.name
                );
            }
            repairs.push(Repair {
                run: state.run_id,
                row: row.name,
                events,
            });
        }
        repairs
    }
}

fn arb_condition(head: u64) -> BoxedStrategy<Condition> {
    prop_oneof![
        6 => Just(Condition::none()),
        3 => Just(Condition::expect_head(head)),
        1 => prop_oneof![Just(head + 1), Just(head.saturating_sub(1)), Just(0)]
            .prop_map(Condition::expect_head),
        1 => Just(Condition::expect_not_terminal()),
        1 => Just(Condition::expect_head(head).and_not_terminal()),
    ]
    .boxed()
}

fn arb_batch_events(state: Option<RunState>, run: RunId) -> BoxedStrategy<Vec<Event>> {
    let choices = happy_choices(state.as_ref());
    let detours = detours(state.as_ref());
    let happy = (1..=3usize, any::<u8>())
        .prop_map(move |(len, variant)| happy_path(state.clone(), run, variant, len));
    let mixed = proptest::collection::vec(
        prop_oneof![4 => select(choices), 2 => select(detours), 2 => arb_event()],
        1..=3,
    );
    prop_oneof![
        15 => happy,
        14 => mixed,
        1 => Just(Vec::new()),
    ]
    .boxed()
}

/// A batch for one of the runs, mostly for one that still has a life ahead.
fn arb_batch(model: &Model) -> BoxedStrategy<(usize, Vec<Event>, Condition)> {
    let per_slot = model
        .runs
        .iter()
        .enumerate()
        .map(|(slot, state)| {
            let weight = match state {
                Some(state) if state.is_closed() && state.dismissed_at_ms.is_some() => 1,
                Some(state) if state.is_closed() => 2,
                _ => 6,
            };
            let head = state.as_ref().map_or(0, |state| state.head_seq);
            let batch = (
                Just(slot),
                arb_batch_events(state.clone(), run_id(slot)),
                arb_condition(head),
            );
            (weight, batch.boxed())
        })
        .collect::<Vec<_>>();
    Union::new_weighted(per_slot).boxed()
}

struct JournalModel;

impl ReferenceStateMachine for JournalModel {
    type State = Model;
    type Transition = Step;

    fn init_state() -> BoxedStrategy<Model> {
        Just(Model {
            runs: vec![None; SLOTS],
            test_batches: Vec::new(),
            test_mark: None,
            expected: Expected::Nothing,
        })
        .boxed()
    }

    fn transitions(model: &Model) -> BoxedStrategy<Step> {
        let batch = arb_batch(model);
        let mut steps: Vec<(u32, BoxedStrategy<Step>)> = vec![
            (
                12,
                batch
                    .clone()
                    .prop_map(|(slot, events, condition)| Step::Append {
                        slot,
                        events,
                        condition,
                    })
                    .boxed(),
            ),
            (
                3,
                proptest::collection::vec(batch, 1..=3)
                    .prop_map(|batches| Step::CommitGroup { batches })
                    .boxed(),
            ),
            (1, Just(Step::Reopen).boxed()),
            (1, Just(Step::Reconcile).boxed()),
        ];
        if !model.test_batches.is_empty() {
            let count = model.test_batches.len();
            steps.push((
                3,
                proptest::collection::vec(0..count, 1..=3)
                    .prop_map(|picks| Step::Recommit { picks })
                    .boxed(),
            ));
        }
        Union::new_weighted(steps).boxed()
    }

    fn preconditions(model: &Model, step: &Step) -> bool {
        match step {
            Step::Recommit { .. } => !model.test_batches.is_empty(),
            _ => true,
        }
    }

    fn apply(mut model: Model, step: &Step) -> Model {
        model.expected = match step {
            Step::Append {
                slot,
                events,
                condition,
            } => {
                let batch = Batch {
                    run: run_id(*slot),
                    events: events.clone(),
                    condition: *condition,
                    writer: WriterId(0),
                    writer_seq: 0,
                    time_ms: 0,
                };
                let outcome = model.commit(&batch, false);
                Expected::Batches {
                    answers: vec![(batch, outcome)],
                }
            }
            Step::CommitGroup { batches } => {
                let mut indexes = Vec::new();
                for (slot, events, condition) in batches {
                    let writer_seq = model.test_batches.len() as u64 + 1;
                    indexes.push(model.test_batches.len());
                    model.test_batches.push(TestBatch {
                        batch: Batch {
                            run: run_id(*slot),
                            events: events.clone(),
                            condition: *condition,
                            writer: TEST_WRITER,
                            writer_seq,
                            time_ms: TEST_BATCH_TIME_MS + writer_seq,
                        },
                        committed: None,
                    });
                }
                Expected::Batches {
                    answers: model.commit_test_batches(&indexes),
                }
            }
            Step::Recommit { picks } => {
                let count = model.test_batches.len();
                let indexes: Vec<usize> = picks.iter().map(|pick| pick % count).collect();
                Expected::Batches {
                    answers: model.commit_test_batches(&indexes),
                }
            }
            Step::Reopen => Expected::Reopened,
            Step::Reconcile => Expected::Reconciled(model.reconcile()),
        };
        model
    }
}

// ---------------------------------------------------------------------------------------------
// The system under test
// ---------------------------------------------------------------------------------------------

/// The journal, and the model's records as the journal stamped them (times, the handle's
/// writer seqs, the reconciler's reasons): what the journal must hold exactly.
struct Sut {
    _dir: tempfile::TempDir,
    home: PathBuf,
    journal: Option<Journal>,
    journal_id: [u8; 16],
    records: BTreeMap<RunId, Vec<Record>>,
    /// Commit order across runs.
    log: Vec<(RunId, u64)>,
    aliases: BTreeMap<String, RunId>,
    marks: BTreeMap<WriterId, u64>,
}

/// Everything a reader can see of the journal, to show that a step wrote nothing.
#[derive(Debug, PartialEq)]
struct Contents {
    record_count: u64,
    global_head: u64,
    log: Vec<(u64, RunId, u64)>,
    snapshots: Vec<RunState>,
    active: Vec<RunId>,
    terminal: Vec<(UnixMs, RunId)>,
    aliases: Vec<(String, RunId)>,
    marks: Vec<(WriterId, Option<u64>)>,
}

/// The answer the journal gave, in the model's terms.
fn outcome_of(result: &Result<Appended, AppendError>, run: RunId) -> Outcome {
    let refused = |refusal| Outcome::Refused(refusal);
    match result {
        Ok(appended) => {
            assert_eq!(appended.run, run, "the answer names the batch's run");
            if appended.was_duplicate {
                Outcome::Duplicate {
                    first_seq: appended.first_seq,
                    last_seq: appended.last_seq,
                }
            } else {
                Outcome::Accepted {
                    first_seq: appended.first_seq,
                    last_seq: appended.last_seq,
                }
            }
        }
        Err(AppendError::EmptyBatch) => refused(Refusal::EmptyBatch),
        Err(AppendError::UnknownRun { run: found }) => {
            assert_eq!(*found, run);
            refused(Refusal::UnknownRun)
        }
        Err(AppendError::HeadMismatch {
            run: found,
            expected,
            found: head,
        }) => {
            assert_eq!(*found, run);
            refused(Refusal::HeadMismatch {
                expected: *expected,
                found: *head,
            })
        }
        Err(AppendError::AlreadyTerminal { run: found, state }) => {
            assert_eq!(*found, run);
            refused(Refusal::AlreadyTerminal { state: *state })
        }
        Err(AppendError::Transition { index, source }) => refused(Refusal::Transition {
            index: *index,
            source: source.clone(),
        }),
        Err(AppendError::WriterSeqReused {
            writer,
            writer_seq,
            run: found,
        }) => {
            assert_eq!((*writer, *found), (TEST_WRITER, run));
            refused(Refusal::WriterSeqReused {
                writer_seq: *writer_seq,
            })
        }
        Err(other) => panic!("the journal failed instead of answering: {other}"),
    }
}

/// Who wrote an accepted batch, which decides what the model takes from the journal.
#[derive(Clone, Copy)]
enum WrittenBy<'a> {
    /// `Journal::append`: the time and the writer seq are the handle's.
    Handle,
    /// The test's writer: everything is the batch's own.
    TestWriter(&'a Batch),
    /// The reconciler: the handle's time and writer seq, and its own reasons.
    Reconciler,
}

/// The journal's event in place of the model's, if they differ only in the reconciler's
/// reason (which the model leaves empty).
fn adopt_reason(predicted: &Event, actual: &Event) -> Event {
    match (predicted, actual) {
        (
            Event::Terminal {
                state,
                exit_code,
                repaired_by,
                ..
            },
            Event::Terminal {
                state: actual_state,
                error: Some(error),
                summary,
                exit_code: actual_exit_code,
                repaired_by: actual_repaired_by,
            },
        ) if (state, exit_code, repaired_by)
            == (actual_state, actual_exit_code, actual_repaired_by) =>
        {
            assert!(
                error == summary && summary.contains("runner"),
                "a repaired Terminal gives its reason as error and summary: {actual:?}"
            );
            actual.clone()
        }
        _ => predicted.clone(),
    }
}

impl Sut {
    fn journal(&self) -> &Journal {
        self.journal.as_ref().expect("the journal is open")
    }

    fn journal_path(&self) -> PathBuf {
        self.home.join("journal.redb")
    }

    fn view(&self) -> View {
        self.journal().view().expect("a view opens")
    }

    fn fold(&self, run: RunId) -> Option<RunState> {
        let records = self.records.get(&run).map_or(&[][..], Vec::as_slice);
        state::replay(records).expect("the model's records fold")
    }

    /// The writers whose marks a step could change: every writer seen, the test's, the handle's.
    fn writers(&self) -> Vec<WriterId> {
        let mut writers: Vec<WriterId> = self.marks.keys().copied().collect();
        writers.extend([TEST_WRITER, self.journal().writer()]);
        writers
    }

    fn contents(&self, writers: &[WriterId]) -> Contents {
        let view = self.view();
        let mut log = Vec::new();
        view.scan_log(|global, run, seq| {
            log.push((global, run, seq));
            true
        })
        .expect("the log reads");
        let mut snapshots = Vec::new();
        view.for_each_snapshot(|state| {
            snapshots.push(state);
            true
        })
        .expect("snapshots read");
        Contents {
            record_count: view.record_count().expect("records count"),
            global_head: view.global_head().expect("the log head reads"),
            log,
            snapshots,
            active: view.active_runs().expect("the active index reads"),
            terminal: view.terminal_index().expect("the terminal index reads"),
            aliases: view.aliases().expect("aliases read"),
            marks: writers
                .iter()
                .map(|&writer| (writer, view.writer_mark(writer).expect("a mark reads")))
                .collect(),
        }
    }

    /// Takes the records of an accepted batch into the model, after checking each against
    /// what the model predicted: run, seq, event, writer; one time and one writer seq for the
    /// whole batch, rising per writer (or exactly the batch's own, for the test writer).
    fn adopt(
        &mut self,
        run: RunId,
        (first_seq, last_seq): (u64, u64),
        events: &[Event],
        writer: WriterId,
        by: WrittenBy<'_>,
    ) {
        let stored: Vec<Record> = self
            .view()
            .records(run)
            .expect("records read")
            .into_iter()
            .filter(|record| (first_seq..=last_seq).contains(&record.seq))
            .collect();
        assert_eq!(
            stored.len() as u64,
            last_seq + 1 - first_seq,
            "run {run}: every record of seqs {first_seq}..={last_seq} is stored"
        );
        assert_eq!(events.len(), stored.len(), "one record per event");
        let (time_ms, writer_seq) = (stored[0].time_ms, stored[0].writer_seq);
        match by {
            WrittenBy::TestWriter(batch) => assert_eq!(
                (writer_seq, time_ms),
                (batch.writer_seq, batch.time_ms),
                "a batch keeps its writer seq and time"
            ),
            WrittenBy::Handle | WrittenBy::Reconciler => assert!(
                self.marks
                    .get(&writer)
                    .is_none_or(|&mark| writer_seq > mark),
                "writer {writer}: writer seq {writer_seq} rises above the last one committed"
            ),
        }
        for ((offset, event), actual) in events.iter().enumerate().zip(&stored) {
            let expected = Record {
                format_version: FORMAT_VERSION,
                run_id: run,
                seq: first_seq + offset as u64,
                time_ms,
                writer,
                writer_seq,
                event: match by {
                    WrittenBy::Reconciler => adopt_reason(event, &actual.event),
                    WrittenBy::Handle | WrittenBy::TestWriter(_) => event.clone(),
                },
            };
            assert_eq!(actual, &expected, "the stored record is the model's");
            if let Event::RunCreated {
                spec, tool_call_id, ..
            } = &expected.event
            {
                if let Some(tool_call_id) = tool_call_id {
                    self.aliases.insert(tool_call_alias(tool_call_id), run);
                }
                if let Some(name) = &spec.name {
                    self.aliases.insert(name_alias(name), run);
                }
            }
            self.log.push((run, expected.seq));
            self.records.entry(run).or_default().push(expected);
        }
        self.marks.insert(writer, writer_seq);
    }

    /// Checks one answer against the model's prediction and takes what it wrote.
    fn check_answer(
        &mut self,
        batch: &Batch,
        expected: &Outcome,
        result: &Result<Appended, AppendError>,
        writer: WriterId,
        by: WrittenBy<'_>,
    ) {
        let actual = outcome_of(result, batch.run);
        assert_eq!(&actual, expected, "the answer to {batch:?}");
        let Ok(appended) = result else {
            return;
        };
        if let Outcome::Accepted {
            first_seq,
            last_seq,
        } = actual
        {
            self.adopt(batch.run, (first_seq, last_seq), &batch.events, writer, by);
        }
        assert_eq!(
            Some(&appended.state),
            self.fold(batch.run).as_ref(),
            "the answer carries the run's state now"
        );
    }

    fn reopen(&mut self) {
        self.journal = None;
        let journal = Journal::open(self.journal_path()).expect("the journal opens again");
        let meta = journal.meta().expect("meta reads");
        assert_eq!(
            meta.journal_id, self.journal_id,
            "the same journal after reopening"
        );
        self.journal = Some(journal);
    }

    fn reconcile(&mut self, repairs: &[Repair]) {
        self.journal = None;
        let store = Store::open_with(Home::at(&self.home), StoreOptions::default())
            .expect("a store opens on the home");
        let writer = store.journal().writer();
        let report = reconcile::reconcile(&store, &reconcile::Options::default())
            .expect("a reconcile pass runs");
        drop(store);
        self.reopen();
        // The active runs' decisions come first; after them, closed runs whose projections the
        // pass rebuilt (this test writes through the journal alone, so none were projected).
        let rows: Vec<(RunId, &str, Vec<&str>)> = report.outcomes[..report.active]
            .iter()
            .map(|outcome| (outcome.run, outcome.row, outcome.appended.clone()))
            .collect();
        for outcome in &report.outcomes[report.active..] {
            assert_eq!(
                (outcome.row, outcome.appended.len()),
                ("closed", 0),
                "after the active runs, only projection repairs of closed runs"
            );
        }
        let expected_rows: Vec<(RunId, &str, Vec<&str>)> = repairs
            .iter()
            .map(|repair| {
                (
                    repair.run,
                    repair.row,
                    repair.events.iter().map(Event::name).collect(),
                )
            })
            .collect();
        assert_eq!(rows, expected_rows, "the reconciler's decisions");
        for outcome in &report.outcomes {
            assert_eq!(outcome.error, None, "run {}", outcome.run);
        }
        for repair in repairs.iter().filter(|repair| !repair.events.is_empty()) {
            let head = self.fold(repair.run).map_or(0, |state| state.head_seq);
            let seqs = (head + 1, head + repair.events.len() as u64);
            self.adopt(
                repair.run,
                seqs,
                &repair.events,
                writer,
                WrittenBy::Reconciler,
            );
        }
    }
}

/// What the reference must agree with the journal on; times and texts aside.
type Lifecycle = (
    RunStatus,
    u64,
    Vec<StepStatus>,
    Vec<ControlAction>,
    Option<Proof>,
    bool,
);

fn lifecycle(state: Option<&RunState>) -> Option<Lifecycle> {
    state.map(|state| {
        (
            state.status,
            state.head_seq,
            state.steps.iter().map(|step| step.status).collect(),
            state
                .controls
                .iter()
                .map(|control| control.action)
                .collect(),
            state
                .process_terminal
                .as_ref()
                .map(|observed| observed.proof),
            state.dismissed_at_ms.is_some(),
        )
    })
}

struct JournalTest;

impl StateMachineTest for JournalTest {
    type SystemUnderTest = Sut;
    type Reference = JournalModel;

    fn init_test(_model: &Model) -> Sut {
        // On tmpfs where there is one: this test checks what the journal holds, not that it
        // survives power loss (the crash tests do), and an fsync there costs nothing.
        let dir = match std::path::Path::new("/dev/shm") {
            shm if shm.is_dir() => tempfile::tempdir_in(shm),
            _ => tempfile::tempdir(),
        }
        .expect("a temporary directory");
        let home = dir.path().to_path_buf();
        let journal = Journal::open(home.join("journal.redb")).expect("a new journal opens");
        let journal_id = journal.meta().expect("meta reads").journal_id;
        Sut {
            _dir: dir,
            home,
            journal: Some(journal),
            journal_id,
            records: BTreeMap::new(),
            log: Vec::new(),
            aliases: BTreeMap::new(),
            marks: BTreeMap::new(),
        }
    }

    fn apply(mut sut: Sut, model: &Model, step: Step) -> Sut {
        let writers = sut.writers();
        let before = sut.contents(&writers);
        match (&step, &model.expected) {
            (Step::Append { .. }, Expected::Batches { answers }) => {
                let (batch, expected) = &answers[0];
                let result = sut
                    .journal()
                    .append(batch.run, batch.events.clone(), batch.condition);
                let writer = sut.journal().writer();
                sut.check_answer(batch, expected, &result, writer, WrittenBy::Handle);
            }
            (Step::CommitGroup { .. } | Step::Recommit { .. }, Expected::Batches { answers }) => {
                let batches: Vec<Batch> = answers.iter().map(|(batch, _)| batch.clone()).collect();
                let results = sut
                    .journal()
                    .commit_batches_for_tests(&batches)
                    .expect("the storage does not fail");
                assert_eq!(results.len(), batches.len(), "one answer per batch");
                for ((batch, expected), result) in answers.iter().zip(&results) {
                    sut.check_answer(
                        batch,
                        expected,
                        result,
                        TEST_WRITER,
                        WrittenBy::TestWriter(batch),
                    );
                }
            }
            (Step::Reopen, Expected::Reopened) => sut.reopen(),
            (Step::Reconcile, Expected::Reconciled(repairs)) => sut.reconcile(repairs),
            (step, expected) => panic!("the model expects {expected:?} of {step:?}"),
        }
        if !model.expected.writes() {
            assert_eq!(
                sut.contents(&writers),
                before,
                "{step:?} was refused or a repeat, and left no trace"
            );
        }
        sut
    }

    fn check_invariants(sut: &Sut, model: &Model) {
        let view = sut.view();
        for (slot, reference) in model.runs.iter().enumerate() {
            let run = run_id(slot);
            let records = sut.records.get(&run).cloned().unwrap_or_default();
            assert_eq!(
                view.records(run).expect("records read"),
                records,
                "run {run} holds exactly the model's records"
            );
            let seqs: Vec<u64> = records.iter().map(|record| record.seq).collect();
            assert_eq!(
                seqs,
                (1..=records.len() as u64).collect::<Vec<_>>(),
                "run {run}: seqs are gap-free from 1"
            );
            let folded = sut.fold(run);
            assert_eq!(
                view.snapshot(run).expect("the snapshot reads"),
                folded,
                "run {run}: the snapshot is the fold of the model's records"
            );
            assert_eq!(
                lifecycle(folded.as_ref()),
                lifecycle(reference.as_ref()),
                "run {run}: the reference predicted the same lifecycle"
            );
        }
        let folds: Vec<RunState> = (0..SLOTS)
            .filter_map(|slot| sut.fold(run_id(slot)))
            .collect();

        assert_eq!(
            view.all_runs().expect("runs read"),
            folds.iter().map(|state| state.run_id).collect::<Vec<_>>(),
            "the runs table holds the created runs"
        );
        let log = view
            .records_after(0, usize::MAX)
            .expect("the log reads")
            .into_iter()
            .map(|(global, record)| (global, record.run_id, record.seq))
            .collect::<Vec<_>>();
        let expected_log: Vec<(u64, RunId, u64)> = sut
            .log
            .iter()
            .enumerate()
            .map(|(index, &(run, seq))| (index as u64 + 1, run, seq))
            .collect();
        assert_eq!(
            log, expected_log,
            "the log is commit order, gap-free from 1"
        );
        assert_eq!(
            view.global_head().expect("the log head reads"),
            sut.log.len() as u64
        );
        assert_eq!(
            view.record_count().expect("records count"),
            sut.log.len() as u64
        );
        assert_eq!(
            view.active_runs().expect("the active index reads"),
            folds
                .iter()
                .filter(|state| !state.is_closed())
                .map(|state| state.run_id)
                .collect::<Vec<_>>(),
            "active holds exactly the runs not closed"
        );
        let mut terminal: Vec<(UnixMs, RunId)> = folds
            .iter()
            .filter_map(|state| state.ended_at_ms().map(|ended| (ended, state.run_id)))
            .collect();
        terminal.sort();
        assert_eq!(
            view.terminal_index().expect("the terminal index reads"),
            terminal,
            "the terminal index holds exactly the terminal runs, at their end times"
        );
        assert_eq!(
            view.aliases().expect("aliases read"),
            sut.aliases
                .iter()
                .map(|(alias, run)| (alias.clone(), *run))
                .collect::<Vec<_>>(),
            "aliases name the latest run created with them"
        );
        for (writer, mark) in &sut.marks {
            assert_eq!(
                view.writer_mark(*writer).expect("a mark reads"),
                Some(*mark),
                "writer {writer}'s mark is its last committed writer seq"
            );
        }
        assert_eq!(
            view.writer_mark(TEST_WRITER).expect("a mark reads"),
            model.test_mark,
            "the test writer's mark"
        );
    }
}

fn config() -> Config {
    Config {
        cases: env_number("RUNJOURNAL_MODEL_CASES", 64) as u32,
        max_shrink_iters: 2048,
        // A failure prints its shrunk sequence; nothing is written beside the sources.
        failure_persistence: None,
        ..Config::default()
    }
}

fn steps() -> RangeInclusive<usize> {
    let steps = env_number("RUNJOURNAL_MODEL_STEPS", 50);
    steps..=steps
}

prop_state_machine! {
    #![proptest_config(config())]

    #[test]
    fn the_journal_follows_its_model_through_any_sequence_of_steps(
        sequential steps() => JournalTest
    );
}
