//! The golden journal: `tests/fixtures/golden-v1.redb` was written by runjournal 0.1 (format
//! version 1) and is kept in the repository, so that every later version must read it exactly
//! as it was written. A change to the record encoding, the tables or the keys without a
//! migration fails here.
//!
//! The fixture is never written by the tests: each copies it to a temporary directory first.
//! To write it again (only with a new format version and a migration, see
//! docs/journal-format.md), run
//! `RUNJOURNAL_WRITE_GOLDEN=1 cargo test --test it -- --ignored golden::write_the_golden_journal`.

use std::path::{Path, PathBuf};

use redb::{ReadableDatabase, ReadableTable, TableDefinition};

use runjournal::event::{
    ControlAction, Event, ExternalJobStatus, FORMAT_VERSION, JobState, Mode, Observer,
    ProcessIdentity, Proof, Record, Repairer, RunSpec, StepEnd, TerminalState, UnixMs, WriterId,
};
use runjournal::journal::{Batch, name_alias, tool_call_alias};
use runjournal::state::{self, RunStatus};
use runjournal::testkit::{self as kit, commit_batches};
use runjournal::{Condition, Journal, JournalReader, RunId};

const WRITER: WriterId = WriterId(0x0060_1de2_0001);
const RECONCILER: WriterId = WriterId(0x0060_1de2_0002);
/// 2025-01-01T00:00:00Z.
const T0: UnixMs = 1_735_689_600_000;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/golden-v1.redb")
}

/// The runs of the golden journal, in id order.
fn run(index: u8) -> RunId {
    RunId::from_bytes([
        0x01, 0x94, 0x20, 0x00, 0x00, index, 7, 7, 7, 7, 7, 7, 7, 7, 7, index,
    ])
}

fn identity(pid: u32) -> ProcessIdentity {
    ProcessIdentity {
        pid,
        start_time: 100_000 + u64::from(pid),
        boot_id: "5f3c1a2e-0d4b-4c8e-9a71-2b6d8e0f4c13".to_string(),
        pid_namespace: None,
    }
}

/// A run created at `offset_ms`; with a tool call, in session `session-1` for `owner-1`.
fn created(spec: RunSpec, tool_call_id: Option<&str>, offset_ms: u64) -> Event {
    let hosts = kit::hosts(
        tool_call_id.map(|_| "session-1"),
        tool_call_id.map(|_| "owner-1"),
        tool_call_id,
    );
    kit::created(spec, T0 + offset_ms, hosts)
}

fn runner_started(pid: u32, instance: &str) -> Event {
    kit::runner_started(identity(pid), instance)
}

fn step_running(step: u32, pid: u32) -> Event {
    kit::step_running(step, Some(identity(pid)))
}

fn job(step: u32, state: JobState, progress: Option<f64>) -> Event {
    let job = ExternalJobStatus {
        message: Some(format!("job is {}", state.as_str())),
        url: Some("https://ci.example/jobs/7".to_string()),
        ..kit::job(state, "job-7", progress)
    };
    kit::job_updated(step, job)
}

/// Every batch of the golden journal, in commit order: (writer, time offset, run, events).
/// Five runs cover every event kind, every run state but paused, both aliases (the name
/// `nightly` is taken by a later run), the terminal index and the active one.
fn batches() -> Vec<(WriterId, u64, RunId, Vec<Event>)> {
    let nightly = RunSpec {
        name: Some("nightly".to_string()),
        timeout_ms: Some(600_000),
        cwd: Some("/srv/app".to_string()),
        ..kit::spec(Mode::Single, vec![kit::make_step("build")])
    };
    let deploy = RunSpec {
        name: Some("deploy".to_string()),
        ..kit::spec(
            Mode::Chain,
            vec![
                kit::shell("test", "make test"),
                kit::step("ship", kit::provider("./deploy-provider.sh")),
            ],
        )
    };
    let render = RunSpec {
        name: Some("nightly".to_string()),
        concurrency: 2,
        ..kit::spec(
            Mode::Parallel,
            vec![
                kit::make_step("left"),
                kit::make_step("right"),
                kit::make_step("merge"),
            ],
        )
    };
    let lonely = kit::spec(Mode::Single, vec![kit::make_step("never")]);
    vec![
        // Run 1: complete, closed by its parent, dismissed.
        (WRITER, 0, run(1), vec![created(nightly, Some("call-1"), 0)]),
        (
            WRITER,
            1_000,
            run(1),
            vec![runner_started(4242, "runner-1")],
        ),
        (WRITER, 2_000, run(1), vec![step_running(0, 4243)]),
        (
            WRITER,
            9_000,
            run(1),
            vec![
                kit::step_complete(0),
                kit::completed("1 of 1 steps complete"),
                kit::runner_exited("runner-1", 0),
            ],
        ),
        // Run 2: a chain whose external job is stopped; its runner dies, the reconciler closes it.
        (
            WRITER,
            10_000,
            run(2),
            vec![created(deploy, Some("call-2"), 10_000)],
        ),
        (
            WRITER,
            11_000,
            run(2),
            vec![runner_started(5000, "runner-2")],
        ),
        (
            WRITER,
            12_000,
            run(2),
            vec![
                step_running(0, 5001),
                kit::step_complete(0),
                step_running(1, 5002),
            ],
        ),
        (WRITER, 13_000, run(2), vec![job(1, JobState::Queued, None)]),
        (
            WRITER,
            14_000,
            run(2),
            vec![job(1, JobState::Running, Some(0.25))],
        ),
        (
            WRITER,
            15_000,
            run(2),
            vec![kit::control(
                ControlAction::Stop,
                "cli",
                "deploy window closed",
            )],
        ),
        (
            WRITER,
            16_000,
            run(2),
            vec![kit::terminal(
                TerminalState::Stopped,
                143,
                "stopped by cli",
                Some("stopped: deploy window closed"),
            )],
        ),
        (
            WRITER,
            20_000,
            run(1),
            vec![Event::Dismissed { at_ms: T0 + 20_000 }],
        ),
        (
            RECONCILER,
            30_000,
            run(2),
            vec![Event::ProcessTerminalObserved {
                instance_id: "runner-2".to_string(),
                exit: None,
                proof: Proof::Unknown,
                observer: Observer::Reconciler,
            }],
        ),
        // Run 3: parallel, still running, and now the owner of the alias name:nightly.
        (WRITER, 40_000, run(3), vec![created(render, None, 40_000)]),
        (
            WRITER,
            41_000,
            run(3),
            vec![
                runner_started(6000, "runner-3"),
                step_running(0, 6001),
                step_running(1, 6002),
            ],
        ),
        (
            WRITER,
            42_000,
            run(3),
            vec![kit::step_finished(
                1,
                StepEnd::Failed,
                Some(2),
                Some("exited with code 2"),
            )],
        ),
        // Run 4: the launcher gave up on it: never started, failed, closed.
        (
            WRITER,
            50_000,
            run(4),
            vec![created(lonely.clone(), None, 50_000)],
        ),
        (
            WRITER,
            60_000,
            run(4),
            vec![
                Event::ProcessTerminalObserved {
                    instance_id: String::new(),
                    exit: None,
                    proof: Proof::NotStarted,
                    observer: Observer::Launcher,
                },
                Event::Terminal {
                    state: TerminalState::Failed,
                    error: Some("runner never started".to_string()),
                    summary: "runner never started".to_string(),
                    exit_code: 1,
                    repaired_by: Some(Repairer::Launcher),
                },
            ],
        ),
        // Run 5: queued, waiting for its runner.
        (
            WRITER,
            70_000,
            run(5),
            vec![created(lonely, Some("call-5"), 70_000)],
        ),
    ]
}

/// The records the golden journal holds, per run in seq order: what every version must read.
fn expected_records() -> Vec<Record> {
    let mut records: Vec<Record> = Vec::new();
    let mut writer_seqs = std::collections::BTreeMap::new();
    for (writer, offset_ms, run, events) in batches() {
        let writer_seq = writer_seqs.entry(writer).or_insert(0u64);
        *writer_seq += 1;
        let head = records.iter().filter(|record| record.run_id == run).count() as u64;
        for (index, event) in events.into_iter().enumerate() {
            records.push(Record {
                format_version: FORMAT_VERSION,
                run_id: run,
                seq: head + 1 + index as u64,
                time_ms: T0 + offset_ms,
                writer,
                writer_seq: *writer_seq,
                event,
            });
        }
    }
    records.sort_by_key(|record| (record.run_id, record.seq));
    records
}

/// Writes the fixture from [`batches`]. Not part of the suite: it runs only when asked.
#[test]
#[ignore = "writes tests/fixtures/golden-v1.redb; run only with a new format and a migration"]
fn write_the_golden_journal() {
    assert_eq!(
        std::env::var("RUNJOURNAL_WRITE_GOLDEN").as_deref(),
        Ok("1"),
        "set RUNJOURNAL_WRITE_GOLDEN=1 to overwrite the golden journal"
    );
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("journal.redb");
    let journal = Journal::open(&path).expect("a new journal opens");
    let mut writer_seqs = std::collections::BTreeMap::new();
    for (writer, offset_ms, run, events) in batches() {
        let writer_seq = writer_seqs.entry(writer).or_insert(0u64);
        *writer_seq += 1;
        let batch = Batch {
            run,
            events,
            condition: Condition::none(),
            writer,
            writer_seq: *writer_seq,
            time_ms: T0 + offset_ms,
            private: None,
        };
        let answers =
            commit_batches(&journal, std::slice::from_ref(&batch)).expect("the storage works");
        for answer in answers {
            answer.unwrap_or_else(|error| panic!("{batch:?} is refused: {error}"));
        }
    }
    drop(journal);
    std::fs::create_dir_all(fixture().parent().expect("a parent")).expect("the fixtures dir");
    std::fs::copy(&path, fixture()).expect("the fixture is written");
}

/// A private copy of the fixture.
fn copy_of_fixture() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("journal.redb");
    std::fs::copy(fixture(), &path).expect("the fixture is in the repository");
    (dir, path)
}

const RECORDS: TableDefinition<&[u8; 24], &[u8]> = TableDefinition::new("records");

#[test]
fn the_golden_journal_reads_exactly_as_written() {
    let (_dir, path) = copy_of_fixture();
    let expected = expected_records();

    // Every stored record decodes, and encodes back to the very bytes stored: the encoding
    // of every variant is pinned by a file, not only by this build's own round trip.
    {
        let db = redb::Database::builder()
            .set_concurrency_mode(redb::ConcurrencyMode::MultiWriter)
            .open_read_only(&path)
            .expect("redb opens the golden journal");
        let txn = db.begin_read().expect("a read");
        let table = txn.open_table(RECORDS).expect("the records table");
        let mut count = 0;
        for entry in table.iter().expect("records iterate") {
            let (key, value) = entry.expect("a record reads");
            let record = Record::decode(value.value()).expect("every record decodes");
            assert_eq!(
                &record.encode().expect("it encodes"),
                value.value(),
                "record {} of run {} encodes to the bytes stored",
                record.seq,
                record.run_id
            );
            assert_eq!(&key.value()[..16], &record.run_id.to_bytes());
            assert_eq!(key.value()[16..], record.seq.to_be_bytes());
            count += 1;
        }
        assert_eq!(count, expected.len());
    }

    let reader = JournalReader::open(&path).expect("the golden journal opens read-only");
    let view = reader.view().expect("a view");
    let meta = view.meta().expect("meta reads");
    assert_eq!(meta.format_version, 1);

    let mut stored = Vec::new();
    view.scan_records(|_, _, record| {
        stored.push(record.expect("every record decodes and matches its key"));
        true
    })
    .expect("the records scan");
    assert_eq!(
        stored, expected,
        "every (run, seq, event) is exactly as written"
    );

    let runs: Vec<RunId> = (1..=5).map(run).collect();
    assert_eq!(view.all_runs().expect("runs read"), runs);
    for &run in &runs {
        let records = view.records(run).expect("the run's records read");
        let replayed = state::replay(&records).expect("the records replay");
        assert_eq!(
            view.snapshot(run).expect("the snapshot reads"),
            replayed,
            "run {run}: the snapshot is the replay of its records"
        );
    }
    let status = |index| {
        view.snapshot(run(index))
            .expect("reads")
            .expect("exists")
            .status
    };
    assert_eq!(
        [1, 2, 3, 4, 5].map(status),
        [
            RunStatus::Complete,
            RunStatus::Stopped,
            RunStatus::Running,
            RunStatus::Failed,
            RunStatus::Queued
        ]
    );
    assert_eq!(
        view.active_runs().expect("the active index reads"),
        vec![run(3), run(5)]
    );
    assert_eq!(
        view.terminal_index().expect("the terminal index reads"),
        vec![
            (T0 + 9_000, run(1)),
            (T0 + 16_000, run(2)),
            (T0 + 60_000, run(4))
        ]
    );
    assert_eq!(
        view.aliases().expect("aliases read"),
        vec![
            (name_alias("deploy"), run(2)),
            (name_alias("nightly"), run(3)),
            (tool_call_alias("call-1"), run(1)),
            (tool_call_alias("call-2"), run(2)),
            (tool_call_alias("call-5"), run(5)),
        ]
    );
    let log: Vec<(u64, RunId, u64)> = view
        .records_after(0, usize::MAX)
        .expect("the log reads")
        .into_iter()
        .map(|(global, record)| (global, record.run_id, record.seq))
        .collect();
    assert_eq!(log.len(), expected.len());
    assert_eq!(
        log.iter().map(|(global, ..)| *global).collect::<Vec<_>>(),
        (1..=expected.len() as u64).collect::<Vec<_>>(),
        "the log is gap-free"
    );
    assert_eq!(&log[..3], &[(1, run(1), 1), (2, run(1), 2), (3, run(1), 3)]);
    assert_eq!(view.writer_mark(WRITER).expect("reads"), Some(18));
    assert_eq!(view.writer_mark(RECONCILER).expect("reads"), Some(1));
}

/// This version appends to a journal an older one wrote, and a retry of an old batch is still
/// recognised.
#[test]
fn this_version_appends_to_the_golden_journal() {
    let (_dir, path) = copy_of_fixture();
    let journal = Journal::open(&path).expect("the golden journal opens for writing");
    let appended = journal
        .append(
            run(5),
            vec![runner_started(7000, "runner-5")],
            Condition::expect_head(1),
        )
        .expect("the queued run takes its runner");
    assert_eq!(
        (appended.first_seq, appended.state.status),
        (2, RunStatus::Running)
    );
    let (_, _, _, reconciler_events) = batches()
        .into_iter()
        .find(|(writer, ..)| *writer == RECONCILER)
        .expect("the reconciler's batch");
    let retried = commit_batches(
        &journal,
        &[Batch {
            run: run(2),
            events: reconciler_events,
            condition: Condition::none(),
            writer: RECONCILER,
            writer_seq: 1,
            time_ms: T0 + 30_000,
            private: None,
        }],
    )
    .expect("the storage works")
    .pop()
    .expect("one answer")
    .expect("a retry is answered");
    assert!(retried.was_duplicate);
    assert_eq!((retried.first_seq, retried.last_seq), (10, 10));
}

/// A journal an older version wrote, appended to by this one, is pruned whole: a run whose
/// records are half the old version's (no entry in the log index) and half this version's (one
/// entry per batch) leaves no record, log entry or index entry behind, and the runs left read
/// as before.
#[test]
fn the_golden_journal_appended_to_by_this_version_is_pruned_whole() {
    let (_dir, path) = copy_of_fixture();
    let journal = Journal::open(&path).expect("the golden journal opens for writing");
    // Run 3 ends under this version, in two batches, one of two records.
    journal
        .append(
            run(3),
            vec![
                kit::control(ControlAction::Stop, "golden", "pruned next"),
                kit::terminal(TerminalState::Stopped, 130, "stopped", None),
            ],
            Condition::expect_head(5),
        )
        .expect("run 3 ends");
    let closed = journal
        .append(
            run(3),
            vec![kit::process_terminal(
                "runner-3",
                Some(2),
                Proof::Observed,
                Observer::RunnerParent,
            )],
            Condition::expect_head(7),
        )
        .expect("run 3 is closed");
    assert!(closed.state.is_closed());
    let view = journal.view().expect("a view");
    let kept: Vec<(u64, Record)> = view
        .records_after(0, usize::MAX)
        .expect("the log reads")
        .into_iter()
        .filter(|(_, record)| [run(4), run(5)].contains(&record.run_id))
        .collect();
    // This version's records are found through its one entry per batch.
    let log: Vec<(u64, Record)> = view.records_after(0, usize::MAX).expect("the log reads");
    for (global, record) in log.iter().filter(|(_, record)| record.run_id == run(3)) {
        if record.seq > 5 {
            assert_eq!(
                view.global_of(run(3), record.seq).expect("the index reads"),
                Some(*global)
            );
        }
    }
    drop(view);

    let pruned = journal
        .prune(&[run(1), run(2), run(3)], &[], T0 + 100_000)
        .expect("the prune commits");
    assert!(
        pruned
            .iter()
            .all(|(_, outcome)| matches!(outcome, runjournal::journal::prune::Pruned::Done(_))),
        "{pruned:?}"
    );
    let view = journal.view().expect("a view");
    let left = view.records_after(0, usize::MAX).expect("the log reads");
    assert_eq!(left, kept, "the log holds exactly the runs kept");
    for gone in [run(1), run(2), run(3)] {
        assert!(view.records(gone).expect("reads").is_empty());
        for seq in 1..=8 {
            assert_eq!(view.global_of(gone, seq).expect("reads"), None);
        }
    }
    for (global, record) in &kept {
        assert_eq!(
            view.global_of(record.run_id, record.seq).expect("reads"),
            Some(*global),
            "the first prune indexed the old version's records"
        );
    }
    assert_eq!(
        view.pruned_records().expect("reads") + left.len() as u64,
        view.global_head().expect("reads")
    );
}
