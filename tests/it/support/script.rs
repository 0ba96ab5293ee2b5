//! A scripted lifecycle for the power-cut and fault sweeps: several runs with fixed ids, every
//! event kind, conditional appends (some refused on purpose), runs left for the reconciler to
//! close, and a burst of appends from several threads at once so that some commits hold more
//! than one batch.

use std::sync::Arc;

use runjournal::event::{
    ControlAction, Event, ExternalJobStatus, JobState, Mode, ProcessIdentity, RunSpec, StepAction,
    StepEnd, TerminalState,
};
use runjournal::journal::{AppendError, Appended};
use runjournal::testkit as kit;
use runjournal::{Condition, Journal, RunId};

/// Creation time of every scripted run: long past, so the reconciler's start grace is over.
pub const CREATED_AT_MS: u64 = 1_700_000_000_000;

/// One append the script made, and what it got.
#[derive(Debug)]
pub struct Attempt {
    pub run: RunId,
    pub events: Vec<Event>,
    pub result: Result<Appended, AppendError>,
}

impl Attempt {
    /// The answer in a form comparable across runs of the script: the seqs of an acknowledged
    /// append, or the kind of error.
    pub fn outcome(&self) -> String {
        match &self.result {
            Ok(appended) => format!("ok {}..={}", appended.first_seq, appended.last_seq),
            Err(error) => format!("refused: {}", error_kind(error)),
        }
    }

    /// Whether the append was refused by a rule (not by storage): nothing was written.
    pub fn is_refused_by_rule(&self) -> bool {
        matches!(&self.result, Err(error) if !matches!(error, AppendError::Storage(_)))
    }
}

fn error_kind(error: &AppendError) -> &'static str {
    match error {
        AppendError::UnknownRun { .. } => "unknown run",
        AppendError::Transition { .. } => "transition",
        AppendError::HeadMismatch { .. } => "head mismatch",
        AppendError::AlreadyTerminal { .. } => "already terminal",
        AppendError::Storage(_) => "storage",
        _ => "other",
    }
}

/// A scripted run id: fixed bytes, so two runs of the script name the same runs.
pub fn run_id(n: u8) -> RunId {
    let mut bytes = [0u8; 16];
    bytes[0] = 0x01;
    bytes[1] = 0x8c;
    bytes[15] = n;
    RunId::from_bytes(bytes)
}

fn spec(name: &str, mode: Mode, actions: Vec<StepAction>) -> Arc<RunSpec> {
    let steps = actions
        .into_iter()
        .enumerate()
        .map(|(index, action)| kit::step(&format!("{name}-{index}"), action))
        .collect();
    Arc::new(RunSpec {
        name: Some(name.to_string()),
        concurrency: 2,
        ..kit::spec(mode, steps)
    })
}

fn created(spec: Arc<RunSpec>, tool_call_id: Option<&str>) -> Event {
    kit::created(
        spec,
        CREATED_AT_MS,
        kit::hosts(Some("session-1"), None, tool_call_id),
    )
}

/// An identity that is certainly not a live process, nor a group anyone may signal: this
/// test's own pid with a start time it does not have (a reused pid).
pub fn dead_identity() -> ProcessIdentity {
    let me = runjournal::liveness::current().expect("identity of the test process");
    ProcessIdentity {
        start_time: me.start_time + 1,
        ..me
    }
}

/// An identity from another boot.
pub fn other_boot_identity() -> ProcessIdentity {
    ProcessIdentity {
        boot_id: "00000000-0000-0000-0000-000000000000".to_string(),
        ..dead_identity()
    }
}

fn runner_started(instance: &str) -> Event {
    kit::runner_started(dead_identity(), instance)
}

fn step_running(step: u32) -> Event {
    kit::step_running(step, Some(dead_identity()))
}

fn step_finished(step: u32, end: StepEnd) -> Event {
    let is_complete = end == StepEnd::Complete;
    let error = (!is_complete).then(|| format!("step {step} {end:?}"));
    kit::step_finished(step, end, is_complete.then_some(0), error.as_deref())
}

fn terminal(state: TerminalState, exit_code: i32) -> Event {
    let error = (state != TerminalState::Complete).then(|| format!("{state:?}"));
    kit::terminal(state, exit_code, "scripted", error.as_deref())
}

fn job(state: JobState, progress: Option<f64>) -> Event {
    let job = ExternalJobStatus {
        message: Some(format!("{state:?}")),
        ..kit::job(state, "job-1", progress)
    };
    kit::job_updated(0, job)
}

/// A `RunCreated` of a one-step run named after `run`.
pub fn created_event(run: RunId) -> Event {
    created(
        spec(&format!("run-{run}"), Mode::Single, vec![kit::sh("true")]),
        None,
    )
}

/// A `RunnerStarted` of a dead runner.
pub fn runner_started_event(instance: &str) -> Event {
    runner_started(instance)
}

/// Runs the script against `journal`, returning every attempt in order (the burst's attempts
/// last, in thread order).
pub fn run(journal: &Journal) -> Vec<Attempt> {
    let mut attempts = Vec::new();
    let mut append = |run: RunId, events: Vec<Event>, condition: Condition| {
        let result = journal.append(run, events.clone(), condition);
        attempts.push(Attempt {
            run,
            events,
            result,
        });
    };
    let head = Condition::expect_head;
    let alive = Condition::expect_not_terminal;

    // A: a chain that completes, is observed closed by its parent, then dismissed.
    let a = run_id(1);
    let a_spec = spec(
        "alpha",
        Mode::Chain,
        vec![kit::sh("true"), kit::sh("true"), kit::sh("true")],
    );
    append(a, vec![created(a_spec, Some("tool-a"))], head(0));
    append(a, vec![runner_started("a-1")], head(1));
    for step in 0..3 {
        append(a, vec![step_running(step)], alive());
        append(a, vec![step_finished(step, StepEnd::Complete)], alive());
    }
    append(
        a,
        vec![
            terminal(TerminalState::Complete, 0),
            kit::runner_exited("a-1", 0),
        ],
        alive(),
    );
    append(
        a,
        vec![Event::Dismissed {
            at_ms: CREATED_AT_MS + 60_000,
        }],
        Condition::none(),
    );

    // B: an external job, stopped by a control request.
    let b = run_id(2);
    let b_spec = spec("bravo", Mode::Single, vec![kit::provider("provider")]);
    append(b, vec![created(b_spec, None)], head(0));
    append(b, vec![runner_started("b-1")], head(1));
    append(b, vec![step_running(0)], head(2));
    append(b, vec![job(JobState::Queued, None)], alive());
    append(b, vec![job(JobState::Running, Some(0.5))], alive());
    append(
        b,
        vec![kit::control(
            ControlAction::Stop,
            "script",
            "a scripted stop",
        )],
        alive(),
    );
    append(b, vec![step_finished(0, StepEnd::Stopped)], alive());
    append(
        b,
        vec![
            terminal(TerminalState::Stopped, 143),
            kit::runner_exited("b-1", 143),
        ],
        alive(),
    );

    // Refused on purpose: nothing may be written for these.
    append(a, vec![terminal(TerminalState::Failed, 1)], alive());
    append(b, vec![runner_started("b-2")], head(3));
    append(run_id(99), vec![runner_started("x")], Condition::none());

    // C: parallel, its runner died mid-way (left running for the reconciler).
    let c = run_id(3);
    let c_spec = spec(
        "charlie",
        Mode::Parallel,
        vec![kit::sh("sleep 1"), kit::sh("sleep 1")],
    );
    append(c, vec![created(c_spec, Some("tool-c"))], head(0));
    append(c, vec![runner_started("c-1")], head(1));
    append(c, vec![step_running(0)], alive());
    append(c, vec![step_running(1)], alive());
    append(c, vec![step_finished(0, StepEnd::Failed)], alive());
    // Refused: step 0 is over.
    append(c, vec![step_finished(0, StepEnd::Complete)], alive());

    // D: queued, its runner never started.
    let d = run_id(4);
    append(
        d,
        vec![created(
            spec("delta", Mode::Single, vec![kit::sh("true")]),
            None,
        )],
        head(0),
    );

    // E: its runner ran in another boot.
    let e = run_id(5);
    append(
        e,
        vec![created(
            spec("echo", Mode::Single, vec![kit::sh("true")]),
            None,
        )],
        head(0),
    );
    append(
        e,
        vec![kit::runner_started(other_boot_identity(), "e-1")],
        head(1),
    );

    // F: terminal, but nobody saw the runner go.
    let f = run_id(6);
    append(
        f,
        vec![created(
            spec("foxtrot", Mode::Single, vec![kit::sh("false")]),
            None,
        )],
        head(0),
    );
    append(f, vec![runner_started("f-1")], head(1));
    append(f, vec![step_running(0)], head(2));
    append(f, vec![step_finished(0, StepEnd::Failed)], head(3));
    append(f, vec![terminal(TerminalState::Failed, 1)], head(4));

    // G: stale: the runner's exit was seen before it recorded an outcome.
    let g = run_id(7);
    append(
        g,
        vec![created(
            spec("golf", Mode::Single, vec![kit::sh("true")]),
            None,
        )],
        head(0),
    );
    append(g, vec![runner_started("g-1")], head(1));
    append(g, vec![kit::runner_exited("g-1", 137)], Condition::none());

    // A burst from three threads at once: some commits hold several batches.
    let burst: Vec<Vec<Attempt>> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..3u8)
            .map(|n| {
                scope.spawn(move || {
                    let run = run_id(10 + n);
                    let name = format!("burst-{n}");
                    let batches = vec![
                        (
                            vec![created(
                                spec(&name, Mode::Single, vec![kit::sh("true")]),
                                None,
                            )],
                            head(0),
                        ),
                        (vec![runner_started(&name)], head(1)),
                        (vec![step_running(0)], alive()),
                        (vec![step_finished(0, StepEnd::Complete)], alive()),
                        (
                            vec![
                                terminal(TerminalState::Complete, 0),
                                kit::runner_exited(&name, 0),
                            ],
                            alive(),
                        ),
                    ];
                    batches
                        .into_iter()
                        .map(|(events, condition)| Attempt {
                            run,
                            result: journal.append(run, events.clone(), condition),
                            events,
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|thread| thread.join().expect("a burst thread"))
            .collect()
    });
    attempts.extend(burst.into_iter().flatten());
    attempts
}
