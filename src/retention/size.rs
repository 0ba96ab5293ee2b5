//! The home's size, kept as the journal learns it, so that a pass with `max_size` costs what
//! the active runs hold, not what every kept run holds (docs/design.md, "Retention").
//!
//! The journal keeps (meta `home_size`, [`KeptSize`]) the bytes of `runs/` and `results/` as
//! the last walk found them, plus the bytes of each run counted since; and through which
//! ended run they are counted (a key of the terminal index). A pass then measures only what
//! the count does not hold: each run that ended since (it is counted from then on: once per
//! run) and each run not yet ended (its files still grow). The journal file and the reserve are
//! one `stat` each. A prune takes the pruned runs' bytes off the count. What a count misses —
//! a file grown after its run was counted (a line of `runner.log`, a marker), a result the
//! host consumed, a crash between a prune and its count's update — the next walk corrects:
//! every [`WALK_EVERY`], and before space pressure prunes anything on the count's word, at
//! most once every [`WALK_UNDER_PRESSURE_EVERY`].
//!
//! Invariants:
//! * a run is counted at most once: a run is in the count exactly when its terminal key is at
//!   or below the cursor, and a prune subtracts only such runs;
//! * without a walk, a pass's cost follows the runs that ended since the last pass and the
//!   runs still active, never the runs kept;
//! * the count is written in a transaction of its own, only when it changed, and re-read
//!   there: a pass that raced another keeps the other's cursor and adds nothing twice.

use std::time::Duration;

use crate::event::{RunId, UnixMs, now_ms};
use crate::home::Home;
use crate::journal::{AppendError, Journal, ReadError, View};
use crate::state::RunState;

use super::{file_bytes, run_bytes, tree_bytes};

/// How often the home is walked whatever the count says: a walk costs what every kept run's
/// files hold (about a second for 20,000 runs on a busy disk), so once in ten minutes of passes
/// it is a fraction of a percent of their time, and what the count misses in between (files
/// grown after their run was counted, results consumed) stays ten minutes' worth.
pub const WALK_EVERY: Duration = Duration::from_secs(10 * 60);

/// How often, at most, a count that says the home is over its bound is checked by a walk
/// before a pass prunes for it: no run is pruned for space on a drifted count, and a home
/// that stays over its bound (its runs all kept for other reasons) is walked once a minute,
/// not by every pass.
pub const WALK_UNDER_PRESSURE_EVERY: Duration = Duration::from_secs(60);

/// The size the journal keeps (meta `home_size`, 42 bytes): version 1, then the bytes of
/// `runs/` and `results/` (u64 BE), the last walk's time (Unix ms, u64 BE), then a flag and the
/// cursor: the terminal key (end time u64 BE, run id 16 bytes) of the last run counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeptSize {
    /// The bytes under `runs/` and `results/` of everything counted.
    pub bytes: u64,
    pub walked_at_ms: UnixMs,
    /// Every run whose terminal key is at or below this is counted (`None`: none ended yet).
    pub through: Option<(UnixMs, RunId)>,
}

const ENCODED_LEN: usize = 42;
const VERSION: u8 = 1;

impl KeptSize {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(ENCODED_LEN);
        out.push(VERSION);
        out.extend_from_slice(&self.bytes.to_be_bytes());
        out.extend_from_slice(&self.walked_at_ms.to_be_bytes());
        let (flag, at, run) = match self.through {
            Some((at, run)) => (1u8, at, run.to_bytes()),
            None => (0u8, 0, [0u8; 16]),
        };
        out.push(flag);
        out.extend_from_slice(&at.to_be_bytes());
        out.extend_from_slice(&run);
        out
    }

    /// `None` for bytes of another length or version: the count is then taken as absent, and
    /// the next pass walks.
    pub fn decode(bytes: &[u8]) -> Option<KeptSize> {
        if bytes.len() != ENCODED_LEN || bytes[0] != VERSION {
            return None;
        }
        let u64_at = |at: usize| -> Option<u64> {
            Some(u64::from_be_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
        };
        let run: [u8; 16] = bytes.get(26..42)?.try_into().ok()?;
        let through = match bytes[17] {
            0 => None,
            1 => Some((u64_at(18)?, RunId::from_bytes(run))),
            _ => return None,
        };
        Some(KeptSize {
            bytes: u64_at(1)?,
            walked_at_ms: u64_at(9)?,
            through,
        })
    }
}

/// What [`measure`] found: the home's bytes, and what the count becomes.
#[derive(Debug, Clone)]
pub struct Measured {
    /// Every byte of the home: journal, reserve, `runs/`, `results/`.
    pub total: u64,
    /// The bytes of `runs/` and `results/` alone.
    pub files: u64,
    /// Whether the home was walked for it.
    pub walked: bool,
    /// The count as read, and as it should be written (equal: nothing to write).
    pub read: Option<KeptSize>,
    pub kept: KeptSize,
}

/// The home's bytes: the kept count plus what it does not hold, measured now; walked instead
/// when the count is absent, older than [`WALK_EVERY`], or says the home is over `max_bytes`
/// and was not walked in the last [`WALK_UNDER_PRESSURE_EVERY`].
pub fn measure(home: &Home, view: &View, max_bytes: u64) -> Result<Measured, ReadError> {
    let now = now_ms();
    let read = view.home_size()?.as_deref().and_then(KeptSize::decode);
    let fixed = file_bytes(&home.journal_path()) + file_bytes(&home.reserve_path());
    let since = |kept: &KeptSize| Duration::from_millis(now.saturating_sub(kept.walked_at_ms));
    if let Some(kept) = read.filter(|kept| since(kept) < WALK_EVERY) {
        let (counted, uncounted) = count(home, view, kept)?;
        let files = counted.bytes + uncounted;
        let total = fixed + files;
        if total <= max_bytes || since(&kept) < WALK_UNDER_PRESSURE_EVERY {
            return Ok(Measured {
                total,
                files,
                walked: false,
                read,
                kept: counted,
            });
        }
    }
    let (walked, uncounted) = walk(home, view, now)?;
    Ok(Measured {
        total: fixed + walked.bytes + uncounted,
        files: walked.bytes + uncounted,
        walked: true,
        read,
        kept: walked,
    })
}

/// The count with the runs ended since its cursor added, and the bytes of the runs it does
/// not hold (not ended yet).
fn count(home: &Home, view: &View, kept: KeptSize) -> Result<(KeptSize, u64), ReadError> {
    let mut counted = kept;
    for (at, run) in view.terminal_after(kept.through, usize::MAX)? {
        if let Some(state) = view.snapshot(run)? {
            counted.bytes += run_bytes(home, &state);
        }
        counted.through = Some((at, run));
    }
    let uncounted = active_bytes(home, view, counted.through)?;
    Ok((counted, uncounted))
}

/// Walks `runs/` and `results/`; the count becomes what the walk found but the runs not
/// counted (those not ended, measured apart), through the newest ended run.
fn walk(home: &Home, view: &View, now: UnixMs) -> Result<(KeptSize, u64), ReadError> {
    let through = view.recent_terminal(1)?.first().copied();
    let found = tree_bytes(&home.runs_dir()) + tree_bytes(&home.results_dir());
    let uncounted = active_bytes(home, view, through)?;
    let kept = KeptSize {
        bytes: found.saturating_sub(uncounted),
        walked_at_ms: now,
        through,
    };
    Ok((kept, uncounted))
}

/// The bytes of the runs not closed whose terminal key is not at or below `through`: those not
/// ended, and those ended since (a count does not hold them).
fn active_bytes(
    home: &Home,
    view: &View,
    through: Option<(UnixMs, RunId)>,
) -> Result<u64, ReadError> {
    let mut bytes = 0;
    for run in view.active_runs()? {
        let Some(state) = view.snapshot(run)? else {
            continue;
        };
        if !is_counted(&state, through) {
            bytes += run_bytes(home, &state);
        }
    }
    Ok(bytes)
}

/// Whether a count through `through` holds the run.
fn is_counted(state: &RunState, through: Option<(UnixMs, RunId)>) -> bool {
    match (&state.terminal, through) {
        (Some(terminal), Some(through)) => (terminal.at_ms, state.run_id) <= through,
        _ => false,
    }
}

/// Writes the count a pass measured, less the bytes of the runs it pruned (each with the
/// bytes measured when it was chosen), in a transaction of its own; nothing when nothing
/// changed. Re-read in the transaction: when another pass moved the count since it was read,
/// only the prunes are taken off the stored count, so nothing is added twice.
pub fn store(
    journal: &Journal,
    measured: &Measured,
    pruned: &[(&RunState, u64)],
) -> Result<(), AppendError> {
    let freed = |kept: &KeptSize| -> u64 {
        pruned
            .iter()
            .filter(|(state, _)| is_counted(state, kept.through))
            .map(|(_, bytes)| bytes)
            .sum()
    };
    let is_changed = measured.read != Some(measured.kept) || freed(&measured.kept) > 0;
    if !is_changed {
        return Ok(());
    }
    journal.update_home_size(|stored| {
        let stored = stored.and_then(KeptSize::decode);
        let mut kept = if stored == measured.read || measured.walked {
            measured.kept
        } else {
            stored?
        };
        kept.bytes = kept.bytes.saturating_sub(freed(&kept));
        Some(kept.encode())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_size_reads_back_as_written_and_other_bytes_read_as_absent() {
        let run = RunId::generate();
        for kept in [
            KeptSize {
                bytes: 12_345_678,
                walked_at_ms: 1_700_000_000_000,
                through: Some((1_700_000_000_123, run)),
            },
            KeptSize {
                bytes: 0,
                walked_at_ms: 1,
                through: None,
            },
        ] {
            let encoded = kept.encode();
            assert_eq!(encoded.len(), ENCODED_LEN);
            assert_eq!(KeptSize::decode(&encoded), Some(kept));
        }
        let mut other_version = KeptSize {
            bytes: 1,
            walked_at_ms: 1,
            through: None,
        }
        .encode();
        other_version[0] = 2;
        assert_eq!(KeptSize::decode(&other_version), None);
        assert_eq!(KeptSize::decode(&[1, 2, 3]), None);
    }
}
