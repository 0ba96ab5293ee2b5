//! Appending: validate a batch against the run's snapshot, then write its records, the new
//! snapshot and the indexes in the same write transaction.

use redb::{Database, Key, ReadableTable, Table, TableDefinition, Value, WriteTransaction};

use crate::event::{Event, FORMAT_VERSION, Record, RunId, UnixMs, WriterId};
use crate::journal::format::error::{
    AppendError, CorruptError, Inconsistency, QueueRefusal, ResumeRefusal, StorageFailure, storage,
};
use crate::journal::format::snapshot::encode_snapshot;
use crate::journal::format::tables::{
    self, ACTIVE, ALIASES, DELAYED, DEPENDENTS, GLOBALS, HOOKS_DUE, HOOKS_GIVEN_UP, LOG, META,
    QUEUE_ACTIVE, QUEUE_WAITING, QUEUES, RECORDS, RESUMES, RUN_ENV, RUN_HOOKS, RUNS, TERMINAL,
    WRITERS,
};
use crate::journal::read::view::state_of;
use crate::run_env::{HookCommands, RunPrivate};
use crate::state::{self, RunState, RunStatus, TransitionError};

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
    /// What a new run keeps in the home only (its environment, its own hooks): written to
    /// their tables in this transaction when the batch creates the run, ignored otherwise.
    /// Never part of a record, so never part of what a retry is recognised by.
    pub private: Option<std::sync::Arc<RunPrivate>>,
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

/// The tables of a group's write transaction: those every group writes, open for the whole
/// transaction, and those only some batches touch, opened by the first batch that needs them
/// (opening a table costs a lookup in redb's table tree, and another at the commit).
struct Tables<'txn> {
    txn: &'txn WriteTransaction,
    records: Table<'txn, &'static [u8; 24], &'static [u8]>,
    log: Table<'txn, u64, &'static [u8; 24]>,
    runs: Table<'txn, &'static [u8; 16], &'static [u8]>,
    writers: Table<'txn, u64, u64>,
    meta: Table<'txn, &'static str, &'static [u8]>,
    /// A batch that does not follow its run's previous record in the log.
    globals: Lazy<'txn, &'static [u8; 24], u64>,
    /// A run's creation and its close.
    active: Lazy<'txn, &'static [u8; 16], ()>,
    /// A run's `Terminal`.
    terminal: Lazy<'txn, &'static [u8; 24], ()>,
    /// A run's creation.
    aliases: Lazy<'txn, &'static str, &'static [u8; 16]>,
    /// A batch holding `Resumed`.
    resumes: Lazy<'txn, &'static [u8; 16], &'static [u8; 16]>,
    /// A batch of a run in a queue that joins it, takes a slot or leaves it.
    queues: Lazy<'txn, &'static str, u64>,
    queue_waiting: Lazy<'txn, &'static [u8], &'static [u8; 16]>,
    queue_active: Lazy<'txn, &'static [u8], ()>,
    /// A run's creation with what it keeps in the home only (`Batch::private`).
    run_env: Lazy<'txn, &'static [u8; 16], &'static [u8]>,
    /// A run's creation with hooks, its `Terminal`, a batch holding `HookEnded`.
    run_hooks: Lazy<'txn, &'static [u8; 16], &'static [u8]>,
    hooks_due: Lazy<'txn, &'static [u8; 16], ()>,
    hooks_given_up: Lazy<'txn, &'static [u8; 16], ()>,
    /// A batch that records a run's dependencies, or ends its wait for them.
    dependents: Lazy<'txn, &'static [u8; 32], ()>,
    /// A creation batch holding `UniqueKey`.
    unique: Lazy<'txn, &'static str, &'static [u8; 16]>,
    /// A delayed run's creation, the end of its delay, or its end while it waited.
    delayed: Lazy<'txn, &'static [u8; 24], ()>,
}

/// A table opened the first time it is needed (and created then, in a journal written before
/// it existed).
struct Lazy<'txn, K: Key + 'static, V: Value + 'static> {
    definition: TableDefinition<'static, K, V>,
    table: Option<Table<'txn, K, V>>,
}

impl<'txn, K: Key + 'static, V: Value + 'static> Lazy<'txn, K, V> {
    fn new(definition: TableDefinition<'static, K, V>) -> Lazy<'txn, K, V> {
        Lazy {
            definition,
            table: None,
        }
    }

    fn open(
        &mut self,
        txn: &'txn WriteTransaction,
    ) -> Result<&mut Table<'txn, K, V>, StorageFailure> {
        let table = match self.table.take() {
            Some(table) => table,
            None => txn
                .open_table(self.definition)
                .map_err(storage("opening a table"))?,
        };
        Ok(self.table.insert(table))
    }
}

impl<'txn> Tables<'txn> {
    fn open(txn: &'txn WriteTransaction) -> Result<Tables<'txn>, StorageFailure> {
        let op = "opening tables";
        Ok(Tables {
            txn,
            records: txn.open_table(RECORDS).map_err(storage(op))?,
            log: txn.open_table(LOG).map_err(storage(op))?,
            runs: txn.open_table(RUNS).map_err(storage(op))?,
            writers: txn.open_table(WRITERS).map_err(storage(op))?,
            globals: Lazy::new(GLOBALS),
            meta: txn.open_table(META).map_err(storage(op))?,
            active: Lazy::new(ACTIVE),
            terminal: Lazy::new(TERMINAL),
            aliases: Lazy::new(ALIASES),
            resumes: Lazy::new(RESUMES),
            queues: Lazy::new(QUEUES),
            queue_waiting: Lazy::new(QUEUE_WAITING),
            queue_active: Lazy::new(QUEUE_ACTIVE),
            run_env: Lazy::new(RUN_ENV),
            run_hooks: Lazy::new(RUN_HOOKS),
            hooks_due: Lazy::new(HOOKS_DUE),
            hooks_given_up: Lazy::new(HOOKS_GIVEN_UP),
            dependents: Lazy::new(DEPENDENTS),
            unique: Lazy::new(tables::UNIQUE),
            delayed: Lazy::new(DELAYED),
        })
    }

    fn active(&mut self) -> Result<&mut Table<'txn, &'static [u8; 16], ()>, StorageFailure> {
        self.active.open(self.txn)
    }

    fn terminal(&mut self) -> Result<&mut Table<'txn, &'static [u8; 24], ()>, StorageFailure> {
        self.terminal.open(self.txn)
    }

    fn aliases(
        &mut self,
    ) -> Result<&mut Table<'txn, &'static str, &'static [u8; 16]>, StorageFailure> {
        self.aliases.open(self.txn)
    }

    fn resumes(
        &mut self,
    ) -> Result<&mut Table<'txn, &'static [u8; 16], &'static [u8; 16]>, StorageFailure> {
        self.resumes.open(self.txn)
    }

    fn queues(&mut self) -> Result<&mut Table<'txn, &'static str, u64>, StorageFailure> {
        self.queues.open(self.txn)
    }

    fn queue_waiting(
        &mut self,
    ) -> Result<&mut Table<'txn, &'static [u8], &'static [u8; 16]>, StorageFailure> {
        self.queue_waiting.open(self.txn)
    }

    fn queue_active(&mut self) -> Result<&mut Table<'txn, &'static [u8], ()>, StorageFailure> {
        self.queue_active.open(self.txn)
    }

    fn run_env(
        &mut self,
    ) -> Result<&mut Table<'txn, &'static [u8; 16], &'static [u8]>, StorageFailure> {
        self.run_env.open(self.txn)
    }

    fn run_hooks(
        &mut self,
    ) -> Result<&mut Table<'txn, &'static [u8; 16], &'static [u8]>, StorageFailure> {
        self.run_hooks.open(self.txn)
    }

    fn hooks_due(&mut self) -> Result<&mut Table<'txn, &'static [u8; 16], ()>, StorageFailure> {
        self.hooks_due.open(self.txn)
    }

    fn hooks_given_up(
        &mut self,
    ) -> Result<&mut Table<'txn, &'static [u8; 16], ()>, StorageFailure> {
        self.hooks_given_up.open(self.txn)
    }

    fn dependents(&mut self) -> Result<&mut Table<'txn, &'static [u8; 32], ()>, StorageFailure> {
        self.dependents.open(self.txn)
    }

    fn unique(
        &mut self,
    ) -> Result<&mut Table<'txn, &'static str, &'static [u8; 16]>, StorageFailure> {
        self.unique.open(self.txn)
    }

    fn delayed(&mut self) -> Result<&mut Table<'txn, &'static [u8; 24], ()>, StorageFailure> {
        self.delayed.open(self.txn)
    }
}

/// The states a journal handle last stored, each with the snapshot bytes it stored it as. A batch
/// whose run's stored snapshot is, byte for byte, the one kept here starts from the state kept
/// with it rather than decode the bytes and check their shape again: a snapshot decodes to the
/// state it was encoded from, so the two are the same state, whoever wrote the bytes. Bytes that
/// differ (another process's write, a commit that failed) are decoded as ever. Bounded: a state
/// whose snapshot is larger than [`StoredStates::MAX_SNAPSHOT_BYTES`] is not kept, and past
/// [`StoredStates::MAX_RUNS`] runs the oldest half of what is kept is forgotten.
#[derive(Default)]
pub(crate) struct StoredStates {
    states: std::collections::HashMap<RunId, (u64, Vec<u8>, RunState)>,
    /// Stamps each state kept, so that the oldest go first.
    kept: u64,
}

impl StoredStates {
    const MAX_RUNS: usize = 4096;
    const MAX_SNAPSHOT_BYTES: usize = 64 * 1024;

    /// The state kept for `run`, taken out, if `snapshot` is the bytes it was stored as.
    fn take(&mut self, run: RunId, snapshot: &[u8]) -> Option<RunState> {
        match self.states.remove(&run) {
            Some((_, bytes, state)) if bytes == snapshot => Some(state),
            _ => None,
        }
    }

    /// Keeps `state`, just stored as `snapshot`, for the run's next batch.
    fn keep(&mut self, run: RunId, snapshot: Vec<u8>, state: &RunState) {
        if snapshot.len() > StoredStates::MAX_SNAPSHOT_BYTES {
            self.states.remove(&run);
            return;
        }
        if self.states.len() >= StoredStates::MAX_RUNS && !self.states.contains_key(&run) {
            let mut stamps: Vec<u64> = self.states.values().map(|(kept, ..)| *kept).collect();
            let (_, median, _) = stamps.select_nth_unstable(StoredStates::MAX_RUNS / 2);
            let median = *median;
            self.states.retain(|_, (kept, ..)| *kept > median);
        }
        self.kept += 1;
        self.states
            .insert(run, (self.kept, snapshot, state.clone()));
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

/// `commit_batches`, with the writer marks judged as `marks` says.
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
    let mut stored = StoredStates::default();
    commit_batches_judged_in(txn, batches, marks, keeps_refusal, &mut stored)
}

/// [`commit_batches_judged`] in a write transaction the caller began, starting each batch from
/// the state `stored` holds for its run where the stored snapshot is the one it holds, and
/// leaving there the states this transaction stores.
pub(crate) fn commit_batches_judged_in(
    mut txn: WriteTransaction,
    batches: &[Batch],
    marks: Marks,
    keeps_refusal: impl Fn(&Batch) -> bool,
    stored: &mut StoredStates,
) -> Result<Vec<Judged>, StorageFailure> {
    txn.set_durability(redb::Durability::Immediate)
        .map_err(|e| StorageFailure::new("setting durability", redb::Error::from(e)))?;
    let mut results = Vec::with_capacity(batches.len());
    {
        let mut tables = Tables::open(&txn)?;
        let mut group = Group::start(&tables, stored)?;
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
/// written yet. Everything that can refuse a batch happens before `write` starts, so a refused
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
    /// The run waited for its dependencies before the batch
    /// ([`RunState::is_waiting_for_dependencies`]).
    was_waiting_for_dependencies: bool,
    /// The run waited for its due time before the batch ([`RunState::is_waiting_for_due`]).
    was_waiting_for_due: bool,
    after: RunState,
    snapshot: Vec<u8>,
    /// The batch records that the run resumes a paused run: link them in the resume index.
    resumes: bool,
}

/// What every batch of a group reads and moves on: the global log head and the writers' marks.
/// They are read once per group and the marks written once at its end, rather than read and
/// written by each batch; what the batches see is the same.
struct Group<'a> {
    global_seq: u64,
    stored: &'a mut StoredStates,
    /// The record at `global_seq` in the log, when it is there (not pruned): a batch of the same
    /// run that follows it needs no entry of its own in `globals`.
    last_key: Option<[u8; 24]>,
    /// Per writer: its mark as the group now stands, and whether the group moved it.
    marks: Vec<(WriterId, Option<u64>, bool)>,
}

impl<'a> Group<'a> {
    fn start(
        tables: &Tables<'_>,
        stored: &'a mut StoredStates,
    ) -> Result<Group<'a>, StorageFailure> {
        let (last, last_key) = tables
            .log
            .last()
            .map_err(storage("reading the log head"))?
            .map_or((0, None), |(global, key)| {
                (global.value(), Some(*key.value()))
            });
        // Pruning may have removed the newest entries: their seqs are not issued again.
        let floor = tables
            .meta
            .get(tables::META_LOG_FLOOR)
            .map_err(storage("reading the log floor"))?;
        let floor = tables::meta_u64(floor.as_ref().map(|value| value.value())).unwrap_or(0);
        let global_seq = last.max(floor);
        Ok(Group {
            global_seq,
            stored,
            last_key: last_key.filter(|_| last == global_seq),
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
    group: &mut Group<'_>,
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
    let prepared = match prepare(tables, group, batch, marks).and_then(|prepared| {
        // A rebuild writes what happened: the slots were judged when the records were made.
        if marks == Marks::Idempotent {
            check_start(tables, batch, &prepared)?;
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
                    AppendError::Resume { .. }
                        | AppendError::Queue { .. }
                        | AppendError::Inconsistent { .. }
                );
            if marks == Marks::Idempotent && is_judged {
                group.advance_mark(batch.writer, batch.writer_seq);
            }
            return Err(refusal);
        }
    };
    write(tables, group, batch, prepared)
}

/// The one judge of whether a waiting run may go on towards its start, across runs, after the
/// reducer accepted its batch, inside the write transaction that commits it: its dependencies
/// ([`check_dependencies`]), then its queue ([`check_queue`]). A refused batch writes nothing.
fn check_start(
    tables: &mut Tables<'_>,
    batch: &Batch,
    prepared: &Prepared,
) -> Result<(), AppendError> {
    check_unique(tables, batch, prepared)?;
    check_dependencies(tables, batch, prepared)?;
    check_queue(tables, batch.run, prepared)
}

/// The key's half of judging a creation batch (docs/design.md, "Launched once"): a run that
/// takes a key takes it only while no other run holds it — the run the `unique` index lists
/// for it has ended (or left the journal), and its hold, if it has one, has passed at this
/// batch's time. Read inside the transaction that commits the batch, so two launchers racing
/// with one key get one run. One index read and one snapshot read.
fn check_unique(
    tables: &mut Tables<'_>,
    batch: &Batch,
    prepared: &Prepared,
) -> Result<(), AppendError> {
    let (Some(unique), false) = (&prepared.after.unique, prepared.existed) else {
        return Ok(());
    };
    let holder = tables
        .unique()?
        .get(unique.key.as_str())
        .map_err(storage("reading the unique index"))?
        .map(|holder| RunId::from_bytes(*holder.value()));
    let Some(holder) = holder.filter(|holder| *holder != batch.run) else {
        return Ok(());
    };
    let Some(state) = state_before(tables, holder)? else {
        return Ok(());
    };
    if holds_key(&state, batch.time_ms) {
        return Err(AppendError::Queue {
            run: batch.run,
            refusal: QueueRefusal::UniqueHeld {
                key: unique.key.clone(),
                holder,
            },
        });
    }
    Ok(())
}

/// Whether `state`'s run still holds its key at `at_ms`: it has not ended, or its hold has not
/// passed.
pub(crate) fn holds_key(state: &RunState, at_ms: crate::event::UnixMs) -> bool {
    let Some(unique) = &state.unique else {
        return false;
    };
    !state.is_terminal()
        || unique
            .held_until_ms(state.created_at_ms)
            .is_some_and(|until| at_ms < until)
}

/// The dependencies' half of judging a batch: a run that records its dependencies names runs
/// the journal holds; a run whose dependencies are found met (`DependenciesMet`) has every
/// one of them ended, and every one it needs `complete` ended so, as this transaction reads
/// their states. A dependency ends only once and never changes its end, so a run found met
/// stays met. Its cost follows the run's own dependencies, never the journal's runs.
fn check_dependencies(
    tables: &mut Tables<'_>,
    batch: &Batch,
    prepared: &Prepared,
) -> Result<(), AppendError> {
    let run = batch.run;
    let Some(dependencies) = &prepared.after.dependencies else {
        return Ok(());
    };
    let refuse = |refusal| AppendError::Queue { run, refusal };
    let records_them = batch
        .events
        .iter()
        .any(|event| matches!(event, Event::DependsOn { .. }));
    let meets_them = batch
        .events
        .iter()
        .any(|event| matches!(event, Event::DependenciesMet { .. }));
    if !records_them && !meets_them {
        return Ok(());
    }
    for dependency in dependencies.runs() {
        let needs_complete = dependencies.after.contains(&dependency);
        let Some(state) = state_before(tables, dependency)? else {
            // Only ended runs leave the journal: one that any end satisfies is met.
            if records_them || needs_complete {
                return Err(refuse(QueueRefusal::UnknownDependency { dependency }));
            }
            continue;
        };
        if !meets_them {
            continue;
        }
        if !state.is_terminal() {
            return Err(refuse(QueueRefusal::DependencyNotEnded { dependency }));
        }
        if needs_complete && state.status != RunStatus::Complete {
            return Err(refuse(QueueRefusal::DependencyFailed {
                dependency,
                state: state.status.to_string(),
            }));
        }
    }
    Ok(())
}

/// The queue's half of judging a batch, after the reducer accepted it: a run that joins a
/// queue joins one with a limit; a run that takes a slot takes it only while its queue has
/// fewer active runs than its limit, and only as the first run waiting. Read from the queue
/// indexes of this transaction, which the batches before it in the group already moved, so
/// two batches racing for the last slot cannot both take it, whichever process judges them.
/// Its cost follows the queue's active runs (at most its limit, unless the limit was
/// lowered), never its waiting ones.
fn check_queue(
    tables: &mut Tables<'_>,
    run: RunId,
    prepared: &Prepared,
) -> Result<(), AppendError> {
    let Some(queue) = &prepared.after.queue else {
        return Ok(());
    };
    let is_joining = !prepared.was_in_queue;
    let is_admitted_now = !prepared.was_admitted && queue.admitted.is_some();
    check_slot_taken_by_admission(
        run,
        prepared.held_slot,
        prepared.was_admitted,
        &prepared.after,
    )?;
    if !is_joining && !is_admitted_now {
        return Ok(());
    }
    let refuse = |refusal| AppendError::Queue { run, refusal };
    let name = queue.name.as_str();
    let Some(max_active) = tables
        .queues()?
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
        .queue_active()?
        .range(low.as_slice()..high.as_slice())
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
        .queue_waiting()?
        .range(low.as_slice()..high.as_slice())
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

/// A run takes a slot of its queue (it did not hold one before the batch, `held_slot`, and
/// holds one after it, `after`) only through the admission that [`check_queue`] judges against
/// the queue's limit, recorded in this batch (it was not admitted before, `was_admitted`), so
/// that no queue holds more active runs than its limit allows. Pure and cheap: kept on in every
/// build, as a refusal.
pub(crate) fn check_slot_taken_by_admission(
    run: RunId,
    held_slot: bool,
    was_admitted: bool,
    after: &RunState,
) -> Result<(), AppendError> {
    let takes_slot = !held_slot && after.holds_slot();
    match &after.queue {
        Some(queue) if takes_slot && was_admitted => Err(AppendError::Inconsistent {
            run,
            broken: Inconsistency::SlotWithoutAdmission {
                queue: queue.name.clone(),
            },
        }),
        _ => Ok(()),
    }
}

/// Validates the batch and encodes its records without writing anything.
fn prepare(
    tables: &mut Tables<'_>,
    group: &mut Group<'_>,
    batch: &Batch,
    marks: Marks,
) -> Result<Prepared, AppendError> {
    let before = stored_state_before(tables, group.stored, batch.run)?;
    let mut prepared = judge(before, batch)?;
    check_seqs_free(tables, batch.run, &prepared)?;
    if let Some(from) = resumed_from(batch) {
        prepared.resumes = resumable(tables, batch.run, from, marks)?;
    }
    Ok(prepared)
}

/// The seq a batch takes first is free in `records`: the head its run's snapshot gave is the
/// head its records have, so the batch's records follow them rather than replace one. A
/// snapshot is checked for its shape when it is read, but one left behind its records (a copy
/// of an older state written back) has a shape; only the records can tell. One lookup.
fn check_seqs_free(
    tables: &Tables<'_>,
    run: RunId,
    prepared: &Prepared,
) -> Result<(), AppendError> {
    let Some(&(first_seq, _)) = prepared.records.first() else {
        return Ok(());
    };
    let is_taken = tables
        .records
        .get(&tables::record_key(run, first_seq))
        .map_err(storage("reading the run's records"))?
        .is_some();
    if is_taken {
        return Err(AppendError::Inconsistent {
            run,
            broken: Inconsistency::SeqTaken {
                head: first_seq - 1,
                seq: first_seq,
            },
        });
    }
    Ok(())
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
    tables: &mut Tables<'_>,
    run: RunId,
    from: RunId,
    marks: Marks,
) -> Result<bool, AppendError> {
    let old = state_before(tables, from)?;
    let by = tables
        .resumes()?
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

/// [`state_before`], taken from `stored` when the run's stored snapshot is the one it holds.
fn stored_state_before(
    tables: &Tables<'_>,
    stored: &mut StoredStates,
    run: RunId,
) -> Result<Option<RunState>, AppendError> {
    match tables
        .runs
        .get(&run.to_bytes())
        .map_err(storage("reading the run snapshot"))?
    {
        Some(bytes) => match stored.take(run, bytes.value()) {
            Some(state) => Ok(Some(state)),
            None => Ok(Some(state_of(run, bytes.value(), &tables.records)?)),
        },
        None => Ok(None),
    }
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
    let was_waiting_for_dependencies = before
        .as_ref()
        .is_some_and(RunState::is_waiting_for_dependencies);
    let was_waiting_for_due = before.as_ref().is_some_and(RunState::is_waiting_for_due);
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
        let found = state.as_ref().map_or(0, |state| state.head_seq);
        if found != seq {
            return Err(AppendError::Inconsistent {
                run,
                broken: Inconsistency::HeadNotAdvanced { seq, found },
            });
        }
        records.push((seq, record.encode()?));
    }
    refuse_late_creation_events(batch, existed, head)?;
    let after = state.expect("a non-empty batch leaves a state");
    after
        .check_folded_shape()
        .map_err(|shape| AppendError::Inconsistent {
            run,
            broken: Inconsistency::Shape(shape),
        })?;
    let snapshot = encode_snapshot(&after)?;
    Ok(Prepared {
        records,
        existed,
        was_terminal,
        was_in_queue,
        was_admitted,
        was_waiting,
        held_slot,
        was_waiting_for_dependencies,
        was_waiting_for_due,
        after,
        snapshot,
        resumes: false,
    })
}

/// Only a creation batch takes a key (docs/design.md, "Launched once"): the `unique` index is
/// judged and written with the run's creation, so a key taken later would hold nothing. A
/// retry policy too, so a run's attempts are counted by what it was created with.
fn refuse_late_creation_events(batch: &Batch, existed: bool, head: u64) -> Result<(), AppendError> {
    if !existed {
        return Ok(());
    }
    let late = batch.events.iter().enumerate().find_map(|(index, event)| {
        let found = head + 1 + index as u64;
        let run = batch.run;
        match event {
            Event::UniqueKey { .. } => Some((index, TransitionError::UniqueKeyLate { run, found })),
            Event::RetryPolicy { .. } => {
                Some((index, TransitionError::RetryPolicyLate { run, found }))
            }
            _ => None,
        }
    });
    match late {
        Some((index, source)) => Err(AppendError::Transition { index, source }),
        None => Ok(()),
    }
}

/// Writes a prepared batch. Only a storage failure can stop it part-way, and that fails the
/// whole transaction.
fn write(
    tables: &mut Tables<'_>,
    group: &mut Group<'_>,
    batch: &Batch,
    prepared: Prepared,
) -> Result<Appended, AppendError> {
    let run = batch.run;
    let run_key = run.to_bytes();
    // `judge` made one record per event, at the seqs after the stored head.
    let first_seq = prepared.records[0].0;
    let last_seq = prepared.after.head_seq;
    // A batch's records take consecutive global seqs: one index entry, at its first record,
    // says where each of them is. A batch that follows its run's previous record in the log is
    // found through that record's entry, and needs none (`tables::global_of`).
    let first_key = tables::record_key(run, first_seq);
    let is_continued =
        first_seq > 1 && group.last_key == Some(tables::record_key(run, first_seq - 1));
    if !is_continued {
        let txn = tables.txn;
        tables
            .globals
            .open(txn)?
            .insert(&first_key, group.global_seq + 1)
            .map_err(storage("writing the log index"))?;
    }
    for (seq, bytes) in &prepared.records {
        let key = tables::record_key(run, *seq);
        tables
            .records
            .insert(&key, bytes.as_slice())
            .map_err(storage("writing a record"))?;
        group.global_seq += 1;
        tables
            .log
            .insert(group.global_seq, &key)
            .map_err(storage("writing the log"))?;
        group.last_key = Some(key);
    }
    tables
        .runs
        .insert(&run_key, prepared.snapshot.as_slice())
        .map_err(storage("writing the snapshot"))?;

    let after = &prepared.after;
    if after.is_closed() {
        tables
            .active()?
            .remove(&run_key)
            .map_err(storage("updating the active index"))?;
    } else if !prepared.existed {
        tables
            .active()?
            .insert(&run_key, ())
            .map_err(storage("updating the active index"))?;
    }
    if let (false, Some(ended_at)) = (prepared.was_terminal, after.ended_at_ms()) {
        tables
            .terminal()?
            .insert(&tables::terminal_key(ended_at, run), ())
            .map_err(storage("updating the terminal index"))?;
    }
    if !prepared.existed {
        if let Some(unique) = &after.unique {
            tables
                .unique()?
                .insert(unique.key.as_str(), &run_key)
                .map_err(storage("writing the unique index"))?;
        }
        if let Some(tool_call_id) = &after.tool_call_id {
            tables
                .aliases()?
                .insert(tables::tool_call_alias(tool_call_id).as_str(), &run_key)
                .map_err(storage("writing an alias"))?;
        }
        if let Some(name) = &after.spec.name {
            tables
                .aliases()?
                .insert(tables::name_alias(name).as_str(), &run_key)
                .map_err(storage("writing an alias"))?;
        }
    }
    if let (true, Some(from)) = (prepared.resumes, resumed_from(batch)) {
        tables
            .resumes()?
            .insert(&from.to_bytes(), &run_key)
            .map_err(storage("writing the resume index"))?;
    }
    write_queue_indexes(tables, run, &prepared)?;
    write_dependents(tables, run, &prepared)?;
    write_delay_index(tables, run, &prepared)?;
    write_private(tables, batch, &prepared)?;
    write_hook_indexes(tables, batch, &prepared)?;
    group.advance_mark(batch.writer, batch.writer_seq);
    group.stored.keep(run, prepared.snapshot, &prepared.after);
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
    // A run waits exactly while it is in a queue, not admitted and not terminal, and holds a
    // slot exactly while admitted and not terminal: never both. That a slot is taken only by an
    // admission was checked before anything was written (`check_slot_taken_by_admission`).
    let is_waiting = after.is_waiting_for_slot();
    let holds_slot = after.holds_slot();
    if prepared.was_waiting != is_waiting {
        // Written with the run's records in its creation batch; never pruned while the run
        // is open.
        let txn = tables.txn;
        let joined = tables::global_of(
            tables.globals.open(txn)?,
            &tables.log,
            run,
            tables::QUEUE_JOINED_SEQ,
        )?;
        if let Some(joined) = joined {
            let key = tables::queue_waiting_key(&queue.name, joined);
            if is_waiting {
                tables
                    .queue_waiting()?
                    .insert(key.as_slice(), &run.to_bytes())
                    .map_err(storage("updating a queue's waiting runs"))?;
            } else {
                tables
                    .queue_waiting()?
                    .remove(key.as_slice())
                    .map_err(storage("updating a queue's waiting runs"))?;
            }
        }
    }
    if prepared.held_slot != holds_slot {
        let key = tables::queue_active_key(&queue.name, run);
        if holds_slot {
            tables
                .queue_active()?
                .insert(key.as_slice(), ())
                .map_err(storage("updating a queue's active runs"))?;
        } else {
            tables
                .queue_active()?
                .remove(key.as_slice())
                .map_err(storage("updating a queue's active runs"))?;
        }
    }
    Ok(())
}

/// Keeps the run's entries in [`DEPENDENTS`] as the batch moved it: one per dependency while
/// it waits for them, none once it waits no more (they were met, or it ended).
fn write_dependents(
    tables: &mut Tables<'_>,
    run: RunId,
    prepared: &Prepared,
) -> Result<(), AppendError> {
    let after = &prepared.after;
    let Some(dependencies) = &after.dependencies else {
        return Ok(());
    };
    let is_waiting = after.is_waiting_for_dependencies();
    if prepared.was_waiting_for_dependencies == is_waiting {
        return Ok(());
    }
    let table = tables.dependents()?;
    for dependency in dependencies.runs() {
        let key = tables::dependents_key(dependency, run);
        if is_waiting {
            table
                .insert(&key, ())
                .map_err(storage("updating the dependents index"))?;
        } else {
            table
                .remove(&key)
                .map_err(storage("updating the dependents index"))?;
        }
    }
    Ok(())
}

/// Moves the run in the `delayed` index as the batch moved it: in while it waits for its due
/// time (from its creation batch), out once its delay ended or it ended first.
fn write_delay_index(
    tables: &mut Tables<'_>,
    run: RunId,
    prepared: &Prepared,
) -> Result<(), AppendError> {
    let Some(delay) = &prepared.after.delay else {
        return Ok(());
    };
    let is_waiting = prepared.after.is_waiting_for_due();
    if prepared.was_waiting_for_due == is_waiting {
        return Ok(());
    }
    let key = tables::terminal_key(delay.due_at_ms, run);
    let table = tables.delayed()?;
    if is_waiting {
        table
            .insert(&key, ())
            .map_err(storage("updating the delayed runs"))?;
    } else {
        table
            .remove(&key)
            .map_err(storage("updating the delayed runs"))?;
    }
    Ok(())
}

/// Writes what a new run keeps in the home only — its environment, its own hooks — in the
/// transaction of its creation batch, so the run never exists without them.
fn write_private(
    tables: &mut Tables<'_>,
    batch: &Batch,
    prepared: &Prepared,
) -> Result<(), AppendError> {
    let (false, Some(private)) = (prepared.existed, &batch.private) else {
        return Ok(());
    };
    let run_key = batch.run.to_bytes();
    if let Some(env) = &private.env {
        tables
            .run_env()?
            .insert(&run_key, env.encode().as_slice())
            .map_err(storage("writing the run's environment"))?;
    }
    if !private.on_exit.is_empty() {
        let hooks = HookCommands {
            own: private.on_exit.clone(),
            home: None,
        };
        tables
            .run_hooks()?
            .insert(&run_key, hooks.encode().as_slice())
            .map_err(storage("writing the run's hooks"))?;
    }
    Ok(())
}

/// The run's hook list as this transaction sees it; a list that does not read counts as none
/// (`verify` reports it), so a run's end is never refused for it.
fn hook_list(tables: &mut Tables<'_>, run: RunId) -> Result<HookCommands, AppendError> {
    Ok(tables
        .run_hooks()?
        .get(&run.to_bytes())
        .map_err(storage("reading the run's hooks"))?
        .and_then(|bytes| HookCommands::decode(bytes.value()).ok())
        .unwrap_or_default())
}

/// Keeps the hook indexes as the batch moved the run: at its `Terminal`, the home's hook in
/// force joins its list and a run with hooks becomes due; once every hook of its list is
/// delivered or given up, it is due no more, and listed as having lost one if any was given
/// up.
fn write_hook_indexes(
    tables: &mut Tables<'_>,
    batch: &Batch,
    prepared: &Prepared,
) -> Result<(), AppendError> {
    let run = batch.run;
    let run_key = run.to_bytes();
    let after = &prepared.after;
    if !prepared.was_terminal && after.is_terminal() {
        let mut list = hook_list(tables, run)?;
        let home = tables
            .meta
            .get(tables::META_HOME_HOOK)
            .map_err(storage("reading the home's hook"))?
            .and_then(|bytes| HookCommands::decode(bytes.value()).ok())
            .and_then(|home| home.home);
        if let Some(home) = home {
            list.home = Some(home);
            tables
                .run_hooks()?
                .insert(&run_key, list.encode().as_slice())
                .map_err(storage("writing the run's hooks"))?;
        }
        if !list.is_empty() {
            tables
                .hooks_due()?
                .insert(&run_key, ())
                .map_err(storage("writing the due hooks"))?;
        }
    }
    let settles = batch
        .events
        .iter()
        .any(|event| matches!(event, Event::HookEnded { .. }));
    if settles {
        let list = hook_list(tables, run)?;
        let count = u32::try_from(list.len()).unwrap_or(u32::MAX);
        let is_settled =
            (0..count).all(|hook| after.hook(hook).is_some_and(|state| state.is_settled()));
        if is_settled {
            tables
                .hooks_due()?
                .remove(&run_key)
                .map_err(storage("writing the due hooks"))?;
        }
        if after.hooks.iter().any(|state| state.is_given_up()) {
            tables
                .hooks_given_up()?
                .insert(&run_key, ())
                .map_err(storage("writing the given-up hooks"))?;
        }
    }
    Ok(())
}

/// Sets the home's completion hook (`None`: none), in a write transaction of its own. Runs
/// that end from then on get it; runs that ended before keep the list they ended with.
pub(crate) fn set_home_hook_in(
    txn: &WriteTransaction,
    command: Option<&str>,
) -> Result<(), StorageFailure> {
    let mut meta = txn.open_table(META).map_err(storage("opening meta"))?;
    match command {
        Some(command) => {
            let hooks = HookCommands {
                own: Vec::new(),
                home: Some(command.to_string()),
            };
            meta.insert(tables::META_HOME_HOOK, hooks.encode().as_slice())
                .map_err(storage("writing the home's hook"))?;
        }
        None => {
            meta.remove(tables::META_HOME_HOOK)
                .map_err(storage("removing the home's hook"))?;
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
        .range(&low..=&high)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit;

    /// What a handle keeps of the states it stored stays bounded, the newest kept.
    #[test]
    fn the_states_a_handle_keeps_stay_bounded_and_the_newest_stay() {
        let mut stored = StoredStates::default();
        let spec = testkit::spec(
            crate::event::Mode::Single,
            vec![testkit::step("build", testkit::argv(&["true"]))],
        );
        let created = testkit::created(spec, 1, crate::event::HostIds::default());
        let runs: Vec<RunId> = (0..StoredStates::MAX_RUNS + 10)
            .map(|_| RunId::generate())
            .collect();
        for &run in &runs {
            let record = Record {
                format_version: FORMAT_VERSION,
                run_id: run,
                seq: 1,
                time_ms: 1,
                writer: WriterId(1),
                writer_seq: 1,
                event: created.clone(),
            };
            let state = state::apply(None, &record).expect("created");
            let bytes = encode_snapshot(&state).expect("encodes");
            stored.keep(run, bytes, &state);
        }
        assert!(stored.states.len() <= StoredStates::MAX_RUNS);
        let newest = runs[runs.len() - 1];
        let (_, bytes, _) = stored
            .states
            .get(&newest)
            .expect("the newest is kept")
            .clone();
        assert!(stored.take(newest, &bytes).is_some());
        assert!(stored.take(newest, &bytes).is_none(), "taken out");
        let oldest = runs[0];
        assert!(
            !stored.states.contains_key(&oldest),
            "the oldest went first"
        );
    }
}
