use super::*;
use crate::event::{Event, HostIds};
use crate::journal::{Condition, Retention};
use crate::testkit::{chain_spec, exited_identity};

fn runs() -> (tempfile::TempDir, Runs) {
    let dir = tempfile::tempdir().expect("temp dir");
    let home = Home::at(dir.path());
    // No pass of these tests starts a runner: no run waits in a queue.
    let runs = Runs::open(home, RunnerProgram::runjournal("/nonexistent/runjournal"))
        .expect("open the home");
    (dir, runs)
}

/// A run whose runner is dead (it never recorded an end): the reconciler closes it.
fn run_with_a_dead_runner(runs: &Runs) -> RunId {
    let store = runs.store();
    let run = store
        .create_run(chain_spec(2), HostIds::default())
        .expect("create")
        .run;
    store
        .append(
            run,
            vec![Event::RunnerStarted {
                runner: exited_identity(),
                instance_id: "runner-1".to_string(),
            }],
            Condition::expect_head(1),
        )
        .expect("runner started");
    run
}

#[test]
fn a_home_with_nothing_to_do_is_maintained_clean_and_keeps_its_runs() {
    let (_dir, runs) = runs();
    let done = runs.maintain();
    assert!(done.is_clean(), "{done}");
    let reconciled = done.reconciled.as_ref().expect("reconciled");
    assert_eq!(reconciled.active, 0);
    assert!(matches!(&done.pruned, Some(Ok(report)) if report.chosen.is_empty()));
}

#[test]
fn a_run_the_reconcile_pass_closes_is_pruned_by_the_same_maintain_under_the_policy() {
    // The retention pass's plan is read before the reconcile pass closes the run; the pass
    // wrote, so retention reads again and sees the run closed. An age bound of 0 takes it at
    // once, its result unconsumed.
    let (_dir, runs) = runs();
    runs.set_retention(&Retention {
        keep_for_ms: Some(0),
        ..Retention::DEFAULT
    })
    .expect("set the policy");
    let run = run_with_a_dead_runner(&runs);
    let done = runs.maintain();
    let reconciled = done.reconciled.as_ref().expect("reconciled");
    assert!(
        reconciled
            .outcomes
            .iter()
            .any(|outcome| outcome.run == run && !outcome.appended.is_empty()),
        "the pass closes the run: {reconciled:?}"
    );
    let pruned = match &done.pruned {
        Some(Ok(report)) => report,
        other => panic!("the retention pass ran: {other:?}"),
    };
    assert_eq!(
        pruned
            .chosen
            .iter()
            .map(|chosen| chosen.run)
            .collect::<Vec<_>>(),
        [run],
        "{done}"
    );
    assert_eq!(
        runs.status(run).expect("read"),
        None,
        "pruned from the journal"
    );
    // A reading command says so: the result was taken before its host consumed it.
    let notes = done.notes();
    assert!(
        notes.iter().any(|note| note
            .starts_with(&format!("{run}  pruned  older than the age bound"))
            && note.ends_with("its result had not been consumed")),
        "{notes:?}"
    );
    // And `runjournal reconcile` prints the run's line, its pruning's, then the summary.
    let lines: Vec<String> = done.lines().iter().map(ToString::to_string).collect();
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert!(
        lines[1].starts_with(&format!("{run}  pruned  ")),
        "{lines:?}"
    );
    assert_eq!(lines[2], "1 active run(s), 1 changed, 1 pruned, 0 error(s)");
}

#[test]
fn an_ended_run_is_pruned_by_maintain_alone_once_the_policy_allows() {
    let (_dir, runs) = runs();
    let run = run_with_a_dead_runner(&runs);
    // The defaults keep an ended run 30 days: maintain closes it and keeps it.
    let first = runs.maintain();
    assert!(
        matches!(&first.pruned, Some(Ok(report)) if report.chosen.is_empty()),
        "{first}"
    );
    assert!(runs.status(run).expect("read").is_some());
    // The host reads its result and consumes it; the count bound may then take the run.
    std::fs::remove_file(runs.home().result_path(run)).expect("consume the result");
    runs.set_retention(&Retention {
        keep_runs: Some(0),
        ..Retention::DEFAULT
    })
    .expect("set the policy");
    // Nothing left to reconcile: every pass reads from the one view.
    let second = runs.maintain();
    assert!(second.is_clean(), "{second}");
    assert!(
        matches!(&second.pruned, Some(Ok(report)) if report.chosen.len() == 1),
        "{second:?}"
    );
    assert_eq!(runs.status(run).expect("read"), None);
}
