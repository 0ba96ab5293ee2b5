//! Reading the fleet back: every journal shipped into one database, their runs and records,
//! and one journal compared with what the server holds of it (`journal-tools --from URL`,
//! `inspect verify --against URL`). Read-only: nothing here writes to the server.
//!
//! Invariant: a host's silence is judged by the server's clock against the heartbeat the
//! server stamped (`now()`), so clock skew between hosts cannot make one look silent; and a
//! silent host's runs are only shown as such — only that host's own reconciler closes them.

use serde_json::Value;

use crate::event::{Record, RunId, UnixMs};
use crate::journal::{ResolveError, View};
use crate::resolve;
use crate::state::{self as run_state, RunState, RunStatus};
use crate::verify::{Problem, ProblemKind, Severity};

use super::connect::Target;
use super::rows::{self, Columns, MAX_JSON_VALUE_BYTES, MAX_TEXT_VALUE_BYTES, RecordRow, capped};
use super::session::Session;
use super::{ShipError, schema};

/// Records compared per page by [`compare`].
const COMPARE_PAGE: usize = 1000;

/// Runs read back per way of matching by [`Fleet::find_run`]: enough to name an ambiguity.
const FIND_MATCHES_MAX: i64 = 20;

/// Runs an ambiguity names.
const AMBIGUITY_EXAMPLES_MAX: usize = 4;

/// Rows one query of the fleet reads at most (each is `LIMIT`ed to it, and read on after its
/// last row's key): a table of any size is read in pages, never at once.
pub const FLEET_PAGE_ROWS: usize = 500;

/// Bytes of column values one page reads at most: once a page's rows pass it, the rest of the
/// page is left unread and the next page starts after the last row read (at least one row
/// is read, so paging always moves on).
pub const FLEET_PAGE_BYTES_MAX: usize = 4 * 1024 * 1024;

/// The wire size of a column value, of any type (to count a page's bytes as it arrives).
struct WireBytes(usize);

impl<'a> tokio_postgres::types::FromSql<'a> for WireBytes {
    fn from_sql(
        _: &tokio_postgres::types::Type,
        raw: &'a [u8],
    ) -> Result<WireBytes, Box<dyn std::error::Error + Sync + Send>> {
        Ok(WireBytes(raw.len()))
    }

    fn from_sql_null(
        _: &tokio_postgres::types::Type,
    ) -> Result<WireBytes, Box<dyn std::error::Error + Sync + Send>> {
        Ok(WireBytes(0))
    }

    fn accepts(_: &tokio_postgres::types::Type) -> bool {
        true
    }
}

/// The bytes of a row's values.
fn row_bytes(row: &tokio_postgres::Row) -> usize {
    (0..row.len())
        .map(|index| {
            row.try_get::<_, WireBytes>(index)
                .map_or(0, |bytes| bytes.0)
        })
        .sum()
}

/// A page's `LIMIT`: what is left of `limit`, at most [`FLEET_PAGE_ROWS`].
fn page_limit(limit: Option<usize>, read: usize) -> i64 {
    let left = limit.map_or(FLEET_PAGE_ROWS, |limit| {
        limit.saturating_sub(read).min(FLEET_PAGE_ROWS)
    });
    i64::try_from(left).unwrap_or(0)
}

/// The fleet database, opened for reading. Every value is read back with its size bounded
/// ([`rows::capped`]): a row put there by hand cannot make a reader hold more than a page.
pub struct Fleet {
    session: Session,
    target: String,
}

/// One shipped journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetJournal {
    pub journal_id: String,
    pub host_name: String,
    pub home: String,
    pub journal_created_at_ms: UnixMs,
    pub shipped_through: u64,
    pub shipped_at_ms: Option<UnixMs>,
    /// The server's time of the journal's last heartbeat.
    pub heartbeat_at_ms: UnixMs,
    pub records: u64,
    pub runs: u64,
    /// Runs not closed.
    pub runs_open: u64,
}

impl FleetJournal {
    /// When the host went silent: its last heartbeat, if that is more than `silent_after_ms`
    /// before `server_now_ms`.
    pub fn silent_since(&self, server_now_ms: UnixMs, silent_after_ms: u64) -> Option<UnixMs> {
        (server_now_ms.saturating_sub(self.heartbeat_at_ms) > silent_after_ms)
            .then_some(self.heartbeat_at_ms)
    }
}

/// One run of the fleet, as its journal's last shipped batch left it.
#[derive(Debug, Clone, PartialEq)]
pub struct FleetRun {
    pub journal_id: String,
    pub host_name: String,
    pub heartbeat_at_ms: UnixMs,
    pub run_id: RunId,
    pub name: Option<String>,
    pub state: RunStatus,
    pub is_closed: bool,
    pub is_stale: bool,
    pub is_dismissed: bool,
    pub steps_done: u32,
    pub steps_total: u32,
    pub runner_pid: Option<u32>,
    pub created_at_ms: UnixMs,
    pub updated_at_ms: UnixMs,
    pub ended_at_ms: Option<UnixMs>,
    pub head_seq: u64,
    /// The run's status.json document.
    pub status: Value,
}

impl FleetRun {
    /// When the run's host went silent, if it did and the run is not closed (a closed run has
    /// nothing left to happen to it).
    pub fn host_silent_since(&self, server_now_ms: UnixMs, silent_after_ms: u64) -> Option<UnixMs> {
        (!self.is_closed && server_now_ms.saturating_sub(self.heartbeat_at_ms) > silent_after_ms)
            .then_some(self.heartbeat_at_ms)
    }
}

/// Which runs [`Fleet::runs`] returns.
#[derive(Debug, Clone, Default)]
pub struct RunFilter {
    /// Only these states (all when empty).
    pub states: Vec<RunStatus>,
    pub created_since_ms: Option<UnixMs>,
    pub created_until_ms: Option<UnixMs>,
    /// At most this many, newest first.
    pub limit: Option<usize>,
}

/// One shipped record with its journal.
#[derive(Debug, Clone, PartialEq)]
pub struct ShippedRecord {
    pub journal_id: String,
    pub host_name: String,
    pub row: RecordRow,
}

/// Which records [`Fleet::events`] returns.
#[derive(Debug, Clone, Default)]
pub struct EventFilter {
    /// Only this run of this journal.
    pub run: Option<(String, RunId)>,
    /// Only records after this global seq of their journal.
    pub after_seq: u64,
    /// Only records after this one in the listing's order (time, journal id, global seq): the
    /// position where the previous page ended.
    pub after: Option<(i64, String, i64)>,
    pub limit: Option<usize>,
}

/// The columns of a run of the fleet, read by [`Fleet::fleet_run`].
fn run_columns() -> String {
    let text = |column: &str| capped(column, MAX_TEXT_VALUE_BYTES);
    format!(
        "{}, {}, (extract(epoch FROM j.heartbeat_at) * 1000)::bigint, {}, {}, {},
        r.is_closed, r.is_stale, r.is_dismissed, r.steps_done, r.steps_total, r.runner_pid,
        r.created_at_ms, r.updated_at_ms, r.ended_at_ms, r.head_seq, {}",
        text("r.journal_id"),
        text("j.host_name"),
        text("r.run_id"),
        text("r.name"),
        text("r.state"),
        capped("r.status", MAX_JSON_VALUE_BYTES),
    )
}

impl Fleet {
    /// Connects and checks that the database holds a schema this build reads.
    pub fn connect(target: &Target) -> Result<Fleet, ShipError> {
        let session = target.connect()?;
        schema::check_readable(&session, target.shown())?;
        Ok(Fleet {
            session,
            target: target.shown().to_string(),
        })
    }

    /// The server, as shown in messages.
    pub fn target(&self) -> &str {
        &self.target
    }

    fn bad(&self) -> impl Fn(String) -> ShipError + '_ {
        |reason| ShipError::BadData {
            target: self.target.clone(),
            reason,
        }
    }

    /// One page of a query whose SQL ends in `LIMIT` (at most [`FLEET_PAGE_ROWS`]): its rows
    /// as they arrive, up to [`FLEET_PAGE_BYTES_MAX`] bytes of values.
    fn page(
        &mut self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, ShipError> {
        let mut bytes = 0usize;
        // The rest of the page is dropped unread; the caller's next page starts after the
        // last row kept.
        self.session.query_page(sql, params, |rows| {
            bytes = bytes.saturating_add(rows.last().map_or(0, row_bytes));
            bytes > FLEET_PAGE_BYTES_MAX || rows.len() >= FLEET_PAGE_ROWS
        })
    }

    /// Column `index` of a row, checked ([`rows::column`]).
    fn col<'a, T: tokio_postgres::types::FromSql<'a>>(
        &self,
        row: &'a tokio_postgres::Row,
        index: usize,
        table: &str,
        column: &str,
    ) -> Result<T, ShipError> {
        rows::column(row, index, table, column).map_err(self.bad())
    }

    /// A `bigint` column that holds a count, time or seq (never negative).
    fn unsigned_col(
        &self,
        row: &tokio_postgres::Row,
        index: usize,
        table: &str,
        column: &str,
    ) -> Result<u64, ShipError> {
        let value: i64 = self.col(row, index, table, column)?;
        rows::unsigned(value, &format!("column {column} of {table}")).map_err(self.bad())
    }

    /// The next column of `columns`, a count, time or seq (never negative).
    fn unsigned_next(&self, columns: &mut Columns<'_>, column: &str) -> Result<u64, ShipError> {
        let value: i64 = columns.value(column).map_err(self.bad())?;
        rows::unsigned(value, &format!("column {column}")).map_err(self.bad())
    }

    /// The server's clock, in Unix milliseconds.
    pub fn server_now_ms(&mut self) -> Result<UnixMs, ShipError> {
        let row = self
            .session
            .query_one("SELECT (extract(epoch FROM now()) * 1000)::bigint", &[])?;
        self.unsigned_col(&row, 0, "the server", "now()")
    }

    /// Every shipped journal, by host name then journal id.
    pub fn journals(&mut self) -> Result<Vec<FleetJournal>, ShipError> {
        self.journals_where(None)
    }

    /// One shipped journal; `None` when the server holds nothing of it.
    pub fn journal(&mut self, journal_id: &str) -> Result<Option<FleetJournal>, ShipError> {
        Ok(self.journals_where(Some(journal_id))?.into_iter().next())
    }

    fn journals_where(&mut self, only: Option<&str>) -> Result<Vec<FleetJournal>, ShipError> {
        let mut journals: Vec<FleetJournal> = Vec::new();
        let limit = page_limit(None, 0);
        loop {
            let after: Option<(String, String)> = journals
                .last()
                .map(|last| (last.host_name.clone(), last.journal_id.clone()));
            let (after_host, after_id) = after.unzip();
            let page = self.page(
                &format!(
                    "SELECT {}, {}, {}, j.journal_created_at_ms,
                    j.shipped_through, (extract(epoch FROM j.shipped_at) * 1000)::bigint,
                    (extract(epoch FROM j.heartbeat_at) * 1000)::bigint,
                    (SELECT count(*) FROM runjournal_records x WHERE x.journal_id = j.journal_id),
                    (SELECT count(*) FROM runjournal_runs r WHERE r.journal_id = j.journal_id),
                    (SELECT count(*) FROM runjournal_runs r
                        WHERE r.journal_id = j.journal_id AND NOT r.is_closed)
                 FROM runjournal_journals j
                 WHERE ($1::text IS NULL OR j.journal_id = $1)
                   AND ($2::text IS NULL OR (j.host_name, j.journal_id) > ($2, $3::text))
                 ORDER BY j.host_name, j.journal_id
                 LIMIT $4",
                    capped("j.journal_id", MAX_TEXT_VALUE_BYTES),
                    capped("j.host_name", MAX_TEXT_VALUE_BYTES),
                    capped("j.home", MAX_TEXT_VALUE_BYTES),
                ),
                &[&only, &after_host, &after_id, &limit],
            )?;
            if page.is_empty() {
                return Ok(journals);
            }
            for row in &page {
                journals.push(self.fleet_journal(row)?);
            }
        }
    }

    fn fleet_journal(&self, row: &tokio_postgres::Row) -> Result<FleetJournal, ShipError> {
        let bad = self.bad();
        let mut columns = Columns::new(row, "runjournal_journals");
        let journal_id = columns
            .capped("journal_id", MAX_TEXT_VALUE_BYTES)
            .map_err(&bad)?;
        let host_name = columns
            .capped("host_name", MAX_TEXT_VALUE_BYTES)
            .map_err(&bad)?;
        let home = columns.capped("home", MAX_TEXT_VALUE_BYTES).map_err(&bad)?;
        let journal_created_at_ms = self.unsigned_next(&mut columns, "journal_created_at_ms")?;
        let shipped_through = self.unsigned_next(&mut columns, "shipped_through")?;
        let shipped_at: Option<i64> = columns.value("shipped_at").map_err(&bad)?;
        Ok(FleetJournal {
            journal_id,
            host_name,
            home,
            journal_created_at_ms,
            shipped_through,
            shipped_at_ms: shipped_at
                .map(|at| rows::unsigned(at, "shipped_at"))
                .transpose()
                .map_err(&bad)?,
            heartbeat_at_ms: self.unsigned_next(&mut columns, "heartbeat_at")?,
            records: self.unsigned_next(columns.of("runjournal_records"), "count(*)")?,
            runs: self.unsigned_next(columns.of("runjournal_runs"), "count(*)")?,
            runs_open: self.unsigned_next(&mut columns, "count(*)")?,
        })
    }

    /// Runs across the fleet, newest first.
    pub fn runs(&mut self, filter: &RunFilter) -> Result<Vec<FleetRun>, ShipError> {
        let states: Vec<&str> = filter.states.iter().map(|state| state.as_str()).collect();
        let since = filter
            .created_since_ms
            .map(|at| rows::bigint(at, "--since"))
            .transpose()
            .map_err(self.bad())?;
        let until = filter
            .created_until_ms
            .map(|at| rows::bigint(at, "--until"))
            .transpose()
            .map_err(self.bad())?;
        let mut runs: Vec<FleetRun> = Vec::new();
        loop {
            let limit = page_limit(filter.limit, runs.len());
            if limit == 0 {
                return Ok(runs);
            }
            let after = runs.last().map(|last| {
                (
                    i64::try_from(last.created_at_ms).unwrap_or(i64::MAX),
                    last.run_id.to_string(),
                    last.journal_id.clone(),
                )
            });
            let after_created = after.as_ref().map(|after| after.0);
            let after_run = after.as_ref().map(|after| after.1.clone());
            let after_journal = after.as_ref().map(|after| after.2.clone());
            let page = self.page(
                &format!(
                    "SELECT {}
                     FROM runjournal_runs r JOIN runjournal_journals j USING (journal_id)
                     WHERE (cardinality($1::text[]) = 0 OR r.state = ANY($1))
                       AND ($2::bigint IS NULL OR r.created_at_ms >= $2)
                       AND ($3::bigint IS NULL OR r.created_at_ms <= $3)
                       AND ($5::bigint IS NULL OR r.created_at_ms < $5
                            OR (r.created_at_ms = $5 AND (r.run_id < $6::text
                                OR (r.run_id = $6::text AND r.journal_id > $7::text))))
                     ORDER BY r.created_at_ms DESC, r.run_id DESC, r.journal_id
                     LIMIT $4",
                    run_columns()
                ),
                &[
                    &states,
                    &since,
                    &until,
                    &limit,
                    &after_created,
                    &after_run,
                    &after_journal,
                ],
            )?;
            if page.is_empty() {
                return Ok(runs);
            }
            for row in &page {
                runs.push(self.fleet_run(row)?);
            }
        }
    }

    /// The one run `text` names across the fleet, as a run of a local journal is named
    /// ([`crate::resolve`], whose refusals it shares): a full id or a unique prefix of one (8
    /// characters or more), or a run's name or tool-call id (per journal, the latest run of
    /// that name, as locally). Different runs matching, in one journal or across the fleet,
    /// are an ambiguity that names them.
    pub fn find_run(&mut self, text: &str) -> Result<FleetRun, ShipError> {
        resolve::check_text(text).map_err(ShipError::Resolve)?;
        // Checked against the id alphabet first, so it can hold no LIKE wildcard.
        let prefix = RunId::prefix_range(text)
            .ok()
            .map(|_| format!("{}%", text.to_ascii_uppercase()));
        let mut found: Vec<(FleetRun, &str)> = Vec::new();
        if let Some(prefix) = &prefix {
            let rows = self.session.query(
                &format!(
                    "SELECT {}
                     FROM runjournal_runs r JOIN runjournal_journals j USING (journal_id)
                     WHERE r.run_id LIKE $1
                     ORDER BY r.created_at_ms DESC, r.journal_id
                     LIMIT $2",
                    run_columns()
                ),
                &[prefix, &FIND_MATCHES_MAX],
            )?;
            for row in &rows {
                found.push((self.fleet_run(row)?, "by id prefix"));
            }
        }
        let rows = self.session.query(
            &format!(
                "SELECT DISTINCT ON (r.journal_id) {}
                 FROM runjournal_runs r JOIN runjournal_journals j USING (journal_id)
                 WHERE r.name = $1 OR r.status ->> 'toolCallId' = $1
                 ORDER BY r.journal_id, r.created_at_ms DESC, r.run_id DESC
                 LIMIT $2",
                run_columns()
            ),
            &[&text, &FIND_MATCHES_MAX],
        )?;
        for row in &rows {
            found.push((self.fleet_run(row)?, "by name or tool-call id"));
        }
        let mut runs: Vec<&(FleetRun, &str)> = Vec::new();
        for candidate in &found {
            let is_known = runs.iter().any(|(run, _)| {
                run.journal_id == candidate.0.journal_id && run.run_id == candidate.0.run_id
            });
            if !is_known {
                runs.push(candidate);
            }
        }
        let text_owned = text.to_string();
        match runs.as_slice() {
            [] => Err(ShipError::Resolve(ResolveError::Unknown {
                text: text_owned,
            })),
            [(run, _)] => Ok(run.clone()),
            many => {
                let named = |(run, how): &&(FleetRun, &str)| {
                    format!("run {} on {} {how}", run.run_id, run.host_name)
                };
                let examples = many
                    .iter()
                    .take(AMBIGUITY_EXAMPLES_MAX)
                    .map(named)
                    .collect::<Vec<_>>()
                    .join(", ");
                let is_all_by_prefix = many.iter().all(|(_, how)| *how == "by id prefix");
                Err(ShipError::Resolve(if is_all_by_prefix {
                    ResolveError::Ambiguous {
                        text: text_owned,
                        count: many.len(),
                        examples,
                    }
                } else {
                    ResolveError::AmbiguousKinds {
                        text: text_owned,
                        matches: examples,
                    }
                }))
            }
        }
    }

    /// A run of the fleet as its shipped records fold (they are the truth here too, as a
    /// local journal's records are), with the records in seq order.
    pub fn run_state(&mut self, run: &FleetRun) -> Result<(RunState, Vec<Record>), ShipError> {
        let records: Vec<Record> = self
            .run_records(&run.journal_id, run.run_id)?
            .into_iter()
            .map(|(_, record)| record)
            .collect();
        let state = run_state::replay(&records)
            .map_err(|error| ShipError::BadData {
                target: self.target.clone(),
                reason: format!(
                    "the shipped records of run {} do not fold: {error}",
                    run.run_id
                ),
            })?
            .ok_or_else(|| ShipError::BadData {
                target: self.target.clone(),
                reason: format!("run {} has no shipped records", run.run_id),
            })?;
        Ok((state, records))
    }

    fn fleet_run(&self, row: &tokio_postgres::Row) -> Result<FleetRun, ShipError> {
        const TABLE: &str = "runjournal_runs";
        let bad = self.bad();
        let text = MAX_TEXT_VALUE_BYTES;
        let mut columns = Columns::new(row, TABLE);
        let journal_id: String = columns.capped("journal_id", text).map_err(&bad)?;
        let host_name: String = columns
            .of("runjournal_journals")
            .capped("host_name", text)
            .map_err(&bad)?;
        let heartbeat_at_ms = self.unsigned_next(&mut columns, "heartbeat_at")?;
        columns.of(TABLE);
        let run_text: String = columns.capped("run_id", text).map_err(&bad)?;
        let name: Option<String> = columns.capped("name", text).map_err(&bad)?;
        let state_text: String = columns.capped("state", text).map_err(&bad)?;
        let is_closed: bool = columns.value("is_closed").map_err(&bad)?;
        let is_stale: bool = columns.value("is_stale").map_err(&bad)?;
        let is_dismissed: bool = columns.value("is_dismissed").map_err(&bad)?;
        let mut count = |column: &str| {
            let count: i32 = columns.value(column).map_err(&bad)?;
            u32::try_from(count)
                .map_err(|_| bad(format!("column {column} of {TABLE} is negative ({count})")))
        };
        let steps_done = count("steps_done")?;
        let steps_total = count("steps_total")?;
        let runner_pid: Option<i64> = columns.value("runner_pid").map_err(&bad)?;
        let created_at_ms = self.unsigned_next(&mut columns, "created_at_ms")?;
        let updated_at_ms = self.unsigned_next(&mut columns, "updated_at_ms")?;
        let ended_at: Option<i64> = columns.value("ended_at_ms").map_err(&bad)?;
        let head_seq = self.unsigned_next(&mut columns, "head_seq")?;
        let status: Value = columns
            .capped("status", MAX_JSON_VALUE_BYTES)
            .map_err(|reason| bad(format!("run {run_text} of journal {journal_id}: {reason}")))?;
        Ok(FleetRun {
            journal_id,
            host_name,
            heartbeat_at_ms,
            run_id: run_text
                .parse()
                .map_err(|error| bad(format!("run id {run_text:?}: {error}")))?,
            name,
            state: state_text
                .parse()
                .map_err(|error| bad(format!("state {state_text:?}: {error}")))?,
            is_closed,
            is_stale,
            is_dismissed,
            steps_done,
            steps_total,
            runner_pid: runner_pid
                .map(|pid| u32::try_from(pid).map_err(|_| bad(format!("runner pid {pid}"))))
                .transpose()?,
            created_at_ms,
            updated_at_ms,
            ended_at_ms: ended_at
                .map(|at| rows::unsigned(at, "ended_at_ms"))
                .transpose()
                .map_err(&bad)?,
            head_seq,
            status,
        })
    }

    /// A row of `runjournal_records` as [`RecordRow`]: the global seq, then the columns of
    /// [`rows::record_value_columns`].
    fn record_row(&self, row: &tokio_postgres::Row) -> Result<RecordRow, ShipError> {
        let mut columns = Columns::new(row, "runjournal_records");
        let global_seq: i64 = columns.value("global_seq").map_err(self.bad())?;
        columns.record_row(global_seq).map_err(self.bad())
    }

    /// The shipped records of one run, in seq order, each read back into a record.
    pub fn run_records(
        &mut self,
        journal_id: &str,
        run: RunId,
    ) -> Result<Vec<(u64, Record)>, ShipError> {
        let run_text = run.to_string();
        let limit = page_limit(None, 0);
        let mut records: Vec<(u64, Record)> = Vec::new();
        let mut after: Option<i64> = None;
        loop {
            let page = self.page(
                &format!(
                    "SELECT global_seq, {}, seq FROM runjournal_records
                     WHERE journal_id = $1 AND run_id = $2 AND ($3::bigint IS NULL OR seq > $3)
                     ORDER BY seq LIMIT $4",
                    capped("event", MAX_JSON_VALUE_BYTES)
                ),
                &[&journal_id, &run_text, &after, &limit],
            )?;
            if page.is_empty() {
                return Ok(records);
            }
            for row in &page {
                let mut columns = Columns::new(row, "runjournal_records");
                let global = self.unsigned_next(&mut columns, "global_seq")?;
                let event: Value = columns
                    .capped("event", MAX_JSON_VALUE_BYTES)
                    .map_err(self.bad())?;
                after = Some(columns.value("seq").map_err(self.bad())?);
                let record = rows::record_from_event_line(&event).map_err(|reason| {
                    (self.bad())(format!("run {run}, global seq {global}: {reason}"))
                })?;
                records.push((global, record));
            }
        }
    }

    /// Shipped records across the fleet in time order (then journal, then global seq).
    pub fn events(&mut self, filter: &EventFilter) -> Result<Vec<ShippedRecord>, ShipError> {
        let (journal, run) = match &filter.run {
            Some((journal, run)) => (Some(journal.clone()), Some(run.to_string())),
            None => (None, None),
        };
        let after = rows::bigint(filter.after_seq, "--after-seq").map_err(self.bad())?;
        // One page at most, whatever the caller asked: the caller reads on from the last.
        let limit = page_limit(filter.limit, 0);
        let (page_time, page_journal, page_global) = match &filter.after {
            Some((time, journal, global)) => (Some(*time), Some(journal.clone()), Some(*global)),
            None => (None, None, None),
        };
        let page = self.page(
            &format!(
                "SELECT {}, {}, x.global_seq, {}
             FROM runjournal_records x JOIN runjournal_journals j USING (journal_id)
             WHERE x.global_seq > $1
               AND ($2::text IS NULL OR x.journal_id = $2)
               AND ($3::text IS NULL OR x.run_id = $3)
               AND ($5::bigint IS NULL
                    OR (x.time_ms, x.journal_id, x.global_seq) > ($5, $6::text, $7::bigint))
             ORDER BY x.time_ms, x.journal_id, x.global_seq
             LIMIT $4",
                capped("x.journal_id", MAX_TEXT_VALUE_BYTES),
                capped("j.host_name", MAX_TEXT_VALUE_BYTES),
                rows::record_value_columns("x"),
            ),
            &[
                &after,
                &journal,
                &run,
                &limit,
                &page_time,
                &page_journal,
                &page_global,
            ],
        )?;
        page.iter()
            .map(|row| {
                let bad = self.bad();
                let mut columns = Columns::new(row, "runjournal_records");
                let journal_id = columns
                    .capped("journal_id", MAX_TEXT_VALUE_BYTES)
                    .map_err(&bad)?;
                let host_name = columns
                    .of("runjournal_journals")
                    .capped("host_name", MAX_TEXT_VALUE_BYTES)
                    .map_err(&bad)?;
                let global_seq: i64 = columns
                    .of("runjournal_records")
                    .value("global_seq")
                    .map_err(&bad)?;
                Ok(ShippedRecord {
                    journal_id,
                    host_name,
                    row: columns.record_row(global_seq).map_err(&bad)?,
                })
            })
            .collect()
    }

    /// Runs per state per journal.
    pub fn state_counts(&mut self) -> Result<Vec<(String, RunStatus, u64)>, ShipError> {
        const TABLE: &str = "runjournal_runs";
        let limit = page_limit(None, 0);
        let mut counts: Vec<(String, RunStatus, u64)> = Vec::new();
        let mut after: Option<(String, String)> = None;
        loop {
            let (after_journal, after_state) = after.clone().unzip();
            let page = self.page(
                &format!(
                    "SELECT {}, {}, count(*) FROM runjournal_runs
                     WHERE $1::text IS NULL OR (journal_id, state) > ($1, $2::text)
                     GROUP BY journal_id, state ORDER BY journal_id, state LIMIT $3",
                    capped("journal_id", MAX_TEXT_VALUE_BYTES),
                    capped("state", MAX_TEXT_VALUE_BYTES),
                ),
                &[&after_journal, &after_state, &limit],
            )?;
            if page.is_empty() {
                return Ok(counts);
            }
            for row in &page {
                let mut columns = Columns::new(row, TABLE);
                let journal: String = columns
                    .capped("journal_id", MAX_TEXT_VALUE_BYTES)
                    .map_err(self.bad())?;
                let state: String = columns
                    .capped("state", MAX_TEXT_VALUE_BYTES)
                    .map_err(self.bad())?;
                let status = state
                    .parse()
                    .map_err(|error| (self.bad())(format!("state {state:?}: {error}")))?;
                let count = self.unsigned_next(&mut columns, "count(*)")?;
                after = Some((journal.clone(), state));
                counts.push((journal, status, count));
            }
        }
    }

    /// A journal's shipped records with `after < global seq <= through`, in global order:
    /// one page, at most `limit` rows (and at most [`FLEET_PAGE_ROWS`]).
    fn records_between(
        &mut self,
        journal_id: &str,
        after: u64,
        through: Option<u64>,
        limit: usize,
    ) -> Result<Vec<RecordRow>, ShipError> {
        let after = rows::bigint(after, "global seq").map_err(self.bad())?;
        let through = through
            .map(|through| rows::bigint(through, "global seq"))
            .transpose()
            .map_err(self.bad())?;
        let limit = page_limit(Some(limit), 0);
        let page = self.page(
            &format!(
                "SELECT global_seq, {}
                 FROM runjournal_records
                 WHERE journal_id = $1 AND global_seq > $2
                   AND ($3::bigint IS NULL OR global_seq <= $3)
                 ORDER BY global_seq LIMIT $4",
                rows::record_value_columns("")
            ),
            &[&journal_id, &after, &through, &limit],
        )?;
        page.iter().map(|row| self.record_row(row)).collect()
    }

    /// Every shipped record of a journal with `after < global seq <= through`, read in pages.
    fn records_through(
        &mut self,
        journal_id: &str,
        after: u64,
        through: u64,
    ) -> Result<Vec<RecordRow>, ShipError> {
        let mut found: Vec<RecordRow> = Vec::new();
        let mut cursor = after;
        loop {
            let page = self.records_between(journal_id, cursor, Some(through), FLEET_PAGE_ROWS)?;
            let Some(last) = page.last() else {
                return Ok(found);
            };
            let last = u64::try_from(last.global_seq).map_err(|_| {
                (self.bad())(format!(
                    "column global_seq of runjournal_records is negative ({})",
                    last.global_seq
                ))
            })?;
            if last <= cursor {
                return Err((self.bad())(format!(
                    "global seq {last} is not after {cursor}"
                )));
            }
            cursor = last;
            found.extend(page);
        }
    }
}

/// How a local journal and the server's copy of it compare.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Comparison {
    /// Whether the server knows the journal at all.
    pub is_registered: bool,
    /// The server's cursor for the journal.
    pub shipped_through: u64,
    pub local_head: u64,
    /// Local records compared (those up to `shipped_through`).
    pub records_compared: u64,
    /// Local records after the cursor: not shipped yet, so not expected on the server.
    pub not_yet_shipped: u64,
    /// Global seqs the server should hold (at or below its cursor) and does not.
    pub missing: Vec<(u64, RunId, u64)>,
    /// Global seqs the server holds that the local journal does not, or holds beyond the
    /// server's own cursor.
    pub extra: Vec<RecordRow>,
    /// Global seqs whose rows differ from the local record, with what differs.
    pub different: Vec<(u64, RunId, u64, Vec<String>)>,
}

impl Comparison {
    /// Each difference as a problem of `inspect verify` (kind `shipped`, inconsistent): the
    /// server knowing nothing of the journal first, then each record, by global seq.
    pub fn problems(&self, journal_id: &str) -> Vec<Problem> {
        let problem = |message: String, run: Option<RunId>, seq: Option<u64>, changes| Problem {
            severity: Severity::Inconsistent,
            kind: ProblemKind::Shipped,
            run,
            seq,
            file: None,
            message,
            changes,
        };
        let mut problems = Vec::new();
        if !self.is_registered && self.local_head > 0 {
            problems.push(problem(
                format!(
                    "the server holds nothing of journal {journal_id} ({} record{} not shipped)",
                    self.not_yet_shipped,
                    if self.not_yet_shipped == 1 { "" } else { "s" }
                ),
                None,
                None,
                Vec::new(),
            ));
        }
        let mut by_record: Vec<(u64, Problem)> = Vec::new();
        for (global, run, seq) in &self.missing {
            by_record.push((
                *global,
                problem(
                    format!("run {run} seq {seq} (global seq {global}) is missing on the server"),
                    Some(*run),
                    Some(*seq),
                    Vec::new(),
                ),
            ));
        }
        for (global, run, seq, changes) in &self.different {
            by_record.push((
                *global,
                problem(
                    format!("run {run} seq {seq} (global seq {global}) differs on the server"),
                    Some(*run),
                    Some(*seq),
                    changes.clone(),
                ),
            ));
        }
        for row in &self.extra {
            by_record.push((
                u64::try_from(row.global_seq).unwrap_or_default(),
                problem(
                    format!(
                        "run {} seq {} ({}) is on the server at global seq {} but not in the journal as shipped",
                        row.run_id, row.seq, row.event_type, row.global_seq
                    ),
                    row.run_id.parse().ok(),
                    u64::try_from(row.seq).ok(),
                    Vec::new(),
                ),
            ));
        }
        by_record.sort_by_key(|(global, _)| *global);
        problems.extend(by_record.into_iter().map(|(_, problem)| problem));
        problems
    }

    pub fn has_differences(&self) -> bool {
        !self.missing.is_empty()
            || !self.extra.is_empty()
            || !self.different.is_empty()
            || (!self.is_registered && self.local_head > 0)
    }
}

/// Compares the journal `view` reads (whose id is `journal_id`) with what the server holds.
pub fn compare(view: &View, fleet: &mut Fleet, journal_id: &str) -> Result<Comparison, ShipError> {
    let local_head = view.global_head()?;
    let Some(journal) = fleet.journal(journal_id)? else {
        return Ok(Comparison {
            local_head,
            not_yet_shipped: view.record_count()?,
            ..Comparison::default()
        });
    };
    let mut comparison = Comparison {
        is_registered: true,
        shipped_through: journal.shipped_through,
        local_head,
        ..Comparison::default()
    };
    let through = journal.shipped_through;
    let mut cursor = 0u64;
    loop {
        let local = view.records_after(cursor, COMPARE_PAGE)?;
        let Some((window_end, _)) = local.last() else {
            break;
        };
        let window_end = *window_end;
        let server = fleet.records_through(journal_id, cursor, window_end)?;
        let mut server = server.into_iter().peekable();
        for (global, record) in &local {
            while let Some(row) = server.next_if(|row| (row.global_seq as u64) < *global) {
                comparison.extra.push(row);
            }
            let shipped = server.next_if(|row| row.global_seq as u64 == *global);
            let is_expected = *global <= through;
            match (shipped, is_expected) {
                (Some(row), _) => {
                    let local_row = rows::record_row(*global, record).map_err(fleet.bad())?;
                    let changes = rows::record_differences(&local_row, &row);
                    if !changes.is_empty() {
                        comparison
                            .different
                            .push((*global, record.run_id, record.seq, changes));
                    }
                    if is_expected {
                        comparison.records_compared += 1;
                    } else {
                        // Held beyond the server's own cursor: a batch is all or nothing, so
                        // someone wrote it there.
                        comparison.extra.push(row);
                    }
                }
                (None, true) => {
                    comparison.records_compared += 1;
                    comparison
                        .missing
                        .push((*global, record.run_id, record.seq));
                }
                (None, false) => comparison.not_yet_shipped += 1,
            }
        }
        comparison.extra.extend(server);
        cursor = window_end;
    }
    // What the server holds past the local head.
    loop {
        let rows = fleet.records_between(journal_id, cursor, None, COMPARE_PAGE)?;
        let Some(last) = rows.last() else { break };
        cursor = last.global_seq as u64;
        comparison.extra.extend(rows);
    }
    Ok(comparison)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_is_silent_only_past_the_threshold_and_only_for_open_runs() {
        let journal = FleetJournal {
            journal_id: "j".into(),
            host_name: "h".into(),
            home: "/h".into(),
            journal_created_at_ms: 0,
            shipped_through: 0,
            shipped_at_ms: None,
            heartbeat_at_ms: 10_000,
            records: 0,
            runs: 0,
            runs_open: 0,
        };
        assert_eq!(journal.silent_since(15_000, 5_000), None);
        assert_eq!(journal.silent_since(15_001, 5_000), Some(10_000));
        let mut run = FleetRun {
            journal_id: "j".into(),
            host_name: "h".into(),
            heartbeat_at_ms: 10_000,
            run_id: RunId::generate(),
            name: None,
            state: RunStatus::Running,
            is_closed: false,
            is_stale: false,
            is_dismissed: false,
            steps_done: 0,
            steps_total: 1,
            runner_pid: Some(7),
            created_at_ms: 1,
            updated_at_ms: 1,
            ended_at_ms: None,
            head_seq: 2,
            status: Value::Null,
        };
        assert_eq!(run.host_silent_since(20_000, 5_000), Some(10_000));
        run.is_closed = true;
        assert_eq!(run.host_silent_since(20_000, 5_000), None);
    }
}
