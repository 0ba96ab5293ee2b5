//! `runjournal retention` (the policy, shown or set) and `runjournal prune` (a pruning now).

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;

use runjournal::Home;
use runjournal::journal::KeepFree;
use runjournal::json::{PolicyDoc, PruneDoc};
use runjournal::retention::{self, PassOptions};

use crate::launch::{Setting, duration_setting, off_or};
use crate::{CliResult, EXIT_ERROR, Failure, note, open_store, print, print_line};

fn count_setting(text: &str) -> Result<Setting<u64>, String> {
    off_or(text, |text| {
        text.trim()
            .parse::<u64>()
            .map_err(|_| format!("{text:?} is not a whole number of runs"))
    })
}

fn size_setting(text: &str) -> Result<Setting<u64>, String> {
    off_or(text, |text| {
        retention::parse_size(text).map_err(|error| error.to_string())
    })
}

fn keep_free_setting(text: &str) -> Result<Setting<KeepFree>, String> {
    off_or(text, |text| {
        retention::parse_keep_free(text).map_err(|error| error.to_string())
    })
}

const RETENTION_HELP: &str = "\
Defaults (a home that never set a policy): ended runs are kept 30 days; the home's file system
is kept 10% free; no run-count or size bound. `off` turns a bound off.

Never pruned: a run whose runner has not been seen to end; a run whose records the shipper has
not shipped (when the home ships); a result the host has not consumed, until the age bound
passes. The oldest ended runs go first. Each reconcile pass (status, list, wait, reconcile)
prunes at most 64 runs; `runjournal prune` prunes everything due now.";

/// `runjournal retention`.
#[derive(clap::Args)]
#[command(after_help = RETENTION_HELP)]
pub struct RetentionArgs {
    /// Prune ended runs this long after they ended (30d, 12h), or off.
    #[arg(long, value_name = "DURATION|off", value_parser = duration_setting)]
    keep_for: Option<Setting<Duration>>,
    /// Keep at most this many ended runs (the oldest beyond go), or off.
    #[arg(long, value_name = "N|off", value_parser = count_setting)]
    keep_runs: Option<Setting<u64>>,
    /// Keep the home (journal, run directories, results) under this size (500M, 2G), or off.
    #[arg(long, value_name = "SIZE|off", value_parser = size_setting)]
    max_size: Option<Setting<u64>>,
    /// Keep this much of the home's file system free (10%, 5G), or off.
    #[arg(long, value_name = "PERCENT|SIZE|off", value_parser = keep_free_setting)]
    keep_free: Option<Setting<KeepFree>>,
    /// Print the policy as JSON.
    #[arg(long)]
    json: bool,
}

fn duration_ms(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// `runjournal retention [--keep-for D] [--keep-runs N] [--max-size S] [--keep-free P|S]`.
pub fn retention(home: Home, args: RetentionArgs) -> CliResult {
    let store = open_store(home)
        .map_err(|failure| crate::needs_journal(failure, "the retention policy"))?;
    let set = store
        .journal()
        .view()
        .and_then(|view| view.retention_set())
        .context("reading the retention policy")?;
    let mut policy = set.unwrap_or_default();
    let is_change = args.keep_for.is_some()
        || args.keep_runs.is_some()
        || args.max_size.is_some()
        || args.keep_free.is_some();
    if is_change {
        if let Some(keep_for) = args.keep_for {
            policy.keep_for_ms = keep_for.value().map(duration_ms);
        }
        if let Some(keep_runs) = args.keep_runs {
            policy.keep_runs = keep_runs.value();
        }
        if let Some(max_size) = args.max_size {
            policy.max_size_bytes = max_size.value();
        }
        if let Some(keep_free) = args.keep_free {
            policy.keep_free = keep_free.value();
        }
        store
            .journal()
            .set_retention(&policy)
            .context("writing the retention policy")?;
    }
    let is_default = set.is_none() && !is_change;
    if args.json {
        let text = serde_json::to_string_pretty(&PolicyDoc::of(&policy, is_default))
            .context("rendering the policy")?;
        return print_line(&text).map(|()| ExitCode::SUCCESS);
    }
    let mut text = String::new();
    for (bound, value) in retention::policy_lines(&policy) {
        text.push_str(&format!("{bound:<10} {value}\n"));
    }
    if is_default {
        text.push_str("(the defaults: this home never set a policy)\n");
    }
    print(&text)?;
    Ok(ExitCode::SUCCESS)
}

/// `runjournal prune`.
#[derive(clap::Args)]
pub struct PruneArgs {
    /// Prune ended runs older than this (since they ended), instead of the policy's age bound.
    #[arg(long, value_name = "DURATION", value_parser = crate::launch::duration_arg)]
    older_than: Option<Duration>,
    /// Keep at most this many ended runs, instead of the policy's count bound.
    #[arg(long, value_name = "N")]
    keep_runs: Option<u64>,
    /// List what would be pruned, and the bytes it would free; prune nothing.
    #[arg(long)]
    dry_run: bool,
    /// Print a JSON document.
    #[arg(long)]
    json: bool,
}

/// `runjournal prune [--older-than D] [--keep-runs N] [--dry-run] [--json]`.
pub fn prune(home: Home, args: PruneArgs) -> CliResult {
    let store = open_store(home)?;
    // The reconcile pass alone: its own retention pass would prune before a dry run looked.
    crate::report_reconciled(&runjournal::reconcile::reconcile(
        &store,
        &runjournal::reconcile::Options::default(),
    ));
    let mut policy = store
        .journal()
        .view()
        .and_then(|view| view.retention())
        .context("reading the retention policy")?;
    if let Some(older_than) = args.older_than {
        policy.keep_for_ms = Some(duration_ms(older_than));
    }
    if let Some(keep_runs) = args.keep_runs {
        policy.keep_runs = Some(keep_runs);
    }
    let options = PassOptions {
        limit: retention::PRUNE_COMMAND_LIMIT,
        dry_run: args.dry_run,
        policy: Some(policy),
    };
    let report = retention::prune_all(&store, &options, |so_far| {
        note(&format!("pruned {so_far} runs so far"));
    })
    .map_err(|error| Failure::Error(anyhow::Error::new(error)))?;
    if let Some(line) = report.clock_line() {
        note(&line);
    }
    let document = PruneDoc::of(&report, args.dry_run);
    if args.json {
        let text = serde_json::to_string_pretty(&document).context("rendering the report")?;
        print_line(&text)?;
    } else {
        print(&document.to_string())?;
        note(&document.summary());
    }
    for error in &report.errors {
        note(error);
    }
    Ok(if report.errors.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_ERROR)
    })
}
