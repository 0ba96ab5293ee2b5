//! Snapshots are a cache in a wire layout of their own (docs/journal-format.md, "Snapshots").
//!
//! * `tests/fixtures/golden-v1.redb` (see `golden.rs`) holds snapshots of layout 1, and this
//!   build encodes each of its states back to the very bytes stored.
//! * `tests/fixtures/golden-v1-other-snapshots.redb` is the same journal with every snapshot
//!   rewritten in a layout this build does not read: a hypothetical layout 2, layout 1 with a
//!   field added at the end, as a later version might write. Read-only, every run reads as the
//!   fold of its records; opened for writing, appends and a reconcile pass succeed and rewrite
//!   the snapshots they touch in layout 1.
//!
//! To write the second fixture again (from the first), run
//! `RUNJOURNAL_WRITE_GOLDEN=1 cargo test --test it -- --ignored golden_snapshots::write_the_golden_journal_with_snapshots_of_another_layout`.

use std::path::{Path, PathBuf};

use redb::{ReadableDatabase, ReadableTable, TableDefinition};

use runjournal::event::Event;
use runjournal::journal::{AppendError, SNAPSHOT_LAYOUT, SnapshotError};
use runjournal::reconcile::{self, Options};
use runjournal::state::{self, RunState, RunStatus};
use runjournal::store::StoreOptions;
use runjournal::testkit::{self as kit, encode_snapshot, snapshot_of_layout_two};
use runjournal::verify::{self, ProblemKind, Severity};
use runjournal::{Condition, Home, Journal, JournalReader, RunId, Store};

const RUNS: TableDefinition<&[u8; 16], &[u8]> = TableDefinition::new("runs");

/// 2025-01-01T00:00:00Z, as in `golden.rs`.
const T0: u64 = 1_735_689_600_000;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn golden() -> PathBuf {
    fixtures().join("golden-v1.redb")
}

fn golden_with_other_snapshots() -> PathBuf {
    fixtures().join("golden-v1-other-snapshots.redb")
}

/// A private copy of a fixture, as `journal.redb` of a fresh home.
fn copy_of(fixture: &Path) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("journal.redb");
    std::fs::copy(fixture, &path).expect("the fixture is in the repository");
    (dir, path)
}

/// Every (run, snapshot bytes) of the `runs` table, read with redb directly.
fn raw_snapshots(path: &Path) -> Vec<(RunId, Vec<u8>)> {
    let db = redb::Database::builder()
        .set_concurrency_mode(redb::ConcurrencyMode::MultiWriter)
        .open_read_only(path)
        .expect("redb opens the journal");
    let txn = db.begin_read().expect("a read");
    let runs = txn.open_table(RUNS).expect("the runs table");
    runs.iter()
        .expect("runs iterate")
        .map(|entry| {
            let (key, value) = entry.expect("an entry reads");
            (RunId::from_bytes(*key.value()), value.value().to_vec())
        })
        .collect()
}

fn fold(view: &runjournal::journal::View, run: RunId) -> RunState {
    let records = view.records(run).expect("the records read");
    state::replay(&records)
        .expect("the records fold")
        .expect("the run has records")
}

/// Writes the second fixture from the first. Not part of the suite: it runs only when asked.
#[test]
#[ignore = "writes tests/fixtures/golden-v1-other-snapshots.redb; run only to make it again"]
fn write_the_golden_journal_with_snapshots_of_another_layout() {
    assert_eq!(
        std::env::var("RUNJOURNAL_WRITE_GOLDEN").as_deref(),
        Ok("1"),
        "set RUNJOURNAL_WRITE_GOLDEN=1 to overwrite the fixture"
    );
    let (_dir, path) = copy_of(&golden());
    let snapshots = raw_snapshots(&path);
    {
        let db = redb::Database::builder()
            .set_concurrency_mode(redb::ConcurrencyMode::MultiWriter)
            .open(&path)
            .expect("redb opens the copy");
        let txn = db.begin_write().expect("a write");
        {
            let mut runs = txn.open_table(RUNS).expect("the runs table");
            for (index, (run, bytes)) in snapshots.iter().enumerate() {
                let heartbeat_ms = T0 + 1_000 * index as u64;
                let layout_two = snapshot_of_layout_two(bytes, Some(heartbeat_ms))
                    .expect("the golden snapshots are of layout 1");
                runs.insert(&run.to_bytes(), layout_two.as_slice())
                    .expect("a snapshot is written");
            }
        }
        txn.commit().expect("the rewrite commits");
    }
    std::fs::copy(&path, golden_with_other_snapshots()).expect("the fixture is written");
}

#[test]
fn the_golden_snapshots_are_layout_one_and_encode_to_the_bytes_stored() {
    let (_dir, path) = copy_of(&golden());
    let snapshots = raw_snapshots(&path);
    assert_eq!(snapshots.len(), 5);
    let reader = JournalReader::open(&path).expect("the golden journal opens read-only");
    let view = reader.view().expect("a view");
    for (run, bytes) in snapshots {
        assert_eq!(bytes[0], 1, "run {run}: layout 1 leads, as the varint 1");
        let state = view
            .stored_snapshot(run)
            .expect("the storage works")
            .expect("the run has a snapshot")
            .unwrap_or_else(|error| panic!("run {run}: the stored snapshot decodes: {error}"));
        assert_eq!(
            state,
            fold(&view, run),
            "run {run}: the snapshot is the fold"
        );
        assert_eq!(
            encode_snapshot(&state).expect("encodes"),
            bytes,
            "run {run}: this build writes the bytes the first release wrote"
        );
    }
    assert_eq!(SNAPSHOT_LAYOUT, 1);
}

#[test]
fn snapshots_of_another_layout_read_as_the_fold_of_their_records() {
    let (_dir, path) = copy_of(&golden_with_other_snapshots());
    let snapshots = raw_snapshots(&path);
    assert_eq!(snapshots.len(), 5);
    assert!(
        snapshots.iter().all(|(_, bytes)| bytes[0] == 2),
        "every snapshot of the fixture is of layout 2"
    );
    let reader = JournalReader::open(&path).expect("the fixture opens read-only");
    let view = reader.view().expect("a view");
    let runs = view.all_runs().expect("runs read");
    for &run in &runs {
        assert_eq!(
            view.stored_snapshot(run).expect("the storage works"),
            Some(Err(SnapshotError::OtherLayout { found: 2 }))
        );
        assert_eq!(
            view.snapshot(run)
                .expect("a run whose snapshot is unreadable still reads"),
            Some(fold(&view, run))
        );
    }
    let mut statuses = Vec::new();
    view.for_each_snapshot(|state| {
        statuses.push(state.status);
        true
    })
    .expect("every run reads");
    assert_eq!(
        statuses,
        [
            RunStatus::Complete,
            RunStatus::Stopped,
            RunStatus::Running,
            RunStatus::Failed,
            RunStatus::Queued
        ]
    );
    assert_eq!(
        view.resolve(&runs[2].to_string())
            .expect("a full id resolves"),
        runs[2]
    );

    // verify reports each snapshot as a stale cache, and nothing else: the indexes agree.
    let report = verify::verify(&view, None);
    assert_eq!(report.problems.len(), 5, "{:#?}", report.problems);
    for problem in &report.problems {
        assert_eq!(
            (problem.severity, problem.kind),
            (Severity::Inconsistent, ProblemKind::Snapshot),
            "{problem:?}"
        );
        assert!(problem.message.contains("layout 2"), "{}", problem.message);
    }
}

#[test]
fn appends_and_a_reconcile_pass_rewrite_snapshots_of_another_layout_in_this_layout() {
    let (dir, path) = copy_of(&golden_with_other_snapshots());
    let runs = {
        let reader = JournalReader::open(&path).expect("opens");
        reader
            .view()
            .expect("a view")
            .all_runs()
            .expect("runs read")
    };
    let (stopped, running, queued) = (runs[1], runs[2], runs[4]);
    let is_layout_one = |journal: &Journal, run: RunId| {
        let view = journal.view().expect("a view");
        match view.stored_snapshot(run).expect("the storage works") {
            Some(Ok(state)) => {
                assert_eq!(state, fold(&view, run), "run {run}: the rewritten snapshot");
                true
            }
            Some(Err(SnapshotError::OtherLayout { found: 2 })) => false,
            other => panic!("run {run}: {other:?}"),
        }
    };
    {
        let journal = Journal::open(&path).expect("the fixture opens for writing");
        let head = fold(&journal.view().expect("a view"), stopped).head_seq;
        let appended = journal
            .append(
                stopped,
                vec![Event::Dismissed { at_ms: T0 + 90_000 }],
                Condition::expect_head(head),
            )
            .expect("a closed run is dismissed");
        assert_eq!(appended.first_seq, head + 1);
        assert!(is_layout_one(&journal, stopped));
        // A refused append writes nothing, the snapshot included; its head came from the
        // re-derived state.
        let refused = journal.append(
            queued,
            vec![kit::runner_started(kit::identity(7000), "r")],
            Condition::expect_head(5),
        );
        assert!(
            matches!(
                refused,
                Err(AppendError::HeadMismatch {
                    expected: 5,
                    found: 1,
                    ..
                })
            ),
            "{refused:?}"
        );
        assert!(!is_layout_one(&journal, queued));
        assert!(!is_layout_one(&journal, running));
    }

    // The running run's runner is of another boot, and the queued run is years past its start
    // grace: the pass closes both through their (re-derived) states.
    let options = StoreOptions {
        reserve_bytes: 0,
        listener: None,
        ..StoreOptions::default()
    };
    let store = Store::open_with(Home::at(dir.path()), options).expect("the home opens");
    let report = reconcile::reconcile(&store, &Options::default()).expect("the pass runs");
    assert!(
        report
            .outcomes
            .iter()
            .all(|outcome| outcome.error.is_none()),
        "{report:#?}"
    );
    let journal = store.journal();
    let view = journal.view().expect("a view");
    for run in [running, queued] {
        let state = view.snapshot(run).expect("reads").expect("exists");
        assert_eq!(state.status, RunStatus::Failed, "run {run}");
        assert!(state.is_closed(), "run {run}");
    }
    drop(view);
    assert!(is_layout_one(journal, running));
    assert!(is_layout_one(journal, queued));
}
