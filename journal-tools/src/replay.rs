//! `journal-tools replay`: prints what `runjournal::replay` does — rebuild projections from the
//! journal, in place or into a directory, or (`--check`) only say which files differ.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use runjournal::json::{ReplayFileDoc, ReplaySummary};
use runjournal::replay::{
    FileAction, Replay, ReplayError, ReplayOptions, RunReplay, Selection, Totals,
};
use runjournal::show::plural;
use runjournal::source::JournalSource;

use crate::inspect::print_problem;
use crate::output::{Out, shown_path};
use crate::{ReplayArgs, Status, UsageError, resolve_run, view};

/// The library's error as this tool says it: input errors in terms of its flags, read errors
/// at the top of the chain (so that damage is recognised).
fn replay_error(error: ReplayError, args: &ReplayArgs) -> anyhow::Error {
    let usage = |message: String| UsageError(message).into();
    match error {
        ReplayError::NeedsHome => usage(format!(
            "{} needs a home: with --journal FILE, give --home DIR too",
            if args.check {
                "replay --check"
            } else {
                "replay in place"
            }
        )),
        ReplayError::RestoreResultsOutOfPlace => usage(
            "--restore-results is for in-place replays; --out writes every file anyway"
                .to_string(),
        ),
        ReplayError::UntilSeqNeedsOneRunOutOfPlace => usage(
            "--until-seq renders one run (--run) into a directory of its own (--out), never in place"
                .to_string(),
        ),
        ReplayError::UntilSeqOutOfRange {
            run,
            head_seq,
            until_seq,
        } => usage(format!(
            "run {run} has records 1 to {head_seq}; --until-seq {until_seq} is not among them"
        )),
        ReplayError::Read(error) => error.into(),
        other => other.into(),
    }
}

pub fn replay(source: &JournalSource, out: &mut Out, args: &ReplayArgs) -> anyhow::Result<Status> {
    let selection = match (&args.run, args.all) {
        (Some(text), _) => Selection::Run(resolve_run(&view(source)?, text)?),
        (None, true) => Selection::All,
        (None, false) => {
            return Err(UsageError("say what to replay: --run RUN or --all".to_string()).into());
        }
    };
    let options = ReplayOptions {
        selection,
        until_seq: args.until_seq,
        out_dir: args.out.clone(),
        out_layout: source.layout(),
        is_check: args.check,
        restore_results: args.restore_results,
    };
    let mut replay =
        Replay::prepare(source, source.home(), options).map_err(|e| replay_error(e, args))?;
    let root = replay.target().root().to_path_buf();
    let is_in_place = replay.is_in_place();

    let runs = replay.runs().to_vec();
    let progress = progress_bar(runs.len());
    let mut status = Status::Fine;
    for run in runs {
        progress.inc(1);
        let replayed = replay
            .replay_run(run)
            .map_err(|error| replay_error(error, args))?;
        status = status.max(Status::of_severity(replayed.worst_fold_problem()));
        progress.suspend(|| print_run(out, args, &replayed, &root, is_in_place))?;
    }
    progress.finish_and_clear();

    let totals = replay.totals();
    print_summary(out, args, &totals, &root, is_in_place, status)?;
    if args.check && totals.files_changed > 0 {
        status = status.max(Status::Problems);
    }
    Ok(status)
}

fn print_run(
    out: &mut Out,
    args: &ReplayArgs,
    replayed: &RunReplay,
    root: &std::path::Path,
    is_in_place: bool,
) -> anyhow::Result<()> {
    let root = Some(root);
    for problem in replayed
        .fold_problems
        .iter()
        .chain(&replayed.check_problems)
    {
        print_problem(out, problem, root)?;
    }
    for file in &replayed.files {
        let path = shown_path(&file.path, root);
        if out.is_json {
            out.json(
                "file",
                &ReplayFileDoc {
                    run_id: replayed.run.to_string(),
                    kind: file.kind.as_str(),
                    path,
                    action: file.action.as_str(),
                    was: file.was.as_str(),
                },
            )?;
        } else if is_in_place {
            let why = if file.action == FileAction::LeftAbsent {
                "(published, then consumed by the host; --restore-results writes it)".to_string()
            } else {
                format!("(was {})", file.was.as_str())
            };
            out.text_line(&format!(
                "{:<12} {:<14} {path} {why}",
                file.action.as_str(),
                file.kind.as_str()
            ))?;
        }
    }
    if let (false, false, false, Some((status, head_seq))) =
        (is_in_place, out.is_json, args.check, replayed.rendered)
    {
        let at = match args.until_seq {
            Some(seq) => format!("as of seq {seq}"),
            None => format!("head {head_seq}"),
        };
        out.line(&format!(
            "{}  {}  {at}  {}",
            replayed.run,
            status.as_str(),
            plural(replayed.files_with_content, "file")
        ))?;
    }
    Ok(())
}

fn print_summary(
    out: &mut Out,
    args: &ReplayArgs,
    totals: &Totals,
    root: &std::path::Path,
    is_in_place: bool,
    status: Status,
) -> anyhow::Result<()> {
    let root = root.display().to_string();
    if out.is_json {
        out.json(
            "summary",
            &ReplaySummary {
                mode: if args.check { "check" } else { "write" },
                target: root,
                in_place: is_in_place,
                runs: totals.runs,
                runs_skipped: totals.runs_skipped,
                files: totals.files,
                files_changed: totals.files_changed,
                results_left_absent: totals.results_left_absent,
                until_seq: args.until_seq,
                ok: status == Status::Fine,
            },
        )?;
        return Ok(());
    }
    let skipped = if totals.runs_skipped > 0 {
        format!(
            " ({} skipped: their records do not fold)",
            plural(totals.runs_skipped, "run")
        )
    } else {
        String::new()
    };
    let consumed = if totals.results_left_absent > 0 {
        format!(
            ", {} absent (consumed?)",
            plural(totals.results_left_absent, "result file")
        )
    } else {
        String::new()
    };
    let line = match (args.check, is_in_place) {
        (true, _) => format!(
            "checked {}{skipped} in {root}: {} of {} differ{consumed}",
            plural(totals.runs, "run"),
            totals.files_changed,
            plural(totals.files, "file")
        ),
        (false, true) => format!(
            "replayed {}{skipped} in place in {root}: {} of {} repaired{consumed}",
            plural(totals.runs, "run"),
            totals.files_changed,
            plural(totals.files, "file")
        ),
        (false, false) => format!(
            "replayed {}{skipped} into {root}: {} written",
            plural(totals.runs, "run"),
            plural(totals.files_changed, "file")
        ),
    };
    out.text_line(&line)?;
    Ok(())
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
