//! `journal-tools replay`: rebuild projections from the journal, in place or into a directory,
//! or (`--check`) only say which files differ.

use std::collections::BTreeSet;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use anyhow::Context;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use runjournal::durable_fs::{self, FileLock};
use runjournal::projection::{self, Plan, ResultPolicy};
use runjournal::verify::{self, Severity};
use runjournal::{Home, RunId};
use serde_json::json;

use crate::inspect::print_problem;
use crate::output::{Out, plural, shown_path};
use crate::source::Source;
use crate::{ReplayArgs, Status, UsageError, resolve_run};

/// Where projections go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    /// The journal's own home, under each run's lock.
    InPlace,
    /// A directory of the user's, laid out as a home.
    OutOfPlace,
}

#[derive(Debug, Default)]
struct Tally {
    runs: u64,
    files: u64,
    changed: u64,
    left_absent: u64,
    skipped_runs: u64,
}

pub fn replay(source: &Source, out: &mut Out, args: &ReplayArgs) -> anyhow::Result<Status> {
    if args.run.is_none() && !args.all {
        return Err(UsageError("say what to replay: --run RUN or --all".to_string()).into());
    }
    if args.restore_results && args.out.is_some() {
        return Err(UsageError(
            "--restore-results is for in-place replays; --out writes every file anyway".to_string(),
        )
        .into());
    }
    let (home, target) = match &args.out {
        Some(dir) if !is_same_dir(dir, source.home.as_ref()) => {
            (Home::in_layout(dir, source.layout), Target::OutOfPlace)
        }
        _ => (
            source
                .require_home(if args.check {
                    "replay --check"
                } else {
                    "replay in place"
                })?
                .clone(),
            Target::InPlace,
        ),
    };

    let view = source.view()?;
    let runs: Vec<RunId> = match &args.run {
        Some(text) => vec![resolve_run(&view, text)?],
        None => view.all_runs()?,
    };
    if let (Some(until_seq), [run]) = (args.until_seq, runs.as_slice()) {
        let head = view.snapshot(*run)?.map_or(0, |state| state.head_seq);
        if until_seq == 0 || until_seq > head {
            return Err(UsageError(format!(
                "run {run} has records 1 to {head}; --until-seq {until_seq} is not among them"
            ))
            .into());
        }
    }
    drop(view);
    if target == Target::OutOfPlace && !args.check {
        durable_fs::ensure_private_dir(home.root())
            .with_context(|| format!("creating {}", home.root().display()))?;
    }

    let progress = progress_bar(runs.len());
    let mut status = Status::Fine;
    let mut tally = Tally::default();
    for run in runs {
        progress.inc(1);
        let outcome =
            progress.suspend(|| replay_run(source, out, args, &home, target, run, &mut tally))?;
        status = status.max(outcome);
    }
    progress.finish_and_clear();

    let root = home.root().display().to_string();
    if out.is_json {
        out.json(
            "summary",
            json!({
                "mode": if args.check { "check" } else { "write" },
                "target": root,
                "in_place": target == Target::InPlace,
                "runs": tally.runs,
                "runs_skipped": tally.skipped_runs,
                "files": tally.files,
                "files_changed": tally.changed,
                "results_left_absent": tally.left_absent,
                "until_seq": args.until_seq,
                "ok": status == Status::Fine,
            }),
        )?;
    } else {
        let skipped = if tally.skipped_runs > 0 {
            format!(
                " ({} skipped: their records do not fold)",
                plural(tally.skipped_runs, "run")
            )
        } else {
            String::new()
        };
        let consumed = if tally.left_absent > 0 {
            format!(
                ", {} absent (consumed?)",
                plural(tally.left_absent, "result file")
            )
        } else {
            String::new()
        };
        let line = match (args.check, target) {
            (true, _) => format!(
                "checked {}{skipped} in {root}: {} of {} differ{consumed}",
                plural(tally.runs, "run"),
                tally.changed,
                plural(tally.files, "file")
            ),
            (false, Target::InPlace) => format!(
                "replayed {}{skipped} in place in {root}: {} of {} repaired{consumed}",
                plural(tally.runs, "run"),
                tally.changed,
                plural(tally.files, "file")
            ),
            (false, Target::OutOfPlace) => format!(
                "replayed {}{skipped} into {root}: {} written",
                plural(tally.runs, "run"),
                plural(tally.changed, "file")
            ),
        };
        out.line(&line)?;
    }
    if args.check && tally.changed > 0 {
        status = status.max(Status::Problems);
    }
    Ok(status)
}

fn is_same_dir(dir: &Path, home: Option<&Home>) -> bool {
    let Some(home) = home else { return false };
    match (dir.canonicalize(), home.root().canonicalize()) {
        (Ok(dir), Ok(root)) => dir == root,
        _ => false,
    }
}

fn progress_bar(runs: usize) -> ProgressBar {
    if runs < 2 || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(runs as u64), ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template("replaying {bar:40} {pos}/{len} runs {eta}") {
        bar.set_style(style);
    }
    bar
}

/// Replays one run; returns how it came out.
fn replay_run(
    source: &Source,
    out: &mut Out,
    args: &ReplayArgs,
    home: &Home,
    target: Target,
    run: RunId,
    tally: &mut Tally,
) -> anyhow::Result<Status> {
    let root = Some(home.root());
    // Writers project under the run's lock, from the latest state read under it; so does
    // replay, so it can never put back an older state than a projector just wrote. A check
    // takes the lock only where its file exists: it creates nothing.
    let lock_path = home.lock_path(run);
    let lock = if !args.check {
        let run_dir = home.run_dir(run);
        durable_fs::ensure_private_dir(&run_dir)
            .with_context(|| format!("creating {}", run_dir.display()))?;
        Some(
            FileLock::acquire(&lock_path)
                .with_context(|| format!("locking {}", lock_path.display()))?,
        )
    } else if lock_path.exists() {
        Some(
            FileLock::acquire(&lock_path)
                .with_context(|| format!("locking {}", lock_path.display()))?,
        )
    } else {
        None
    };
    let view = source.view()?;
    let rederived = verify::rederive(&view, run, args.until_seq);
    drop(view);
    let mut status = Status::Fine;
    for problem in &rederived.problems {
        print_problem(out, problem, root)?;
        status = status.max(Status::of_severity(Some(problem.severity)));
    }
    let Some(state) = &rederived.state else {
        tally.skipped_runs += 1;
        return Ok(status);
    };
    tally.runs += 1;
    let plan = projection::plan(home, state, &rederived.records);
    tally.files += plan.files.len() as u64;
    let differences = projection::check_plan(&plan);
    if args.check {
        // A recheck takes the lock again itself.
        drop(lock);
        let mut problems: Vec<verify::Problem> =
            differences.iter().map(verify::difference_problem).collect();
        if target == Target::InPlace && args.until_seq.is_none() && !problems.is_empty() {
            // A live projector may be a moment behind its commit: look again before saying so.
            problems = verify::recheck_projections(home, source, problems);
        }
        for problem in &problems {
            if problem.severity == Severity::Note {
                tally.left_absent += 1;
            } else {
                tally.changed += 1;
            }
            print_problem(out, problem, root)?;
        }
        return Ok(status);
    }

    // In place, a result file (or result-index entry) that was published and is gone now was
    // delivered and deleted by its host: writing it again would deliver it twice. It is
    // restored only when asked; one never published, or one that differs, is written.
    let left_absent: BTreeSet<PathBuf> = differences
        .iter()
        .filter(|difference| {
            target == Target::InPlace
                && !args.restore_results
                && difference.problem == projection::Problem::Consumed
        })
        .map(|difference| difference.path.clone())
        .collect();
    let to_write = Plan {
        run: plan.run,
        files: plan
            .files
            .iter()
            .filter(|file| !left_absent.contains(&file.path))
            .cloned()
            .collect(),
        result_published_marker: plan.result_published_marker.clone(),
    };
    projection::write_plan(&to_write, ResultPolicy::Rewrite)?;

    for difference in &differences {
        let was = match &difference.problem {
            projection::Problem::Missing => "missing",
            projection::Problem::Consumed => "consumed",
            projection::Problem::Unexpected => "unexpected",
            projection::Problem::Differs { .. } => "differing",
            projection::Problem::Unreadable { .. } => "unreadable",
        };
        let is_left_absent = left_absent.contains(&difference.path);
        let action = match (is_left_absent, target) {
            (true, _) => "left-absent",
            (false, Target::OutOfPlace) => "written",
            (false, Target::InPlace) if difference.problem == projection::Problem::Unexpected => {
                "removed"
            }
            (false, Target::InPlace) => "repaired",
        };
        if is_left_absent {
            tally.left_absent += 1;
        } else {
            tally.changed += 1;
        }
        let path = shown_path(&difference.path, root);
        if out.is_json {
            out.json(
                "file",
                json!({
                    "run": run.to_string(),
                    "kind": difference.kind.as_str(),
                    "path": path,
                    "action": action,
                    "was": was,
                }),
            )?;
        } else if target == Target::InPlace {
            let why = if is_left_absent {
                "(published, then consumed by the host; --restore-results writes it)".to_string()
            } else {
                format!("(was {was})")
            };
            out.line(&format!(
                "{action:<12} {:<14} {path} {why}",
                difference.kind.as_str()
            ))?;
        }
    }
    if target == Target::OutOfPlace && !out.is_json {
        let at = match args.until_seq {
            Some(seq) => format!("as of seq {seq}"),
            None => format!("head {}", state.head_seq),
        };
        let files = to_write
            .files
            .iter()
            .filter(|file| file.content != projection::Content::Absent)
            .count();
        out.line(&format!(
            "{run}  {}  {at}  {}",
            state.status.as_str(),
            plural(files as u64, "file")
        ))?;
    }
    Ok(status)
}
