//! `journal-tools inspect ...`: runs, run, events, stats, verify. The library reads, folds,
//! checks and words; this prints.

use std::time::Duration;

use anyhow::Context;
use runjournal::capacity;
use runjournal::duration::{format_time_s, parse_time};
use runjournal::event::Record;
use runjournal::ship::journal_id_text;
use runjournal::ship::state as ship_state;
use runjournal::show::{self, Cell, LogEntry, RunRow, RunView, Tone, plural};
use runjournal::source::JournalSource;
use runjournal::state::{RunState, RunStatus};
use runjournal::verify::{self, Problem, Severity};
use serde_json::{Value, json};

use crate::output::{Out, note, shown_path};
use crate::{EventsArgs, RunsArgs, Status, UsageError, resolve_run, view};

/// How long `inspect events --follow` waits between looks at the journal.
const FOLLOW_POLL: Duration = Duration::from_millis(200);

/// Records read from the log per read.
const LOG_PAGE: usize = 512;

fn record_json(global: Option<u64>, record: &Record) -> Value {
    let mut object = json!({
        "run": record.run_id.to_string(),
        "seq": record.seq,
        "timeMs": record.time_ms,
        "writer": record.writer.to_string(),
        "writerSeq": record.writer_seq,
        "event": record.event.name(),
        "fields": Value::Object(show::event_fields(&record.event)),
    });
    if let (Some(global), Value::Object(object)) = (global, &mut object) {
        object.insert("globalSeq".to_string(), global.into());
    }
    object
}

fn run_json(state: &RunState) -> Value {
    let runner = show::look_at_runner(state);
    json!({
        "run": state.run_id.to_string(),
        "name": state.spec.name,
        "state": state.status.as_str(),
        "closed": state.is_closed(),
        "stale": state.is_stale(),
        "dismissed": state.dismissed_at_ms.is_some(),
        "stepsDone": state.steps_done(),
        "stepsTotal": state.steps.len(),
        "createdAtMs": state.created_at_ms,
        "endedAtMs": state.ended_at_ms(),
        "headSeq": state.head_seq,
        "runnerPid": state.runner.as_ref().map(|runner| runner.identity.pid),
        "runnerAlive": runner.map(show::RunnerSeen::as_str),
    })
}

pub fn runs(source: &JournalSource, out: &mut Out, args: &RunsArgs) -> anyhow::Result<Status> {
    let now_ms = runjournal::event::now_ms();
    let parse = |text: &Option<String>| {
        text.as_deref()
            .map(|text| parse_time(text, now_ms).map_err(|error| UsageError(error.to_string())))
            .transpose()
    };
    let since = parse(&args.since)?;
    let until = parse(&args.until)?;
    let view = view(source)?;
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
        let rows: Vec<RunRow> = matching
            .iter()
            .map(|state| RunRow::of(state, show::look_at_runner(state)))
            .collect();
        let rows = show::runs_table(&rows);
        out.table(&rows, "")?;
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

pub fn run(source: &JournalSource, out: &mut Out, text: &str) -> anyhow::Result<Status> {
    let view = view(source)?;
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
                "stateFolded".to_string(),
                serde_json::to_value(&state).map_or(Value::Null, show::camel_case_keys),
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
                "headSeq": state.head_seq,
            }),
        )?;
        return Ok(status);
    }
    let paint = |text: &str, tone: Tone| out.paint(text, tone);
    let lines = RunView::of(&state, show::look_at_runner(&state)).lines(&paint);
    for line in lines {
        out.line(&line)?;
    }
    out.line("")?;
    out.line("timeline")?;
    out.table(&show::timeline_rows(&rederived.records), "  ")?;
    Ok(status)
}

pub fn events(source: &JournalSource, out: &mut Out, args: &EventsArgs) -> anyhow::Result<Status> {
    let only = match &args.run {
        Some(text) => Some(resolve_run(&view(source)?, text)?),
        None => None,
    };
    let mut cursor = args.after_seq;
    let mut shown = 0usize;
    let is_done = |shown: usize| args.limit.is_some_and(|limit| shown >= limit);
    'polls: loop {
        let view = view(source)?;
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
                    out.line(&LogEntry::of(None, global, &record).line())?;
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

pub fn stats(source: &JournalSource, out: &mut Out) -> anyhow::Result<Status> {
    let view = view(source)?;
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
    let policy = view.retention()?;
    let policy_is_set = view.retention_set()?.is_some();
    let tombstones = view.tombstone_count()?;
    let pruned_records = view.pruned_records()?;
    let queues = view.queues()?;
    let shipping = source.home().and_then(|home| {
        ship_state::read(home).map(|state| {
            // The lag is a report: when it cannot be read, there is no line rather than a
            // failed command.
            let lag = ship_state::lag(home, &view).ok().flatten();
            (state, lag)
        })
    });
    drop(view);
    let journal_path = source.journal_path();
    let file_bytes = std::fs::metadata(journal_path)
        .with_context(|| format!("reading the size of {}", journal_path.display()))?
        .len();
    let capacity =
        match source.home() {
            Some(home) => Some(capacity::read_status(home).with_context(|| {
                format!("reading the capacity state of {}", home.root().display())
            })?),
            None => None,
        };
    // What the home holds, and the room its file system has left.
    let bytes = source.home().map(runjournal::retention::home_bytes);
    let space = source
        .home()
        .and_then(|home| runjournal::platform::space::space_of(home.root()).ok());
    let free_floor = match (policy.keep_free, &space) {
        (Some(keep_free), Some(space)) => Some(keep_free.bytes_of(space.total_bytes)),
        _ => None,
    };
    let journal_id = journal_id_text(&meta.journal_id);
    for error in &damaged {
        note(&error.to_string());
    }
    if out.is_json {
        let runs_by_state: serde_json::Map<String, Value> = by_state
            .iter()
            .map(|(status, count)| (status.as_str().to_string(), Value::from(*count)))
            .collect();
        let blocked_pids: Option<Vec<u32>> = capacity.as_ref().map(|capacity| {
            capacity
                .blocked
                .iter()
                .map(|blocked| blocked.writer.pid)
                .collect()
        });
        out.json(
            "stats",
            json!({
                "journal": journal_path.display().to_string(),
                "formatVersion": meta.format_version,
                "journalId": journal_id,
                "createdAtMs": meta.created_at_ms,
                "fileBytes": file_bytes,
                "runs": runs,
                "runsByState": runs_by_state,
                "damagedSnapshots": damaged.len(),
                "activeRuns": active,
                "records": records,
                "globalHead": global_head,
                "hasReserve": capacity.as_ref().map(|capacity| capacity.has_reserve),
                "blockedSinceMs": capacity.as_ref().and_then(|c| c.blocked_since_ms()),
                "blockedPids": blocked_pids,
                "blocked": capacity.as_ref().map(show::blocked_writers_json),
                "retention": {
                    "keepForMs": policy.keep_for_ms,
                    "keepRuns": policy.keep_runs,
                    "maxSizeBytes": policy.max_size_bytes,
                    "keepFree": runjournal::retention::keep_free_text(policy.keep_free),
                    "isDefault": !policy_is_set,
                },
                "queues": serde_json::to_value(
                    queues
                        .iter()
                        .map(runjournal::launch::queue::QueueUsageReport::of)
                        .collect::<Vec<_>>()
                )?,
                "prunedRuns": tombstones,
                "prunedRecords": pruned_records,
                "bytes": bytes.map(|bytes| json!({
                    "journal": bytes.journal,
                    "runs": bytes.runs,
                    "results": bytes.results,
                    "reserve": bytes.reserve,
                })),
                "fileSystem": space.as_ref().map(|space| json!({
                    "mountPoint": space.mount_point.display().to_string(),
                    "totalBytes": space.total_bytes,
                    "availableBytes": space.available_bytes,
                    "keepFreeBytes": free_floor,
                })),
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
                if capacity.blocked.is_empty() {
                    "no".to_string()
                } else {
                    capacity
                        .blocked
                        .iter()
                        .map(|blocked| {
                            format!(
                                "pid {} on {} since {}",
                                blocked.writer.pid,
                                blocked.cause.describe(),
                                format_time_s(blocked.since_ms)
                            )
                        })
                        .collect::<Vec<_>>()
                        .join("; ")
                },
            ),
        };
        let rows: Vec<Vec<Cell>> = [
            ("journal", journal_path.display().to_string()),
            ("format", format!("version {}", meta.format_version)),
            ("journal id", journal_id),
            ("created", format_time_s(meta.created_at_ms)),
            (
                "file size",
                format!("{file_bytes} bytes ({})", human_bytes(file_bytes)),
            ),
            ("runs", format!("{runs} ({states})")),
            ("active runs", active.to_string()),
            ("records", format!("{records} (global head {global_head})")),
            ("reserve", reserve),
            ("blocked", blocked),
            (
                "retention",
                runjournal::retention::policy_lines(&policy)
                    .into_iter()
                    .map(|(bound, value)| format!("{bound} {value}"))
                    .collect::<Vec<_>>()
                    .join(", ")
                    + if policy_is_set { "" } else { " (the defaults)" },
            ),
            (
                "pruned",
                format!("{tombstones} tombstone(s) kept; {pruned_records} record(s) pruned in all"),
            ),
            (
                "home bytes",
                bytes.map_or_else(
                    || "unknown (no home)".to_string(),
                    |bytes| {
                        format!(
                            "journal {}, run directories {}, results {}, reserve {}",
                            human_bytes(bytes.journal),
                            human_bytes(bytes.runs),
                            human_bytes(bytes.results),
                            human_bytes(bytes.reserve)
                        )
                    },
                ),
            ),
            (
                "file system",
                space.as_ref().map_or_else(
                    || "unknown".to_string(),
                    |space| {
                        let mut text = format!(
                            "{} free of {} at {}",
                            human_bytes(space.available_bytes),
                            human_bytes(space.total_bytes),
                            space.mount_point.display()
                        );
                        if let Some(floor) = free_floor {
                            text.push_str(&format!(", {} kept free", human_bytes(floor)));
                        }
                        text
                    },
                ),
            ),
            (
                "shipping",
                show::shipping_text(
                    shipping.as_ref().map(|(state, _)| state),
                    shipping.as_ref().and_then(|(_, lag)| lag.as_ref()),
                    global_head,
                ),
            ),
        ]
        .into_iter()
        // A home without queues shows no line for them.
        .chain((!queues.is_empty()).then(|| {
            (
                "queues",
                queues
                    .iter()
                    .map(|usage| {
                        format!(
                            "{} {}",
                            usage.name,
                            runjournal::launch::queue::usage_text(usage)
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("; "),
            )
        }))
        .map(|(label, value)| vec![Cell::plain(label), Cell::plain(value)])
        .collect();
        out.table(&rows, "")?;
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
    // The message may quote a run's text; the label is this binary's, painted.
    out.line(&format!(
        "{} {}",
        out.paint(&label, Tone::of_severity(problem.severity)),
        show::escape_control(&problem.message)
    ))?;
    if let Some((_, path)) = &problem.file {
        out.line(&format!("{:13}{}", "", shown_path(path, root)))?;
    }
    for change in &problem.changes {
        out.text_line(&format!("{:13}{change}", ""))?;
    }
    Ok(())
}

pub fn problem_json(problem: &Problem, root: Option<&std::path::Path>) -> Value {
    json!({
        "severity": problem.severity.as_str(),
        "kind": problem.kind.as_str(),
        "run": problem.run.map(|run| run.to_string()),
        "seq": problem.seq,
        "fileKind": problem.file.as_ref().map(|(kind, _)| kind.as_str()),
        "path": problem.file.as_ref().map(|(_, path)| shown_path(path, root)),
        "message": problem.message,
        "changes": problem.changes,
    })
}

pub fn verify(source: &JournalSource, out: &mut Out) -> anyhow::Result<Status> {
    let verification = source.verify().map_err(|error| match error {
        runjournal::source::VerifyError::Read(error) => {
            anyhow::Error::new(error).context("reading the journal")
        }
        other => other.into(),
    })?;
    let report = &verification.report;
    let integrity = verification.integrity.as_str();
    let root = source.home().map(|home| home.root().to_path_buf());
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
            "projectionsChecked": source.home().is_some(),
            "integrity": integrity,
            "ok": Status::of_report(report) == Status::Fine,
        });
        if let Value::Object(summary) = &mut summary {
            for (severity, count) in counts {
                summary.insert(severity.as_str().to_string(), count.into());
            }
        }
        out.json("summary", summary)?;
    } else {
        let files = if source.home().is_some() {
            plural(report.files, "projection file")
        } else {
            "no projections (no home)".to_string()
        };
        let found = show::counted(
            counts.iter().map(|(severity, count)| (*count, severity)),
            "no problems",
        );
        out.line(&format!(
            "verified {}, {}, {files}; redb integrity check {integrity}: {found}",
            plural(report.runs, "run"),
            plural(report.records, "record")
        ))?;
    }
    Ok(Status::of_report(report))
}
