//! `runjournal reconcile`, and the reconcile pass every reading command makes first.

use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;

use runjournal::json::{PrunedDoc, ReconcileLine};
use runjournal::launch::queue;
use runjournal::reconcile::Report;
use runjournal::retention::{self, PassReport};
use runjournal::runs::{self, Maintained};
use runjournal::{Home, Store};

use crate::{CliResult, note, open_store, print};

/// The upkeep before `status`, `list` and `wait` read ([`runs::maintain`]). Routine
/// bookkeeping (recording that the runner of an ended run is gone, rebuilding a projection,
/// pruning by the policy) says nothing; a repair of a stale run is reported in one line
/// ([`report_reconciled`]), and so is a result pruned before its host consumed it. A failure
/// of a pass does not stop the reading.
pub fn before_reading(store: &Store) {
    let runner = match crate::launch::runner_base() {
        Ok(runner) => runner,
        Err(error) => {
            note(&format!("reconciling: {error:#}"));
            return;
        }
    };
    let done = runs::maintain(store, &runner);
    if let Some(held) = done.skipped() {
        skipped(held);
        return;
    }
    report_reconciled(&done.reconciled);
    if let Some(Err(error)) = &done.admitted {
        note(&format!("starting queued runs: {error}"));
    }
    if let Some(Err(error)) = &done.deliverer {
        note(&format!("delivering hooks: {error}"));
    }
    match &done.pruned {
        Some(Ok(report)) => {
            for line in unconsumed_lines(report) {
                note(&line);
            }
        }
        Some(Err(error)) => note(&format!("pruning: {error}")),
        None => {}
    }
}

/// Says, in one line, that the passes before a read were skipped because `held` says who
/// keeps the journal's write lock; the command reads the journal as it stands.
pub fn skipped(held: &runjournal::journal::LockHeld) {
    note(&format!(
        "{held}: reconciling, starting queued runs and pruning skipped; read as the journal stands"
    ));
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

/// The lines that say a pass took results their hosts had not consumed.
fn unconsumed_lines(report: &PassReport) -> impl Iterator<Item = String> + '_ {
    report
        .chosen
        .iter()
        .filter(|chosen| chosen.unconsumed_result)
        .map(retention::pruned_line)
}

/// Says on stderr, in one line, what a pass the command made (or the library made for it)
/// repaired, or why it failed; routine bookkeeping says nothing.
pub fn report_reconciled<E: std::fmt::Display>(pass: &Result<Report, E>) {
    match pass {
        Ok(report) => {
            if let Some(line) = runjournal::show::repairs_line(report) {
                note(&line);
            }
        }
        Err(error) => note(&format!("reconciling: {error}")),
    }
}

/// `runjournal reconcile [--json]`: one [`runs::maintain`], every active run's row printed,
/// then the runs it admitted and pruned.
pub fn command(home: Home, json: bool) -> CliResult {
    let store = open_store(home)?;
    let runner = crate::launch::runner_base()?;
    let Maintained {
        reconciled,
        admitted,
        deliverer,
        pruned: pruning,
    } = runs::maintain(&store, &runner);
    let report = reconciled.context("reconciling")?;
    let mut text = String::new();
    let mut errors = 0usize;
    for outcome in &report.outcomes {
        errors += usize::from(outcome.error.is_some());
        let line = if json {
            serde_json::to_string(&ReconcileLine::of(outcome)).context("rendering a line")?
        } else {
            runjournal::show::outcome_line(outcome)
        };
        text.push_str(&line);
        text.push('\n');
    }
    if let Some(held) = &report.lock_held {
        skipped(held);
    }
    match admitted {
        Some(Ok(admitted)) => {
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
        Some(Err(error)) => {
            errors += 1;
            note(&format!("starting queued runs: {error}"));
        }
        None => {}
    }
    if let Some(Err(error)) = deliverer {
        errors += 1;
        note(&format!("delivering hooks: {error}"));
    }
    let pruned = match &pruning {
        Some(Ok(pruning)) => {
            for chosen in &pruning.chosen {
                let line = if json {
                    serde_json::to_string(&ReconcileLine::Pruned(PrunedDoc::of(chosen)))
                        .context("rendering a line")?
                } else {
                    retention::pruned_line(chosen)
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
        Some(Err(error)) => {
            errors += 1;
            note(&format!("pruning: {error}"));
            0
        }
        None => 0,
    };
    let changed = report.changed().count();
    if json {
        let summary = serde_json::to_string(&ReconcileLine::Summary {
            active: report.active,
            changed,
            pruned,
            errors,
        })
        .context("rendering the summary")?;
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
