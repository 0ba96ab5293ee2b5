//! Unit tests of the journal: appends, the indexes, refusals, idempotency, format checks,
//! corruption detection and id resolution, each against a real redb file in a temporary
//! directory.

use std::path::{Path, PathBuf};
use std::sync::Barrier;

use redb::{ReadableDatabase, TableDefinition, TableHandle};
use tempfile::TempDir;

use super::*;
use crate::event::{
    Event, HostIds, Mode, Observer, ProcessIdentity, Proof, Record, Repairer, RunId, RunIdError,
    RunSpec, StepEnd, TerminalState, UnixMs, WriterId, now_ms,
};
use crate::journal::format::snapshot::{SnapshotError, snapshot_of_layout_two_for_tests};
use crate::journal::format::tables::{self, META, RECORDS};
use crate::journal::write::append::commit_batches;
use crate::state::{self, RunState, RunStatus, TransitionError};
use crate::testkit;

mod aliases;
mod corruption;
mod equivalence;
mod idempotency;
mod indexes;
mod invariants;
mod lifecycle;
mod opening;
mod private;
mod queues;
mod refusals;
mod resolve;
mod resume;
mod snapshot_cache;
mod unique;

fn journal_path(dir: &TempDir) -> PathBuf {
    dir.path().join("journal.redb")
}

fn new_journal() -> (TempDir, Journal) {
    let dir = tempfile::tempdir().expect("a temporary directory can be created");
    let journal = Journal::open(journal_path(&dir)).expect("a new journal opens");
    (dir, journal)
}

/// A run of one step, `build`, running `true`.
fn spec(name: Option<&str>) -> RunSpec {
    RunSpec {
        name: name.map(str::to_string),
        ..testkit::spec(
            Mode::Single,
            vec![testkit::step("build", testkit::argv(&["true"]))],
        )
    }
}

fn host_ids(tool_call_id: Option<&str>) -> HostIds {
    testkit::hosts(Some("session-1"), None, tool_call_id)
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
    testkit::created(spec(name), now_ms(), HostIds::default())
}

/// The runner's process: pid 4242, which `repaired_failure`'s words name.
fn runner_identity() -> ProcessIdentity {
    testkit::identity(4242)
}

fn runner_started(instance: &str) -> Event {
    testkit::runner_started(runner_identity(), instance)
}

fn step_running(step: u32) -> Event {
    testkit::step_running(step, Some(testkit::identity(4243)))
}

fn step_finished(step: u32, end: StepEnd) -> Event {
    testkit::step_finished(step, end, Some(0), None)
}

fn terminal(state: TerminalState) -> Event {
    testkit::terminal(state, 0, &format!("run ended {}", state.as_str()), None)
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
    testkit::process_terminal(instance, Some(0), proof, observer)
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
        private: None,
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

fn write_raw_record(db: &redb::Database, key: [u8; 24], bytes: &[u8]) {
    let txn = db.begin_write().expect("a write begins");
    txn.open_table(RECORDS)
        .expect("records opens")
        .insert(&key, bytes)
        .expect("written");
    txn.commit().expect("commits");
}
