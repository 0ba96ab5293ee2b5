//! Idempotency.

use super::*;

#[test]
fn a_batch_committed_twice_is_recognised_and_stored_once() {
    let (_dir, journal) = new_journal();
    let run = create(&journal, None, None);
    let writer = WriterId(0x00c0_ffee);
    let retried = batch(run, vec![runner_started("i"), step_running(0)], writer, 1);

    let first = commit_one(&journal, &retried).expect("the batch commits");
    assert!(!first.was_duplicate);
    assert_eq!((first.first_seq, first.last_seq), (2, 3));
    let after_first = contents(&journal);

    let second = commit_one(&journal, &retried).expect("a retry is answered, not refused");
    assert!(second.was_duplicate);
    assert_eq!((second.first_seq, second.last_seq), (2, 3));
    assert_eq!(second.state, first.state);
    assert_eq!(contents(&journal), after_first, "the retry wrote nothing");
    let view = journal.view().expect("a view opens");
    assert_eq!(
        seqs(&view.records(run).expect("records read")),
        vec![1, 2, 3]
    );
    assert_eq!(view.writer_mark(writer).expect("reads"), Some(1));
    drop(view);

    // Still recognised after other writers and later batches of the same writer moved on.
    journal
        .append(
            run,
            vec![step_finished(0, StepEnd::Complete)],
            Condition::none(),
        )
        .expect("another writer appends");
    let later = batch(run, vec![terminal(TerminalState::Complete)], writer, 2);
    let later_answer = commit_one(&journal, &later).expect("the later batch commits");
    assert_eq!((later_answer.first_seq, later_answer.last_seq), (5, 5));
    let third = commit_one(&journal, &retried).expect("a late retry is answered");
    assert!(third.was_duplicate);
    assert_eq!((third.first_seq, third.last_seq), (2, 3));
    assert_eq!(
        third.state, later_answer.state,
        "a duplicate answers the state now"
    );
    let view = journal.view().expect("a view opens");
    assert_eq!(
        seqs(&view.records(run).expect("records read")),
        vec![1, 2, 3, 4, 5]
    );
    assert_eq!(view.writer_mark(writer).expect("reads"), Some(2));
}

#[test]
fn a_create_batch_committed_twice_creates_the_run_once() {
    let (_dir, journal) = new_journal();
    let run = RunId::generate();
    let writer = WriterId(42);
    let mut create_batch = batch(run, vec![run_created(Some("once"))], writer, 7);
    create_batch.condition = Condition::expect_head(0);
    let first = commit_one(&journal, &create_batch).expect("the run is created");
    let after_first = contents(&journal);
    let second = commit_one(&journal, &create_batch).expect("the retry is answered");
    assert!(second.was_duplicate);
    assert_eq!((second.first_seq, second.last_seq), (1, 1));
    assert_eq!(second.state, first.state);
    assert_eq!(contents(&journal), after_first);
}

#[test]
fn a_reused_writer_seq_that_was_never_committed_is_refused() {
    let (_dir, journal) = new_journal();
    let run = create(&journal, None, None);
    let other = create(&journal, None, None);
    let writer = WriterId(0xbad5_eed5);
    commit_one(&journal, &batch(run, vec![runner_started("i")], writer, 5))
        .expect("the batch commits");
    let before = contents(&journal);

    // Below the mark, on the same run: that seq never carried a batch.
    let below = batch(run, vec![step_running(0)], writer, 3);
    // At the mark, on another run: seq 5 went to `run`, not `other`.
    let elsewhere = batch(other, vec![runner_started("j")], writer, 5);
    for (reused, target) in [(below, run), (elsewhere, other)] {
        let writer_seq = reused.writer_seq;
        let error = commit_one(&journal, &reused).expect_err("the seq was never committed here");
        assert!(
            matches!(
                &error,
                AppendError::WriterSeqReused { writer: w, writer_seq: s, run: r }
                    if *w == writer && *s == writer_seq && *r == target
            ),
            "{error:?}"
        );
    }
    assert_eq!(contents(&journal), before, "a reused seq writes nothing");
}

/// Regression: a writer seq that was committed with other events on the same run used to be
/// answered as a duplicate of the new batch.
#[test]
fn a_reused_writer_seq_with_other_events_is_refused() {
    let (_dir, journal) = new_journal();
    let run = create(&journal, None, None);
    let writer = WriterId(0x5eed);
    commit_one(&journal, &batch(run, vec![runner_started("i")], writer, 1))
        .expect("the batch commits");
    let before = contents(&journal);
    let different = batch(run, vec![runner_started("other-instance")], writer, 1);
    let error = commit_one(&journal, &different).expect_err("not the same batch");
    assert!(
        matches!(error, AppendError::WriterSeqReused { writer_seq: 1, .. }),
        "{error:?}"
    );
    assert_eq!(contents(&journal), before, "a reused seq writes nothing");
}

#[test]
fn batches_of_one_transaction_are_each_answered_and_a_refused_one_fails_only_itself() {
    let (_dir, journal) = new_journal();
    let run = create(&journal, None, None);
    let writer = WriterId(9);
    let batches = [
        batch(run, vec![runner_started("i")], writer, 1),
        // Illegal: the runner already started.
        batch(run, vec![runner_started("i")], writer, 2),
        batch(run, vec![step_running(0)], writer, 3),
    ];
    let results = commit_batches(&journal.database().expect("a handle"), &batches)
        .expect("the storage works");
    assert_eq!(results.len(), 3);
    assert_eq!(results[0].as_ref().expect("legal").last_seq, 2);
    assert!(
        matches!(
            &results[1],
            Err(AppendError::Transition {
                index: 0,
                source: TransitionError::RunnerNotQueued { .. }
            })
        ),
        "{:?}",
        results[1]
    );
    assert_eq!(results[2].as_ref().expect("legal").last_seq, 3);
    let view = journal.view().expect("a view opens");
    assert_eq!(
        seqs(&view.records(run).expect("records read")),
        vec![1, 2, 3]
    );
    drop(view);

    // Retrying all three: the committed ones are duplicates, and nothing is written.
    let before = contents(&journal);
    let retried = commit_batches(&journal.database().expect("a handle"), &batches)
        .expect("the storage works");
    assert!(retried[0].as_ref().expect("answered").was_duplicate);
    assert!(matches!(
        retried[1],
        Err(AppendError::WriterSeqReused { .. })
    ));
    assert!(retried[2].as_ref().expect("answered").was_duplicate);
    assert_eq!(contents(&journal), before);
}
