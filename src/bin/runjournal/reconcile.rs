//! `runjournal reconcile`, and the reconcile pass every reading command makes first.

use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;

use runjournal::reconcile::{self, Action, Outcome, Report};
use runjournal::{Home, Store};

use crate::{CliResult, note, open_store, print};

/// One pass with the default options.
pub fn pass(store: &Store) -> Result<Report, reconcile::ReconcileError> {
    reconcile::reconcile(store, &reconcile::Options::default())
}

fn describe(outcome: &Outcome) -> String {
    let mut line = format!("{}  {}", outcome.run, outcome.row);
    if !outcome.appended.is_empty() {
        line.push_str(&format!("  recorded {}", outcome.appended.join(" + ")));
    } else if outcome.action != Action::Nothing {
        line.push_str("  (someone else acted first)");
    }
    if outcome.reprojected && outcome.appended.is_empty() {
        line.push_str("  projection rebuilt");
    }
    if let Some(reason) = &outcome.reason {
        line.push_str(&format!("  reason: {reason}"));
    }
    if let Some(note) = &outcome.note {
        line.push_str(&format!("  note: {note}"));
    }
    if let Some(error) = &outcome.error {
        line.push_str(&format!("  error: {error}"));
    }
    // The reason quotes runner.log: the run's own text.
    runjournal::show::escape_control(&line).into_owned()
}

/// The reconcile pass before `status`, `list` and `wait` read. It prints, on stderr, only the
/// runs it closed (a rebuilt projection is routine); a failure to reconcile does not stop the
/// reading.
pub fn before_reading(store: &Store) {
    report_reconciled(&pass(store));
}

/// Says on stderr what a pass the command made (or the library made for it) closed, or why it
/// failed.
pub fn report_reconciled<E: std::fmt::Display>(pass: &Result<Report, E>) {
    match pass {
        Ok(report) => {
            for outcome in report.outcomes.iter().filter(|o| !o.appended.is_empty()) {
                note(&format!("reconciled {}", describe(outcome)));
            }
        }
        Err(error) => note(&format!("reconciling: {error}")),
    }
}

/// `runjournal reconcile [--json]`: one pass, every active run's row printed.
pub fn command(home: Home, json: bool) -> CliResult {
    let store = open_store(home)?;
    let report = pass(&store).context("reconciling")?;
    let mut text = String::new();
    let mut errors = 0usize;
    for outcome in &report.outcomes {
        errors += usize::from(outcome.error.is_some());
        let line = if json {
            serde_json::json!({
                "type": "run",
                "run": outcome.run.to_string(),
                "row": outcome.row,
                "action": format!("{:?}", outcome.action),
                "appended": outcome.appended,
                "reprojected": outcome.reprojected,
                "reason": outcome.reason,
                "note": outcome.note,
                "error": outcome.error,
            })
            .to_string()
        } else {
            describe(outcome)
        };
        text.push_str(&line);
        text.push('\n');
    }
    let changed = report.changed().count();
    if json {
        let summary = serde_json::json!({
            "type": "summary",
            "active": report.active,
            "changed": changed,
            "errors": errors,
        });
        text.push_str(&format!("{summary}\n"));
        print(&text)?;
    } else {
        print(&text)?;
        let _ = writeln!(
            std::io::stderr().lock(),
            "{} active run(s), {changed} changed, {errors} error(s)",
            report.active
        );
    }
    Ok(if errors == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(crate::EXIT_ERROR)
    })
}
