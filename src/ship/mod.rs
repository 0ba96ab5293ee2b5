//! Shipping every journal to PostgreSQL, and reading the fleet back (docs/design.md,
//! "Shipping"; docs/shipping.md).
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
//! journal; [`connect`] turns a URL into a connection, TLS included, with the password found
//! as libpq finds it ([`password`]) when the URL holds none.
//!
//! Invariant: shipping never writes to the journal and never takes its write lock; nothing in
//! here runs on the path of an append. Invariant: a record row and the cursor that covers it are
//! committed in the same PostgreSQL transaction.

pub mod connect;
pub mod fleet;
pub mod password;
pub mod rows;
pub mod schema;
pub mod shipper;
pub mod state;

use std::path::PathBuf;

use crate::journal::{OpenError, ReadError, ResolveError};

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
    /// No run of the fleet, or more than one, is named so (or the text names none anywhere):
    /// the same refusals as naming a run of a local journal.
    #[error(transparent)]
    Resolve(ResolveError),
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
        match self {
            ShipError::Url { .. } => true,
            ShipError::Resolve(error) => !matches!(error, ResolveError::Read(_)),
            _ => false,
        }
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

/// The journal id as the server stores it: 32 lowercase hex digits.
pub fn journal_id_text(id: &[u8; 16]) -> String {
    id.iter().map(|byte| format!("{byte:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journal_ids_print_as_32_hex_digits() {
        let mut id = [0u8; 16];
        id[0] = 0xab;
        id[15] = 0x01;
        assert_eq!(journal_id_text(&id), "ab000000000000000000000000000001");
    }
}
