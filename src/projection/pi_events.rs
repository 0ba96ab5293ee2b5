//! A run's `events.jsonl` in pi-subagents' own vocabulary, for the pi-subagents layout: what
//! its hosts tail to follow a run (`subagent.run.started`, `subagent.step.*`,
//! `subagent.parallel.*`, `subagent.steer.*`, `subagent.run.process_terminal`,
//! `subagent.run.repaired_stale`, `subagent.control`, ...), with the fields its readers use.
//! Every record of the run renders one or more lines, in seq order, so every transition the
//! journal holds shows there; transitions pi-subagents has no word for get one in its style
//! (`subagent.run.created`, `subagent.run.queued`, `subagent.step.external_job`, ...).
//!
//! The journal's own record lines, which `recover` rebuilds a lost journal from, are kept in a
//! file of their own beside it ([`crate::home::Home::events_path`]): a host may append to this
//! one, and its readers must not meet our envelopes.
//!
//! Each line we render carries `journalSeq`, the seq of the record it comes from (an addition
//! pi-subagents' readers ignore). A line without one was written by someone else: a host's
//! `subagent.run.repaired_stale` ([`host_verdicts`]) is the one such line runjournal reads and
//! keeps ([`keep_host_verdicts`]) until its verdict is journaled.
//!
//! Rendering is pure: a record's lines depend on it and on the run's state before it, which the
//! caller folds ([`render`]).

use serde_json::{Map, Value, json};

use super::documents::{
    self, LIFECYCLE_ARTIFACT_VERSION, job_doc_of, process_terminal_doc, undelivered_reason,
};
use crate::event::{ControlAction, Event, Mode, Record, Repairer, StepEnd, UnixMs};
use crate::state::{self, RunState, SteerDelivery, StepStatus, Undelivered};

/// The type of pi-subagents' stale-run repair line, the one verdict a host writes here.
pub const REPAIRED_STALE: &str = "subagent.run.repaired_stale";

/// The key of the record seq each line we render carries.
const JOURNAL_SEQ: &str = "journalSeq";

/// A line under construction: `type`, then `ts`, then `runId`, as pi-subagents writes them.
struct Line(Map<String, Value>);

impl Line {
    fn new(kind: &str, ts: UnixMs, state: &RunState) -> Line {
        let mut fields = Map::new();
        fields.insert("type".into(), kind.into());
        fields.insert("ts".into(), ts.into());
        fields.insert("runId".into(), state.run_id.to_string().into());
        Line(fields)
    }

    fn with(mut self, key: &str, value: impl Into<Value>) -> Line {
        self.0.insert(key.into(), value.into());
        self
    }

    fn with_some(self, key: &str, value: Option<impl Into<Value>>) -> Line {
        match value {
            Some(value) => self.with(key, value),
            None => self,
        }
    }
}

fn agent(state: &RunState, step: u32) -> String {
    state
        .spec
        .steps
        .get(step as usize)
        .map(crate::spec::agent_name)
        .unwrap_or_default()
}

fn agents(state: &RunState) -> Vec<String> {
    state
        .spec
        .steps
        .iter()
        .map(crate::spec::agent_name)
        .collect()
}

/// `subagent.run.created`: the run's mode, its steps' agents and its directory; its task's
/// text never (pi-subagents' redaction).
fn run_created(ts: UnixMs, run: &RunState) -> Line {
    Line::new("subagent.run.created", ts, run)
        .with("mode", run.spec.mode.as_str())
        .with("agents", agents(run))
        .with("task", crate::spec::TASK_REDACTED)
        .with_some("cwd", run.spec.cwd.clone())
}

/// The lines of `record`, given the run's state before it (`None` for its first) and after
/// it. Pure.
pub fn record_lines(before: Option<&RunState>, record: &Record, after: &RunState) -> Vec<Value> {
    let ts = record.time_ms;
    let run = after;
    let mut lines: Vec<Line> = Vec::new();
    match &record.event {
        Event::RunCreated { .. } => lines.push(run_created(ts, run)),
        Event::RunnerStarted { runner, .. } => lines.extend(runner_started(ts, runner.pid, run)),
        Event::StepRunning { step, process } => {
            lines.extend(step_started(ts, *step, process.as_ref(), run));
        }
        Event::ExternalJobUpdated { step, .. } => {
            let job = job_doc_of(run, *step as usize);
            lines.push(
                Line::new("subagent.step.external_job", ts, run)
                    .with("stepIndex", *step)
                    .with("agent", agent(run, *step))
                    .with_some(
                        "externalJob",
                        job.and_then(|job| serde_json::to_value(job).ok()),
                    ),
            );
        }
        Event::StepFinished { step, outcome } => {
            lines.push(step_finished(before, ts, *step, outcome, run));
            lines.extend(given_up(before, run, ts, Some(*step)));
        }
        Event::ControlRequested { action, by, reason } => {
            lines.push(control_requested(before, ts, *action, by, reason, run));
        }
        Event::Terminal { repaired_by, .. } => {
            lines.extend(given_up(before, run, ts, None));
            lines.extend(run_ended(before, ts, *repaired_by, None, run));
        }
        Event::HostEnded {
            ended_at_ms,
            result_path,
            ..
        } => {
            lines.extend(given_up(before, run, *ended_at_ms, None));
            lines.extend(run_ended(
                before,
                *ended_at_ms,
                Some(Repairer::Host),
                result_path.clone(),
                run,
            ));
        }
        Event::ProcessTerminalObserved { .. } => lines.push(
            Line::new("subagent.run.process_terminal", ts, run)
                .with("lifecycleArtifactVersion", LIFECYCLE_ARTIFACT_VERSION)
                .with_some(
                    "processTerminal",
                    serde_json::to_value(process_terminal_doc(run)).ok(),
                ),
        ),
        Event::Dismissed { at_ms } => lines
            .push(Line::new("subagent.run.dismissed", ts, run).with("displayDismissedAt", *at_ms)),
        Event::Resumed { from } => lines
            .push(Line::new("subagent.run.resumed", ts, run).with("resumedFrom", from.to_string())),
        Event::QueueJoined { queue, .. } => {
            lines.push(Line::new("subagent.run.queued", ts, run).with("queue", queue.clone()));
        }
        Event::QueueAdmitted { by } => lines.push(
            Line::new("subagent.run.admitted", ts, run)
                .with_some("queue", run.queue.as_ref().map(|queue| queue.name.clone()))
                .with("by", by.clone()),
        ),
        Event::DependsOn { .. } | Event::DependenciesMet { .. } => {
            lines.extend(dependency_line(ts, &record.event, run));
        }
        Event::SteerRequested {
            id, steps, mode, ..
        } => lines.extend(steer_requested(before, ts, id, steps, mode.as_str(), run)),
        Event::SteerDelivered { id, step } => lines.push(
            Line::new("subagent.steer.delivered", ts, run)
                .with("requestId", id.clone())
                .with("index", *step)
                .with("deliveryStatus", "delivered"),
        ),
        Event::ControlRefused { file, reason } => {
            lines.push(control_refused(ts, file, reason, run));
        }
        Event::HookAttempted { .. } | Event::HookEnded { .. } => {
            lines.extend(hook_line(ts, &record.event, run));
        }
        Event::StartDelayed { .. } | Event::DelayEnded { .. } => {
            lines.extend(delay_line(ts, &record.event, run));
        }
        Event::UniqueKey { .. } | Event::RetryPolicy { .. } | Event::AttemptEnded { .. } => {
            lines.extend(retry_lines(before, ts, &record.event, run));
        }
        Event::StepStopRequested { step, by, reason } => {
            lines.push(step_stop_requested(ts, *step, by, reason, run));
        }
    }
    lines
        .into_iter()
        .map(|line| Value::Object(line.with(JOURNAL_SEQ, record.seq).0))
        .collect()
}

/// `subagent.step.stop_requested`: a host asked that one step stop (pi-subagents' words).
fn step_stop_requested(ts: UnixMs, step: u32, by: &str, reason: &str, run: &RunState) -> Line {
    Line::new("subagent.step.stop_requested", ts, run)
        .with("stepIndex", step)
        .with("agent", agent(run, step))
        .with("by", by.to_string())
        .with("reason", reason.to_string())
}

/// The lines of a run's key and retries (docs/design.md, "Launched once", "Retries"): its key,
/// its policy; an attempt's end, after the messages its steps never took.
fn retry_lines(before: Option<&RunState>, ts: UnixMs, event: &Event, run: &RunState) -> Vec<Line> {
    match event {
        Event::UniqueKey { key, hold_ms } => vec![unique_line(ts, key, *hold_ms, run)],
        Event::RetryPolicy { retries, on, .. } => vec![
            Line::new("subagent.run.retries", ts, run)
                .with("retries", *retries)
                .with("retryOn", on.text()),
        ],
        Event::AttemptEnded {
            attempt,
            cause,
            exit_code,
            summary,
            retry_at_ms,
            ..
        } => {
            let mut lines = given_up(before, run, ts, None);
            lines.push(
                Line::new("subagent.run.attempt_ended", ts, run)
                    .with("attempt", *attempt)
                    .with("cause", cause.as_str())
                    .with("exitCode", *exit_code)
                    .with("summary", summary.clone())
                    .with("retryAt", *retry_at_ms),
            );
            lines
        }
        _ => Vec::new(),
    }
}

/// The line of a run's key: it was launched once by it.
fn unique_line(ts: UnixMs, key: &str, hold_ms: Option<u64>, run: &RunState) -> Line {
    Line::new("subagent.run.unique", ts, run)
        .with("uniqueKey", key.to_string())
        .with_some("holdMs", hold_ms)
}

/// The line of a delayed start's record: the run is delayed until its due time, or its delay
/// ended and its runner starts.
fn delay_line(ts: UnixMs, event: &Event, run: &RunState) -> Option<Line> {
    match event {
        Event::StartDelayed { due_at_ms, .. } => {
            Some(Line::new("subagent.run.delayed", ts, run).with("dueAt", *due_at_ms))
        }
        Event::DelayEnded { by } => Some(
            Line::new("subagent.run.due", ts, run)
                .with_some("dueAt", run.delay.as_ref().map(|delay| delay.due_at_ms))
                .with("by", by.clone()),
        ),
        _ => None,
    }
}

/// The line of a dependency's record: the runs a run waits for, or that they were met.
fn dependency_line(ts: UnixMs, event: &Event, run: &RunState) -> Option<Line> {
    let ids = |runs: &[crate::event::RunId]| -> Vec<String> {
        runs.iter().map(ToString::to_string).collect()
    };
    match event {
        Event::DependsOn {
            after, after_any, ..
        } => Some(
            Line::new("subagent.run.waiting", ts, run)
                .with("after", ids(after))
                .with("afterAny", ids(after_any)),
        ),
        Event::DependenciesMet { by } => {
            Some(Line::new("subagent.run.dependencies_met", ts, run).with("by", by.clone()))
        }
        _ => None,
    }
}

/// The line of a hook's record. A hook is named by its place in the run's list: its command is
/// in no projection.
fn hook_line(ts: UnixMs, event: &Event, run: &RunState) -> Option<Line> {
    match event {
        Event::HookAttempted {
            hook, attempt, by, ..
        } => Some(
            Line::new("subagent.run.hook_attempted", ts, run)
                .with("hook", *hook)
                .with("attempt", *attempt)
                .with("by", by.clone()),
        ),
        Event::HookEnded {
            hook,
            attempt,
            outcome,
            retry_at_ms,
        } => Some(
            Line::new("subagent.run.hook_ended", ts, run)
                .with("hook", *hook)
                .with("attempt", *attempt)
                .with("outcome", outcome.as_str())
                .with_some("retryAt", *retry_at_ms),
        ),
        _ => None,
    }
}

/// `subagent.run.started`, and for a parallel run the start of its one group.
fn runner_started(ts: UnixMs, pid: u32, run: &RunState) -> Vec<Line> {
    let mut lines = vec![
        Line::new("subagent.run.started", ts, run)
            .with("lifecycleArtifactVersion", LIFECYCLE_ARTIFACT_VERSION)
            .with("mode", run.spec.mode.as_str())
            .with_some("cwd", run.spec.cwd.clone())
            .with("pid", pid),
    ];
    if run.spec.mode == Mode::Parallel {
        lines.push(
            Line::new("subagent.parallel.started", ts, run)
                .with("stepIndex", 0)
                .with("agents", agents(run))
                .with("count", run.steps.len()),
        );
    }
    lines
}

/// `subagent.step.started`, and `subagent.steer.routed` for each message waiting for the
/// step: it goes to the step's inbox now.
fn step_started(
    ts: UnixMs,
    step: u32,
    process: Option<&crate::event::ProcessIdentity>,
    run: &RunState,
) -> Vec<Line> {
    let mut lines = vec![
        Line::new("subagent.step.started", ts, run)
            .with("stepIndex", step)
            .with("agent", agent(run, step))
            .with_some("pid", process.map(|process| process.pid)),
    ];
    for steer in &run.steers {
        let is_waiting = steer
            .targets
            .iter()
            .any(|target| target.step == step && target.delivery == SteerDelivery::Queued);
        if is_waiting {
            lines.push(
                Line::new("subagent.steer.routed", ts, run)
                    .with("requestId", steer.id.clone())
                    .with("index", step),
            );
        }
    }
    lines
}

/// `subagent.step.completed|failed|stopped|paused`, or, for a step that never ran,
/// pi-subagents' line for a skipped task: `failed`, exit code -1, no duration.
fn step_finished(
    before: Option<&RunState>,
    ts: UnixMs,
    step: u32,
    outcome: &crate::event::StepOutcome,
    run: &RunState,
) -> Line {
    let is_interrupt = run
        .controls
        .first()
        .is_some_and(|control| control.action == ControlAction::Interrupt);
    // A pending step a host stopped is skipped when its turn comes: to pi, it was stopped.
    let is_stopped_pending = outcome.end == StepEnd::Skipped && run.step_stop(step).is_some();
    let kind = match outcome.end {
        StepEnd::Complete => "subagent.step.completed",
        StepEnd::Skipped if is_stopped_pending => "subagent.step.stopped",
        StepEnd::Failed | StepEnd::Skipped => "subagent.step.failed",
        StepEnd::Stopped if is_interrupt => "subagent.step.paused",
        StepEnd::Stopped => "subagent.step.stopped",
    };
    let started_at = before
        .and_then(|state| state.steps.get(step as usize))
        .and_then(|step| step.started_at_ms);
    let (exit_code, duration_ms) = match outcome.end {
        StepEnd::Skipped if is_stopped_pending => (1, 0),
        StepEnd::Skipped => (-1, 0),
        end => (
            outcome
                .exit_code
                .unwrap_or(if end == StepEnd::Complete { 0 } else { 1 }),
            started_at.map_or(0, |started_at| ts.saturating_sub(started_at)),
        ),
    };
    Line::new(kind, ts, run)
        .with("stepIndex", step)
        .with("agent", agent(run, step))
        .with("exitCode", exit_code)
        .with("durationMs", duration_ms)
        .with_some("error", outcome.error.clone())
}

/// The first control request is what the run acts on: pi-subagents' line for its effect
/// (`subagent.run.stopped`, `paused`, `timed_out`). A later one changes nothing: it says only
/// that it was asked.
fn control_requested(
    before: Option<&RunState>,
    ts: UnixMs,
    action: ControlAction,
    by: &str,
    reason: &str,
    run: &RunState,
) -> Line {
    let is_first = before.is_none_or(|state| state.controls.is_empty());
    let line = match (is_first, action) {
        (true, ControlAction::Stop) => {
            Line::new("subagent.run.stopped", ts, run).with("message", reason)
        }
        (true, ControlAction::Interrupt) => Line::new("subagent.run.paused", ts, run),
        (true, ControlAction::Timeout) => Line::new("subagent.run.timed_out", ts, run)
            .with_some("timeoutMs", run.spec.timeout_ms)
            .with_some("deadlineAt", documents::deadline_at(run))
            .with("message", reason),
        (false, action) => {
            Line::new("subagent.run.control_requested", ts, run).with("action", action.as_str())
        }
    };
    line.with("by", by).with("reason", reason)
}

/// The lines of the run's end: pi-subagents' stale repair for a run a reconciler or a host
/// ended (exactly what its own reconciler writes, for a host's verdict), else the parallel
/// group's end and `subagent.run.completed`, as its runner writes them.
fn run_ended(
    before: Option<&RunState>,
    ts: UnixMs,
    repaired_by: Option<Repairer>,
    result_path: Option<String>,
    run: &RunState,
) -> Vec<Line> {
    let terminal = run.terminal.as_ref();
    let message = terminal
        .map(|terminal| terminal.error.clone().unwrap_or(terminal.summary.clone()))
        .unwrap_or_default();
    let pid = run.runner.as_ref().map(|runner| runner.identity.pid);
    match repaired_by {
        Some(Repairer::Reconciler | Repairer::Host) => vec![
            Line::new(REPAIRED_STALE, ts, run)
                .with_some("pid", pid)
                .with_some("resultPath", result_path)
                .with("message", message),
        ],
        Some(Repairer::Launcher) | None => {
            let mut lines = Vec::new();
            let was_running = before.is_some_and(|state| state.runner.is_some());
            if run.spec.mode == Mode::Parallel && was_running {
                lines.push(
                    Line::new("subagent.parallel.completed", ts, run)
                        .with("stepIndex", 0)
                        .with("success", run.status == state::RunStatus::Complete),
                );
            }
            let started_at = run
                .runner
                .as_ref()
                .map_or(run.created_at_ms, |runner| runner.started_at_ms);
            lines.push(
                Line::new("subagent.run.completed", ts, run)
                    .with("lifecycleArtifactVersion", LIFECYCLE_ARTIFACT_VERSION)
                    .with("status", super::documents::pi_state(run))
                    .with("durationMs", ts.saturating_sub(started_at)),
            );
            lines
        }
    }
}

/// `subagent.steer.failed` for each message this record gave up on (the step's end: `step`;
/// the run's: `None`), and pi-subagents' failure notice for each request none of whose
/// targets took it.
fn given_up(before: Option<&RunState>, run: &RunState, ts: UnixMs, step: Option<u32>) -> Vec<Line> {
    let why = if step.is_some() {
        Undelivered::StepEnded
    } else {
        Undelivered::RunEnded
    };
    let mut lines = Vec::new();
    for steer in &run.steers {
        let waited_before = before
            .and_then(|state| state.steer(&steer.id))
            .map(|earlier| {
                earlier
                    .targets
                    .iter()
                    .filter(|target| target.delivery == SteerDelivery::Queued)
                    .map(|target| target.step)
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        let given_up: Vec<u32> = steer
            .targets
            .iter()
            .filter(|target| {
                waited_before.contains(&target.step)
                    && matches!(target.delivery, SteerDelivery::Undelivered { why: was, .. } if was == why)
            })
            .map(|target| target.step)
            .collect();
        for index in &given_up {
            lines.push(
                Line::new("subagent.steer.failed", ts, run)
                    .with("requestId", steer.id.clone())
                    .with("index", *index)
                    .with("reason", undelivered_reason(why)),
            );
        }
        let none_took_it = steer
            .targets
            .iter()
            .all(|target| matches!(target.delivery, SteerDelivery::Undelivered { .. }));
        if !given_up.is_empty() && none_took_it {
            lines.push(
                Line::new("subagent.steering.notice", ts, run)
                    .with("requestId", steer.id.clone())
                    .with("state", "failed")
                    .with(
                        "message",
                        format!(
                            "Steering failed for run {}: {}.",
                            run.run_id,
                            undelivered_reason(why)
                        ),
                    )
                    .with_some("currentSessionId", run.session_id.clone()),
            );
        }
    }
    lines
}

/// `subagent.steer.requested`, then per target `subagent.steer.routed` (its step runs: the
/// message goes to its inbox) or `subagent.steer.scheduled` (it will when the step starts).
fn steer_requested(
    before: Option<&RunState>,
    ts: UnixMs,
    id: &str,
    steps: &[u32],
    mode: &str,
    run: &RunState,
) -> Vec<Line> {
    let is_running = |step: u32| {
        before
            .and_then(|state| state.steps.get(step as usize))
            .is_some_and(|step| step.status == StepStatus::Running)
    };
    let targets: Vec<Value> = steps
        .iter()
        .map(|&step| {
            let state = if is_running(step) {
                "routed"
            } else {
                "scheduled"
            };
            json!({"index": step, "state": state})
        })
        .collect();
    let source = run.steer(id).map(|steer| steer.source.clone());
    let mut lines = vec![
        Line::new("subagent.steer.requested", ts, run)
            .with("requestId", id)
            .with("targets", targets)
            .with("mode", mode)
            .with_some("source", source),
    ];
    for &step in steps {
        let kind = if is_running(step) {
            "subagent.steer.routed"
        } else {
            "subagent.steer.scheduled"
        };
        lines.push(
            Line::new(kind, ts, run)
                .with("requestId", id)
                .with("index", step),
        );
    }
    lines
}

/// A refused control file, as pi-subagents' attention notice (`subagent.control`), which its
/// job tracker shows its host: a request the host made was not taken.
fn control_refused(ts: UnixMs, file: &str, reason: &str, run: &RunState) -> Line {
    let message = format!("control request {file} was refused: {reason}");
    let current = documents::current_step_index(run);
    let agent = agent(run, u32::try_from(current).unwrap_or(u32::MAX));
    let event = json!({
        "type": "needs_attention",
        "to": "needs_attention",
        "ts": ts,
        "runId": run.run_id.to_string(),
        "agent": agent,
        "index": current,
        "message": message,
    });
    let notice = format!(
        "Subagent needs attention: {agent}\nRun: {}\nSignal: {message}",
        run.run_id
    );
    let mut fields = Map::new();
    fields.insert("type".into(), "subagent.control".into());
    fields.insert("event".into(), event);
    fields.insert("channels".into(), json!(["event"]));
    fields.insert("noticeText".into(), notice.into());
    fields.insert("file".into(), file.into());
    fields.insert("reason".into(), reason.into());
    Line(fields)
}

/// The lines of `records` after `before` (the state at the record before the first of them;
/// `None` from the run's first record), and the state after the last: each record folded to
/// render the next. A record that does not fold (a journal's records always do) ends the
/// rendering there.
pub fn render(before: Option<RunState>, records: &[Record]) -> (Vec<u8>, Option<RunState>) {
    let mut out = Vec::new();
    let mut state = before;
    for record in records {
        let Ok(after) = state::apply(state.as_ref(), record) else {
            break;
        };
        for line in record_lines(state.as_ref(), record, &after) {
            if serde_json::to_writer(&mut out, &line).is_ok() {
                out.push(b'\n');
            }
        }
        state = Some(after);
    }
    (out, state)
}

/// The whole file of a run's records.
pub fn pi_events_jsonl(records: &[Record]) -> Vec<u8> {
    render(None, records).0
}

/// A host's verdict found in a pi events file: a `subagent.run.repaired_stale` line of the run
/// that we did not render (it has no `journalSeq`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostVerdict {
    /// The line as it is in the file, without its newline.
    pub line: Vec<u8>,
    pub ts: UnixMs,
    pub message: String,
    pub pid: Option<u64>,
    pub result_path: Option<String>,
}

/// The hosts' verdicts on run `run` among `bytes` (a pi events file, or its tail: a first line
/// cut short does not parse and is passed over).
pub fn host_verdicts(bytes: &[u8], run: crate::event::RunId) -> Vec<HostVerdict> {
    let run_text = run.to_string();
    bytes
        .split(|&byte| byte == b'\n')
        .filter_map(|line| {
            let value: Value = serde_json::from_slice(line).ok()?;
            let fields = value.as_object()?;
            if fields.get("type")?.as_str()? != REPAIRED_STALE
                || fields.contains_key(JOURNAL_SEQ)
                || fields.get("runId")?.as_str()? != run_text
            {
                return None;
            }
            Some(HostVerdict {
                line: line.to_vec(),
                ts: fields.get("ts")?.as_u64()?,
                message: fields
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                pid: fields.get("pid").and_then(Value::as_u64),
                result_path: fields
                    .get("resultPath")
                    .and_then(Value::as_str)
                    .map(str::to_string),
            })
        })
        .collect()
}

/// `rendered` with the hosts' verdicts of `on_disk` (the file it replaces) kept after it: a
/// projection never removes a host's verdict that the journal does not hold yet, so that the
/// reconciler finds it.
pub fn keep_host_verdicts(rendered: &[u8], on_disk: &[u8], run: crate::event::RunId) -> Vec<u8> {
    let mut out = rendered.to_vec();
    for verdict in host_verdicts(on_disk, run) {
        out.extend_from_slice(&verdict.line);
        out.push(b'\n');
    }
    out
}

/// `on_disk` without the hosts' verdicts it holds: what a fresh rendering is compared with
/// while the journal does not hold them.
pub fn without_host_verdicts(on_disk: &[u8], run: crate::event::RunId) -> Vec<u8> {
    let verdicts: Vec<Vec<u8>> = host_verdicts(on_disk, run)
        .into_iter()
        .map(|verdict| verdict.line)
        .collect();
    let mut out = Vec::with_capacity(on_disk.len());
    for line in on_disk.split_inclusive(|&byte| byte == b'\n') {
        let body = line.strip_suffix(b"\n").unwrap_or(line);
        if !verdicts.iter().any(|verdict| verdict.as_slice() == body) {
            out.extend_from_slice(line);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{FORMAT_VERSION, HostIds, RunId, StepEnd, TerminalState, WriterId};
    use crate::testkit as kit;

    const RUN: RunId = RunId::from_bytes([9; 16]);

    fn records(events: Vec<Event>) -> Vec<Record> {
        events
            .into_iter()
            .enumerate()
            .map(|(index, event)| Record {
                format_version: FORMAT_VERSION,
                run_id: RUN,
                seq: index as u64 + 1,
                time_ms: 1_000 + index as u64 * 10,
                writer: WriterId(1),
                writer_seq: index as u64 + 1,
                event,
            })
            .collect()
    }

    fn lines(records: &[Record]) -> Vec<Value> {
        pi_events_jsonl(records)
            .split(|&byte| byte == b'\n')
            .filter(|line| !line.is_empty())
            .map(|line| serde_json::from_slice(line).expect("a JSON line"))
            .collect()
    }

    fn types(lines: &[Value]) -> Vec<&str> {
        lines
            .iter()
            .map(|line| line["type"].as_str().expect("a type"))
            .collect()
    }

    /// A parallel run steered, one step finishing, one stopped, in pi-subagents' words; every
    /// record gives at least one line, in seq order, each naming its record.
    #[test]
    fn every_record_renders_in_pi_subagents_vocabulary() {
        let spec = kit::spec(
            Mode::Parallel,
            vec![kit::echo_step("a"), kit::echo_step("b")],
        );
        let records = records(vec![
            kit::created(spec, 1_000, kit::hosts(Some("s1"), None, None)),
            kit::runner_started(kit::identity(77), "i1"),
            kit::step_running(0, Some(kit::identity(78))),
            kit::steer_requested("m1", &[0, 1], "look again"),
            kit::steer_delivered("m1", 0),
            kit::step_complete(0),
            kit::control(ControlAction::Stop, "cli", "enough"),
            kit::step_finished(1, StepEnd::Skipped, None, None),
            kit::terminal(TerminalState::Stopped, 143, "stopped", None),
            kit::runner_exited("i1", 0),
        ]);
        let lines = lines(&records);
        assert_eq!(
            types(&lines),
            [
                "subagent.run.created",
                "subagent.run.started",
                "subagent.parallel.started",
                "subagent.step.started",
                "subagent.steer.requested",
                "subagent.steer.routed",
                "subagent.steer.scheduled",
                "subagent.steer.delivered",
                "subagent.step.completed",
                "subagent.run.stopped",
                "subagent.step.failed",
                "subagent.steer.failed",
                "subagent.parallel.completed",
                "subagent.run.completed",
                "subagent.run.process_terminal",
            ]
        );
        let seqs: Vec<u64> = lines
            .iter()
            .map(|line| line["journalSeq"].as_u64().expect("journalSeq"))
            .collect();
        assert!(seqs.windows(2).all(|pair| pair[0] <= pair[1]), "{seqs:?}");
        assert_eq!(
            seqs.iter()
                .copied()
                .collect::<std::collections::BTreeSet<_>>(),
            (1..=10).collect(),
            "every record renders"
        );
        let started = &lines[1];
        assert_eq!(started["pid"], 77);
        assert_eq!(started["lifecycleArtifactVersion"], 3);
        let skipped = &lines[10];
        assert_eq!(skipped["stepIndex"], 1);
        assert_eq!(skipped["exitCode"], -1, "pi-subagents' skipped task");
        assert_eq!(skipped["durationMs"], 0);
        assert_eq!(lines[8]["durationMs"], 30, "from its start to its end");
        let completed = &lines[13];
        assert_eq!(completed["status"], "stopped");
        assert_eq!(completed["runId"], RUN.to_string());
        assert_eq!(lines[11]["requestId"], "m1");
        assert_eq!(lines[11]["index"], 1);
    }

    #[test]
    fn a_reconciler_or_a_host_ends_a_run_with_pi_subagents_stale_repair() {
        let start = || {
            vec![
                kit::created(kit::chain_spec(1), 1_000, HostIds::default()),
                kit::runner_started(kit::identity(77), "i1"),
            ]
        };
        let mut by_reconciler = start();
        by_reconciler.push(Event::Terminal {
            state: TerminalState::Failed,
            error: Some("runner 77 died".to_string()),
            summary: "runner 77 died".to_string(),
            exit_code: 1,
            repaired_by: Some(Repairer::Reconciler),
        });
        let lines = lines(&records(by_reconciler));
        assert_eq!(lines.last().expect("a line")["type"], REPAIRED_STALE);
        assert_eq!(lines.last().expect("a line")["message"], "runner 77 died");

        let mut by_host = start();
        by_host.push(kit::host_ended("gone", 5, Some("/r/x.json")));
        let rendered = pi_events_jsonl(&records(by_host));
        let last: Value = serde_json::from_slice(
            rendered
                .split(|&byte| byte == b'\n')
                .rfind(|line| !line.is_empty())
                .expect("a line"),
        )
        .expect("JSON");
        // What pi-subagents' reconciler wrote, key for key, and our seq after it.
        let keys: Vec<&str> = last
            .as_object()
            .expect("an object")
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(
            keys,
            [
                "type",
                "ts",
                "runId",
                "pid",
                "resultPath",
                "message",
                "journalSeq"
            ]
        );
        assert_eq!(last["ts"], 5, "the host's time");
        assert!(
            host_verdicts(&rendered, RUN).is_empty(),
            "our own rendering is no host's verdict"
        );
    }

    #[test]
    fn a_hosts_verdict_is_found_and_kept_until_the_journal_holds_it() {
        let ours = pi_events_jsonl(&records(vec![kit::created(
            kit::chain_spec(1),
            1_000,
            HostIds::default(),
        )]));
        let host = format!(
            r#"{{"type":"subagent.run.repaired_stale","ts":42,"runId":"{RUN}","pid":77,"resultPath":"/r/x.json","message":"Async runner process 77 exited"}}"#
        );
        let other_run = r#"{"type":"subagent.run.repaired_stale","ts":1,"runId":"01ARZ3NDEKTSV4RRFFQ69G5FAV","message":"x"}"#;
        let mut on_disk = ours.clone();
        on_disk.extend_from_slice(format!("{host}\n{other_run}\n").as_bytes());
        let verdicts = host_verdicts(&on_disk, RUN);
        assert_eq!(
            verdicts,
            [HostVerdict {
                line: host.as_bytes().to_vec(),
                ts: 42,
                message: "Async runner process 77 exited".to_string(),
                pid: Some(77),
                result_path: Some("/r/x.json".to_string()),
            }]
        );
        let kept = keep_host_verdicts(&ours, &on_disk, RUN);
        assert_eq!(
            kept,
            [ours.clone(), format!("{host}\n").into_bytes()].concat()
        );
        assert_eq!(without_host_verdicts(&kept, RUN), ours);
        // A first line cut short (a tail read) is passed over.
        assert!(host_verdicts(&on_disk[5..ours.len()], RUN).is_empty());
    }
}
