//! What the shipper tells the rest of the host: `<home>/shipping.json`, replaced atomically
//! (0600) whenever the cursor moves, the shipper fails or recovers, and at each heartbeat.
//! `runjournal status`/`list` and `journal-tools inspect stats` read it to say how far behind
//! shipping is ([`lag`]). It is a report, never a cursor: the server's `shipped_through` is
//! the truth, and a shipper starts from there whatever this file says.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::durable_fs;
use crate::duration::format_time_s;
use crate::event::{ProcessIdentity, UnixMs};
use crate::home::Home;
use crate::journal::{ReadError, View};
use crate::liveness::{self, Liveness};
use crate::text::escape_control;

use super::ShipError;

/// Where the state file lives.
pub fn state_path(home: &Home) -> PathBuf {
    home.shipping_state_path()
}

/// The shipper's last word, as written to `shipping.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ShipState {
    /// The shipper process, so a reader can tell whether it still runs.
    pub shipper: Option<ProcessIdentity>,
    /// The server, as shown in messages (no password).
    pub target: String,
    /// The journal's id, 32 hex digits; `None` until the journal was read.
    pub journal_id: Option<String>,
    pub host_name: String,
    /// The last global seq the server acknowledged (its `shipped_through`).
    pub shipped_through: u64,
    /// When the shipper last learned `shipped_through` from a commit or the server.
    pub shipped_at_ms: Option<UnixMs>,
    /// Since when every attempt has failed; `None` while shipping works.
    pub failing_since_ms: Option<UnixMs>,
    /// The last failure, one line.
    pub last_error: Option<String>,
    pub updated_at_ms: UnixMs,
}

/// Writes the state file.
pub fn write(home: &Home, state: &ShipState) -> Result<(), ShipError> {
    let path = state_path(home);
    let bytes = serde_json::to_vec_pretty(state).expect("the shipper's state is plain data");
    durable_fs::write_atomic(&path, &bytes).map_err(|source| ShipError::State { path, source })
}

/// The largest state file read: a few hundred bytes are written; anything much larger is not
/// one of ours.
const MAX_STATE_FILE_BYTES: u64 = 64 * 1024;

/// Reads the state file; `None` when this home has never been shipped from (or the file is
/// unreadable, not a regular file, or over [`MAX_STATE_FILE_BYTES`]: it is a report, and a
/// damaged one says nothing).
pub fn read(home: &Home) -> Option<ShipState> {
    match durable_fs::read_file_bounded(&state_path(home), MAX_STATE_FILE_BYTES).ok()? {
        durable_fs::Bounded::Whole(bytes) => serde_json::from_slice(&bytes).ok(),
        durable_fs::Bounded::Over(_) => None,
    }
}

/// How far behind shipping is, when it is worth a line (as JSON: `recordsBehind`, `sinceMs`,
/// `reason`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Lag {
    pub records_behind: u64,
    /// Since when: the first failure, or (no shipper running) the oldest unshipped record.
    pub since_ms: UnixMs,
    /// Why, one line, as it came (a server's error text among it): escaped only where it is
    /// shown ([`Lag::line`], [`Lag::summary`]); JSON escapes it its own way.
    pub reason: String,
}

impl Lag {
    /// `shipping N records behind since T: reason`, the line `status`, `list` and
    /// `inspect stats` print, its control characters shown visibly.
    pub fn line(&self) -> String {
        format!("shipping {}", self.summary())
    }

    /// `N records behind since T: reason`, its control characters shown visibly
    /// ([`escape_control`]): the reason quotes the server, and the server is input.
    pub fn summary(&self) -> String {
        escape_control(&format!(
            "{} record{} behind since {}: {}",
            self.records_behind,
            if self.records_behind == 1 { "" } else { "s" },
            format_time_s(self.since_ms),
            self.reason
        ))
        .into_owned()
    }
}

/// The lag worth reporting (pure): shipping failing, or records waiting with no shipper
/// running. `None` when this home does not ship, or shipping keeps up.
pub fn judge(
    state: &ShipState,
    global_head: u64,
    is_shipper_running: bool,
    oldest_unshipped_ms: Option<UnixMs>,
) -> Option<Lag> {
    let records_behind = global_head.saturating_sub(state.shipped_through);
    if let Some(since_ms) = state.failing_since_ms {
        return Some(Lag {
            records_behind,
            since_ms,
            reason: state
                .last_error
                .clone()
                .unwrap_or_else(|| "failing".to_string()),
        });
    }
    if records_behind == 0 || is_shipper_running {
        return None;
    }
    let pid = state.shipper.as_ref().map_or_else(String::new, |shipper| {
        format!(" (last was pid {})", shipper.pid)
    });
    Some(Lag {
        records_behind,
        since_ms: oldest_unshipped_ms.unwrap_or(state.updated_at_ms),
        reason: format!(
            "no shipper is running to {}{pid}; start `runjournal ship`",
            state.target
        ),
    })
}

/// The lag of this home's journal as `view` shows it; `None` when the home does not ship or
/// shipping keeps up.
pub fn lag(home: &Home, view: &View) -> Result<Option<Lag>, ReadError> {
    let Some(state) = read(home) else {
        return Ok(None);
    };
    let global_head = view.global_head()?;
    let oldest_unshipped_ms = view
        .records_after(state.shipped_through, 1)?
        .first()
        .map(|(_, record)| record.time_ms);
    // A failed look at /proc counts as running: no line is better than a false alarm.
    let is_running = state.shipper.as_ref().is_some_and(|shipper| {
        !matches!(
            liveness::check(shipper),
            Ok(Liveness::Dead | Liveness::OtherBoot)
        )
    });
    Ok(judge(&state, global_head, is_running, oldest_unshipped_ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> ShipState {
        ShipState {
            shipper: None,
            target: "ship@db:5432/fleet".to_string(),
            journal_id: Some("00".repeat(16)),
            host_name: "build-7".to_string(),
            shipped_through: 40,
            shipped_at_ms: Some(1_000),
            failing_since_ms: None,
            last_error: None,
            updated_at_ms: 2_000,
        }
    }

    #[test]
    fn a_failing_shipper_is_reported_with_its_error_and_since_when() {
        let mut failing = state();
        failing.failing_since_ms = Some(951_827_696_000);
        failing.last_error = Some("PostgreSQL at ship@db:5432/fleet: connection refused".into());
        let lag = judge(&failing, 52, true, Some(5)).unwrap();
        assert_eq!(
            lag.line(),
            "shipping 12 records behind since 2000-02-29 12:34:56Z: PostgreSQL at ship@db:5432/fleet: connection refused"
        );
    }

    #[test]
    fn a_servers_error_text_is_shown_escaped_and_kept_as_it_came() {
        let mut failing = state();
        failing.failing_since_ms = Some(951_827_696_000);
        failing.last_error = Some("FATAL: \u{1b}]2;pwned\u{7}\u{1b}[2J\nnext".into());
        let lag = judge(&failing, 41, true, None).unwrap();
        assert_eq!(
            lag.line(),
            "shipping 1 record behind since 2000-02-29 12:34:56Z: FATAL: \\x1b]2;pwned\\x07\\x1b[2J\\nnext"
        );
        assert!(lag.summary().starts_with("1 record behind"));
        assert!(!lag.summary().contains('\u{1b}'));
        assert!(
            lag.reason.contains('\u{1b}'),
            "the JSON field holds what was said"
        );
    }

    #[test]
    fn a_running_shipper_that_keeps_up_or_is_catching_up_says_nothing() {
        assert_eq!(judge(&state(), 40, false, None), None);
        assert_eq!(judge(&state(), 90, true, Some(5)), None);
    }

    #[test]
    fn records_waiting_with_no_shipper_are_reported_since_the_oldest() {
        let lag = judge(&state(), 41, false, Some(951_827_696_000)).unwrap();
        assert_eq!(lag.records_behind, 1);
        assert_eq!(lag.since_ms, 951_827_696_000);
        assert!(
            lag.line()
                .starts_with("shipping 1 record behind since 2000-02-29")
        );
        assert!(
            lag.reason.contains("no shipper is running"),
            "{}",
            lag.reason
        );
    }

    #[test]
    fn the_state_file_round_trips_and_is_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let home = Home::at(dir.path());
        assert_eq!(read(&home), None);
        write(&home, &state()).unwrap();
        assert_eq!(read(&home), Some(state()));
        let mode = std::fs::metadata(state_path(&home))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
