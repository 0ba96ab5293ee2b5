//! The append path keeps no state a full replay would not give: whatever a handle reuses (the
//! state it stored, a `globals` entry it skips), every run's stored snapshot is the fold of its
//! records, every record is placed at its global seq, and the indexes are those the folds
//! imply, after every commit of an interleaved workload, on a warm handle and on fresh ones.

use super::*;

/// Checks the whole journal against a replay of its records.
fn assert_state_is_the_replay(journal: &Journal, runs: &[RunId], after: &str) {
    let view = journal.view().expect("a view opens");
    let mut expected_active = Vec::new();
    let mut expected_terminal = Vec::new();
    for &run in runs {
        let records = view.records(run).expect("the records read");
        let fold = state::replay(&records)
            .expect("the records fold")
            .expect("the run has records");
        assert_eq!(
            view.stored_snapshot(run).expect("the storage works"),
            Some(Ok(fold.clone())),
            "{after}: the stored snapshot of {run} is the fold of its records"
        );
        if !fold.is_closed() {
            expected_active.push(run);
        }
        if let Some(ended_at) = fold.ended_at_ms() {
            expected_terminal.push((ended_at, run));
        }
    }
    expected_active.sort();
    expected_terminal.sort();
    assert_eq!(
        view.active_runs().expect("the active index reads"),
        expected_active,
        "{after}: the active index"
    );
    assert_eq!(
        view.terminal_index().expect("the terminal index reads"),
        expected_terminal,
        "{after}: the terminal index"
    );
    let log = view.records_after(0, usize::MAX).expect("the log reads");
    assert_eq!(
        log.len() as u64,
        view.global_head().expect("the log head reads"),
        "{after}: the log holds every global seq once"
    );
    for (global, record) in &log {
        assert_eq!(
            view.global_of(record.run_id, record.seq).expect("reads"),
            Some(*global),
            "{after}: record {} of {} is placed at its global seq",
            record.seq,
            record.run_id
        );
    }
}

#[test]
fn every_commit_leaves_the_state_a_full_replay_gives_on_warm_and_fresh_handles() {
    let dir = tempfile::tempdir().expect("a temporary directory can be created");
    let path = journal_path(&dir);
    let mut journal = Journal::open(&path).expect("a new journal opens");
    let runs: Vec<RunId> = (0..4).map(|_| create(&journal, None, None)).collect();
    assert_state_is_the_replay(&journal, &runs, "the creations");

    // The events of each step of the runs' lifecycles, one per run.
    let lifecycles: Vec<Vec<Event>> = (0..runs.len())
        .map(|n| successful_lifecycle(&format!("i{n}")))
        .collect();
    let steps: Vec<Vec<Event>> = (0..lifecycles[0].len())
        .map(|step| lifecycles.iter().map(|life| life[step].clone()).collect())
        .collect();
    for (step, events) in steps.iter().enumerate() {
        // Every other step on a fresh handle, which has kept nothing from earlier commits.
        if step % 2 == 1 {
            drop(journal);
            journal = Journal::open(&path).expect("the journal reopens");
        }
        // Alone, in a rotating order, so that a run's batch sometimes follows its own
        // previous record in the log and sometimes another run's.
        let first = step % runs.len();
        for n in (first..runs.len()).chain(0..first) {
            if n % 2 == 0 {
                let appended = journal
                    .append(runs[n], vec![events[n].clone()], Condition::none())
                    .expect("a legal transition is appended");
                assert_state_is_the_replay(&journal, &runs, &format!("step {step} of run {n}"));
                let stored = journal
                    .view()
                    .expect("a view opens")
                    .stored_snapshot(runs[n])
                    .expect("the storage works");
                assert_eq!(
                    stored,
                    Some(Ok(appended.state)),
                    "the answer is the stored state"
                );
            }
        }
        // And the odd runs together, in one commit.
        let answers = journal.append_all(
            (0..runs.len())
                .filter(|n| n % 2 == 1)
                .map(|n| (runs[n], vec![events[n].clone()], Condition::none())),
        );
        assert!(answers.iter().all(Result::is_ok), "{answers:?}");
        assert_state_is_the_replay(&journal, &runs, &format!("step {step} together"));
    }

    // Two batches of one run in one commit, the second following the first in the log, beside
    // batches of the closed runs.
    let mut runs = runs;
    let late = create(&journal, None, None);
    let mut batches = vec![
        (late, vec![runner_started("late")], Condition::none()),
        (late, vec![step_running(0)], Condition::none()),
    ];
    batches.extend(runs.iter().map(|&run| {
        (
            run,
            vec![Event::Dismissed { at_ms: now_ms() }],
            Condition::none(),
        )
    }));
    runs.push(late);
    let answers = journal.append_all(batches);
    assert!(answers.iter().all(Result::is_ok), "{answers:?}");
    assert_state_is_the_replay(&journal, &runs, "two batches of a run in one commit");
    drop(journal);
    let journal = Journal::open(&path).expect("the journal reopens");
    assert_state_is_the_replay(&journal, &runs, "a reopen");
}
