//! `runjournal reconcile`, and the reconcile pass every reading command makes first.

use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;

use runjournal::json::{PrunedDoc, ReconcileLine};
use runjournal::launch::queue;
use runjournal::reconcile::{self, Report};
use runjournal::retention::{self, PassOptions, PassReport};
use runjournal::{Home, Store};

use crate::{CliResult, note, open_store, print};

/// One pass with the default options.
pub fn pass(store: &Store) -> Result<Report, reconcile::ReconcileError> {
    reconcile::reconcile(store, &reconcile::Options::default())
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
    let reconciled = pass(store);
    if let Some(held) = reconciled
        .as_ref()
        .ok()
        .and_then(|report| report.lock_held.as_ref())
    {
        skipped(held);
        return;
    }
    report_reconciled(&reconciled);
    if let Err(error) = admit_pass(store) {
        note(&format!("starting queued runs: {error:#}"));
    }
    if let Err(error) = delay_pass(store) {
        note(&format!("starting delayed runs: {error:#}"));
    }
    if let Err(error) = hooks_pass(store) {
        note(&format!("delivering hooks: {error:#}"));
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

/// Says, in one line, that the passes before a read were skipped because `held` says who
/// keeps the journal's write lock; the command reads the journal as it stands.
pub fn skipped(held: &runjournal::journal::LockHeld) {
    note(&format!(
        "{held}: reconciling, starting queued runs and pruning skipped; read as the journal stands"
    ));
}

/// The starts that follow a reconcile pass: every run waiting for its dependencies is judged
/// (those met start, or take their place in their queue; those failed end, and their
/// dependents are judged in turn), then every queue's free slots go to its first waiting runs,
/// whose runners are started (the runner program is this one).
pub fn admit_pass(store: &Store) -> anyhow::Result<Vec<queue::Admitted>> {
    let program = crate::launch::runner_base()?;
    let by = format!("reconciler (pid {})", std::process::id());
    runjournal::launch::after::settle(store, &program, &by, runjournal::launch::after::Scope::All)
        .context("judging the runs that wait for others")?;
    Ok(queue::start_admissible(store, &program, &by, None)?)
}

/// The delayed starts that follow a reconcile pass: the runs due are started (the runner
/// program is this one), and the home's timer too when runs still wait and none runs.
pub fn delay_pass(store: &Store) -> anyhow::Result<Vec<runjournal::launch::delay::DueStarted>> {
    let program = crate::launch::runner_base()?;
    Ok(runjournal::launch::delay::reconcile_delayed(
        store,
        &program,
        &format!("reconciler (pid {})", std::process::id()),
    )?)
}

/// [`delay_pass`], and a line for each run it started (JSON with `json`).
fn delay_lines(store: &Store, json: bool) -> anyhow::Result<String> {
    let mut text = String::new();
    for started in &delay_pass(store)? {
        let report = runjournal::launch::delay::DueStartedReport::of(started);
        let line = if json {
            serde_json::to_string(&report).context("writing JSON")?
        } else {
            report.line()
        };
        text.push_str(&line);
        text.push('\n');
    }
    Ok(text)
}

/// The hook delivery that follows a reconcile pass: a deliverer (this program) is started,
/// detached, when a completion hook is due and nobody alive holds it. The pass never waits
/// on a hook.
pub fn hooks_pass(store: &Store) -> anyhow::Result<Option<u32>> {
    let program = std::env::current_exe().context("finding this program to deliver hooks")?;
    Ok(runjournal::hooks::start_deliverer_if_needed(
        store, &program,
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

/// `runjournal reconcile [--json]`: one pass, every active run's row printed.
pub fn command(home: Home, json: bool) -> CliResult {
    let store = open_store(home)?;
    let report = pass(&store).context("reconciling")?;
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
    match delay_lines(&store, json) {
        Ok(lines) => text.push_str(&lines),
        Err(error) => {
            errors += 1;
            note(&format!("starting delayed runs: {error:#}"));
        }
    }
    if let Err(error) = hooks_pass(&store) {
        errors += 1;
        note(&format!("delivering hooks: {error:#}"));
    }
    let pruning = prune_pass(&store);
    let pruned = match &pruning {
        Ok(pruning) => {
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
        Err(error) => {
            errors += 1;
            note(&format!("pruning: {error}"));
            0
        }
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
