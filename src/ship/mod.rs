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
//! Whether the home ships and through which global seq its records are proven shipped is the
//! journal's own mark (`meta` key `shipped_through`, written by [`crate::journal::Journal::mark_shipped`]):
//! retention keeps every record above it, and the shipper checks the server's cursor against
//! the journal's head and its record there before it ships ([`cursor`]).
//!
//! The PostgreSQL client is the cargo feature `ship` (on by default): without it, only
//! [`state`] (the report and the lag `status` shows) and the journal's mark are built, and
//! nothing links a PostgreSQL client. Every wait on the server has a deadline ([`session`]).
//!
//! Invariant: shipping writes to the journal only its mark, in a write transaction of its own
//! after the server's transaction committed, never on the path of an append. Invariant: a
//! record row and the cursor that covers it are committed in the same PostgreSQL transaction.
//! Invariant: the journal's mark only covers records whose shipping the server proved.

#[cfg(feature = "ship")]
pub mod connect;
#[cfg(feature = "ship")]
pub mod cursor;
#[cfg(feature = "ship")]
pub mod fleet;
#[cfg(feature = "ship")]
pub mod password;
#[cfg(feature = "ship")]
pub mod rows;
#[cfg(feature = "ship")]
pub mod schema;
#[cfg(feature = "ship")]
pub mod session;
#[cfg(feature = "ship")]
pub mod shipper;
pub mod state;

#[cfg(feature = "ship")]
pub use connect::Target;
#[cfg(feature = "ship")]
pub use error::ShipError;
#[cfg(feature = "ship")]
pub use fleet::Fleet;
#[cfg(feature = "ship")]
pub use shipper::{ShipOptions, Shipper};

/// Environment variable naming the PostgreSQL URL of `runjournal ship` when `--to` is absent.
pub const SHIP_URL_ENV: &str = "RUNJOURNAL_SHIP_URL";

#[cfg(feature = "ship")]
mod error {
    use crate::journal::{AppendError, OpenError, ReadError, ResolveError};

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
            error: tokio_postgres::Error,
        },
        /// The server did not answer within its deadline (`connect_timeout` for the connection,
        /// `statement_timeout` and a margin for a statement): stopped, cut off, or not a
        /// PostgreSQL server that speaks.
        #[error(
            "PostgreSQL at {target}: no answer to {what} within {} (is the server stopped, overloaded or cut off? connect_timeout and statement_timeout in the URL set the bounds)",
            crate::duration::format_duration_ms(*.after_ms)
        )]
        NoAnswer {
            target: String,
            what: String,
            after_ms: u64,
        },
        /// The server holds more of this journal than the journal itself: the journal is older
        /// than what was shipped from it (restored from a backup, say). Nothing is shipped.
        #[error(
            "PostgreSQL at {target} holds journal {journal_id} through global seq {server_through}, but this journal's head is {journal_head}: the journal is behind what was shipped from it (restored from a backup?). Nothing was shipped, and runs not proven shipped are kept. To ship this journal on, delete the server's copy of it (docs/shipping.md, \"A server ahead of its journal\")"
        )]
        ServerAhead {
            target: String,
            journal_id: String,
            server_through: u64,
            journal_head: u64,
        },
        /// The server's record at its cursor is not this journal's record there: the server's
        /// copy and this journal went different ways. Nothing is shipped.
        #[error(
            "PostgreSQL at {target} holds journal {journal_id} through global seq {global_seq}, but its record there ({server}) is not this journal's ({journal}): the server's copy and this journal differ (a journal restored from a backup that went on?). Nothing was shipped, and runs not proven shipped are kept. To ship this journal on, delete the server's copy of it (docs/shipping.md, \"A server ahead of its journal\")"
        )]
        Diverged {
            target: String,
            journal_id: String,
            global_seq: u64,
            server: String,
            journal: String,
        },
        /// The shipper's own runtime could not be made (no thread, no file descriptor).
        #[error("PostgreSQL at {target}: starting the client: {source}")]
        Runtime {
            target: String,
            #[source]
            source: std::io::Error,
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
        /// The journal's shipping mark could not be written.
        #[error("recording in the journal what was shipped: {0}")]
        Mark(#[from] AppendError),
        /// The local journal could not be read.
        #[error("reading the journal: {0}")]
        Read(#[from] ReadError),
        /// A run's records in the local journal do not fold.
        #[error("the journal's run {run} does not fold: {reason}")]
        Fold { run: String, reason: String },
    }

    impl ShipError {
        /// Whether the server refused as a copy of another history than this journal's (ahead of
        /// it, or diverged): waiting will not mend it, a person must.
        pub fn is_refusal(&self) -> bool {
            matches!(
                self,
                ShipError::ServerAhead { .. } | ShipError::Diverged { .. }
            )
        }

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
    fn server_error_text(error: &tokio_postgres::Error) -> String {
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
