//! Unit tests of the journal: appends, the indexes, refusals, idempotency, format checks,
//! corruption detection and id resolution, each against a real redb file in a temporary
//! directory.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};

use redb::{ReadableDatabase, TableDefinition, TableHandle};
use tempfile::TempDir;

use super::append::commit_batches;
use super::snapshot::{SnapshotError, snapshot_of_layout_two_for_tests};
use super::tables::{self, META, RECORDS};
use super::*;
use crate::event::{
    Event, HostIds, Mode, Observer, ProcessExit, ProcessIdentity, Proof, Record, Repairer, RunId,
    RunIdError, RunSpec, StepAction, StepEnd, StepOutcome, StepSpec, TerminalState, UnixMs,
    WriterId, now_ms,
};
use crate::state::{self, RunState, RunStatus, TransitionError};

// ---------------------------------------------------------------------------------------------
// Fixtures
// ---------------------------------------------------------------------------------------------

fn journal_path(dir: &TempDir) -> PathBuf {
    dir.path().join("journal.redb")
}

fn new_journal() -> (TempDir, Journal) {
    let dir = tempfile::tempdir().expect("a temporary directory can be created");
    let journal = Journal::open(journal_path(&dir)).expect("a new journal opens");
    (dir, journal)
}

fn spec(name: Option<&str>) -> RunSpec {
    RunSpec {
        name: name.map(str::to_string),
        mode: Mode::Single,
        concurrency: 1,
        timeout_ms: None,
        cwd: None,
        steps: vec![StepSpec {
            name: "build".to_string(),
            action: StepAction::Command {
                argv: vec!["true".to_string()],
            },
        }],
    }
}

fn host_ids(tool_call_id: Option<&str>) -> HostIds {
    HostIds {
        session_id: Some("session-1".to_string()),
        completion_owner_id: None,
        tool_call_id: tool_call_id.map(str::to_string),
    }
}

fn create(journal: &Journal, name: Option<&str>, tool_call_id: Option<&str>) -> RunId {
    let appended = journal
        .create_run(spec(name), host_ids(tool_call_id))
        .expect("a valid run is created");
    assert_eq!((appended.first_seq, appended.last_seq), (1, 1));
    assert!(!appended.was_duplicate);
    appended.run
}

fn run_created(name: Option<&str>) -> Event {
    Event::RunCreated {
        spec: Arc::new(spec(name)),
        created_at_ms: now_ms(),
        session_id: None,
        completion_owner_id: None,
        tool_call_id: None,
    }
}

fn runner_identity() -> ProcessIdentity {
    ProcessIdentity {
        pid: 4242,
        start_time: 987_654,
        boot_id: "boot-a".to_string(),
        pid_namespace: None,
    }
}

fn runner_started(instance: &str) -> Event {
    Event::RunnerStarted {
        runner: runner_identity(),
        instance_id: instance.to_string(),
    }
}

fn step_running(step: u32) -> Event {
    Event::StepRunning {
        step,
        process: Some(ProcessIdentity {
            pid: 4243,
            start_time: 987_700,
            boot_id: "boot-a".to_string(),
            pid_namespace: None,
        }),
    }
}

fn step_finished(step: u32, end: StepEnd) -> Event {
    Event::StepFinished {
        step,
        outcome: StepOutcome {
            end,
            exit_code: Some(0),
            error: None,
        },
    }
}

fn terminal(state: TerminalState) -> Event {
    Event::Terminal {
        state,
        error: None,
        summary: format!("run ended {}", state.as_str()),
        exit_code: 0,
        repaired_by: None,
    }
}

fn repaired_failure() -> Event {
    Event::Terminal {
        state: TerminalState::Failed,
        error: Some("runner 4242 exited without recording an outcome".to_string()),
        summary: "runner lost".to_string(),
        exit_code: 1,
        repaired_by: Some(Repairer::Reconciler),
    }
}

fn process_gone(instance: &str, proof: Proof, observer: Observer) -> Event {
    Event::ProcessTerminalObserved {
        instance_id: instance.to_string(),
        exit: Some(ProcessExit {
            code: Some(0),
            signal: None,
        }),
        proof,
        observer,
    }
}

/// The five transitions after `RunCreated` of a run that succeeds and is then seen gone.
fn successful_lifecycle(instance: &str) -> Vec<Event> {
    vec![
        runner_started(instance),
        step_running(0),
        step_finished(0, StepEnd::Complete),
        terminal(TerminalState::Complete),
        process_gone(instance, Proof::Observed, Observer::RunnerParent),
    ]
}

/// Everything a reader can see of the journal, to show that a refusal changed none of it.
#[derive(Debug, PartialEq)]
struct Contents {
    global_head: u64,
    log: Vec<(u64, Record)>,
    record_count: u64,
    snapshots: Vec<RunState>,
    active: Vec<RunId>,
    terminal: Vec<(UnixMs, RunId)>,
    aliases: Vec<(String, RunId)>,
}

fn contents(journal: &Journal) -> Contents {
    let view = journal.view().expect("a view opens");
    let mut snapshots = Vec::new();
    view.for_each_snapshot(|state| {
        snapshots.push(state);
        true
    })
    .expect("snapshots read");
    Contents {
        global_head: view.global_head().expect("the log head reads"),
        log: view.records_after(0, usize::MAX).expect("the log reads"),
        record_count: view.record_count().expect("records count"),
        snapshots,
        active: view.active_runs().expect("the active index reads"),
        terminal: view.terminal_index().expect("the terminal index reads"),
        aliases: view.aliases().expect("aliases read"),
    }
}

/// Commits one batch through `commit_batches`, as a retry after a reopen would.
fn commit_one(journal: &Journal, batch: &Batch) -> Result<Appended, AppendError> {
    let mut results = commit_batches(
        &journal.database().expect("a handle"),
        std::slice::from_ref(batch),
    )
    .expect("the storage does not fail");
    assert_eq!(results.len(), 1, "one answer per batch");
    results.pop().expect("one answer per batch")
}

fn batch(run: RunId, events: Vec<Event>, writer: WriterId, writer_seq: u64) -> Batch {
    Batch {
        run,
        events,
        condition: Condition::none(),
        writer,
        writer_seq,
        time_ms: now_ms(),
    }
}

/// A redb handle on the journal file, bypassing the journal, as another program would open it.
fn open_raw(path: &Path) -> redb::Database {
    redb::Database::builder()
        .set_concurrency_mode(redb::ConcurrencyMode::MultiWriter)
        .open(path)
        .expect("the file opens as a redb database")
}

/// The error of a read-only open that must fail (`JournalReader` has no `Debug`, so
/// `expect_err` is not available).
fn refused_read_only(path: &Path, why: &str) -> OpenError {
    match JournalReader::open(path) {
        Ok(_) => panic!("{}: the read-only open succeeded; {why}", path.display()),
        Err(error) => error,
    }
}

fn read_bytes(path: &Path) -> Vec<u8> {
    std::fs::read(path).expect("the journal file reads")
}

fn seqs(records: &[Record]) -> Vec<u64> {
    records.iter().map(|record| record.seq).collect()
}

// ---------------------------------------------------------------------------------------------
// 1. Appending a lifecycle
// ---------------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------------
// 2. The active and terminal indexes
// ---------------------------------------------------------------------------------------------

#[test]
fn a_run_stays_active_until_it_is_terminal_and_its_process_is_observed() {
    let (_dir, journal) = new_journal();
    let finished = create(&journal, None, None);
    let lost = create(&journal, None, None);
    let running = create(&journal, None, None);
    let active = |journal: &Journal| {
        journal
            .view()
            .expect("a view opens")
            .active_runs()
            .expect("the active index reads")
    };
    let mut all = vec![finished, lost, running];
    all.sort();
    assert_eq!(
        active(&journal),
        all,
        "created runs are active, in id order"
    );

    for run in [finished, lost, running] {
        journal
            .append(
                run,
                vec![runner_started("i"), step_running(0)],
                Condition::none(),
            )
            .expect("a legal batch is appended");
    }
    assert_eq!(active(&journal), all);

    // Terminal alone does not close a run: its runner may still be finishing.
    journal
        .append(
            finished,
            vec![
                step_finished(0, StepEnd::Complete),
                terminal(TerminalState::Complete),
            ],
            Condition::none(),
        )
        .expect("a legal batch is appended");
    assert!(active(&journal).contains(&finished));
    journal
        .append(
            finished,
            vec![process_gone("i", Proof::Observed, Observer::RunnerParent)],
            Condition::none(),
        )
        .expect("a legal transition is appended");
    assert!(
        !active(&journal).contains(&finished),
        "a closed run leaves the index"
    );

    // The runner died first: the process terminal alone does not close the run either.
    journal
        .append(
            lost,
            vec![process_gone("i", Proof::Unknown, Observer::Reconciler)],
            Condition::none(),
        )
        .expect("a legal transition is appended");
    let stale = journal
        .view()
        .expect("a view opens")
        .snapshot(lost)
        .expect("the snapshot reads")
        .expect("the run exists");
    assert!(stale.is_stale());
    assert!(
        active(&journal).contains(&lost),
        "a stale run is still work to do"
    );
    journal
        .append(
            lost,
            vec![repaired_failure()],
            Condition::expect_not_terminal(),
        )
        .expect("the repair is appended");
    assert_eq!(active(&journal), vec![running]);

    // A dismissed closed run does not come back.
    journal
        .append(
            finished,
            vec![Event::Dismissed { at_ms: now_ms() }],
            Condition::none(),
        )
        .expect("a closed run can be dismissed");
    assert_eq!(active(&journal), vec![running]);
}

#[test]
fn a_run_created_and_closed_in_one_batch_is_never_active_but_is_listed_as_terminal() {
    let (_dir, journal) = new_journal();
    let run = RunId::generate();
    let appended = journal
        .append(
            run,
            vec![
                run_created(Some("never-started")),
                Event::Terminal {
                    state: TerminalState::Failed,
                    error: Some("runner never started".to_string()),
                    summary: "runner never started".to_string(),
                    exit_code: 1,
                    repaired_by: Some(Repairer::Launcher),
                },
                process_gone("none", Proof::NotStarted, Observer::Launcher),
            ],
            Condition::expect_head(0),
        )
        .expect("a launcher may give up on a run in one batch");
    assert_eq!((appended.first_seq, appended.last_seq), (1, 3));
    assert!(appended.state.is_closed());
    let view = journal.view().expect("a view opens");
    assert!(view.active_runs().expect("the index reads").is_empty());
    let ended_at = appended.state.ended_at_ms().expect("the run ended");
    assert_eq!(
        view.recent_terminal(10).expect("the index reads"),
        vec![(ended_at, run)]
    );
    assert_eq!(
        view.lookup_alias(&name_alias("never-started"))
            .expect("reads"),
        Some(run)
    );
}

#[test]
fn recent_terminal_lists_terminal_runs_most_recently_ended_first() {
    let (_dir, journal) = new_journal();
    let writer = WriterId(0x7e57);
    let runs: Vec<RunId> = (0..4).map(|_| create(&journal, None, None)).collect();
    // End times are chosen, so ties and order are known: runs 0 and 2 end at the same time.
    let ends: [(usize, UnixMs); 3] = [(0, 3_000), (1, 1_000), (2, 3_000)];
    for (writer_seq, (run_index, ended_at_ms)) in ends.into_iter().enumerate() {
        let mut terminal_batch = batch(
            runs[run_index],
            vec![runner_started("i"), terminal(TerminalState::Stopped)],
            writer,
            writer_seq as u64 + 1,
        );
        terminal_batch.time_ms = ended_at_ms;
        let appended = commit_one(&journal, &terminal_batch).expect("a legal batch commits");
        assert_eq!(appended.state.ended_at_ms(), Some(ended_at_ms));
    }
    let mut tied = [(3_000, runs[0]), (3_000, runs[2])];
    tied.sort();
    let expected = vec![tied[1], tied[0], (1_000, runs[1])];

    let view = journal.view().expect("a view opens");
    assert_eq!(view.recent_terminal(10).expect("the index reads"), expected);
    assert_eq!(
        view.recent_terminal(2).expect("the index reads"),
        expected[..2]
    );
    assert!(view.recent_terminal(0).expect("the index reads").is_empty());
    let listed: Vec<RunId> = expected.iter().map(|(_, run)| *run).collect();
    assert!(
        !listed.contains(&runs[3]),
        "a run that has not ended is not listed"
    );
    // Terminal but not closed: still active.
    assert_eq!(view.active_runs().expect("the index reads").len(), 4);

    // Observing the process later neither moves nor duplicates the entry.
    drop(view);
    journal
        .append(
            runs[1],
            vec![process_gone("i", Proof::Observed, Observer::Launcher)],
            Condition::none(),
        )
        .expect("a legal transition is appended");
    let view = journal.view().expect("a view opens");
    assert_eq!(view.recent_terminal(10).expect("the index reads"), expected);
}

// ---------------------------------------------------------------------------------------------
// 3. Aliases
// ---------------------------------------------------------------------------------------------

#[test]
fn tool_call_and_name_aliases_resolve_to_the_run() {
    let (_dir, journal) = new_journal();
    let first = create(&journal, Some("nightly"), Some("toolu_01"));
    let anonymous = create(&journal, None, None);
    let view = journal.view().expect("a view opens");
    assert_eq!(
        view.lookup_alias(&tool_call_alias("toolu_01"))
            .expect("reads"),
        Some(first)
    );
    assert_eq!(
        view.lookup_alias(&name_alias("nightly")).expect("reads"),
        Some(first)
    );
    assert_eq!(
        view.lookup_alias(&tool_call_alias("toolu_02"))
            .expect("reads"),
        None
    );
    // A tool-call id and a name are different namespaces.
    assert_eq!(
        view.lookup_alias(&name_alias("toolu_01")).expect("reads"),
        None
    );
    assert_eq!(view.lookup_alias("toolu_01").expect("reads"), None);
    let aliases = view.aliases().expect("aliases read");
    assert!(
        aliases.iter().all(|(_, run)| *run != anonymous),
        "a run without host ids has no alias: {aliases:?}"
    );
    drop(view);

    // The latest run of a name wins; the earlier tool-call alias stays.
    let second = create(&journal, Some("nightly"), Some("toolu_02"));
    let view = journal.view().expect("a view opens");
    assert_eq!(
        view.lookup_alias(&name_alias("nightly")).expect("reads"),
        Some(second)
    );
    assert_eq!(
        view.lookup_alias(&tool_call_alias("toolu_01"))
            .expect("reads"),
        Some(first)
    );
    assert_eq!(
        view.lookup_alias(&tool_call_alias("toolu_02"))
            .expect("reads"),
        Some(second)
    );
    // Appends after creation do not touch aliases.
    drop(view);
    journal
        .append(first, successful_lifecycle("i"), Condition::none())
        .expect("a legal batch is appended");
    let view = journal.view().expect("a view opens");
    assert_eq!(
        view.lookup_alias(&tool_call_alias("toolu_01"))
            .expect("reads"),
        Some(first)
    );
    assert_eq!(view.aliases().expect("aliases read").len(), 3);
}

// ---------------------------------------------------------------------------------------------
// 4. Refusals write nothing
// ---------------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------------
// 5. Idempotency
// ---------------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------------
// 6. Opening: format version and foreign files
// ---------------------------------------------------------------------------------------------

#[test]
fn a_journal_reopens_for_writing_and_reading_with_its_records() {
    let dir = tempfile::tempdir().expect("a temporary directory can be created");
    let path = journal_path(&dir);
    let journal = Journal::open(&path).expect("a new journal opens");
    let run = create(&journal, Some("kept"), None);
    let meta = journal.meta().expect("meta reads");
    assert_eq!(meta.format_version, crate::event::FORMAT_VERSION);
    assert!(meta.created_at_ms > 0);
    drop(journal);

    let journal = Journal::open(&path).expect("the journal reopens");
    assert_eq!(
        journal.meta().expect("meta reads"),
        meta,
        "reopening rewrites no meta"
    );
    let view = journal.view().expect("a view opens");
    assert_eq!(view.resolve(&run.to_string()).expect("resolves"), run);
    assert_eq!(
        view.lookup_alias(&name_alias("kept")).expect("reads"),
        Some(run)
    );
    drop(view);

    // A read-only handle beside a live writer sees the writer's later commits.
    let reader = JournalReader::open(&path).expect("the journal opens read-only");
    assert_eq!(reader.path(), path.as_path());
    assert_eq!(
        reader
            .view()
            .expect("a view opens")
            .meta()
            .expect("meta reads"),
        meta
    );
    journal
        .append(run, vec![runner_started("i")], Condition::none())
        .expect("a legal transition is appended");
    let view = reader.view().expect("a view opens");
    assert_eq!(seqs(&view.records(run).expect("records read")), vec![1, 2]);
    assert_eq!(
        view.snapshot(run)
            .expect("reads")
            .expect("the run exists")
            .status,
        RunStatus::Running
    );
}

#[test]
fn opening_a_missing_journal_read_only_is_an_io_error_and_creates_nothing() {
    let dir = tempfile::tempdir().expect("a temporary directory can be created");
    let path = journal_path(&dir);
    let error = refused_read_only(&path, "there is no journal");
    assert!(
        matches!(&error, OpenError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound),
        "{error:?}"
    );
    assert!(!path.exists());
}

fn rewrite_format_version(path: &Path, version: u16) {
    let db = open_raw(path);
    let txn = db.begin_write().expect("a write begins");
    {
        let mut meta = txn.open_table(META).expect("the meta table opens");
        meta.insert(tables::META_FORMAT_VERSION, &version.to_be_bytes()[..])
            .expect("the entry is written");
    }
    txn.commit().expect("the rewrite commits");
}

fn assert_newer_format(error: &OpenError, path: &Path) {
    assert!(
        matches!(error, OpenError::NewerFormat { path: p, found: 2 } if p == path),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(message.contains("upgrade runjournal"), "{message}");
    assert!(message.contains("version 2"), "{message}");
}

#[test]
fn a_journal_of_a_newer_format_is_refused_by_both_opens() {
    let dir = tempfile::tempdir().expect("a temporary directory can be created");
    let path = journal_path(&dir);
    let run = {
        let journal = Journal::open(&path).expect("a new journal opens");
        create(&journal, None, None)
    };
    rewrite_format_version(&path, 2);

    let error = Journal::open(&path).expect_err("a newer format is refused");
    assert_newer_format(&error, &path);
    let error = refused_read_only(&path, "a newer format is refused read-only too");
    assert_newer_format(&error, &path);

    // The refusal left the journal as it was: the run is there, the version is still 2.
    let db = open_raw(&path);
    let txn = db.begin_read().expect("a read begins");
    let meta = txn.open_table(META).expect("meta opens");
    let version = meta
        .get(tables::META_FORMAT_VERSION)
        .expect("reads")
        .expect("the entry exists");
    assert_eq!(version.value(), &2u16.to_be_bytes()[..]);
    let runs = txn.open_table(tables::RUNS).expect("runs opens");
    assert!(runs.get(&run.to_bytes()).expect("reads").is_some());
}

/// A closed journal whose meta says format version 2; returns the directory and path.
fn journal_of_format_two() -> (TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("a temporary directory can be created");
    let path = journal_path(&dir);
    {
        let journal = Journal::open(&path).expect("a new journal opens");
        create(&journal, None, None);
    }
    rewrite_format_version(&path, 2);
    (dir, path)
}

#[test]
fn refusing_a_newer_format_read_only_leaves_the_file_bytes_unchanged() {
    let (_dir, path) = journal_of_format_two();
    let before = read_bytes(&path);
    let error = refused_read_only(&path, "refused");
    assert_newer_format(&error, &path);
    assert!(
        read_bytes(&path) == before,
        "a read-only refusal wrote to the file"
    );
}

fn changed_bytes(before: &[u8], after: &[u8]) -> String {
    let changed = before
        .iter()
        .zip(after)
        .filter(|(old, new)| old != new)
        .count();
    format!(
        "{} -> {} bytes long, {changed} bytes differ",
        before.len(),
        after.len()
    )
}

#[test]
fn a_refused_open_for_writing_leaves_the_file_bytes_unchanged() {
    let (_dir, path) = journal_of_format_two();
    let before = read_bytes(&path);
    let error = Journal::open(&path).expect_err("refused");
    assert_newer_format(&error, &path);
    let after = read_bytes(&path);
    assert!(
        after == before,
        "refusing a newer format wrote to the file: {}",
        changed_bytes(&before, &after)
    );

    let (_dir, path) = foreign_database();
    let before = read_bytes(&path);
    let error = Journal::open(&path).expect_err("refused");
    assert!(matches!(error, OpenError::NotAJournal { .. }), "{error:?}");
    let after = read_bytes(&path);
    assert!(
        after == before,
        "refusing another program's database wrote to it: {}",
        changed_bytes(&before, &after)
    );
}

#[test]
fn a_format_version_below_one_is_reported_as_corruption() {
    let dir = tempfile::tempdir().expect("a temporary directory can be created");
    let path = journal_path(&dir);
    drop(Journal::open(&path).expect("a new journal opens"));
    rewrite_format_version(&path, 0);
    let error = Journal::open(&path).expect_err("version 0 was never written");
    assert!(matches!(error, OpenError::Corrupt { .. }), "{error:?}");
    let error = refused_read_only(&path, "version 0 was never written");
    assert!(matches!(error, OpenError::Corrupt { .. }), "{error:?}");
}

fn random_bytes(len: usize) -> Vec<u8> {
    // Not "redb..." at the start, whatever the generator gives.
    let mut bytes: Vec<u8> = (0..len).map(|_| rand::random::<u8>()).collect();
    bytes[0] = b'#';
    bytes
}

#[test]
fn what_redb_reports_for_a_file_of_random_bytes() {
    // Pins the redb behaviour the journal's error mapping depends on: redb (2.4 and later, with
    // std) reports a foreign file as an I/O error of kind InvalidData, not as `Corrupted`.
    let dir = tempfile::tempdir().expect("a temporary directory can be created");
    let path = dir.path().join("random.bin");
    std::fs::write(&path, random_bytes(8192)).expect("the file is written");
    let error = redb::Database::builder()
        .set_concurrency_mode(redb::ConcurrencyMode::MultiWriter)
        .create(&path)
        .expect_err("random bytes are not a database");
    assert!(
        matches!(
            &error,
            redb::DatabaseError::Storage(redb::StorageError::Io(io))
                if io.kind() == std::io::ErrorKind::InvalidData
                    && io.to_string().contains("magic number mismatch")
        ),
        "{error:?}"
    );
}

#[test]
fn a_file_of_random_bytes_is_not_a_journal() {
    let dir = tempfile::tempdir().expect("a temporary directory can be created");
    for len in [1, 100, 8192, 1 << 20] {
        let path = dir.path().join(format!("random-{len}.redb"));
        std::fs::write(&path, random_bytes(len)).expect("the file is written");
        let before = read_bytes(&path);
        let error = Journal::open(&path).expect_err("random bytes are no journal");
        assert!(
            matches!(&error, OpenError::NotAJournal { path: p, .. } if *p == path),
            "{len} bytes: {error:?}"
        );
        let error = refused_read_only(&path, "random bytes are no journal");
        assert!(
            matches!(&error, OpenError::NotAJournal { path: p, .. } if *p == path),
            "{len} bytes, read-only: {error:?}"
        );
        assert!(
            read_bytes(&path) == before,
            "{len} bytes: the file was written to"
        );
    }
    // An empty file is no journal to a reader either (a writer would set it up as one).
    let empty = dir.path().join("empty.redb");
    std::fs::write(&empty, b"").expect("the file is written");
    let error = refused_read_only(&empty, "an empty file is no journal");
    assert!(
        matches!(&error, OpenError::NotAJournal { path: p, .. } if *p == empty),
        "empty file, read-only: {error:?}"
    );
    assert_eq!(read_bytes(&empty).len(), 0);
}

#[test]
fn a_file_of_random_bytes_is_refused_without_being_written() {
    // The part of the contract that holds today, whatever the error variant.
    let dir = tempfile::tempdir().expect("a temporary directory can be created");
    let path = dir.path().join("random.redb");
    std::fs::write(&path, random_bytes(8192)).expect("the file is written");
    let before = read_bytes(&path);
    assert!(Journal::open(&path).is_err());
    assert!(JournalReader::open(&path).is_err());
    assert!(read_bytes(&path) == before);
}

const INVENTORY: TableDefinition<&str, u64> = TableDefinition::new("inventory");

/// Another program's redb database: one table, `inventory`, holding `widgets` = 3.
fn foreign_database() -> (TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("a temporary directory can be created");
    let path = dir.path().join("other-app.redb");
    let db = redb::Database::builder()
        .set_concurrency_mode(redb::ConcurrencyMode::MultiWriter)
        .create(&path)
        .expect("a redb database is created");
    let txn = db.begin_write().expect("a write begins");
    txn.open_table(INVENTORY)
        .expect("the table opens")
        .insert("widgets", 3)
        .expect("written");
    txn.commit().expect("commits");
    (dir, path)
}

#[test]
fn a_redb_database_with_foreign_tables_is_not_a_journal() {
    let (_dir, path) = foreign_database();
    let error = Journal::open(&path).expect_err("another program's database");
    assert!(
        matches!(&error, OpenError::NotAJournal { path: p, .. } if *p == path),
        "{error:?}"
    );
    assert!(
        error.to_string().contains("is not a runjournal journal"),
        "{error}"
    );
    let error = refused_read_only(&path, "another program's database");
    assert!(
        matches!(&error, OpenError::NotAJournal { path: p, .. } if *p == path),
        "{error:?}"
    );

    // The refusal created none of the journal's tables in the other program's file.
    let db = open_raw(&path);
    let txn = db.begin_read().expect("a read begins");
    let names: Vec<String> = txn
        .list_tables()
        .expect("tables list")
        .map(|table| table.name().to_string())
        .collect();
    assert_eq!(names, vec!["inventory".to_string()]);
    let inventory = txn.open_table(INVENTORY).expect("opens");
    assert_eq!(
        inventory.get("widgets").expect("reads").map(|v| v.value()),
        Some(3)
    );
}

// ---------------------------------------------------------------------------------------------
// 7. Corruption is detected on read
// ---------------------------------------------------------------------------------------------

/// A closed journal with one run of six records; returns the directory, path and run.
fn journal_with_one_lifecycle() -> (TempDir, PathBuf, RunId) {
    let dir = tempfile::tempdir().expect("a temporary directory can be created");
    let path = journal_path(&dir);
    let journal = Journal::open(&path).expect("a new journal opens");
    let run = create(&journal, None, None);
    journal
        .append(run, successful_lifecycle("instance-XYZ"), Condition::none())
        .expect("a legal batch is appended");
    drop(journal);
    (dir, path, run)
}

fn raw_record(db: &redb::Database, run: RunId, seq: u64) -> Vec<u8> {
    let txn = db.begin_read().expect("a read begins");
    let records = txn.open_table(RECORDS).expect("records opens");
    let value = records
        .get(&tables::record_key(run, seq))
        .expect("reads")
        .expect("the record exists");
    value.value().to_vec()
}

fn write_raw_record(db: &redb::Database, key: [u8; 24], bytes: &[u8]) {
    let txn = db.begin_write().expect("a write begins");
    txn.open_table(RECORDS)
        .expect("records opens")
        .insert(&key, bytes)
        .expect("written");
    txn.commit().expect("commits");
}

#[test]
fn a_damaged_record_fails_its_checksum_on_read_naming_run_and_seq() {
    let (_dir, path, run) = journal_with_one_lifecycle();
    {
        let db = open_raw(&path);
        let mut bytes = raw_record(&db, run, 2);
        // Damage a byte of the runner instance id: the record still decodes field by field,
        // so only the checksum can tell.
        let at = bytes
            .windows(3)
            .position(|window| window == b"XYZ")
            .expect("the instance id is stored in the RunnerStarted record");
        bytes[at] ^= 0x01;
        write_raw_record(&db, tables::record_key(run, 2), &bytes);
    }

    let journal = Journal::open(&path).expect("the journal opens");
    let view = journal.view().expect("a view opens");
    let error = view.records(run).expect_err("record 2 is damaged");
    assert!(
        matches!(
            &error,
            ReadError::Corrupt(CorruptError::Record {
                run: found,
                seq: 2,
                source: crate::event::DecodeError::Checksum,
            }) if *found == run
        ),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(message.contains("checksum"), "{message}");
    assert!(message.contains(&run.to_string()), "{message}");
    assert!(message.contains("record 2"), "{message}");

    let error = view
        .records_after(0, usize::MAX)
        .expect_err("the log reaches the damaged record");
    assert!(
        matches!(
            &error,
            ReadError::Corrupt(CorruptError::Record { seq: 2, .. })
        ),
        "{error:?}"
    );
    // Records before the damage still read.
    assert_eq!(
        seqs(&view.records_until(run, 1).expect("record 1 is intact")),
        vec![1]
    );
}

#[test]
fn a_record_stored_under_another_key_is_reported_as_a_mismatch() {
    let (_dir, path, run) = journal_with_one_lifecycle();
    let stranger = RunId::from_bytes([0x01; 16]);
    {
        let db = open_raw(&path);
        let second = raw_record(&db, run, 2);
        // Record 2 copied over record 3 of the same run, and under another run's key.
        write_raw_record(&db, tables::record_key(run, 3), &second);
        write_raw_record(&db, tables::record_key(stranger, 1), &second);
    }

    let journal = Journal::open(&path).expect("the journal opens");
    let view = journal.view().expect("a view opens");
    let error = view.records(run).expect_err("record 3 holds record 2");
    assert!(
        matches!(
            &error,
            ReadError::Corrupt(CorruptError::RecordKeyMismatch {
                key_run,
                key_seq: 3,
                found_run,
                found_seq: 2,
            }) if *key_run == run && *found_run == run
        ),
        "{error:?}"
    );
    let error = view
        .records(stranger)
        .expect_err("the record is another run's");
    assert!(
        matches!(
            &error,
            ReadError::Corrupt(CorruptError::RecordKeyMismatch {
                key_run,
                key_seq: 1,
                found_run,
                found_seq: 2,
            }) if *key_run == stranger && *found_run == run
        ),
        "{error:?}"
    );
    assert!(error.to_string().contains(&stranger.to_string()), "{error}");
}

// ---------------------------------------------------------------------------------------------
// 7b. A snapshot is a cache: one that does not decode is re-derived from the records
// ---------------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------------
// 8. Resolving ids and prefixes
// ---------------------------------------------------------------------------------------------

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
    use super::append::{Marks, commit_batches_judged, is_judged_refusal};
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

// ---------------------------------------------------------------------------------------------
// Resume links
// ---------------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------------
// Queues
// ---------------------------------------------------------------------------------------------

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
