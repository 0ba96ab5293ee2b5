//! `runjournal reconcile`, and the reconcile pass every reading command makes first.

use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;

use runjournal::launch::queue;
use runjournal::reconcile::{self, Action, Outcome, Report};
use runjournal::retention::{self, PassOptions, PassReport};
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

/// The retention pass that follows a reconcile pass: the home's policy, bounded work.
pub fn prune_pass(store: &Store) -> Result<PassReport, retention::PassError> {
    retention::pass(store, &PassOptions::reconcile())
}

/// The reconcile pass before `status`, `list` and `wait` read, and its retention pass. Routine
/// bookkeeping (recording that the runner of an ended run is gone, rebuilding a projection,
/// pruning by the policy) says nothing; a repair of a stale run is reported in one line
/// ([`report_reconciled`]), and so is a result pruned before its host consumed it. A failure
/// of either does not stop the reading.
pub fn before_reading(store: &Store) {
    report_reconciled(&pass(store));
    if let Err(error) = admit_pass(store) {
        note(&format!("starting queued runs: {error:#}"));
    }
    match prune_pass(store) {
        Ok(report) => {
            for line in unconsumed_lines(&report) {
                note(&line);
            }
        }
        Err(error) => note(&format!("pruning: {error}")),
    }
}

/// The admissions that follow a reconcile pass: every queue's free slots go to its first
/// waiting runs, whose runners are started (the runner program is this one).
pub fn admit_pass(store: &Store) -> anyhow::Result<Vec<queue::Admitted>> {
    let program = crate::launch::runner_base()?;
    Ok(queue::start_admissible(
        store,
        &program,
        &format!("reconciler (pid {})", std::process::id()),
        None,
    )?)
}

/// One line per run a pass admitted.
fn admitted_line(admitted: &queue::Admitted) -> String {
    match &admitted.runner {
        Ok(pid) => format!(
            "{}  admitted by queue {}  runner pid {pid}",
            admitted.run, admitted.queue
        ),
        Err(error) => format!(
            "{}  admitted by queue {}  its runner did not start: {}",
            admitted.run,
            admitted.queue,
            runjournal::show::escape_control(error)
        ),
    }
}

/// One line per run a pass pruned.
pub fn pruned_line(chosen: &retention::Chosen) -> String {
    let mut line = format!(
        "{}  pruned  {} ({}), ended {}",
        chosen.run,
        chosen.why.as_str(),
        runjournal::show::format_bytes(chosen.bytes),
        runjournal::show::time_or_dash(Some(chosen.ended_at_ms)),
    );
    if chosen.unconsumed_result {
        line.push_str("  its result had not been consumed");
    }
    line
}

/// The lines that say a pass took results their hosts had not consumed.
fn unconsumed_lines(report: &PassReport) -> impl Iterator<Item = String> + '_ {
    report
        .chosen
        .iter()
        .filter(|chosen| chosen.unconsumed_result)
        .map(pruned_line)
}

/// Most run ids the summary of repairs names.
const SUMMARY_RUNS: usize = 3;

/// Whether an outcome is a repair worth telling a reader: a run that was not terminal, and
/// the pass recorded it failed (its runner was gone, or never started). Recording that an
/// ended run's runner is gone closes the run as its runner's parent would have: routine.
fn is_repair(outcome: &Outcome) -> bool {
    !outcome.appended.is_empty()
        && matches!(
            outcome.action,
            Action::FailRunnerDied
                | Action::FailHostRestarted
                | Action::FailAfterObservedExit
                | Action::FailNeverStarted
        )
}

/// The one line that tells a reader what a pass repaired; `None` when it repaired nothing.
fn repairs_summary(report: &Report) -> Option<String> {
    let repaired: Vec<String> = report
        .outcomes
        .iter()
        .filter(|outcome| is_repair(outcome))
        .map(|outcome| outcome.run.to_string())
        .collect();
    let count = repaired.len();
    if count == 0 {
        return None;
    }
    let mut named = repaired
        .iter()
        .take(SUMMARY_RUNS)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if count > SUMMARY_RUNS {
        named.push_str(&format!(" and {} more", count - SUMMARY_RUNS));
    }
    let runs = if count == 1 { "run" } else { "runs" };
    Some(format!(
        "repaired {count} stale {runs} whose runner was gone, recorded failed: {named}; \
         `runjournal reconcile` repairs and reports run by run"
    ))
}

/// Says on stderr, in one line, what a pass the command made (or the library made for it)
/// repaired, or why it failed; routine bookkeeping says nothing.
pub fn report_reconciled<E: std::fmt::Display>(pass: &Result<Report, E>) {
    match pass {
        Ok(report) => {
            if let Some(line) = repairs_summary(report) {
                note(&line);
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
    match admit_pass(&store) {
        Ok(admitted) => {
            for admitted in &admitted {
                let line = if json {
                    serde_json::to_string(&queue::AdmittedReport::of(admitted))
                        .context("writing JSON")?
                } else {
                    admitted_line(admitted)
                };
                text.push_str(&line);
                text.push('\n');
            }
        }
        Err(error) => {
            errors += 1;
            note(&format!("starting queued runs: {error:#}"));
        }
    }
    let pruning = prune_pass(&store);
    let pruned = match &pruning {
        Ok(pruning) => {
            for chosen in &pruning.chosen {
                let line = if json {
                    serde_json::json!({
                        "type": "pruned",
                        "run": chosen.run.to_string(),
                        "why": chosen.why.as_str(),
                        "bytes": chosen.bytes,
                        "endedAt": chosen.ended_at_ms,
                        "unconsumedResult": chosen.unconsumed_result,
                    })
                    .to_string()
                } else {
                    pruned_line(chosen)
                };
                text.push_str(&line);
                text.push('\n');
            }
            errors += pruning.errors.len();
            for error in &pruning.errors {
                note(error);
            }
            pruning.chosen.len()
        }
        Err(error) => {
            errors += 1;
            note(&format!("pruning: {error}"));
            0
        }
    };
    let changed = report.changed().count();
    if json {
        let summary = serde_json::json!({
            "type": "summary",
            "active": report.active,
            "changed": changed,
            "pruned": pruned,
            "errors": errors,
        });
        text.push_str(&format!("{summary}\n"));
        print(&text)?;
    } else {
        print(&text)?;
        let _ = writeln!(
            std::io::stderr().lock(),
            "{} active run(s), {changed} changed, {pruned} pruned, {errors} error(s)",
            report.active
        );
    }
    Ok(if errors == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(crate::EXIT_ERROR)
    })
}
