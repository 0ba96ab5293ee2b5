//! Model-based test of the journal (proptest-state-machine).
//!
//! The system under test is a real [`Journal`] on a temporary redb file, driven through the
//! library only, by two handles on the same file (two writers, as two processes would be):
//! appends of any of the nine events, legal or not, in batches of any size, with and without
//! `expect_head` / `expect_not_terminal` (right and wrong), one at a time or many at once
//! (`append_all`); batches of a writer of the test's own, committed and then committed again
//! under the same writer seqs, as the writer thread retries a group after a reopen; storage
//! faults (ENOSPC, EIO) at a write or a sync of a commit, ridden out by the writer thread or,
//! for the test's writer, failing the commit, which then must have changed nothing or
//! everything, and lands once when retried; the journal dropped and opened again; and
//! reconcile passes (through a [`Store`] on the same home) over runs whose runners are dead,
//! alive, or of another boot.
//!
//! The oracle is [`reference`]: a specification of docs/design.md's "Rules" and "Reconciler" written for this
//! test, sharing no code with the library's reducer or decision table. It predicts every answer
//! (accepted with which seqs, a duplicate, or which refusal, naming a rule the batch breaks),
//! every run's state, and what a reconcile pass appends. As a second check the journal's
//! records are folded by the library's own `state::replay`: each snapshot must equal that
//! fold. After every step the journal must hold exactly the records the model accepted, the
//! indexes (active, terminal, aliases, log, writer marks) must be what they imply, per-run and
//! global seqs must be gap-free, and a step the model says writes nothing must leave
//! everything readable unchanged.
//!
//! The model cannot know the clock: it takes each batch's `time_ms`, the handles' writer seqs
//! and the text of the reconciler's reasons from the journal, after checking everything else
//! about those records (the reasons must say what the reference says they say).
//!
//! `RUNJOURNAL_MODEL_CASES` (default 64) and `RUNJOURNAL_MODEL_STEPS` (default 50) scale it.

mod reference;

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
    ControlAction, Event, ExternalJobStatus, FORMAT_VERSION, HookOutcome, JobState, MAX_TEXT_BYTES,
    Mode, Observer, ProcessExit, ProcessIdentity, Proof, Record, Repairer, RunSpec, SteerMode,
    StepEnd, StepOutcome, TerminalState, UnixMs, WriterId,
};
use runjournal::journal::{
    AppendError, Appended, Batch, QueueRefusal, View, WriterOptions, name_alias, tool_call_alias,
};
use runjournal::reconcile;
use runjournal::state::{self, RunState, RunStatus, SteerDelivery, StepStatus, TransitionError};
use runjournal::store::{Store, StoreOptions};
use runjournal::testkit::{self as kit, commit_batches};
use runjournal::{Condition, Home, Journal, RunId, liveness};

use crate::support::faulty_file::{Fault, Faults};
use crate::support::mem_disk::Call;
use reference::{Repair, Rule, Run, Runner, Status};

/// Runs the model knows; each is a fixed id, so a step names its run without depending on
/// earlier steps (deleting steps while shrinking keeps the rest meaningful).
const SLOTS: usize = 6;

/// Journal handles on the one file: 0 goes through a backend that can fail on cue, and groups
/// at most [`SMALL_GROUP_EVENTS`] events per commit; 1 is a plain handle with the defaults.
const HANDLES: usize = 2;
const SMALL_GROUP_EVENTS: usize = 8;

/// The test's own writer, whose batches it commits (and commits again) itself, on handle 0.
const TEST_WRITER: WriterId = WriterId(0x7e57_7e57_7e57_7e57);

/// Time stamped on the test writer's batches (plus their writer seq).
const TEST_BATCH_TIME_MS: UnixMs = 1_750_000_000_000;

/// `created_at_ms` of a run created long ago: past the reconciler's start grace.
const ANCIENT_MS: UnixMs = 1_000_000;
/// `created_at_ms` in the far future: within the start grace, whatever the clock says.
const FUTURE_MS: UnixMs = 4_000_000_000_000;

/// The time the reference judges a batch's records at: a test batch's own; a handle's batch
/// takes the journal's clock, which the model cannot know, but which lies, as
/// [`TEST_BATCH_TIME_MS`] does, between [`ANCIENT_MS`] and [`FUTURE_MS`] — the only due
/// times the model draws — so either decides a delay's end alike.
fn clock_of(batch: &Batch) -> UnixMs {
    if batch.writer == TEST_WRITER {
        batch.time_ms
    } else {
        TEST_BATCH_TIME_MS
    }
}

const ENOSPC: i32 = 28;
const EIO: i32 = 5;

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
    IDENTITIES.get_or_init(|| Identities {
        dead: kit::exited_identity(),
        alive: liveness::current().expect("this process is in /proc"),
        other_boot: ProcessIdentity {
            pid: 4242,
            start_time: 17,
            boot_id: "another-boot".to_string(),
            pid_namespace: None,
        },
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
fn runner_found(run: &Run) -> Runner {
    let Some((identity, _)) = &run.runner else {
        return Runner::None;
    };
    let ids = identities();
    if *identity == ids.dead {
        Runner::Dead
    } else if *identity == ids.alive {
        Runner::Alive
    } else if *identity == ids.other_boot {
        Runner::OlderBoot
    } else {
        panic!("runner {identity:?} is not one of the test's")
    }
}

// ---------------------------------------------------------------------------------------------
// Events
// ---------------------------------------------------------------------------------------------

/// Specs of every mode, named and unnamed (two share a name, so the later run takes the
/// alias), and one that `RunSpec::check` refuses.
fn spec_pool() -> [RunSpec; 5] {
    let spec = |name: Option<&str>, mode, concurrency, steps| RunSpec {
        name: name.map(str::to_string),
        concurrency,
        ..kit::spec(mode, steps)
    };
    [
        spec(
            Some("nightly"),
            Mode::Single,
            1,
            vec![kit::make_step("build")],
        ),
        spec(
            Some("deploy"),
            Mode::Chain,
            1,
            vec![
                kit::make_step("fetch"),
                kit::echo_step("build"),
                kit::farm_step("ship"),
            ],
        ),
        spec(
            None,
            Mode::Parallel,
            2,
            vec![
                kit::farm_step("render"),
                kit::echo_step("test"),
                kit::make_step("lint"),
            ],
        ),
        spec(
            Some("nightly"),
            Mode::Chain,
            1,
            vec![kit::farm_step("wait"), kit::make_step("report")],
        ),
        spec(None, Mode::Chain, 1, vec![]),
    ]
}

fn created(spec_index: usize, created_at_ms: UnixMs, tool_call: Option<u8>) -> Event {
    let call = tool_call.map(|call| format!("call-{call}"));
    let hosts = kit::hosts(tool_call.map(|_| "session-1"), None, call.as_deref());
    kit::created(spec_pool()[spec_index].clone(), created_at_ms, hosts)
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
        Just(JobState::Blocked),
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

/// How a runner's exit may be recorded.
fn arb_exit() -> BoxedStrategy<Option<ProcessExit>> {
    prop_oneof![
        Just(None),
        Just(Some(ProcessExit {
            code: Some(0),
            signal: None,
        })),
        Just(Some(ProcessExit {
            code: None,
            signal: Some(9),
        })),
    ]
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
    let observed = (arb_instance(), arb_exit(), proof, observer).prop_map(
        |(instance_id, exit, proof, observer)| Event::ProcessTerminalObserved {
            instance_id,
            exit,
            proof,
            observer,
        },
    );
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
        arb_pi_host_event(),
        arb_delay_event(),
    ]
    .boxed()
}

/// The events a pi-subagents host's requests and repairs bring: steer requests (a small pool of
/// ids, so repeats happen; a step named twice, none, or past the spec now and then), their
/// deliveries, refused control files and a host's end.
fn arb_pi_host_event() -> BoxedStrategy<Event> {
    let id = prop_oneof![Just("s1"), Just("s2"), Just("s 3")].prop_map(str::to_string);
    let steps = proptest::collection::vec(0..4u32, 0..3);
    let mode = prop_oneof![Just(SteerMode::Steer), Just(SteerMode::FollowUp)];
    let message = prop_oneof![Just("look again".to_string()), Just(" ".to_string())];
    let requested = (id.clone(), steps, mode, message).prop_map(|(id, steps, mode, message)| {
        Event::SteerRequested {
            id,
            steps,
            mode,
            message,
            source: "model".to_string(),
        }
    });
    let delivered = (id, 0..4u32).prop_map(|(id, step)| Event::SteerDelivered { id, step });
    let refused = arb_text().prop_map(|reason| Event::ControlRefused {
        file: "control/stop-requests/x.json".to_string(),
        reason,
    });
    let host_state = prop_oneof![Just(TerminalState::Failed), Just(TerminalState::Complete)];
    let host_ended = (host_state, arb_text()).prop_map(|(state, message)| Event::HostEnded {
        state,
        exit_code: 1,
        message,
        ended_at_ms: 5,
        result_path: Some("/results/run.json".to_string()),
    });
    prop_oneof![
        3 => requested,
        3 => delivered,
        1 => refused,
        1 => host_ended,
    ]
    .boxed()
}

/// The event that takes a run one step further along a successful life; `variant` picks
/// among equally good choices (which runner, which spec, whether a step has a process).
fn happy_next(run: Option<&Run>, variant: u8) -> Option<Event> {
    let Some(run) = run else {
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
    match run.status {
        Status::Queued if run.observed.is_some() => Some(Event::Terminal {
            state: TerminalState::Failed,
            error: Some("runner never started".to_string()),
            summary: "runner never started".to_string(),
            exit_code: 1,
            repaired_by: Some(Repairer::Launcher),
        }),
        // A run just created may be tried again once.
        Status::Queued if run.head == 1 && variant == 15 => Some(Event::RetryPolicy {
            retries: 1,
            backoff_ms: 5,
            backoff_max_ms: 10,
            on: exits_only(),
            idle_timeout_ms: None,
            heartbeat_ms: None,
        }),
        // A delayed run, or one waiting for its next attempt, is due first.
        Status::Queued if matches!(run.delay, Some((_, false))) => Some(Event::DelayEnded {
            by: "model".to_string(),
        }),
        Status::Queued => Some(Event::RunnerStarted {
            runner: runner_pool()[usize::from(variant % 3)].clone(),
            instance_id: "runner-a".to_string(),
        }),
        Status::Running => {
            let running = run
                .steps
                .iter()
                .position(|step| step.status == reference::StepStatus::Running);
            let pending = run
                .steps
                .iter()
                .position(|step| step.status == reference::StepStatus::Pending);
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
                let is_external = run.spec.steps[index].is_external_job();
                match &run.steps[index].job {
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
        _ if run.observed.is_none() => Some(Event::ProcessTerminalObserved {
            instance_id: run.instance().unwrap_or_default().to_string(),
            exit: Some(ProcessExit {
                code: Some(0),
                signal: None,
            }),
            proof: if run.runner.is_some() {
                Proof::Observed
            } else {
                Proof::NotStarted
            },
            observer: Observer::RunnerParent,
        }),
        _ if run.dismissed_at_ms.is_none() => Some(Event::Dismissed { at_ms: 1 }),
        _ => None,
    }
}

/// Up to `len` events along a successful life (at least one: past its end, an illegal
/// second `Dismissed`).
fn happy_path(run: Option<Run>, variant: u8, len: usize) -> Vec<Event> {
    let mut run = run;
    let mut events = Vec::new();
    while events.len() < len {
        let Some(event) = happy_next(run.as_ref(), variant) else {
            break;
        };
        // No happy path resumes a run, so no rule reads the run's id.
        run = reference::apply(run_id(0), run.as_ref(), &event, TEST_BATCH_TIME_MS).ok();
        events.push(event);
        if run.is_none() {
            break;
        }
    }
    if events.is_empty() {
        events.push(Event::Dismissed { at_ms: 2 });
    }
    events
}

/// The events along a successful life that the run could take next, in every variant.
fn happy_choices(run: Option<&Run>) -> Vec<Event> {
    let mut events: Vec<Event> = Vec::new();
    for variant in 0..16 {
        if let Some(event) = happy_next(run, variant)
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
/// request, a step's stop, a step failing, a runner seen gone early, a launcher giving up, a
/// dismissal.
fn detours(run: Option<&Run>) -> Vec<Event> {
    let mut events = vec![Event::Dismissed { at_ms: 0 }];
    let Some(run) = run else {
        return events;
    };
    if !run.status.is_terminal() {
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
        events.push(step_stop(0));
    }
    if let Some(index) = run
        .steps
        .iter()
        .position(|step| step.status == reference::StepStatus::Running)
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
    // "Retries": the attempt a runner is on ends and is tried again (or, its retries spent,
    // is refused).
    if let (Some((_, _, attempts)), Status::Running) = (&run.retry, run.status) {
        events.push(Event::AttemptEnded {
            attempt: attempts.len() as u32 + 1,
            cause: runjournal::event::AttemptCause::Exit,
            error: Some("exit 2".to_string()),
            summary: "exit 2".to_string(),
            exit_code: 2,
            retry_at_ms: ANCIENT_MS,
        });
    }
    match (&run.runner, &run.observed) {
        (Some((_, instance_id)), None) => events.push(Event::ProcessTerminalObserved {
            instance_id: instance_id.clone(),
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
// The model
// ---------------------------------------------------------------------------------------------

/// One batch as a step carries it: the run's slot, its events, its condition.
type StepBatch = (usize, Vec<Event>, Condition);

/// One step of a test case.
#[derive(Clone, Debug)]
enum Step {
    /// `Journal::append` on a handle, numbered by that handle's writer; on handle 0 perhaps
    /// with a fault the writer thread rides out.
    Append {
        handle: usize,
        slot: usize,
        events: Vec<Event>,
        condition: Condition,
        fault: Option<Fault>,
    },
    /// `Journal::append_all` on a handle: batches queued together, answered each on its own.
    AppendAll {
        handle: usize,
        batches: Vec<StepBatch>,
        fault: Option<Fault>,
    },
    /// New batches of the test's writer, committed in one write transaction on handle 0; with
    /// a fault, the commit fails, the handle is opened again and the batches committed again.
    CommitGroup {
        batches: Vec<StepBatch>,
        fault: Option<Fault>,
    },
    /// Batches of the test's writer (committed or refused before) committed again in one
    /// transaction, under the writer seqs they had.
    Recommit { picks: Vec<usize> },
    /// Drop the handles and open them again.
    Reopen,
    /// Drop the handles, open a store on the home, reconcile once, and open them again.
    Reconcile,
}

/// How the journal must answer one batch.
#[derive(Clone, Debug, PartialEq)]
enum Outcome {
    Accepted { first_seq: u64, last_seq: u64 },
    Duplicate { first_seq: u64, last_seq: u64 },
    Refused(Refusal),
}

/// Why a batch is refused.
#[derive(Clone, Debug, PartialEq)]
enum Refusal {
    EmptyBatch,
    UnknownRun,
    HeadMismatch {
        expected: u64,
        found: u64,
    },
    AlreadyTerminal {
        state: Status,
    },
    /// The event at `index` breaks these rules; the journal must name one of them.
    Transition {
        index: usize,
        rules: Vec<Rule>,
    },
    WriterSeqReused {
        writer_seq: u64,
    },
    /// "Launched once": another run holds the creation batch's key.
    UniqueHeld,
}

impl Outcome {
    fn writes(&self) -> bool {
        matches!(self, Outcome::Accepted { .. })
    }

    /// Whether the batch's writer seq is spent: a batch accepted, or refused after it was
    /// judged (not an empty one, refused before anything is looked up, nor a repeat), raises
    /// its writer's mark.
    fn spends_seq(&self) -> bool {
        match self {
            Outcome::Accepted { .. } => true,
            Outcome::Duplicate { .. } => false,
            Outcome::Refused(refusal) => !matches!(
                refusal,
                Refusal::EmptyBatch | Refusal::WriterSeqReused { .. }
            ),
        }
    }
}

/// A repair the reconciler must make: the run and what the reference says it appends.
#[derive(Clone, Debug)]
struct RunRepair {
    run: RunId,
    repairs: Vec<Repair>,
}

/// What the last step must have done.
#[derive(Clone, Debug)]
enum Expected {
    Nothing,
    /// Each batch with its answer. A batch appended through a handle gets the handle's writer
    /// id, writer seq and time, not those of the batch. `is_retried`: a fault made the writer
    /// retry, so an accepted batch may be answered as a duplicate of its own landed commit.
    Batches {
        answers: Vec<(Batch, Outcome)>,
        is_retried: bool,
    },
    /// The test writer's group whose commit fails at `fault`, then is committed again.
    FailedGroup {
        answers: Vec<(Batch, Outcome)>,
        fault: Fault,
    },
    Reopened,
    Reconciled(Vec<RunRepair>),
}

impl Expected {
    fn writes(&self) -> bool {
        match self {
            Expected::Nothing | Expected::Reopened => false,
            Expected::Batches { answers, .. } | Expected::FailedGroup { answers, .. } => {
                answers.iter().any(|(_, outcome)| outcome.writes())
            }
            Expected::Reconciled(runs) => runs.iter().any(|run| !run.repairs.is_empty()),
        }
    }
}

#[derive(Clone, Debug)]
struct TestBatch {
    batch: Batch,
    /// The seqs it was committed at.
    committed: Option<(u64, u64)>,
}

/// The reference: each run's state by [`reference::apply`] of the records the model
/// accepted, the test writer's batches and mark, and the expected answer of the last step.
#[derive(Clone, Debug)]
struct Model {
    runs: Vec<Option<Run>>,
    test_batches: Vec<TestBatch>,
    test_mark: Option<u64>,
    expected: Expected,
}

impl Model {
    /// Predicts the answer to one batch, as docs/design.md ("Architecture") and docs/journal-format.md
    /// describe an append, and takes its records if it is accepted.
    fn commit(&mut self, batch: &Batch, is_test_writer: bool) -> Outcome {
        let outcome = self.judge(batch, is_test_writer);
        if is_test_writer && outcome.spends_seq() {
            self.test_mark = Some(
                self.test_mark
                    .map_or(batch.writer_seq, |mark| mark.max(batch.writer_seq)),
            );
        }
        outcome
    }

    /// [`Model::commit`]'s answer, and the records it takes.
    fn judge(&mut self, batch: &Batch, is_test_writer: bool) -> Outcome {
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
        let head = before.as_ref().map_or(0, |run| run.head);
        if before.is_none() && !matches!(batch.events[0], Event::RunCreated { .. }) {
            return Outcome::Refused(Refusal::UnknownRun);
        }
        if let Some(expected) = batch.condition.expect_head.filter(|&e| e != head) {
            return Outcome::Refused(Refusal::HeadMismatch {
                expected,
                found: head,
            });
        }
        if let Some(run) = before.as_ref().filter(|run| run.status.is_terminal())
            && batch.condition.expect_not_terminal
        {
            return Outcome::Refused(Refusal::AlreadyTerminal { state: run.status });
        }
        let existed = before.is_some();
        let mut run = before;
        for (index, event) in batch.events.iter().enumerate() {
            match reference::apply(batch.run, run.as_ref(), event, clock_of(batch)) {
                Ok(next) => run = Some(next),
                Err(rules) => return Outcome::Refused(Refusal::Transition { index, rules }),
            }
        }
        // "Launched once" and "Retries", the journal's half, once the reducer accepted the
        // batch: only a creation batch takes a key or a retry policy (the first such event of a
        // later batch is refused), and a key only while no other run holds it.
        if existed
            && let Some((index, rule)) =
                batch
                    .events
                    .iter()
                    .enumerate()
                    .find_map(|(index, event)| match event {
                        Event::UniqueKey { .. } => Some((index, Rule::UniqueKeyAtCreation)),
                        Event::RetryPolicy { .. } => Some((index, Rule::RetryPolicyAtCreation)),
                        _ => None,
                    })
        {
            return Outcome::Refused(Refusal::Transition {
                index,
                rules: vec![rule],
            });
        }
        if let Some(Event::UniqueKey { key, .. }) = batch
            .events
            .iter()
            .find(|event| matches!(event, Event::UniqueKey { .. }))
            && self.key_is_held(key, slot, batch.time_ms)
        {
            return Outcome::Refused(Refusal::UniqueHeld);
        }
        self.runs[slot] = run;
        Outcome::Accepted {
            first_seq: head + 1,
            last_seq: head + batch.events.len() as u64,
        }
    }

    /// Whether a run other than the one in `slot` holds `key` at `at_ms`: it took it and has
    /// not ended, or its hold has not passed.
    fn key_is_held(&self, key: &str, slot: usize, at_ms: u64) -> bool {
        self.runs.iter().enumerate().any(|(other, run)| {
            let Some(run) = run.as_ref().filter(|_| other != slot) else {
                return false;
            };
            let Some((taken, hold_ms)) = &run.unique else {
                return false;
            };
            taken == key
                && (!run.status.is_terminal()
                    || hold_ms.is_some_and(|hold_ms| at_ms < run.created_at_ms + hold_ms))
        })
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

    /// New batches of the test writer, numbered after the ones it has.
    fn new_test_batches(&mut self, batches: &[StepBatch]) -> Vec<usize> {
        let mut indexes = Vec::new();
        for (slot, events, condition) in batches {
            let writer_seq = self.test_batches.len() as u64 + 1;
            indexes.push(self.test_batches.len());
            self.test_batches.push(TestBatch {
                batch: Batch {
                    run: run_id(*slot),
                    events: events.clone(),
                    condition: *condition,
                    writer: TEST_WRITER,
                    writer_seq,
                    time_ms: TEST_BATCH_TIME_MS + writer_seq,
                    private: None,
                },
                committed: None,
            });
        }
        indexes
    }

    /// The repairs of one reconcile pass: for each run not closed, in id order, what the
    /// reference's reconciler appends.
    fn reconcile(&mut self) -> Vec<RunRepair> {
        let mut repairs = Vec::new();
        for slot in 0..SLOTS {
            let Some(run) = self.runs[slot].clone() else {
                continue;
            };
            if run.is_closed() {
                continue;
            }
            assert!(
                [ANCIENT_MS, FUTURE_MS].contains(&run.created_at_ms),
                "the model creates runs long ago or in the future only"
            );
            let run_repairs =
                reference::reconcile(&run, runner_found(&run), run.created_at_ms == ANCIENT_MS);
            if !run_repairs.is_empty() {
                let batch = Batch {
                    run: run_id(slot),
                    events: run_repairs
                        .iter()
                        .map(|repair| repair.event.clone())
                        .collect(),
                    condition: Condition::expect_head(run.head),
                    writer: WriterId(0),
                    writer_seq: 0,
                    time_ms: 0,
                    private: None,
                };
                let outcome = self.commit(&batch, false);
                assert!(
                    outcome.writes(),
                    "the reference's reconciler makes a repair its own lifecycle accepts: {run_repairs:?}: {outcome:?}"
                );
            }
            repairs.push(RunRepair {
                run: run_id(slot),
                repairs: run_repairs,
            });
        }
        repairs
    }

    fn handle_batch(&mut self, (slot, events, condition): &StepBatch) -> (Batch, Outcome) {
        let batch = Batch {
            run: run_id(*slot),
            events: events.clone(),
            condition: *condition,
            writer: WriterId(0),
            writer_seq: 0,
            time_ms: 0,
            private: None,
        };
        let outcome = self.commit(&batch, false);
        (batch, outcome)
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

/// Events for one batch: mostly one to three, now and then a long stretch of a run's life or
/// a long mix (batches of any size; longer than a handle's group bound, too).
fn arb_batch_events(run: Option<Run>) -> BoxedStrategy<Vec<Event>> {
    let choices = happy_choices(run.as_ref());
    let detours = detours(run.as_ref());
    let happy = {
        let run = run.clone();
        (1..=3usize, any::<u8>())
            .prop_map(move |(len, variant)| happy_path(run.clone(), variant, len))
    };
    let long_happy = (4..=24usize, any::<u8>())
        .prop_map(move |(len, variant)| happy_path(run.clone(), variant, len));
    let one = prop_oneof![4 => select(choices), 2 => select(detours), 2 => arb_event()];
    let mixed = proptest::collection::vec(one.clone(), 1..=3);
    let long_mixed = proptest::collection::vec(one, 4..=40);
    prop_oneof![
        15 => happy,
        3 => long_happy,
        14 => mixed,
        2 => long_mixed,
        1 => Just(Vec::new()),
    ]
    .boxed()
}

/// A batch for one of the runs, mostly for one that still has a life ahead.
fn arb_batch(model: &Model) -> BoxedStrategy<StepBatch> {
    let per_slot = model
        .runs
        .iter()
        .enumerate()
        .map(|(slot, run)| {
            let weight = match run {
                Some(run) if run.is_closed() && run.dismissed_at_ms.is_some() => 1,
                Some(run) if run.is_closed() => 2,
                _ => 6,
            };
            let head = run.as_ref().map_or(0, |run| run.head);
            let batch = (
                Just(slot),
                arb_batch_events(run.clone()),
                arb_condition(head),
            );
            (weight, batch.boxed())
        })
        .collect::<Vec<_>>();
    Union::new_weighted(per_slot).boxed()
}

fn arb_errno() -> BoxedStrategy<i32> {
    prop_oneof![Just(ENOSPC), Just(EIO)].boxed()
}

/// A fault at one of a commit's first writes, or at its first or second sync (data, then the
/// commit slot: a commit whose sync after the commit slot fails has landed).
fn arb_fault() -> BoxedStrategy<Fault> {
    let at_write = (1..=2u64, arb_errno()).prop_map(|(at, errno)| Fault {
        on: Call::Write,
        at,
        errno,
    });
    let at_sync = (1..=2u64, arb_errno()).prop_map(|(at, errno)| Fault {
        on: Call::Sync,
        at,
        errno,
    });
    prop_oneof![at_write, at_sync].boxed()
}

/// A fault before a commit lands: at a write, or at the first (data) sync.
fn arb_fault_before_landing() -> BoxedStrategy<Fault> {
    arb_fault()
        .prop_map(|fault| Fault {
            at: if fault.on == Call::Sync { 1 } else { fault.at },
            ..fault
        })
        .boxed()
}

/// Whether a commit failed by this fault may have landed all the same: its second sync may be
/// the one after the commit slot was written (or the data sync, when growing the file made the
/// first). Its first writes and its first sync come before the commit slot.
fn lands_anyway(fault: &Fault) -> bool {
    fault.on == Call::Sync && fault.at >= 2
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
        let maybe_fault = || proptest::option::weighted(0.25, arb_fault());
        let append = (0..HANDLES, batch.clone(), maybe_fault()).prop_map(
            |(handle, (slot, events, condition), fault)| Step::Append {
                handle,
                slot,
                events,
                condition,
                // Faults are armed on handle 0's backend only.
                fault: fault.filter(|_| handle == 0),
            },
        );
        let append_all = (
            0..HANDLES,
            proptest::collection::vec(batch.clone(), 1..=6),
            proptest::option::weighted(0.25, arb_fault_before_landing()),
        )
            .prop_map(|(handle, batches, fault)| Step::AppendAll {
                handle,
                batches,
                fault: fault.filter(|_| handle == 0),
            });
        let group = (proptest::collection::vec(batch, 1..=3), maybe_fault())
            .prop_map(|(batches, fault)| Step::CommitGroup { batches, fault });
        let mut steps: Vec<(u32, BoxedStrategy<Step>)> = vec![
            (12, append.boxed()),
            (3, append_all.boxed()),
            (4, group.boxed()),
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
                fault,
                ..
            } => Expected::Batches {
                answers: vec![model.handle_batch(&(*slot, events.clone(), *condition))],
                is_retried: fault.is_some(),
            },
            Step::AppendAll { batches, .. } => Expected::Batches {
                answers: batches
                    .iter()
                    .map(|batch| model.handle_batch(batch))
                    .collect(),
                // Only faults before landing: a retry commits what it would have.
                is_retried: false,
            },
            Step::CommitGroup { batches, fault } => {
                let indexes = model.new_test_batches(batches);
                let answers = model.commit_test_batches(&indexes);
                match fault {
                    Some(fault) => Expected::FailedGroup {
                        answers,
                        fault: *fault,
                    },
                    None => Expected::Batches {
                        answers,
                        is_retried: false,
                    },
                }
            }
            Step::Recommit { picks } => {
                let count = model.test_batches.len();
                let indexes: Vec<usize> = picks.iter().map(|pick| pick % count).collect();
                Expected::Batches {
                    answers: model.commit_test_batches(&indexes),
                    is_retried: false,
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

/// The journal's handles, and the model's records as the journal stamped them (times, the
/// handles' writer seqs, the reconciler's reasons): what the journal must hold exactly.
struct Sut {
    _dir: tempfile::TempDir,
    home: PathBuf,
    /// The fault armed on handle 0's backend.
    faults: Arc<Faults>,
    journals: Vec<Option<Journal>>,
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

/// How the journal answered one batch, in the reference's terms.
#[derive(Debug)]
enum Answer {
    Accepted { first_seq: u64, last_seq: u64 },
    Duplicate { first_seq: u64, last_seq: u64 },
    Refused(Refusal),
}

/// The reference's rule a refusal of the library names: the library's error families mapped,
/// one line each, onto the sentences the reference checks. `None` for an error the reference
/// has no rule for.
fn rule_of(error: &TransitionError) -> Option<Rule> {
    Some(match error {
        TransitionError::NotCreated { .. } | TransitionError::CreatedNotFirst { .. } => {
            Rule::CreatedFirst
        }
        TransitionError::AlreadyCreated { .. } => Rule::CreatedOnce,
        TransitionError::InvalidSpec { .. } => Rule::ValidSpec,
        TransitionError::TextTooLong { .. } => Rule::TextBounded,
        TransitionError::AfterTerminal { .. } => Rule::NothingAfterTerminal,
        TransitionError::RunnerNotQueued { .. } => Rule::RunnerFromQueued,
        TransitionError::NoSuchStep { .. } => Rule::StepExists,
        TransitionError::StepStartWhileNotRunning { .. } => Rule::StepStartsInRunningRun,
        TransitionError::StepNotPending { .. } => Rule::StepStartsPending,
        TransitionError::ChainOrder { .. } => Rule::ChainOrder,
        TransitionError::ConcurrencyExceeded { .. } => Rule::Concurrency,
        TransitionError::StepNotRunning { .. } => Rule::StepIsRunning,
        TransitionError::NotExternalJob { .. } => Rule::ExternalJobStep,
        TransitionError::CompleteWithUnfinishedStep { .. } => Rule::CompleteNeedsEveryStep,
        TransitionError::ProcessTerminalAlreadyObserved { .. } => Rule::ObservedOnce,
        TransitionError::InstanceMismatch { .. } => Rule::ObservedNamesTheRunner,
        TransitionError::ProofMismatch { .. } => Rule::ProofMatchesRunner,
        TransitionError::RunnerAfterProcessTerminal { .. } => Rule::RunnerNotAfterGivenUp,
        TransitionError::NonFiniteProgress { .. } => Rule::ProgressFinite,
        TransitionError::SkipNotPending { .. } => Rule::SkipOnlyPending,
        TransitionError::ControlAlreadyRequested { .. } => Rule::ControlOncePerAction,
        TransitionError::AlreadyDismissed { .. } => Rule::DismissedOnce,
        TransitionError::ResumedNotAtCreation { .. } => Rule::ResumedAtCreation,
        TransitionError::ResumedFromItself { .. } => Rule::ResumesAnotherRun,
        TransitionError::QueueJoinedLate { .. } => Rule::QueueJoinedAtCreation,
        TransitionError::InvalidQueueName { .. } => Rule::QueueNameValid,
        TransitionError::NotInQueue { .. } | TransitionError::AlreadyAdmitted { .. } => {
            Rule::AdmittedOnceInQueue
        }
        TransitionError::RunnerBeforeAdmission { .. } => Rule::RunnerAfterAdmission,
        TransitionError::DependsOnLate { .. } => Rule::DependenciesAtCreation,
        TransitionError::InvalidDependencies { .. } => Rule::DependenciesWellFormed,
        TransitionError::NoDependencies { .. } | TransitionError::DependenciesAlreadyMet { .. } => {
            Rule::MetOnceWithDependencies
        }
        TransitionError::BeforeDependencies { .. } => Rule::NothingBeforeDependencies,
        TransitionError::StartDelayedLate { .. } => Rule::DelayedAtCreation,
        TransitionError::NotDelayed { .. } | TransitionError::DelayAlreadyEnded { .. } => {
            Rule::DelayEndsOnce
        }
        TransitionError::NotYetDue { .. } => Rule::DelayEndsWhenDue,
        TransitionError::RunnerBeforeDue { .. } => Rule::RunnerAfterDue,
        TransitionError::UniqueKeyLate { .. } => Rule::UniqueKeyAtCreation,
        TransitionError::RetryPolicyLate { .. } => Rule::RetryPolicyAtCreation,
        TransitionError::InvalidRetryPolicy { .. } => Rule::RetryPolicyWellFormed,
        TransitionError::NoRetries { .. } | TransitionError::AttemptNotCurrent { .. } => {
            Rule::AttemptEndsTheCurrentOne
        }
        TransitionError::RetriesSpent { .. } => Rule::RetriesBounded,
        TransitionError::AttemptAfterControl { .. } => Rule::NoRetryAfterStop,
        TransitionError::HookBeforeEnd { .. } => Rule::HookAfterEnd,
        TransitionError::HookOutOfRange { .. } => Rule::HookInRange,
        TransitionError::HookAttemptNotNext { .. } | TransitionError::HookAttemptOpen { .. } => {
            Rule::HookAttemptsInTurn
        }
        TransitionError::HookNotClaimed { .. } => Rule::HookEndsItsAttempt,
        TransitionError::HookSettled { .. } => Rule::HookNeverAgainOnceSettled,
        TransitionError::HookRetryNotAllowed { .. } => Rule::HookRetryFits,
        TransitionError::InvalidSteer { .. } => Rule::SteerWellFormed,
        TransitionError::SteerToEndedStep { .. } => Rule::SteerToOpenStep,
        TransitionError::SteerIdReused { .. } => Rule::SteerIdOnce,
        TransitionError::SteerQueueFull { .. } => Rule::SteerWaitingBounded,
        TransitionError::TooManySteers { .. } => Rule::SteerTotalBounded,
        TransitionError::NoSuchSteer { .. } | TransitionError::SteerNotQueued { .. } => {
            Rule::SteerTakenWhileWaiting
        }
        TransitionError::StepNotStoppable { .. } => Rule::StepStopOfOpenStep,
        TransitionError::StepStopAlreadyRequested { .. } => Rule::StepStopOnce,
        TransitionError::AttemptAfterStepStop { .. } => Rule::NoRetryAfterStepStop,
        _ => return None,
    })
}

fn status_of(status: RunStatus) -> Status {
    match status {
        RunStatus::Queued => Status::Queued,
        RunStatus::Running => Status::Running,
        RunStatus::Complete => Status::Complete,
        RunStatus::Failed => Status::Failed,
        RunStatus::Stopped => Status::Stopped,
        RunStatus::Paused => Status::Paused,
    }
}

fn step_status_of(status: StepStatus) -> reference::StepStatus {
    match status {
        StepStatus::Pending => reference::StepStatus::Pending,
        StepStatus::Running => reference::StepStatus::Running,
        StepStatus::Complete => reference::StepStatus::Complete,
        StepStatus::Failed => reference::StepStatus::Failed,
        StepStatus::Stopped => reference::StepStatus::Stopped,
        StepStatus::Skipped => reference::StepStatus::Skipped,
    }
}

/// The library's state of a run in the reference's terms, times left out.
fn view_of(state: &RunState) -> Run {
    Run {
        spec: RunSpec::clone(&state.spec),
        created_at_ms: state.created_at_ms,
        session_id: state.session_id.clone(),
        completion_owner_id: state.completion_owner_id.clone(),
        tool_call_id: state.tool_call_id.clone(),
        head: state.head_seq,
        status: status_of(state.status),
        runner: state
            .runner
            .as_ref()
            .map(|runner| (runner.identity.clone(), runner.instance_id.clone())),
        steps: state
            .steps
            .iter()
            .map(|step| reference::Step {
                status: step_status_of(step.status),
                process: step.process.clone(),
                exit_code: step.exit_code,
                error: step.error.clone(),
                job: step.job.clone(),
            })
            .collect(),
        controls: state
            .controls
            .iter()
            .map(|control| (control.action, control.by.clone(), control.reason.clone()))
            .collect(),
        ending: state.terminal.as_ref().map(|terminal| reference::Ending {
            state: terminal.state,
            error: terminal.error.clone(),
            summary: terminal.summary.clone(),
            exit_code: terminal.exit_code,
            repaired_by: terminal.repaired_by,
        }),
        observed: state
            .process_terminal
            .as_ref()
            .map(|observed| reference::Observed {
                instance_id: observed.instance_id.clone(),
                exit: observed.exit,
                proof: observed.proof,
                observer: observed.observer,
            }),
        dismissed_at_ms: state.dismissed_at_ms,
        queue: state
            .queue
            .as_ref()
            .map(|queue| (queue.name.clone(), queue.admitted.is_some())),
        dependencies: state.dependencies.as_ref().map(|dependencies| {
            (
                dependencies.after.clone(),
                dependencies.after_any.clone(),
                dependencies.met.is_some(),
            )
        }),
        delay: state
            .delay
            .as_ref()
            .map(|delay| (delay.due_at_ms, delay.ended.is_some())),
        unique: state
            .unique
            .as_ref()
            .map(|unique| (unique.key.clone(), unique.hold_ms)),
        retry: state.retry.as_ref().map(|retry| {
            let attempts = retry
                .attempts
                .iter()
                .map(|attempt| reference::Attempt {
                    attempt: attempt.attempt,
                    cause: attempt.cause,
                    exit_code: attempt.exit_code,
                    retry_at_ms: attempt.retry_at_ms,
                    instance: attempt.runner_instance.clone(),
                    observed: attempt.process_terminal.as_ref().map(|observed| {
                        reference::Observed {
                            instance_id: observed.instance_id.clone(),
                            exit: observed.exit,
                            proof: observed.proof,
                            observer: observed.observer,
                        }
                    }),
                })
                .collect();
            (retry.retries, retry.on.crash, attempts)
        }),
        hooks: state
            .hooks
            .iter()
            .map(|hook| reference::Hook {
                hook: hook.hook,
                attempts: hook.attempts,
                open: hook.claim.as_ref().map(|claim| {
                    (
                        claim.attempt,
                        claim.claimant.clone(),
                        claim.by.clone(),
                        claim.lease_ms,
                    )
                }),
                last: hook
                    .last
                    .as_ref()
                    .map(|last| (last.attempt, last.outcome.clone(), last.retry_at_ms)),
            })
            .collect(),
        steers: state
            .steers
            .iter()
            .map(|steer| {
                let targets = steer
                    .targets
                    .iter()
                    .map(|target| {
                        let delivery = match target.delivery {
                            SteerDelivery::Queued => reference::Delivery::Waiting,
                            SteerDelivery::Delivered { .. } => reference::Delivery::Taken,
                            SteerDelivery::Undelivered { .. } => reference::Delivery::Lost,
                        };
                        (target.step, delivery)
                    })
                    .collect();
                (steer.id.clone(), targets)
            })
            .collect(),
        step_stops: state
            .step_stops
            .iter()
            .map(|stop| (stop.step, stop.by.clone(), stop.reason.clone()))
            .collect(),
    }
}

/// The queue and dependency events of a run's life against both statements of the lifecycle:
/// every sequence of up to four events drawn from a queue's events, a dependency's and those
/// around them, folded through the
/// library's reducer and the reference, record by record; each record is accepted by both
/// (to the same state) or refused by both (the library naming one of the reference's rules).
#[test]
fn the_queue_rules_of_the_reducer_agree_with_the_reference() {
    let joined = |queue: &str| Event::QueueJoined {
        queue: queue.to_string(),
        idle_timeout_ms: None,
        heartbeat_ms: Some(5),
    };
    let pool = [
        joined("q"),
        joined("a b"),
        Event::QueueAdmitted {
            by: "test".to_string(),
        },
        Event::DependsOn {
            after: vec![RunId::from_bytes([8; 16])],
            after_any: Vec::new(),
            idle_timeout_ms: None,
            heartbeat_ms: None,
        },
        // It names the run itself.
        Event::DependsOn {
            after: Vec::new(),
            after_any: vec![RunId::from_bytes([7; 16])],
            idle_timeout_ms: None,
            heartbeat_ms: None,
        },
        Event::DependenciesMet {
            by: "test".to_string(),
        },
        Event::RunnerStarted {
            runner: runner_pool()[0].clone(),
            instance_id: "runner-a".to_string(),
        },
        Event::Terminal {
            state: TerminalState::Stopped,
            error: None,
            summary: "stopped".to_string(),
            exit_code: 143,
            repaired_by: None,
        },
        Event::ControlRequested {
            action: ControlAction::Stop,
            by: "test".to_string(),
            reason: "test".to_string(),
        },
    ];
    let run = RunId::from_bytes([7; 16]);
    let mut sequences: Vec<Vec<usize>> = vec![Vec::new()];
    for _ in 0..4 {
        let longer: Vec<Vec<usize>> = sequences
            .iter()
            .filter(|sequence| sequence.len() == sequences.last().map_or(0, Vec::len))
            .flat_map(|sequence| {
                (0..pool.len()).map(move |pick| {
                    let mut next = sequence.clone();
                    next.push(pick);
                    next
                })
            })
            .collect();
        sequences.extend(longer);
    }
    let mut agreed = 0usize;
    for sequence in &sequences {
        let first = created(0, ANCIENT_MS, None);
        let record = |seq: u64, event: &Event| runjournal::event::Record {
            format_version: runjournal::event::FORMAT_VERSION,
            run_id: run,
            seq,
            time_ms: 0,
            writer: WriterId(0),
            writer_seq: 0,
            event: event.clone(),
        };
        let mut library = runjournal::state::apply(None, &record(1, &first)).expect("created");
        let mut reference_run = reference::apply(run, None, &first, 0).expect("created");
        for &pick in sequence {
            let event = &pool[pick];
            let seq = library.head_seq + 1;
            match (
                runjournal::state::apply(Some(&library), &record(seq, event)),
                reference::apply(run, Some(&reference_run), event, 0),
            ) {
                (Ok(next), Ok(reference_next)) => {
                    assert_eq!(view_of(&next), reference_next, "{sequence:?}");
                    library = next;
                    reference_run = reference_next;
                }
                (Err(error), Err(rules)) => {
                    let rule = rule_of(&error).expect("a rule the reference has");
                    assert!(
                        rules.contains(&rule),
                        "{sequence:?}: {error} not in {rules:?}"
                    );
                    break;
                }
                (library_answer, reference_answer) => panic!(
                    "{sequence:?}: the library says {library_answer:?}, the reference {reference_answer:?}"
                ),
            }
            agreed += 1;
        }
    }
    assert!(agreed > 1000, "{agreed}");
}

/// The run with the reason of a reconciler's `Terminal` (and the same words where they became
/// a running step's error) blanked: the reference does not know the words, only what they say.
fn without_repair_reason(mut run: Run) -> Run {
    let Some(ending) = run
        .ending
        .as_mut()
        .filter(|ending| ending.repaired_by == Some(Repairer::Reconciler))
    else {
        return run;
    };
    let reason = ending.error.replace(String::new());
    ending.summary = String::new();
    for step in &mut run.steps {
        if step.error.is_some() && step.error == reason {
            step.error = Some(String::new());
        }
    }
    run
}

/// The answer the journal gave, in the model's terms.
fn answer_of(result: &Result<Appended, AppendError>, run: RunId, writer: WriterId) -> Answer {
    let refused = Answer::Refused;
    match result {
        Ok(appended) => {
            assert_eq!(appended.run, run, "the answer names the batch's run");
            if appended.was_duplicate {
                Answer::Duplicate {
                    first_seq: appended.first_seq,
                    last_seq: appended.last_seq,
                }
            } else {
                Answer::Accepted {
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
            refused(Refusal::AlreadyTerminal {
                state: status_of(*state),
            })
        }
        Err(AppendError::Transition { index, source }) => match rule_of(source) {
            Some(rule) => refused(Refusal::Transition {
                index: *index,
                rules: vec![rule],
            }),
            None => panic!(
                "the journal refused event {index} of a batch of run {run} by a rule the reference does not have: {source}"
            ),
        },
        Err(AppendError::WriterSeqReused {
            writer: found_writer,
            writer_seq,
            run: found,
        }) => {
            assert_eq!((*found_writer, *found), (writer, run));
            refused(Refusal::WriterSeqReused {
                writer_seq: *writer_seq,
            })
        }
        Err(AppendError::Queue {
            refusal: QueueRefusal::UniqueHeld { .. },
            run: found,
        }) => {
            assert_eq!(*found, run);
            refused(Refusal::UniqueHeld)
        }
        Err(other) => panic!("the journal failed instead of answering: {other}"),
    }
}

/// Whether the journal's answer is the one the reference predicts: the same seqs, or the same
/// refusal (for a broken lifecycle rule: the same event, and one of the rules it breaks). After
/// a retried commit, an accepted batch may come back as a duplicate of itself.
fn agrees(expected: &Outcome, answer: &Answer, is_retried: bool) -> bool {
    match (expected, answer) {
        (
            Outcome::Accepted {
                first_seq,
                last_seq,
            },
            Answer::Accepted {
                first_seq: first,
                last_seq: last,
            },
        )
        | (
            Outcome::Duplicate {
                first_seq,
                last_seq,
            },
            Answer::Duplicate {
                first_seq: first,
                last_seq: last,
            },
        ) => (first_seq, last_seq) == (first, last),
        (
            Outcome::Accepted {
                first_seq,
                last_seq,
            },
            Answer::Duplicate {
                first_seq: first,
                last_seq: last,
            },
        ) => is_retried && (first_seq, last_seq) == (first, last),
        (
            Outcome::Refused(Refusal::Transition { index, rules }),
            Answer::Refused(Refusal::Transition {
                index: found,
                rules: named,
            }),
        ) => index == found && named.iter().all(|rule| rules.contains(rule)),
        (Outcome::Refused(expected), Answer::Refused(refusal)) => expected == refusal,
        _ => false,
    }
}

/// Who wrote an accepted batch, which decides what the model takes from the journal.
#[derive(Clone, Copy)]
enum WrittenBy<'a> {
    /// A handle's `append`: the time and the writer seq are the handle's.
    Handle,
    /// The test's writer: everything is the batch's own.
    TestWriter(&'a Batch),
    /// The reconciler: the handle's time and writer seq, and its own reasons.
    Reconciler(&'a [Repair]),
}

/// The journal's event in place of the reference's, if they differ only in the reconciler's
/// reason (which the reference leaves empty), and the reason says what the reference says.
fn adopt_reason(repair: &Repair, actual: &Event) -> Event {
    let (
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
    ) = (&repair.event, actual)
    else {
        return repair.event.clone();
    };
    if (state, exit_code, repaired_by) != (actual_state, actual_exit_code, actual_repaired_by) {
        return repair.event.clone();
    }
    assert_eq!(
        error, summary,
        "a repaired Terminal gives its reason as error and summary"
    );
    for words in &repair.reason_says {
        assert!(
            error.contains(words.as_str()),
            "the reconciler's reason says {words:?}: {error:?}"
        );
    }
    actual.clone()
}

impl Sut {
    fn journal(&self, handle: usize) -> &Journal {
        self.journals[handle]
            .as_ref()
            .expect("the journal's handles are open")
    }

    fn journal_path(&self) -> PathBuf {
        self.home.join("journal.redb")
    }

    fn open_handle(&self, handle: usize) -> Journal {
        let journal = if handle == 0 {
            Journal::open_with(
                self.faults.source(&self.journal_path()),
                WriterOptions {
                    max_group_events: SMALL_GROUP_EVENTS,
                    ..WriterOptions::default()
                },
            )
        } else {
            Journal::open(self.journal_path())
        }
        .expect("the journal opens");
        let meta = journal.meta().expect("meta reads");
        assert_eq!(meta.journal_id, self.journal_id, "the same journal");
        journal
    }

    fn reopen_handle(&mut self, handle: usize) {
        self.journals[handle] = None;
        self.journals[handle] = Some(self.open_handle(handle));
    }

    fn reopen(&mut self) {
        for handle in 0..HANDLES {
            self.reopen_handle(handle);
        }
    }

    fn view(&self) -> View {
        self.journal(HANDLES - 1).view().expect("a view opens")
    }

    fn fold(&self, run: RunId) -> Option<RunState> {
        let records = self.records.get(&run).map_or(&[][..], Vec::as_slice);
        state::replay(records).expect("the model's records fold")
    }

    /// The writers whose marks a step could change: every writer seen, the test's, the
    /// handles'.
    fn writers(&self) -> Vec<WriterId> {
        let mut writers: Vec<WriterId> = self.marks.keys().copied().collect();
        writers.push(TEST_WRITER);
        writers.extend((0..HANDLES).map(|handle| self.journal(handle).writer()));
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
            WrittenBy::Handle | WrittenBy::Reconciler(_) => assert!(
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
                    WrittenBy::Reconciler(repairs) => adopt_reason(&repairs[offset], &actual.event),
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
        is_retried: bool,
    ) {
        let answer = answer_of(result, batch.run, writer);
        assert!(
            agrees(expected, &answer, is_retried),
            "the answer to {batch:?}: the reference expects {expected:?}, the journal answered {answer:?}"
        );
        let Ok(appended) = result else {
            return;
        };
        if let Outcome::Accepted {
            first_seq,
            last_seq,
        } = *expected
        {
            self.adopt(batch.run, (first_seq, last_seq), &batch.events, writer, by);
        }
        assert_eq!(
            Some(&appended.state),
            self.fold(batch.run).as_ref(),
            "the answer carries the run's state now"
        );
    }

    /// The test writer's group committed with `fault` armed: the commit fails; the handle is
    /// opened again, as the writer thread would; the journal then holds nothing of the group,
    /// or all of it if the fault came after its commit slot was written; and the group
    /// committed again lands once.
    fn commit_failing(&mut self, answers: &[(Batch, Outcome)], fault: Fault, before: &Contents) {
        let batches: Vec<Batch> = answers.iter().map(|(batch, _)| batch.clone()).collect();
        let writers = self.writers();
        self.faults.arm(fault);
        let first = commit_batches(self.journal(0), &batches);
        let has_fired = self.faults.disarm();
        let failure = match first {
            Ok(results) => {
                assert!(!has_fired, "a fault that fired fails the commit");
                for ((batch, expected), result) in answers.iter().zip(&results) {
                    self.check_answer(
                        batch,
                        expected,
                        result,
                        TEST_WRITER,
                        WrittenBy::TestWriter(batch),
                        false,
                    );
                }
                return;
            }
            Err(failure) => failure,
        };
        assert!(has_fired, "the commit failed by the fault only: {failure}");
        // A handle is suspect after a failed commit: the writer thread reopens.
        self.reopen_handle(0);
        let has_landed = self.contents(&writers) != *before;
        assert!(
            !has_landed || lands_anyway(&fault),
            "a commit failed at {fault:?}, before its commit slot was written, leaves the journal as it was"
        );
        if has_landed {
            for (batch, expected) in answers {
                if let Outcome::Accepted {
                    first_seq,
                    last_seq,
                } = *expected
                {
                    self.adopt(
                        batch.run,
                        (first_seq, last_seq),
                        &batch.events,
                        TEST_WRITER,
                        WrittenBy::TestWriter(batch),
                    );
                }
            }
        }
        let results = commit_batches(self.journal(0), &batches).expect("the storage works again");
        // What landed is answered from its records; a refused batch (but an empty one, refused
        // before anything is looked up) at or before the last judged one finds its writer seq
        // at or below the mark.
        let last_judged = answers
            .iter()
            .filter(|(_, outcome)| outcome.spends_seq())
            .map(|(batch, _)| batch.writer_seq)
            .max();
        for ((batch, expected), result) in answers.iter().zip(&results) {
            let expected = match expected {
                Outcome::Accepted {
                    first_seq,
                    last_seq,
                } if has_landed => Outcome::Duplicate {
                    first_seq: *first_seq,
                    last_seq: *last_seq,
                },
                Outcome::Refused(refusal)
                    if *refusal != Refusal::EmptyBatch
                        && has_landed
                        && last_judged.is_some_and(|seq| batch.writer_seq <= seq) =>
                {
                    Outcome::Refused(Refusal::WriterSeqReused {
                        writer_seq: batch.writer_seq,
                    })
                }
                other => other.clone(),
            };
            self.check_answer(
                batch,
                &expected,
                result,
                TEST_WRITER,
                WrittenBy::TestWriter(batch),
                false,
            );
        }
    }

    fn reconcile(&mut self, expected: &[RunRepair]) {
        for journal in &mut self.journals {
            *journal = None;
        }
        let store = Store::open_with(Home::at(&self.home), StoreOptions::default())
            .expect("a store opens on the home");
        let writer = store.journal().writer();
        let report = reconcile::reconcile(&store, &reconcile::Options::default())
            .expect("a reconcile pass runs");
        drop(store);
        self.reopen();
        // The active runs' decisions come first; after them, closed runs whose projections the
        // pass rebuilt (this test writes through the journal alone, so none were projected).
        let rows: Vec<(RunId, Vec<&str>)> = report.outcomes[..report.active]
            .iter()
            .map(|outcome| (outcome.run, outcome.appended.clone()))
            .collect();
        for outcome in &report.outcomes[report.active..] {
            assert_eq!(
                (outcome.row, outcome.appended.len()),
                ("closed", 0),
                "after the active runs, only projection repairs of closed runs"
            );
        }
        let expected_rows: Vec<(RunId, Vec<&str>)> = expected
            .iter()
            .map(|run| {
                (
                    run.run,
                    run.repairs
                        .iter()
                        .map(|repair| repair.event.name())
                        .collect(),
                )
            })
            .collect();
        let errors: Vec<(RunId, &str)> = report
            .outcomes
            .iter()
            .filter_map(|outcome| Some((outcome.run, outcome.error.as_deref()?)))
            .collect();
        assert_eq!(
            rows, expected_rows,
            "what the reconciler appends, run by run (its errors: {errors:?})"
        );
        for outcome in &report.outcomes {
            assert_eq!(outcome.error, None, "run {}", outcome.run);
        }
        for run in expected.iter().filter(|run| !run.repairs.is_empty()) {
            let head = self.fold(run.run).map_or(0, |state| state.head_seq);
            let seqs = (head + 1, head + run.repairs.len() as u64);
            let events: Vec<Event> = run
                .repairs
                .iter()
                .map(|repair| repair.event.clone())
                .collect();
            self.adopt(
                run.run,
                seqs,
                &events,
                writer,
                WrittenBy::Reconciler(&run.repairs),
            );
        }
    }
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
        let journal_id = Journal::open(home.join("journal.redb"))
            .expect("a new journal opens")
            .meta()
            .expect("meta reads")
            .journal_id;
        let mut sut = Sut {
            _dir: dir,
            home,
            faults: Faults::new(),
            journals: (0..HANDLES).map(|_| None).collect(),
            journal_id,
            records: BTreeMap::new(),
            log: Vec::new(),
            aliases: BTreeMap::new(),
            marks: BTreeMap::new(),
        };
        sut.reopen();
        sut
    }

    fn apply(mut sut: Sut, model: &Model, step: Step) -> Sut {
        let writers = sut.writers();
        let before = sut.contents(&writers);
        match (&step, &model.expected) {
            (
                Step::Append { handle, fault, .. },
                Expected::Batches {
                    answers,
                    is_retried,
                },
            ) => {
                let (batch, expected) = &answers[0];
                if let Some(fault) = fault {
                    sut.faults.arm(*fault);
                }
                let result =
                    sut.journal(*handle)
                        .append(batch.run, batch.events.clone(), batch.condition);
                let has_fired = sut.faults.disarm();
                assert!(
                    has_fired || fault.is_none() || !expected.writes(),
                    "a commit meets the fault armed at {fault:?}"
                );
                let writer = sut.journal(*handle).writer();
                sut.check_answer(
                    batch,
                    expected,
                    &result,
                    writer,
                    WrittenBy::Handle,
                    *is_retried,
                );
            }
            (Step::AppendAll { handle, fault, .. }, Expected::Batches { answers, .. }) => {
                if let Some(fault) = fault {
                    sut.faults.arm(*fault);
                }
                let results = sut.journal(*handle).append_all(
                    answers
                        .iter()
                        .map(|(batch, _)| (batch.run, batch.events.clone(), batch.condition)),
                );
                let has_fired = sut.faults.disarm();
                let has_accepted = answers.iter().any(|(_, outcome)| outcome.writes());
                assert!(
                    has_fired || fault.is_none() || !has_accepted,
                    "a commit meets the fault armed at {fault:?}"
                );
                assert_eq!(results.len(), answers.len(), "one answer per batch");
                let writer = sut.journal(*handle).writer();
                for ((batch, expected), result) in answers.iter().zip(&results) {
                    sut.check_answer(batch, expected, result, writer, WrittenBy::Handle, false);
                }
            }
            (
                Step::CommitGroup { .. } | Step::Recommit { .. },
                Expected::Batches { answers, .. },
            ) => {
                let batches: Vec<Batch> = answers.iter().map(|(batch, _)| batch.clone()).collect();
                let results =
                    commit_batches(sut.journal(0), &batches).expect("the storage does not fail");
                assert_eq!(results.len(), batches.len(), "one answer per batch");
                for ((batch, expected), result) in answers.iter().zip(&results) {
                    sut.check_answer(
                        batch,
                        expected,
                        result,
                        TEST_WRITER,
                        WrittenBy::TestWriter(batch),
                        false,
                    );
                }
            }
            (Step::CommitGroup { .. }, Expected::FailedGroup { answers, fault }) => {
                sut.commit_failing(answers, *fault, &before);
            }
            (Step::Reopen, Expected::Reopened) => sut.reopen(),
            (Step::Reconcile, Expected::Reconciled(repairs)) => sut.reconcile(repairs),
            (step, expected) => panic!("the model expects {expected:?} of {step:?}"),
        }
        if !model.expected.writes() {
            // A judged refusal spends its writer's seq: marks may rise, nothing else moves.
            let mut after = sut.contents(&writers);
            for ((writer, mark), (was_writer, was)) in after.marks.iter().zip(&before.marks) {
                assert_eq!(writer, was_writer, "the same writers");
                assert!(mark >= was, "writer {writer}'s mark never falls");
            }
            after.marks = before.marks.clone();
            assert_eq!(
                after, before,
                "{step:?} was refused or a repeat, and left no trace but its writer's mark"
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
            let snapshot = view.snapshot(run).expect("the snapshot reads");
            // The oracle: the run as the reference specification has it (the words of a
            // reconciler's reason aside: checked when the repair was adopted).
            assert_eq!(
                snapshot.as_ref().map(view_of).map(without_repair_reason),
                reference.clone().map(without_repair_reason),
                "run {run}: the journal's state is the reference's"
            );
            // The second check: the snapshot is the library's own fold of the records.
            assert_eq!(
                snapshot,
                sut.fold(run),
                "run {run}: the snapshot is the fold of the model's records"
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
            (0..SLOTS)
                .filter(|&slot| model.runs[slot]
                    .as_ref()
                    .is_some_and(|run| !run.is_closed()))
                .map(run_id)
                .collect::<Vec<_>>(),
            "active holds exactly the runs the reference has not closed"
        );
        // Which runs are terminal, by the reference; when they ended, by their records.
        let mut terminal: Vec<(UnixMs, RunId)> = folds
            .iter()
            .filter(|state| {
                model.runs[slot_of(state.run_id)]
                    .as_ref()
                    .is_some_and(|run| run.status.is_terminal())
            })
            .map(|state| {
                // A host's end is at the host's time.
                let ended = sut.records[&state.run_id]
                    .iter()
                    .find_map(|record| match record.event {
                        Event::Terminal { .. } => Some(record.time_ms),
                        Event::HostEnded { ended_at_ms, .. } => Some(ended_at_ms),
                        _ => None,
                    })
                    .expect("a terminal run has its Terminal or HostEnded record");
                (ended, state.run_id)
            })
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
            assert!(
                view.writer_mark(*writer)
                    .expect("a mark reads")
                    .is_some_and(|found| found >= *mark),
                "writer {writer}'s mark is at least its last committed writer seq"
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

/// The reference and the reducer on one record: both accept it, reaching the same state
/// (returned), or both refuse it, the reducer naming a rule the reference says is broken
/// (counted in `refused_by`).
fn agree(
    expected_run: &Option<Run>,
    library: &Option<RunState>,
    record: &Record,
    refused_by: &mut BTreeMap<Rule, usize>,
) -> Option<(Run, RunState)> {
    let expected = reference::apply(
        record.run_id,
        expected_run.as_ref(),
        &record.event,
        record.time_ms,
    );
    match (expected, state::apply(library.as_ref(), record)) {
        (Ok(run), Ok(state)) => {
            assert_eq!(view_of(&state), run, "after {:?}", record.event);
            Some((run, state))
        }
        (Err(rules), Err(error)) => {
            let rule = rule_of(&error).unwrap_or_else(|| {
                panic!("the reducer refused by a rule the reference lacks: {error}")
            });
            assert!(
                rules.contains(&rule),
                "{:?} breaks {rules:?}; the reducer says: {error}",
                record.event
            );
            *refused_by.entry(rule).or_default() += 1;
            None
        }
        (Ok(_), Err(error)) => panic!(
            "the reference accepts {:?} on {expected_run:?}; the reducer refuses: {error}",
            record.event
        ),
        (Err(rules), Ok(_)) => panic!(
            "the reference refuses {:?} on {expected_run:?} ({rules:?}); the reducer accepts",
            record.event
        ),
    }
}

/// Lives of one run, event by event, through the reference and the library's reducer side by
/// side (`state::apply` is what the journal calls; this drives it without a journal, so many
/// more lives fit): both accept the same events and reach the same state, or both refuse, the
/// reducer naming a rule the reference says is broken. Every rule of the reference is met
/// along the way, so a rule that stopped being exercised would fail here.
#[test]
fn the_reducer_and_the_reference_agree_event_by_event() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    const LIVES: usize = 3_000;
    const EVENTS_PER_LIFE: usize = 30;
    let mut runner = TestRunner::deterministic();
    let mut refused_by: BTreeMap<Rule, usize> = BTreeMap::new();
    for _ in 0..LIVES {
        let mut expected_run: Option<Run> = None;
        let mut library: Option<RunState> = None;
        for seq in 1..=EVENTS_PER_LIFE as u64 {
            // A run that ended has only its hooks left to record: they come often then.
            let hook_weight = if expected_run
                .as_ref()
                .is_some_and(|run| run.status.is_terminal())
            {
                8
            } else {
                1
            };
            let next = prop_oneof![
                3 => select(happy_choices(expected_run.as_ref())),
                2 => select(detours(expected_run.as_ref())),
                2 => arb_event(),
                1 => arb_rare_event(expected_run.as_ref()),
                1 => arb_queue_event(),
                1 => arb_delay_event(),
                hook_weight => arb_hook_event(expected_run.as_ref()),
                1 => arb_steer_event(expected_run.as_ref()),
            ];
            let event = next
                .new_tree(&mut runner)
                .expect("an event is drawn")
                .current();
            let record = Record {
                format_version: FORMAT_VERSION,
                run_id: run_id(0),
                seq: library.as_ref().map_or(1, |state| state.head_seq + 1),
                time_ms: TEST_BATCH_TIME_MS + seq,
                writer: TEST_WRITER,
                writer_seq: seq,
                event,
            };
            // A resume link, naming the run itself or another, tried at every place of every
            // life and then left out (the drawn events stay those of the seed).
            for from in [run_id(0), run_id(1)] {
                let probe = Record {
                    event: Event::Resumed { from },
                    ..record.clone()
                };
                agree(&expected_run, &library, &probe, &mut refused_by);
            }
            if let Some((run, state)) = agree(&expected_run, &library, &record, &mut refused_by) {
                expected_run = Some(run);
                library = Some(state);
            }
        }
    }
    // Lives too long to be drawn: steer requests up to the bounds of a run's queue and of
    // its whole life, and one more.
    for life in steer_floods() {
        let mut expected_run: Option<Run> = None;
        let mut library: Option<RunState> = None;
        for (index, event) in life.into_iter().enumerate() {
            let record = Record {
                format_version: FORMAT_VERSION,
                run_id: run_id(0),
                seq: library.as_ref().map_or(1, |state| state.head_seq + 1),
                time_ms: TEST_BATCH_TIME_MS + index as u64,
                writer: TEST_WRITER,
                writer_seq: index as u64 + 1,
                event,
            };
            if let Some((run, state)) = agree(&expected_run, &library, &record, &mut refused_by) {
                expected_run = Some(run);
                library = Some(state);
            }
        }
    }
    let unmet: Vec<Rule> = Rule::ALL
        .into_iter()
        .filter(|rule| !refused_by.contains_key(rule))
        .collect();
    assert_eq!(unmet, vec![], "rules no event broke: {refused_by:?}");
}

/// A steer request of the model's, for `steps`.
fn steer_requested(id: String, steps: Vec<u32>) -> Event {
    Event::SteerRequested {
        id,
        steps,
        mode: SteerMode::Steer,
        message: "look again".to_string(),
        source: "model".to_string(),
    }
}

/// A host's stop of step `step` alone.
fn step_stop(step: u32) -> Event {
    Event::StepStopRequested {
        step,
        by: "model".to_string(),
        reason: "enough".to_string(),
    }
}

/// Steer requests for the run as it is: to a step that has yet to end (or to one that ended),
/// with an id from a small pool, so that repeats happen; a step taking one; a step's stop (of
/// a step past the last now and then).
fn arb_steer_event(run: Option<&Run>) -> BoxedStrategy<Event> {
    let steps = run.map_or(1, |run| run.steps.len().max(1)) as u32;
    let id = (0..4u8).prop_map(|id| format!("steer-{id}"));
    prop_oneof![
        (id.clone(), 0..steps).prop_map(|(id, step)| steer_requested(id, vec![step])),
        (id, 0..steps).prop_map(|(id, step)| Event::SteerDelivered { id, step }),
        (0..steps + 1).prop_map(step_stop),
    ]
    .boxed()
}

/// Two lives: a running step sent more requests than may wait at once; and one that took
/// every request a run may have, then is sent one more.
fn steer_floods() -> Vec<Vec<Event>> {
    let start = || {
        vec![
            created(0, ANCIENT_MS, None),
            Event::RunnerStarted {
                runner: runner_pool()[0].clone(),
                instance_id: "flood".to_string(),
            },
            Event::StepRunning {
                step: 0,
                process: None,
            },
        ]
    };
    let mut waiting = start();
    waiting.extend((0..=20).map(|index| steer_requested(format!("w{index}"), vec![0])));
    let mut taken = start();
    for index in 0..=128 {
        let id = format!("t{index}");
        taken.push(steer_requested(id.clone(), vec![0]));
        taken.push(Event::SteerDelivered { id, step: 0 });
    }
    vec![waiting, taken]
}

/// Events the other strategies seldom make, for the run as it is: a step started or skipped
/// out of turn, a parallel run over its concurrency, a job update with a progress that is not
/// a number, a spec that is refused.
fn arb_rare_event(run: Option<&Run>) -> BoxedStrategy<Event> {
    let steps = run.map_or(1, |run| run.steps.len().max(1)) as u32;
    prop_oneof![
        (0..steps).prop_map(|step| Event::StepRunning {
            step,
            process: None,
        }),
        (0..steps).prop_map(|step| Event::StepFinished {
            step,
            outcome: StepOutcome {
                end: StepEnd::Skipped,
                exit_code: None,
                error: None,
            },
        }),
        (0..steps).prop_map(|step| Event::ExternalJobUpdated {
            step,
            job: ExternalJobStatus {
                state: JobState::Running,
                id: None,
                progress: Some(f64::INFINITY),
                message: None,
                url: None,
            },
        }),
        Just(created(4, ANCIENT_MS, None)),
    ]
    .boxed()
}

/// A run's hook events, mostly the next right one for where its hooks are (an attempt
/// claimed in turn, the open attempt ended, failing with a retry most of the time so that
/// hooks reach their last attempt), sometimes a wrong one: an attempt out of turn, a hook out
/// of range, a retry after a delivery, an end for an attempt not claimed.
fn arb_hook_event(run: Option<&Run>) -> BoxedStrategy<Event> {
    let hooks = run.map(|run| run.hooks.clone()).unwrap_or_default();
    let claim = |hook: u32, attempt: u32| Event::HookAttempted {
        hook,
        attempt,
        claimant: runner_pool()[0].clone(),
        by: "model".to_string(),
        lease_ms: 1_000,
    };
    let outcome = prop_oneof![
        Just(HookOutcome::Delivered),
        Just(HookOutcome::Failed {
            exit: ProcessExit {
                code: Some(1),
                signal: None,
            }
        }),
        Just(HookOutcome::TimedOut),
        Just(HookOutcome::Abandoned {
            reason: "its deliverer died".to_string(),
        }),
    ];
    let right = (0..2u32, outcome.clone(), 0..4u8).prop_map(move |(hook, outcome, retry)| {
        let state = hooks.iter().find(|state| state.hook == hook);
        match state.and_then(|state| state.open.as_ref()) {
            Some((attempt, ..)) => {
                let is_delivered = outcome == HookOutcome::Delivered;
                Event::HookEnded {
                    hook,
                    attempt: *attempt,
                    retry_at_ms: (retry > 0 && !is_delivered && *attempt < 5).then_some(9),
                    outcome,
                }
            }
            None => claim(hook, state.map_or(0, |state| state.attempts) + 1),
        }
    });
    prop_oneof![
        6 => right,
        1 => (0..3u32, 0..7u32).prop_map(move |(hook, attempt)| claim(hook, attempt)),
        1 => Just(claim(17, 1)),
        1 => (0..2u32, 0..7u32, outcome, proptest::option::of(Just(9u64))).prop_map(
            |(hook, attempt, outcome, retry_at_ms)| Event::HookEnded {
                hook,
                attempt,
                outcome,
                retry_at_ms,
            }
        ),
    ]
    .boxed()
}

/// A delayed start, due long ago or far in the future (so any clock the model's records are
/// written at judges it alike: [`clock_of`]), and the end of a delay.
fn arb_delay_event() -> BoxedStrategy<Event> {
    prop_oneof![
        prop_oneof![Just(ANCIENT_MS), Just(FUTURE_MS)].prop_map(|due_at_ms| {
            Event::StartDelayed {
                due_at_ms,
                idle_timeout_ms: None,
                heartbeat_ms: Some(5),
            }
        }),
        Just(Event::DelayEnded {
            by: "test".to_string(),
        }),
        prop_oneof![Just(None), Just(Some(60_000))].prop_map(|hold_ms| Event::UniqueKey {
            key: "k".to_string(),
            hold_ms,
        }),
        arb_retry_event(),
    ]
    .boxed()
}

/// The causes of the model's retry policies: failed exits only. A crash a reconcile pass tries
/// again is due at the pass's own clock plus a jittered backoff, which the model cannot
/// foresee (its next `DelayEnded` would be judged against it); the reference's reconciler
/// states that row all the same, and `tests/it/retry.rs` and `tests/it/watch.rs` show crashes
/// tried again with the real binaries.
fn exits_only() -> runjournal::event::RetryOn {
    runjournal::event::RetryOn {
        exit: true,
        crash: false,
        timeout: false,
        exit_codes: Vec::new(),
    }
}

/// A retry policy (of no retry now and then, or a longest backoff shorter than the first), and
/// the end of an attempt, the current one or not, due long ago or far in the future.
fn arb_retry_event() -> BoxedStrategy<Event> {
    prop_oneof![
        (
            prop_oneof![Just(0u32), Just(1), Just(2)],
            prop_oneof![Just(10u64), Just(1)]
        )
            .prop_map(|(retries, backoff_max_ms)| Event::RetryPolicy {
                retries,
                backoff_ms: 5,
                backoff_max_ms,
                on: exits_only(),
                idle_timeout_ms: None,
                heartbeat_ms: Some(5),
            }),
        (
            1..=3u32,
            prop_oneof![
                Just(runjournal::event::AttemptCause::Exit),
                Just(runjournal::event::AttemptCause::Crash)
            ],
            prop_oneof![Just(ANCIENT_MS), Just(FUTURE_MS)],
        )
            .prop_map(|(attempt, cause, retry_at_ms)| Event::AttemptEnded {
                attempt,
                cause,
                error: Some("failed".to_string()),
                summary: "s".to_string(),
                exit_code: 3,
                retry_at_ms,
            }),
    ]
    .boxed()
}

/// A run's queue and dependency events, right or wrong for where it is: joining a queue (by
/// a name that may not be one), being admitted, recording dependencies (one naming a run twice),
/// finding them met.
fn arb_queue_event() -> BoxedStrategy<Event> {
    prop_oneof![
        prop_oneof![Just("q"), Just("a b"), Just("")].prop_map(|queue| Event::QueueJoined {
            queue: queue.to_string(),
            idle_timeout_ms: None,
            heartbeat_ms: None,
        }),
        Just(Event::QueueAdmitted {
            by: "test".to_string(),
        }),
        prop_oneof![Just(0u8), Just(1), Just(2)].prop_map(|which| Event::DependsOn {
            after: vec![RunId::from_bytes([which; 16])],
            after_any: if which == 2 {
                vec![RunId::from_bytes([which; 16])]
            } else {
                Vec::new()
            },
            idle_timeout_ms: None,
            heartbeat_ms: None,
        }),
        Just(Event::DependenciesMet {
            by: "test".to_string(),
        }),
    ]
    .boxed()
}
