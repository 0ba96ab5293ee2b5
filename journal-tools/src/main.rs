//! `journal-tools`: look inside a runjournal journal and rebuild its projections. It opens the
//! journal read-only, so it works while runs are live; `recover --from-projections` rebuilds a
//! lost journal (through the library, which does the writing).
//!
//! Exit codes: 0 fine; 1 a problem found (`inspect verify`, `replay --check`) or a home that is
//! not safe to use (another user owns it or may write it); 2 a usage or other error; 4 a
//! journal that is damaged or of an unknown format. When several apply, the
//! most serious wins (4, then 2, then 1). A closed stdout (`| head`) exits 0 quietly.

#[cfg(feature = "ship")]
mod fleet;
// A build without the fleet: the same options, each refused as a usage error.
#[cfg(not(feature = "ship"))]
#[path = "no_fleet.rs"]
mod fleet;
mod inspect;
mod output;
mod recover;
mod replay;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use runjournal::RunId;
use runjournal::home::Layout;
use runjournal::journal::{OpenError, View};
use runjournal::source::{JournalSource, SourceError};
use runjournal::state::RunStatus;
use runjournal::verify::{Report, Severity};

/// Look inside a runjournal journal and rebuild its projections.
///
/// The journal is opened read-only, so every command works while runs are live. Data goes to
/// stdout, messages to stderr. Times are shown in UTC.
///
/// Exit codes: 0 fine, 1 a problem found (inspect verify, replay --check) or a home that is not
/// safe to use (another user owns it or may write it), 2 a usage or other error, 4 a journal
/// that is damaged or of an unknown format.
#[derive(Parser)]
#[command(version, about, long_about)]
struct Cli {
    /// State directory [default: $RUNJOURNAL_HOME, else $XDG_STATE_HOME/runjournal, else
    /// ~/.local/state/runjournal; with --layout pi-subagents: $RUNJOURNAL_HOME, else
    /// $PI_SUBAGENTS_TEMP_ROOT, else pi-subagents' own temp root].
    #[arg(long, global = true, value_name = "DIR")]
    home: Option<PathBuf>,
    /// How the home (and a --out directory) is laid out: runjournal's own, or pi-subagents.
    #[arg(long, global = true, value_name = "LAYOUT", env = "RUNJOURNAL_LAYOUT",
          value_parser = parse_layout, default_value = "runjournal")]
    layout: Layout,
    /// Read this journal file (a copy, say) instead of the home's. Projections are then
    /// checked or rebuilt only with --home or --out.
    #[arg(long, global = true, value_name = "FILE")]
    journal: Option<PathBuf>,
    /// Print JSON Lines: one object per line, each with a "type", ending with a summary.
    #[arg(long, global = true)]
    json: bool,
    /// Read the fleet shipped into this PostgreSQL database (`runjournal ship`) instead of a
    /// local journal: inspect runs, run, events and stats across every shipped journal
    /// [default: $JOURNAL_TOOLS_FROM]. The password is best left out of the URL: it is found
    /// as libpq finds it ($PGPASSWORD, $PGPASSFILE or ~/.pgpass).
    #[arg(long, global = true, value_name = "URL")]
    from: Option<String>,
    /// With --from: a host whose last heartbeat is older than this is shown silent (500ms,
    /// 30s, 5m, 1h30m).
    #[arg(long, global = true, value_name = "DURATION", default_value = "2m",
          value_parser = parse_duration_ms)]
    silent_after: u64,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// See what the journal holds.
    #[command(subcommand)]
    Inspect(InspectCommand),
    /// Rebuild status.json, events.jsonl, result files and index markers from the journal.
    Replay(ReplayArgs),
    /// Rebuild a lost journal (missing, empty, zero-filled, truncated or damaged) from the
    /// runs' events.jsonl. The lost file is moved aside, never deleted; runs that were not
    /// closed are left to the reconciler. Run it when nothing else uses the home.
    Recover(RecoverArgs),
    /// Shrink the journal file to what it holds: redb reuses the pages pruned runs free, but
    /// gives none back by itself. Refused while any other process has the journal open.
    Compact,
}

#[derive(Args)]
pub struct RecoverArgs {
    /// Rebuild from the runs' events.jsonl (the only source there is; required, so the
    /// command says what it does).
    #[arg(long, required = true)]
    from_projections: bool,
}

#[derive(Subcommand)]
enum InspectCommand {
    /// One row per run, newest first.
    Runs(RunsArgs),
    /// One run: its state folded from its records, and its timeline.
    Run {
        /// Run id, a unique prefix of one (8 characters or more), its name or tool-call id.
        run: String,
    },
    /// The global log in commit order; each line shows its global seq, a resumable cursor.
    Events(EventsArgs),
    /// Counts, sizes, format, and the journal's space reserve.
    Stats,
    /// Check everything: records, snapshots, indexes, projections, redb's integrity.
    Verify {
        /// Instead, compare the journal with what this PostgreSQL database holds of it
        /// (missing, extra or different records).
        #[arg(long, value_name = "URL")]
        against: Option<String>,
    },
}

#[derive(Args)]
struct RunsArgs {
    /// Only runs in these states (queued, running, complete, failed, stopped, paused).
    #[arg(long, value_name = "S", value_delimiter = ',', value_parser = parse_status)]
    state: Vec<RunStatus>,
    /// Only runs created at or after TIME: 2025-01-31T12:00:00Z, 2025-01-31 12:00 (UTC), or
    /// a time before now: 30s, 2h, 1d.
    #[arg(long, value_name = "TIME")]
    since: Option<String>,
    /// Only runs created at or before TIME (same forms as --since).
    #[arg(long, value_name = "TIME")]
    until: Option<String>,
    /// At most N runs (the newest).
    #[arg(long, value_name = "N")]
    limit: Option<usize>,
}

#[derive(Args)]
struct EventsArgs {
    /// Only this run's records.
    #[arg(long, value_name = "RUN")]
    run: Option<String>,
    /// Start after this global seq (the cursor a previous listing ended at).
    #[arg(long, value_name = "N", default_value_t = 0)]
    after_seq: u64,
    /// Stop after N records (with --follow too).
    #[arg(long, value_name = "N")]
    limit: Option<usize>,
    /// Keep waiting for new commits and print them as they come.
    #[arg(long)]
    follow: bool,
}

#[derive(Args)]
struct ReplayArgs {
    /// Replay this run (id, unique prefix, name or tool-call id).
    #[arg(long, value_name = "RUN", conflicts_with = "all")]
    run: Option<String>,
    /// Replay every run.
    #[arg(long)]
    all: bool,
    /// Render the run as it stood at this seq of its own (needs --run and --out).
    #[arg(long, value_name = "N", requires = "run", requires = "out")]
    until_seq: Option<u64>,
    /// Write into this directory (laid out as a home) instead of in place.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Change nothing; report the files that differ from a fresh projection.
    #[arg(long)]
    check: bool,
    /// In place, also re-create result files (and their index entries) that are absent. They
    /// are left absent by default: hosts delete them once they have delivered the result.
    #[arg(long)]
    restore_results: bool,
}

fn parse_status(text: &str) -> Result<RunStatus, String> {
    text.parse()
}

fn parse_duration_ms(text: &str) -> Result<u64, String> {
    runjournal::duration::parse_duration(text)
        .map(|duration| u64::try_from(duration.as_millis()).unwrap_or(u64::MAX))
        .map_err(|error| error.to_string())
}

/// A mistake in how the tool was called (exit 2, one line).
#[derive(Debug)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// How a command that ran to its end came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Status {
    Fine,
    /// A problem found (verify, check): exit 1.
    Problems,
    /// A check could not run: exit 2.
    Unchecked,
    /// The journal is damaged: exit 4.
    Damaged,
}

impl Status {
    /// The status a set of findings calls for; notes alone are fine.
    pub fn of_severity(severity: Option<Severity>) -> Status {
        match severity {
            None | Some(Severity::Note) => Status::Fine,
            Some(Severity::Inconsistent) => Status::Problems,
            Some(Severity::Unchecked) => Status::Unchecked,
            Some(Severity::Damaged) => Status::Damaged,
        }
    }

    pub fn of_report(report: &Report) -> Status {
        Status::of_severity(report.worst())
    }

    fn exit_code(self) -> ExitCode {
        ExitCode::from(match self {
            Status::Fine => 0,
            Status::Problems => 1,
            Status::Unchecked => 2,
            Status::Damaged => 4,
        })
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut out = output::Out::new(cli.json);
    let result = run(cli, &mut out).and_then(|status| {
        out.flush()?;
        Ok(status)
    });
    match result {
        Ok(status) => status.exit_code(),
        Err(error) if is_broken_pipe(&error) => ExitCode::SUCCESS,
        Err(error) => {
            // Whatever was printed before the error still goes out.
            if let Err(flush_error) = out.flush()
                && flush_error.kind() != std::io::ErrorKind::BrokenPipe
            {
                output::note(&format!("writing stdout: {flush_error}"));
            }
            output::note(&format!("{error:#}"));
            if is_damage(&error) {
                ExitCode::from(4)
            } else if is_unsafe_home(&error) || is_bad_fleet_data(&error) {
                ExitCode::from(1)
            } else {
                ExitCode::from(2)
            }
        }
    }
}

fn run(cli: Cli, out: &mut output::Out) -> anyhow::Result<Status> {
    let from = match cli.from {
        Some(url) => Some((url, true)),
        None => std::env::var(fleet::FROM_ENV)
            .ok()
            .filter(|url| !url.is_empty())
            .map(|url| (url, false)),
    };
    if let Some((url, is_on_command_line)) = from {
        return run_fleet(
            &fleet::FleetArgs {
                url,
                is_on_command_line,
                silent_after_ms: cli.silent_after,
            },
            cli.command,
            out,
        );
    }
    // Recovery works on a home whose journal cannot be opened: it opens no source.
    if let Command::Recover(args) = &cli.command {
        if cli.journal.is_some() {
            return Err(UsageError(
                "recover rebuilds a home's journal: give --home DIR (or RUNJOURNAL_HOME), not --journal".to_string(),
            )
            .into());
        }
        return recover::recover(cli.home.as_deref(), cli.layout, out, args);
    }
    // Compaction needs the journal alone: it opens no read-only source beside it.
    if let Command::Compact = &cli.command {
        let path = match &cli.journal {
            Some(path) => path.clone(),
            None => runjournal::Home::resolve(cli.home.as_deref(), cli.layout)
                .map_err(|error| UsageError(error.to_string()))?
                .journal_path(),
        };
        return compact(&path, out);
    }
    let source = JournalSource::open(cli.home.as_deref(), cli.journal.as_deref(), cli.layout)
        .map_err(source_error)?;
    if source.was_recovered() {
        output::note(&format!(
            "{} was not shut down cleanly (its writer crashed, or it was copied while open); reading a recovered private copy, the file itself is left as it is",
            source.journal_path().display()
        ));
    }
    match cli.command {
        Command::Inspect(InspectCommand::Runs(args)) => inspect::runs(&source, out, &args),
        Command::Inspect(InspectCommand::Run { run }) => inspect::run(&source, out, &run),
        Command::Inspect(InspectCommand::Events(args)) => inspect::events(&source, out, &args),
        Command::Inspect(InspectCommand::Stats) => inspect::stats(&source, out),
        Command::Inspect(InspectCommand::Verify { against: None }) => inspect::verify(&source, out),
        Command::Inspect(InspectCommand::Verify { against: Some(url) }) => {
            fleet::verify_against(&source, out, &url)
        }
        Command::Replay(args) => replay::replay(&source, out, &args),
        Command::Recover(_) => unreachable!("recover returned above"),
        Command::Compact => unreachable!("compact returned above"),
    }
}

/// The commands that read the fleet (`--from URL`).
fn run_fleet(
    args: &fleet::FleetArgs,
    command: Command,
    out: &mut output::Out,
) -> anyhow::Result<Status> {
    match command {
        Command::Inspect(InspectCommand::Runs(runs)) => fleet::runs(args, out, &runs),
        Command::Inspect(InspectCommand::Run { run }) => fleet::run(args, out, &run),
        Command::Inspect(InspectCommand::Events(events)) => fleet::events(args, out, &events),
        Command::Inspect(InspectCommand::Stats) => fleet::stats(args, out),
        Command::Inspect(InspectCommand::Verify { .. }) => Err(UsageError(
            "verify checks a local journal; compare it with the fleet with inspect verify --against URL".to_string(),
        )
        .into()),
        Command::Replay(_) => Err(UsageError(
            "replay rebuilds a local home's files; it does not read the fleet (--from)".to_string(),
        )
        .into()),
        Command::Recover(_) => Err(UsageError(
            "recover rebuilds a local home's journal; it does not read the fleet (--from)"
                .to_string(),
        )
        .into()),
        Command::Compact => Err(UsageError(
            "compact shrinks a local journal file; it does not read the fleet (--from)".to_string(),
        )
        .into()),
    }
}

/// `--layout`'s values.
fn parse_layout(text: &str) -> Result<Layout, String> {
    text.parse()
        .map_err(|error: runjournal::home::UnknownLayout| error.to_string())
}

/// The library's error, with its `OpenError` where [`is_damage`] looks for it.
fn source_error(error: SourceError) -> anyhow::Error {
    match error {
        SourceError::Open(error) => error.into(),
        SourceError::Recover { journal, source } => anyhow::Error::new(*source)
            .context(format!("recovering a copy of {}", journal.display())),
        other => other.into(),
    }
}

/// A fresh read view of the source.
pub fn view(source: &JournalSource) -> anyhow::Result<View> {
    source.view().context("reading the journal")
}

fn is_broken_pipe(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|error| error.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// Whether an error means the journal is damaged, lost or of an unknown format (exit 4): the
/// library's one rule ([`runjournal::journal::is_damage`]), which `runjournal` follows too.
fn is_damage(error: &anyhow::Error) -> bool {
    error.chain().any(runjournal::journal::is_damage)
}

/// Whether an error is a home (or journal) refused as unsafe: exit 1, as `runjournal` does.
/// Whether the fleet's tables hold what no shipper wrote (a NULL, a column of another type, a
/// value out of range): exit 1, as for a journal that differs, not 2 (usage or server error).
#[cfg(feature = "ship")]
fn is_bad_fleet_data(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        matches!(
            cause.downcast_ref::<runjournal::ship::ShipError>(),
            Some(runjournal::ship::ShipError::BadData { .. })
        )
    })
}

#[cfg(not(feature = "ship"))]
fn is_bad_fleet_data(_: &anyhow::Error) -> bool {
    false
}

fn is_unsafe_home(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        matches!(
            cause.downcast_ref::<OpenError>(),
            Some(OpenError::Unsafe(_))
        )
    })
}

/// The run `text` names: an id, a unique prefix of one, its name or tool-call id.
/// `journal-tools compact`.
fn compact(path: &std::path::Path, out: &mut output::Out) -> anyhow::Result<Status> {
    use runjournal::journal::compact::{self, CompactError};
    let compacted = match compact::compact(path) {
        Ok(compacted) => compacted,
        Err(error @ CompactError::InUse { .. }) => return Err(UsageError(error.to_string()).into()),
        Err(error) => return Err(error.into()),
    };
    if out.is_json {
        out.json(
            "compacted",
            &runjournal::json::CompactedDoc {
                journal: path.display().to_string(),
                bytes_before: compacted.bytes_before,
                bytes_after: compacted.bytes_after,
            },
        )?;
    } else {
        output::note(&format!(
            "{}: {} bytes before, {} after",
            path.display(),
            compacted.bytes_before,
            compacted.bytes_after
        ));
    }
    Ok(Status::Fine)
}

pub fn resolve_run(view: &View, text: &str) -> anyhow::Result<RunId> {
    use runjournal::journal::ResolveError;
    runjournal::resolve::resolve_run(view, text).map_err(|error| match error {
        ResolveError::Read(error) => error.into(),
        other => UsageError(other.to_string()).into(),
    })
}
