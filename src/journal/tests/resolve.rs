//! Resolving ids and prefixes.

use super::*;

/// Five ids that differ only in their last byte, so they share their first 25 characters.
fn clustered_ids() -> Vec<RunId> {
    (1..=5u8)
        .map(|last| {
            RunId::from_bytes([
                0x01, 0x8E, 0x5A, 0x3C, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xAA,
                0xBB, last,
            ])
        })
        .collect()
}

fn lonely_id() -> RunId {
    RunId::from_bytes([
        0x01, 0x00, 0x5A, 0x3C, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xAA, 0xBB,
        0x01,
    ])
}

fn journal_with_chosen_ids() -> (TempDir, Journal) {
    let (dir, journal) = new_journal();
    for run in clustered_ids().into_iter().chain([lonely_id()]) {
        journal
            .append(run, vec![run_created(None)], Condition::expect_head(0))
            .expect("a run is created under a chosen id");
    }
    (dir, journal)
}

#[test]
fn resolve_accepts_a_full_id_and_a_unique_prefix_in_either_case() {
    let (_dir, journal) = journal_with_chosen_ids();
    let view = journal.view().expect("a view opens");
    let lonely = lonely_id();
    let text = lonely.to_string();
    let cluster_text = clustered_ids()[0].to_string();
    assert_ne!(
        text[..8],
        cluster_text[..8],
        "the fixture's prefixes differ"
    );

    assert_eq!(view.resolve(&text).expect("full id"), lonely);
    assert_eq!(
        view.resolve(&text.to_ascii_lowercase())
            .expect("lower case"),
        lonely
    );
    assert_eq!(
        view.resolve(&text[..8]).expect("8-character prefix"),
        lonely
    );
    assert_eq!(
        view.resolve(&text[..12].to_ascii_lowercase())
            .expect("lower-case prefix"),
        lonely
    );
    for run in clustered_ids() {
        assert_eq!(view.resolve(&run.to_string()).expect("full id"), run);
    }
}

#[test]
fn resolve_refuses_short_unknown_and_ambiguous_text() {
    let (_dir, journal) = journal_with_chosen_ids();
    let view = journal.view().expect("a view opens");
    let text = lonely_id().to_string();

    let error = view.resolve(&text[..7]).expect_err("too short");
    assert!(
        matches!(
            error,
            ResolveError::BadId(RunIdError::PrefixTooShort { .. })
        ),
        "{error:?}"
    );

    let unknown = RunId::from_bytes([0x02; 16]).to_string();
    let error = view.resolve(&unknown).expect_err("no such run");
    assert!(
        matches!(&error, ResolveError::Unknown { text } if *text == unknown),
        "{error:?}"
    );
    let error = view
        .resolve("7ZZZZZZZ")
        .expect_err("no run has this prefix");
    assert!(matches!(error, ResolveError::Unknown { .. }), "{error:?}");

    let cluster = clustered_ids();
    let shared = cluster[0].to_string();
    assert_eq!(shared[..25], cluster[4].to_string()[..25]);
    for length in [8, 25] {
        let error = view
            .resolve(&shared[..length])
            .expect_err("five runs match");
        match &error {
            ResolveError::Ambiguous {
                text,
                count,
                examples,
            } => {
                assert_eq!(text, &shared[..length]);
                assert_eq!(*count, 5, "the count is of every match, not of those shown");
                assert_eq!(examples.split(", ").count(), 3, "{examples}");
            }
            other => panic!("expected Ambiguous, got {other:?}"),
        }
        assert!(
            error.to_string().contains("give more characters"),
            "{error}"
        );
    }
}

#[test]
fn resolve_refuses_path_characters_before_touching_the_journal() {
    let (_dir, journal) = journal_with_chosen_ids();
    let view = journal.view().expect("a view opens");
    let full_length_with_slash = format!("{}/", &lonely_id().to_string()[..25]);
    assert_eq!(full_length_with_slash.len(), RunId::LEN);
    for (text, bad) in [
        ("../../etc/passwd", '.'),
        ("01ARZ3ND/x", '/'),
        (full_length_with_slash.as_str(), '/'),
        ("01ARZ3ND.json", '.'),
    ] {
        let error = view.resolve(text).expect_err("not an id");
        assert!(
            matches!(&error, ResolveError::BadId(RunIdError::BadCharacter { bad: found, .. }) if *found == bad),
            "{text:?}: {error:?}"
        );
    }
}

#[test]
fn a_consistent_copy_holds_every_commit_and_leaves_the_source_as_it_was() {
    let (dir, path, run) = journal_with_one_lifecycle();
    let before = read_bytes(&path);
    let copy = dir.path().join("copy.redb");
    copy_consistent(&path, &copy).expect("a quiet journal copies at once");
    assert_eq!(read_bytes(&path), before, "the source is not written");
    let reader = JournalReader::open(&copy).expect("the copy opens read-only");
    let view = reader.view().expect("a view opens");
    assert_eq!(
        seqs(&view.records(run).expect("records read")),
        (1..=6).collect::<Vec<_>>()
    );
}

/// Survivors of mutation testing: a refused batch carries the state it was judged against only
/// when its refusal is one `judge` words from that state and the batch alone, and only when
/// the committer asked for it (a client's batch, whose process words the refusal itself).
#[test]
fn only_a_judged_refusal_asked_for_keeps_the_state_it_was_judged_against() {
    use crate::journal::write::append::{Marks, commit_batches_judged, is_judged_refusal};
    let (_dir, journal) = new_journal();
    let run = create(&journal, None, None);
    let writer = WriterId(0x0dd_ba7c);
    commit_one(&journal, &batch(run, vec![runner_started("i")], writer, 5))
        .expect("the batch commits");
    let db = journal.database().expect("a handle");
    // Judged from the state: a step that is not pending cannot finish. Not judged from the
    // state: a writer seq reused below its mark.
    let illegal = batch(run, vec![step_finished(0, StepEnd::Complete)], writer, 6);
    let reused = batch(run, vec![step_running(0)], writer, 3);
    let judged = commit_batches_judged(
        &db,
        &[illegal.clone(), reused.clone()],
        Marks::Idempotent,
        |_| true,
    )
    .expect("the storage does not fail");
    assert!(matches!(
        judged[0].result,
        Err(AppendError::Transition { .. })
    ));
    let against = judged[0]
        .refused_against
        .as_ref()
        .expect("kept when asked for");
    assert_eq!(
        against.as_ref().map(|state| state.head_seq),
        Some(2),
        "the state the batch was judged against"
    );
    assert!(matches!(
        judged[1].result,
        Err(AppendError::WriterSeqReused { .. })
    ));
    assert!(judged[1].refused_against.is_none(), "not a judged refusal");

    let judged = commit_batches_judged(&db, &[illegal], Marks::Idempotent, |_| false)
        .expect("the storage does not fail");
    assert!(judged[0].result.is_err());
    assert!(judged[0].refused_against.is_none(), "not asked for");

    let head_mismatch = AppendError::HeadMismatch {
        run,
        expected: 1,
        found: 2,
    };
    assert!(is_judged_refusal(&head_mismatch));
    assert!(is_judged_refusal(&AppendError::EmptyBatch));
    assert!(!is_judged_refusal(&AppendError::WriterSeqReused {
        writer,
        writer_seq: 3,
        run
    }));
}
