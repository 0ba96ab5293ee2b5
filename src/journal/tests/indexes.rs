//! The active and terminal indexes.

use super::*;
use crate::journal::prune::Pruned;
use redb::ReadableTable as _;

#[test]
fn a_run_stays_active_until_it_is_terminal_and_its_process_is_observed() {
    let (_dir, journal) = new_journal();
    let finished = create(&journal, None, None);
    let lost = create(&journal, None, None);
    let running = create(&journal, None, None);
    let active = |journal: &Journal| {
        journal
            .view()
            .expect("a view opens")
            .active_runs()
            .expect("the active index reads")
    };
    let mut all = vec![finished, lost, running];
    all.sort();
    assert_eq!(
        active(&journal),
        all,
        "created runs are active, in id order"
    );

    for run in [finished, lost, running] {
        journal
            .append(
                run,
                vec![runner_started("i"), step_running(0)],
                Condition::none(),
            )
            .expect("a legal batch is appended");
    }
    assert_eq!(active(&journal), all);

    // Terminal alone does not close a run: its runner may still be finishing.
    journal
        .append(
            finished,
            vec![
                step_finished(0, StepEnd::Complete),
                terminal(TerminalState::Complete),
            ],
            Condition::none(),
        )
        .expect("a legal batch is appended");
    assert!(active(&journal).contains(&finished));
    journal
        .append(
            finished,
            vec![process_gone("i", Proof::Observed, Observer::RunnerParent)],
            Condition::none(),
        )
        .expect("a legal transition is appended");
    assert!(
        !active(&journal).contains(&finished),
        "a closed run leaves the index"
    );

    // The runner died first: the process terminal alone does not close the run either.
    journal
        .append(
            lost,
            vec![process_gone("i", Proof::Unknown, Observer::Reconciler)],
            Condition::none(),
        )
        .expect("a legal transition is appended");
    let stale = journal
        .view()
        .expect("a view opens")
        .snapshot(lost)
        .expect("the snapshot reads")
        .expect("the run exists");
    assert!(stale.is_stale());
    assert!(
        active(&journal).contains(&lost),
        "a stale run is still work to do"
    );
    journal
        .append(
            lost,
            vec![repaired_failure()],
            Condition::expect_not_terminal(),
        )
        .expect("the repair is appended");
    assert_eq!(active(&journal), vec![running]);

    // A dismissed closed run does not come back.
    journal
        .append(
            finished,
            vec![Event::Dismissed { at_ms: now_ms() }],
            Condition::none(),
        )
        .expect("a closed run can be dismissed");
    assert_eq!(active(&journal), vec![running]);
}

#[test]
fn a_run_created_and_closed_in_one_batch_is_never_active_but_is_listed_as_terminal() {
    let (_dir, journal) = new_journal();
    let run = RunId::generate();
    let appended = journal
        .append(
            run,
            vec![
                run_created(Some("never-started")),
                Event::Terminal {
                    state: TerminalState::Failed,
                    error: Some("runner never started".to_string()),
                    summary: "runner never started".to_string(),
                    exit_code: 1,
                    repaired_by: Some(Repairer::Launcher),
                },
                process_gone("none", Proof::NotStarted, Observer::Launcher),
            ],
            Condition::expect_head(0),
        )
        .expect("a launcher may give up on a run in one batch");
    assert_eq!((appended.first_seq, appended.last_seq), (1, 3));
    assert!(appended.state.is_closed());
    let view = journal.view().expect("a view opens");
    assert!(view.active_runs().expect("the index reads").is_empty());
    let ended_at = appended.state.ended_at_ms().expect("the run ended");
    assert_eq!(
        view.recent_terminal(10).expect("the index reads"),
        vec![(ended_at, run)]
    );
    assert_eq!(
        view.lookup_alias(&name_alias("never-started"))
            .expect("reads"),
        Some(run)
    );
}

#[test]
fn recent_terminal_lists_terminal_runs_most_recently_ended_first() {
    let (_dir, journal) = new_journal();
    let writer = WriterId(0x7e57);
    let runs: Vec<RunId> = (0..4).map(|_| create(&journal, None, None)).collect();
    // End times are chosen, so ties and order are known: runs 0 and 2 end at the same time.
    let ends: [(usize, UnixMs); 3] = [(0, 3_000), (1, 1_000), (2, 3_000)];
    for (writer_seq, (run_index, ended_at_ms)) in ends.into_iter().enumerate() {
        let mut terminal_batch = batch(
            runs[run_index],
            vec![runner_started("i"), terminal(TerminalState::Stopped)],
            writer,
            writer_seq as u64 + 1,
        );
        terminal_batch.time_ms = ended_at_ms;
        let appended = commit_one(&journal, &terminal_batch).expect("a legal batch commits");
        assert_eq!(appended.state.ended_at_ms(), Some(ended_at_ms));
    }
    let mut tied = [(3_000, runs[0]), (3_000, runs[2])];
    tied.sort();
    let expected = vec![tied[1], tied[0], (1_000, runs[1])];

    let view = journal.view().expect("a view opens");
    assert_eq!(view.recent_terminal(10).expect("the index reads"), expected);
    assert_eq!(
        view.recent_terminal(2).expect("the index reads"),
        expected[..2]
    );
    assert!(view.recent_terminal(0).expect("the index reads").is_empty());
    let listed: Vec<RunId> = expected.iter().map(|(_, run)| *run).collect();
    assert!(
        !listed.contains(&runs[3]),
        "a run that has not ended is not listed"
    );
    // Terminal but not closed: still active.
    assert_eq!(view.active_runs().expect("the index reads").len(), 4);

    // Observing the process later neither moves nor duplicates the entry.
    drop(view);
    journal
        .append(
            runs[1],
            vec![process_gone("i", Proof::Observed, Observer::Launcher)],
            Condition::none(),
        )
        .expect("a legal transition is appended");
    let view = journal.view().expect("a view opens");
    assert_eq!(view.recent_terminal(10).expect("the index reads"), expected);
}

/// The raw `globals` entries of `run`: (seq, global seq).
fn globals_of(journal: &Journal, run: RunId) -> Vec<(u64, u64)> {
    let db = journal.database().expect("a handle");
    let txn = db.begin_read().expect("a read begins");
    let globals = txn.open_table(tables::GLOBALS).expect("globals opens");
    let low = tables::record_key(run, 0);
    let high = tables::record_key(run, u64::MAX);
    globals
        .range(&low..=&high)
        .expect("reads")
        .map(|entry| {
            let (key, global) = entry.expect("reads");
            (tables::split_record_key(key.value()).1, global.value())
        })
        .collect()
}

/// Two runs whose batches interleave in the log: `run` has batches of 1, 3, 1 and 1 records.
fn interleaved_runs(journal: &Journal) -> (RunId, RunId) {
    let run = create(journal, None, None);
    let other = create(journal, None, None);
    let lifecycle = successful_lifecycle("i");
    journal
        .append(run, lifecycle[..3].to_vec(), Condition::none())
        .expect("three records");
    journal
        .append(other, vec![runner_started("j")], Condition::none())
        .expect("the other run starts");
    journal
        .append(run, vec![lifecycle[3].clone()], Condition::none())
        .expect("terminal");
    journal
        .append(other, vec![step_running(0)], Condition::none())
        .expect("the other run's step starts");
    journal
        .append(run, vec![lifecycle[4].clone()], Condition::none())
        .expect("closed");
    (run, other)
}

#[test]
fn the_log_index_holds_one_entry_per_batch_and_places_every_record_of_it() {
    let (_dir, journal) = new_journal();
    let (run, other) = interleaved_runs(&journal);
    let log = journal
        .view()
        .expect("a view opens")
        .records_after(0, usize::MAX)
        .expect("the log reads");
    let global_of_record = |seq: u64| {
        log.iter()
            .find(|(_, record)| record.run_id == run && record.seq == seq)
            .map(|(global, _)| *global)
            .expect("the record is in the log")
    };
    assert_eq!(
        globals_of(&journal, run),
        [1, 2, 5, 6]
            .iter()
            .map(|&seq| (seq, global_of_record(seq)))
            .collect::<Vec<_>>(),
        "one entry per batch, at its first record"
    );
    let view = journal.view().expect("a view opens");
    for (global, record) in &log {
        assert_eq!(
            view.global_of(record.run_id, record.seq).expect("reads"),
            Some(*global),
            "record {} of {}",
            record.seq,
            record.run_id
        );
    }
    assert_eq!(view.global_of(run, 7).expect("reads"), None, "no record 7");
    assert_eq!(globals_of(&journal, other).len(), 3);
}

/// A record the index lacks (committed by a version that did not index it) is never placed at
/// another record's global seq, and pruning its run still removes its log entry.
#[test]
fn a_record_the_log_index_lacks_is_never_misplaced_and_its_run_is_still_pruned_whole() {
    let (_dir, journal) = new_journal();
    let (run, other) = interleaved_runs(&journal);
    let db = journal.database().expect("a handle");
    let txn = db.begin_write().expect("a write begins");
    txn.open_table(tables::GLOBALS)
        .expect("globals opens")
        .remove(&tables::record_key(run, 5))
        .expect("removed")
        .expect("record 5 had its batch's entry");
    txn.commit().expect("commits");
    let view = journal.view().expect("a view opens");
    // The nearest entry below is record 2's batch; the other run's record sits between them.
    assert_eq!(view.global_of(run, 5).expect("reads"), None);
    let others: Vec<(u64, Record)> = view
        .records_after(0, usize::MAX)
        .expect("the log reads")
        .into_iter()
        .filter(|(_, record)| record.run_id == other)
        .collect();
    drop(view);

    let pruned = journal
        .prune(&[run], &[], now_ms())
        .expect("the prune commits");
    assert!(
        matches!(pruned[..], [(found, Pruned::Done(_))] if found == run),
        "{pruned:?}"
    );
    let view = journal.view().expect("a view opens");
    assert_eq!(
        view.records_after(0, usize::MAX).expect("the log reads"),
        others,
        "the log holds the other run's records and nothing of the pruned one"
    );
    assert!(globals_of(&journal, run).is_empty());
    assert_eq!(globals_of(&journal, other).len(), 3);
}

/// A run appending alone, each batch right after its previous record in the log, needs the
/// entry of its creation batch only; every record is still placed.
#[test]
fn batches_that_follow_their_runs_previous_record_in_the_log_add_no_entry() {
    let (_dir, journal) = new_journal();
    let run = create(&journal, None, None);
    for event in successful_lifecycle("i") {
        journal
            .append(run, vec![event], Condition::none())
            .expect("a legal batch");
    }
    let two = journal
        .append_all([
            (
                run,
                vec![Event::Dismissed { at_ms: now_ms() }],
                Condition::none(),
            ),
            (
                run,
                vec![Event::Dismissed { at_ms: now_ms() }],
                Condition::none(),
            ),
        ])
        .into_iter()
        .filter(Result::is_ok)
        .count();
    assert!(two >= 1, "at least the first dismissal lands");
    assert_eq!(globals_of(&journal, run), vec![(1, 1)]);
    let view = journal.view().expect("a view opens");
    for (global, record) in view.records_after(0, usize::MAX).expect("the log reads") {
        assert_eq!(
            view.global_of(run, record.seq).expect("reads"),
            Some(global)
        );
    }
}
