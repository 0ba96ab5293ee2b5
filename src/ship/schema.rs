//! The PostgreSQL schema, created and migrated by the shipper (docs/shipping.md).
//!
//! `runjournal_schema` holds one row per applied migration. Each migration runs in its own
//! transaction with its version row, so a schema is never half migrated; a shipper that finds a
//! later version than it knows refuses to write. Migrations are only ever appended.

use super::session::Session;
use super::{ShipError, rows};

/// The schema version this build writes and reads.
pub const SCHEMA_VERSION: i32 = 1;

/// `(version, SQL)`, in order. Plain SQL that PostgreSQL, CockroachDB and YugabyteDB accept.
const MIGRATIONS: &[(i32, &str)] = &[(
    1,
    "
    CREATE TABLE runjournal_journals (
        journal_id text PRIMARY KEY,
        host_name text NOT NULL,
        home text NOT NULL,
        journal_created_at_ms bigint NOT NULL,
        shipped_through bigint NOT NULL DEFAULT 0,
        shipped_at timestamptz,
        heartbeat_at timestamptz NOT NULL DEFAULT now(),
        registered_at timestamptz NOT NULL DEFAULT now()
    );
    CREATE TABLE runjournal_records (
        journal_id text NOT NULL,
        global_seq bigint NOT NULL,
        run_id text NOT NULL,
        seq bigint NOT NULL,
        time_ms bigint NOT NULL,
        event_type text NOT NULL,
        event jsonb NOT NULL,
        PRIMARY KEY (journal_id, global_seq)
    );
    CREATE INDEX runjournal_records_by_run ON runjournal_records (journal_id, run_id, seq);
    CREATE TABLE runjournal_runs (
        journal_id text NOT NULL,
        run_id text NOT NULL,
        name text,
        state text NOT NULL,
        is_closed boolean NOT NULL,
        is_stale boolean NOT NULL,
        is_dismissed boolean NOT NULL,
        steps_done integer NOT NULL,
        steps_total integer NOT NULL,
        runner_pid bigint,
        created_at_ms bigint NOT NULL,
        updated_at_ms bigint NOT NULL,
        ended_at_ms bigint,
        head_seq bigint NOT NULL,
        status jsonb NOT NULL,
        PRIMARY KEY (journal_id, run_id)
    );
    CREATE INDEX runjournal_runs_by_created ON runjournal_runs (created_at_ms);
    ",
)];

const CREATE_VERSION_TABLE: &str = "CREATE TABLE IF NOT EXISTS runjournal_schema (
    version integer PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
)";

/// How often a migration that lost a race with another shipper's is tried again.
const MIGRATE_ATTEMPTS: usize = 3;

/// Brings the database to [`SCHEMA_VERSION`].
pub fn migrate(session: &mut Session, target: &str) -> Result<(), ShipError> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        match migrate_once(session, target) {
            // Two shippers creating the tables at once: one wins, the other's statement fails
            // on the catalog's unique index (or the version row); the next attempt finds the
            // work done.
            Err(error)
                if attempt < MIGRATE_ATTEMPTS
                    && matches!(error.sql_state(), Some("23505" | "42P07" | "40001")) => {}
            other => return other,
        }
    }
}

fn migrate_once(session: &mut Session, target: &str) -> Result<(), ShipError> {
    session.batch_execute(CREATE_VERSION_TABLE)?;
    let current = current_version(session, target)?.unwrap_or(0);
    if current > SCHEMA_VERSION {
        return Err(ShipError::SchemaNewer {
            target: target.to_string(),
            found: current,
            known: SCHEMA_VERSION,
        });
    }
    for (version, sql) in MIGRATIONS.iter().filter(|(version, _)| *version > current) {
        session.transaction(async |transaction, bound| {
            let is_applied = bound
                .answer(
                    "the schema's version",
                    transaction.query_opt(
                        "SELECT 1 FROM runjournal_schema WHERE version = $1",
                        &[version],
                    ),
                )
                .await?
                .is_some();
            if is_applied {
                return Ok(());
            }
            bound
                .answer("a migration", transaction.batch_execute(sql))
                .await?;
            bound
                .answer(
                    "a migration's version",
                    transaction.execute(
                        "INSERT INTO runjournal_schema (version) VALUES ($1)",
                        &[version],
                    ),
                )
                .await?;
            Ok(())
        })?;
    }
    Ok(())
}

/// The schema version the database holds; `None` when it holds no runjournal tables.
pub fn current_version(session: &Session, target: &str) -> Result<Option<i32>, ShipError> {
    let bad = |reason| ShipError::BadData {
        target: target.to_string(),
        reason,
    };
    let row = session.query_one("SELECT to_regclass('runjournal_schema') IS NOT NULL", &[])?;
    let exists: bool = rows::column(&row, 0, "the catalog", "to_regclass").map_err(bad)?;
    if !exists {
        return Ok(None);
    }
    let row = session.query_one("SELECT max(version) FROM runjournal_schema", &[])?;
    rows::column::<Option<i32>>(&row, 0, "runjournal_schema", "version").map_err(bad)
}

/// Checks, without changing anything, that the database holds a schema this build reads.
pub fn check_readable(session: &Session, target: &str) -> Result<(), ShipError> {
    match current_version(session, target)? {
        None | Some(0) => Err(ShipError::NoSchema {
            target: target.to_string(),
        }),
        Some(found) if found > SCHEMA_VERSION => Err(ShipError::SchemaNewer {
            target: target.to_string(),
            found,
            known: SCHEMA_VERSION,
        }),
        Some(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_are_numbered_from_one_without_gaps_up_to_the_version() {
        for (index, (version, _)) in MIGRATIONS.iter().enumerate() {
            assert_eq!(*version, index as i32 + 1);
        }
        assert_eq!(
            MIGRATIONS.last().map(|(version, _)| *version),
            Some(SCHEMA_VERSION)
        );
    }
}
