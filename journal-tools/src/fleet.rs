//! `journal-tools --from URL inspect runs|run|events|stats`: the fleet as shipped into
//! PostgreSQL (`runjournal::ship::fleet`), printed as the local commands print a journal, with
//! a host and a journal column; and `inspect verify --against URL`.

use anyhow::Context;
use runjournal::RunStatus;
use runjournal::ship::fleet::{self, EventFilter, Fleet, FleetRun, RunFilter, ShippedRecord};
use runjournal::ship::rows::{self, RecordRow};
use runjournal::ship::{ShipError, Target, journal_id_text};
use runjournal::state;
use runjournal::verify::{Problem, ProblemKind, Severity};
use serde_json::{Value, json};

use crate::inspect::{event_fields, fields_text, print_problem, print_state, status_cell};
use crate::output::{Out, cell, note, plural, table, time, time_ms};
use crate::source::Source;
use crate::{EventsArgs, RunsArgs, Status, UsageError, when};

/// Records read from the server per page by `inspect events --from`.
const FLEET_EVENTS_PAGE: usize = 1000;

/// How many differences `verify --against` lists one by one (the summary counts them all).
const LISTED_DIFFERENCES_MAX: usize = 200;

/// The fleet's options, from the command line.
pub struct FleetArgs {
    pub url: String,
    /// A host whose heartbeat is older than this is silent.
    pub silent_after_ms: u64,
}

fn connect(url: &str) -> anyhow::Result<Fleet> {
    let target = Target::parse(url).map_err(|error| UsageError(error.to_string()))?;
    Ok(Fleet::connect(&target)?)
}

/// The first characters of a journal id: enough to tell a fleet's journals apart in a table
/// (JSON carries the whole id).
fn short_journal(journal_id: &str) -> &str {
    journal_id.get(..8).unwrap_or(journal_id)
}

fn runner_text(run: &FleetRun, silent_since: Option<u64>) -> String {
    match (silent_since, run.runner_pid) {
        (Some(since), _) => format!("host silent since {}", time(since)),
        (None, Some(pid)) => pid.to_string(),
        (None, None) => "-".to_string(),
    }
}

fn run_json(run: &FleetRun, silent_since: Option<u64>) -> Value {
    json!({
        "host": run.host_name,
        "journalId": run.journal_id,
        "run": run.run_id.to_string(),
        "name": run.name,
        "state": run.state.as_str(),
        "closed": run.is_closed,
        "stale": run.is_stale,
        "dismissed": run.is_dismissed,
        "stepsDone": run.steps_done,
        "stepsTotal": run.steps_total,
        "createdAtMs": run.created_at_ms,
        "endedAtMs": run.ended_at_ms,
        "headSeq": run.head_seq,
        "runnerPid": run.runner_pid,
        "hostSilentSinceMs": silent_since,
    })
}

pub fn runs(args: &FleetArgs, out: &mut Out, runs_args: &RunsArgs) -> anyhow::Result<Status> {
    let now = jiff::Timestamp::now();
    let parse = |text: &Option<String>| {
        text.as_deref()
            .map(|text| when::parse_time(text, now).map_err(UsageError))
            .transpose()
    };
    let filter = RunFilter {
        states: runs_args.state.clone(),
        created_since_ms: parse(&runs_args.since)?,
        created_until_ms: parse(&runs_args.until)?,
        limit: runs_args.limit,
    };
    let mut fleet = connect(&args.url)?;
    let server_now = fleet.server_now_ms()?;
    let runs = fleet.runs(&filter)?;
    let journals = fleet.journals()?.len();
    if out.is_json {
        for run in &runs {
            let silent = run.host_silent_since(server_now, args.silent_after_ms);
            out.json("run", run_json(run, silent))?;
        }
        out.json("summary", json!({"runs": runs.len(), "journals": journals}))?;
        return Ok(Status::Fine);
    }
    if runs.is_empty() {
        note(&format!(
            "no runs match ({} shipped to {})",
            plural(journals as u64, "journal"),
            fleet.target()
        ));
        return Ok(Status::Fine);
    }
    let mut rows = vec![
        [
            "HOST", "JOURNAL", "RUN", "NAME", "STATE", "CLOSED", "STEPS", "STARTED", "ENDED",
            "HEAD", "RUNNER",
        ]
        .map(cell)
        .to_vec(),
    ];
    for run in &runs {
        let silent = run.host_silent_since(server_now, args.silent_after_ms);
        rows.push(vec![
            cell(run.host_name.clone()),
            cell(short_journal(&run.journal_id)),
            cell(run.run_id.to_string()),
            cell(run.name.clone().unwrap_or_else(|| "-".to_string())),
            status_cell(out, run.state),
            cell(if run.is_closed {
                "yes"
            } else if run.is_stale {
                "stale"
            } else {
                "no"
            }),
            cell(format!("{}/{}", run.steps_done, run.steps_total)),
            cell(time(run.created_at_ms)),
            cell(run.ended_at_ms.map_or_else(|| "-".to_string(), time)),
            cell(run.head_seq.to_string()),
            cell(runner_text(run, silent)),
        ]);
    }
    for line in table(&rows) {
        out.line(&line)?;
    }
    Ok(Status::Fine)
}

/// The one run `text` names across the fleet.
fn find_run(fleet: &mut Fleet, text: &str) -> anyhow::Result<FleetRun> {
    let mut found = fleet.find_runs(text)?;
    found.dedup_by(|a, b| a.journal_id == b.journal_id && a.run_id == b.run_id);
    match found.len() {
        0 => Err(UsageError(format!("no run of the fleet matches {text:?}")).into()),
        1 => Ok(found.remove(0)),
        count => {
            let examples = found
                .iter()
                .take(4)
                .map(|run| format!("{} on {}", run.run_id, run.host_name))
                .collect::<Vec<_>>()
                .join(", ");
            Err(UsageError(format!(
                "{text:?} matches {count} runs of the fleet ({examples}); give more characters of the id"
            ))
            .into())
        }
    }
}

pub fn run(args: &FleetArgs, out: &mut Out, text: &str) -> anyhow::Result<Status> {
    let mut fleet = connect(&args.url)?;
    let server_now = fleet.server_now_ms()?;
    let found = find_run(&mut fleet, text)?;
    let silent = found.host_silent_since(server_now, args.silent_after_ms);
    let records = fleet.run_records(&found.journal_id, found.run_id)?;
    let records: Vec<_> = records.into_iter().map(|(_, record)| record).collect();
    // The shipped records are the truth here too: the run is their fold.
    let state = state::replay(&records)
        .map_err(|error| ShipError::BadData {
            target: fleet.target().to_string(),
            reason: format!(
                "the shipped records of run {} do not fold: {error}",
                found.run_id
            ),
        })?
        .ok_or_else(|| ShipError::BadData {
            target: fleet.target().to_string(),
            reason: format!("run {} has no shipped records", found.run_id),
        })?;
    if out.is_json {
        let mut object = run_json(&found, silent);
        if let Value::Object(object) = &mut object {
            object.insert("headSeq".to_string(), state.head_seq.into());
            object.insert("state".to_string(), state.status.as_str().into());
        }
        out.json("run", object)?;
        for record in &records {
            out.json(
                "record",
                json!({
                    "run": record.run_id.to_string(),
                    "seq": record.seq,
                    "timeMs": record.time_ms,
                    "writer": record.writer.to_string(),
                    "writerSeq": record.writer_seq,
                    "event": record.event.name(),
                    "fields": Value::Object(event_fields(&record.event)),
                }),
            )?;
        }
        out.json(
            "summary",
            json!({
                "run": found.run_id.to_string(),
                "host": found.host_name,
                "journalId": found.journal_id,
                "records": records.len(),
                "headSeq": state.head_seq,
            }),
        )?;
        return Ok(Status::Fine);
    }
    let mut remote = vec![
        ("host".to_string(), found.host_name.clone()),
        ("journal".to_string(), found.journal_id.clone()),
    ];
    if let Some(since) = silent {
        remote.push((
            "silent".to_string(),
            format!(
                "host silent since {} (only its own reconciler closes this run)",
                time(since)
            ),
        ));
    }
    print_state(out, &state, Some(&remote))?;
    out.line("")?;
    out.line("timeline")?;
    let mut rows = vec![["SEQ", "TIME", "WRITER", "EVENT"].map(cell).to_vec()];
    for record in &records {
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
    Ok(Status::Fine)
}

pub fn events(args: &FleetArgs, out: &mut Out, events_args: &EventsArgs) -> anyhow::Result<Status> {
    if events_args.follow {
        return Err(UsageError(
            "--follow reads a local journal as it grows; with --from, run the command again with --after-seq"
                .to_string(),
        )
        .into());
    }
    let mut fleet = connect(&args.url)?;
    let run = match &events_args.run {
        Some(text) => {
            let found = find_run(&mut fleet, text)?;
            Some((found.journal_id, found.run_id))
        }
        None => None,
    };
    // Read in pages, so a fleet of millions of records is never held at once.
    let mut shown = 0usize;
    let mut after: Option<(i64, String, i64)> = None;
    loop {
        let left = events_args.limit.map_or(FLEET_EVENTS_PAGE, |limit| {
            limit.saturating_sub(shown).min(FLEET_EVENTS_PAGE)
        });
        if left == 0 {
            break;
        }
        let page = fleet.events(&EventFilter {
            run: run.clone(),
            after_seq: events_args.after_seq,
            after: after.clone(),
            limit: Some(left),
        })?;
        let Some(last) = page.last() else { break };
        after = Some((
            last.row.time_ms,
            last.journal_id.clone(),
            last.row.global_seq,
        ));
        shown += page.len();
        for shipped in &page {
            print_event(out, shipped)?;
        }
    }
    if out.is_json {
        out.json("summary", json!({"events": shown}))?;
    }
    Ok(Status::Fine)
}

fn print_event(out: &mut Out, shipped: &ShippedRecord) -> anyhow::Result<()> {
    let row = &shipped.row;
    let decoded = rows::record_from_event_line(&row.event);
    if out.is_json {
        let fields = match &decoded {
            Ok(record) => Value::Object(event_fields(&record.event)),
            Err(_) => row.event.clone(),
        };
        out.json(
            "event",
            json!({
                "host": shipped.host_name,
                "journalId": shipped.journal_id,
                "globalSeq": row.global_seq,
                "run": row.run_id,
                "seq": row.seq,
                "timeMs": row.time_ms,
                "event": row.event_type,
                "fields": fields,
            }),
        )?;
    } else {
        let fields = match &decoded {
            Ok(record) => fields_text(&event_fields(&record.event)),
            Err(reason) => format!("(does not decode: {reason})"),
        };
        let line = format!(
            "{}  {}  {:>6}  {}  {}  {:>4}  {} {fields}",
            shipped.host_name,
            short_journal(&shipped.journal_id),
            row.global_seq,
            time_ms(u64::try_from(row.time_ms).unwrap_or_default()),
            row.run_id,
            row.seq,
            row.event_type
        );
        out.line(line.trim_end())?;
    }
    Ok(())
}

pub fn stats(args: &FleetArgs, out: &mut Out) -> anyhow::Result<Status> {
    let mut fleet = connect(&args.url)?;
    let server_now = fleet.server_now_ms()?;
    let journals = fleet.journals()?;
    let counts = fleet.state_counts()?;
    let by_state = |journal: Option<&str>| -> Vec<(RunStatus, u64)> {
        RunStatus::ALL
            .iter()
            .map(|status| {
                let count = counts
                    .iter()
                    .filter(|(id, state, _)| {
                        state == status && journal.is_none_or(|journal| journal == id)
                    })
                    .map(|(_, _, count)| count)
                    .sum();
                (*status, count)
            })
            .collect()
    };
    let states_text = |states: &[(RunStatus, u64)]| {
        states
            .iter()
            .map(|(status, count)| format!("{status} {count}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if out.is_json {
        for journal in &journals {
            let silent = journal.silent_since(server_now, args.silent_after_ms);
            let states: serde_json::Map<String, Value> = by_state(Some(&journal.journal_id))
                .iter()
                .map(|(status, count)| (status.as_str().to_string(), Value::from(*count)))
                .collect();
            out.json(
                "journal",
                json!({
                    "host": journal.host_name,
                    "journalId": journal.journal_id,
                    "home": journal.home,
                    "journalCreatedAtMs": journal.journal_created_at_ms,
                    "runs": journal.runs,
                    "runsOpen": journal.runs_open,
                    "runsByState": states,
                    "records": journal.records,
                    "shippedThrough": journal.shipped_through,
                    "shippedAtMs": journal.shipped_at_ms,
                    "heartbeatAtMs": journal.heartbeat_at_ms,
                    "silentSinceMs": silent,
                }),
            )?;
        }
        let total_runs: u64 = journals.iter().map(|journal| journal.runs).sum();
        let total_records: u64 = journals.iter().map(|journal| journal.records).sum();
        out.json(
            "summary",
            json!({
                "server": fleet.target(),
                "journals": journals.len(),
                "silentJournals": journals
                    .iter()
                    .filter(|journal| journal.silent_since(server_now, args.silent_after_ms).is_some())
                    .count(),
                "runs": total_runs,
                "records": total_records,
            }),
        )?;
        return Ok(Status::Fine);
    }
    let mut rows = vec![
        [
            "HOST",
            "JOURNAL",
            "RUNS",
            "OPEN",
            "RECORDS",
            "SHIPPED",
            "LAST SHIPPED",
            "HEARTBEAT",
        ]
        .map(cell)
        .to_vec(),
    ];
    for journal in &journals {
        let heartbeat = match journal.silent_since(server_now, args.silent_after_ms) {
            Some(since) => format!("silent since {}", time(since)),
            None => time(journal.heartbeat_at_ms),
        };
        rows.push(vec![
            cell(journal.host_name.clone()),
            cell(short_journal(&journal.journal_id)),
            cell(journal.runs.to_string()),
            cell(journal.runs_open.to_string()),
            cell(journal.records.to_string()),
            cell(format!("through {}", journal.shipped_through)),
            cell(journal.shipped_at_ms.map_or_else(|| "-".to_string(), time)),
            cell(heartbeat),
        ]);
    }
    let total_runs: u64 = journals.iter().map(|journal| journal.runs).sum();
    let total_records: u64 = journals.iter().map(|journal| journal.records).sum();
    let summary = vec![
        vec![cell("server"), cell(fleet.target().to_string())],
        vec![cell("journals"), cell(journals.len().to_string())],
        vec![
            cell("runs"),
            cell(format!("{total_runs} ({})", states_text(&by_state(None)))),
        ],
        vec![cell("records"), cell(total_records.to_string())],
    ];
    for line in table(&summary) {
        out.line(&line)?;
    }
    if !journals.is_empty() {
        out.line("")?;
        for line in table(&rows) {
            out.line(&line)?;
        }
    }
    Ok(Status::Fine)
}

fn shipped_problem(
    message: String,
    run: Option<runjournal::RunId>,
    seq: Option<u64>,
    changes: Vec<String>,
) -> Problem {
    Problem {
        severity: Severity::Inconsistent,
        kind: ProblemKind::Shipped,
        run,
        seq,
        file: None,
        message,
        changes,
    }
}

fn row_text(row: &RecordRow) -> String {
    format!(
        "run {} seq {} ({}) is on the server at global seq {}",
        row.run_id, row.seq, row.event_type, row.global_seq
    )
}

/// `inspect verify --against URL`: the local journal compared with what the server holds of
/// it. Exit 1 when they differ.
pub fn verify_against(source: &Source, out: &mut Out, url: &str) -> anyhow::Result<Status> {
    let target = Target::parse(url).map_err(|error| UsageError(error.to_string()))?;
    let view = source.view()?;
    let meta = view.meta()?;
    let journal_id = journal_id_text(&meta.journal_id);
    let mut fleet = Fleet::connect(&target)?;
    let comparison = fleet::compare(&view, &mut fleet, &journal_id)
        .with_context(|| format!("comparing journal {journal_id} with {}", target.shown()))?;
    drop(view);
    let mut problems = Vec::new();
    if !comparison.is_registered && comparison.local_head > 0 {
        problems.push(shipped_problem(
            format!(
                "the server holds nothing of journal {journal_id} ({} not shipped)",
                plural(comparison.not_yet_shipped, "record")
            ),
            None,
            None,
            Vec::new(),
        ));
    }
    for (global, run, seq) in &comparison.missing {
        problems.push(shipped_problem(
            format!("run {run} seq {seq} (global seq {global}) is missing on the server"),
            Some(*run),
            Some(*seq),
            Vec::new(),
        ));
    }
    for (global, run, seq, changes) in &comparison.different {
        problems.push(shipped_problem(
            format!("run {run} seq {seq} (global seq {global}) differs on the server"),
            Some(*run),
            Some(*seq),
            changes.clone(),
        ));
    }
    for row in &comparison.extra {
        problems.push(shipped_problem(
            format!("{} but not in the journal as shipped", row_text(row)),
            row.run_id.parse().ok(),
            u64::try_from(row.seq).ok(),
            Vec::new(),
        ));
    }
    problems.sort_by_key(|problem| problem.seq.is_none());
    for problem in problems.iter().take(LISTED_DIFFERENCES_MAX) {
        print_problem(out, problem, None)?;
    }
    if problems.len() > LISTED_DIFFERENCES_MAX {
        note(&format!(
            "{} more differences not listed",
            problems.len() - LISTED_DIFFERENCES_MAX
        ));
    }
    let status = if comparison.has_differences() {
        Status::Problems
    } else {
        Status::Fine
    };
    if out.is_json {
        out.json(
            "summary",
            json!({
                "journalId": journal_id,
                "server": target.shown(),
                "registered": comparison.is_registered,
                "shippedThrough": comparison.shipped_through,
                "localHead": comparison.local_head,
                "recordsCompared": comparison.records_compared,
                "notYetShipped": comparison.not_yet_shipped,
                "missing": comparison.missing.len(),
                "extra": comparison.extra.len(),
                "different": comparison.different.len(),
                "ok": status == Status::Fine,
            }),
        )?;
    } else {
        let found = [
            (comparison.missing.len(), "missing"),
            (comparison.extra.len(), "extra"),
            (comparison.different.len(), "different"),
        ]
        .iter()
        .filter(|(count, _)| *count > 0)
        .map(|(count, what)| format!("{count} {what}"))
        .collect::<Vec<_>>();
        let found = if found.is_empty() {
            "no differences".to_string()
        } else {
            found.join(", ")
        };
        out.line(&format!(
            "compared {} of journal {journal_id} with {} (shipped through {}, journal head {}, {} not shipped yet): {found}",
            plural(comparison.records_compared, "record"),
            target.shown(),
            comparison.shipped_through,
            comparison.local_head,
            comparison.not_yet_shipped,
        ))?;
    }
    Ok(status)
}
