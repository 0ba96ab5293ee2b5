//! A snapshot is a cache: one that does not decode is re-derived from the records.

use super::*;
use redb::ReadableTable as _;

fn raw_snapshot(db: &redb::Database, run: RunId) -> Vec<u8> {
    let txn = db.begin_read().expect("a read begins");
    let runs = txn.open_table(tables::RUNS).expect("runs opens");
    let value = runs
        .get(&run.to_bytes())
        .expect("reads")
        .expect("the snapshot exists");
    value.value().to_vec()
}

fn write_raw_snapshot(path: &Path, run: RunId, bytes: &[u8]) {
    let db = open_raw(path);
    let txn = db.begin_write().expect("a write begins");
    txn.open_table(tables::RUNS)
        .expect("runs opens")
        .insert(&run.to_bytes(), bytes)
        .expect("written");
    txn.commit().expect("commits");
}

/// Replaces the run's snapshot with the same state in layout 2, as a later version would
/// write it.
fn rewrite_snapshot_in_layout_two(path: &Path, run: RunId) {
    let layout_one = raw_snapshot(&open_raw(path), run);
    let layout_two = snapshot_of_layout_two_for_tests(&layout_one, Some(now_ms()))
        .expect("the stored snapshot is of layout 1");
    write_raw_snapshot(path, run, &layout_two);
}

fn stored_snapshot(journal: &Journal, run: RunId) -> Result<RunState, SnapshotError> {
    journal
        .view()
        .expect("a view opens")
        .stored_snapshot(run)
        .expect("the storage works")
        .expect("the run has a snapshot")
}

fn fold_of(journal: &Journal, run: RunId) -> RunState {
    let records = journal
        .view()
        .expect("a view opens")
        .records(run)
        .expect("the records read");
    state::replay(&records)
        .expect("the records fold")
        .expect("the run has records")
}

#[test]
fn a_snapshot_of_another_layout_is_rederived_on_read_and_rewritten_by_the_next_append() {
    let (_dir, path, run) = journal_with_one_lifecycle();
    rewrite_snapshot_in_layout_two(&path, run);

    let journal = Journal::open(&path).expect("the journal opens");
    assert_eq!(
        stored_snapshot(&journal, run),
        Err(SnapshotError::OtherLayout { found: 2 })
    );
    let fold = fold_of(&journal, run);
    let view = journal.view().expect("a view opens");
    assert_eq!(view.snapshot(run).expect("reads"), Some(fold.clone()));
    assert_eq!(contents(&journal).snapshots, vec![fold.clone()]);
    let mut scanned = Vec::new();
    view.scan_snapshots(|_, state| {
        scanned.push(state.expect("the run re-derives"));
        true
    })
    .expect("the storage works");
    assert_eq!(scanned, vec![fold.clone()]);
    assert_eq!(view.resolve(&run.to_string()).expect("resolves"), run);
    drop(view);

    let appended = journal
        .append(
            run,
            vec![Event::Dismissed { at_ms: now_ms() }],
            Condition::expect_head(6),
        )
        .expect("an append to a run whose snapshot is of another layout succeeds");
    assert_eq!((appended.first_seq, appended.state.head_seq), (7, 7));
    assert_eq!(appended.state, fold_of(&journal, run));
    // Rewritten in this build's layout, in the append's own transaction.
    assert_eq!(stored_snapshot(&journal, run), Ok(appended.state.clone()));
    let bytes = raw_snapshot(&journal.database().expect("a handle"), run);
    assert_eq!(bytes[0], 1, "layout 1");
}

#[test]
fn a_refused_or_duplicate_append_leaves_a_snapshot_it_cannot_read_as_it_was() {
    let (_dir, journal) = new_journal();
    let writer = WriterId(77);
    let run = RunId::generate();
    commit_one(&journal, &batch(run, vec![run_created(None)], writer, 1)).expect("created");
    let started = batch(run, vec![runner_started("i-1")], writer, 2);
    commit_one(&journal, &started).expect("started");
    let path = journal.path().to_path_buf();
    let mut damaged = raw_snapshot(&journal.database().expect("a handle"), run);
    let last = damaged.len() - 1;
    damaged[last] ^= 0x01;
    write_raw_snapshot(&path, run, &damaged);
    assert_eq!(stored_snapshot(&journal, run), Err(SnapshotError::Checksum));

    // A retry of a committed batch is answered from the records and the re-derived state.
    let retried = commit_one(&journal, &started).expect("a retry is answered");
    assert!(retried.was_duplicate);
    assert_eq!(retried.state, fold_of(&journal, run));
    // A refused batch is judged against the re-derived state, and writes nothing.
    let error = journal
        .append(run, vec![runner_started("i-2")], Condition::none())
        .expect_err("a second runner is refused");
    assert!(
        matches!(
            error,
            AppendError::Transition {
                source: TransitionError::RunnerNotQueued { .. },
                ..
            }
        ),
        "{error:?}"
    );
    assert_eq!(
        raw_snapshot(&journal.database().expect("a handle"), run),
        damaged,
        "neither wrote the snapshot"
    );
}

#[test]
fn a_run_whose_snapshot_and_records_are_both_unreadable_is_an_error() {
    let (_dir, path, run) = journal_with_one_lifecycle();
    write_raw_snapshot(&path, run, b"not a snapshot");
    // Record 3 replaced by a well-formed record that breaks a rule: a second RunnerStarted.
    let second_runner = Record {
        format_version: crate::event::FORMAT_VERSION,
        run_id: run,
        seq: 3,
        time_ms: now_ms(),
        writer: WriterId(1),
        writer_seq: 9,
        event: runner_started("instance-2"),
    };
    write_raw_record(
        &open_raw(&path),
        tables::record_key(run, 3),
        &second_runner.encode().expect("encodes"),
    );
    let stranger = RunId::from_bytes([0x02; 16]);
    write_raw_snapshot(&path, stranger, &[]);

    let journal = Journal::open(&path).expect("the journal opens");
    let view = journal.view().expect("a view opens");
    let error = view
        .snapshot(run)
        .expect_err("nothing to read the run from");
    assert!(
        matches!(
            &error,
            ReadError::Corrupt(CorruptError::Unfoldable {
                seq: 3,
                snapshot: SnapshotError::Checksum,
                source,
                ..
            }) if matches!(**source, TransitionError::RunnerNotQueued { .. })
        ),
        "{error:?}"
    );
    let error = view.snapshot(stranger).expect_err("no records");
    assert!(
        matches!(
            &error,
            ReadError::Corrupt(CorruptError::NoRecords {
                snapshot: SnapshotError::Empty,
                ..
            })
        ),
        "{error:?}"
    );
    drop(view);
    let error = journal
        .append(
            run,
            vec![Event::Dismissed { at_ms: now_ms() }],
            Condition::none(),
        )
        .expect_err("an append needs the run's state");
    assert!(
        matches!(error, AppendError::Corrupt(CorruptError::Unfoldable { .. })),
        "{error:?}"
    );
}

/// A handle starts a batch from the state it stored itself only while the run's stored snapshot
/// is byte for byte the one it stored: a snapshot written since by anyone else is read as it is.
#[test]
fn a_handle_reuses_the_state_it_stored_only_while_the_stored_snapshot_is_that_one() {
    let (_dir, journal) = new_journal();
    let run = create(&journal, None, None);
    let started = journal
        .append(run, vec![runner_started("i")], Condition::none())
        .expect("the runner starts");
    // Another writer's snapshot of the same head, of a state the records do not give (but
    // of a valid shape): the next batch must start from it, not from what this handle kept.
    let dismissed_at_ms = 1_234;
    let other = RunState {
        dismissed_at_ms: Some(dismissed_at_ms),
        ..started.state.clone()
    };
    let bytes = crate::journal::format::snapshot::encode_snapshot_for_tests(&other)
        .expect("the state encodes");
    write_raw_snapshot(journal.path(), run, &bytes);

    let next = journal
        .append(run, vec![step_running(0)], Condition::none())
        .expect("the step starts");
    assert_eq!(next.state.dismissed_at_ms, Some(dismissed_at_ms));
    // And the state it stored then is the one it starts from next.
    let last = journal
        .append(
            run,
            vec![step_finished(0, StepEnd::Complete)],
            Condition::none(),
        )
        .expect("the step ends");
    assert_eq!(last.state.dismissed_at_ms, Some(dismissed_at_ms));
    assert_eq!(
        stored_snapshot(&journal, run),
        Ok(last.state.clone()),
        "the stored snapshot is the state answered"
    );
}
