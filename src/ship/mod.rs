//! Shipping every journal to PostgreSQL, and reading the fleet back (DESIGN.md section 9,
//! issue 16).
//!
//! Each host's journal stays the durable local truth; its `log` table is the outbox. The
//! [`shipper`] reads the log after a cursor, read-only, and writes the records in commit order
//! into PostgreSQL (whose wire protocol also serves CockroachDB and YugabyteDB), in batches,
//! each one transaction that also moves the journal's cursor (`shipped_through`) on the server:
//! the server's row is the truth, so a shipper killed at any moment resumes without losing or
//! repeating a record. [`schema`] creates and migrates the tables; [`rows`] turns records and
//! snapshots into rows and back (pure); [`state`] is the small file under the home that
//! `runjournal status`/`list` and `journal-tools inspect stats` read to say how far behind
//! shipping is; [`fleet`] reads every shipped journal back, and compares one with its local
//! journal; [`connect`] turns a URL into a connection, TLS included.
//!
//! Invariant: shipping never writes to the journal and never takes its write lock; nothing in
//! here runs on the path of an append. Invariant: a record row and the cursor that covers it are
//! committed in the same PostgreSQL transaction.

pub mod connect;
pub mod fleet;
pub mod rows;
pub mod schema;
pub mod shipper;
pub mod state;

use std::path::PathBuf;

use crate::event::UnixMs;
use crate::journal::{OpenError, ReadError};

pub use connect::Target;
pub use fleet::Fleet;
pub use shipper::{ShipOptions, Shipper};

/// Environment variable naming the PostgreSQL URL of `runjournal ship` when `--to` is absent.
pub const SHIP_URL_ENV: &str = "RUNJOURNAL_SHIP_URL";

/// Why shipping, or reading the fleet, failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ShipError {
    /// The URL cannot be used as given: a usage error, retrying will not help.
    #[error("PostgreSQL URL: {reason}")]
    Url { reason: String },
    /// The TLS settings could not be made (root certificates unreadable, say).
    #[error("TLS for {target}: {reason}")]
    Tls { target: String, reason: String },
    /// The server refused, failed or could not be reached.
    // The client's error is shown in the message, not chained as a source: printed with its
    // chain, it would say the same thing twice.
    #[error("PostgreSQL at {target}: {}", server_error_text(.error))]
    Server {
        target: String,
        error: postgres::Error,
    },
    /// The database holds a schema of a later version than this build knows.
    #[error(
        "PostgreSQL at {target}: its runjournal schema is version {found}; this build knows version {known} at most (upgrade runjournal)"
    )]
    SchemaNewer {
        target: String,
        found: i32,
        known: i32,
    },
    /// The database holds no runjournal tables (nothing was ever shipped there).
    #[error("PostgreSQL at {target}: no runjournal tables (nothing has been shipped there)")]
    NoSchema { target: String },
    /// What the server holds does not make sense (a value out of range, a record that does not
    /// decode): someone wrote the tables behind the shipper's back.
    #[error("PostgreSQL at {target}: {reason}")]
    BadData { target: String, reason: String },
    /// The local journal could not be opened.
    #[error("opening the journal: {0}")]
    Open(#[from] OpenError),
    /// The local journal could not be read.
    #[error("reading the journal: {0}")]
    Read(#[from] ReadError),
    /// A run's records in the local journal do not fold.
    #[error("the journal's run {run} does not fold: {reason}")]
    Fold { run: String, reason: String },
    /// The shipper's state file could not be written.
    #[error("writing {}", path.display())]
    State {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl ShipError {
    /// Whether the error is in what the caller asked for (exit 2), not in the server or disk.
    pub fn is_usage(&self) -> bool {
        matches!(self, ShipError::Url { .. })
    }

    /// The SQLSTATE code of a server error, when the server sent one.
    pub fn sql_state(&self) -> Option<&str> {
        match self {
            ShipError::Server { error, .. } => error.code().map(|code| code.code()),
            _ => None,
        }
    }
}

/// A server error as one line: the server's own message and SQLSTATE when it sent one (auth,
/// schema, disk full), else the client's description (connection refused, closed, timed out).
fn server_error_text(error: &postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => format!(
            "{}: {} (SQLSTATE {})",
            db.severity(),
            db.message(),
            db.code().code()
        ),
        None => {
            let mut text = error.to_string();
            let mut cause = std::error::Error::source(error);
            while let Some(inner) = cause {
                let inner_text = inner.to_string();
                if !text.contains(&inner_text) {
                    text.push_str(": ");
                    text.push_str(&inner_text);
                }
                cause = inner.source();
            }
            text
        }
    }
}

/// Unix milliseconds as `YYYY-MM-DD HH:MM:SSZ` (UTC), as the status lines show times.
pub fn utc_text(ms: UnixMs) -> String {
    let seconds = ms / 1000;
    let days = seconds / 86_400;
    let of_day = seconds % 86_400;
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}Z",
        of_day / 3600,
        of_day % 3600 / 60,
        of_day % 60
    )
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`, for days on or after the epoch).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let day_of_era = z % 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = era * 400 + year_of_era + u64::from(month <= 2);
    (year, month, day)
}

/// The journal id as the server stores it: 32 lowercase hex digits.
pub fn journal_id_text(id: &[u8; 16]) -> String {
    id.iter().map(|byte| format!("{byte:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_text_matches_known_dates() {
        assert_eq!(utc_text(0), "1970-01-01 00:00:00Z");
        // 2000-02-29 12:34:56 UTC, a leap day.
        assert_eq!(utc_text(951_827_696_000), "2000-02-29 12:34:56Z");
        // 2026-11-30 03:42:25.718 UTC, from the README's demo.
        assert_eq!(utc_text(1_796_010_145_718), "2026-11-30 03:42:25Z");
        assert_eq!(utc_text(4_102_444_800_000), "2100-01-01 00:00:00Z");
    }

    #[test]
    fn journal_ids_print_as_32_hex_digits() {
        let mut id = [0u8; 16];
        id[0] = 0xab;
        id[15] = 0x01;
        assert_eq!(journal_id_text(&id), "ab000000000000000000000000000001");
    }
}
