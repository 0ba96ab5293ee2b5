//! A storage error at the k-th call of a scripted lifecycle, for every k: ENOSPC at every write
//! and sync; EIO at every write, sync, read, `len`, `set_len` and open of the journal file.
//!
//! The journal runs on an in-memory disk (tests/it/support/mem_disk.rs) that fails the k-th call
//! of one kind, in two modes: that one call only, or that call and every call after it (for
//! ENOSPC, every write and sync; for EIO, every call of every kind, opens included: a flaky
//! disk for a window) until the test heals the disk, which it does once the writer has failed
//! a few times. In every case the writer rides it out: each append gets the answer it gets
//! without the fault, and the final journal equals the fault-free one, run by run, record by
//! record, index by index, and passes redb's integrity check.

use crate::support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use runjournal::event::Event;
use runjournal::journal::{OpenError, WriterOptions};
use runjournal::{Condition, Journal, RunId};
use support::mem_disk::{Call, EIO, ENOSPC, Fault, MemDisk};
use support::script;

/// Writer failures after which a persistent ENOSPC is lifted ("space is freed").
const FAILURES_BEFORE_FREEING: u64 = 2;

/// How long one case may take before the test calls it stuck.
const CASE_DEADLINE: Duration = Duration::from_secs(60);

/// Cases run at once: most of a case is the writer's backoff sleep.
const WORKERS: u64 = 6;

/// What two journals must agree on: per run its (seq, event) list (writer ids and times
/// differ between runs of the script), and the indexes by run.
#[derive(Debug, PartialEq)]
struct Summary {
    runs: BTreeMap<RunId, Vec<(u64, Event)>>,
    active: Vec<RunId>,
    terminal: Vec<RunId>,
    aliases: Vec<(String, RunId)>,
    records: u64,
    global_head: u64,
}

fn summarize(journal: &Journal) -> Summary {
    let view = journal.view().expect("a read view");
    let checked = support::check_journal(&view, None);
    let runs = checked
        .into_iter()
        .map(|(state, records)| {
            let events = records
                .into_iter()
                .map(|record| (record.seq, record.event))
                .collect();
            (state.run_id, events)
        })
        .collect();
    let mut terminal: Vec<RunId> = view
        .terminal_index()
        .expect("terminal index")
        .into_iter()
        .map(|(_, run)| run)
        .collect();
    terminal.sort();
    Summary {
        runs,
        active: view.active_runs().expect("active runs"),
        terminal,
        aliases: view.aliases().expect("aliases"),
        records: view.record_count().expect("record count"),
        global_head: view.global_head().expect("global head"),
    }
}

/// Whether an open failed on the injected storage error (the disk is full, or failing, while
/// the journal is opened or created).
fn is_injected(error: &OpenError, errno: i32) -> bool {
    match error {
        OpenError::Io { source, .. } => source.raw_os_error() == Some(errno),
        OpenError::Storage(failure) => {
            failure
                .io_error()
                .and_then(std::io::Error::raw_os_error)
                .is_some_and(|code| code == errno)
                || (errno == ENOSPC && failure.is_capacity())
                || matches!(failure.source, redb::Error::PreviousIo)
        }
        _ => false,
    }
}

/// Opens the journal, riding out a storage error during its opening or creation the way a
/// caller would: the open fails with the error, and succeeds once the disk is healed. Returns
/// the journal and how many opens failed.
fn open_counting(disk: &Arc<MemDisk>, label: &str, errno: i32) -> (Journal, u64) {
    let mut failed = 0;
    for _ in 0..3 {
        match Journal::open_with(disk.source(), WriterOptions::default()) {
            Ok(journal) => return (journal, failed),
            Err(error) => {
                assert!(
                    is_injected(&error, errno),
                    "{label}: the open fails only with the injected error: {error:?}"
                );
                failed += 1;
                disk.free_space();
            }
        }
    }
    panic!("{label}: the journal does not open after the disk was healed");
}

fn open(disk: &Arc<MemDisk>, label: &str) -> Journal {
    open_counting(disk, label, ENOSPC).0
}

/// The answers of one run of the script, and the journal it left.
struct Outcome {
    answers: Vec<(RunId, String)>,
    summary: Summary,
    /// Failed commits the writer retried, plus failed opens the caller retried.
    writer_failures: u64,
    /// Calls of each kind the disk failed on purpose (see [`Call::ALL`]).
    injected: [u64; 6],
    /// Appends whose commit landed although the writer saw it fail: answered from the records
    /// on the retry.
    duplicates: u64,
}

/// Runs the script on a disk with `fault` (of OS error `errno`); heals the disk once the
/// writer failed a few times.
fn run_case(fault: Fault, errno: i32, label: &str) -> Outcome {
    let disk = MemDisk::new(fault);
    let (journal, failed_opens) = open_counting(&disk, label, errno);
    let started = Instant::now();
    let attempts = std::thread::scope(|scope| {
        let script = scope.spawn(|| script::run(&journal));
        while !script.is_finished() {
            if journal.writer_stats().failures.load(Ordering::Relaxed) >= FAILURES_BEFORE_FREEING {
                disk.free_space();
            }
            assert!(
                started.elapsed() < CASE_DEADLINE,
                "{label}: the script did not finish within {CASE_DEADLINE:?}"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        script.join().expect("the script thread")
    });
    let writer_failures = journal.writer_stats().failures.load(Ordering::Relaxed) + failed_opens;
    assert_eq!(
        journal.writer_stats().give_ups.load(Ordering::Relaxed),
        0,
        "{label}: the writer never gave up within its retry window"
    );
    drop(journal);
    let injected = Call::ALL.map(|call| disk.injected_on(call));
    // The journal as a new process finds it (a failure in the handle's shutdown included),
    // with the fault over.
    disk.disarm();
    let journal = open(&disk, label);
    let summary = summarize(&journal);
    assert!(
        journal
            .check_integrity()
            .unwrap_or_else(|error| panic!("{label}: integrity check runs: {error}")),
        "{label}: redb's integrity check passes"
    );
    Outcome {
        answers: attempts
            .iter()
            .map(|attempt| (attempt.run, attempt.outcome()))
            .collect(),
        summary,
        writer_failures,
        injected,
        duplicates: attempts
            .iter()
            .filter(|attempt| matches!(&attempt.result, Ok(appended) if appended.was_duplicate))
            .count() as u64,
    }
}

/// What a sweep saw, over all its cases.
struct Swept {
    /// Calls of each kind failed on purpose, over all cases.
    injected: [u64; 6],
}

/// Sweeps the OS error `errno` over every `on` call of the script, in one mode: the k-th call
/// only, or from the k-th call on until the disk is healed.
fn sweep(on: Call, errno: i32, is_persistent: bool) -> Swept {
    let name = if errno == ENOSPC { "ENOSPC" } else { "EIO" };
    let reference_disk = MemDisk::new(Fault::None);
    let reference = {
        let journal = open(&reference_disk, "fault-free");
        let attempts = script::run(&journal);
        drop(journal);
        attempts
    };
    let total = reference_disk.count(on);
    let reference = {
        let journal = open(&reference_disk, "fault-free, reopened");
        Outcome {
            answers: reference
                .iter()
                .map(|attempt| (attempt.run, attempt.outcome()))
                .collect(),
            summary: summarize(&journal),
            writer_failures: 0,
            injected: [0; 6],
            duplicates: 0,
        }
    };
    assert!(
        reference.summary.runs.len() >= 8 && reference.summary.records >= 50,
        "the script makes a lifecycle worth sweeping: {} runs, {} records",
        reference.summary.runs.len(),
        reference.summary.records
    );
    assert!(total >= 1, "the script makes {on:?} calls to sweep");
    let next = AtomicU64::new(1);
    let recovered = AtomicU64::new(0);
    let duplicates = AtomicU64::new(0);
    let injected = std::sync::Mutex::new([0u64; 6]);
    std::thread::scope(|scope| {
        for _ in 0..WORKERS {
            scope.spawn(|| {
                loop {
                    let at = next.fetch_add(1, Ordering::Relaxed);
                    if at > total {
                        return;
                    }
                    let mode = if is_persistent {
                        "until healed"
                    } else {
                        "once"
                    };
                    let label = format!("{name} at {on:?} {at} of {total} ({mode})");
                    let fault = if errno == ENOSPC {
                        Fault::Enospc {
                            on,
                            at,
                            is_persistent,
                        }
                    } else {
                        Fault::Fail {
                            on,
                            at,
                            errno,
                            is_persistent,
                        }
                    };
                    let outcome = run_case(fault, errno, &label);
                    assert_eq!(
                        outcome.answers, reference.answers,
                        "{label}: every append gets the answer it gets without the fault"
                    );
                    assert_eq!(
                        outcome.summary, reference.summary,
                        "{label}: the journal equals the fault-free one"
                    );
                    if outcome.writer_failures > 0 {
                        recovered.fetch_add(1, Ordering::Relaxed);
                    }
                    duplicates.fetch_add(outcome.duplicates, Ordering::Relaxed);
                    let mut injected = injected
                        .lock()
                        .unwrap_or_else(|poisoned| poisoned.into_inner());
                    for (sum, count) in injected.iter_mut().zip(outcome.injected) {
                        *sum += count;
                    }
                }
            });
        }
    });
    let recovered = recovered.load(Ordering::Relaxed);
    let duplicates = duplicates.load(Ordering::Relaxed);
    let injected = injected
        .into_inner()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    eprintln!(
        "{name} at each of {total} {on:?} calls ({}): {recovered} cases retried a failed commit or open; {duplicates} appends had landed before the failure and were answered from their records; calls failed on purpose: {}",
        if is_persistent {
            "until healed"
        } else {
            "once"
        },
        Call::ALL
            .iter()
            .zip(injected)
            .map(|(call, count)| format!("{call:?} {count}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    assert!(
        recovered * 2 >= total,
        "most faults hit a commit or an open that had to be retried ({recovered} of {total})"
    );
    Swept { injected }
}

#[test]
fn enospc_once_at_any_write_delays_and_loses_nothing() {
    sweep(Call::Write, ENOSPC, false);
}

#[test]
fn enospc_once_at_any_sync_delays_and_loses_nothing() {
    sweep(Call::Sync, ENOSPC, false);
}

#[test]
fn enospc_at_any_write_until_space_is_freed_delays_and_loses_nothing() {
    sweep(Call::Write, ENOSPC, true);
}

#[test]
fn enospc_at_any_sync_until_space_is_freed_delays_and_loses_nothing() {
    sweep(Call::Sync, ENOSPC, true);
}

#[test]
fn eio_once_at_any_write_is_retried_and_loses_nothing() {
    sweep(Call::Write, EIO, false);
}

#[test]
fn eio_once_at_any_sync_is_retried_on_a_fresh_handle_and_loses_nothing() {
    sweep(Call::Sync, EIO, false);
}

/// From the k-th write on, every call fails (reopens too) until the disk is healed.
#[test]
fn eio_for_a_window_from_any_write_is_ridden_out_and_loses_nothing() {
    let swept = sweep(Call::Write, EIO, true);
    assert!(
        swept.injected[Call::Open.index()] > 0,
        "reopens failed during the window: {:?}",
        swept.injected
    );
}

#[test]
fn eio_for_a_window_from_any_sync_is_ridden_out_and_loses_nothing() {
    let swept = sweep(Call::Sync, EIO, true);
    assert!(swept.injected[Call::Open.index()] > 0);
}

#[test]
fn eio_once_and_for_a_window_at_any_read_is_ridden_out_and_loses_nothing() {
    for is_persistent in [false, true] {
        let swept = sweep(Call::Read, EIO, is_persistent);
        assert!(swept.injected[Call::Read.index()] > 0);
    }
}

#[test]
fn eio_once_and_for_a_window_at_any_len_or_set_len_is_ridden_out_and_loses_nothing() {
    for call in [Call::Len, Call::SetLen] {
        for is_persistent in [false, true] {
            sweep(call, EIO, is_persistent);
        }
    }
}

/// Opening the journal file fails: the first open (the caller retries it), and in the window
/// mode every open after it until the disk is healed.
#[test]
fn eio_at_any_open_is_ridden_out_and_loses_nothing() {
    for is_persistent in [false, true] {
        let swept = sweep(Call::Open, EIO, is_persistent);
        assert!(swept.injected[Call::Open.index()] >= 1);
    }
}

/// The answers of a refused append and a legal one that the writer commits in one group, with
/// ENOSPC at the sync `fail_sync` (or none), and how many commits the writer saw fail.
fn grouped_refusal(fail_sync: Option<u64>) -> (GroupedAnswers, u64) {
    let fault = match fail_sync {
        Some(at) => Fault::Enospc {
            on: Call::Sync,
            at,
            is_persistent: false,
        },
        None => Fault::None,
    };
    let disk = MemDisk::new(fault);
    let journal = open(&disk, "grouped");
    let (first, second) = (script::run_id(1), script::run_id(2));
    for run in [first, second] {
        journal
            .append(
                run,
                vec![script::created_event(run)],
                Condition::expect_head(0),
            )
            .expect("create");
    }
    // A second handle's write transaction holds redb's writer lock: the journal's writer takes
    // the next append as a group of its own and waits; what comes meanwhile queues up.
    let holder = redb::Database::builder()
        .set_concurrency_mode(redb::ConcurrencyMode::MultiWriter)
        .create_with_backend(disk.backend())
        .expect("a second handle");
    let held = holder.begin_write().expect("hold the writer lock");
    let submitted = || journal.writer_stats().submitted.load(Ordering::Relaxed);
    // Bounded waits for appends to enter the queue; nothing depends on how long they take.
    let wait_submitted = |count: u64| {
        let waited = Instant::now();
        while submitted() < count {
            assert!(
                waited.elapsed() < Duration::from_secs(10),
                "{count} appends are queued"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    };
    let before = submitted();
    let answers = std::thread::scope(|scope| {
        let started = scope.spawn(|| {
            journal.append(
                first,
                vec![script::runner_started_event("a")],
                Condition::expect_head(1),
            )
        });
        let waited = Instant::now();
        let refused_before = disk.lock_refusals();
        while disk.lock_waiters() == 0 && disk.lock_refusals() == refused_before {
            assert!(
                waited.elapsed() < Duration::from_secs(10),
                "the writer waits for the lock"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        // Refused: the append above moves the head to 2 first.
        let refused = scope.spawn(|| {
            journal.append(
                first,
                vec![script::runner_started_event("b")],
                Condition::expect_head(1),
            )
        });
        wait_submitted(before + 2);
        let legal = scope.spawn(|| {
            journal.append(
                second,
                vec![script::runner_started_event("c")],
                Condition::expect_head(1),
            )
        });
        wait_submitted(before + 3);
        drop(held);
        started
            .join()
            .expect("thread")
            .expect("the first append lands");
        GroupedAnswers {
            refused: refused.join().expect("thread"),
            legal: legal.join().expect("thread"),
            syncs_after: disk.counts().1,
        }
    });
    let failures = journal.writer_stats().failures.load(Ordering::Relaxed);
    (answers, failures)
}

struct GroupedAnswers {
    refused: Result<runjournal::journal::Appended, runjournal::journal::AppendError>,
    legal: Result<runjournal::journal::Appended, runjournal::journal::AppendError>,
    syncs_after: u64,
}

/// Regression: when a group's commit landed but reported a failure (its last sync failed),
/// the retry answered a batch of the group that had been refused (here a head mismatch) with
/// "writer reused writer seq", an internal error, instead of its refusal: the writer mark had
/// moved past its seq, and it had written no records to be recognised by.
#[test]
fn a_refused_append_in_a_group_whose_commit_landed_unacknowledged_gets_its_refusal() {
    use runjournal::journal::AppendError;
    let (probe, _) = grouped_refusal(None);
    assert!(
        matches!(probe.refused, Err(AppendError::HeadMismatch { .. })),
        "without a fault: {:?}",
        probe.refused
    );
    assert!(probe.legal.is_ok());
    // The group's last sync is the last sync of the probe: fail it.
    let (faulted, failures) = grouped_refusal(Some(probe.syncs_after));
    assert!(failures >= 1, "the group's commit failed once");
    let legal = faulted.legal.expect("the legal append is acknowledged");
    assert!(
        legal.was_duplicate,
        "the failed commit had landed (the scenario needs it)"
    );
    assert!(
        matches!(faulted.refused, Err(AppendError::HeadMismatch { .. })),
        "the refused append gets its refusal: {:?}",
        faulted.refused
    );
}

/// Storage errors that outlast the retry window: the waiting append gets the error (the writer
/// tried again and again meanwhile, and said it was blocked, then that it gave up), the next
/// append is tried once, and once the disk is healed appends land again; nothing acknowledged
/// is lost.
#[test]
fn eio_past_the_retry_window_fails_the_waiting_append_and_the_writer_works_again_once_healed() {
    use runjournal::capacity::BlockCause;
    use runjournal::journal::{AppendError, CapacityEvent};
    let disk = MemDisk::new(Fault::None);
    let events: Arc<std::sync::Mutex<Vec<CapacityEvent>>> = Arc::default();
    let listened = Arc::clone(&events);
    let options = WriterOptions {
        io_retry_window: Duration::from_millis(300),
        listener: Some(Arc::new(move |event: &CapacityEvent| {
            listened
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .push(event.clone());
        })),
        ..WriterOptions::default()
    };
    let journal = Journal::open_with(disk.source(), options).expect("open");
    let run = script::run_id(1);
    let created = journal
        .append(
            run,
            vec![script::created_event(run)],
            Condition::expect_head(0),
        )
        .expect("the run is created");
    assert_eq!(created.last_seq, 1);

    disk.set_fault(Fault::Fail {
        on: Call::Write,
        at: disk.count(Call::Write) + 1,
        errno: EIO,
        is_persistent: true,
    });
    let failed = journal.append(
        run,
        vec![script::runner_started_event("a")],
        Condition::expect_head(1),
    );
    let failure = match failed {
        Err(AppendError::Storage(failure)) => failure,
        other => panic!("the append fails with the storage error: {other:?}"),
    };
    assert_eq!(
        failure.io_error().and_then(std::io::Error::raw_os_error),
        Some(EIO)
    );
    let stats = journal.writer_stats();
    let failures = stats.failures.load(Ordering::Relaxed);
    assert!(
        failures > 1,
        "it was retried within the window ({failures})"
    );
    assert_eq!(stats.give_ups.load(Ordering::Relaxed), 1);

    // Still failing: the next append gets one attempt, not another window.
    let again = journal.append(
        run,
        vec![script::runner_started_event("a")],
        Condition::expect_head(1),
    );
    assert!(matches!(again, Err(AppendError::Storage(_))), "{again:?}");
    assert_eq!(stats.failures.load(Ordering::Relaxed), failures + 1);
    assert_eq!(stats.give_ups.load(Ordering::Relaxed), 1);

    disk.free_space();
    let landed = journal
        .append(
            run,
            vec![script::runner_started_event("a")],
            Condition::expect_head(1),
        )
        .expect("healed: the append lands");
    assert_eq!(landed.last_seq, 2);
    let events = events
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .clone();
    assert!(
        matches!(
            events.as_slice(),
            [
                CapacityEvent::Blocked {
                    cause: BlockCause::Io { errno: EIO },
                    ..
                },
                CapacityEvent::GaveUp { .. },
                CapacityEvent::Unblocked { .. },
            ]
        ),
        "blocked on EIO, gave up, unblocked: {events:?}"
    );
    drop(journal);
    disk.disarm();
    let journal = open(&disk, "healed");
    let view = journal.view().expect("view");
    let (_, records) = support::check_run(&view, run);
    assert_eq!(
        support::events(&records),
        vec![
            script::created_event(run),
            script::runner_started_event("a")
        ],
        "the acknowledged records, once each"
    );
}
