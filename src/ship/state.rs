//! What the shipper tells the rest of the host: `<home>/shipping.json`, replaced atomically
//! (0600) whenever the cursor moves, the shipper fails or recovers, and at each heartbeat.
//! `runjournal status`/`list` and `journal-tools inspect stats` read it, with the journal's
//! shipping mark, to say how far behind shipping is and why ([`lag`]). It is a report, never a
//! cursor and never a proof: whether the home ships and what was proven shipped is the
//! journal's mark ([`crate::journal::View::shipped_through`]), so a lost or stale file changes
//! nothing but the words.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::durable_fs;
use crate::duration::format_time_s;
use crate::event::{ProcessIdentity, UnixMs};
use crate::home::Home;
use crate::journal::{AppendError, Journal, ReadError, View};
use crate::liveness::{self, Liveness};
use crate::text::escape_control;

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
pub fn write(home: &Home, state: &ShipState) -> std::io::Result<()> {
    let bytes = serde_json::to_vec_pretty(state).map_err(std::io::Error::other)?;
    durable_fs::write_atomic(&state_path(home), &bytes)
}

/// The largest state file read: a few hundred bytes are written; anything much larger is not
/// one of ours.
const MAX_STATE_FILE_BYTES: u64 = 64 * 1024;

/// Reads the state file; `None` when this home has never been shipped from (or the file is
/// unreadable, not a regular file, or over `MAX_STATE_FILE_BYTES`: it is a report, and a
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

/// The lag worth reporting (pure), from the journal's log head and shipping mark (`through`:
/// the global seq proven shipped) and the shipper's report, if there is one: shipping failing
/// (or refused), or records waiting with no shipper running. `None` when shipping keeps up.
pub fn judge(
    report: Option<&ShipState>,
    through: u64,
    global_head: u64,
    is_shipper_running: bool,
    oldest_unshipped_ms: Option<UnixMs>,
) -> Option<Lag> {
    let records_behind = global_head.saturating_sub(through);
    if let Some((since_ms, error)) =
        report.and_then(|report| Some((report.failing_since_ms?, report.last_error.as_deref())))
    {
        return Some(Lag {
            records_behind,
            since_ms,
            reason: error.unwrap_or("failing").to_string(),
        });
    }
    if records_behind == 0 || is_shipper_running {
        return None;
    }
    let reason = match report {
        Some(report) => {
            let pid = report.shipper.as_ref().map_or_else(String::new, |shipper| {
                format!(" (last was pid {})", shipper.pid)
            });
            format!(
                "no shipper is running to {}{pid}; start `runjournal ship`",
                report.target
            )
        }
        None => "no shipper has reported from this home (shipping.json is missing); start `runjournal ship`".to_string(),
    };
    Some(Lag {
        records_behind,
        since_ms: oldest_unshipped_ms
            .or(report.map(|report| report.updated_at_ms))
            .unwrap_or_default(),
        reason,
    })
}

/// Whether the home ships, and through which global seq its records are proven shipped: the
/// journal's mark; a home shipped from by a version that kept no mark (its report file is
/// there, the mark is not) ships with nothing proven until its shipper runs again.
pub fn shipped_through(home: &Home, view: &View) -> Result<Option<u64>, ReadError> {
    if let Some(through) = view.shipped_through()? {
        return Ok(Some(through));
    }
    let is_reported = matches!(durable_fs::look(&state_path(home)), Ok(Some(_)));
    Ok(is_reported.then_some(0))
}

/// What `runjournal ship --off` did: the home no longer ships.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stopped {
    /// The mark the journal had (`None`: the home did not ship).
    pub was_proven_through: Option<u64>,
    pub global_head: u64,
}

impl std::fmt::Display for Stopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.was_proven_through {
            None => write!(f, "this home did not ship; nothing changed"),
            Some(through) => write!(
                f,
                "this home no longer ships: retention keeps nothing for a shipper now ({} of {} records were proven shipped); `runjournal ship` starts it again",
                through.min(self.global_head),
                self.global_head
            ),
        }
    }
}

/// Why shipping could not be stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StopError {
    #[error("reading the journal: {0}")]
    Read(#[from] ReadError),
    #[error("forgetting the shipping mark: {0}")]
    Write(#[from] AppendError),
}

/// Stops shipping the home: the journal forgets its mark and the report file goes, so that
/// retention keeps nothing for a shipper. A shipper still running marks the home again.
pub fn stop(home: &Home, journal: &Journal) -> Result<Stopped, StopError> {
    let view = journal.view()?;
    let was_proven_through = shipped_through(home, &view)?;
    let global_head = view.global_head()?;
    drop(view);
    if was_proven_through.is_some() {
        journal.stop_shipping()?;
        // A report left behind would make the home count as shipping again (a home shipped
        // from before the journal kept its mark has only the report); a missing one is fine.
        let _ = durable_fs::remove_if_present(&state_path(home));
    }
    Ok(Stopped {
        was_proven_through,
        global_head,
    })
}

/// The lag of this home's journal as `view` shows it; `None` when the home does not ship or
/// shipping keeps up.
pub fn lag(home: &Home, view: &View) -> Result<Option<Lag>, ReadError> {
    let Some(through) = shipped_through(home, view)? else {
        return Ok(None);
    };
    let report = read(home);
    let global_head = view.global_head()?;
    let oldest_unshipped_ms = view
        .records_after(through, 1)?
        .first()
        .map(|(_, record)| record.time_ms);
    // A failed look at /proc counts as running: no line is better than a false alarm.
    let is_running = report
        .as_ref()
        .and_then(|report| report.shipper.as_ref())
        .is_some_and(|shipper| {
            !matches!(
                liveness::check(shipper),
                Ok(Liveness::Dead | Liveness::OtherBoot)
            )
        });
    Ok(judge(
        report.as_ref(),
        through,
        global_head,
        is_running,
        oldest_unshipped_ms,
    ))
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
        let lag = judge(Some(&failing), 40, 52, true, Some(5)).unwrap();
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
        let lag = judge(Some(&failing), 40, 41, true, None).unwrap();
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
        assert_eq!(judge(Some(&state()), 40, 40, false, None), None);
        assert_eq!(judge(Some(&state()), 40, 90, true, Some(5)), None);
    }

    #[test]
    fn records_waiting_with_no_shipper_are_reported_since_the_oldest() {
        let lag = judge(Some(&state()), 40, 41, false, Some(951_827_696_000)).unwrap();
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
    fn the_journals_mark_not_the_report_says_how_far_behind() {
        // The report says 40 were shipped; the journal proved only 30.
        let lag = judge(Some(&state()), 30, 41, false, Some(951_827_696_000)).unwrap();
        assert_eq!(lag.records_behind, 11);
        // No report at all: still behind, and said so.
        let lag = judge(None, 30, 41, false, Some(951_827_696_000)).unwrap();
        assert_eq!(lag.records_behind, 11);
        assert!(
            lag.reason.contains("shipping.json is missing"),
            "{}",
            lag.reason
        );
        assert_eq!(judge(None, 41, 41, false, None), None);
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
