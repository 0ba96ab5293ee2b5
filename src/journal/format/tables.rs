//! The redb tables of the journal and the encoding of their keys.
//!
//! Keys made of several parts are fixed-width big-endian byte arrays, so byte order is the
//! order we want (run, then seq; time, then run). Values are postcard with a CRC-32C, except
//! where noted. docs/journal-format.md describes the same layout for readers of the file.

use redb::{Key, ReadableTable, TableDefinition, Value, WriteTransaction};

use crate::event::{RunId, UnixMs};
use crate::journal::format::error::{StorageFailure, storage};

/// (run id, seq) → record ([`crate::event::RecordEnvelope::encode`]).
pub(crate) const RECORDS: TableDefinition<&[u8; 24], &[u8]> = TableDefinition::new("records");
/// global seq → (run id, seq): commit order across runs.
pub(crate) const LOG: TableDefinition<u64, &[u8; 24]> = TableDefinition::new("log");
/// run id → snapshot ([`super::snapshot::SnapshotV1`]): the folded state, a cache of the
/// records.
pub(crate) const RUNS: TableDefinition<&[u8; 16], &[u8]> = TableDefinition::new("runs");
/// run id → (): runs not yet closed.
pub(crate) const ACTIVE: TableDefinition<&[u8; 16], ()> = TableDefinition::new("active");
/// (ended at ms, run id) → (): terminal runs, oldest first.
pub(crate) const TERMINAL: TableDefinition<&[u8; 24], ()> = TableDefinition::new("terminal");
/// alias → run id; aliases are `tool-call:<id>` and `name:<name>`, the latest run wins.
pub(crate) const ALIASES: TableDefinition<&str, &[u8; 16]> = TableDefinition::new("aliases");
/// writer id → the last writer seq committed by that writer.
pub(crate) const WRITERS: TableDefinition<u64, u64> = TableDefinition::new("writers");
/// key → value: `format_version` (u16 BE), `journal_id` (16 bytes), `created_at_ms` (u64 BE).
pub(crate) const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");

/// (run id, seq) → global seq: where record `seq` of the run sits in `log`, and with it the
/// records of the run that follow it at the next global seqs (a batch's records take
/// consecutive global seqs): an entry at the first record of each batch that does not follow
/// its run's previous record in the log, so a pruned run's log entries are found without a scan
/// ([`global_of`]). Journals written before this was so hold one entry per record, which reads
/// the same way. Records committed before the table existed are indexed once, by the first
/// prune ([`crate::journal::write::prune`]).
pub(crate) const GLOBALS: TableDefinition<&[u8; 24], u64> = TableDefinition::new("globals");
/// run id → tombstone (`Tombstone`): what stays of a pruned run.
pub(crate) const PRUNED: TableDefinition<&[u8; 16], &[u8]> = TableDefinition::new("pruned");
/// (pruned at ms, run id) → (): tombstones, oldest first, so that they stay bounded.
pub(crate) const PRUNED_AT: TableDefinition<&[u8; 24], ()> = TableDefinition::new("pruned_at");
/// run id → tombstone: pruned runs whose files may still be on disk; a later pass removes
/// them and then the entry.
pub(crate) const PRUNING: TableDefinition<&[u8; 16], &[u8]> = TableDefinition::new("pruning");
/// run id of a paused run → run id of the run that resumed it, written in the transaction of
/// the new run's creation batch (its `Resumed` record). The old run's records never change:
/// this is where its `resumedBy` comes from. At most one entry per paused run.
pub(crate) const RESUMES: TableDefinition<&[u8; 16], &[u8; 16]> = TableDefinition::new("resumes");

/// queue name → its limit of active runs (u64).
pub(crate) const QUEUES: TableDefinition<&str, u64> = TableDefinition::new("queues");
/// (queue name, NUL, global seq of the run's `QueueJoined` BE) → run id: the runs waiting in
/// each queue, first in first ([`queue_waiting_key`]).
pub(crate) const QUEUE_WAITING: TableDefinition<&[u8], &[u8; 16]> =
    TableDefinition::new("queue_waiting");
/// (queue name, NUL, run id) → (): the runs holding a slot of each queue: admitted, not yet
/// terminal ([`queue_active_key`]).
pub(crate) const QUEUE_ACTIVE: TableDefinition<&[u8], ()> = TableDefinition::new("queue_active");

/// run id → the environment its launcher gave it ([`crate::run_env::RunEnvironment::encode`]),
/// written in the transaction of its creation batch. Secret: never in a record, never shipped.
pub(crate) const RUN_ENV: TableDefinition<&[u8; 16], &[u8]> = TableDefinition::new("run_env");
/// run id → its completion hooks ([`crate::run_env::HookCommands::encode`]): its own from its
/// creation batch, then the home's hook in force added in the transaction of its `Terminal`.
pub(crate) const RUN_HOOKS: TableDefinition<&[u8; 16], &[u8]> = TableDefinition::new("run_hooks");
/// run id → (): runs that have ended with a hook neither delivered nor given up — the work
/// list of whoever delivers hooks, written with the `Terminal` and removed with the record
/// that settles the last hook.
pub(crate) const HOOKS_DUE: TableDefinition<&[u8; 16], ()> = TableDefinition::new("hooks_due");
/// run id → (): runs with a hook given up, until they are pruned: what `hooks` lists as lost.
pub(crate) const HOOKS_GIVEN_UP: TableDefinition<&[u8; 16], ()> =
    TableDefinition::new("hooks_given_up");
/// (dependency's run id, dependent's run id) → (): the runs that wait for each run
/// ([`dependents_key`]), written with the dependent's `DependsOn` and removed, all its entries,
/// once it waits no more (its dependencies met, or it ended). Whoever records a run's end finds
/// its dependents here, and retention keeps a run listed as a dependency.
pub(crate) const DEPENDENTS: TableDefinition<&[u8; 32], ()> = TableDefinition::new("dependents");
/// a run's unique key → the run that last took it ([`crate::event::Event::UniqueKey`]),
/// written with its creation batch. A creation batch with a key listed here is refused while
/// that run holds it (it has not ended, or its hold has not passed); the entry is overwritten
/// by the next run that takes the key, and removed with its run when the run is pruned.
pub(crate) const UNIQUE: TableDefinition<&str, &[u8; 16]> = TableDefinition::new("unique");
/// due time (8 bytes, big-endian ms) + run id → (): delayed runs waiting for their due time,
/// soonest first — what the timer and every reconcile pass read to start what is due, so their
/// cost follows the runs due, never the runs waiting. Written with the run's creation batch,
/// removed with the record that ends its delay or the run.
pub(crate) const DELAYED: TableDefinition<&[u8; 24], ()> = TableDefinition::new("delayed");

pub(crate) const META_FORMAT_VERSION: &str = "format_version";
/// The home's completion hook ([`crate::run_env::HookCommands`] of one command); absent: none.
pub(crate) const META_HOME_HOOK: &str = "home_hook";
/// The retention policy (`Retention`); absent: the defaults.
pub(crate) const META_RETENTION: &str = "retention";
/// The highest global seq a prune removed from `log` (u64 BE): global seqs are never issued
/// again, even when the newest log entries were pruned.
pub(crate) const META_LOG_FLOOR: &str = "log_floor";
/// How many log entries prunes removed in all (u64 BE): with the entries left, the head.
pub(crate) const META_PRUNED_RECORDS: &str = "pruned_records";
/// Present once every record written before `globals` existed is indexed there.
pub(crate) const META_GLOBALS_INDEXED: &str = "globals_indexed";
/// Present once the home ships (`runjournal ship`): the highest global seq proven shipped
/// (u64 BE), that is, at or below the server's cursor when the shipper checked the server's
/// record at that cursor against this journal's. It only ever rises; retention keeps every
/// record above it ([`crate::journal::write::ship_mark`]).
pub(crate) const META_SHIPPED_THROUGH: &str = "shipped_through";
pub(crate) const META_JOURNAL_ID: &str = "journal_id";
/// The home's size as the journal keeps it (42 bytes, `home_size::KeptSize`): the
/// bytes of `runs/` and `results/` found by the last walk and counted since, through which
/// ended run they are counted, and when the home was last walked. Absent: never walked.
pub(crate) const META_HOME_SIZE: &str = "home_size";
/// What a rebuild from projections chose and could not recover (JSON,
/// [`crate::journal::RecoveryNote`]); present only in a rebuilt journal.
pub(crate) const META_RECOVERY: &str = "recovered_from_projections";
pub(crate) const META_CREATED_AT: &str = "created_at_ms";
/// What the home's last scrub found (JSON, [`crate::scrub::ScrubRecord`]); absent: never
/// scrubbed.
pub(crate) const META_SCRUB: &str = "scrub";
/// The home's scrub interval in ms (u64 BE); absent: [`crate::scrub::DEFAULT_EVERY`].
pub(crate) const META_SCRUB_EVERY: &str = "scrub_every_ms";
/// The timeout a run gets when its launch names none, in ms (u64 BE; 0: none); absent: the
/// layout's default ([`crate::launch::layout_default_timeout_ms`]).
pub(crate) const META_RUN_TIMEOUT: &str = "run_timeout_ms";
/// Where retention's clock was anchored in the current boot (text: boot id, wall ms, uptime
/// ms; [`crate::retention::clock`]); absent: never anchored.
pub(crate) const META_CLOCK: &str = "clock";

/// Key of a record: run id, then seq big-endian.
pub(crate) fn record_key(run: RunId, seq: u64) -> [u8; 24] {
    let mut key = [0u8; 24];
    key[..16].copy_from_slice(&run.to_bytes());
    key[16..].copy_from_slice(&seq.to_be_bytes());
    key
}

/// Splits a record key into run id and seq.
pub(crate) fn split_record_key(key: &[u8; 24]) -> (RunId, u64) {
    let (run, seq) = key.split_at(16);
    let run: [u8; 16] = run.try_into().expect("a record key has 16 bytes of run id");
    let seq: [u8; 8] = seq.try_into().expect("a record key has 8 bytes of seq");
    (RunId::from_bytes(run), u64::from_be_bytes(seq))
}

/// Key of a terminal-index entry: end time big-endian, then run id.
pub(crate) fn terminal_key(ended_at_ms: UnixMs, run: RunId) -> [u8; 24] {
    let mut key = [0u8; 24];
    key[..8].copy_from_slice(&ended_at_ms.to_be_bytes());
    key[8..].copy_from_slice(&run.to_bytes());
    key
}

/// Splits a terminal-index key into end time and run id.
pub(crate) fn split_terminal_key(key: &[u8; 24]) -> (UnixMs, RunId) {
    let (time, run) = key.split_at(8);
    let time: [u8; 8] = time.try_into().expect("a terminal key has 8 bytes of time");
    let run: [u8; 16] = run
        .try_into()
        .expect("a terminal key has 16 bytes of run id");
    (u64::from_be_bytes(time), RunId::from_bytes(run))
}

/// Key of a tombstone's age entry: prune time big-endian, then run id.
pub(crate) fn pruned_at_key(pruned_at_ms: UnixMs, run: RunId) -> [u8; 24] {
    terminal_key(pruned_at_ms, run)
}

/// The prefix of a queue's keys in [`QUEUE_WAITING`] and [`QUEUE_ACTIVE`]: its name, then a
/// NUL (which no queue name holds), so one queue's keys are one contiguous range.
pub(crate) fn queue_prefix(queue: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(queue.len() + 1 + 16);
    key.extend_from_slice(queue.as_bytes());
    key.push(0);
    key
}

/// The key just past every key of `queue`: its name, then the byte after NUL.
pub(crate) fn queue_prefix_end(queue: &str) -> Vec<u8> {
    let mut key = queue_prefix(queue);
    *key.last_mut().expect("a prefix ends with its separator") = 1;
    key
}

/// Key of a waiting run: its queue's prefix, then the global seq of its `QueueJoined` record,
/// big-endian, so keys sort in the order the runs joined.
pub(crate) fn queue_waiting_key(queue: &str, joined_global_seq: u64) -> Vec<u8> {
    let mut key = queue_prefix(queue);
    key.extend_from_slice(&joined_global_seq.to_be_bytes());
    key
}

/// Key of a run holding a slot: its queue's prefix, then its run id.
pub(crate) fn queue_active_key(queue: &str, run: RunId) -> Vec<u8> {
    let mut key = queue_prefix(queue);
    key.extend_from_slice(&run.to_bytes());
    key
}

/// The seq of a run's `QueueJoined`: it is always the run's second record.
pub(crate) const QUEUE_JOINED_SEQ: u64 = 2;

/// Where record `seq` of `run` sits in `log`, from the nearest [`GLOBALS`] entry of the run at or
/// below it (its batch's, when its batch wrote one), checked against `log` itself: `None` when
/// the index does not know the record (one committed before the index existed, or by a version
/// that did not index it), never a wrong answer. Costs two lookups.
pub(crate) fn global_of(
    globals: &impl ReadableTable<&'static [u8; 24], u64>,
    log: &impl ReadableTable<u64, &'static [u8; 24]>,
    run: RunId,
    seq: u64,
) -> Result<Option<u64>, StorageFailure> {
    let key = record_key(run, seq);
    let low = record_key(run, 0);
    let nearest = globals
        .range(&low..=&key)
        .map_err(storage("reading the log index"))?
        .next_back()
        .transpose()
        .map_err(storage("reading the log index"))?
        .map(|(found, global)| (split_record_key(found.value()).1, global.value()));
    let Some(candidate) =
        nearest.and_then(|(first_seq, global)| global.checked_add(seq - first_seq))
    else {
        return Ok(None);
    };
    let is_there = log
        .get(candidate)
        .map_err(storage("reading the log"))?
        .is_some_and(|found| *found.value() == key);
    Ok(is_there.then_some(candidate))
}

/// Reads a u64 meta value (big-endian); `None` when absent or not 8 bytes.
pub(crate) fn meta_u64(value: Option<&[u8]>) -> Option<u64> {
    value.and_then(|bytes| Some(u64::from_be_bytes(bytes.try_into().ok()?)))
}

/// Alias of a host's tool-call id.
pub fn tool_call_alias(tool_call_id: &str) -> String {
    format!("tool-call:{tool_call_id}")
}

/// Alias of a run name.
pub fn name_alias(name: &str) -> String {
    format!("name:{name}")
}

/// Creates every table, so that read transactions never meet a missing one.
pub(crate) fn create_tables(txn: &WriteTransaction) -> Result<(), StorageFailure> {
    fn create<K: Key + 'static, V: Value + 'static>(
        txn: &WriteTransaction,
        table: TableDefinition<K, V>,
    ) -> Result<(), StorageFailure> {
        txn.open_table(table)
            .map(drop)
            .map_err(|error| StorageFailure::new("creating tables", error))
    }
    create(txn, RECORDS)?;
    create(txn, LOG)?;
    create(txn, RUNS)?;
    create(txn, ACTIVE)?;
    create(txn, TERMINAL)?;
    create(txn, ALIASES)?;
    create(txn, WRITERS)?;
    create(txn, META)?;
    create(txn, GLOBALS)?;
    create(txn, PRUNED)?;
    create(txn, PRUNED_AT)?;
    create(txn, PRUNING)?;
    create(txn, RESUMES)?;
    create(txn, QUEUES)?;
    create(txn, QUEUE_WAITING)?;
    create(txn, QUEUE_ACTIVE)?;
    create(txn, RUN_ENV)?;
    create(txn, RUN_HOOKS)?;
    create(txn, HOOKS_DUE)?;
    create(txn, HOOKS_GIVEN_UP)?;
    create(txn, DEPENDENTS)?;
    create(txn, DELAYED)?;
    create(txn, UNIQUE)?;
    Ok(())
}

/// The key of `dependent`'s entry under `dependency` in [`DEPENDENTS`].
pub(crate) fn dependents_key(dependency: RunId, dependent: RunId) -> [u8; 32] {
    let mut key = [0u8; 32];
    key[..16].copy_from_slice(&dependency.to_bytes());
    key[16..].copy_from_slice(&dependent.to_bytes());
    key
}

/// The dependency and the dependent of a [`DEPENDENTS`] key.
pub(crate) fn split_dependents_key(key: &[u8; 32]) -> (RunId, RunId) {
    let mut dependency = [0u8; 16];
    let mut dependent = [0u8; 16];
    dependency.copy_from_slice(&key[..16]);
    dependent.copy_from_slice(&key[16..]);
    (RunId::from_bytes(dependency), RunId::from_bytes(dependent))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_keys_sort_by_run_then_seq() {
        let run = RunId::from_bytes([7; 16]);
        let later_run = RunId::from_bytes([8; 16]);
        assert!(record_key(run, 255) < record_key(run, 256));
        assert!(record_key(run, u64::MAX) < record_key(later_run, 1));
        assert_eq!(split_record_key(&record_key(run, 300)), (run, 300));
    }

    #[test]
    fn terminal_keys_sort_by_time_then_run() {
        let run = RunId::from_bytes([9; 16]);
        let earlier_run = RunId::from_bytes([1; 16]);
        assert!(terminal_key(255, run) < terminal_key(256, earlier_run));
        assert_eq!(split_terminal_key(&terminal_key(42, run)), (42, run));
    }
}
