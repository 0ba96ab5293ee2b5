//! Resume links.

use super::*;

/// A run that ran, was interrupted and ended paused, its runner seen gone.
fn paused_run(journal: &Journal) -> RunId {
    let run = create(journal, Some("long"), None);
    journal
        .append(
            run,
            vec![
                runner_started("i1"),
                step_running(0),
                terminal(TerminalState::Paused),
                process_gone("i1", Proof::Observed, Observer::RunnerParent),
            ],
            Condition::expect_head(1),
        )
        .expect("the run ends paused");
    run
}

fn resume_of(journal: &Journal, from: RunId) -> Result<Appended, AppendError> {
    journal.create_run_with(
        spec(Some("long")),
        host_ids(None),
        vec![Event::Resumed { from }],
    )
}

#[test]
fn a_resume_links_the_paused_run_and_the_new_one_both_ways() {
    let (_dir, journal) = new_journal();
    let old = paused_run(&journal);
    let new = resume_of(&journal, old).expect("a paused run is resumed");
    assert_eq!((new.first_seq, new.last_seq), (1, 2));
    assert_eq!(new.state.status, RunStatus::Queued);
    let view = journal.view().expect("a view");
    assert_eq!(
        view.resume_links(old).expect("links"),
        ResumeLinks {
            resumed_from: None,
            resumed_by: Some(new.run),
        }
    );
    assert_eq!(
        view.resume_links(new.run).expect("links"),
        ResumeLinks {
            resumed_from: Some(old),
            resumed_by: None,
        }
    );
    assert_eq!(view.resumes().expect("the index"), vec![(old, new.run)]);
    // The paused run's records and state are as they were.
    assert_eq!(view.records(old).expect("records").len(), 5);
    assert_eq!(
        view.snapshot(old).expect("read").expect("a run").status,
        RunStatus::Paused
    );
}

#[test]
fn a_run_is_resumed_once_and_only_when_paused() {
    let (_dir, journal) = new_journal();
    let old = paused_run(&journal);
    let first = resume_of(&journal, old).expect("the first resume lands");
    let refused = |result: Result<Appended, AppendError>| match result {
        Err(AppendError::Resume { refusal, .. }) => refusal,
        other => panic!("expected a resume refusal, got {other:?}"),
    };
    assert_eq!(
        refused(resume_of(&journal, old)),
        ResumeRefusal::AlreadyResumed { by: first.run }
    );
    // The new run is queued, not paused.
    assert_eq!(
        refused(resume_of(&journal, first.run)),
        ResumeRefusal::NotPaused {
            state: RunStatus::Queued
        }
    );
    let complete = create(&journal, None, None);
    journal
        .append(
            complete,
            successful_lifecycle("i2"),
            Condition::expect_head(1),
        )
        .expect("the run completes");
    assert_eq!(
        refused(resume_of(&journal, complete)),
        ResumeRefusal::NotPaused {
            state: RunStatus::Complete
        }
    );
    assert_eq!(
        refused(resume_of(&journal, RunId::from_bytes([9; 16]))),
        ResumeRefusal::Unknown
    );
    // Nothing of the refused creations was written.
    let view = journal.view().expect("a view");
    assert_eq!(view.all_runs().expect("runs").len(), 3);
    assert_eq!(view.resumes().expect("the index"), vec![(old, first.run)]);
}

#[test]
fn two_resumes_of_one_run_in_one_transaction_link_it_once() {
    let (dir, journal) = new_journal();
    let old = paused_run(&journal);
    drop(journal);
    let db = redb::Database::builder()
        .create(journal_path(&dir))
        .expect("the journal opens");
    let batch = |seq: u64| super::Batch {
        run: RunId::generate(),
        events: vec![run_created(None), Event::Resumed { from: old }],
        condition: Condition::expect_head(0),
        writer: WriterId(77),
        writer_seq: seq,
        time_ms: now_ms(),
        private: None,
    };
    let results = commit_batches(&db, &[batch(1), batch(2)]).expect("the group commits");
    assert!(results[0].is_ok(), "{:?}", results[0]);
    assert!(
        matches!(
            &results[1],
            Err(AppendError::Resume {
                refusal: ResumeRefusal::AlreadyResumed { .. },
                ..
            })
        ),
        "{:?}",
        results[1]
    );
}

#[test]
fn pruning_a_resumed_run_takes_its_link_and_the_new_run_keeps_naming_it() {
    let (_dir, journal) = new_journal();
    let old = paused_run(&journal);
    let new = resume_of(&journal, old).expect("resumed");
    journal.prune(&[old], &[], now_ms()).expect("pruned");
    let view = journal.view().expect("a view");
    assert_eq!(view.resumes().expect("the index"), vec![]);
    assert_eq!(
        view.resume_links(new.run).expect("links").resumed_from,
        Some(old)
    );
    drop(view);
    // A pruned run is no longer there to resume.
    assert!(matches!(
        resume_of(&journal, old),
        Err(AppendError::Resume {
            refusal: ResumeRefusal::Unknown,
            ..
        })
    ));
}

/// What a launcher records when no runner took its run.
fn given_up() -> Vec<Event> {
    vec![
        Event::Terminal {
            state: TerminalState::Failed,
            error: Some("runner did not start".to_string()),
            summary: "the runner never started".to_string(),
            exit_code: 1,
            repaired_by: Some(Repairer::Launcher),
        },
        Event::ProcessTerminalObserved {
            instance_id: String::new(),
            exit: None,
            proof: Proof::NotStarted,
            observer: Observer::Launcher,
        },
    ]
}

#[test]
fn a_resume_whose_runner_never_started_gives_way_to_another() {
    let (_dir, journal) = new_journal();
    let old = paused_run(&journal);
    let unstarted = resume_of(&journal, old).expect("resumed");
    journal
        .append(unstarted.run, given_up(), Condition::expect_head(2))
        .expect("the launcher gives up");
    let again = resume_of(&journal, old).expect("a resume that ran nothing does not count");
    let view = journal.view().expect("a view");
    assert_eq!(view.resumes().expect("the index"), vec![(old, again.run)]);
    assert_eq!(
        view.resume_links(unstarted.run)
            .expect("links")
            .resumed_from,
        Some(old),
        "the run that never started still says what it was for"
    );
    drop(view);
    // One whose runner took it counts, ended or not.
    journal
        .append(
            again.run,
            vec![runner_started("i9"), terminal(TerminalState::Failed)],
            Condition::expect_head(2),
        )
        .expect("the resumed run ran and failed");
    assert!(matches!(
        resume_of(&journal, old),
        Err(AppendError::Resume {
            refusal: ResumeRefusal::AlreadyResumed { by },
            ..
        }) if by == again.run
    ));
}
