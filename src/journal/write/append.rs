//! Appending: validate a batch against the run's snapshot, then write its records, the new
//! snapshot and the indexes in the same write transaction.

use redb::{Database, ReadableTable, Table, WriteTransaction};

use crate::event::{Event, FORMAT_VERSION, Record, RunId, UnixMs, WriterId};
use crate::journal::format::error::{
    AppendError, CorruptError, QueueRefusal, ResumeRefusal, StorageFailure, storage,
};
use crate::journal::format::snapshot::encode_snapshot;
use crate::journal::format::tables::{
    self, ACTIVE, ALIASES, GLOBALS, LOG, META, QUEUE_ACTIVE, QUEUE_WAITING, QUEUES, RECORDS,
    RESUMES, RUNS, TERMINAL, WRITERS,
};
use crate::journal::read::view::state_of;
use crate::state::{self, RunState, RunStatus};

/// What must hold for an append to go ahead; checked inside the write transaction, so it
/// cannot race another writer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Condition {
    /// The run's head must be exactly this (0: the run must not exist yet).
    pub expect_head: Option<u64>,
    /// The run must not be terminal.
    pub expect_not_terminal: bool,
}

impl Condition {
    /// No condition.
    pub fn none() -> Condition {
        Condition::default()
    }

    /// The head must be `head`.
    pub fn expect_head(head: u64) -> Condition {
        Condition {
            expect_head: Some(head),
            ..Condition::default()
        }
    }

    /// The run must not be terminal.
    pub fn expect_not_terminal() -> Condition {
        Condition {
            expect_not_terminal: true,
            ..Condition::default()
        }
    }

    /// This condition, and the run must not be terminal.
    pub fn and_not_terminal(self) -> Condition {
        Condition {
            expect_not_terminal: true,
            ..self
        }
    }
}

/// One caller's events for one run, with the identity that makes a retry recognisable.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    pub run: RunId,
    pub events: Vec<Event>,
    pub condition: Condition,
    pub writer: WriterId,
    pub writer_seq: u64,
    /// Time stamped on every record of the batch.
    pub time_ms: UnixMs,
}

/// The outcome of an acknowledged append.
#[derive(Debug, Clone, PartialEq)]
pub struct Appended {
    pub run: RunId,
    /// Seq of the batch's first record.
    pub first_seq: u64,
    /// Seq of the batch's last record.
    pub last_seq: u64,
    /// The run's state after the batch (for a duplicate: the state now).
    pub state: RunState,
    /// The batch had been committed before, by an earlier attempt; nothing was written now.
    pub was_duplicate: bool,
}

struct Tables<'txn> {
    records: Table<'txn, &'static [u8; 24], &'static [u8]>,
    log: Table<'txn, u64, &'static [u8; 24]>,
    runs: Table<'txn, &'static [u8; 16], &'static [u8]>,
    active: Table<'txn, &'static [u8; 16], ()>,
    terminal: Table<'txn, &'static [u8; 24], ()>,
    aliases: Table<'txn, &'static str, &'static [u8; 16]>,
    writers: Table<'txn, u64, u64>,
    globals: Table<'txn, &'static [u8; 24], u64>,
    meta: Table<'txn, &'static str, &'static [u8]>,
    resumes: Table<'txn, &'static [u8; 16], &'static [u8; 16]>,
    queues: Table<'txn, &'static str, u64>,
    queue_waiting: Table<'txn, &'static [u8], &'static [u8; 16]>,
    queue_active: Table<'txn, &'static [u8], ()>,
}

impl<'txn> Tables<'txn> {
    fn open(txn: &'txn WriteTransaction) -> Result<Tables<'txn>, StorageFailure> {
        let op = "opening tables";
        Ok(Tables {
            records: txn
                .open_table(RECORDS)
                .map_err(|e| StorageFailure::new(op, e))?,
            log: txn
                .open_table(LOG)
                .map_err(|e| StorageFailure::new(op, e))?,
            runs: txn
                .open_table(RUNS)
                .map_err(|e| StorageFailure::new(op, e))?,
            active: txn
                .open_table(ACTIVE)
                .map_err(|e| StorageFailure::new(op, e))?,
            terminal: txn
                .open_table(TERMINAL)
                .map_err(|e| StorageFailure::new(op, e))?,
            aliases: txn
                .open_table(ALIASES)
                .map_err(|e| StorageFailure::new(op, e))?,
            writers: txn
                .open_table(WRITERS)
                .map_err(|e| StorageFailure::new(op, e))?,
            globals: txn
                .open_table(GLOBALS)
                .map_err(|e| StorageFailure::new(op, e))?,
            meta: txn
                .open_table(META)
                .map_err(|e| StorageFailure::new(op, e))?,
            resumes: txn
                .open_table(RESUMES)
                .map_err(|e| StorageFailure::new(op, e))?,
            queues: txn
                .open_table(QUEUES)
                .map_err(|e| StorageFailure::new(op, e))?,
            queue_waiting: txn
                .open_table(QUEUE_WAITING)
                .map_err(|e| StorageFailure::new(op, e))?,
            queue_active: txn
                .open_table(QUEUE_ACTIVE)
                .map_err(|e| StorageFailure::new(op, e))?,
        })
    }
}

/// How a batch's writer seq is judged against its writer's mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Marks {
    /// A seq at or below the mark was committed before: answered from its records.
    Idempotent,
    /// Records rebuilt as they were (`journal::rebuild`): their seqs are not checked against
    /// the marks, which only rise to each writer's highest seq, and their queue slots are not
    /// judged again (the records say what each queue admitted; the indexes follow them).
    Rebuild,
}

/// Commits `batches` in one durable write transaction, in order. Each batch is validated on its
/// own against the state left by the batches before it: a refused batch writes nothing and
/// fails only itself. A storage failure fails them all, and none of them is committed.
#[cfg(any(test, feature = "testkit"))]
pub(crate) fn commit_batches(
    db: &Database,
    batches: &[Batch],
) -> Result<Vec<Result<Appended, AppendError>>, StorageFailure> {
    commit_batches_with(db, batches, Marks::Idempotent)
}

/// [`commit_batches`], with the writer marks judged as `marks` says.
pub(crate) fn commit_batches_with(
    db: &Database,
    batches: &[Batch],
    marks: Marks,
) -> Result<Vec<Result<Appended, AppendError>>, StorageFailure> {
    let judged = commit_batches_judged(db, batches, marks, |_| false)?;
    Ok(judged.into_iter().map(|judged| judged.result).collect())
}

/// One batch's outcome in a commit, with what a process that handed the batch over needs to
/// word a refusal itself.
pub(crate) struct Judged {
    pub(crate) result: Result<Appended, AppendError>,
    /// For a refused batch whose refusal was asked to be kept: the run's state it was judged
    /// against (inner `None`: the run did not exist), from which [`judge`] words the same
    /// refusal again.
    pub(crate) refused_against: Option<Option<RunState>>,
}

/// [`commit_batches_with`], keeping for each refused batch that `keeps_refusal` names the
/// run's state the batch was judged against. A refused batch wrote nothing, so reading the
/// run's state again in the same transaction reads exactly that state.
pub(crate) fn commit_batches_judged(
    db: &Database,
    batches: &[Batch],
    marks: Marks,
    keeps_refusal: impl Fn(&Batch) -> bool,
) -> Result<Vec<Judged>, StorageFailure> {
    let txn = db
        .begin_write()
        .map_err(|e| StorageFailure::new("beginning a write", e))?;
    commit_batches_judged_in(txn, batches, marks, keeps_refusal)
}

/// [`commit_batches_judged`] in a write transaction the caller began.
pub(crate) fn commit_batches_judged_in(
    mut txn: WriteTransaction,
    batches: &[Batch],
    marks: Marks,
    keeps_refusal: impl Fn(&Batch) -> bool,
) -> Result<Vec<Judged>, StorageFailure> {
    txn.set_durability(redb::Durability::Immediate)
        .map_err(|e| StorageFailure::new("setting durability", redb::Error::from(e)))?;
    let mut results = Vec::with_capacity(batches.len());
    {
        let mut tables = Tables::open(&txn)?;
        let mut group = Group::start(&tables)?;
        for batch in batches {
            let result = match apply_batch(&mut tables, &mut group, batch, marks) {
                Err(AppendError::Storage(failure)) => return Err(failure),
                other => other,
            };
            let refused_against = match &result {
                Err(error) if is_judged_refusal(error) && keeps_refusal(batch) => {
                    match state_before(&tables, batch.run) {
                        Ok(state) => Some(state),
                        Err(AppendError::Storage(failure)) => return Err(failure),
                        // The state read when the batch was judged; reading it again cannot
                        // fail otherwise, but if it did, the refusal is sent without it.
                        Err(_) => None,
                    }
                }
                _ => None,
            };
            results.push(Judged {
                result,
                refused_against,
            });
        }
        group.finish(&mut tables)?;
    }
    txn.commit()
        .map_err(|e| StorageFailure::new("committing", e))?;
    Ok(results)
}

/// Whether `error` is a refusal that [`judge`] gives from the run's state and the batch alone.
pub(crate) fn is_judged_refusal(error: &AppendError) -> bool {
    matches!(
        error,
        AppendError::UnknownRun { .. }
            | AppendError::Transition { .. }
            | AppendError::HeadMismatch { .. }
            | AppendError::AlreadyTerminal { .. }
            | AppendError::EmptyBatch
            | AppendError::Encode(_)
    )
}

/// A prepared batch: records encoded, the new state folded and its snapshot encoded, nothing
/// written yet. Everything that can refuse a batch happens before [`write`] starts, so a refused
/// batch leaves no trace in a transaction that goes on to commit its batch-mates, but its
/// writer's mark (see [`apply_batch`]).
pub(crate) struct Prepared {
    records: Vec<(u64, Vec<u8>)>,
    /// The run existed before the batch.
    existed: bool,
    /// The run was terminal before the batch.
    was_terminal: bool,
    /// The run was in a queue before the batch.
    was_in_queue: bool,
    /// The run was admitted by its queue before the batch.
    was_admitted: bool,
    /// The run waited for a slot before the batch ([`RunState::is_waiting_for_slot`]).
    was_waiting: bool,
    /// The run held a slot before the batch ([`RunState::holds_slot`]).
    held_slot: bool,
    after: RunState,
    snapshot: Vec<u8>,
    /// The batch records that the run resumes a paused run: link them in the resume index.
    resumes: bool,
}

/// What every batch of a group reads and moves on: the global log head and the writers' marks.
/// They are read once per group and the marks written once at its end, rather than read and
/// written by each batch; what the batches see is the same.
struct Group {
    global_seq: u64,
    /// Per writer: its mark as the group now stands, and whether the group moved it.
    marks: Vec<(WriterId, Option<u64>, bool)>,
}

impl Group {
    fn start(tables: &Tables<'_>) -> Result<Group, StorageFailure> {
        let last = tables
            .log
            .last()
            .map_err(storage("reading the log head"))?
            .map_or(0, |(key, _)| key.value());
        // Pruning may have removed the newest entries: their seqs are not issued again.
        let floor = tables
            .meta
            .get(tables::META_LOG_FLOOR)
            .map_err(storage("reading the log floor"))?;
        let floor = tables::meta_u64(floor.as_ref().map(|value| value.value())).unwrap_or(0);
        let global_seq = last.max(floor);
        Ok(Group {
            global_seq,
            marks: Vec::new(),
        })
    }

    fn mark(
        &mut self,
        tables: &Tables<'_>,
        writer: WriterId,
    ) -> Result<Option<u64>, StorageFailure> {
        if let Some((_, mark, _)) = self.marks.iter().find(|(id, _, _)| *id == writer) {
            return Ok(*mark);
        }
        let mark = tables
            .writers
            .get(writer.0)
            .map_err(storage("reading the writer mark"))?
            .map(|mark| mark.value());
        self.marks.push((writer, mark, false));
        Ok(mark)
    }

    fn advance_mark(&mut self, writer: WriterId, writer_seq: u64) {
        let entry = self
            .marks
            .iter_mut()
            .find(|(id, _, _)| *id == writer)
            .expect("a batch's writer mark is read before it is written");
        let mark = entry.1.map_or(writer_seq, |mark| mark.max(writer_seq));
        *entry = (writer, Some(mark), true);
    }

    fn finish(self, tables: &mut Tables<'_>) -> Result<(), StorageFailure> {
        for (writer, mark, is_moved) in self.marks {
            if let (true, Some(mark)) = (is_moved, mark) {
                tables
                    .writers
                    .insert(writer.0, mark)
                    .map_err(storage("writing the writer mark"))?;
            }
        }
        Ok(())
    }
}

fn apply_batch(
    tables: &mut Tables<'_>,
    group: &mut Group,
    batch: &Batch,
    marks: Marks,
) -> Result<Appended, AppendError> {
    if batch.events.is_empty() {
        return Err(AppendError::EmptyBatch);
    }
    let mark = group.mark(tables, batch.writer)?;
    if marks == Marks::Idempotent && mark.is_some_and(|mark| batch.writer_seq <= mark) {
        return find_duplicate(tables, batch);
    }
    let prepared = match prepare(tables, batch, marks).and_then(|prepared| {
        // A rebuild writes what happened: the slots were judged when the records were made.
        if marks == Marks::Idempotent {
            check_queue(tables, batch.run, &prepared)?;
        }
        Ok(prepared)
    }) {
        Ok(prepared) => prepared,
        Err(refusal) => {
            // A judged seq is spent, refused or not: should a copy of this batch reach another
            // committer later (a commit leader that was stopped while it held the batch, say),
            // it is found at or below the mark and never judged again against a later state.
            let is_judged = is_judged_refusal(&refusal)
                || matches!(
                    refusal,
                    AppendError::Resume { .. } | AppendError::Queue { .. }
                );
            if marks == Marks::Idempotent && is_judged {
                group.advance_mark(batch.writer, batch.writer_seq);
            }
            return Err(refusal);
        }
    };
    write(tables, group, batch, prepared)
}

/// The queue's half of judging a batch, after the reducer accepted it: a run that joins a
/// queue joins one with a limit; a run that takes a slot takes it only while its queue has
/// fewer active runs than its limit, and only as the first run waiting. Read from the queue
/// indexes of this transaction, which the batches before it in the group already moved, so
/// two batches racing for the last slot cannot both take it, whichever process judges them.
/// Its cost follows the queue's active runs (at most its limit, unless the limit was
/// lowered), never its waiting ones.
fn check_queue(tables: &Tables<'_>, run: RunId, prepared: &Prepared) -> Result<(), AppendError> {
    let Some(queue) = &prepared.after.queue else {
        return Ok(());
    };
    let is_joining = !prepared.was_in_queue;
    let is_admitted_now = !prepared.was_admitted && queue.admitted.is_some();
    if !is_joining && !is_admitted_now {
        return Ok(());
    }
    let refuse = |refusal| AppendError::Queue { run, refusal };
    let name = queue.name.as_str();
    let Some(max_active) = tables
        .queues
        .get(name)
        .map_err(storage("reading a queue's limit"))?
        .map(|limit| limit.value())
    else {
        return Err(refuse(QueueRefusal::NoSuchQueue {
            queue: name.to_string(),
        }));
    };
    if !is_admitted_now {
        return Ok(());
    }
    let low = tables::queue_prefix(name);
    let high = tables::queue_prefix_end(name);
    let mut active = 0u64;
    for entry in tables
        .queue_active
        .range::<&[u8]>(low.as_slice()..high.as_slice())
        .map_err(storage("counting a queue's active runs"))?
    {
        entry.map_err(storage("counting a queue's active runs"))?;
        active += 1;
        if active >= max_active {
            return Err(refuse(QueueRefusal::Full {
                queue: name.to_string(),
                active,
                max_active,
            }));
        }
    }
    if max_active == 0 {
        return Err(refuse(QueueRefusal::Full {
            queue: name.to_string(),
            active,
            max_active,
        }));
    }
    let first = tables
        .queue_waiting
        .range::<&[u8]>(low.as_slice()..high.as_slice())
        .map_err(storage("reading a queue's first run"))?
        .next()
        .transpose()
        .map_err(storage("reading a queue's first run"))?
        .map(|(_, first)| RunId::from_bytes(*first.value()));
    match first {
        Some(first) if first == run => Ok(()),
        Some(first) => Err(refuse(QueueRefusal::NotFirst {
            queue: name.to_string(),
            first,
        })),
        // A run being admitted waits in its queue by the index's own rule; if it is missing
        // there, the index is behind the records, and the run is still the one to admit.
        None => Ok(()),
    }
}

/// Validates the batch and encodes its records without writing anything.
fn prepare(tables: &Tables<'_>, batch: &Batch, marks: Marks) -> Result<Prepared, AppendError> {
    let before = state_before(tables, batch.run)?;
    let mut prepared = judge(before, batch)?;
    if let Some(from) = resumed_from(batch) {
        prepared.resumes = resumable(tables, batch.run, from, marks)?;
    }
    Ok(prepared)
}

/// The run a batch's `Resumed` names, if it holds one (the reducer takes one at most, right
/// after `RunCreated`).
fn resumed_from(batch: &Batch) -> Option<RunId> {
    batch.events.iter().find_map(|event| match event {
        Event::Resumed { from } => Some(*from),
        _ => None,
    })
}

/// Whether `run` may record that it resumes `from`, judged in the transaction that would link
/// them, so two resumes of one run cannot both land: `from` is in the journal, ended `paused`,
/// and no run resumed it yet — but one that ended before any runner took it (its launcher gave
/// up on it), which ran nothing and so does not count: the new run takes its place in the
/// index. `Ok(true)`: link them. A rebuild (`journal::rebuild`) takes the records as they were
/// and links only runs that are both there (the old one may have been pruned before the
/// journal was lost).
fn resumable(
    tables: &Tables<'_>,
    run: RunId,
    from: RunId,
    marks: Marks,
) -> Result<bool, AppendError> {
    let old = state_before(tables, from)?;
    let by = tables
        .resumes
        .get(&from.to_bytes())
        .map_err(storage("reading the resume index"))?
        .map(|entry| RunId::from_bytes(*entry.value()));
    let by = match by {
        Some(by) => match state_before(tables, by)? {
            Some(resumer) if resumer.ended_unstarted() => None,
            _ => Some(by),
        },
        None => None,
    };
    if marks == Marks::Rebuild {
        return Ok(old.is_some() && by.is_none());
    }
    let refusal = match (&old, by) {
        (None, _) => ResumeRefusal::Unknown,
        (Some(_), Some(by)) => ResumeRefusal::AlreadyResumed { by },
        (Some(state), None) if state.status != RunStatus::Paused => ResumeRefusal::NotPaused {
            state: state.status,
        },
        (Some(_), None) => return Ok(true),
    };
    Err(AppendError::Resume { run, from, refusal })
}

/// The run's state as this transaction sees it; `None` when the run does not exist.
fn state_before(tables: &Tables<'_>, run: RunId) -> Result<Option<RunState>, AppendError> {
    match tables
        .runs
        .get(&run.to_bytes())
        .map_err(storage("reading the run snapshot"))?
    {
        // A snapshot that does not decode is re-derived from the records; the new snapshot
        // this batch writes replaces it.
        Some(bytes) => Ok(Some(state_of(run, bytes.value(), &tables.records)?)),
        None => Ok(None),
    }
}

/// Judges a batch against the run's state before it (`None`: no such run): its conditions,
/// then each event through [`state::apply`], then the encoding of its records and snapshot.
/// Pure: the same state and batch give the same answer, in any process, which lets a process
/// whose batch another process committed word that process's refusal itself.
pub(crate) fn judge(before: Option<RunState>, batch: &Batch) -> Result<Prepared, AppendError> {
    let run = batch.run;
    let Some(first) = batch.events.first() else {
        return Err(AppendError::EmptyBatch);
    };
    let head = before.as_ref().map_or(0, |state| state.head_seq);
    if before.is_none() && !matches!(first, Event::RunCreated { .. }) {
        return Err(AppendError::UnknownRun { run });
    }
    if let Some(expected) = batch
        .condition
        .expect_head
        .filter(|&expected| expected != head)
    {
        return Err(AppendError::HeadMismatch {
            run,
            expected,
            found: head,
        });
    }
    let terminal = before.as_ref().filter(|state| state.is_terminal());
    if let (true, Some(state)) = (batch.condition.expect_not_terminal, terminal) {
        return Err(AppendError::AlreadyTerminal {
            run,
            state: state.status,
        });
    }
    let existed = before.is_some();
    let was_terminal = before.as_ref().is_some_and(RunState::is_terminal);
    let before_queue = before.as_ref().and_then(|state| state.queue.as_ref());
    let was_in_queue = before_queue.is_some();
    let was_admitted = before_queue.is_some_and(|queue| queue.admitted.is_some());
    let was_waiting = before.as_ref().is_some_and(RunState::is_waiting_for_slot);
    let held_slot = before.as_ref().is_some_and(RunState::holds_slot);
    // Folded in place: a refused event leaves `state` half-way, but it is then dropped.
    let mut state = before;
    let mut records = Vec::with_capacity(batch.events.len());
    for (index, event) in batch.events.iter().enumerate() {
        let seq = head + 1 + index as u64;
        let record = Record {
            format_version: FORMAT_VERSION,
            run_id: run,
            seq,
            time_ms: batch.time_ms,
            writer: batch.writer,
            writer_seq: batch.writer_seq,
            event: event.clone(),
        };
        let folded = match &mut state {
            None => state::apply(None, &record).map(|created| state = Some(created)),
            Some(state) => state.apply_mut(&record),
        };
        folded.map_err(|source| AppendError::Transition { index, source })?;
        assert_eq!(
            state.as_ref().map(|state| state.head_seq),
            Some(seq),
            "apply advances the head by exactly one"
        );
        records.push((seq, record.encode()?));
    }
    let after = state.expect("a non-empty batch leaves a state");
    let snapshot = encode_snapshot(&after)?;
    Ok(Prepared {
        records,
        existed,
        was_terminal,
        was_in_queue,
        was_admitted,
        was_waiting,
        held_slot,
        after,
        snapshot,
        resumes: false,
    })
}

/// Writes a prepared batch. Only a storage failure can stop it part-way, and that fails the
/// whole transaction.
fn write(
    tables: &mut Tables<'_>,
    group: &mut Group,
    batch: &Batch,
    prepared: Prepared,
) -> Result<Appended, AppendError> {
    let run = batch.run;
    let run_key = run.to_bytes();
    let global_seq = &mut group.global_seq;
    let first_seq = prepared.records[0].0;
    let last_seq = prepared.after.head_seq;
    debug_assert!(
        prepared.records.len() == batch.events.len()
            && (first_seq..=last_seq).eq(prepared.records.iter().map(|(seq, _)| *seq)),
        "a batch's records take consecutive seqs, one each, up to the stored state's head"
    );
    for (seq, bytes) in &prepared.records {
        let key = tables::record_key(run, *seq);
        tables
            .records
            .insert(&key, bytes.as_slice())
            .map_err(storage("writing a record"))?;
        *global_seq += 1;
        tables
            .log
            .insert(*global_seq, &key)
            .map_err(storage("writing the log"))?;
        tables
            .globals
            .insert(&key, *global_seq)
            .map_err(storage("writing the log index"))?;
    }
    tables
        .runs
        .insert(&run_key, prepared.snapshot.as_slice())
        .map_err(storage("writing the snapshot"))?;

    let after = &prepared.after;
    if after.is_closed() {
        tables
            .active
            .remove(&run_key)
            .map_err(storage("updating the active index"))?;
    } else if !prepared.existed {
        tables
            .active
            .insert(&run_key, ())
            .map_err(storage("updating the active index"))?;
    }
    if let (false, Some(ended_at)) = (prepared.was_terminal, after.ended_at_ms()) {
        tables
            .terminal
            .insert(&tables::terminal_key(ended_at, run), ())
            .map_err(storage("updating the terminal index"))?;
    }
    if !prepared.existed {
        if let Some(tool_call_id) = &after.tool_call_id {
            tables
                .aliases
                .insert(tables::tool_call_alias(tool_call_id).as_str(), &run_key)
                .map_err(storage("writing an alias"))?;
        }
        if let Some(name) = &after.spec.name {
            tables
                .aliases
                .insert(tables::name_alias(name).as_str(), &run_key)
                .map_err(storage("writing an alias"))?;
        }
    }
    if let (true, Some(from)) = (prepared.resumes, resumed_from(batch)) {
        tables
            .resumes
            .insert(&from.to_bytes(), &run_key)
            .map_err(storage("writing the resume index"))?;
    }
    write_queue_indexes(tables, run, &prepared)?;
    group.advance_mark(batch.writer, batch.writer_seq);
    Ok(Appended {
        run,
        first_seq,
        last_seq,
        state: prepared.after,
        was_duplicate: false,
    })
}

/// Moves the run in its queue's indexes as the batch moved it: into the waiting runs when it
/// joined, out of them when admitted or ended; into the active runs when admitted, out of
/// them at its `Terminal`.
fn write_queue_indexes(
    tables: &mut Tables<'_>,
    run: RunId,
    prepared: &Prepared,
) -> Result<(), AppendError> {
    let after = &prepared.after;
    let Some(queue) = &after.queue else {
        return Ok(());
    };
    let is_waiting = after.is_waiting_for_slot();
    let holds_slot = after.holds_slot();
    debug_assert!(
        !(is_waiting && holds_slot),
        "a run either waits for a slot or holds one"
    );
    debug_assert!(
        prepared.held_slot || !holds_slot || (!prepared.was_admitted && queue.admitted.is_some()),
        "a slot is taken only by an admission judged in this batch (check_queue)"
    );
    if prepared.was_waiting != is_waiting {
        let joined = tables
            .globals
            .get(&tables::record_key(run, tables::QUEUE_JOINED_SEQ))
            .map_err(storage("reading where the run joined its queue"))?
            .map(|global| global.value());
        // Written with the run's records in its creation batch; never pruned while the run
        // is open.
        if let Some(joined) = joined {
            let key = tables::queue_waiting_key(&queue.name, joined);
            if is_waiting {
                tables
                    .queue_waiting
                    .insert(key.as_slice(), &run.to_bytes())
                    .map_err(storage("updating a queue's waiting runs"))?;
            } else {
                tables
                    .queue_waiting
                    .remove(key.as_slice())
                    .map_err(storage("updating a queue's waiting runs"))?;
            }
        }
    }
    if prepared.held_slot != holds_slot {
        let key = tables::queue_active_key(&queue.name, run);
        if holds_slot {
            tables
                .queue_active
                .insert(key.as_slice(), ())
                .map_err(storage("updating a queue's active runs"))?;
        } else {
            tables
                .queue_active
                .remove(key.as_slice())
                .map_err(storage("updating a queue's active runs"))?;
        }
    }
    Ok(())
}

/// Sets `queue`'s limit of active runs, in a write transaction of its own. Lowering it stops
/// no run: fewer are admitted until the queue is below it.
pub(crate) fn set_queue_limit_in(
    txn: &WriteTransaction,
    queue: &str,
    max_active: u64,
) -> Result<(), StorageFailure> {
    let mut queues = txn
        .open_table(QUEUES)
        .map_err(storage("opening the queues"))?;
    queues
        .insert(queue, max_active)
        .map_err(storage("writing a queue's limit"))?;
    Ok(())
}

/// Answers a batch that was already committed, from its records.
fn find_duplicate(tables: &Tables<'_>, batch: &Batch) -> Result<Appended, AppendError> {
    let run = batch.run;
    let low = tables::record_key(run, 0);
    let high = tables::record_key(run, u64::MAX);
    // Newest first: the batch's records, as (seq, event).
    let mut found: Vec<(u64, Event)> = Vec::new();
    let range = tables
        .records
        .range::<&[u8; 24]>(&low..=&high)
        .map_err(storage("scanning the run's records"))?;
    for entry in range.rev() {
        let (key, value) = entry.map_err(storage("scanning the run's records"))?;
        let (_, seq) = tables::split_record_key(key.value());
        let record = Record::decode(value.value()).map_err(|source| CorruptError::Record {
            run,
            seq,
            source,
        })?;
        if record.writer != batch.writer {
            if found.is_empty() {
                continue;
            }
            break;
        }
        if record.writer_seq == batch.writer_seq {
            found.push((seq, record.event));
        } else if record.writer_seq < batch.writer_seq {
            break;
        }
    }
    found.reverse();
    // The same (writer, writer seq) must name the same events, or the seq was reused.
    let is_same_batch = found.len() == batch.events.len()
        && found
            .iter()
            .zip(&batch.events)
            .all(|((_, stored), event)| stored == event);
    let (Some(&(first_seq, _)), Some(&(last_seq, _)), true) =
        (found.first(), found.last(), is_same_batch)
    else {
        return Err(AppendError::WriterSeqReused {
            writer: batch.writer,
            writer_seq: batch.writer_seq,
            run,
        });
    };
    let state = match tables
        .runs
        .get(&run.to_bytes())
        .map_err(storage("reading the run snapshot"))?
    {
        // A duplicate writes nothing, so a snapshot that does not decode is re-derived in
        // memory only.
        Some(bytes) => state_of(run, bytes.value(), &tables.records)?,
        None => return Err(AppendError::UnknownRun { run }),
    };
    Ok(Appended {
        run,
        first_seq,
        last_seq,
        state,
        was_duplicate: true,
    })
}
