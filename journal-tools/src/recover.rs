//! `journal-tools recover --from-projections`: prints what `runjournal::recover` did — a lost
//! journal rebuilt from the runs' events.jsonl.

use std::path::Path;

use runjournal::home::{Home, Layout};
use runjournal::json::{
    FactNotRecoveredDoc, RecoverSummary, RecoveredQueueDoc, RecoveredRunDoc, RunProblemDoc,
};
use runjournal::recover::{self, LostFact, RecoverError, Recovery};
use runjournal::show::plural;

use crate::output::{Out, shown_path};
use crate::{RecoverArgs, Status, UsageError};

pub fn recover(
    home: Option<&Path>,
    layout: Layout,
    out: &mut Out,
    args: &RecoverArgs,
) -> anyhow::Result<Status> {
    debug_assert!(args.from_projections, "clap requires --from-projections");
    let home = Home::resolve(home, layout)?;
    let recovery = match recover::recover_from_projections(&home) {
        Ok(recovery) => recovery,
        Err(error) if error.is_refusal() => {
            return Err(UsageError(refusal_text(&error)).into());
        }
        // An unsafe home exits 1 naming the fix, as every command's does.
        Err(RecoverError::Unsafe(error)) => return Err(anyhow::Error::new(*error)),
        Err(error) => return Err(error.into()),
    };
    print(&home, out, &recovery)?;
    Ok(
        if recovery.unrecoverable.is_empty() && recovery.results_without_runs.is_empty() {
            Status::Fine
        } else {
            Status::Problems
        },
    )
}

fn refusal_text(error: &RecoverError) -> String {
    format!("{error}; nothing was changed")
}

/// Every fact not recovered: the home's, then each run's.
fn facts(recovery: &Recovery) -> impl Iterator<Item = &LostFact> {
    recovery.home_facts_not_recovered.iter().chain(
        recovery
            .runs
            .iter()
            .flat_map(|run| run.facts_not_recovered.iter()),
    )
}

fn print(home: &Home, out: &mut Out, recovery: &Recovery) -> std::io::Result<()> {
    let root = Some(home.root());
    let active = recovery.runs.iter().filter(|run| !run.is_closed).count() as u64;
    if out.is_json {
        return print_json(out, recovery, active);
    }
    out.line(&format!(
        "journal {} was {}",
        shown_path(&recovery.journal, root),
        recovery.found
    ))?;
    if let Some(aside) = &recovery.moved_aside {
        out.line(&format!("moved it aside to {}", shown_path(aside, root)))?;
    }
    out.line(&format!(
        "rebuilt {} with {} from their events.jsonl; {} left to the reconciler",
        plural(recovery.runs.len() as u64, "run"),
        plural(recovery.records, "record"),
        plural(active, "active run")
    ))?;
    for run in &recovery.unrecoverable {
        out.line(&format!("not rebuilt: run {}: {}", run.run, run.reason))?;
    }
    for run in &recovery.results_without_runs {
        out.line(&format!(
            "not rebuilt: result {} has no run directory (its records are gone)",
            shown_path(&home.result_path(*run), root)
        ))?;
    }
    for queue in &recovery.queues {
        out.line(&format!(
            "queue {}: limit set to {}, {}; set another with `runjournal queue {} --max-active N`",
            queue.name, queue.max_active, queue.basis, queue.name
        ))?;
    }
    for fact in facts(recovery) {
        let whose = match &fact.run {
            Some(run) => format!("run {run}: "),
            None => String::new(),
        };
        out.line(&format!(
            "not recovered: {whose}{}: {}",
            fact.fact, fact.reason
        ))?;
    }
    for (run, error) in &recovery.projection_failures {
        out.line(&format!(
            "run {run}: its files could not be written again ({error}); the reconciler retries"
        ))?;
    }
    Ok(())
}

/// `recover --json`: a line per run, problem, queue and fact, then the summary.
fn print_json(out: &mut Out, recovery: &Recovery, active: u64) -> std::io::Result<()> {
    for run in &recovery.runs {
        out.json(
            "run",
            &RecoveredRunDoc {
                run_id: run.run.to_string(),
                records: run.records,
                state: run.status.as_str(),
                closed: run.is_closed,
            },
        )?;
    }
    for run in &recovery.unrecoverable {
        out.json(
            "unrecoverable",
            &RunProblemDoc {
                run_id: run.run.to_string(),
                reason: Some(run.reason.clone()),
                error: None,
            },
        )?;
    }
    for run in &recovery.results_without_runs {
        out.json(
            "resultWithoutRun",
            &RunProblemDoc {
                run_id: run.to_string(),
                reason: None,
                error: None,
            },
        )?;
    }
    for queue in &recovery.queues {
        out.json(
            "queue",
            &RecoveredQueueDoc {
                name: queue.name.clone(),
                max_active: queue.max_active,
                basis: queue.basis.clone(),
            },
        )?;
    }
    for fact in facts(recovery) {
        out.json(
            "factNotRecovered",
            &FactNotRecoveredDoc {
                run_id: fact.run.clone(),
                fact: fact.fact.clone(),
                reason: fact.reason.clone(),
            },
        )?;
    }
    for (run, error) in &recovery.projection_failures {
        out.json(
            "projectionFailure",
            &RunProblemDoc {
                run_id: run.to_string(),
                reason: None,
                error: Some(error.clone()),
            },
        )?;
    }
    out.json(
        "summary",
        &RecoverSummary {
            journal: recovery.journal.display().to_string(),
            found: recovery.found.to_string(),
            moved_aside: recovery
                .moved_aside
                .as_ref()
                .map(|path| path.display().to_string()),
            runs: recovery.runs.len(),
            records: recovery.records,
            active_runs: active,
            unrecoverable: recovery.unrecoverable.len(),
            results_without_runs: recovery.results_without_runs.len(),
            queues: recovery.queues.len(),
            facts_not_recovered: facts(recovery).count(),
        },
    )
}
