//! The shipper: reads the journal's `log` after the server's cursor and writes the records into
//! PostgreSQL in commit order, a batch per transaction.
//!
//! Exactly once: each batch transaction locks the journal's row (`SELECT shipped_through ...
//! FOR UPDATE`), checks that the cursor is where the batch starts, inserts the records with
//! `ON CONFLICT (journal_id, global_seq) DO NOTHING`, upserts the runs they touch, and moves
//! `shipped_through` to the batch's last global seq — all or nothing. The cursor is read back
//! from the server at every (re)connection, never from a local file, so a shipper killed at any
//! instruction resumes exactly after the last committed batch: a batch whose commit did not
//! happen is sent again whole, one that did is never sent again, and a batch sent twice
//! (two shippers of one journal) changes nothing.
//!
//! Trusted only once checked: the cursor the server gives is judged against the journal
//! ([`super::cursor`]) — not past its head, and the server's record there the journal's own —
//! before anything is sent. What the server proved is then written to the journal's shipping
//! mark ([`crate::journal::Journal::mark_shipped`]), in a write transaction of its own once per
//! pass, after the server's transactions committed; retention keeps every record above the
//! mark. A shipper that starts marks the home as shipping before it contacts the server.
//!
//! Never in the way: each batch is read in a short read transaction that ends before the
//! server is contacted, and nothing here is on the path of an append. A failure (server down,
//! slow, refusing) drops the connection, is written to the state file, and is retried with
//! growing delays; a server refused as ahead of the journal or diverged from it is not
//! retried by [`Shipper::follow`]: a person must look.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio_postgres::Statement;

use crate::event::{Record, RunId, now_ms};
use crate::home::Home;
use crate::journal::lock_wait::{LockWait, command_bound_from_env};
use crate::journal::{CommitSharing, Journal, Location, OpenError, WriterOptions};
use crate::liveness;
use crate::state::{self as run_state, RunState};

use super::connect::Target;
use super::cursor::{self, Local, Refusal};
use super::rows::{self, RecordRow, RunRow};
use super::session::{Bound, Session};
use super::state::{self, ShipState};
use super::{ShipError, journal_id_text, schema};

/// Records per transaction unless told otherwise.
pub const BATCH_RECORDS_DEFAULT: usize = 1000;
/// The most records one transaction may carry.
pub const BATCH_RECORDS_MAX: usize = 10_000;
/// How often a following shipper looks at the journal's head.
pub const POLL_INTERVAL_DEFAULT: Duration = Duration::from_millis(250);
/// How often the journal's row is touched when there is nothing to ship.
pub const HEARTBEAT_INTERVAL_DEFAULT: Duration = Duration::from_secs(10);
/// The first wait after a failure; it doubles up to the maximum.
pub const RETRY_DELAY_FIRST: Duration = Duration::from_millis(250);
pub const RETRY_DELAY_MAX_DEFAULT: Duration = Duration::from_secs(30);

/// How to ship.
#[derive(Debug, Clone)]
pub struct ShipOptions {
    pub target: Target,
    /// The host's name as the fleet shows it.
    pub host_name: String,
    /// Records per transaction, 1 to [`BATCH_RECORDS_MAX`].
    pub batch_records: usize,
    pub poll_interval: Duration,
    pub heartbeat_interval: Duration,
    pub retry_delay_max: Duration,
}

impl ShipOptions {
    /// The defaults, shipping to `target` as `host_name`.
    pub fn new(target: Target, host_name: impl Into<String>) -> ShipOptions {
        ShipOptions {
            target,
            host_name: host_name.into(),
            batch_records: BATCH_RECORDS_DEFAULT,
            poll_interval: POLL_INTERVAL_DEFAULT,
            heartbeat_interval: HEARTBEAT_INTERVAL_DEFAULT,
            retry_delay_max: RETRY_DELAY_MAX_DEFAULT,
        }
    }
}

/// This machine's host name, for `--host-name`'s default.
pub fn local_host_name() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|name| name.into_string().ok())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "unknown-host".to_string())
}

/// What one pass did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PassReport {
    pub records_shipped: u64,
    pub batches: u64,
    /// The server's cursor after the pass.
    pub shipped_through: u64,
    /// The journal's log head when the pass last looked.
    pub global_head: u64,
}

/// What a following shipper reports as it goes.
#[derive(Debug)]
pub enum FollowEvent<'a> {
    /// A pass shipped records.
    Shipped(&'a PassReport),
    /// An attempt failed (the first of a streak, or with another error than the last).
    Failing(&'a ShipError),
    /// Shipping works again after failures.
    Recovered(&'a PassReport),
}

struct Connection {
    session: Session,
    lock_cursor: Statement,
    insert_records: Statement,
    upsert_runs: Statement,
    move_cursor: Statement,
    heartbeat: Statement,
}

struct JournalFacts {
    id: String,
    created_at_ms: u64,
}

/// A batch read from the journal, ready to send.
struct Batch {
    records: Vec<RecordRow>,
    runs: Vec<RunRow>,
    last_global_seq: u64,
}

enum Sent {
    Committed,
    /// The server's cursor was not where the batch starts (another shipper of this journal
    /// moved it); nothing was written.
    CursorMoved(u64),
}

/// Ships one home's journal.
pub struct Shipper {
    home: Home,
    options: ShipOptions,
    /// The journal, opened for reading and for writing its shipping mark (never an append).
    reader: Option<Journal>,
    journal: Option<JournalFacts>,
    connection: Option<Connection>,
    /// The server's `shipped_through`, as last learned from it.
    shipped_through: Option<u64>,
    /// Runs folded for the previous batch, so a run spanning batches is not folded from its
    /// first record again for each.
    folded: HashMap<RunId, RunState>,
    last_heartbeat: Option<Instant>,
    state: ShipState,
}

impl Shipper {
    pub fn new(home: Home, options: ShipOptions) -> Shipper {
        let mut state = state::read(&home).unwrap_or(ShipState {
            shipper: None,
            target: String::new(),
            journal_id: None,
            host_name: String::new(),
            shipped_through: 0,
            shipped_at_ms: None,
            failing_since_ms: None,
            last_error: None,
            updated_at_ms: now_ms(),
        });
        state.shipper = liveness::current().ok();
        state.target = options.target.shown().to_string();
        state.host_name = options.host_name.clone();
        Shipper {
            home,
            options,
            reader: None,
            journal: None,
            connection: None,
            shipped_through: None,
            folded: HashMap::new(),
            last_heartbeat: None,
            state,
        }
    }

    /// The server's cursor, once learned.
    pub fn shipped_through(&self) -> Option<u64> {
        self.shipped_through
    }

    /// Ships everything the journal held when the pass began, then touches the heartbeat if it
    /// is due. The outcome is written to the state file either way.
    pub fn pass(&mut self) -> Result<PassReport, ShipError> {
        let result = self.try_pass();
        match &result {
            Ok(report) => self.note_success(report),
            Err(error) => self.note_failure(error),
        }
        result
    }

    /// Ships until `should_stop` says so, retrying failures with growing delays; reports what
    /// happens through `on_event`. Returns the error of a server refused as ahead of the
    /// journal or diverged from it ([`ShipError::is_refusal`]): retrying would not mend it.
    pub fn follow(
        &mut self,
        should_stop: &dyn Fn() -> bool,
        on_event: &mut dyn FnMut(FollowEvent<'_>),
    ) -> Result<(), ShipError> {
        let mut retry_delay = RETRY_DELAY_FIRST;
        let mut last_error: Option<String> = None;
        while !should_stop() {
            let wait = match self.pass() {
                Ok(report) => {
                    if last_error.take().is_some() {
                        on_event(FollowEvent::Recovered(&report));
                    } else if report.records_shipped > 0 {
                        on_event(FollowEvent::Shipped(&report));
                    }
                    retry_delay = RETRY_DELAY_FIRST;
                    self.options.poll_interval
                }
                Err(error) if error.is_refusal() => return Err(error),
                Err(error) => {
                    let text = error.to_string();
                    if last_error.as_deref() != Some(text.as_str()) {
                        on_event(FollowEvent::Failing(&error));
                    }
                    last_error = Some(text);
                    let wait = jittered(retry_delay);
                    retry_delay = (retry_delay * 2).min(self.options.retry_delay_max);
                    wait
                }
            };
            sleep_unless_stopped(wait, should_stop);
        }
        Ok(())
    }

    fn try_pass(&mut self) -> Result<PassReport, ShipError> {
        self.ensure_reader()?;
        self.ensure_connection()?;
        let mut report = PassReport::default();
        let head_at_start = self.global_head()?;
        report.global_head = head_at_start;
        // The next batch, read while the server committed the previous one.
        let mut prefetched: Option<Batch> = None;
        loop {
            let cursor = self
                .shipped_through
                .expect("a connection always knows the server's cursor");
            report.shipped_through = cursor;
            if cursor >= head_at_start {
                break;
            }
            let batch = match prefetched.take() {
                Some(batch) => batch,
                None => match self.read_batch(cursor)? {
                    Some(batch) => batch,
                    None => break,
                },
            };
            let mut connection = self.connection.take().expect("ensure_connection ran");
            let journal_id = self.journal().id.clone();
            let target = self.options.target.shown().to_string();
            let has_more = batch.last_global_seq < head_at_start;
            let (sent, next) = std::thread::scope(|scope| {
                let sending = scope
                    .spawn(|| send_batch(&mut connection, &target, &journal_id, cursor, &batch));
                // The journal is read on this thread while the server works on the batch;
                // if the batch does not commit, this read is simply thrown away.
                let next = has_more.then(|| self.read_batch(batch.last_global_seq));
                let sent = match sending.join() {
                    Ok(sent) => sent,
                    Err(panic) => std::panic::resume_unwind(panic),
                };
                (sent, next)
            });
            self.connection = Some(connection);
            match sent? {
                Sent::Committed => {
                    report.records_shipped += batch.records.len() as u64;
                    report.batches += 1;
                    self.shipped_through = Some(batch.last_global_seq);
                    self.last_heartbeat = Some(Instant::now());
                    prefetched = next.transpose()?.flatten();
                }
                Sent::CursorMoved(server) => {
                    // Another shipper of this journal moved it: checked as at a connection.
                    self.folded.clear();
                    self.check_cursor(server)?;
                    self.shipped_through = Some(server);
                }
            }
        }
        report.shipped_through = self.shipped_through.unwrap_or(0);
        self.mark_proven(report.shipped_through)?;
        let is_heartbeat_due = self
            .last_heartbeat
            .is_none_or(|at| at.elapsed() >= self.options.heartbeat_interval);
        if is_heartbeat_due {
            self.heartbeat()?;
        }
        Ok(report)
    }

    /// Opens the journal (never creating one) and marks the home as shipping, before the
    /// server is contacted: from now on retention keeps what is not proven shipped.
    fn ensure_reader(&mut self) -> Result<(), ShipError> {
        if self.reader.is_some() {
            return Ok(());
        }
        // A home someone else owns or may write is refused, as every command refuses it; so
        // is a journal lost beside runs, and a missing one is waited for, never made.
        crate::store::check_home(&self.home)?;
        crate::journal::check_home_journal(&self.home)?;
        let path = self.home.journal_path();
        if let Err(source) = std::fs::symlink_metadata(&path) {
            return Err(ShipError::Open(OpenError::Io { path, source }));
        }
        let lock_bound = command_bound_from_env().map_err(|reason| {
            ShipError::Open(OpenError::Io {
                path: path.clone(),
                source: std::io::Error::new(std::io::ErrorKind::InvalidInput, reason),
            })
        })?;
        // Its own commits only (the mark), each alone: a shipper never leads others' commits
        // and gives up on a write lock another process keeps, as a command does.
        let options = WriterOptions {
            commit_sharing: CommitSharing::Alone,
            lock_wait: LockWait::give_up_after(lock_bound),
            ..WriterOptions::default()
        };
        let journal = Journal::open_with(Location::Path(path), options)?;
        let view = journal.view()?;
        let meta = view.meta()?;
        let is_shipping = view.shipped_through()?.is_some();
        drop(view);
        if !is_shipping {
            journal.mark_shipped(0)?;
        }
        self.journal = Some(JournalFacts {
            id: journal_id_text(&meta.journal_id),
            created_at_ms: meta.created_at_ms,
        });
        self.reader = Some(journal);
        Ok(())
    }

    /// Judges the server's cursor against the journal ([`cursor::judge`]); a cursor proven
    /// raises the journal's mark.
    fn check_cursor(&mut self, server_through: u64) -> Result<(), ShipError> {
        let target = self.options.target.shown().to_string();
        let journal_id = self.journal().id.clone();
        let bad = |reason| ShipError::BadData {
            target: target.clone(),
            reason,
        };
        let (journal_head, local, mark) = {
            let reader = self.reader.as_ref().expect("ensure_reader ran");
            let view = reader.view()?;
            let local = match server_through.checked_sub(1) {
                Some(before) => match view.records_after(before, 1)?.pop() {
                    Some((global, record)) if global == server_through => {
                        Local::Record(rows::record_row(global, &record).map_err(bad)?)
                    }
                    _ => Local::Gone,
                },
                None => Local::Gone,
            };
            (view.global_head()?, local, view.shipped_through()?)
        };
        let server_record = if server_through == 0 || server_through > journal_head {
            None
        } else {
            let connection = self.connection.as_ref().expect("ensure_connection ran");
            fetch_record(&connection.session, &target, &journal_id, server_through)?
        };
        match cursor::judge(
            server_through,
            server_record.as_ref(),
            journal_head,
            &local,
            mark,
        ) {
            Ok(true) => self.mark_proven(server_through),
            Ok(false) => Ok(()),
            Err(Refusal::Ahead { journal_head }) => Err(ShipError::ServerAhead {
                target,
                journal_id,
                server_through,
                journal_head,
            }),
            Err(Refusal::Diverged { server, journal }) => Err(ShipError::Diverged {
                target,
                journal_id,
                global_seq: server_through,
                server,
                journal,
            }),
        }
    }

    /// Raises the journal's shipping mark to `through` when it is below: a write transaction
    /// of its own, made only after the server committed what it covers.
    fn mark_proven(&self, through: u64) -> Result<(), ShipError> {
        let journal = self.reader.as_ref().expect("ensure_reader ran");
        let mark = journal.view()?.shipped_through()?;
        if mark.is_none_or(|mark| mark < through) {
            journal.mark_shipped(through)?;
        }
        Ok(())
    }

    fn journal(&self) -> &JournalFacts {
        self.journal
            .as_ref()
            .expect("the journal's facts are read with the reader")
    }

    fn global_head(&self) -> Result<u64, ShipError> {
        let reader = self.reader.as_ref().expect("ensure_reader ran");
        Ok(reader.view()?.global_head()?)
    }

    fn ensure_connection(&mut self) -> Result<(), ShipError> {
        if self.connection.is_some() {
            return Ok(());
        }
        let target = self.options.target.shown().to_string();
        let mut session = self.options.target.connect()?;
        schema::migrate(&mut session, &target)?;
        let journal = self.journal();
        let created_at_ms =
            rows::bigint(journal.created_at_ms, "journal creation time").map_err(|reason| {
                ShipError::BadData {
                    target: target.clone(),
                    reason,
                }
            })?;
        let row = session.query_one(
            "INSERT INTO runjournal_journals (journal_id, host_name, home, journal_created_at_ms)
             VALUES ($1, $2, $3, $4)
             ON CONFLICT (journal_id) DO UPDATE
             SET host_name = EXCLUDED.host_name, home = EXCLUDED.home, heartbeat_at = now()
             RETURNING shipped_through",
            &[
                &journal.id,
                &self.options.host_name,
                &self.home.root().display().to_string(),
                &created_at_ms,
            ],
        )?;
        let bad = |reason| ShipError::BadData {
            target: target.clone(),
            reason,
        };
        let shipped_through = rows::column(&row, 0, "runjournal_journals", "shipped_through")
            .and_then(|through| rows::unsigned(through, "shipped_through"))
            .map_err(bad)?;
        let lock_cursor = session.prepare(
            "SELECT shipped_through FROM runjournal_journals WHERE journal_id = $1 FOR UPDATE",
        )?;
        let insert_records = session.prepare(INSERT_RECORDS)?;
        let upsert_runs = session.prepare(UPSERT_RUNS)?;
        let move_cursor = session.prepare(
            "UPDATE runjournal_journals
             SET shipped_through = $2, shipped_at = now(), heartbeat_at = now()
             WHERE journal_id = $1",
        )?;
        let heartbeat = session
            .prepare("UPDATE runjournal_journals SET heartbeat_at = now() WHERE journal_id = $1")?;
        self.connection = Some(Connection {
            session,
            lock_cursor,
            insert_records,
            upsert_runs,
            move_cursor,
            heartbeat,
        });
        self.folded.clear();
        // Nothing is sent before the server's cursor is known to be this journal's.
        self.check_cursor(shipped_through)?;
        self.shipped_through = Some(shipped_through);
        self.last_heartbeat = Some(Instant::now());
        Ok(())
    }

    /// Up to a batch of records after `cursor`, with the state of each run they touch as of
    /// its last record in the batch. `None` when there is nothing after `cursor`. The read
    /// transaction ends before this returns.
    fn read_batch(&mut self, cursor: u64) -> Result<Option<Batch>, ShipError> {
        let reader = self.reader.as_ref().expect("ensure_reader ran");
        let view = reader.view()?;
        let records = view.records_after(cursor, self.options.batch_records)?;
        let Some((last_global_seq, _)) = records.last() else {
            return Ok(None);
        };
        let last_global_seq = *last_global_seq;
        let mut folded = HashMap::new();
        let mut runs = Vec::new();
        for (run, seq) in rows::runs_in_batch(&records) {
            let state = match view.snapshot(run)? {
                Some(snapshot) if snapshot.head_seq == seq => snapshot,
                _ => self.fold(&view, &records, run, seq)?,
            };
            let links = view.resume_links(run)?;
            runs.push(rows::run_row(&self.home, &state, &links).map_err(|reason| {
                ShipError::Fold {
                    run: run.to_string(),
                    reason,
                }
            })?);
            folded.insert(run, state);
        }
        drop(view);
        let record_rows = records
            .iter()
            .map(|(global, record)| rows::record_row(*global, record))
            .collect::<Result<Vec<_>, String>>()
            .map_err(|reason| ShipError::Fold {
                run: "-".to_string(),
                reason,
            })?;
        self.folded = folded;
        Ok(Some(Batch {
            records: record_rows,
            runs,
            last_global_seq,
        }))
    }

    /// The run's state as of `seq`: the previous batch's fold carried forward by this batch's
    /// records when it has it, else a fold of the run's records up to `seq`.
    fn fold(
        &self,
        view: &crate::journal::View,
        batch: &[(u64, Record)],
        run: RunId,
        seq: u64,
    ) -> Result<RunState, ShipError> {
        let failed = |reason: String| ShipError::Fold {
            run: run.to_string(),
            reason,
        };
        if let Some(previous) = self.folded.get(&run) {
            let mut state = previous.clone();
            let mut is_contiguous = true;
            for (_, record) in batch.iter().filter(|(_, record)| record.run_id == run) {
                if record.seq != state.head_seq + 1 {
                    is_contiguous = false;
                    break;
                }
                state
                    .apply_mut(record)
                    .map_err(|error| failed(error.to_string()))?;
            }
            if is_contiguous && state.head_seq == seq {
                return Ok(state);
            }
        }
        let records = view.records_until(run, seq)?;
        run_state::replay(&records)
            .map_err(|error| failed(error.to_string()))?
            .ok_or_else(|| failed("it has no records".to_string()))
    }

    fn heartbeat(&mut self) -> Result<(), ShipError> {
        let journal_id = self.journal().id.clone();
        let connection = self.connection.as_mut().expect("ensure_connection ran");
        let heartbeat = connection.heartbeat.clone();
        connection.session.run(async |client, bound| {
            bound
                .answer("the heartbeat", client.execute(&heartbeat, &[&journal_id]))
                .await
        })?;
        self.last_heartbeat = Some(Instant::now());
        self.state.updated_at_ms = now_ms();
        self.save_state();
        Ok(())
    }

    fn note_success(&mut self, report: &PassReport) {
        let has_changed = self.state.failing_since_ms.is_some()
            || self.state.shipped_through != report.shipped_through
            || self.state.journal_id.as_deref() != self.journal.as_ref().map(|j| j.id.as_str());
        if !has_changed {
            return;
        }
        let now = now_ms();
        self.state.failing_since_ms = None;
        self.state.last_error = None;
        self.state.shipped_through = report.shipped_through;
        self.state.shipped_at_ms = Some(now);
        self.state.journal_id = self.journal.as_ref().map(|journal| journal.id.clone());
        self.state.updated_at_ms = now;
        self.save_state();
    }

    fn note_failure(&mut self, error: &ShipError) {
        // Whatever failed, the next attempt starts from a fresh connection (a failed
        // transaction leaves the client in no state to trust) and, after a journal error, a
        // fresh reader.
        self.connection = None;
        self.shipped_through = None;
        if matches!(error, ShipError::Open(_) | ShipError::Read(_)) {
            self.reader = None;
        }
        let now = now_ms();
        self.state.failing_since_ms = Some(self.state.failing_since_ms.unwrap_or(now));
        self.state.last_error = Some(error.to_string().replace('\n', " "));
        self.state.updated_at_ms = now;
        self.save_state();
    }

    fn save_state(&self) {
        // The state file is a report for people; failing to write it (a full disk is the local
        // writer's business) must not stop shipping.
        let _ = state::write(&self.home, &self.state);
    }
}

/// The server's record of journal `journal_id` at `global_seq`, if it holds one.
fn fetch_record(
    session: &Session,
    target: &str,
    journal_id: &str,
    global_seq: u64,
) -> Result<Option<RecordRow>, ShipError> {
    let bad = |reason: String| ShipError::BadData {
        target: target.to_string(),
        reason,
    };
    let global = rows::bigint(global_seq, "global seq").map_err(bad)?;
    let row = session.query_opt(
        &format!(
            "SELECT global_seq, {} FROM runjournal_records
             WHERE journal_id = $1 AND global_seq = $2",
            rows::record_value_columns("")
        ),
        &[&journal_id, &global],
    )?;
    row.map(|row| {
        let mut columns = rows::Columns::new(&row, "runjournal_records");
        let global_seq: i64 = columns.value("global_seq")?;
        columns.record_row(global_seq)
    })
    .transpose()
    .map_err(bad)
}

/// Sends one batch in one transaction: the cursor checked and locked, the records, the runs,
/// the cursor moved; all or nothing.
fn send_batch(
    connection: &mut Connection,
    target: &str,
    journal_id: &str,
    cursor: u64,
    batch: &Batch,
) -> Result<Sent, ShipError> {
    let bad = |reason: String| ShipError::BadData {
        target: target.to_string(),
        reason,
    };
    let expected = rows::bigint(cursor, "cursor").map_err(bad)?;
    let last = rows::bigint(batch.last_global_seq, "global seq").map_err(bad)?;
    let Connection {
        session,
        lock_cursor,
        insert_records,
        upsert_runs,
        move_cursor,
        ..
    } = connection;
    session.transaction(async |transaction, bound| {
        let Some(row) = bound
            .answer(
                "the cursor's lock",
                transaction.query_opt(&*lock_cursor, &[&journal_id]),
            )
            .await?
        else {
            // The journal's row was deleted behind our back: the failure drops the
            // connection, and registering again on the next one starts over from 0 (the
            // conflict rule skips what is there).
            return Err(bad(format!(
                "the row of journal {journal_id} vanished; registering it again"
            )));
        };
        let through: i64 =
            rows::column(&row, 0, "runjournal_journals", "shipped_through").map_err(bad)?;
        if through != expected {
            let through = rows::unsigned(through, "shipped_through").map_err(bad)?;
            return Ok(Sent::CursorMoved(through));
        }
        insert_batch(
            transaction,
            bound,
            journal_id,
            insert_records,
            upsert_runs,
            batch,
        )
        .await?;
        bound
            .answer(
                "the cursor's move",
                transaction.execute(&*move_cursor, &[&journal_id, &last]),
            )
            .await?;
        Ok(Sent::Committed)
    })
}

/// The batch's records and runs, inside its transaction.
async fn insert_batch(
    transaction: &tokio_postgres::Transaction<'_>,
    bound: &Bound,
    journal_id: &str,
    insert_records: &Statement,
    upsert_runs: &Statement,
    batch: &Batch,
) -> Result<(), ShipError> {
    let records = &batch.records;
    let column = |f: fn(&RecordRow) -> i64| records.iter().map(f).collect::<Vec<i64>>();
    let globals = column(|row| row.global_seq);
    let seqs = column(|row| row.seq);
    let times = column(|row| row.time_ms);
    let run_ids: Vec<&str> = records.iter().map(|row| row.run_id.as_str()).collect();
    let types: Vec<&str> = records.iter().map(|row| row.event_type.as_str()).collect();
    let events: Vec<&Value> = records.iter().map(|row| &row.event).collect();
    bound
        .answer(
            "the records' insert",
            transaction.execute(
                insert_records,
                &[
                    &journal_id,
                    &globals,
                    &run_ids,
                    &seqs,
                    &times,
                    &types,
                    &events,
                ],
            ),
        )
        .await?;
    let runs = &batch.runs;
    let run_ids: Vec<&str> = runs.iter().map(|row| row.run_id.as_str()).collect();
    let names: Vec<Option<&str>> = runs.iter().map(|row| row.name.as_deref()).collect();
    let states: Vec<&str> = runs.iter().map(|row| row.state.as_str()).collect();
    let closed: Vec<bool> = runs.iter().map(|row| row.is_closed).collect();
    let stale: Vec<bool> = runs.iter().map(|row| row.is_stale).collect();
    let dismissed: Vec<bool> = runs.iter().map(|row| row.is_dismissed).collect();
    let steps_done: Vec<i32> = runs.iter().map(|row| row.steps_done).collect();
    let steps_total: Vec<i32> = runs.iter().map(|row| row.steps_total).collect();
    let pids: Vec<Option<i64>> = runs.iter().map(|row| row.runner_pid).collect();
    let created: Vec<i64> = runs.iter().map(|row| row.created_at_ms).collect();
    let updated: Vec<i64> = runs.iter().map(|row| row.updated_at_ms).collect();
    let ended: Vec<Option<i64>> = runs.iter().map(|row| row.ended_at_ms).collect();
    let heads: Vec<i64> = runs.iter().map(|row| row.head_seq).collect();
    let statuses: Vec<&Value> = runs.iter().map(|row| &row.status).collect();
    bound
        .answer(
            "the runs' upsert",
            transaction.execute(
                upsert_runs,
                &[
                    &journal_id,
                    &run_ids,
                    &names,
                    &states,
                    &closed,
                    &stale,
                    &dismissed,
                    &steps_done,
                    &steps_total,
                    &pids,
                    &created,
                    &updated,
                    &ended,
                    &heads,
                    &statuses,
                ],
            ),
        )
        .await?;
    Ok(())
}

const INSERT_RECORDS: &str = "
INSERT INTO runjournal_records (journal_id, global_seq, run_id, seq, time_ms, event_type, event)
SELECT $1::text, g, r, s, t, y, e
FROM unnest($2::bigint[], $3::text[], $4::bigint[], $5::bigint[], $6::text[], $7::jsonb[])
     AS batch (g, r, s, t, y, e)
ON CONFLICT (journal_id, global_seq) DO NOTHING";

const UPSERT_RUNS: &str = "
INSERT INTO runjournal_runs (journal_id, run_id, name, state, is_closed, is_stale, is_dismissed,
    steps_done, steps_total, runner_pid, created_at_ms, updated_at_ms, ended_at_ms, head_seq,
    status)
SELECT $1::text, r, n, st, c, sl, d, sd, stt, p, ca, ua, ea, h, j
FROM unnest($2::text[], $3::text[], $4::text[], $5::bool[], $6::bool[], $7::bool[],
            $8::int[], $9::int[], $10::bigint[], $11::bigint[], $12::bigint[], $13::bigint[],
            $14::bigint[], $15::jsonb[])
     AS batch (r, n, st, c, sl, d, sd, stt, p, ca, ua, ea, h, j)
ON CONFLICT (journal_id, run_id) DO UPDATE SET
    name = EXCLUDED.name, state = EXCLUDED.state, is_closed = EXCLUDED.is_closed,
    is_stale = EXCLUDED.is_stale, is_dismissed = EXCLUDED.is_dismissed,
    steps_done = EXCLUDED.steps_done, steps_total = EXCLUDED.steps_total,
    runner_pid = EXCLUDED.runner_pid, created_at_ms = EXCLUDED.created_at_ms,
    updated_at_ms = EXCLUDED.updated_at_ms, ended_at_ms = EXCLUDED.ended_at_ms,
    head_seq = EXCLUDED.head_seq, status = EXCLUDED.status
WHERE runjournal_runs.head_seq < EXCLUDED.head_seq";

/// `delay` give or take a quarter, so shippers that failed together do not retry together.
fn jittered(delay: Duration) -> Duration {
    let quarter_ms = (delay.as_millis() / 4).max(1) as u64;
    let offset = rand::random_range(0..=2 * quarter_ms);
    (delay + Duration::from_millis(offset)).saturating_sub(Duration::from_millis(quarter_ms))
}

fn sleep_unless_stopped(total: Duration, should_stop: &dyn Fn() -> bool) {
    const SLICE: Duration = Duration::from_millis(50);
    let deadline = Instant::now() + total;
    while !should_stop() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        std::thread::sleep(left.min(SLICE));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_within_a_quarter() {
        for _ in 0..200 {
            let wait = jittered(Duration::from_millis(400));
            assert!(wait >= Duration::from_millis(300) && wait <= Duration::from_millis(500));
        }
    }
}
