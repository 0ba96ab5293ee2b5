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

#[cfg(all(test, not(loom)))]
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
