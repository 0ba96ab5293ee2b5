//! Refusals write nothing.

use super::*;

#[test]
fn an_illegal_transition_is_refused_with_its_index_and_writes_nothing() {
    let (_dir, journal) = new_journal();
    let run = create(&journal, Some("n"), Some("t"));
    let before = contents(&journal);

    let error = journal
        .append(run, vec![step_running(0)], Condition::none())
        .expect_err("a step cannot start before the runner");
    assert!(
        matches!(
            &error,
            AppendError::Transition {
                index: 0,
                source: TransitionError::StepStartWhileNotRunning {
                    step: 0,
                    state: RunStatus::Queued,
                    ..
                },
            }
        ),
        "{error:?}"
    );
    assert!(error.to_string().contains("event 0"), "{error}");
    assert_eq!(contents(&journal), before);
}

#[test]
fn a_batch_whose_later_event_is_illegal_leaves_no_trace_of_the_legal_ones() {
    let (_dir, journal) = new_journal();
    let run = create(&journal, Some("n"), Some("t"));
    let before = contents(&journal);

    let error = journal
        .append(
            run,
            vec![
                runner_started("i"),
                step_running(0),
                // Step 0 is running, not pending: illegal.
                step_running(0),
                terminal(TerminalState::Failed),
            ],
            Condition::none(),
        )
        .expect_err("the third event is illegal");
    assert!(
        matches!(
            &error,
            AppendError::Transition {
                index: 2,
                source: TransitionError::StepNotPending { step: 0, .. },
            }
        ),
        "{error:?}"
    );
    assert_eq!(
        contents(&journal),
        before,
        "nothing of the batch was written"
    );
    let view = journal.view().expect("a view opens");
    let state = view.snapshot(run).expect("reads").expect("the run exists");
    assert_eq!((state.status, state.head_seq), (RunStatus::Queued, 1));
    assert_eq!(seqs(&view.records(run).expect("records read")), vec![1]);
    assert_eq!(view.global_head().expect("the log head reads"), 1);
    drop(view);

    // The refused batch did not leave the run in a state that refuses its legal prefix.
    let appended = journal
        .append(run, vec![runner_started("i")], Condition::expect_head(1))
        .expect("the legal event alone is appended");
    assert_eq!(appended.first_seq, 2);
}

#[test]
fn appending_to_an_unknown_run_is_refused_and_writes_nothing() {
    let (_dir, journal) = new_journal();
    create(&journal, None, None);
    let before = contents(&journal);
    let stranger = RunId::generate();
    let error = journal
        .append(stranger, vec![runner_started("i")], Condition::none())
        .expect_err("the run does not exist");
    assert!(
        matches!(&error, AppendError::UnknownRun { run } if *run == stranger),
        "{error:?}"
    );
    assert!(error.to_string().contains(&stranger.to_string()), "{error}");
    assert_eq!(contents(&journal), before);
    let view = journal.view().expect("a view opens");
    assert_eq!(view.snapshot(stranger).expect("the snapshot reads"), None);
}

#[test]
fn an_empty_batch_is_refused_and_writes_nothing() {
    let (_dir, journal) = new_journal();
    let run = create(&journal, None, None);
    let before = contents(&journal);
    for target in [run, RunId::generate()] {
        let error = journal
            .append(target, Vec::new(), Condition::none())
            .expect_err("an empty batch is refused");
        assert!(matches!(error, AppendError::EmptyBatch), "{error:?}");
    }
    assert_eq!(contents(&journal), before);
}

#[test]
fn creating_a_run_twice_under_the_same_id_is_refused() {
    let (_dir, journal) = new_journal();
    let run = RunId::generate();
    journal
        .append(run, vec![run_created(None)], Condition::expect_head(0))
        .expect("a new run is created");
    let before = contents(&journal);
    let error = journal
        .append(run, vec![run_created(None)], Condition::expect_head(0))
        .expect_err("the run exists");
    assert!(
        matches!(
            &error,
            AppendError::HeadMismatch { run: found, expected: 0, found: 1 } if *found == run
        ),
        "{error:?}"
    );
    let error = journal
        .append(run, vec![run_created(None)], Condition::none())
        .expect_err("the run exists");
    assert!(
        matches!(
            &error,
            AppendError::Transition {
                index: 0,
                source: TransitionError::AlreadyCreated { .. }
            }
        ),
        "{error:?}"
    );
    assert_eq!(contents(&journal), before);
}

#[test]
fn a_wrong_expected_head_is_refused_and_writes_nothing() {
    let (_dir, journal) = new_journal();
    let run = create(&journal, None, None);
    journal
        .append(run, vec![runner_started("i")], Condition::none())
        .expect("a legal transition is appended");
    let before = contents(&journal);
    for expected in [0, 1, 3] {
        let error = journal
            .append(run, vec![step_running(0)], Condition::expect_head(expected))
            .expect_err("the head is 2");
        assert!(
            matches!(
                &error,
                AppendError::HeadMismatch { run: found_run, expected: e, found: 2 }
                    if *found_run == run && *e == expected
            ),
            "{error:?}"
        );
        assert!(
            error.to_string().contains("someone appended first"),
            "{error}"
        );
    }
    assert_eq!(contents(&journal), before);
    journal
        .append(run, vec![step_running(0)], Condition::expect_head(2))
        .expect("the right head is accepted");
}

#[test]
fn expect_not_terminal_on_a_terminal_run_is_refused_and_writes_nothing() {
    let (_dir, journal) = new_journal();
    let run = create(&journal, None, None);
    journal
        .append(
            run,
            vec![runner_started("i"), terminal(TerminalState::Stopped)],
            Condition::none(),
        )
        .expect("a legal batch is appended");
    let before = contents(&journal);
    // ProcessTerminalObserved is legal after Terminal; only the condition refuses it.
    let error = journal
        .append(
            run,
            vec![process_gone("i", Proof::Observed, Observer::RunnerParent)],
            Condition::expect_head(3).and_not_terminal(),
        )
        .expect_err("the run is terminal");
    assert!(
        matches!(
            &error,
            AppendError::AlreadyTerminal { run: found, state: RunStatus::Stopped } if *found == run
        ),
        "{error:?}"
    );
    assert!(error.to_string().contains("already stopped"), "{error}");
    assert_eq!(contents(&journal), before);
    journal
        .append(
            run,
            vec![process_gone("i", Proof::Observed, Observer::RunnerParent)],
            Condition::expect_head(3),
        )
        .expect("without the condition the event is legal");
}

#[test]
fn two_handles_racing_a_conditional_terminal_record_exactly_one() {
    let dir = tempfile::tempdir().expect("a temporary directory can be created");
    let path = journal_path(&dir);
    let runner_side = Journal::open(&path).expect("the journal opens");
    let reconciler_side = Journal::open(&path).expect("a second handle opens the same file");
    assert_ne!(runner_side.writer(), reconciler_side.writer());

    for round in 0..8 {
        let run = create(&runner_side, None, None);
        runner_side
            .append(
                run,
                vec![runner_started("i"), step_running(0)],
                Condition::none(),
            )
            .expect("a legal batch is appended");
        let barrier = Barrier::new(2);
        let (by_runner, by_reconciler) = std::thread::scope(|scope| {
            let runner = scope.spawn(|| {
                barrier.wait();
                runner_side.append(
                    run,
                    vec![terminal(TerminalState::Stopped)],
                    Condition::expect_not_terminal(),
                )
            });
            let reconciler = scope.spawn(|| {
                barrier.wait();
                reconciler_side.append(
                    run,
                    vec![repaired_failure()],
                    Condition::expect_not_terminal(),
                )
            });
            (
                runner.join().expect("the runner thread does not panic"),
                reconciler
                    .join()
                    .expect("the reconciler thread does not panic"),
            )
        });
        let (winner_state, loser_error) = match (by_runner, by_reconciler) {
            (Ok(won), Err(lost)) => (won.state.status, lost),
            (Err(lost), Ok(won)) => (won.state.status, lost),
            other => panic!("round {round}: exactly one Terminal must win, got {other:?}"),
        };
        assert!(
            matches!(
                &loser_error,
                AppendError::AlreadyTerminal { run: found, state } if *found == run && *state == winner_state
            ),
            "round {round}: {loser_error:?}"
        );
        // Both handles see the same single outcome.
        for journal in [&runner_side, &reconciler_side] {
            let view = journal.view().expect("a view opens");
            let records = view.records(run).expect("records read");
            let terminals = records
                .iter()
                .filter(|record| matches!(record.event, Event::Terminal { .. }))
                .count();
            assert_eq!(terminals, 1, "round {round}");
            assert_eq!(seqs(&records), vec![1, 2, 3, 4]);
            let state = view.snapshot(run).expect("reads").expect("the run exists");
            assert_eq!(state.status, winner_state);
            assert_eq!(
                Some(&state),
                state::replay(&records)
                    .expect("the records replay")
                    .as_ref()
            );
        }
    }
}
