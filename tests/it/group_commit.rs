//! Group commit through one journal handle: many callers, one writer, few commits.
//!
//! The journal here lives in a real file, opened through a backend that can hold redb's syncs
//! at a gate: while the writer's commit is held, appends pile up in the queue, so the group the
//! writer takes next is known exactly, whatever the speed of the disk or the machine. No test
//! asserts a time.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use runjournal::event::{
    ControlAction, Event, ExternalJobStatus, JobState, Mode, Observer, ProcessIdentity, Proof,
    RunId, RunSpec, StepAction, StepSpec, TerminalState,
};
use runjournal::journal::instrumented::{DiskCounters, InstrumentedFile, SyncGate};
use runjournal::journal::{AppendError, Appended, Condition, WriterOptions};
use runjournal::state::TransitionError;
use runjournal::testkit as kit;
use runjournal::{HostIds, Journal, state};

/// Bounds only the wait for callers to reach the gate, so a broken test fails instead of
/// hanging; nothing is asserted about how long anything takes.
const GATE_PATIENCE: Duration = Duration::from_secs(120);

fn spec() -> RunSpec {
    kit::spec(
        Mode::Single,
        vec![kit::step("deploy", kit::provider("./provider.sh"))],
    )
}

fn created() -> Event {
    kit::created(spec(), runjournal::event::now_ms(), HostIds::default())
}

fn runner_started() -> Event {
    kit::runner_started(kit::identity(4242), "instance-1")
}

fn step_running() -> Event {
    kit::step_running(0, None)
}

fn job_update(progress: u32) -> Event {
    kit::job_updated(
        0,
        kit::job(JobState::Running, "job-1", Some(f64::from(progress))),
    )
}

fn terminal() -> Event {
    kit::terminal(
        TerminalState::Failed,
        1,
        "stopped",
        Some("stopped by the test"),
    )
}

/// A journal in `dir` whose syncs pass `gate`, with these writer options.
fn gated_journal(dir: &Path, gate: &Arc<SyncGate>, options: WriterOptions) -> Journal {
    let source = InstrumentedFile::source(
        dir.join("journal.redb"),
        Arc::new(DiskCounters::default()),
        Some(Arc::clone(gate)),
    );
    Journal::open_with(source, options).expect("the journal opens")
}

/// A run whose step is running, ready for job updates.
fn running_run(journal: &Journal) -> RunId {
    let run = RunId::generate();
    journal
        .append(
            run,
            vec![created(), runner_started(), step_running()],
            Condition::expect_head(0),
        )
        .expect("a legal first batch is appended");
    run
}

fn commits(journal: &Journal) -> u64 {
    journal.writer_stats().commits.load(Ordering::Relaxed)
}

fn batches(journal: &Journal) -> u64 {
    journal.writer_stats().batches.load(Ordering::Relaxed)
}

/// Waits (bounded) until `count` appends in all have been queued.
fn wait_until_submitted(journal: &Journal, count: u64) {
    for _ in 0..1_000_000 {
        if journal.writer_stats().submitted.load(Ordering::Relaxed) >= count {
            return;
        }
        std::thread::yield_now();
        std::thread::sleep(Duration::from_micros(100));
    }
    panic!("{count} appends were never queued");
}

/// Every record of `run` folds to its stored snapshot.
fn assert_snapshot_is_the_fold(journal: &Journal, run: RunId) {
    let view = journal.view().expect("a view opens");
    let records = view.records(run).expect("the records read");
    let snapshot = view.snapshot(run).expect("the snapshot reads");
    assert_eq!(
        snapshot,
        state::replay(&records).expect("the records fold"),
        "run {run}"
    );
}

#[test]
fn two_hundred_fifty_six_appenders_each_get_their_own_answer_from_two_commits() {
    const APPENDERS: usize = 256;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let gate = Arc::new(SyncGate::default());
    let journal = gated_journal(dir.path(), &gate, WriterOptions::default());
    let runs: Vec<RunId> = (0..=APPENDERS).map(|_| running_run(&journal)).collect();
    let (commits_before, batches_before) = (commits(&journal), batches(&journal));
    let submitted_before = journal.writer_stats().submitted.load(Ordering::Relaxed);

    // The first append's commit is held at the gate; the 256 others queue up behind it.
    let barrier = Barrier::new(APPENDERS);
    gate.close();
    let answers: Vec<(RunId, Result<Appended, AppendError>)> = std::thread::scope(|scope| {
        let (journal, runs, barrier) = (&journal, &runs, &barrier);
        let first =
            scope.spawn(move || journal.append(runs[0], vec![job_update(1)], Condition::none()));
        assert!(
            gate.wait_until_held(1, GATE_PATIENCE),
            "the first commit reached its sync"
        );
        let handles: Vec<_> = runs[1..]
            .iter()
            .enumerate()
            .map(|(index, &run)| {
                scope.spawn(move || {
                    barrier.wait();
                    let progress = u32::try_from(index).expect("few appenders") + 2;
                    (
                        run,
                        journal.append(run, vec![job_update(progress)], Condition::none()),
                    )
                })
            })
            .collect();
        wait_until_submitted(journal, submitted_before + 1 + APPENDERS as u64);
        gate.open();
        let mut answers = vec![(runs[0], first.join().expect("no panic"))];
        answers.extend(
            handles
                .into_iter()
                .map(|handle| handle.join().expect("no panic")),
        );
        answers
    });

    for (run, answer) in &answers {
        let appended = answer.as_ref().expect("every legal append is acknowledged");
        assert_eq!(
            appended.run, *run,
            "each caller is answered for its own run"
        );
        assert_eq!((appended.first_seq, appended.last_seq), (4, 4));
        assert!(!appended.was_duplicate);
        assert_snapshot_is_the_fold(&journal, *run);
    }
    // One commit for the first append, one for the 256 that waited behind it.
    assert_eq!(commits(&journal) - commits_before, 2);
    assert_eq!(batches(&journal) - batches_before, 1 + APPENDERS as u64);
}

#[test]
fn a_refused_batch_in_a_group_fails_only_its_caller() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let gate = Arc::new(SyncGate::default());
    let journal = gated_journal(dir.path(), &gate, WriterOptions::default());
    let holder = running_run(&journal);
    let [before_mate, refused_run, after_mate] = [(); 3].map(|()| running_run(&journal));
    let refused_head = journal
        .view()
        .expect("a view")
        .records(refused_run)
        .expect("records")
        .len();
    let commits_before = commits(&journal);

    gate.close();
    let (held, group) = std::thread::scope(|scope| {
        let journal = &journal;
        let held =
            scope.spawn(move || journal.append(holder, vec![job_update(1)], Condition::none()));
        assert!(
            gate.wait_until_held(1, GATE_PATIENCE),
            "the first commit is held"
        );
        let submitted = journal.writer_stats().submitted.load(Ordering::Relaxed);
        let group = scope.spawn(move || {
            journal.append_all([
                (before_mate, vec![job_update(2)], Condition::none()),
                // Illegal: the runner of this run has already started.
                (
                    refused_run,
                    vec![job_update(3), runner_started()],
                    Condition::none(),
                ),
                // A failed condition is a refusal too.
                (after_mate, vec![job_update(4)], Condition::expect_head(99)),
                (after_mate, vec![job_update(5)], Condition::none()),
            ])
        });
        wait_until_submitted(journal, submitted + 4);
        gate.open();
        (
            held.join().expect("no panic"),
            group.join().expect("no panic"),
        )
    });

    held.expect("the held append lands");
    assert_eq!(group.len(), 4);
    assert_eq!(group[0].as_ref().expect("legal").last_seq, 4);
    assert!(
        matches!(
            &group[1],
            Err(AppendError::Transition {
                index: 1,
                source: TransitionError::RunnerNotQueued { .. }
            })
        ),
        "{:?}",
        group[1]
    );
    assert!(
        matches!(
            &group[2],
            Err(AppendError::HeadMismatch {
                expected: 99,
                found: 3,
                ..
            })
        ),
        "{:?}",
        group[2]
    );
    assert_eq!(group[3].as_ref().expect("legal").last_seq, 4);
    // The refused batch wrote nothing, not even its legal first event.
    let view = journal.view().expect("a view");
    assert_eq!(
        view.records(refused_run).expect("records").len(),
        refused_head
    );
    drop(view);
    for run in [holder, before_mate, refused_run, after_mate] {
        assert_snapshot_is_the_fold(&journal, run);
    }
    // The held append, then the four batches in one transaction.
    assert_eq!(commits(&journal) - commits_before, 2);
}

#[test]
fn a_group_is_bounded_by_its_events_and_an_oversized_batch_goes_alone() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let gate = Arc::new(SyncGate::default());
    let options = WriterOptions {
        max_group_events: 7,
        ..WriterOptions::default()
    };
    let journal = gated_journal(dir.path(), &gate, options);
    let holder = running_run(&journal);
    let runs: Vec<RunId> = (0..6).map(|_| running_run(&journal)).collect();
    let commits_before = commits(&journal);
    let three_updates = |first: u32| (first..first + 3).map(job_update).collect::<Vec<_>>();

    gate.close();
    let results = std::thread::scope(|scope| {
        let journal = &journal;
        let held =
            scope.spawn(move || journal.append(holder, vec![job_update(1)], Condition::none()));
        assert!(
            gate.wait_until_held(1, GATE_PATIENCE),
            "the first commit is held"
        );
        let submitted = journal.writer_stats().submitted.load(Ordering::Relaxed);
        let runs = &runs;
        let group = scope.spawn(move || {
            let mut batches: Vec<_> = runs[..4]
                .iter()
                .map(|&run| (run, three_updates(10), Condition::none()))
                .collect();
            // Ten events: over the bound on its own.
            batches.push((
                runs[4],
                (20..30).map(job_update).collect(),
                Condition::none(),
            ));
            batches.push((runs[5], three_updates(40), Condition::none()));
            journal.append_all(batches)
        });
        wait_until_submitted(journal, submitted + 6);
        gate.open();
        held.join()
            .expect("no panic")
            .expect("the held append lands");
        group.join().expect("no panic")
    });

    for result in &results {
        result.as_ref().expect("every batch is legal");
    }
    // Held: 1 commit. Then 3+3 | 3+3 | 10 alone | 3: four commits for six batches.
    assert_eq!(commits(&journal) - commits_before, 1 + 4);
    for &run in &runs {
        assert_snapshot_is_the_fold(&journal, run);
    }
}

#[test]
fn each_run_keeps_its_callers_order_under_many_concurrent_appenders() {
    const APPENDERS: usize = 32;
    const UPDATES: u32 = 20;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let journal = Journal::open(dir.path().join("journal.redb")).expect("the journal opens");
    let runs: Vec<RunId> = (0..APPENDERS).map(|_| running_run(&journal)).collect();
    let barrier = Barrier::new(APPENDERS);
    let answers: BTreeMap<RunId, Vec<Appended>> = std::thread::scope(|scope| {
        let handles: Vec<_> = runs
            .iter()
            .map(|&run| {
                let (journal, barrier) = (&journal, &barrier);
                scope.spawn(move || {
                    barrier.wait();
                    let answers: Vec<Appended> = (0..UPDATES)
                        .map(|progress| {
                            journal
                                .append(run, vec![job_update(progress)], Condition::none())
                                .expect("a legal update is acknowledged")
                        })
                        .collect();
                    (run, answers)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|handle| handle.join().expect("no panic"))
            .collect()
    });

    let view = journal.view().expect("a view");
    for (run, answers) in &answers {
        let seqs: Vec<u64> = answers.iter().map(|appended| appended.last_seq).collect();
        assert_eq!(
            seqs,
            (4..4 + u64::from(UPDATES)).collect::<Vec<_>>(),
            "run {run}"
        );
        let progress: Vec<f64> = view
            .records(*run)
            .expect("records")
            .iter()
            .filter_map(|record| match &record.event {
                Event::ExternalJobUpdated { job, .. } => job.progress,
                _ => None,
            })
            .collect();
        assert_eq!(
            progress,
            (0..UPDATES).map(f64::from).collect::<Vec<_>>(),
            "run {run}: the records are in the caller's order"
        );
    }
    drop(view);
    for &run in &runs {
        assert_snapshot_is_the_fold(&journal, run);
    }
}

#[test]
fn append_all_keeps_the_order_given_for_one_run_across_a_refusal() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let journal = Journal::open(dir.path().join("journal.redb")).expect("the journal opens");
    let run = RunId::generate();
    let results = journal.append_all([
        (run, vec![created()], Condition::expect_head(0)),
        (run, vec![runner_started()], Condition::expect_head(1)),
        // Refused: the runner already started. The batches after it still land, in order.
        (run, vec![runner_started()], Condition::none()),
        (run, vec![step_running()], Condition::expect_head(2)),
        (run, vec![terminal()], Condition::expect_not_terminal()),
        (run, vec![job_update(1)], Condition::none()),
    ]);
    let seqs: Vec<Option<u64>> = results
        .iter()
        .map(|result| result.as_ref().ok().map(|appended| appended.last_seq))
        .collect();
    assert_eq!(seqs, vec![Some(1), Some(2), None, Some(3), Some(4), None]);
    assert!(matches!(
        results[2],
        Err(AppendError::Transition {
            source: TransitionError::RunnerNotQueued { .. },
            ..
        })
    ));
    assert!(matches!(results[5], Err(AppendError::Transition { .. })));
    assert_snapshot_is_the_fold(&journal, run);
}

/// A run of `MAX_STEPS` external-job steps, each with its provider text at the step limit.
fn huge_spec() -> RunSpec {
    let steps = (0..runjournal::event::MAX_STEPS)
        .map(|index| StepSpec {
            name: format!("{index}"),
            action: StepAction::ExternalJob {
                provider: "p".repeat(runjournal::event::MAX_STEP_BYTES - 4),
            },
        })
        .collect();
    RunSpec {
        name: None,
        mode: Mode::Parallel,
        concurrency: u32::try_from(runjournal::event::MAX_STEPS).expect("few steps"),
        timeout_ms: None,
        cwd: None,
        steps,
    }
}

fn big_text(c: &str) -> String {
    c.repeat(runjournal::event::MAX_TEXT_BYTES)
}

fn big_process() -> ProcessIdentity {
    ProcessIdentity {
        pid: 4243,
        start_time: 2,
        boot_id: big_text("b"),
        pid_namespace: None,
    }
}

#[test]
fn a_run_with_every_text_at_its_limit_is_journaled_and_its_snapshot_reads_back() {
    // Such a run's snapshot is over 2 MiB. Snapshots used to be refused when written over
    // 2 MiB (after the batch's records were already in the transaction) and when read over
    // 1 MiB: the run could then never end.
    let dir = tempfile::tempdir().expect("a temporary directory");
    let journal = Journal::open(dir.path().join("journal.redb")).expect("the journal opens");
    let run = RunId::generate();
    let create = Event::RunCreated {
        spec: Arc::new(huge_spec()),
        created_at_ms: runjournal::event::now_ms(),
        session_id: Some(big_text("s")),
        completion_owner_id: Some(big_text("o")),
        tool_call_id: Some(big_text("t")),
    };
    let started = Event::RunnerStarted {
        runner: big_process(),
        instance_id: big_text("n"),
    };
    journal
        .append(run, vec![create, started], Condition::none())
        .expect("the run is created");
    let steps = u32::try_from(runjournal::event::MAX_STEPS).expect("few steps");
    for first in (0..steps).step_by(32) {
        let events = (first..first + 32)
            .flat_map(|step| {
                [
                    Event::StepRunning {
                        step,
                        process: Some(big_process()),
                    },
                    Event::ExternalJobUpdated {
                        step,
                        job: ExternalJobStatus {
                            state: JobState::Running,
                            id: Some(big_text("i")),
                            progress: None,
                            message: Some(big_text("m")),
                            url: Some(big_text("u")),
                        },
                    },
                ]
            })
            .collect();
        journal
            .append(run, events, Condition::none())
            .unwrap_or_else(|error| panic!("steps from {first} start: {error}"));
    }
    for action in [
        ControlAction::Interrupt,
        ControlAction::Timeout,
        ControlAction::Stop,
    ] {
        journal
            .append(
                run,
                vec![Event::ControlRequested {
                    action,
                    by: big_text("y"),
                    reason: big_text("r"),
                }],
                Condition::none(),
            )
            .expect("a control request is journaled");
    }
    let last = journal
        .append(
            run,
            vec![
                // Every running step takes this error.
                Event::Terminal {
                    state: TerminalState::Stopped,
                    error: Some(big_text("e")),
                    summary: big_text("z"),
                    exit_code: 143,
                    repaired_by: None,
                },
                Event::ProcessTerminalObserved {
                    instance_id: big_text("n"),
                    exit: None,
                    proof: Proof::Observed,
                    observer: Observer::RunnerParent,
                },
            ],
            Condition::none(),
        )
        .expect("the run ends");
    assert!(last.state.is_closed());
    assert_snapshot_is_the_fold(&journal, run);
}
