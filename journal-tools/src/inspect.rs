//! `journal-tools inspect ...`: runs, run, events, stats, verify. The library reads, folds,
//! checks and words; this prints.

use std::time::Duration;

use anyhow::Context;
use runjournal::duration::parse_time;
use runjournal::json::{
    EventsSummary, InspectedRunDoc, ProblemDoc, RecordDoc, RunDoc, RunSummary, RunsSummary,
    StatsSummary, VerifySummary,
};
use runjournal::show::{self, Cell, LogEntry, RunRow, RunView, Tone, plural};
use runjournal::source::JournalSource;
use runjournal::state::RunState;
use runjournal::stats::Stats;
use runjournal::verify::{self, Problem, Severity};

use crate::output::{Out, note, shown_path};
use crate::{EventsArgs, RunsArgs, Status, UsageError, resolve_run, view};

/// How long `inspect events --follow` waits between looks at the journal.
const FOLLOW_POLL: Duration = Duration::from_millis(200);

/// Records read from the log per read.
const LOG_PAGE: usize = 512;

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
            out.json("run", &RunDoc::of(state))?;
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
            &RunsSummary {
                runs: matching.len(),
                total,
                damaged: damaged.len(),
            },
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
        out.json("run", &InspectedRunDoc::of(&state))?;
        for record in &rederived.records {
            out.json("record", &RecordDoc::of(None, record))?;
        }
        out.json(
            "summary",
            &RunSummary {
                run_id: run.to_string(),
                host: None,
                journal_id: None,
                records: rederived.records.len(),
                head_seq: state.head_seq,
            },
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
                    out.json("event", &RecordDoc::of(Some(global), &record))?;
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
        out.json(
            "summary",
            &EventsSummary {
                events: shown,
                cursor: Some(cursor),
            },
        )?;
    }
    Ok(Status::Fine)
}

pub fn stats(source: &JournalSource, out: &mut Out) -> anyhow::Result<Status> {
    let stats = Stats::gather(source)?;
    for error in &stats.damaged {
        note(&error.to_string());
    }
    if out.is_json {
        out.json("stats", &stats)?;
        out.json(
            "summary",
            &StatsSummary {
                runs: stats.runs,
                records: stats.records,
            },
        )?;
    } else {
        let rows: Vec<Vec<Cell>> = stats
            .lines()
            .into_iter()
            .map(|(label, value)| vec![Cell::plain(label), Cell::plain(value)])
            .collect();
        out.table(&rows, "")?;
    }
    Ok(if stats.damaged.is_empty() {
        Status::Fine
    } else {
        Status::Damaged
    })
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
        out.json(kind, &problem_doc(problem, root))?;
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

pub fn problem_doc(problem: &Problem, root: Option<&std::path::Path>) -> ProblemDoc {
    ProblemDoc::of(problem, |path| shown_path(path, root))
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
        let count = |severity: Severity| report.count(severity);
        let summary = VerifySummary {
            runs: report.runs,
            records: report.records,
            files: report.files,
            projections_checked: source.home().is_some(),
            integrity,
            ok: Status::of_report(report) == Status::Fine,
            damaged: count(Severity::Damaged),
            unchecked: count(Severity::Unchecked),
            inconsistent: count(Severity::Inconsistent),
            note: count(Severity::Note),
        };
        out.json("summary", &summary)?;
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
