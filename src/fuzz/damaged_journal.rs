//! The body of the `damaged_journal` fuzz target: a real journal, made once per process, its
//! pages damaged as the fuzz input says (bytes flipped, pages zeroed, copied over one another,
//! the file cut short), then opened, read and recovered through the library's own entry
//! points.
//!
//! Properties:
//! * nothing panics out of the library: redb's panics on the damaged bytes are contained and
//!   reported as damage;
//! * what a read returns is true: every record read back is the record made at that run and
//!   seq, and every run's state is the fold of the records made up to its head;
//! * an append on a damaged journal returns, never as a storage failure to retry, and a writer
//!   that died of damage answers every later append with the damage at once;
//! * `recover --from-projections` rebuilds every run (every events.jsonl is intact) with the
//!   records it was made with, and keeps the damaged file aside; or refuses a journal that
//!   reads whole, which then holds every record as it was made.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use crate::event::{
    ControlAction, Event, HostIds, Mode, Observer, ProcessExit, ProcessIdentity, Proof, Record,
    RunId, RunSpec, StepAction, StepEnd, StepOutcome, StepSpec, TerminalState,
};
use crate::home::{Home, Layout};
use crate::journal::{
    AppendError, CommitSharing, Condition, Journal, JournalReader, Location, ReadJournal, View,
    WriterOptions,
};
use crate::recover::{self, RecoverError};
use crate::source::JournalSource;
use crate::state::{self, RunState};
use crate::store::{Store, StoreOptions};

/// redb's page size: the unit the input damages.
const PAGE_BYTES: usize = 4096;

/// The first byte of a redb b-tree branch page.
const BRANCH_PAGE: u8 = 2;

/// The byte of a branch page that holds the top bits of its first child's page number (after
/// the kind and key count, 8 bytes, and the child's 16-byte checksum), where the page's order
/// is kept.
const HUGE_CHILD_ORDER_BYTE: u16 = 31;

/// Order 19 in the top five bits: a page of 2^19 pages of 4 KiB.
const HUGE_CHILD_ORDER_BITS: u8 = 19 << 3;

/// Most damages one input makes.
const MAX_DAMAGES: usize = 12;

/// The journal as made, its runs' events.jsonl, and every run's records.
struct Pristine {
    journal: Vec<u8>,
    events: Vec<(RunId, Vec<u8>)>,
    records: BTreeMap<RunId, Vec<Record>>,
}

fn pristine() -> &'static Pristine {
    static PRISTINE: OnceLock<Pristine> = OnceLock::new();
    PRISTINE.get_or_init(make_pristine)
}

/// A home with runs of every kind — complete, failed, running, queued and admitted, waiting,
/// paused and resumed, dismissed, named and with a tool-call id — made through a [`Store`], so
/// its events.jsonl are the projector's.
fn make_pristine() -> Pristine {
    let dir = tempfile::tempdir().expect("a temporary directory for the pristine home");
    let home = Home::at(dir.path());
    let options = StoreOptions {
        commit_sharing: CommitSharing::Alone,
        ..StoreOptions::default()
    };
    let store = Store::open_with(home.clone(), options).expect("a new home opens");
    let mut runs = Vec::new();
    for index in 0..4 {
        runs.push(chain_run(&store, index, StepEnd::Complete));
    }
    runs.push(chain_run(&store, 4, StepEnd::Failed));
    runs.push(running_run(&store));
    let paused = paused_run(&store);
    runs.push(paused);
    runs.push(resumed_run(&store, paused));
    runs.extend(queued_runs(&store));
    store
        .append(
            runs[1],
            vec![Event::Dismissed { at_ms: 1_000 }],
            Condition::none(),
        )
        .expect("a dismissal lands");
    for run in &runs {
        store
            .project(*run)
            .expect("a run of the pristine home is projected");
    }
    assert_eq!(
        store.flush_projections(Duration::from_secs(10)),
        0,
        "every projection of the pristine home is written"
    );
    let reader = JournalReader::open(home.journal_path()).expect("the pristine journal opens");
    let view = reader.view().expect("a view");
    let records = runs
        .iter()
        .map(|run| (*run, view.records(*run).expect("the pristine records read")))
        .collect();
    drop(view);
    drop(reader);
    drop(store);
    let events = runs
        .iter()
        .map(|run| {
            let bytes = std::fs::read(home.events_path(*run)).expect("events.jsonl is written");
            (*run, bytes)
        })
        .collect();
    let journal = std::fs::read(home.journal_path()).expect("the journal reads");
    Pristine {
        journal,
        events,
        records,
    }
}

fn identity(pid: u32) -> ProcessIdentity {
    ProcessIdentity {
        pid,
        start_time: 7,
        boot_id: "fuzz-boot".to_string(),
        pid_namespace: None,
    }
}

fn spec(name: Option<String>, steps: usize) -> RunSpec {
    RunSpec {
        name,
        mode: Mode::Chain,
        concurrency: 1,
        timeout_ms: None,
        cwd: None,
        steps: (0..steps)
            .map(|index| StepSpec {
                name: format!("step-{index}"),
                action: StepAction::Shell {
                    script: format!("echo {index}"),
                },
            })
            .collect(),
    }
}

fn append(store: &Store, run: RunId, events: Vec<Event>) {
    store
        .append(run, events, Condition::none())
        .expect("a batch of the pristine home lands");
}

fn started(store: &Store, run: RunId, instance: &str) {
    append(
        store,
        run,
        vec![Event::RunnerStarted {
            runner: identity(100),
            instance_id: instance.to_string(),
        }],
    );
}

fn step_ran(store: &Store, run: RunId, step: u32, end: StepEnd) {
    append(
        store,
        run,
        vec![Event::StepRunning {
            step,
            process: Some(identity(200 + step)),
        }],
    );
    let exit_code = if end == StepEnd::Complete { 0 } else { 3 };
    append(
        store,
        run,
        vec![Event::StepFinished {
            step,
            outcome: StepOutcome {
                end,
                exit_code: Some(exit_code),
                error: (end != StepEnd::Complete).then(|| "it failed".to_string()),
            },
        }],
    );
}

fn ended(store: &Store, run: RunId, state: TerminalState, exit_code: i32) {
    append(
        store,
        run,
        vec![
            Event::Terminal {
                state,
                error: (state != TerminalState::Complete).then(|| "it ended".to_string()),
                summary: "done".to_string(),
                exit_code,
                repaired_by: None,
            },
            Event::ProcessTerminalObserved {
                instance_id: "instance".to_string(),
                exit: Some(ProcessExit {
                    code: Some(exit_code),
                    signal: None,
                }),
                proof: Proof::Observed,
                observer: Observer::RunnerParent,
            },
        ],
    );
}

fn created(store: &Store, name: Option<String>, steps: usize, hosts: HostIds) -> RunId {
    store
        .create_run(spec(name, steps), hosts)
        .expect("a run is created")
        .run
}

/// A chain of two steps, the second ending as `end`.
fn chain_run(store: &Store, index: u32, end: StepEnd) -> RunId {
    let hosts = HostIds {
        session_id: Some("session".to_string()),
        completion_owner_id: None,
        tool_call_id: Some(format!("tool-call-{index}")),
    };
    let run = created(store, Some(format!("run-{index}")), 2, hosts);
    started(store, run, "instance");
    step_ran(store, run, 0, StepEnd::Complete);
    step_ran(store, run, 1, end);
    let (state, exit_code) = match end {
        StepEnd::Complete => (TerminalState::Complete, 0),
        _ => (TerminalState::Failed, 3),
    };
    ended(store, run, state, exit_code);
    run
}

fn running_run(store: &Store) -> RunId {
    let run = created(store, None, 2, HostIds::default());
    started(store, run, "instance");
    append(
        store,
        run,
        vec![Event::StepRunning {
            step: 0,
            process: Some(identity(300)),
        }],
    );
    run
}

fn paused_run(store: &Store) -> RunId {
    let run = created(store, Some("paused".to_string()), 2, HostIds::default());
    started(store, run, "instance");
    step_ran(store, run, 0, StepEnd::Complete);
    append(
        store,
        run,
        vec![Event::ControlRequested {
            action: ControlAction::Interrupt,
            by: "fuzz".to_string(),
            reason: "paused".to_string(),
        }],
    );
    ended(store, run, TerminalState::Paused, 130);
    run
}

fn resumed_run(store: &Store, paused: RunId) -> RunId {
    store
        .journal()
        .create_run_with(
            spec(Some("resumed".to_string()), 1),
            HostIds::default(),
            vec![Event::Resumed { from: paused }],
        )
        .expect("the paused run is resumed")
        .run
}

/// Two runs of queue `fuzz-q` (limit 1): the first admitted and complete, the second admitted
/// after it and running, and a third waiting.
fn queued_runs(store: &Store) -> Vec<RunId> {
    store
        .journal()
        .set_queue_limit("fuzz-q", 1)
        .expect("the queue's limit is set");
    let joined = || Event::QueueJoined {
        queue: "fuzz-q".to_string(),
        idle_timeout_ms: None,
        heartbeat_ms: Some(60_000),
    };
    let mut runs = Vec::new();
    for _ in 0..3 {
        let run = store
            .journal()
            .create_queued_run(spec(None, 1), HostIds::default(), joined())
            .expect("a queued run is created")
            .run;
        runs.push(run);
    }
    let admitted = |run| {
        append(
            store,
            run,
            vec![Event::QueueAdmitted {
                by: "fuzz".to_string(),
            }],
        );
    };
    admitted(runs[0]);
    started(store, runs[0], "instance");
    step_ran(store, runs[0], 0, StepEnd::Complete);
    ended(store, runs[0], TerminalState::Complete, 0);
    admitted(runs[1]);
    started(store, runs[1], "instance");
    runs
}

/// The pristine journal with the damages `data` describes, six bytes each: what (flip, zero,
/// copy a page over another, cut the file), which page (u16), where in it (u16), and a value
/// (the bits to flip, or the page to copy).
fn damage(journal: &[u8], data: &[u8]) -> Vec<u8> {
    let mut bytes = journal.to_vec();
    for chunk in data.chunks(6).take(MAX_DAMAGES) {
        let mut op = [0u8; 6];
        op[..chunk.len()].copy_from_slice(chunk);
        let pages = bytes.len().div_ceil(PAGE_BYTES).max(1);
        let page = usize::from(u16::from_le_bytes([op[1], op[2]])) % pages;
        let offset = usize::from(u16::from_le_bytes([op[3], op[4]])) % PAGE_BYTES;
        let at = (page * PAGE_BYTES + offset).min(bytes.len().saturating_sub(1));
        let page_range = |page: usize, len: usize| {
            let start = (page * PAGE_BYTES).min(len);
            start..(start + PAGE_BYTES).min(len)
        };
        match op[0] % 4 {
            0 if !bytes.is_empty() => bytes[at] ^= op[5].max(1),
            1 => {
                let range = page_range(page, bytes.len());
                bytes[range].fill(0);
            }
            2 => {
                let from = page_range(usize::from(op[5]) % pages, bytes.len());
                let to = page_range(page, bytes.len());
                let copied = bytes[from].to_vec();
                let len = copied.len().min(to.len());
                bytes[to.start..to.start + len].copy_from_slice(&copied[..len]);
            }
            3 => bytes.truncate(at),
            _ => {}
        }
    }
    bytes
}

/// Opens, reads, appends to and recovers the pristine journal damaged as `data` says
/// ([module docs](self)).
pub fn damaged_journal(data: &[u8]) {
    let pristine = pristine();
    let damaged = damage(&pristine.journal, data);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let home = Home::at(dir.path().join("home"));
    lay_out(&home, pristine, &damaged);

    match JournalReader::open(home.journal_path()) {
        Ok(reader) => check_reads(pristine, &reader),
        Err(error) => assert_no_panic_text(&error.to_string()),
    }

    let copy = dir.path().join("read-write.redb");
    write_private(&copy, &damaged);
    check_read_write(pristine, &copy);

    check_recover(pristine, &home);
}

/// A home holding the damaged journal and every run's intact events.jsonl.
fn lay_out(home: &Home, pristine: &Pristine, journal: &[u8]) {
    for dir in [
        home.root().to_path_buf(),
        home.runs_dir(),
        home.results_dir(),
    ] {
        crate::durable_fs::ensure_private_dir(&dir).expect("a home directory is made");
    }
    write_private(&home.journal_path(), journal);
    for (run, events) in &pristine.events {
        crate::durable_fs::ensure_private_dir(&home.run_dir(*run)).expect("a run directory");
        write_private(&home.events_path(*run), events);
    }
}

fn write_private(path: &Path, bytes: &[u8]) {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut file| file.write_all(bytes))
        .expect("a file of the fuzz home is written");
}

/// Damage is never taken for a storage failure that clears by waiting: the writer would retry
/// it for its whole window (ten minutes by default) and a command would seem to hang. (The
/// fuzz journals live in memory-backed files, where no real I/O error happens.)
fn assert_not_retried(error: &AppendError) {
    if let AppendError::Storage(failure) = error {
        assert_eq!(
            failure.class(),
            crate::capacity::FailureClass::NotStorage,
            "damage was taken for a storage failure to retry: {failure}"
        );
    }
}

/// A message shown to a person names no panic of our own: a contained panic is words about
/// damage, never a Rust panic's location in runjournal's code.
fn assert_no_panic_text(message: &str) {
    assert!(
        !message.contains("src/journal") && !message.contains("src/state"),
        "an error names a panic inside runjournal itself: {message}"
    );
}

/// Every read of the view returns without panicking, and what it returns is true.
fn check_reads(pristine: &Pristine, journal: &impl ReadJournal) {
    let view = match journal.view() {
        Ok(view) => view,
        Err(error) => return assert_no_panic_text(&error.to_string()),
    };
    for (run, made) in &pristine.records {
        if let Ok(records) = view.records(*run) {
            for record in &records {
                assert_record_made(pristine, record);
            }
        }
        if let Ok(Some(state)) = view.snapshot(*run) {
            assert_state_made(made, &state);
        }
        let _ = view.resume_links(*run);
        let _ = view.terminal_seq(*run);
    }
    if let Ok(records) = view.records_after(0, usize::MAX) {
        for (_, record) in &records {
            assert_record_made(pristine, record);
        }
    }
    let _ = view.scan_records(|_, _, record| {
        if let Ok(record) = record {
            assert_record_made(pristine, &record);
        }
        true
    });
    let _ = view.scan_snapshots(|run, state| {
        if let (Some(made), Ok(state)) = (pristine.records.get(&run), state) {
            assert_state_made(made, &state);
        }
        true
    });
    let _ = (view.meta(), view.all_runs(), view.active_runs());
    let _ = (view.queues(), view.queue_index(), view.aliases());
    let _ = (view.terminal_index(), view.resumes(), view.tombstones());
    let _ = (view.retention(), view.global_head(), view.record_count());
    let _ = view.resolve("run-1");
    let report = crate::verify::verify(&view, None);
    for problem in &report.problems {
        assert_no_panic_text(&problem.message);
    }
}

/// A record read back is the record made at its run and seq.
fn assert_record_made(pristine: &Pristine, record: &Record) {
    let made = pristine
        .records
        .get(&record.run_id)
        .and_then(|records| records.get(record.seq.saturating_sub(1) as usize));
    assert_eq!(
        made,
        Some(record),
        "a record read from the damaged journal is not the one made at run {} seq {}",
        record.run_id,
        record.seq
    );
}

/// A run's state read back is the fold of the records made up to its head.
fn assert_state_made(made: &[Record], state: &RunState) {
    let head = usize::try_from(state.head_seq).unwrap_or(usize::MAX);
    let folded = made
        .get(..head)
        .and_then(|records| state::replay(records).ok().flatten());
    assert_eq!(
        folded.as_ref(),
        Some(state),
        "a run's state read from the damaged journal is not the fold of its records"
    );
}

/// The journal opened for writing (which may repair it: a copy), read, and appended to.
fn check_read_write(pristine: &Pristine, path: &Path) {
    let options = WriterOptions {
        commit_sharing: CommitSharing::Alone,
        io_retry_window: Duration::ZERO,
        ..WriterOptions::default()
    };
    let journal = match Journal::open_with(Location::Path(path.to_path_buf()), options) {
        Ok(journal) => journal,
        Err(error) => return assert_no_panic_text(&error.to_string()),
    };
    check_reads(pristine, &journal);
    let created = journal.create_run(spec(None, 1), HostIds::default());
    if let Err(error) = &created {
        assert_not_retried(error);
    }
    if let Err(AppendError::Damaged(_)) = &created {
        let again = journal.append(
            RunId::generate(),
            vec![Event::Dismissed { at_ms: 1 }],
            Condition::none(),
        );
        assert!(
            matches!(again, Err(AppendError::Damaged(_))),
            "a writer that died of damage answers the next append with it: {again:?}"
        );
    }
    let dismissed =
        pristine.records.keys().next().map(|run| {
            journal.append(*run, vec![Event::Dismissed { at_ms: 2 }], Condition::none())
        });
    if let Some(Err(error)) = dismissed {
        assert_no_panic_text(&error.to_string());
        assert_not_retried(&error);
    }
    let _ = journal.set_queue_limit("fuzz-q", 2);
    let _ = journal.check_integrity();
    drop(journal);
}

/// Recovery rebuilds every run from its intact events.jsonl, or finds the journal whole.
fn check_recover(pristine: &Pristine, home: &Home) {
    match recover::recover_from_projections(home) {
        Ok(recovery) => {
            assert!(
                recovery.unrecoverable.is_empty(),
                "every run's events.jsonl is intact, yet some were not rebuilt: {:?}",
                recovery.unrecoverable
            );
            let rebuilt: Vec<RunId> = recovery.runs.iter().map(|run| run.run).collect();
            let made: Vec<RunId> = pristine.records.keys().copied().collect();
            assert_eq!(rebuilt, made, "every run is rebuilt");
            assert!(
                recovery
                    .moved_aside
                    .as_ref()
                    .is_some_and(|aside| aside.exists()),
                "the damaged journal is kept aside"
            );
            let reader =
                JournalReader::open(home.journal_path()).expect("the rebuilt journal opens");
            let view = reader.view().expect("a view of the rebuilt journal");
            assert_every_record_as_made(pristine, &view, "the rebuilt journal");
        }
        Err(RecoverError::NotLost { .. }) => {
            // Read as recover judged it: one flagged as not shut down cleanly (redb's god byte
            // says so) through a recovered private copy.
            let source = JournalSource::open(None, Some(&home.journal_path()), Layout::Runjournal)
                .unwrap_or_else(|error| {
                    panic!(
                        "a journal recover found whole opens: {}",
                        with_sources(&error)
                    )
                });
            let view = source.view().expect("a view");
            assert_every_record_as_made(pristine, &view, "a journal recover found whole");
        }
        Err(error) => panic!(
            "recover failed on a home whose every events.jsonl is intact: {}",
            with_sources(&error)
        ),
    }
}

fn assert_every_record_as_made(pristine: &Pristine, view: &View, what: &str) {
    for (run, made) in &pristine.records {
        let records = view
            .records(*run)
            .unwrap_or_else(|error| panic!("{what}: run {run} does not read: {error}"));
        assert_eq!(&records, made, "{what}: run {run} holds other records");
    }
}

/// The corpus seeds: damages of every kind at pages spread over the pristine journal, as
/// `(name, bytes)`.
pub fn damaged_journal_seeds() -> Vec<(String, Vec<u8>)> {
    let pages = pristine().journal.len().div_ceil(PAGE_BYTES);
    let op = |kind: u8, page: usize, offset: u16, value: u8| -> Vec<u8> {
        let page = u16::try_from(page).unwrap_or(u16::MAX).to_le_bytes();
        let offset = offset.to_le_bytes();
        vec![kind, page[0], page[1], offset[0], offset[1], value]
    };
    let mut seeds = vec![("nothing".to_string(), Vec::new())];
    for page in 0..pages {
        seeds.push((format!("flip-page-{page}"), op(0, page, 100, 0xff)));
        seeds.push((format!("zero-page-{page}"), op(1, page, 0, 0)));
    }
    // Each of four pages zeroed and made a b-tree branch whose one child names a page of
    // order 19 (2 GiB): redb would allocate the whole page before reading it. Every page is in
    // one of these seeds, so whichever pages the journal's trees hold, some seed damages one a
    // read reaches.
    for first in (1..pages).step_by(4) {
        let bytes = (first..(first + 4).min(pages))
            .flat_map(|page| {
                [
                    op(1, page, 0, 0),
                    op(0, page, 0, BRANCH_PAGE),
                    op(0, page, HUGE_CHILD_ORDER_BYTE, HUGE_CHILD_ORDER_BITS),
                ]
                .concat()
            })
            .collect();
        seeds.push((format!("huge-page-pointer-from-page-{first}"), bytes));
    }
    seeds.push(("flip-header-magic".to_string(), op(0, 0, 3, 0x01)));
    seeds.push(("flip-commit-slot".to_string(), op(0, 0, 200, 0x10)));
    seeds.push(("copy-page-2-over-3".to_string(), op(2, 3, 0, 2)));
    seeds.push(("cut-mid-file".to_string(), op(3, pages / 2, 7, 0)));
    seeds.push((
        "flip-two-pages".to_string(),
        [op(0, 1, 40, 0x04), op(0, pages - 1, 4000, 0x80)].concat(),
    ));
    seeds
}

/// An error and its sources, one after another.
fn with_sources(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
