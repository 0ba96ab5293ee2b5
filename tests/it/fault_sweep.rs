//! ENOSPC at the k-th write or sync of a scripted lifecycle, for every k (issue 5, item 8).
//!
//! The journal runs on an in-memory disk (tests/support/mem_disk.rs) that fails with ENOSPC at
//! the k-th write, or the k-th sync, in two modes: that one call only, or that call and every
//! write and sync after it until the test "frees space", which it does once the writer has
//! failed a few times. In every case the writer rides it out: each append gets the answer it
//! gets without the fault, and the final journal equals the fault-free one, run by run, record
//! by record, index by index, and passes redb's integrity check.

use crate::support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use runjournal::event::Event;
use runjournal::journal::{OpenError, WriterOptions};
use runjournal::{Condition, Journal, RunId};
use support::mem_disk::{Call, Fault, MemDisk};
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

/// Whether an open failed for lack of space (the disk is full while the journal is created).
fn is_out_of_space(error: &OpenError) -> bool {
    match error {
        OpenError::Io { source, .. } => source.raw_os_error() == Some(28),
        OpenError::Storage(failure) => failure.is_capacity(),
        _ => false,
    }
}

/// Opens the journal, riding out ENOSPC during its creation the way a caller would: the open
/// fails with a capacity error, and succeeds once space is back.
fn open(disk: &Arc<MemDisk>, label: &str) -> Journal {
    for _ in 0..3 {
        match Journal::open_with(disk.source(), WriterOptions::default()) {
            Ok(journal) => return journal,
            Err(error) => {
                assert!(
                    is_out_of_space(&error),
                    "{label}: the open fails only for lack of space: {error:?}"
                );
                disk.free_space();
            }
        }
    }
    panic!("{label}: the journal does not open after space was freed");
}

/// The answers of one run of the script, and the journal it left.
struct Outcome {
    answers: Vec<(RunId, String)>,
    summary: Summary,
    writer_failures: u64,
    /// Appends whose commit landed although the writer saw it fail: answered from the records
    /// on the retry.
    duplicates: u64,
}

/// Runs the script on a disk with `fault`; frees space once the writer failed a few times.
fn run_case(fault: Fault, label: &str) -> Outcome {
    let disk = MemDisk::new(fault);
    let journal = open(&disk, label);
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
    let writer_failures = journal.writer_stats().failures.load(Ordering::Relaxed);
    drop(journal);
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
        duplicates: attempts
            .iter()
            .filter(|attempt| matches!(&attempt.result, Ok(appended) if appended.was_duplicate))
            .count() as u64,
    }
}

/// Sweeps ENOSPC over every `on` call of the script, in one mode.
fn sweep(on: Call, is_persistent: bool) {
    let reference_disk = MemDisk::new(Fault::None);
    let reference = {
        let journal = open(&reference_disk, "fault-free");
        let attempts = script::run(&journal);
        drop(journal);
        attempts
    };
    let (writes, syncs) = reference_disk.counts();
    let reference = {
        let journal = open(&reference_disk, "fault-free, reopened");
        Outcome {
            answers: reference
                .iter()
                .map(|attempt| (attempt.run, attempt.outcome()))
                .collect(),
            summary: summarize(&journal),
            writer_failures: 0,
            duplicates: 0,
        }
    };
    assert!(
        reference.summary.runs.len() >= 8 && reference.summary.records >= 50,
        "the script makes a lifecycle worth sweeping: {} runs, {} records",
        reference.summary.runs.len(),
        reference.summary.records
    );
    let total = match on {
        Call::Write => writes,
        Call::Sync => syncs,
    };
    let next = AtomicU64::new(1);
    let recovered = AtomicU64::new(0);
    let duplicates = AtomicU64::new(0);
    std::thread::scope(|scope| {
        for _ in 0..WORKERS {
            scope.spawn(|| {
                loop {
                    let at = next.fetch_add(1, Ordering::Relaxed);
                    if at > total {
                        return;
                    }
                    let mode = if is_persistent { "until freed" } else { "once" };
                    let label = format!("ENOSPC at {on:?} {at} of {total} ({mode})");
                    let outcome = run_case(
                        Fault::Enospc {
                            on,
                            at,
                            is_persistent,
                        },
                        &label,
                    );
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
                }
            });
        }
    });
    let recovered = recovered.load(Ordering::Relaxed);
    let duplicates = duplicates.load(Ordering::Relaxed);
    eprintln!(
        "ENOSPC at each of {total} {on:?} calls ({}): the writer recovered from {recovered} failed commits; {duplicates} appends had landed before the failure and were answered from their records",
        if is_persistent { "until freed" } else { "once" }
    );
    assert!(
        recovered * 2 >= total,
        "most faults hit a commit the writer had to retry ({recovered} of {total})"
    );
}

#[test]
fn enospc_once_at_any_write_delays_and_loses_nothing() {
    sweep(Call::Write, false);
}

#[test]
fn enospc_once_at_any_sync_delays_and_loses_nothing() {
    sweep(Call::Sync, false);
}

#[test]
fn enospc_at_any_write_until_space_is_freed_delays_and_loses_nothing() {
    sweep(Call::Write, true);
}

#[test]
fn enospc_at_any_sync_until_space_is_freed_delays_and_loses_nothing() {
    sweep(Call::Sync, true);
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
        while disk.lock_waiters() == 0 {
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
