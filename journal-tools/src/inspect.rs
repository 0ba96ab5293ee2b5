//! `journal-tools inspect ...`: runs, run, events, stats, verify.

use std::time::Duration;

use anyhow::Context;
use runjournal::capacity;
use runjournal::event::{Event, Record};
use runjournal::liveness::{self, Liveness};
use runjournal::ship::state as ship_state;
use runjournal::state::{RunState, RunStatus};
use runjournal::verify::{self, Problem, Severity};
use serde_json::{Value, json};

use crate::output::{Colour, Out, cell, note, plural, shown_path, table, time, time_ms, wire_name};
use crate::source::Source;
use crate::{EventsArgs, RunsArgs, Status, UsageError, resolve_run, when};

/// How long `inspect events --follow` waits between looks at the journal.
const FOLLOW_POLL: Duration = Duration::from_millis(200);

/// Records read from the log per read.
const LOG_PAGE: usize = 512;

/// What is known of a run's runner now.
fn runner_liveness(state: &RunState) -> Option<(u32, &'static str)> {
    let runner = state.runner.as_ref()?;
    let alive = match liveness::check(&runner.identity) {
        Ok(Liveness::Alive) => "alive",
        Ok(Liveness::Dead) => "dead",
        Ok(Liveness::OtherBoot) => "dead (other boot)",
        Err(_) => "unknown",
    };
    Some((runner.identity.pid, alive))
}

fn closed_text(state: &RunState) -> &'static str {
    if state.is_closed() {
        "yes"
    } else if state.is_stale() {
        "stale"
    } else {
        "no"
    }
}

pub(crate) fn status_cell(out: &Out, status: RunStatus) -> (String, String) {
    let text = status.as_str().to_string();
    let shown = match Colour::of_status(status) {
        Some(colour) => out.paint(&text, colour),
        None => text.clone(),
    };
    (text, shown)
}

/// A record's event fields: the event's own fields as JSON (camelCase, as in events.jsonl).
pub(crate) fn event_fields(event: &Event) -> serde_json::Map<String, Value> {
    match serde_json::to_value(event) {
        Ok(Value::Object(mut tagged)) => match tagged.remove(event.name()) {
            Some(Value::Object(fields)) => fields,
            _ => serde_json::Map::new(),
        },
        _ => serde_json::Map::new(),
    }
}

/// `key=value ...` of the fields that are set.
pub(crate) fn fields_text(fields: &serde_json::Map<String, Value>) -> String {
    fields
        .iter()
        .filter(|(_, value)| !value.is_null())
        .map(|(key, value)| format!("{key}={value}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn record_json(global: Option<u64>, record: &Record) -> Value {
    let mut object = json!({
        "run": record.run_id.to_string(),
        "seq": record.seq,
        "time_ms": record.time_ms,
        "writer": record.writer.to_string(),
        "writer_seq": record.writer_seq,
        "event": record.event.name(),
        "fields": Value::Object(event_fields(&record.event)),
    });
    if let (Some(global), Value::Object(object)) = (global, &mut object) {
        object.insert("global_seq".to_string(), global.into());
    }
    object
}

fn run_json(state: &RunState) -> Value {
    let runner = runner_liveness(state);
    json!({
        "run": state.run_id.to_string(),
        "name": state.spec.name,
        "state": state.status.as_str(),
        "closed": state.is_closed(),
        "stale": state.is_stale(),
        "dismissed": state.dismissed_at_ms.is_some(),
        "steps_done": state.steps_done(),
        "steps_total": state.steps.len(),
        "created_at_ms": state.created_at_ms,
        "ended_at_ms": state.ended_at_ms(),
        "head_seq": state.head_seq,
        "runner_pid": runner.map(|(pid, _)| pid),
        "runner_alive": runner.map(|(_, alive)| alive),
    })
}

pub fn runs(source: &Source, out: &mut Out, args: &RunsArgs) -> anyhow::Result<Status> {
    let now = jiff::Timestamp::now();
    let parse = |text: &Option<String>| {
        text.as_deref()
            .map(|text| when::parse_time(text, now).map_err(UsageError))
            .transpose()
    };
    let since = parse(&args.since)?;
    let until = parse(&args.until)?;
    let view = source.view()?;
    let mut total = 0u64;
    let mut matching: Vec<RunState> = Vec::new();
    let mut damaged = Vec::new();
    view.scan_snapshots(|_, snapshot| {
        total += 1;
        match snapshot {
            Ok(state) => {
                let is_wanted = (args.state.is_empty() || args.state.contains(&state.status))
                    && since.is_none_or(|since| state.created_at_ms >= since)
                    && until.is_none_or(|until| state.created_at_ms <= until);
                if is_wanted {
                    matching.push(state);
                }
            }
            Err(error) => damaged.push(error),
        }
        true
    })
    .context("reading the runs")?;
    drop(view);
    // Newest first; ids are ULIDs, so their order is creation order.
    matching.sort_by(|a, b| {
        b.created_at_ms
            .cmp(&a.created_at_ms)
            .then(b.run_id.cmp(&a.run_id))
    });
    if let Some(limit) = args.limit {
        matching.truncate(limit);
    }
    if out.is_json {
        for state in &matching {
            out.json("run", run_json(state))?;
        }
    } else if matching.is_empty() {
        note(&format!("no runs match (the journal holds {total})"));
    } else {
        let mut rows = vec![
            [
                "RUN", "NAME", "STATE", "CLOSED", "STEPS", "STARTED", "ENDED", "HEAD", "RUNNER",
            ]
            .map(cell)
            .to_vec(),
        ];
        for state in &matching {
            let runner = runner_liveness(state)
                .map_or_else(|| "-".to_string(), |(pid, alive)| format!("{pid} {alive}"));
            rows.push(vec![
                cell(state.run_id.to_string()),
                cell(state.spec.name.clone().unwrap_or_else(|| "-".to_string())),
                status_cell(out, state.status),
                cell(closed_text(state)),
                cell(format!("{}/{}", state.steps_done(), state.steps.len())),
                cell(time(state.created_at_ms)),
                cell(state.ended_at_ms().map_or_else(|| "-".to_string(), time)),
                cell(state.head_seq.to_string()),
                cell(runner),
            ]);
        }
        for line in table(&rows) {
            out.line(&line)?;
        }
    }
    for error in &damaged {
        note(&error.to_string());
    }
    if out.is_json {
        out.json(
            "summary",
            json!({"runs": matching.len(), "total": total, "damaged": damaged.len()}),
        )?;
    }
    Ok(if damaged.is_empty() {
        Status::Fine
    } else {
        Status::Damaged
    })
}

pub fn run(source: &Source, out: &mut Out, text: &str) -> anyhow::Result<Status> {
    let view = source.view()?;
    let run = resolve_run(&view, text)?;
    let rederived = verify::rederive(&view, run, None);
    let stored = view.snapshot(run);
    drop(view);
    let mut status = Status::Fine;
    for problem in &rederived.problems {
        note(&format!("{}: {}", problem.severity, problem.message));
        for change in &problem.changes {
            note(&format!("  {change}"));
        }
        if problem.severity == Severity::Damaged {
            status = Status::Damaged;
        }
    }
    // The fold is the truth; the stored snapshot stands in when the records cannot be read.
    let state = match (&rederived.state, stored) {
        (Some(state), _) => state.clone(),
        (None, Ok(Some(stored))) => {
            note("showing the stored snapshot: the records do not fold");
            stored
        }
        (None, Ok(None)) => anyhow::bail!("run {run} has no snapshot and its records do not fold"),
        (None, Err(error)) => return Err(error.into()),
    };
    if out.is_json {
        let mut object = run_json(&state);
        if let Value::Object(object) = &mut object {
            object.insert(
                "state_folded".to_string(),
                serde_json::to_value(&state).unwrap_or(Value::Null),
            );
        }
        out.json("run", object)?;
        for record in &rederived.records {
            out.json("record", record_json(None, record))?;
        }
        out.json(
            "summary",
            json!({
                "run": run.to_string(),
                "records": rederived.records.len(),
                "head_seq": state.head_seq,
            }),
        )?;
        return Ok(status);
    }
    print_state(out, &state, None)?;
    out.line("")?;
    out.line("timeline")?;
    let mut rows = vec![["SEQ", "TIME", "WRITER", "EVENT"].map(cell).to_vec()];
    for record in &rederived.records {
        let fields = fields_text(&event_fields(&record.event));
        rows.push(vec![
            cell(record.seq.to_string()),
            cell(time_ms(record.time_ms)),
            cell(format!("{}/{}", record.writer, record.writer_seq)),
            cell(
                format!("{} {fields}", record.event.name())
                    .trim_end()
                    .to_string(),
            ),
        ]);
    }
    for line in table(&rows) {
        out.line(&format!("  {line}"))?;
    }
    Ok(status)
}

/// Prints a run's state. `remote` is for a run of another host (the fleet): its rows come
/// first, and the runner's liveness is not looked up here, where its pid means nothing.
pub(crate) fn print_state(
    out: &mut Out,
    state: &RunState,
    remote: Option<&[(String, String)]>,
) -> anyhow::Result<()> {
    let mut rows: Vec<Vec<(String, String)>> = Vec::new();
    let mut row = |label: &str, value: (String, String)| rows.push(vec![cell(label), value]);
    for (label, value) in remote.unwrap_or_default() {
        row(label, cell(value.clone()));
    }
    row("run", cell(state.run_id.to_string()));
    if let Some(name) = &state.spec.name {
        row("name", cell(name.clone()));
    }
    let step_count = state.steps.len();
    row(
        "mode",
        cell(format!(
            "{}, {step_count} step{}",
            state.spec.mode.as_str(),
            if step_count == 1 { "" } else { "s" }
        )),
    );
    let (plain, shown) = status_cell(out, state.status);
    let closed = if state.is_closed() {
        " (closed)"
    } else if state.is_stale() {
        " (stale: its runner is gone, no outcome recorded)"
    } else {
        ""
    };
    row(
        "state",
        (format!("{plain}{closed}"), format!("{shown}{closed}")),
    );
    row("created", cell(time_ms(state.created_at_ms)));
    for (label, value) in [
        ("session", &state.session_id),
        ("owner", &state.completion_owner_id),
        ("tool call", &state.tool_call_id),
    ] {
        if let Some(value) = value {
            row(label, cell(value.clone()));
        }
    }
    if let Some(runner) = &state.runner {
        let alive = if remote.is_some() {
            "on its host"
        } else {
            runner_liveness(state).map_or("unknown", |(_, alive)| alive)
        };
        row(
            "runner",
            cell(format!(
                "pid {}, {alive}, instance {}, started {}",
                runner.identity.pid,
                runner.instance_id,
                time_ms(runner.started_at_ms)
            )),
        );
    }
    for control in &state.controls {
        row(
            "control",
            cell(format!(
                "{} by {} at {}: {}",
                control.action.as_str(),
                control.by,
                time_ms(control.at_ms),
                control.reason
            )),
        );
    }
    if let Some(terminal) = &state.terminal {
        let mut text = format!(
            "{} at {}, exit code {}, summary {:?}",
            terminal.state.as_str(),
            time_ms(terminal.at_ms),
            terminal.exit_code,
            terminal.summary
        );
        if let Some(error) = &terminal.error {
            text.push_str(&format!(", error {error:?}"));
        }
        if let Some(repairer) = terminal.repaired_by {
            text.push_str(&format!(", repaired by {}", wire_name(&repairer)));
        }
        row("ended", cell(text));
    }
    if let Some(observed) = &state.process_terminal {
        let exit = match observed.exit {
            Some(exit) => match (exit.code, exit.signal) {
                (_, Some(signal)) => format!(", signal {signal}"),
                (Some(code), None) => format!(", exit code {code}"),
                (None, None) => String::new(),
            },
            None => String::new(),
        };
        row(
            "process",
            cell(format!(
                "{} by {} at {}{exit}",
                observed.proof.as_str(),
                wire_name(&observed.observer),
                time_ms(observed.at_ms)
            )),
        );
    }
    if let Some(at) = state.dismissed_at_ms {
        row("dismissed", cell(time_ms(at)));
    }
    row(
        "head",
        cell(format!(
            "seq {}, updated {}",
            state.head_seq,
            time_ms(state.updated_at_ms)
        )),
    );
    for line in table(&rows) {
        out.line(&line)?;
    }
    out.line("")?;
    out.line("steps")?;
    let mut rows = vec![
        ["#", "NAME", "STATUS", "STARTED", "ENDED", "EXIT", "DETAIL"]
            .map(cell)
            .to_vec(),
    ];
    for (index, (spec, step)) in state.spec.steps.iter().zip(&state.steps).enumerate() {
        let mut detail = Vec::new();
        if let Some(job) = &step.job {
            detail.push(format!("job {}", job.state.as_str()));
            if let Some(id) = &job.id {
                detail.push(format!("id {id}"));
            }
            if let Some(progress) = job.progress {
                detail.push(format!("progress {progress}"));
            }
            if let Some(message) = &job.message {
                detail.push(format!("{message:?}"));
            }
        }
        if let Some(error) = &step.error {
            detail.push(format!("error {error:?}"));
        }
        rows.push(vec![
            cell(index.to_string()),
            cell(spec.name.clone()),
            cell(step.status.as_str()),
            cell(step.started_at_ms.map_or_else(|| "-".to_string(), time_ms)),
            cell(step.ended_at_ms.map_or_else(|| "-".to_string(), time_ms)),
            cell(
                step.exit_code
                    .map_or_else(|| "-".to_string(), |code| code.to_string()),
            ),
            cell(detail.join(", ")),
        ]);
    }
    for line in table(&rows) {
        out.line(&format!("  {}", line.trim_end()))?;
    }
    Ok(())
}

pub fn events(source: &Source, out: &mut Out, args: &EventsArgs) -> anyhow::Result<Status> {
    let only = match &args.run {
        Some(text) => Some(resolve_run(&source.view()?, text)?),
        None => None,
    };
    let mut cursor = args.after_seq;
    let mut shown = 0usize;
    let is_done = |shown: usize| args.limit.is_some_and(|limit| shown >= limit);
    'polls: loop {
        let view = source.view()?;
        loop {
            if is_done(shown) {
                break 'polls;
            }
            let page = view.records_after(cursor, LOG_PAGE)?;
            if page.is_empty() {
                break;
            }
            for (global, record) in page {
                cursor = global;
                if only.is_some_and(|run| run != record.run_id) {
                    continue;
                }
                if out.is_json {
                    out.json("event", record_json(Some(global), &record))?;
                } else {
                    let fields = fields_text(&event_fields(&record.event));
                    let line = format!(
                        "{global:>6}  {}  {}  {:>4}  {} {fields}",
                        time_ms(record.time_ms),
                        record.run_id,
                        record.seq,
                        record.event.name()
                    );
                    out.line(line.trim_end())?;
                }
                shown += 1;
                if is_done(shown) {
                    break 'polls;
                }
            }
        }
        drop(view);
        if !args.follow {
            break;
        }
        out.flush()?;
        std::thread::sleep(FOLLOW_POLL);
    }
    if out.is_json {
        out.json("summary", json!({"events": shown, "cursor": cursor}))?;
    }
    Ok(Status::Fine)
}

pub fn stats(source: &Source, out: &mut Out) -> anyhow::Result<Status> {
    let view = source.view()?;
    let meta = view.meta()?;
    // In lifecycle order.
    let mut by_state: Vec<(RunStatus, u64)> =
        RunStatus::ALL.iter().map(|status| (*status, 0)).collect();
    let mut damaged = Vec::new();
    view.scan_snapshots(|_, snapshot| {
        match snapshot {
            Ok(state) => {
                if let Some((_, count)) = by_state
                    .iter_mut()
                    .find(|(status, _)| *status == state.status)
                {
                    *count += 1;
                }
            }
            Err(error) => damaged.push(error),
        }
        true
    })
    .context("reading the runs")?;
    let runs: u64 = by_state.iter().map(|(_, count)| count).sum::<u64>() + damaged.len() as u64;
    let active = view.active_runs()?.len();
    let records = view.record_count()?;
    let global_head = view.global_head()?;
    let shipping = match &source.home {
        Some(home) => ship_state::read(home).map(|state| {
            let lag = ship_state::lag(home, &view).ok().flatten();
            (state, lag)
        }),
        None => None,
    };
    drop(view);
    let file_bytes = std::fs::metadata(&source.journal_path)
        .with_context(|| format!("reading the size of {}", source.journal_path.display()))?
        .len();
    let capacity =
        match &source.home {
            Some(home) => Some(capacity::read_status(home).with_context(|| {
                format!("reading the capacity state of {}", home.root().display())
            })?),
            None => None,
        };
    let journal_id: String = meta
        .journal_id
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    for error in &damaged {
        note(&error.to_string());
    }
    if out.is_json {
        let runs_by_state: serde_json::Map<String, Value> = by_state
            .iter()
            .map(|(status, count)| (status.as_str().to_string(), Value::from(*count)))
            .collect();
        let blocked_pids: Option<Vec<u32>> = capacity
            .as_ref()
            .map(|capacity| capacity.blocked.iter().map(|blocked| blocked.pid).collect());
        out.json(
            "stats",
            json!({
                "journal": source.journal_path.display().to_string(),
                "format_version": meta.format_version,
                "journal_id": journal_id,
                "created_at_ms": meta.created_at_ms,
                "file_bytes": file_bytes,
                "runs": runs,
                "runs_by_state": runs_by_state,
                "damaged_snapshots": damaged.len(),
                "active_runs": active,
                "records": records,
                "global_head": global_head,
                "has_reserve": capacity.as_ref().map(|capacity| capacity.has_reserve),
                "blocked_since_ms": capacity.as_ref().and_then(|c| c.blocked_since_ms()),
                "blocked_pids": blocked_pids,
                "shipping": shipping.as_ref().map(|(state, lag)| json!({
                    "target": state.target,
                    "shippedThrough": state.shipped_through,
                    "recordsBehind": global_head.saturating_sub(state.shipped_through),
                    "failingSinceMs": state.failing_since_ms,
                    "lastError": state.last_error,
                    "lag": lag.as_ref().map(|lag| lag.line()),
                })),
            }),
        )?;
        out.json("summary", json!({"runs": runs, "records": records}))?;
    } else {
        let states = by_state
            .iter()
            .map(|(status, count)| format!("{status} {count}"))
            .collect::<Vec<_>>()
            .join(", ");
        let (reserve, blocked) = match &capacity {
            None => (
                "unknown (no home: --journal without --home)".to_string(),
                "unknown (no home)".to_string(),
            ),
            Some(capacity) => (
                if capacity.has_reserve {
                    "in place"
                } else {
                    "missing (released on a full disk, or never made)"
                }
                .to_string(),
                match capacity.blocked_since_ms() {
                    None => "no".to_string(),
                    Some(since) => format!(
                        "yes, since {} ({} writer{} waiting for space: pid {})",
                        time(since),
                        capacity.blocked.len(),
                        if capacity.blocked.len() == 1 { "" } else { "s" },
                        capacity
                            .blocked
                            .iter()
                            .map(|blocked| blocked.pid.to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                },
            ),
        };
        let rows = vec![
            vec![
                cell("journal"),
                cell(source.journal_path.display().to_string()),
            ],
            vec![
                cell("format"),
                cell(format!("version {}", meta.format_version)),
            ],
            vec![cell("journal id"), cell(journal_id)],
            vec![cell("created"), cell(time(meta.created_at_ms))],
            vec![
                cell("file size"),
                cell(format!("{file_bytes} bytes ({})", human_bytes(file_bytes))),
            ],
            vec![cell("runs"), cell(format!("{runs} ({states})"))],
            vec![cell("active runs"), cell(active.to_string())],
            vec![
                cell("records"),
                cell(format!("{records} (global head {global_head})")),
            ],
            vec![cell("reserve"), cell(reserve)],
            vec![cell("disk full"), cell(blocked)],
            vec![
                cell("shipping"),
                cell(match &shipping {
                    None => "not shipped (no runjournal ship from this home)".to_string(),
                    Some((_, Some(lag))) => lag.summary(),
                    Some((state, None)) => format!(
                        "to {}, shipped through global seq {} of {global_head}",
                        state.target, state.shipped_through
                    ),
                }),
            ],
        ];
        for line in table(&rows) {
            out.line(&line)?;
        }
    }
    Ok(if damaged.is_empty() {
        Status::Fine
    } else {
        Status::Damaged
    })
}

fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = "B";
    for next in UNITS {
        if value < 1024.0 {
            break;
        }
        value /= 1024.0;
        unit = next;
    }
    if unit == "B" {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {unit}")
    }
}

/// Prints one problem: a line of severity and message, then its file and changes indented.
pub fn print_problem(
    out: &mut Out,
    problem: &Problem,
    root: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    if out.is_json {
        let kind = if problem.severity == Severity::Note {
            "note"
        } else {
            "problem"
        };
        out.json(kind, problem_json(problem, root))?;
        return Ok(());
    }
    let label = format!("{:<12}", problem.severity.as_str());
    out.line(&format!(
        "{} {}",
        out.paint(&label, Colour::of_severity(problem.severity)),
        problem.message
    ))?;
    if let Some((_, path)) = &problem.file {
        out.line(&format!("{:13}{}", "", shown_path(path, root)))?;
    }
    for change in &problem.changes {
        out.line(&format!("{:13}{change}", ""))?;
    }
    Ok(())
}

pub fn problem_json(problem: &Problem, root: Option<&std::path::Path>) -> Value {
    json!({
        "severity": problem.severity.as_str(),
        "kind": problem.kind.as_str(),
        "run": problem.run.map(|run| run.to_string()),
        "seq": problem.seq,
        "file_kind": problem.file.as_ref().map(|(kind, _)| kind.as_str()),
        "path": problem.file.as_ref().map(|(_, path)| shown_path(path, root)),
        "message": problem.message,
        "changes": problem.changes,
    })
}

pub fn verify(source: &Source, out: &mut Out) -> anyhow::Result<Status> {
    let view = source.view()?;
    let mut report = verify::verify(&view, source.home.as_ref());
    drop(view);
    if let Some(home) = &source.home {
        report.problems = verify::recheck_projections(home, source, report.problems);
    }
    let scratch = tempfile::Builder::new()
        .prefix("journal-tools-")
        .tempdir()
        .context("making a directory for a copy of the journal")?;
    let integrity = match verify::check_integrity_of_copy(&source.journal_path, scratch.path()) {
        Ok(integrity) => {
            let passed = integrity.problems.is_empty();
            report.problems.extend(integrity.problems);
            if passed { "passed" } else { "failed" }
        }
        Err(error) => {
            report.problems.push(Problem {
                severity: Severity::Note,
                kind: verify::ProblemKind::Integrity,
                run: None,
                seq: None,
                file: None,
                message: format!("redb's integrity check was skipped: {error}"),
                changes: Vec::new(),
            });
            "skipped"
        }
    };
    let root = source.home.as_ref().map(|home| home.root().to_path_buf());
    for problem in &report.problems {
        print_problem(out, problem, root.as_deref())?;
    }
    let counts = [
        Severity::Damaged,
        Severity::Unchecked,
        Severity::Inconsistent,
        Severity::Note,
    ]
    .map(|severity| (severity, report.count(severity)));
    if out.is_json {
        let mut summary = json!({
            "runs": report.runs,
            "records": report.records,
            "files": report.files,
            "projections_checked": source.home.is_some(),
            "integrity": integrity,
            "ok": Status::of_report(&report) == Status::Fine,
        });
        if let Value::Object(summary) = &mut summary {
            for (severity, count) in counts {
                summary.insert(severity.as_str().to_string(), count.into());
            }
        }
        out.json("summary", summary)?;
    } else {
        let files = if source.home.is_some() {
            plural(report.files, "projection file")
        } else {
            "no projections (no home)".to_string()
        };
        let found = counts
            .iter()
            .filter(|(_, count)| *count > 0)
            .map(|(severity, count)| format!("{count} {severity}"))
            .collect::<Vec<_>>();
        let found = if found.is_empty() {
            "no problems".to_string()
        } else {
            found.join(", ")
        };
        out.line(&format!(
            "verified {}, {}, {files}; redb integrity check {integrity}: {found}",
            plural(report.runs, "run"),
            plural(report.records, "record")
        ))?;
    }
    Ok(Status::of_report(&report))
}
