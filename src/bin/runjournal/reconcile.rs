//! `runjournal reconcile`, and the upkeep every reading command makes first.

use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;

use runjournal::runs;
use runjournal::{Home, Store};

use crate::{CliResult, note, open_store, print};

/// The upkeep before `status`, `list` and `wait` read ([`runs::maintain`]), saying on stderr
/// what its report's [`runs::Maintained::notes`] say: a repair of stale runs, a result pruned
/// before its host consumed it, a pass that failed. A failure of a pass does not stop the
/// reading.
pub fn before_reading(store: &Store) {
    match crate::launch::runner_base() {
        Ok(runner) => {
            for line in runs::maintain(store, &runner).notes() {
                note(&line);
            }
        }
        Err(error) => note(&format!("reconciling: {error:#}")),
    }
}

/// `runjournal reconcile [--json]`: one [`runs::maintain`], a line per active run, per run
/// admitted and per run pruned, then the summary (on stderr as text).
pub fn command(home: Home, json: bool) -> CliResult {
    let store = open_store(home)?;
    let runner = crate::launch::runner_base()?;
    let done = runs::maintain(&store, &runner);
    if done.reconciled.is_err() {
        // Kept as the error itself, so that damage met by the pass exits 4 as damage does.
        if let Err(error) = done.reconciled {
            return Err(anyhow::Error::new(error).context("reconciling").into());
        }
    }
    if let Some(held) = done.skipped() {
        note(&runs::skipped_line(held));
    }
    for failure in done.failures() {
        note(&failure);
    }
    let mut lines = done.lines();
    let summary = lines.pop();
    let mut text = String::new();
    for line in &lines {
        if json {
            text.push_str(&serde_json::to_string(line).context("rendering a line")?);
        } else {
            text.push_str(&line.to_string());
        }
        text.push('\n');
    }
    let mut errors = 0;
    if let Some(summary) = &summary {
        if let runjournal::json::ReconcileLine::Summary { errors: count, .. } = summary {
            errors = *count;
        }
        if json {
            text.push_str(&serde_json::to_string(summary).context("rendering the summary")?);
            text.push('\n');
        }
    }
    print(&text)?;
    if let (false, Some(summary)) = (json, &summary) {
        let _ = writeln!(std::io::stderr().lock(), "{summary}");
    }
    Ok(if done.met_damage() {
        note(&runjournal::journal::damage_advice(
            &store.home().journal_path(),
        ));
        ExitCode::from(crate::EXIT_DAMAGED)
    } else if errors == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(crate::EXIT_ERROR)
    })
}
