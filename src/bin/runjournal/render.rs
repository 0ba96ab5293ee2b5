//! Human output: transition lines, the status view, the list table. No colour is used, so
//! `NO_COLOR` holds trivially and `--json` output is plain.

use std::fmt::Write as _;

use runjournal::event::{Event, ProcessExit, Record, RunSpec, StepEnd, UnixMs};
use runjournal::spec::format_duration_ms;
use runjournal::state::StepStatus;
use runjournal::{Home, RunState};

fn step_label(spec: &RunSpec, step: u32) -> String {
    match spec.steps.get(step as usize) {
        Some(step_spec) => format!("step {step} ({})", step_spec.name),
        None => format!("step {step}"),
    }
}

/// "exit code 3", "signal 9".
pub fn exit_text(exit: ProcessExit) -> String {
    match (exit.code, exit.signal) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(signal)) => format!("signal {signal}"),
        (None, None) => "unknown exit".to_string(),
    }
}

/// One line per journaled transition, as `run --wait` prints them.
pub fn record_line(record: &Record, spec: &RunSpec) -> String {
    let detail = match &record.event {
        Event::RunCreated { spec, .. } => format!(
            "created: {}, {} step{}{}",
            spec.mode.as_str(),
            spec.steps.len(),
            if spec.steps.len() == 1 { "" } else { "s" },
            spec.name
                .as_ref()
                .map(|name| format!(", name {name}"))
                .unwrap_or_default()
        ),
        Event::RunnerStarted { runner, .. } => format!("runner started (pid {})", runner.pid),
        Event::StepRunning { step, process } => format!(
            "{} running{}",
            step_label(spec, *step),
            process
                .as_ref()
                .map(|process| format!(" (pid {})", process.pid))
                .unwrap_or_default()
        ),
        Event::ExternalJobUpdated { step, job } => {
            let mut text = format!("{} job {}", step_label(spec, *step), job.state.as_str());
            if let Some(progress) = job.progress {
                let _ = write!(text, " {progress}");
            }
            if let Some(message) = &job.message {
                let _ = write!(text, ": {message}");
            }
            if let Some(url) = &job.url {
                let _ = write!(text, " <{url}>");
            }
            text
        }
        Event::StepFinished { step, outcome } => {
            let end = match outcome.end {
                StepEnd::Complete => "complete",
                StepEnd::Failed => "failed",
                StepEnd::Stopped => "stopped",
                StepEnd::Skipped => "skipped",
            };
            let mut text = format!("{} {end}", step_label(spec, *step));
            if let Some(code) = outcome.exit_code {
                let _ = write!(text, " (exit {code})");
            }
            if let Some(error) = &outcome.error {
                let _ = write!(text, ": {error}");
            }
            text
        }
        Event::ControlRequested { action, by, reason } => {
            format!("{} requested by {by}: {reason}", action.as_str())
        }
        Event::Terminal {
            state,
            error,
            exit_code,
            ..
        } => {
            let mut text = format!("run {} (exit {exit_code})", state.as_str());
            if let Some(error) = error {
                let _ = write!(text, ": {error}");
            }
            text
        }
        Event::ProcessTerminalObserved {
            exit,
            proof,
            observer,
            ..
        } => {
            let exit = exit
                .map(exit_text)
                .unwrap_or_else(|| "exit unknown".to_string());
            format!(
                "runner gone ({exit}; proof {}, seen by {observer:?})",
                proof.as_str()
            )
        }
        Event::Dismissed { .. } => "dismissed".to_string(),
    };
    format!("#{} {}", record.seq, detail.replace('\n', " "))
}

/// The line `wait` prints when a run has ended.
pub fn end_line(state: &RunState) -> String {
    match &state.terminal {
        Some(terminal) => {
            let mut text = format!(
                "run {} {} (exit {})",
                state.run_id, state.status, terminal.exit_code
            );
            if let Some(error) = &terminal.error {
                let _ = write!(text, ": {error}");
            }
            text.replace('\n', " ")
        }
        None => format!("run {} {}", state.run_id, state.status),
    }
}

/// `status` without `--json`.
pub fn status_text(home: &Home, state: &RunState) -> String {
    let run = state.run_id;
    let mut out = String::new();
    let _ = writeln!(out, "run:      {run}");
    if let Some(name) = &state.spec.name {
        let _ = writeln!(out, "name:     {name}");
    }
    let mut line = state.status.to_string();
    if let Some(terminal) = &state.terminal {
        let _ = write!(line, " (exit {})", terminal.exit_code);
    }
    if state.dismissed_at_ms.is_some() {
        line.push_str(", dismissed");
    }
    let _ = writeln!(out, "state:    {line}");
    let mut mode = format!(
        "{}, {} steps",
        state.spec.mode.as_str(),
        state.spec.steps.len()
    );
    if state.spec.mode == runjournal::event::Mode::Parallel {
        let _ = write!(mode, ", concurrency {}", state.spec.concurrency);
    }
    if let Some(timeout_ms) = state.spec.timeout_ms {
        let _ = write!(mode, ", timeout {}", format_duration_ms(timeout_ms));
    }
    let _ = writeln!(out, "mode:     {mode}");
    if let Some(runner) = &state.runner {
        let gone = match &state.process_terminal {
            Some(observed) => format!(
                ", gone ({})",
                observed
                    .exit
                    .map(exit_text)
                    .unwrap_or_else(|| observed.proof.as_str().to_string())
            ),
            None => String::new(),
        };
        let _ = writeln!(out, "runner:   pid {}{gone}", runner.identity.pid);
    }
    if let Some(terminal) = &state.terminal
        && let Some(error) = &terminal.error
    {
        let _ = writeln!(out, "error:    {}", error.replace('\n', " "));
    }
    let _ = writeln!(out, "steps:");
    for (index, (step, spec)) in state.steps.iter().zip(&state.spec.steps).enumerate() {
        let exit = step
            .exit_code
            .map(|code| format!("exit {code}"))
            .unwrap_or_default();
        let mut line = format!(
            "  {index:>3}  {:<8}  {exit:<8}  {}",
            step.status.as_str(),
            spec.name
        );
        if let Some(job) = &step.job {
            let _ = write!(line, "  [job {}]", job.state.as_str());
        }
        if let Some(error) = step
            .error
            .as_ref()
            .filter(|_| step.status != StepStatus::Complete)
        {
            let _ = write!(line, "  {}", error.replace('\n', " "));
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
    let _ = writeln!(out, "status:   {}", home.status_path(run).display());
    let _ = writeln!(out, "result:   {}", home.result_path(run).display());
    let _ = writeln!(out, "output:   {}", home.run_dir(run).display());
    out
}

/// A short age: 5s, 3m, 2h, 4d.
fn age(now_ms: UnixMs, then_ms: UnixMs) -> String {
    let seconds = now_ms.saturating_sub(then_ms) / 1000;
    match seconds {
        0..60 => format!("{seconds}s"),
        60..3600 => format!("{}m", seconds / 60),
        3600..86_400 => format!("{}h", seconds / 3600),
        _ => format!("{}d", seconds / 86_400),
    }
}

/// `list` without `--json`.
pub fn list_table(states: &[RunState], now_ms: UnixMs) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<26}  {:<8}  {:<8}  {:>5}  {:>4}  {:>5}  NAME",
        "RUN", "STATE", "MODE", "STEPS", "EXIT", "AGE"
    );
    for state in states {
        let exit = state
            .terminal
            .as_ref()
            .map(|terminal| terminal.exit_code.to_string())
            .unwrap_or_else(|| "-".to_string());
        let steps = format!("{}/{}", state.steps_done(), state.steps.len());
        let name = state.spec.name.clone().unwrap_or_else(|| {
            state
                .spec
                .steps
                .first()
                .map(|step| step.name.clone())
                .unwrap_or_default()
        });
        let _ = writeln!(
            out,
            "{:<26}  {:<8}  {:<8}  {steps:>5}  {exit:>4}  {:>5}  {name}",
            state.run_id.to_string(),
            state.status.as_str(),
            state.spec.mode.as_str(),
            age(now_ms, state.created_at_ms)
        );
    }
    out
}

/// One run of `list --json`.
pub fn list_json(state: &RunState) -> serde_json::Value {
    serde_json::json!({
        "runId": state.run_id.to_string(),
        "name": state.spec.name,
        "state": state.status.as_str(),
        "mode": state.spec.mode.as_str(),
        "steps": state.steps.len(),
        "stepsDone": state.steps_done(),
        "createdAt": state.created_at_ms,
        "endedAt": state.ended_at_ms(),
        "exitCode": state.terminal.as_ref().map(|terminal| terminal.exit_code),
        "error": state.terminal.as_ref().and_then(|terminal| terminal.error.clone()),
        "dismissed": state.dismissed_at_ms.is_some(),
        "sessionId": state.session_id,
        "toolCallId": state.tool_call_id,
    })
}

/// What `status` and `list` say about a full disk: a line when a journal writer is blocked
/// waiting for space, or when the space reserve has been released. `None` when all is well.
pub fn capacity_notice(home: &Home, now_ms: UnixMs) -> Option<String> {
    let status = runjournal::capacity::read_status(home).ok()?;
    if let Some(since_ms) = status.blocked_since_ms() {
        return Some(format!(
            "journal: blocked on a full disk for {} ({} writer(s) waiting; transitions land once space returns)",
            age(now_ms, since_ms),
            status.blocked.len()
        ));
    }
    let is_reserve_expected =
        runjournal::capacity::reserve_bytes_from_env().is_ok_and(|bytes| bytes > 0);
    (is_reserve_expected && !status.has_reserve && home.journal_path().exists()).then(|| {
        "journal: the space reserve is released (the disk was full); it is made again once space allows"
            .to_string()
    })
}

/// The capacity state as JSON, for `status --json`.
pub fn capacity_json(home: &Home) -> serde_json::Value {
    match runjournal::capacity::read_status(home) {
        Ok(status) => serde_json::json!({
            "blockedSinceMs": status.blocked_since_ms(),
            "blockedWriters": status.blocked.len(),
            "hasReserve": status.has_reserve,
        }),
        Err(error) => serde_json::json!({ "error": error.to_string() }),
    }
}

/// What `status` and `list` say about shipping (`runjournal ship`): a line when it fails, or
/// when records wait and no shipper runs. `None` when the home does not ship or it keeps up.
pub fn ship_lag(store: &runjournal::Store) -> Option<runjournal::ship::state::Lag> {
    let view = store.journal().view().ok()?;
    runjournal::ship::state::lag(store.home(), &view)
        .ok()
        .flatten()
}

/// The shipping lag as JSON, for `status --json`.
pub fn ship_lag_json(lag: Option<&runjournal::ship::state::Lag>) -> serde_json::Value {
    match lag {
        Some(lag) => serde_json::json!({
            "recordsBehind": lag.records_behind,
            "sinceMs": lag.since_ms,
            "reason": lag.reason,
        }),
        None => serde_json::Value::Null,
    }
}
