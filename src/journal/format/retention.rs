//! What the journal keeps of retention: the policy (stored in `meta`), and the tombstone a
//! pruned run leaves (stored in `pruned` and `pruning`), with their encodings.

use serde::{Deserialize, Serialize};

use crate::event::{
    self, DecodeError, FORMAT_VERSION, MAX_TEXT_BYTES, RunId, TerminalState, UnixMs,
};

/// Where retention's clock was anchored in one boot (meta `clock`, stored as text:
/// `crate::retention::clock`;
/// `<boot id> <wall ms> <uptime ms>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClockAnchor {
    pub boot_id: String,
    pub wall_ms: UnixMs,
    pub uptime_ms: u64,
}

impl ClockAnchor {
    /// This boot's anchor at `wall_ms`: `None` where the boot id or the uptime cannot be read.
    pub fn now_at(wall_ms: UnixMs) -> Option<ClockAnchor> {
        Some(ClockAnchor {
            boot_id: crate::liveness::boot_id().ok()?,
            wall_ms,
            uptime_ms: crate::platform::uptime_ms()?,
        })
    }

    /// The stored form.
    pub fn to_bytes(&self) -> Vec<u8> {
        format!("{} {} {}", self.boot_id, self.wall_ms, self.uptime_ms).into_bytes()
    }

    /// Reads the stored form; `None` for anything else (taken as no anchor: a new one is made).
    pub fn parse(bytes: &[u8]) -> Option<ClockAnchor> {
        let text = std::str::from_utf8(bytes).ok()?;
        let mut fields = text.split(' ');
        let anchor = ClockAnchor {
            boot_id: fields.next()?.to_string(),
            wall_ms: fields.next()?.parse().ok()?,
            uptime_ms: fields.next()?.parse().ok()?,
        };
        fields.next().is_none().then_some(anchor)
    }
}

/// Most tombstones kept; the oldest go first.
pub const MAX_TOMBSTONES: u64 = 1_000;

/// The largest tombstone that decodes: three texts at their limit, and some numbers.
const MAX_TOMBSTONE_BYTES: usize = 3 * MAX_TEXT_BYTES + 256;

/// One day, in milliseconds.
const DAY_MS: u64 = 24 * 60 * 60 * 1000;

/// How much of the home's file system must stay free.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum KeepFree {
    /// A percentage of the file system's size (0–100).
    Percent(u8),
    Bytes(u64),
}

impl KeepFree {
    /// The bytes to keep free on a file system of `total` bytes.
    pub fn bytes_of(self, total: u64) -> u64 {
        match self {
            KeepFree::Percent(percent) => {
                u64::try_from(u128::from(total) * u128::from(percent.min(100)) / 100)
                    .unwrap_or(u64::MAX)
            }
            KeepFree::Bytes(bytes) => bytes,
        }
    }
}

/// The retention policy of a home, kept in its journal so that every process applies the same.
/// `None` turns a bound off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retention {
    /// Ended runs older than this (since they ended) are pruned.
    pub keep_for_ms: Option<u64>,
    /// At most this many ended runs are kept; the oldest beyond it are pruned.
    pub keep_runs: Option<u64>,
    /// The home (journal, run directories, results) is kept under this many bytes by pruning
    /// the oldest ended runs.
    pub max_size_bytes: Option<u64>,
    /// The home's file system is kept this free by pruning the oldest ended runs.
    pub keep_free: Option<KeepFree>,
}

impl Retention {
    /// The policy of a home that never set one: ended runs are kept 30 days, and the home's file
    /// system 10 % free (journald keeps 15 % free by default; runs are cheaper to lose than the
    /// system's logs, so the floor is lower).
    pub const DEFAULT: Retention = Retention {
        keep_for_ms: Some(30 * DAY_MS),
        keep_runs: None,
        max_size_bytes: None,
        keep_free: Some(KeepFree::Percent(10)),
    };
}

impl Default for Retention {
    fn default() -> Retention {
        Retention::DEFAULT
    }
}

/// The policy as stored: the format version first, as in every value of the journal.
#[derive(Serialize, Deserialize)]
struct StoredRetention {
    format_version: u16,
    policy: Retention,
}

/// What stays of a pruned run: enough to say how it ended, and to find its files.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tombstone {
    pub(crate) format_version: u16,
    pub run_id: RunId,
    pub name: Option<String>,
    pub tool_call_id: Option<String>,
    pub session_id: Option<String>,
    pub state: TerminalState,
    pub exit_code: i32,
    pub created_at_ms: UnixMs,
    pub ended_at_ms: UnixMs,
    pub pruned_at_ms: UnixMs,
    /// The global seq of the run's `RunCreated`: which of two runs of one name was the later.
    pub created_global: u64,
    /// How many records the run had.
    pub records: u64,
}

impl Tombstone {
    pub(crate) fn encode(&self) -> Vec<u8> {
        event::encode_checked(self).expect("a tombstone is plain data")
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<Tombstone, DecodeError> {
        event::decode_checked(bytes, MAX_TOMBSTONE_BYTES)
    }

    /// A tombstone for tests and fixtures.
    #[cfg(any(test, feature = "testkit"))]
    pub(crate) fn for_tests(run_id: RunId, state: TerminalState, exit_code: i32) -> Tombstone {
        Tombstone {
            format_version: FORMAT_VERSION,
            run_id,
            name: None,
            tool_call_id: None,
            session_id: None,
            state,
            exit_code,
            created_at_ms: 0,
            ended_at_ms: 0,
            pruned_at_ms: 0,
            created_global: 0,
            records: 0,
        }
    }
}

pub(crate) fn encode_retention(policy: &Retention) -> Vec<u8> {
    event::encode_checked(&StoredRetention {
        format_version: FORMAT_VERSION,
        policy: *policy,
    })
    .expect("a retention policy is plain data")
}

pub(crate) fn decode_retention(bytes: &[u8]) -> Result<Retention, DecodeError> {
    event::decode_checked::<StoredRetention>(bytes, 256).map(|stored| stored.policy)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clock_anchor_reads_back_and_nothing_else_is_one() {
        let anchor = ClockAnchor {
            boot_id: "0f1e-2d".to_string(),
            wall_ms: 17,
            uptime_ms: 99,
        };
        assert_eq!(ClockAnchor::parse(&anchor.to_bytes()), Some(anchor));
        for bad in [&b""[..], b"x 1", b"x 1 2 3", b"x y 2", b"\xff 1 2"] {
            assert_eq!(ClockAnchor::parse(bad), None, "{bad:?}");
        }
    }
}
