//! Queues.

use super::*;

fn queue_joined() -> Event {
    Event::QueueJoined {
        queue: "q".to_string(),
        idle_timeout_ms: None,
        heartbeat_ms: None,
    }
}

fn queue_admitted() -> Event {
    Event::QueueAdmitted {
        by: "test".to_string(),
    }
}

fn batch_of(run: RunId, events: Vec<Event>, writer_seq: u64) -> Batch {
    batch(run, events, WriterId(77), writer_seq)
}

/// Two batches of one group committed in one transaction, each admitting the queue's first
/// waiting run while one slot is free: the second is judged against the indexes the first
/// moved, and refused.
#[test]
fn two_admissions_in_one_transaction_take_the_last_slot_once() {
    let (_dir, journal) = new_journal();
    journal.set_queue_limit("q", 1).expect("limit");
    let runs: Vec<RunId> = (0..2)
        .map(|_| {
            journal
                .append(
                    RunId::generate(),
                    vec![run_created(None), queue_joined()],
                    Condition::expect_head(0),
                )
                .expect("joins")
                .run
        })
        .collect();
    let results = commit_batches(
        &journal.database().expect("a handle"),
        &[
            batch_of(runs[0], vec![queue_admitted()], 1),
            batch_of(runs[1], vec![queue_admitted()], 2),
        ],
    )
    .expect("commits");
    assert!(results[0].is_ok(), "{:?}", results[0]);
    assert!(
        matches!(
            results[1],
            Err(AppendError::Queue {
                refusal: QueueRefusal::Full {
                    active: 1,
                    max_active: 1,
                    ..
                },
                ..
            })
        ),
        "{:?}",
        results[1]
    );
}

/// The indexes follow each run: waiting from its creation, active from its admission to its
/// `Terminal`, then neither; a stopped waiting run leaves the waiting runs without a slot.
#[test]
fn queue_indexes_follow_each_run_from_waiting_to_its_end() {
    let (_dir, journal) = new_journal();
    journal.set_queue_limit("q", 1).expect("limit");
    let join = || {
        journal
            .append(
                RunId::generate(),
                vec![run_created(None), queue_joined()],
                Condition::expect_head(0),
            )
            .expect("joins")
            .run
    };
    let (first, second, third) = (join(), join(), join());
    let view = journal.view().expect("view");
    assert_eq!(
        view.queue_waiting("q", 10).expect("w"),
        vec![first, second, third]
    );
    assert_eq!(view.queue_usage("q").expect("use").waiting, 3);
    drop(view);
    journal
        .append(first, vec![queue_admitted()], Condition::none())
        .expect("admitted");
    journal
        .append(
            second,
            vec![Event::Terminal {
                state: TerminalState::Stopped,
                error: None,
                summary: "stopped".to_string(),
                exit_code: 143,
                repaired_by: None,
            }],
            Condition::none(),
        )
        .expect("a waiting run is stopped");
    let view = journal.view().expect("view");
    assert_eq!(view.queue_active("q").expect("a"), vec![first]);
    assert_eq!(view.queue_waiting("q", 10).expect("w"), vec![third]);
    drop(view);
    journal
        .append(
            first,
            vec![Event::Terminal {
                state: TerminalState::Failed,
                error: Some("x".to_string()),
                summary: "failed".to_string(),
                exit_code: 1,
                repaired_by: None,
            }],
            Condition::none(),
        )
        .expect("ends");
    let view = journal.view().expect("view");
    assert!(
        view.queue_active("q").expect("a").is_empty(),
        "its slot is free"
    );
    drop(view);
    journal
        .append(third, vec![queue_admitted()], Condition::none())
        .expect("the next takes the freed slot");
}
