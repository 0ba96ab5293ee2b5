//! `journal-tools --from URL inspect runs|run|events|stats`: the fleet as shipped into
//! PostgreSQL (`runjournal::ship::fleet`), printed through the same table, run view and log
//! line as a local journal (`runjournal::show`), with host and journal columns; and
//! `inspect verify --against URL`. The library reads, folds and compares; this prints.

use anyhow::Context;
use runjournal::duration::parse_time;
use runjournal::json::{
    CompareSummary, EventsSummary, FleetEventDoc, FleetRunDoc, FleetSummary, RecordDoc, RunSummary,
};
use runjournal::ship::fleet::{self, EventFilter, Fleet, FleetRun, RunFilter, ShippedRecord};
use runjournal::ship::rows;
use runjournal::ship::{ShipError, Target, journal_id_text};
use runjournal::show::{self, Cell, LogEntry, Origin, RunRow, RunView, Tone, plural};
use runjournal::source::JournalSource;
use runjournal::stats::FleetStats;
use serde_json::Value;

use crate::inspect::print_problem;
use crate::output::{Out, note};
use crate::{EventsArgs, RunsArgs, Status, UsageError, view};

/// Records read from the server per page by `inspect events --from`.
const FLEET_EVENTS_PAGE: usize = 1000;

/// How many differences `verify --against` lists one by one (the summary counts them all).
const LISTED_DIFFERENCES_MAX: usize = 200;

/// The variable naming the fleet's URL when `--from` is not given (so that a URL, and a
/// password in it, need not be on the command line).
pub const FROM_ENV: &str = "JOURNAL_TOOLS_FROM";

/// The fleet's options, from the command line.
pub struct FleetArgs {
    pub url: String,
    /// Whether the URL was given on the command line (rather than in [`FROM_ENV`]).
    pub is_on_command_line: bool,
    /// A host whose heartbeat is older than this is silent.
    pub silent_after_ms: u64,
}

/// A usage error (exit 2) for what the caller got wrong, else the error itself.
fn fleet_error(error: ShipError) -> anyhow::Error {
    if error.is_usage() {
        UsageError(error.to_string()).into()
    } else {
        error.into()
    }
}

fn connect(args: &FleetArgs) -> anyhow::Result<Fleet> {
    connect_to(&args.url, args.is_on_command_line, "--from")
}

/// Connects to `url`, warning first when the URL holds a password on the command line (which
/// every user of the machine can read) and when the password file was ignored.
fn connect_to(url: &str, is_on_command_line: bool, option: &str) -> anyhow::Result<Fleet> {
    let target = Target::parse(url).map_err(|error| UsageError(error.to_string()))?;
    for warning in target.warnings() {
        note(warning);
    }
    if is_on_command_line && target.is_password_in_url() {
        note(&format!(
            "warning: the {option} URL holds a password, which every user of this machine can read on the command line; leave it out and set PGPASSWORD or a ~/.pgpass file (0600){}",
            if option == "--from" {
                format!(", or give the URL in {FROM_ENV}")
            } else {
                String::new()
            }
        ));
    }
    Fleet::connect(&target).map_err(fleet_error)
}

fn origin_of(run: &FleetRun) -> Origin {
    Origin {
        host_name: run.host_name.clone(),
        journal_id: run.journal_id.clone(),
    }
}

pub fn runs(args: &FleetArgs, out: &mut Out, runs_args: &RunsArgs) -> anyhow::Result<Status> {
    let now_ms = runjournal::event::now_ms();
    let parse = |text: &Option<String>| {
        text.as_deref()
            .map(|text| parse_time(text, now_ms).map_err(|error| UsageError(error.to_string())))
            .transpose()
    };
    let filter = RunFilter {
        states: runs_args.state.clone(),
        created_since_ms: parse(&runs_args.since)?,
        created_until_ms: parse(&runs_args.until)?,
        limit: runs_args.limit,
    };
    let mut fleet = connect(args)?;
    let server_now = fleet.server_now_ms()?;
    let runs = fleet.runs(&filter)?;
    let journals = fleet.journals()?.len();
    if out.is_json {
        for run in &runs {
            let silent = run.host_silent_since(server_now, args.silent_after_ms);
            out.json("run", &FleetRunDoc::of(run, silent))?;
        }
        out.json(
            "summary",
            &FleetSummary {
                server: None,
                journals,
                silent_journals: None,
                runs: runs.len() as u64,
                records: None,
            },
        )?;
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
    let rows: Vec<RunRow> = runs
        .iter()
        .map(|run| RunRow::of_shipped(run, run.host_silent_since(server_now, args.silent_after_ms)))
        .collect();
    out.table(&show::runs_table(&rows), "")?;
    Ok(Status::Fine)
}

pub fn run(args: &FleetArgs, out: &mut Out, text: &str) -> anyhow::Result<Status> {
    let mut fleet = connect(args)?;
    let server_now = fleet.server_now_ms()?;
    let found = fleet.find_run(text).map_err(fleet_error)?;
    let silent = found.host_silent_since(server_now, args.silent_after_ms);
    let (state, records) = fleet.run_state(&found)?;
    if out.is_json {
        let mut document = FleetRunDoc::of(&found, silent);
        document.head_seq = state.head_seq;
        document.state = state.status.as_str();
        out.json("run", &document)?;
        for record in &records {
            out.json("record", &RecordDoc::of(None, record))?;
        }
        out.json(
            "summary",
            &RunSummary {
                run_id: found.run_id.to_string(),
                host: Some(found.host_name.clone()),
                journal_id: Some(found.journal_id.clone()),
                records: records.len(),
                head_seq: state.head_seq,
            },
        )?;
        return Ok(Status::Fine);
    }
    let paint = |text: &str, tone: Tone| out.paint(text, tone);
    let lines = RunView::of_shipped(&state, &origin_of(&found), silent).lines(&paint);
    for line in lines {
        out.line(&line)?;
    }
    out.line("")?;
    out.line("timeline")?;
    out.table(&show::timeline_rows(&records), "  ")?;
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
    let mut fleet = connect(args)?;
    let run = match &events_args.run {
        Some(text) => {
            let found = fleet.find_run(text).map_err(fleet_error)?;
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
        out.json(
            "summary",
            &EventsSummary {
                events: shown,
                cursor: None,
            },
        )?;
    }
    Ok(Status::Fine)
}

fn print_event(out: &mut Out, shipped: &ShippedRecord) -> anyhow::Result<()> {
    let row = &shipped.row;
    let decoded = rows::record_from_event_line(&row.event);
    if out.is_json {
        let fields = match &decoded {
            Ok(record) => Value::Object(show::event_fields(&record.event)),
            Err(_) => row.event.clone(),
        };
        out.json(
            "event",
            &FleetEventDoc {
                host: shipped.host_name.clone(),
                journal_id: shipped.journal_id.clone(),
                global_seq: row.global_seq,
                run_id: row.run_id.clone(),
                seq: row.seq,
                time_ms: row.time_ms,
                event: row.event_type.clone(),
                fields,
            },
        )?;
        return Ok(());
    }
    let origin = Origin {
        host_name: shipped.host_name.clone(),
        journal_id: shipped.journal_id.clone(),
    };
    let global_seq = u64::try_from(row.global_seq).unwrap_or_default();
    let line = match &decoded {
        Ok(record) => LogEntry::of(Some(&origin), global_seq, record).line(),
        // A row someone wrote behind the shipper's back: listed, with why it shows no fields.
        Err(reason) => LogEntry {
            origin: Some(&origin),
            global_seq,
            time_ms: u64::try_from(row.time_ms).unwrap_or_default(),
            run: row.run_id.clone(),
            seq: u64::try_from(row.seq).unwrap_or_default(),
            event: &row.event_type,
            fields: format!("(does not decode: {reason})"),
        }
        .line(),
    };
    out.line(&line)?;
    Ok(())
}

pub fn stats(args: &FleetArgs, out: &mut Out) -> anyhow::Result<Status> {
    let mut fleet = connect(args)?;
    let stats = FleetStats::gather(&mut fleet, args.silent_after_ms)?;
    if out.is_json {
        for journal in &stats.journals {
            out.json("journal", journal)?;
        }
        out.json("summary", &stats.summary)?;
        return Ok(Status::Fine);
    }
    let summary: Vec<Vec<Cell>> = stats
        .lines()
        .into_iter()
        .map(|(label, value)| vec![Cell::plain(label), Cell::plain(value)])
        .collect();
    out.table(&summary, "")?;
    if stats.journals.is_empty() {
        return Ok(Status::Fine);
    }
    out.line("")?;
    out.table(&stats.journal_rows(), "")?;
    Ok(Status::Fine)
}

/// `inspect verify --against URL`: the local journal compared with what the server holds of
/// it. Exit 1 when they differ.
pub fn verify_against(source: &JournalSource, out: &mut Out, url: &str) -> anyhow::Result<Status> {
    // Refused as a usage error before the journal is opened.
    Target::parse(url).map_err(|error| UsageError(error.to_string()))?;
    let view = view(source)?;
    let meta = view.meta()?;
    let journal_id = journal_id_text(&meta.journal_id);
    let mut fleet = connect_to(url, true, "--against")?;
    let shown = fleet.target().to_string();
    let comparison = fleet::compare(&view, &mut fleet, &journal_id)
        .with_context(|| format!("comparing journal {journal_id} with {shown}"))?;
    drop(view);
    let problems = comparison.problems(&journal_id);
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
            &CompareSummary {
                journal_id: journal_id.clone(),
                server: shown.clone(),
                registered: comparison.is_registered,
                shipped_through: comparison.shipped_through,
                local_head: comparison.local_head,
                records_compared: comparison.records_compared,
                not_yet_shipped: comparison.not_yet_shipped,
                missing: comparison.missing.len(),
                extra: comparison.extra.len(),
                different: comparison.different.len(),
                ok: status == Status::Fine,
            },
        )?;
    } else {
        let found = show::counted(
            [
                (comparison.missing.len(), "missing"),
                (comparison.extra.len(), "extra"),
                (comparison.different.len(), "different"),
            ],
            "no differences",
        );
        out.line(&format!(
            "compared {} of journal {journal_id} with {} (shipped through {}, journal head {}, {} not shipped yet): {found}",
            plural(comparison.records_compared, "record"),
            shown,
            comparison.shipped_through,
            comparison.local_head,
            comparison.not_yet_shipped,
        ))?;
    }
    Ok(status)
}
