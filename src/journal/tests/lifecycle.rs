//! Appending a lifecycle.

use super::*;

#[test]
fn snapshot_of_a_full_lifecycle_equals_the_replay_of_its_records() {
    let (_dir, journal) = new_journal();
    let run = create(&journal, Some("nightly"), Some("call-1"));

    for (index, event) in successful_lifecycle("instance-1").into_iter().enumerate() {
        let head = index as u64 + 1;
        let appended = journal
            .append(run, vec![event], Condition::expect_head(head))
            .expect("a legal transition is appended");
        assert_eq!(
            (appended.first_seq, appended.last_seq),
            (head + 1, head + 1)
        );
        assert_eq!(appended.state.head_seq, head + 1);
        assert!(!appended.was_duplicate);
        let stored = journal
            .view()
            .expect("a view opens")
            .snapshot(run)
            .expect("the snapshot reads")
            .expect("the run exists");
        assert_eq!(appended.state, stored, "the answer is the committed state");
    }

    let view = journal.view().expect("a view opens");
    let records = view.records(run).expect("records read");
    assert_eq!(seqs(&records), vec![1, 2, 3, 4, 5, 6]);
    assert!(records.iter().all(|record| record.run_id == run));
    assert!(
        records
            .iter()
            .all(|record| record.writer == journal.writer())
    );
    let names: Vec<&str> = records.iter().map(|record| record.event.name()).collect();
    assert_eq!(
        names,
        [
            "RunCreated",
            "RunnerStarted",
            "StepRunning",
            "StepFinished",
            "Terminal",
            "ProcessTerminalObserved"
        ]
    );

    let snapshot = view
        .snapshot(run)
        .expect("the snapshot reads")
        .expect("the run exists");
    let replayed = state::replay(&records)
        .expect("the stored records replay")
        .expect("there are records");
    assert_eq!(snapshot, replayed);
    assert_eq!(snapshot.status, RunStatus::Complete);
    assert_eq!(snapshot.head_seq, 6);
    assert!(snapshot.is_closed());
    assert_eq!(view.records_until(run, 3).expect("records read").len(), 3);
    assert_eq!(view.run_count().expect("runs count"), 1);
    assert_eq!(view.record_count().expect("records count"), 6);
    drop(view);
    assert!(
        journal.check_integrity().expect("the check runs"),
        "redb finds the file sound"
    );
}

#[test]
fn records_after_returns_every_run_in_commit_order_and_resumes_after_a_cursor() {
    let (_dir, journal) = new_journal();
    let a = create(&journal, None, None);
    let b = create(&journal, None, None);
    let mut expected = vec![(a, 1), (b, 1)];
    let mut a_events = successful_lifecycle("a").into_iter();
    for event in a_events.by_ref().take(2) {
        let appended = journal
            .append(a, vec![event], Condition::none())
            .expect("a legal transition is appended");
        expected.push((a, appended.last_seq));
    }
    // A batch of several events, in the middle of the other run's appends.
    let appended = journal
        .append(b, successful_lifecycle("b"), Condition::expect_head(1))
        .expect("a legal batch is appended");
    assert_eq!((appended.first_seq, appended.last_seq), (2, 6));
    expected.extend((2..=6).map(|seq| (b, seq)));
    for event in a_events {
        let appended = journal
            .append(a, vec![event], Condition::none())
            .expect("a legal transition is appended");
        expected.push((a, appended.last_seq));
    }

    let view = journal.view().expect("a view opens");
    let all = view.records_after(0, usize::MAX).expect("the log reads");
    let order: Vec<(RunId, u64)> = all
        .iter()
        .map(|(_, record)| (record.run_id, record.seq))
        .collect();
    assert_eq!(order, expected, "the log is in commit order");
    let globals: Vec<u64> = all.iter().map(|(global, _)| *global).collect();
    assert_eq!(globals, (1..=12).collect::<Vec<u64>>());
    assert_eq!(view.global_head().expect("the log head reads"), 12);
    // The log hands out the very records the run holds.
    let records_of_b = view.records(b).expect("records read");
    let logged_b: Vec<Record> = all
        .iter()
        .filter(|(_, record)| record.run_id == b)
        .map(|(_, record)| record.clone())
        .collect();
    assert_eq!(logged_b, records_of_b);

    assert_eq!(
        view.records_after(5, usize::MAX).expect("the log reads"),
        all[5..].to_vec(),
        "a cursor resumes right after the global seq it names"
    );
    assert_eq!(
        view.records_after(5, 3).expect("the log reads"),
        all[5..8].to_vec(),
        "the limit bounds the answer"
    );
    assert!(
        view.records_after(12, 10)
            .expect("the log reads")
            .is_empty()
    );
    assert!(
        view.records_after(u64::MAX, 10)
            .expect("the log reads")
            .is_empty()
    );
}

#[test]
fn an_empty_journal_has_head_zero_and_no_records() {
    let (_dir, journal) = new_journal();
    let view = journal.view().expect("a view opens");
    assert_eq!(view.global_head().expect("the log head reads"), 0);
    assert!(view.records_after(0, 10).expect("the log reads").is_empty());
    assert!(
        view.active_runs()
            .expect("the active index reads")
            .is_empty()
    );
    assert!(
        view.recent_terminal(10)
            .expect("the terminal index reads")
            .is_empty()
    );
    let unknown = RunId::generate();
    assert_eq!(view.snapshot(unknown).expect("the snapshot reads"), None);
    assert!(view.records(unknown).expect("records read").is_empty());
}
