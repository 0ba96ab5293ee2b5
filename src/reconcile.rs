//! The reconciler: closes runs whose runner died, and re-projects damaged projections.
//!
//! It walks the `active` table, and the log records since its last pass (for the projections
//! of runs closed meanwhile, see [`ProjectionCursor`]), so its cost grows with the runs not yet
//! closed and what changed since, not with every run ever. For each active run it evaluates one
//! row of [`TABLE`] (docs/design.md, "Reconciler") and appends that row's events with
//! `expect_head(head)`: if anything else landed in between, the append fails, the run is read
//! again and decided again. Two reconcilers, or a reconciler and a live runner, therefore never
//! record two `Terminal`s.
//!
//! Invariants:
//! * every combination of [`Inputs`] matches exactly one row of [`TABLE`];
//! * the reconciler never records anything for a run whose runner is alive, unless someone
//!   recorded that runner's process gone (a stale run, docs/design.md, "Rules": the recorded
//!   observation outweighs a liveness look, which may have failed);
//! * it signals step processes only of a runner it knows dead in this boot and this PID
//!   namespace, and only groups that are provably ours ([`process_group::is_ours`]);
//! * a runner recorded in another PID namespace is unknown to it: it neither repairs its run
//!   nor signals anything of it, and says why (`Outcome::note`).

use std::time::Duration;

use crate::event::{
    AttemptCause, Event, Observer, Proof, Repairer, RunId, TerminalState, UnixMs, now_ms,
    truncate_text,
};
use crate::exit::{UNKNOWN_EXIT, describe_exit, describe_observed_exit};
use crate::journal::{AppendError, Condition, ReadError, View};
use crate::liveness::{self, Liveness};
use crate::logs::{self, TailBounds};
use crate::process_group::{self, GroupEnd, Reaping};
use crate::projection::pi_events::{self, HostVerdict};
use crate::projection::{self, ProjectionError};
use crate::state::{AttemptFailure, RunState, StepStatus};
use crate::store::Store;

/// How long a queued run may wait for its runner before it counts as never started.
pub const START_GRACE_MS: u64 = 10_000;

/// How much of runner.log's end goes into a failure reason.
pub const LOG_TAIL: TailBounds = TailBounds {
    max_lines: 5,
    max_bytes: 300,
};

/// What the reconciler knows of the runner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RunnerLiveness {
    /// No runner ever recorded `RunnerStarted`.
    None,
    Alive,
    Dead,
    /// Recorded in another boot: the host restarted since.
    OtherBoot,
    /// Recorded in another PID namespace than this process's: unknown from here.
    OtherNamespace,
}

/// The facts one row of the table is chosen by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Inputs {
    pub is_terminal: bool,
    pub is_process_observed: bool,
    pub runner: RunnerLiveness,
    /// The run became startable — created, or admitted by its queue — longer than
    /// [`START_GRACE_MS`] ago.
    pub is_past_start_grace: bool,
    /// The run waits — in its queue for a slot, for its dependencies or for its due time: no
    /// runner is due until it is admitted, they are met or its delay ends.
    pub is_waiting_for_slot: bool,
    /// A host's own repair ended the run (pi-subagents' `subagent.run.repaired_stale`, in the
    /// pi-subagents layout's events.jsonl) before runjournal's reconciler did.
    pub has_host_verdict: bool,
}

/// Whether a host's verdict ends the run here: the host's own repair ended it first, and no
/// runner of ours can still end it (one alive, or of another namespace, ends it itself) nor is
/// one due (a run waiting in its queue is left to its queue).
fn is_host_ended(i: &Inputs) -> bool {
    !i.is_terminal
        && i.has_host_verdict
        && !matches!(
            i.runner,
            RunnerLiveness::Alive | RunnerLiveness::OtherNamespace
        )
        && !i.is_waiting_for_slot
}

/// What a row does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    Nothing,
    /// Terminal(failed) naming the dead runner, + ProcessTerminalObserved(unknown); end the
    /// orphaned step groups, and record the messages their steps took from their inboxes
    /// meanwhile delivered, before the end.
    FailRunnerDied,
    /// Terminal(failed) "host restarted", + ProcessTerminalObserved(unknown); signal nothing.
    FailHostRestarted,
    /// Terminal(failed) from what the recorded observation says of the runner's end; end the
    /// orphaned step groups when the runner died in this boot.
    FailAfterObservedExit,
    /// Terminal(failed) "runner never started", + ProcessTerminalObserved(not-started) if
    /// missing.
    FailNeverStarted,
    /// ProcessTerminalObserved(unknown) after a Terminal.
    ObserveGone,
    /// ProcessTerminalObserved(not-started) after a Terminal that no runner recorded.
    ObserveNeverStarted,
    /// `HostEnded` with the host's verdict, + ProcessTerminalObserved when the runner is gone;
    /// end the orphaned step groups of a runner dead in this boot.
    AdoptHostVerdict,
}

impl Action {
    /// The action's name, as `runjournal reconcile --json` prints it.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Nothing => "nothing",
            Action::FailRunnerDied => "fail-runner-died",
            Action::FailHostRestarted => "fail-host-restarted",
            Action::FailAfterObservedExit => "fail-after-observed-exit",
            Action::FailNeverStarted => "fail-never-started",
            Action::ObserveGone => "observe-gone",
            Action::ObserveNeverStarted => "observe-never-started",
            Action::AdoptHostVerdict => "adopt-host-verdict",
        }
    }

    /// Whether the action fails a run that was not terminal (its runner gone, or never
    /// started): a repair worth telling a reader. Recording that an ended run's runner is gone
    /// closes the run as its runner's parent would have: routine.
    pub fn is_repair(self) -> bool {
        match self {
            Action::FailRunnerDied
            | Action::FailHostRestarted
            | Action::FailAfterObservedExit
            | Action::FailNeverStarted
            | Action::AdoptHostVerdict => true,
            Action::Nothing | Action::ObserveGone | Action::ObserveNeverStarted => false,
        }
    }
}

/// One row of the decision table.
#[derive(Debug)]
pub struct Row {
    pub name: &'static str,
    pub why: &'static str,
    pub matches: fn(&Inputs) -> bool,
    pub action: Action,
}

/// The reconciler's decision table (docs/design.md, "Reconciler"), one row per case.
pub const TABLE: &[Row] = &[
    Row {
        name: "closed",
        why: "terminal and its process observed: nothing is left to close",
        matches: |i| i.is_terminal && i.is_process_observed,
        action: Action::Nothing,
    },
    Row {
        name: "finishing",
        why: "terminal, and the runner is still alive: it is on its way out, and whoever sees it go records that",
        matches: |i| i.is_terminal && !i.is_process_observed && i.runner == RunnerLiveness::Alive,
        action: Action::Nothing,
    },
    Row {
        name: "finishing-elsewhere",
        why: "terminal, and the runner was recorded in another PID namespace: from here it is neither seen alive nor gone, so its end is left to a reconciler in its namespace",
        matches: |i| {
            i.is_terminal && !i.is_process_observed && i.runner == RunnerLiveness::OtherNamespace
        },
        action: Action::Nothing,
    },
    Row {
        name: "gone-after-terminal",
        why: "terminal, runner gone, and nobody recorded seeing it go: record that it is gone, how unknown",
        matches: |i| {
            i.is_terminal
                && !i.is_process_observed
                && matches!(i.runner, RunnerLiveness::Dead | RunnerLiveness::OtherBoot)
        },
        action: Action::ObserveGone,
    },
    Row {
        name: "terminal-without-runner",
        why: "terminal before any runner started (the launcher gave up): no runner will ever exist",
        matches: |i| i.is_terminal && !i.is_process_observed && i.runner == RunnerLiveness::None,
        action: Action::ObserveNeverStarted,
    },
    Row {
        name: "host-ended",
        why: "a host's own repair ended the run first (pi-subagents' stale-run reconciler wrote its verdict): its verdict is the run's one end, recorded as the host made it",
        matches: is_host_ended,
        action: Action::AdoptHostVerdict,
    },
    Row {
        name: "running",
        why: "the runner is alive and owns the run",
        matches: |i| {
            !i.is_terminal
                && !is_host_ended(i)
                && !i.is_process_observed
                && i.runner == RunnerLiveness::Alive
        },
        action: Action::Nothing,
    },
    Row {
        name: "runner-elsewhere",
        why: "the runner was recorded in another PID namespace: from here it is unknown, neither alive nor dead, so the run is neither repaired nor signalled; a reconciler in its namespace can tell",
        matches: |i| {
            !i.is_terminal
                && !is_host_ended(i)
                && !i.is_process_observed
                && i.runner == RunnerLiveness::OtherNamespace
        },
        action: Action::Nothing,
    },
    Row {
        name: "runner-died",
        why: "the runner is dead in this boot without recording an outcome: fail the run naming it",
        matches: |i| {
            !i.is_terminal
                && !is_host_ended(i)
                && !i.is_process_observed
                && i.runner == RunnerLiveness::Dead
        },
        action: Action::FailRunnerDied,
    },
    Row {
        name: "host-restarted",
        why: "the runner ran in an earlier boot: it is gone, and its pids mean nothing now",
        matches: |i| {
            !i.is_terminal
                && !is_host_ended(i)
                && !i.is_process_observed
                && i.runner == RunnerLiveness::OtherBoot
        },
        action: Action::FailHostRestarted,
    },
    Row {
        name: "stale",
        why: "someone saw the runner exit before it recorded an outcome: fail the run with what they saw",
        matches: |i| {
            !i.is_terminal
                && !is_host_ended(i)
                && i.is_process_observed
                && i.runner != RunnerLiveness::None
        },
        action: Action::FailAfterObservedExit,
    },
    Row {
        name: "launcher-gave-up",
        why: "the launcher recorded that no runner started: fail the run",
        matches: |i| {
            !i.is_terminal
                && !is_host_ended(i)
                && i.is_process_observed
                && i.runner == RunnerLiveness::None
        },
        action: Action::FailNeverStarted,
    },
    Row {
        name: "never-started",
        why: "queued past the start grace with no runner: it will not start now",
        matches: |i| {
            !i.is_terminal
                && !is_host_ended(i)
                && !i.is_process_observed
                && i.runner == RunnerLiveness::None
                && !i.is_waiting_for_slot
                && i.is_past_start_grace
        },
        action: Action::FailNeverStarted,
    },
    Row {
        name: "starting",
        why: "queued within the start grace: the runner may still be starting",
        matches: |i| {
            !i.is_terminal
                && !is_host_ended(i)
                && !i.is_process_observed
                && i.runner == RunnerLiveness::None
                && !i.is_waiting_for_slot
                && !i.is_past_start_grace
        },
        action: Action::Nothing,
    },
    Row {
        name: "waiting-for-slot",
        why: "it waits in its queue for a slot, for its dependencies or for its due time: no runner is due before it is admitted, they are met or it is due, however long it waits",
        matches: |i| {
            !i.is_terminal
                && !is_host_ended(i)
                && !i.is_process_observed
                && i.runner == RunnerLiveness::None
                && i.is_waiting_for_slot
        },
        action: Action::Nothing,
    },
];

/// The row for these inputs.
pub fn decide(inputs: &Inputs) -> &'static Row {
    let mut matching = TABLE.iter().filter(|row| (row.matches)(inputs));
    let row = matching
        .next()
        .expect("the decision table covers every combination of inputs");
    debug_assert!(
        matching.next().is_none(),
        "exactly one row matches {inputs:?}"
    );
    row
}

/// Options of a reconcile pass.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    pub start_grace_ms: u64,
    /// Grace between SIGTERM and SIGKILL for the step groups of a dead runner.
    pub step_grace: Duration,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            start_grace_ms: START_GRACE_MS,
            step_grace: Duration::from_secs(1),
        }
    }
}

/// What the pass did for one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub run: RunId,
    pub row: &'static str,
    pub action: Action,
    /// Events appended (empty for `Nothing`, or when someone else acted first).
    pub appended: Vec<&'static str>,
    /// The reason recorded in a repaired `Terminal`.
    pub reason: Option<String>,
    /// Why nothing was done where a person might expect something (a runner of another PID
    /// namespace, unknown from here).
    pub note: Option<String>,
    /// Whether the run's projection was rewritten.
    pub reprojected: bool,
    /// What went wrong, if anything; the run is left for the next pass.
    pub error: Option<String>,
    /// Whether what went wrong is damage to the journal ([`crate::journal::is_damage`]).
    pub damaged: bool,
    /// Whether the run's files were left as they were because another process kept its
    /// projection lock ([`ProjectionError::LockHeld`]: a process stopped while writing them).
    pub files_held: bool,
}

impl Outcome {
    /// Records a projection that failed: left for the next pass.
    fn projection_failed(&mut self, failure: &ProjectionError) {
        self.damaged |= crate::journal::is_damage_in_chain(failure);
        self.files_held |= matches!(failure, ProjectionError::LockHeld { .. });
        self.error = Some(failure.to_string());
    }

    /// The pass repaired the run: it recorded a stale run failed ([`Action::is_repair`]).
    pub fn is_repair(&self) -> bool {
        !self.appended.is_empty() && self.action.is_repair()
    }
}

/// A whole pass.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// One per active run, then one per closed run whose projection had to be repaired.
    pub outcomes: Vec<Outcome>,
    /// How many active runs the pass decided.
    pub active: usize,
    /// The pass's appends gave up on the journal's write lock, which another process kept past
    /// the store's bound (a process stopped inside a commit): nothing more of it was written.
    pub lock_held: Option<crate::journal::LockHeld>,
}

impl Report {
    /// Runs the pass changed (appended to or re-projected).
    pub fn changed(&self) -> impl Iterator<Item = &Outcome> {
        self.outcomes
            .iter()
            .filter(|outcome| !outcome.appended.is_empty() || outcome.reprojected)
    }
}

/// Why a pass could not run at all.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReconcileError {
    #[error("reading the active runs: {0}")]
    Read(#[from] ReadError),
}

fn runner_liveness(state: &RunState) -> RunnerLiveness {
    match &state.runner {
        None => RunnerLiveness::None,
        Some(runner) => match liveness::check(&runner.identity) {
            Ok(Liveness::Alive) => RunnerLiveness::Alive,
            Ok(Liveness::Dead) => RunnerLiveness::Dead,
            Ok(Liveness::OtherBoot) => RunnerLiveness::OtherBoot,
            Ok(Liveness::OtherNamespace) => RunnerLiveness::OtherNamespace,
            // Cannot look: never declare it dead on a failed look.
            Err(_) => RunnerLiveness::Alive,
        },
    }
}

/// The facts about a run now.
pub fn inputs_of(state: &RunState, now_ms: UnixMs, options: &Options) -> Inputs {
    Inputs {
        is_terminal: state.is_terminal(),
        is_process_observed: state.process_terminal.is_some(),
        runner: runner_liveness(state),
        is_past_start_grace: state.startable_at_ms().is_some_and(|startable_at_ms| {
            now_ms.saturating_sub(startable_at_ms) > options.start_grace_ms
        }),
        is_waiting_for_slot: state.is_waiting(),
        has_host_verdict: false,
    }
}

/// A host's verdict on `state`'s run, if a host's own repair ended it first: the earliest
/// `subagent.run.repaired_stale` of the run that runjournal did not write, at the end of its
/// pi events file (the pi-subagents layout only). Only for a run that is not terminal.
pub fn host_verdict(home: &crate::home::Home, state: &RunState) -> Option<HostVerdict> {
    if state.is_terminal() {
        return None;
    }
    let path = home.pi_events_path(state.run_id)?;
    let (tail, _) =
        crate::durable_fs::read_tail(&path, projection::HOST_VERDICT_WINDOW_BYTES).ok()?;
    pi_events::host_verdicts(&tail, state.run_id)
        .into_iter()
        .next()
}

/// The last lines of runner.log ([`LOG_TAIL`]); none when it is empty or cannot be read (a
/// reason is still recorded without it).
fn runner_log_tail(store: &Store, run: RunId) -> Option<String> {
    logs::tail(&store.home().runner_log_path(run), LOG_TAIL)
        .ok()
        .filter(|tail| !tail.is_empty())
}

fn with_log_tail(mut reason: String, tail: Option<String>) -> String {
    if let Some(tail) = tail {
        reason.push_str("; runner.log ends: ");
        reason.push_str(&tail);
    }
    truncate_text(&reason, crate::event::MAX_TEXT_BYTES)
}

fn failed(reason: String) -> Event {
    Event::Terminal {
        state: TerminalState::Failed,
        error: Some(reason.clone()),
        summary: reason,
        exit_code: 1,
        repaired_by: Some(Repairer::Reconciler),
    }
}

/// The events that end a run whose runner died without recording an outcome, for `reason`:
/// when its retry policy tries a crash again, the runner's end (`gone`, if not recorded yet)
/// and then the attempt's `AttemptEnded`, which keeps it (docs/design.md, "Retries");
/// otherwise its `Terminal(failed)`, then `gone`.
fn crash_end(state: &RunState, reason: String, gone: Option<Event>) -> Vec<Event> {
    let failure = AttemptFailure {
        cause: AttemptCause::Crash,
        error: Some(reason.clone()),
        summary: reason.clone(),
        exit_code: 1,
    };
    match state.retry_event(failure, now_ms(), rand::random()) {
        Some(attempt_ended) => gone.into_iter().chain([attempt_ended]).collect(),
        None => [failed(reason)].into_iter().chain(gone).collect(),
    }
}

fn observed_gone(state: &RunState, proof: Proof) -> Event {
    Event::ProcessTerminalObserved {
        instance_id: state
            .runner
            .as_ref()
            .map(|runner| runner.instance_id.clone())
            .unwrap_or_default(),
        exit: None,
        proof,
        observer: Observer::Reconciler,
    }
}

/// The events a row appends for this run, and the reason recorded.
fn events_for(
    store: &Store,
    state: &RunState,
    action: Action,
    inputs: &Inputs,
    verdict: Option<&HostVerdict>,
) -> (Vec<Event>, Option<String>) {
    let run = state.run_id;
    let pid = state.runner.as_ref().map(|runner| runner.identity.pid);
    match action {
        Action::Nothing => (vec![], None),
        Action::AdoptHostVerdict => {
            let Some(verdict) = verdict else {
                return (vec![], None);
            };
            let message = truncate_text(&verdict.message, crate::event::MAX_TEXT_BYTES);
            let mut events = vec![Event::HostEnded {
                state: TerminalState::Failed,
                exit_code: 1,
                message: message.clone(),
                ended_at_ms: verdict.ts,
                result_path: verdict
                    .result_path
                    .as_deref()
                    .map(|path| truncate_text(path, crate::event::MAX_TEXT_BYTES)),
            }];
            // The runner is gone (or never came): its end is recorded as for any run closed
            // here. A live one sees the end and ends its steps; whoever sees it go records that.
            let proof = match inputs.runner {
                RunnerLiveness::None => Some(Proof::NotStarted),
                RunnerLiveness::Dead | RunnerLiveness::OtherBoot => Some(Proof::Unknown),
                RunnerLiveness::Alive | RunnerLiveness::OtherNamespace => None,
            };
            if let Some(proof) = proof.filter(|_| state.process_terminal.is_none()) {
                events.push(observed_gone(state, proof));
            }
            (events, Some(message))
        }
        Action::FailRunnerDied => {
            let reason = with_log_tail(
                format!(
                    "runner {} exited without recording an outcome ({})",
                    pid.unwrap_or_default(),
                    describe_exit(UNKNOWN_EXIT)
                ),
                runner_log_tail(store, run),
            );
            let gone = Some(observed_gone(state, Proof::Unknown));
            (crash_end(state, reason.clone(), gone), Some(reason))
        }
        Action::FailHostRestarted => {
            let boot = state
                .runner
                .as_ref()
                .map(|runner| runner.identity.boot_id.clone())
                .unwrap_or_default();
            let reason = with_log_tail(
                format!(
                    "host restarted: runner {} ran in boot {boot} and did not record an outcome",
                    pid.unwrap_or_default()
                ),
                runner_log_tail(store, run),
            );
            let gone = Some(observed_gone(state, Proof::Unknown));
            (crash_end(state, reason.clone(), gone), Some(reason))
        }
        Action::FailAfterObservedExit => {
            let observed = state.process_terminal.as_ref();
            let reason = with_log_tail(
                format!(
                    "runner {} exited without recording an outcome ({})",
                    pid.unwrap_or_default(),
                    describe_observed_exit(observed.and_then(|observed| observed.exit))
                ),
                runner_log_tail(store, run),
            );
            (crash_end(state, reason.clone(), None), Some(reason))
        }
        Action::FailNeverStarted => {
            let reason = with_log_tail(
                "runner never started".to_string(),
                runner_log_tail(store, run),
            );
            let mut events = vec![failed(reason.clone())];
            if state.process_terminal.is_none() {
                events.push(observed_gone(state, Proof::NotStarted));
            }
            (events, Some(reason))
        }
        Action::ObserveGone => (vec![observed_gone(state, Proof::Unknown)], None),
        Action::ObserveNeverStarted => (vec![observed_gone(state, Proof::NotStarted)], None),
    }
}

/// Ends the process groups of a dead runner's running steps, in this boot only, and only those
/// whose leader is still there by its recorded identity: the owner passed to
/// [`process_group::end`] is the dead runner, so a group whose leader is gone is never
/// verified ours (its id may lead a stranger's group now). The reconciler is not their
/// parent: it reaps nothing ([`Reaping::Nothing`]).
fn end_orphaned_steps(state: &RunState, grace: Duration) -> Vec<String> {
    let owner = state.runner.as_ref().map(|runner| &runner.identity);
    let mut errors = Vec::new();
    for (index, step) in state.steps.iter().enumerate() {
        if step.status != StepStatus::Running {
            continue;
        }
        let Some(process) = step.process.as_ref() else {
            continue;
        };
        match process_group::end(process, owner, grace, Reaping::Nothing) {
            Ok(GroupEnd::Survived) => errors.push(format!(
                "step {index}: process group {} still has members after SIGKILL",
                process.pid
            )),
            Ok(_) => {}
            Err(error) => errors.push(format!("step {index}: {error}")),
        }
    }
    errors
}

/// How many times a run is re-read and decided again when someone else appends first.
const ATTEMPTS: usize = 3;

fn new_outcome(run: RunId) -> Outcome {
    Outcome {
        run,
        row: "",
        action: Action::Nothing,
        appended: vec![],
        reason: None,
        note: None,
        reprojected: false,
        error: None,
        damaged: false,
        files_held: false,
    }
}

/// What a person is told about a runner of another PID namespace.
fn other_namespace_note(state: &RunState) -> Option<String> {
    let runner = state.runner.as_ref()?;
    let here = match liveness::pid_namespace() {
        Ok(Some(namespace)) => format!("PID namespace {namespace}"),
        Ok(None) | Err(_) => "a PID namespace that cannot be read".to_string(),
    };
    Some(format!(
        "runner {} was recorded in PID namespace {}, and this process is in {here}: it is unknown from here, so the run is neither repaired nor signalled; run `runjournal reconcile` in the runner's namespace",
        runner.identity.pid,
        runner
            .identity
            .pid_namespace
            .map_or_else(|| "?".to_string(), |namespace| namespace.to_string()),
    ))
}

/// What a run needs, decided from its state now.
struct Decision {
    events: Vec<Event>,
    head_seq: u64,
    reason: Option<String>,
}

/// Reads the run, picks its row, and does what needs no append: a projection repair, or
/// ending a dead runner's step groups before its failure is recorded. Returns the events to
/// append, if any; `outcome` carries the row and any error.
fn decide_run(
    store: &Store,
    run: RunId,
    read: Result<Option<RunState>, ReadError>,
    options: &Options,
    outcome: &mut Outcome,
) -> Option<Decision> {
    let state = match read {
        Ok(Some(state)) => state,
        Ok(None) => {
            outcome.error = Some("in the active table but has no snapshot".to_string());
            return None;
        }
        Err(error) => {
            outcome.damaged = crate::journal::is_damage_in_chain(&error);
            outcome.error = Some(error.to_string());
            return None;
        }
    };
    let mut inputs = inputs_of(&state, now_ms(), options);
    // What a host asked while no runner of ours was there to take it is taken now; the run is
    // then decided as it stands after it.
    let is_unowned = !matches!(
        inputs.runner,
        RunnerLiveness::Alive | RunnerLiveness::OtherNamespace
    );
    let state = if !inputs.is_terminal && is_unowned {
        match take_inbox(store, run) {
            Ok(Some(after)) => {
                inputs = inputs_of(&after, now_ms(), options);
                after
            }
            Ok(None) => state,
            Err(error) => {
                outcome.error = Some(format!("taking its control inbox: {error}"));
                state
            }
        }
    } else {
        state
    };
    let verdict = host_verdict(store.home(), &state);
    inputs.has_host_verdict = verdict.is_some();
    let row = decide(&inputs);
    outcome.row = row.name;
    outcome.action = row.action;
    if inputs.runner == RunnerLiveness::OtherNamespace {
        outcome.note = other_namespace_note(&state);
    }
    let (mut events, reason) = events_for(store, &state, row.action, &inputs, verdict.as_ref());
    if events.is_empty() {
        match repair_projection(store, run) {
            Ok(reprojected) => outcome.reprojected = reprojected,
            Err(failure) => outcome.projection_failed(&failure),
        }
        return None;
    }
    // A runner dead in this boot, whether or not someone saw it exit, left its running steps'
    // groups behind: end them before the run is recorded failed.
    let has_orphans = match row.action {
        Action::FailRunnerDied => true,
        Action::FailAfterObservedExit | Action::AdoptHostVerdict => {
            inputs.runner == RunnerLiveness::Dead
        }
        _ => false,
    };
    if has_orphans {
        let errors = end_orphaned_steps(&state, options.step_grace);
        if !errors.is_empty() {
            outcome.error = Some(errors.join("; "));
        }
        // What its steps took from their inboxes after the runner died was delivered: recorded
        // before the run's end, which records the rest undelivered.
        let delivered = crate::control_inbox::steers_taken_without_runner(store.home(), &state);
        events.splice(0..0, delivered);
    }
    Some(Decision {
        events,
        head_seq: state.head_seq,
        reason,
    })
}

/// Takes the control inbox of a run no live runner of ours takes it for
/// ([`crate::control_inbox::take`]). The run's state after it when it journaled anything.
fn take_inbox(
    store: &Store,
    run: RunId,
) -> Result<Option<RunState>, crate::control_inbox::TakeError> {
    // One look: a file not yet whole is left for the next pass (or the run's runner).
    let taken = crate::control_inbox::take(
        store.home(),
        run,
        &mut crate::control_inbox::Settling::default(),
        || store.journal().view()?.snapshot(run),
        |events, condition| store.append(run, events, condition),
    )?;
    if !taken.has_recorded() {
        return Ok(None);
    }
    Ok(store.journal().view()?.snapshot(run)?)
}

/// Records what an acknowledged append of `decision` did.
fn appended(outcome: &mut Outcome, decision: Decision) {
    outcome.appended = decision.events.iter().map(Event::name).collect();
    outcome.reason = decision.reason;
    outcome.reprojected = true;
}

/// Decides and appends for one run until it lands, re-reading the run when someone else
/// appended first.
fn reconcile_run(store: &Store, run: RunId, options: &Options) -> Outcome {
    let mut outcome = new_outcome(run);
    for _ in 0..ATTEMPTS {
        let read = store.journal().view().and_then(|view| view.snapshot(run));
        let Some(decision) = decide_run(store, run, read, options, &mut outcome) else {
            return outcome;
        };
        let condition = Condition::expect_head(decision.head_seq);
        match store.append(run, decision.events.clone(), condition) {
            Ok(_) => {
                appended(&mut outcome, decision);
                return outcome;
            }
            // Someone else moved the run on: look again.
            Err(AppendError::HeadMismatch { .. }) => continue,
            Err(error) => {
                outcome.damaged = crate::journal::is_damage_in_chain(&error);
                outcome.error = Some(error.to_string());
                return outcome;
            }
        }
    }
    outcome.error = Some(format!(
        "the run kept changing; left for the next pass after {ATTEMPTS} attempts"
    ));
    outcome
}

/// Projects the run again if any of its files differs from a fresh projection. Returns
/// whether it did.
fn repair_projection(store: &Store, run: RunId) -> Result<bool, ProjectionError> {
    let view = store
        .journal()
        .view()
        .map_err(|source| ProjectionError::Read { run, source })?;
    let (state, records, links) = projection::load(&view, run)?;
    drop(view);
    let differs = projection::check_plan(&projection::plan(store.home(), &state, &records, &links))
        .iter()
        .any(projection::Difference::is_damage);
    if differs {
        store.project(run)?;
    }
    Ok(differs)
}

/// How many records back in the log a pass looks for runs to re-project when it has no cursor
/// of this boot: projections are not fsynced, so a host crash can lose the files of runs that
/// changed shortly before it, closed runs included.
pub const LOOKBACK_RECORDS: u64 = 10_000;

/// How far into the global log a reconcile pass has checked the projections of the runs the
/// records belong to, in which boot. Kept in `runs/.reconciled-through` as `<boot id> <seq>`.
///
/// A writer that dies between its commit and its projection (SIGKILL) leaves the run's files
/// behind the journal; when that commit closed the run, the run has left the `active` table, so
/// the walk over active runs never sees it. The cursor makes each pass also check the runs
/// changed since the last pass: O(records since then), not O(all runs). In another boot (or
/// without a cursor) the last [`LOOKBACK_RECORDS`] records are checked instead: files written
/// before a host crash may be lost even though a pass had checked them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProjectionCursor {
    pub boot_id: String,
    pub global_seq: u64,
}

impl ProjectionCursor {
    /// The cursor of this home, if it has a readable one.
    pub fn read(home: &crate::home::Home) -> Option<ProjectionCursor> {
        // A cursor is a boot id and a number: anything longer is not one.
        let text = match crate::durable_fs::read_file_bounded(&home.reconcile_cursor_path(), 256) {
            Ok(crate::durable_fs::Bounded::Whole(bytes)) => String::from_utf8(bytes).ok()?,
            _ => return None,
        };
        let (boot_id, seq) = text.trim().split_once(' ')?;
        Some(ProjectionCursor {
            boot_id: boot_id.to_string(),
            global_seq: seq.parse().ok()?,
        })
    }

    fn write(&self, home: &crate::home::Home) -> std::io::Result<()> {
        crate::durable_fs::write_atomic(
            &home.reconcile_cursor_path(),
            format!("{} {}\n", self.boot_id, self.global_seq).as_bytes(),
        )
    }

    /// Where a pass starts reading the log: after the cursor if it is of this boot, else
    /// [`LOOKBACK_RECORDS`] before the head.
    fn start(cursor: Option<&ProjectionCursor>, boot_id: Option<&str>, head: u64) -> u64 {
        match cursor {
            Some(cursor)
                if Some(cursor.boot_id.as_str()) == boot_id && cursor.global_seq <= head =>
            {
                cursor.global_seq
            }
            _ => head.saturating_sub(LOOKBACK_RECORDS),
        }
    }
}

/// What a pass reads of the journal before it acts, all from one view
/// ([`survey`]); the pass then acts on it with the view dropped ([`act`]).
#[derive(Debug)]
pub struct Survey {
    /// The active runs, each with its snapshot as the view held it.
    active: Vec<(RunId, Result<Option<RunState>, ReadError>)>,
    /// Runs changed since the cursor (and the paused runs resumed by them).
    changed: Vec<RunId>,
    /// The global seq the changed runs were read through.
    through: u64,
    cursor: Option<ProjectionCursor>,
    boot_id: Option<String>,
}

/// Reads, from `view`, what a pass decides on: the active runs and their snapshots, and the
/// runs changed since the last pass (see [`ProjectionCursor`]). Only reads.
pub fn survey(home: &crate::home::Home, view: &View) -> Result<Survey, ReadError> {
    let active = view.active_runs()?;
    let boot_id = liveness::boot_id().ok();
    let cursor = ProjectionCursor::read(home);
    let start = ProjectionCursor::start(cursor.as_ref(), boot_id.as_deref(), view.global_head()?);
    let (mut changed, through) = view.runs_changed_after(start)?;
    // A run created to resume a paused one changed what the paused run's files show (its
    // `resumedBy`, from the resume index) without a record of the paused run: it is checked
    // with the runs that changed.
    let mut linked = Vec::new();
    for &run in &changed {
        if let Some(from) = view.resume_links(run)?.resumed_from
            && !changed.contains(&from)
            && !linked.contains(&from)
            && view.snapshot(from)?.is_some()
        {
            linked.push(from);
        }
    }
    changed.extend(linked);
    let active = active
        .into_iter()
        .map(|run| (run, view.snapshot(run)))
        .collect();
    Ok(Survey {
        active,
        changed,
        through,
        cursor,
        boot_id,
    })
}

/// One reconcile pass: every active run is decided by [`TABLE`], and every other run changed
/// since the last pass (see [`ProjectionCursor`]) has its projection rebuilt if it differs.
/// [`survey`] over a view of its own, then [`act`].
pub fn reconcile(store: &Store, options: &Options) -> Result<Report, ReconcileError> {
    let survey = survey(store.home(), &store.journal().view()?)?;
    Ok(act(store, survey, options))
}

/// Acts on what [`survey`] read: decides each active run, appends what it decided, and
/// re-projects the changed runs whose files differ.
///
/// Active runs are decided first; then all their appends are queued together
/// ([`Store::append_all`]), so closing a thousand stale runs costs a few group commits rather
/// than a thousand. A run that someone else moved on in between is decided and appended again
/// on its own, from a fresh read.
pub fn act(store: &Store, survey: Survey, options: &Options) -> Report {
    let Survey {
        active,
        changed,
        through,
        cursor,
        boot_id,
    } = survey;
    let active_count = active.len();
    let mut outcomes: Vec<Outcome> = Vec::with_capacity(active.len());
    let mut decided: Vec<(usize, Decision)> = Vec::new();
    let mut active_runs = Vec::with_capacity(active.len());
    for (run, read) in active {
        active_runs.push(run);
        let mut outcome = new_outcome(run);
        if let Some(decision) = decide_run(store, run, read, options, &mut outcome) {
            decided.push((outcomes.len(), decision));
        }
        outcomes.push(outcome);
    }
    let results = store.append_all(decided.iter().map(|(index, decision)| {
        (
            outcomes[*index].run,
            decision.events.clone(),
            Condition::expect_head(decision.head_seq),
        )
    }));
    let mut lock_held = None;
    for ((index, decision), result) in decided.into_iter().zip(results) {
        let outcome = &mut outcomes[index];
        match result {
            Ok(_) => appended(outcome, decision),
            Err(AppendError::HeadMismatch { .. }) => {
                *outcome = reconcile_run(store, outcome.run, options);
            }
            Err(error) => {
                if let AppendError::WriteLockHeld(held) | AppendError::Uncertain { held, .. } =
                    &error
                {
                    lock_held.get_or_insert_with(|| held.clone());
                }
                outcome.damaged = crate::journal::is_damage_in_chain(&error);
                outcome.error = Some(error.to_string());
            }
        }
    }

    let active: std::collections::HashSet<RunId> = active_runs.into_iter().collect();
    let mut has_failed_repair = false;
    for run in changed.into_iter().filter(|run| !active.contains(run)) {
        let mut outcome = Outcome {
            row: "closed",
            ..new_outcome(run)
        };
        match repair_projection(store, run) {
            Ok(reprojected) => outcome.reprojected = reprojected,
            Err(failure) => outcome.projection_failed(&failure),
        }
        has_failed_repair |= outcome.error.is_some();
        if outcome.reprojected || outcome.error.is_some() {
            outcomes.push(outcome);
        }
    }
    if let (false, Some(boot_id)) = (has_failed_repair, boot_id) {
        let next = ProjectionCursor {
            boot_id,
            global_seq: through,
        };
        if cursor.as_ref() != Some(&next) {
            // Best effort: without it, the next pass checks the same runs again.
            let _ = next.write(store.home());
        }
    }
    Report {
        outcomes,
        active: active_count,
        lock_held,
    }
}

#[cfg(test)]
mod tests;
