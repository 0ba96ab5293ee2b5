//! Projections that failed (a full disk, say) and wait to be written again.
//!
//! Only the run and the head it must reach are kept: a retry projects the run's latest state
//! from the journal, so the newest payload always wins and an older one can never overwrite
//! it.
//!
//! Invariants:
//! * an entry leaves the map only when a projection at or past its wanted head succeeded;
//! * the wanted head of an entry never goes down.

use std::collections::BTreeMap;

use crate::event::RunId;
use crate::sync::{self, Mutex};

/// One run waiting to be projected again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pending {
    /// The head the projection must reflect.
    pub wanted_seq: u64,
    /// Failed attempts so far.
    pub attempts: u32,
}

/// The runs waiting to be projected again.
#[derive(Debug, Default)]
pub struct PendingProjections {
    runs: Mutex<BTreeMap<RunId, Pending>>,
}

impl PendingProjections {
    pub fn new() -> PendingProjections {
        PendingProjections::default()
    }

    /// A projection of `run` that had to reflect `wanted_seq` failed.
    pub fn failed(&self, run: RunId, wanted_seq: u64) {
        let mut runs = sync::lock(&self.runs);
        let entry = runs.entry(run).or_insert(Pending {
            wanted_seq,
            attempts: 0,
        });
        entry.wanted_seq = entry.wanted_seq.max(wanted_seq);
        entry.attempts = entry.attempts.saturating_add(1);
    }

    /// A projection of `run` reflecting `projected_seq` succeeded.
    pub fn succeeded(&self, run: RunId, projected_seq: u64) {
        let mut runs = sync::lock(&self.runs);
        if runs
            .get(&run)
            .is_some_and(|pending| pending.wanted_seq <= projected_seq)
        {
            runs.remove(&run);
        }
    }

    /// The runs waiting, with what they wait for.
    pub fn snapshot(&self) -> Vec<(RunId, Pending)> {
        let runs = sync::lock(&self.runs);
        runs.iter().map(|(run, pending)| (*run, *pending)).collect()
    }

    /// How many runs wait.
    pub fn count(&self) -> usize {
        sync::lock(&self.runs).len()
    }

    /// The most failed attempts of any waiting run (for the retry backoff).
    pub fn max_attempts(&self) -> u32 {
        sync::lock(&self.runs)
            .values()
            .map(|pending| pending.attempts)
            .max()
            .unwrap_or(0)
    }
}

#[cfg(all(test, not(runjournal_loom)))]
mod tests {
    use super::*;

    #[test]
    fn an_older_success_does_not_clear_a_newer_failure() {
        let pending = PendingProjections::new();
        let run = RunId::from_bytes([1; 16]);
        pending.failed(run, 5);
        pending.succeeded(run, 4);
        assert_eq!(pending.count(), 1, "head 5 is still unprojected");
        pending.failed(run, 3);
        assert_eq!(
            pending.snapshot()[0].1.wanted_seq,
            5,
            "the wanted head never goes down"
        );
        pending.succeeded(run, 5);
        assert_eq!(pending.count(), 0);
    }
}

/// Every interleaving of projections failing and succeeding, explored by loom
/// (`RUSTFLAGS="--cfg runjournal_loom" cargo test --release --lib loom`).
#[cfg(all(test, runjournal_loom))]
mod loom_tests {
    use loom::sync::atomic::{AtomicU64, Ordering};
    use loom::thread;

    use super::*;
    use crate::sync::Arc;

    const RUN: RunId = RunId::from_bytes([1; 16]);

    fn wanted(pending: &PendingProjections) -> Option<u64> {
        pending
            .snapshot()
            .into_iter()
            .find(|(run, _)| *run == RUN)
            .map(|(_, pending)| pending.wanted_seq)
    }

    /// A success that reflects an older head, landing before or after a failure at a newer
    /// head, never clears it.
    #[test]
    fn an_older_success_never_clears_a_newer_failure() {
        loom::model(|| {
            let pending = Arc::new(PendingProjections::new());
            let older = thread::spawn({
                let pending = Arc::clone(&pending);
                move || pending.succeeded(RUN, 4)
            });
            pending.failed(RUN, 5);
            older.join().expect("the older projection");
            assert_eq!(wanted(&pending), Some(5));
        });
    }

    /// Failures from two threads: the wanted head is the highest failed one and never goes
    /// down, as a third thread watching sees, and every attempt is counted.
    #[test]
    fn the_wanted_head_never_goes_down_and_every_failure_counts() {
        loom::model(|| {
            let pending = Arc::new(PendingProjections::new());
            let second = thread::spawn({
                let pending = Arc::clone(&pending);
                move || pending.failed(RUN, 4)
            });
            let watcher = thread::spawn({
                let pending = Arc::clone(&pending);
                move || {
                    let first = wanted(&pending);
                    let then = wanted(&pending);
                    if let (Some(first), Some(then)) = (first, then) {
                        assert!(then >= first, "wanted went down from {first} to {then}");
                    }
                    assert!(
                        first.is_none() || then.is_some(),
                        "an entry left without a success"
                    );
                }
            });
            pending.failed(RUN, 3);
            pending.failed(RUN, 5);
            second.join().expect("the second thread");
            watcher.join().expect("the watcher");
            let entries = pending.snapshot();
            assert_eq!(
                entries,
                vec![(
                    RUN,
                    Pending {
                        wanted_seq: 5,
                        attempts: 3
                    }
                )]
            );
        });
    }

    /// The store's protocol: a committer moves the head to 6 and its projection fails; a retry
    /// pass meanwhile projects whatever head it reads and reports success at that head. If the
    /// run is no longer pending at the end, the retry must have projected head 6 or later.
    #[test]
    fn a_retry_clears_a_failure_only_by_projecting_its_head_or_later() {
        loom::model(|| {
            let pending = Arc::new(PendingProjections::new());
            let head = Arc::new(AtomicU64::new(5));
            pending.failed(RUN, 5);
            let retry = thread::spawn({
                let pending = Arc::clone(&pending);
                let head = Arc::clone(&head);
                move || {
                    let projected = head.load(Ordering::SeqCst);
                    pending.succeeded(RUN, projected);
                    projected
                }
            });
            head.store(6, Ordering::SeqCst);
            pending.failed(RUN, 6);
            let projected = retry.join().expect("the retry pass");
            match wanted(&pending) {
                None => assert!(
                    projected >= 6,
                    "cleared by a projection of head {projected}"
                ),
                Some(wanted) => assert_eq!(wanted, 6),
            }
        });
    }
}
