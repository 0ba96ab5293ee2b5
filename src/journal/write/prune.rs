//! The journal's side of retention: the policy it keeps, pruning ended runs, and the tombstones
//! they leave. What to prune is chosen above (`crate::retention`, which also removes the files);
//! here it is done.
//!
//! Invariants:
//! * a run is pruned in one write transaction: its records, log entries, snapshot and terminal
//!   index entry go and its tombstone comes, or nothing changes; no run is ever half there;
//! * only a terminal, closed run with no hook due is pruned: the check is made again inside the
//!   transaction, so a run that moved on since it was chosen is skipped;
//! * a global seq is never issued twice: the highest one a prune removed is kept
//!   (`tables::META_LOG_FLOOR`), and the count of removed log entries with it, so that the
//!   log's entries and the pruned ones still add up to its head (`verify` checks it);
//! * a pruned run stays listed in `pruning` until a later pass has removed its files, so a pass
//!   cut short is finished by the next one;
//! * tombstones are bounded ([`MAX_TOMBSTONES`]): the oldest go first, with the aliases that
//!   still name them.

use crate::event::{FORMAT_VERSION, RunId, UnixMs};
use crate::journal::format::error::{ReadError, StorageFailure, storage};
use crate::journal::format::retention::{MAX_TOMBSTONES, Retention, Tombstone, encode_retention};
use crate::journal::format::tables::{
    self, ACTIVE, ALIASES, DEPENDENTS, GLOBALS, HOOKS_DUE, HOOKS_GIVEN_UP, LOG, META, PRUNED,
    PRUNED_AT, PRUNING, RECORDS, RESUMES, RUN_ENV, RUN_HOOKS, RUNS, TERMINAL,
};
use crate::journal::read::view::state_of;
use redb::{ReadableTable, ReadableTableMetadata, Table, WriteTransaction};

/// What a prune did with one run it was asked to prune.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pruned {
    /// Gone from the journal; this is its tombstone.
    Done(Tombstone),
    /// Left as it is, and why (it moved on since it was chosen, say).
    Skipped(&'static str),
}

/// Writes the policy.
pub(crate) fn set_retention_in(
    txn: &WriteTransaction,
    policy: &Retention,
) -> Result<(), StorageFailure> {
    let mut meta = txn.open_table(META).map_err(storage("opening meta"))?;
    meta.insert(tables::META_RETENTION, encode_retention(policy).as_slice())
        .map_err(storage("writing the retention policy"))?;
    Ok(())
}

struct PruneTables<'txn> {
    records: Table<'txn, &'static [u8; 24], &'static [u8]>,
    log: Table<'txn, u64, &'static [u8; 24]>,
    runs: Table<'txn, &'static [u8; 16], &'static [u8]>,
    active: Table<'txn, &'static [u8; 16], ()>,
    terminal: Table<'txn, &'static [u8; 24], ()>,
    aliases: Table<'txn, &'static str, &'static [u8; 16]>,
    globals: Table<'txn, &'static [u8; 24], u64>,
    pruned: Table<'txn, &'static [u8; 16], &'static [u8]>,
    pruned_at: Table<'txn, &'static [u8; 24], ()>,
    pruning: Table<'txn, &'static [u8; 16], &'static [u8]>,
    meta: Table<'txn, &'static str, &'static [u8]>,
    resumes: Table<'txn, &'static [u8; 16], &'static [u8; 16]>,
    run_env: Table<'txn, &'static [u8; 16], &'static [u8]>,
    run_hooks: Table<'txn, &'static [u8; 16], &'static [u8]>,
    hooks_due: Table<'txn, &'static [u8; 16], ()>,
    hooks_given_up: Table<'txn, &'static [u8; 16], ()>,
    dependents: Table<'txn, &'static [u8; 32], ()>,
    unique: Table<'txn, &'static str, &'static [u8; 16]>,
}

impl<'txn> PruneTables<'txn> {
    fn open(txn: &'txn WriteTransaction) -> Result<PruneTables<'txn>, StorageFailure> {
        Ok(PruneTables {
            records: txn.open_table(RECORDS).map_err(storage("opening tables"))?,
            log: txn.open_table(LOG).map_err(storage("opening tables"))?,
            runs: txn.open_table(RUNS).map_err(storage("opening tables"))?,
            active: txn.open_table(ACTIVE).map_err(storage("opening tables"))?,
            terminal: txn
                .open_table(TERMINAL)
                .map_err(storage("opening tables"))?,
            aliases: txn.open_table(ALIASES).map_err(storage("opening tables"))?,
            globals: txn.open_table(GLOBALS).map_err(storage("opening tables"))?,
            pruned: txn.open_table(PRUNED).map_err(storage("opening tables"))?,
            pruned_at: txn
                .open_table(PRUNED_AT)
                .map_err(storage("opening tables"))?,
            pruning: txn.open_table(PRUNING).map_err(storage("opening tables"))?,
            meta: txn.open_table(META).map_err(storage("opening tables"))?,
            resumes: txn.open_table(RESUMES).map_err(storage("opening tables"))?,
            run_env: txn.open_table(RUN_ENV).map_err(storage("opening tables"))?,
            run_hooks: txn
                .open_table(RUN_HOOKS)
                .map_err(storage("opening tables"))?,
            hooks_due: txn
                .open_table(HOOKS_DUE)
                .map_err(storage("opening tables"))?,
            hooks_given_up: txn
                .open_table(HOOKS_GIVEN_UP)
                .map_err(storage("opening tables"))?,
            dependents: txn
                .open_table(DEPENDENTS)
                .map_err(storage("opening tables"))?,
            unique: txn
                .open_table(tables::UNIQUE)
                .map_err(storage("opening tables"))?,
        })
    }

    fn meta_u64(&self, key: &str) -> Result<u64, StorageFailure> {
        let value = self.meta.get(key).map_err(storage("reading meta"))?;
        Ok(tables::meta_u64(value.as_ref().map(|value| value.value())).unwrap_or(0))
    }

    fn set_meta_u64(&mut self, key: &str, value: u64) -> Result<(), StorageFailure> {
        self.meta
            .insert(key, &value.to_be_bytes()[..])
            .map_err(storage("writing meta"))?;
        Ok(())
    }

    /// Indexes in `globals` every record of `log` that it does not find yet, once: records
    /// committed before the index existed have no entry there. Walked in log order, a record
    /// that sits right after the one before it of its run is found through that one's entry,
    /// so it needs none of its own.
    fn index_globals_once(&mut self) -> Result<(), StorageFailure> {
        let is_indexed = self
            .meta
            .get(tables::META_GLOBALS_INDEXED)
            .map_err(storage("reading meta"))?
            .is_some();
        if is_indexed {
            return Ok(());
        }
        let mut entries = Vec::new();
        for entry in self.log.iter().map_err(storage("reading the log"))? {
            let (global, key) = entry.map_err(storage("reading the log"))?;
            entries.push((*key.value(), global.value()));
        }
        for (key, global) in entries {
            let (run, seq) = tables::split_record_key(&key);
            if tables::global_of(&self.globals, &self.log, run, seq)? == Some(global) {
                continue;
            }
            self.globals
                .insert(&key, global)
                .map_err(storage("indexing the log"))?;
        }
        self.meta
            .insert(tables::META_GLOBALS_INDEXED, &[1u8][..])
            .map_err(storage("writing meta"))?;
        Ok(())
    }

    /// The global seq of a record, through the `globals` entry of its batch; a scan of the log
    /// when the index does not know it (a record written by a process that did not index it).
    fn global_of(&self, key: &[u8; 24]) -> Result<Option<u64>, StorageFailure> {
        let (run, seq) = tables::split_record_key(key);
        if let Some(global) = tables::global_of(&self.globals, &self.log, run, seq)? {
            return Ok(Some(global));
        }
        for entry in self.log.iter().map_err(storage("reading the log"))? {
            let (global, found) = entry.map_err(storage("reading the log"))?;
            if found.value() == key {
                return Ok(Some(global.value()));
            }
        }
        Ok(None)
    }

    fn has_hooks_due(&self, run_key: &[u8; 16]) -> Result<bool, StorageFailure> {
        Ok(self
            .hooks_due
            .get(run_key)
            .map_err(storage("reading the due hooks"))?
            .is_some())
    }

    /// Why a closed run must stay, if it must: a hook of it still to deliver needs its state
    /// and environment; a waiting run reads its end to know whether it may start; it holds its
    /// key until its hold passed.
    fn kept_for(
        &self,
        run: RunId,
        state: &crate::state::RunState,
        now_ms: UnixMs,
    ) -> Result<Option<&'static str>, StorageFailure> {
        Ok(if self.has_hooks_due(&run.to_bytes())? {
            Some("a hook of it is still due")
        } else if self.has_dependents(run)? {
            Some("a waiting run depends on it")
        } else if crate::journal::write::append::holds_key(state, now_ms) {
            Some("it holds its unique key for a while yet")
        } else {
            None
        })
    }

    /// Removes the run's entry from the unique index, if the index still lists it under its
    /// key (a later run that took the key keeps its own).
    fn forget_key(
        &mut self,
        run_key: &[u8; 16],
        state: &crate::state::RunState,
    ) -> Result<(), StorageFailure> {
        let Some(unique) = &state.unique else {
            return Ok(());
        };
        let names_it = self
            .unique
            .get(unique.key.as_str())
            .map_err(storage("reading the unique index"))?
            .is_some_and(|holder| holder.value() == run_key);
        if names_it {
            self.unique
                .remove(unique.key.as_str())
                .map_err(storage("pruning the unique index"))?;
        }
        Ok(())
    }

    /// Whether a run waits for `run` (the dependents index holds an entry under it).
    fn has_dependents(&self, run: RunId) -> Result<bool, StorageFailure> {
        let low = tables::dependents_key(run, RunId::from_bytes([0; 16]));
        let high = tables::dependents_key(run, RunId::from_bytes([0xff; 16]));
        Ok(self
            .dependents
            .range(&low..=&high)
            .map_err(storage("reading the dependents index"))?
            .next()
            .is_some())
    }

    /// What a run kept in the home only goes with it: its environment, its hooks.
    fn forget_private(&mut self, run_key: &[u8; 16]) -> Result<(), StorageFailure> {
        self.run_env
            .remove(run_key)
            .map_err(storage("pruning the run's environment"))?;
        self.run_hooks
            .remove(run_key)
            .map_err(storage("pruning the run's hooks"))?;
        self.hooks_given_up
            .remove(run_key)
            .map_err(storage("pruning the given-up hooks"))?;
        Ok(())
    }

    /// Removes one run whole and leaves its tombstone. Returns how many log entries went and
    /// the highest of their global seqs.
    fn prune_one(&mut self, run: RunId, now_ms: UnixMs) -> Result<Pruned, StorageFailure> {
        let run_key = run.to_bytes();
        let state = {
            let Some(bytes) = self.runs.get(&run_key).map_err(storage("reading runs"))? else {
                return Ok(Pruned::Skipped("it is not in the journal"));
            };
            match state_of(run, bytes.value(), &self.records) {
                Ok(state) => state,
                Err(ReadError::Storage(failure)) => return Err(failure),
                // Damage is for `verify` to report and a person to look at, never to erase.
                Err(ReadError::Corrupt(_) | ReadError::Damaged(_)) => {
                    return Ok(Pruned::Skipped("its records do not read"));
                }
            }
        };
        let is_active = self
            .active
            .get(&run_key)
            .map_err(storage("reading the active index"))?
            .is_some();
        let (Some(terminal), false, true) = (&state.terminal, is_active, state.is_closed()) else {
            return Ok(Pruned::Skipped("it is not closed"));
        };
        if let Some(why) = self.kept_for(run, &state, now_ms)? {
            return Ok(Pruned::Skipped(why));
        }
        let low = tables::record_key(run, 0);
        let high = tables::record_key(run, u64::MAX);
        let mut keys = Vec::new();
        for entry in self
            .records
            .range(&low..=&high)
            .map_err(storage("reading records"))?
        {
            let (key, _) = entry.map_err(storage("reading records"))?;
            keys.push(*key.value());
        }
        let mut created_global = 0;
        let mut highest = 0;
        let mut removed = 0u64;
        for key in &keys {
            if let Some(global) = self.global_of(key)? {
                self.log
                    .remove(global)
                    .map_err(storage("pruning the log"))?;
                if tables::split_record_key(key).1 == 1 {
                    created_global = global;
                }
                highest = highest.max(global);
                removed += 1;
            }
            self.records
                .remove(key)
                .map_err(storage("pruning records"))?;
        }
        self.globals
            .retain_in(&low..=&high, |_, _| false)
            .map_err(storage("pruning the log index"))?;
        self.runs
            .remove(&run_key)
            .map_err(storage("pruning the snapshot"))?;
        self.terminal
            .remove(&tables::terminal_key(terminal.at_ms, run))
            .map_err(storage("pruning the terminal index"))?;
        // The link a resumed run keeps goes with it; the run that resumed it still names it
        // (`resumedFrom`), as it names any pruned run, by its id.
        self.resumes
            .remove(&run_key)
            .map_err(storage("pruning the resume index"))?;
        self.forget_private(&run_key)?;
        self.forget_key(&run_key, &state)?;
        let tombstone = Tombstone {
            format_version: FORMAT_VERSION,
            run_id: run,
            name: state.spec.name.clone(),
            tool_call_id: state.tool_call_id.clone(),
            session_id: state.session_id.clone(),
            state: terminal.state,
            exit_code: terminal.exit_code,
            created_at_ms: state.created_at_ms,
            ended_at_ms: terminal.at_ms,
            pruned_at_ms: now_ms,
            created_global,
            records: keys.len() as u64,
        };
        let bytes = tombstone.encode();
        self.pruned
            .insert(&run_key, bytes.as_slice())
            .map_err(storage("writing a tombstone"))?;
        self.pruned_at
            .insert(&tables::pruned_at_key(now_ms, run), ())
            .map_err(storage("writing a tombstone"))?;
        self.pruning
            .insert(&run_key, bytes.as_slice())
            .map_err(storage("writing a tombstone"))?;
        let floor = self.meta_u64(tables::META_LOG_FLOOR)?.max(highest);
        self.set_meta_u64(tables::META_LOG_FLOOR, floor)?;
        let total = self.meta_u64(tables::META_PRUNED_RECORDS)? + removed;
        self.set_meta_u64(tables::META_PRUNED_RECORDS, total)?;
        Ok(Pruned::Done(tombstone))
    }

    /// Drops the oldest tombstones beyond [`MAX_TOMBSTONES`], and the aliases that still name
    /// them.
    fn bound_tombstones(&mut self) -> Result<(), StorageFailure> {
        while self
            .pruned_at
            .len()
            .map_err(storage("counting tombstones"))?
            > MAX_TOMBSTONES
        {
            let oldest = self
                .pruned_at
                .pop_first()
                .map_err(storage("dropping a tombstone"))?
                .map(|(key, _)| *key.value());
            let Some(key) = oldest else { break };
            let (_, run) = tables::split_terminal_key(&key);
            let tombstone = self
                .pruned
                .remove(&run.to_bytes())
                .map_err(storage("dropping a tombstone"))?
                .and_then(|bytes| Tombstone::decode(bytes.value()).ok());
            let Some(tombstone) = tombstone else { continue };
            let aliases = [
                tombstone
                    .tool_call_id
                    .as_deref()
                    .map(tables::tool_call_alias),
                tombstone.name.as_deref().map(tables::name_alias),
            ];
            for alias in aliases.into_iter().flatten() {
                let names_it = self
                    .aliases
                    .get(alias.as_str())
                    .map_err(storage("reading an alias"))?
                    .is_some_and(|found| *found.value() == run.to_bytes());
                if names_it {
                    self.aliases
                        .remove(alias.as_str())
                        .map_err(storage("dropping an alias"))?;
                }
            }
        }
        Ok(())
    }
}

/// In one write transaction: forgets the `pruning` entries of `finished` (their files are
/// gone), prunes each of `runs` (see the module's invariants), and bounds the tombstones.
pub(crate) fn prune_in(
    txn: &WriteTransaction,
    runs: &[RunId],
    finished: &[RunId],
    now_ms: UnixMs,
) -> Result<Vec<(RunId, Pruned)>, StorageFailure> {
    let mut tables = PruneTables::open(txn)?;
    for run in finished {
        tables
            .pruning
            .remove(&run.to_bytes())
            .map_err(storage("finishing a prune"))?;
    }
    if !runs.is_empty() {
        tables.index_globals_once()?;
    }
    let mut outcomes = Vec::with_capacity(runs.len());
    for &run in runs {
        outcomes.push((run, tables.prune_one(run, now_ms)?));
    }
    tables.bound_tombstones()?;
    Ok(outcomes)
}
