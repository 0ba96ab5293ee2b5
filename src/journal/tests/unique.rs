//! Runs launched once: a creation batch that takes a key another run holds is refused inside
//! the transaction that would commit it.

use super::*;

fn key(hold_ms: Option<u64>) -> Event {
    Event::UniqueKey {
        key: "deploy".to_string(),
        hold_ms,
    }
}

fn batch_of(run: RunId, events: Vec<Event>, writer_seq: u64) -> Batch {
    batch(run, events, WriterId(78), writer_seq)
}

fn is_held_by(result: &Result<Appended, AppendError>, holder: RunId) -> bool {
    matches!(
        result,
        Err(AppendError::Queue {
            refusal: QueueRefusal::UniqueHeld { holder: found, .. },
            ..
        }) if *found == holder
    )
}

/// Two creation batches with one key in one group, as two launchers racing through one commit
/// leader would send them: the second is judged against the index the first wrote, and
/// refused, naming the first.
#[test]
fn two_creations_with_one_key_in_one_transaction_create_one_run() {
    let (_dir, journal) = new_journal();
    let (first, second) = (RunId::generate(), RunId::generate());
    let results = commit_batches(
        &journal.database().expect("a handle"),
        &[
            batch_of(first, vec![run_created(None), key(None)], 1),
            batch_of(second, vec![run_created(None), key(None)], 2),
        ],
    )
    .expect("commits");
    assert!(results[0].is_ok(), "{:?}", results[0]);
    assert!(is_held_by(&results[1], first), "{:?}", results[1]);
    let view = journal.view().expect("view");
    assert!(
        view.snapshot(second).expect("reads").is_none(),
        "nothing of it was written"
    );
    assert_eq!(view.unique_holder("deploy").expect("reads"), Some(first));
}

/// The key is free again once its run ended; with a hold, only once the hold passed too,
/// judged at the time of the creation batch.
#[test]
fn a_key_is_held_until_its_run_ended_and_its_hold_passed() {
    let (_dir, journal) = new_journal();
    let create =
        |events: Vec<Event>| journal.append(RunId::generate(), events, Condition::expect_head(0));
    let end = |run: RunId| {
        journal
            .append(
                run,
                vec![terminal(TerminalState::Stopped)],
                Condition::expect_head(2),
            )
            .expect("ends");
    };
    let first = create(vec![run_created(None), key(None)])
        .expect("the first takes the key")
        .run;
    let refused = create(vec![run_created(None), key(None)]);
    assert!(is_held_by(&refused, first), "{refused:?}");
    end(first);
    let second = create(vec![run_created(None), key(Some(3_600_000))])
        .expect("free once its run ended")
        .run;
    end(second);
    let refused = create(vec![run_created(None), key(None)]);
    assert!(
        is_held_by(&refused, second),
        "held for an hour after its creation: {refused:?}"
    );
    // A batch made an hour and a minute later judges the hold passed.
    let later = now_ms() + 3_660_000;
    let third = RunId::generate();
    let results = commit_batches(
        &journal.database().expect("a handle"),
        &[Batch {
            time_ms: later,
            ..batch_of(
                third,
                vec![
                    testkit::created(spec(None), later, HostIds::default()),
                    key(None),
                ],
                1,
            )
        }],
    )
    .expect("commits");
    assert!(results[0].is_ok(), "{:?}", results[0]);
    assert_eq!(
        journal
            .view()
            .expect("view")
            .unique_holder("deploy")
            .expect("reads"),
        Some(third)
    );
}

/// Only a creation batch takes a key: a run created without one is refused one later, even
/// at the seq the reducer would take it at.
#[test]
fn a_key_in_a_later_batch_is_refused() {
    let (_dir, journal) = new_journal();
    let run = journal
        .append(
            RunId::generate(),
            vec![run_created(None)],
            Condition::expect_head(0),
        )
        .expect("created")
        .run;
    let refused = journal.append(run, vec![key(None)], Condition::expect_head(1));
    assert!(
        matches!(
            refused,
            Err(AppendError::Transition {
                source: TransitionError::UniqueKeyLate { found: 2, .. },
                ..
            })
        ),
        "{refused:?}"
    );
    assert_eq!(
        journal
            .view()
            .expect("view")
            .unique_holder("deploy")
            .expect("reads"),
        None
    );
}
