//! The checks of the journal's own state that stay on in every build: a batch that meets a state
//! the journal does not write is refused with `AppendError::Inconsistent`, nothing written, and
//! the handle goes on; never a panic. None of these tests relies on `debug_assertions`, so they
//! hold in an optimized build too (`cargo test --release --lib invariants`).

use super::*;
use crate::journal::format::error::Inconsistency;
use crate::journal::format::snapshot::encode_snapshot_for_tests;
use crate::journal::write::append::{check_slot_taken_by_admission, judge};
use crate::journal::write::commit::{Answer, one_answer_per_batch};
use crate::state::ShapeRule;

/// Writes `state` as the run's stored snapshot, behind the journal's back.
fn write_snapshot(journal: &Journal, run: RunId, state: &RunState) {
    let bytes = encode_snapshot_for_tests(state).expect("the state encodes");
    let db = journal.database().expect("a handle");
    let txn = db.begin_write().expect("a write begins");
    txn.open_table(tables::RUNS)
        .expect("runs opens")
        .insert(&run.to_bytes(), bytes.as_slice())
        .expect("written");
    txn.commit().expect("commits");
}

fn stored_records(journal: &Journal, run: RunId) -> Vec<Record> {
    journal
        .view()
        .expect("a view opens")
        .records(run)
        .expect("the records read")
}

#[test]
fn a_snapshot_left_behind_its_records_refuses_the_batch_rather_than_replace_a_record() {
    let (_dir, journal) = new_journal();
    let run = create(&journal, None, None);
    let started = journal
        .append(run, vec![runner_started("i")], Condition::none())
        .expect("the runner starts");
    journal
        .append(run, vec![step_running(0)], Condition::none())
        .expect("the step starts");
    // A copy of the state at head 2 written back: it has a snapshot's shape, so only the
    // records can tell that it is behind them.
    write_snapshot(&journal, run, &started.state);
    let records = stored_records(&journal, run);
    let before = contents(&journal);

    // Legal against the stale state, and it would take seq 3.
    let error = journal
        .append(run, vec![step_running(0)], Condition::none())
        .expect_err("the batch would replace record 3");
    assert!(
        matches!(
            &error,
            AppendError::Inconsistent {
                run: found,
                broken: Inconsistency::SeqTaken { head: 2, seq: 3 },
            } if *found == run
        ),
        "{error:?}"
    );
    assert!(error.to_string().contains("nothing was written"), "{error}");
    assert_eq!(
        stored_records(&journal, run),
        records,
        "record 3 is as it was"
    );
    assert_eq!(contents(&journal), before);

    // The handle goes on: another run appends as ever.
    let other = create(&journal, None, None);
    journal
        .append(other, vec![runner_started("j")], Condition::none())
        .expect("another run's batch lands");
}

#[test]
fn a_refused_inconsistent_batch_spends_its_writer_seq_like_any_judged_refusal() {
    let (_dir, journal) = new_journal();
    let writer = WriterId(91);
    let run = RunId::generate();
    commit_one(&journal, &batch(run, vec![run_created(None)], writer, 1)).expect("created");
    let started =
        commit_one(&journal, &batch(run, vec![runner_started("i")], writer, 2)).expect("started");
    commit_one(&journal, &batch(run, vec![step_running(0)], writer, 3)).expect("running");
    write_snapshot(&journal, run, &started.state);

    let refused = batch(run, vec![step_running(0)], writer, 4);
    let error = commit_one(&journal, &refused).expect_err("refused");
    assert!(
        matches!(error, AppendError::Inconsistent { .. }),
        "{error:?}"
    );
    // Judged in a committed transaction: a copy of it handed to another committer later is
    // not judged again.
    let again = commit_one(&journal, &refused).expect_err("the seq was spent");
    assert!(
        matches!(again, AppendError::WriterSeqReused { writer_seq: 4, .. }),
        "{again:?}"
    );
}

#[test]
fn a_batch_that_folds_to_a_state_without_a_snapshots_shape_is_refused_not_stored() {
    // A state no reducer makes (running, but no runner), as a fault of the reducer would
    // leave it: the batch folded from it is judged, and refused.
    let run = RunId::generate();
    let record = |seq: u64, event: Event| Record {
        format_version: crate::event::FORMAT_VERSION,
        run_id: run,
        seq,
        time_ms: now_ms(),
        writer: WriterId(5),
        writer_seq: seq,
        event,
    };
    let mut running = state::apply(None, &record(1, run_created(None))).expect("created");
    for (seq, event) in [(2, runner_started("i")), (3, step_running(0))] {
        running.apply_mut(&record(seq, event)).expect("legal");
    }
    let mut broken = running;
    broken.runner = None;

    let update = Batch {
        run,
        events: vec![Event::Dismissed { at_ms: now_ms() }],
        condition: Condition::none(),
        writer: WriterId(5),
        writer_seq: 4,
        time_ms: now_ms(),
        private: None,
    };
    let error = match judge(Some(broken), &update) {
        Ok(_) => panic!("a batch folding to a state without a snapshot's shape was accepted"),
        Err(error) => error,
    };
    assert!(
        matches!(
            &error,
            AppendError::Inconsistent {
                broken: Inconsistency::Shape(shape),
                ..
            } if shape.rule() == ShapeRule::RunningHasRunner
        ),
        "{error:?}"
    );
    assert!(
        error.to_string().contains("running without a runner"),
        "{error}"
    );
}

#[test]
fn a_group_short_of_an_answer_answers_every_caller_rather_than_leave_one_waiting() {
    let runs = [RunId::generate(), RunId::generate(), RunId::generate()];
    let answered = |run: RunId| Answer {
        result: Err(AppendError::UnknownRun { run }),
        refused_against: None,
        was_retried: false,
    };
    let answers = one_answer_per_batch(vec![answered(runs[0])], &runs);
    assert_eq!(answers.len(), 3);
    assert!(matches!(
        answers[0].result,
        Err(AppendError::UnknownRun { .. })
    ));
    for (answer, run) in answers[1..].iter().zip(&runs[1..]) {
        assert!(
            matches!(&answer.result, Err(AppendError::Unanswered { run: found }) if found == run),
            "{:?}",
            answer.result
        );
    }
    let too_many =
        one_answer_per_batch(runs.iter().map(|&run| answered(run)).collect(), &runs[..1]);
    assert_eq!(too_many.len(), 1, "an answer beyond the group is dropped");
}

/// A queue's slot is taken only through an admission recorded in the batch, which is judged
/// against the queue's limit: a batch that would give a run a slot otherwise (a state no
/// reducer makes: admitted in an earlier batch, yet holding no slot before this one) is refused.
#[test]
fn a_slot_is_never_taken_without_the_admission_judged_against_the_queue_limit() {
    let (_dir, journal) = new_journal();
    journal.set_queue_limit("q", 1).expect("the limit is set");
    let run = RunId::generate();
    let writer = WriterId(33);
    let joined = Event::QueueJoined {
        queue: "q".to_string(),
        idle_timeout_ms: None,
        heartbeat_ms: None,
    };
    commit_one(
        &journal,
        &batch(run, vec![run_created(None), joined], writer, 1),
    )
    .expect("joined");
    let admitted = commit_one(
        &journal,
        &batch(
            run,
            vec![Event::QueueAdmitted {
                by: "test".to_string(),
            }],
            writer,
            2,
        ),
    )
    .expect("admitted");
    let holding = &admitted.state;
    assert!(holding.holds_slot());

    // (held a slot before, was admitted before) → refused?
    for (held_slot, was_admitted, is_refused) in [
        (false, false, false), // admitted in this batch: judged against the limit
        (true, true, false),   // held its slot already
        (false, true, true),   // a slot out of nowhere
    ] {
        let judged = check_slot_taken_by_admission(run, held_slot, was_admitted, holding);
        match judged {
            Err(AppendError::Inconsistent {
                broken: Inconsistency::SlotWithoutAdmission { queue },
                ..
            }) => assert!(is_refused && queue == "q", "{held_slot} {was_admitted}"),
            Ok(()) => assert!(!is_refused, "{held_slot} {was_admitted}: accepted"),
            Err(other) => panic!("{held_slot} {was_admitted}: {other:?}"),
        }
    }
}
