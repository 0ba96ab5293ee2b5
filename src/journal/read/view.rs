//! A [`View`] is one redb read transaction, so everything read through it is from
//! the same commit.

use std::path::Path;
use std::sync::Arc;

use redb::{
    ReadOnlyTable, ReadTransaction, ReadableDatabase, ReadableTable, ReadableTableMetadata,
    TableDefinition,
};

use crate::event::{Record, RunId, RunIdError, UnixMs, WriterId};
use crate::journal::file::contain::contain;
use crate::journal::format::error::{
    CorruptError, Damaged, ReadError, StorageFailure, StoragePanic, storage,
};
use crate::journal::format::recovery::RecoveryNote;
use crate::journal::format::retention::{self, Retention, Tombstone};
use crate::journal::format::snapshot::{SnapshotError, decode_snapshot};
use crate::journal::format::tables::{
    self, ACTIVE, ALIASES, DELAYED, DEPENDENTS, GLOBALS, HOOKS_DUE, HOOKS_GIVEN_UP, LOG, META,
    PRUNED, PRUNING, QUEUE_ACTIVE, QUEUE_WAITING, QUEUES, RECORDS, RESUMES, RUN_ENV, RUN_HOOKS,
    RUNS, TERMINAL, WRITERS,
};
use crate::run_env::{HookCommands, RunEnvironment};
use crate::state::{self, DependencyVerdict, RunState};

/// Facts about the journal file itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalMeta {
    pub format_version: u16,
    pub journal_id: [u8; 16],
    pub created_at_ms: u64,
}

/// Why a text does not name exactly one run: by [`View::resolve`] (a run id or prefix), or by
/// [`crate::resolve::resolve_run`] (also a name or tool-call id).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ResolveError {
    #[error(transparent)]
    BadId(#[from] RunIdError),
    #[error("no run matches {text:?}")]
    Unknown { text: String },
    #[error("{text:?} matches {count} runs ({examples}); give more characters")]
    Ambiguous {
        text: String,
        count: usize,
        examples: String,
    },
    /// Refused before any lookup: no run may be named so here.
    #[error("{text:?} is not a run id, name or tool-call id: {why}")]
    Unusable { text: String, why: &'static str },
    /// Not an id or prefix, and no run has it as its name or tool-call id.
    #[error("no run matches {text:?}: no run has it as its name or tool-call id, and {id_error}")]
    NoMatch { text: String, id_error: RunIdError },
    /// Different runs match it in different ways (`matches` names each run and how).
    #[error("{text:?} names more than one run ({matches}); give the full run id")]
    AmbiguousKinds { text: String, matches: String },
    #[error(transparent)]
    Read(#[from] ReadError),
}

impl From<StorageFailure> for ResolveError {
    fn from(failure: StorageFailure) -> ResolveError {
        ResolveError::Read(failure.into())
    }
}

/// How a run is linked to the runs it resumed or that resumed it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ResumeLinks {
    /// The paused run this run carries on from (its own `Resumed` record, seq 2).
    pub resumed_from: Option<RunId>,
    /// The run that carries this one on (the journal's resume index).
    pub resumed_by: Option<RunId>,
}

impl ResumeLinks {
    /// The run a run's records say it resumed: its `Resumed`, which the reducer takes only at
    /// seq 2.
    pub fn resumed_from_records(records: &[Record]) -> Option<RunId> {
        records
            .iter()
            .take(2)
            .find_map(|record| match record.event {
                crate::event::Event::Resumed { from } => Some(from),
                _ => None,
            })
    }
}

/// A queue as the journal holds it: its limit and how many runs hold or wait for a slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueUsage {
    pub name: String,
    /// `None`: no limit was set for it (a queue only runs name, which no run can join).
    pub max_active: Option<u64>,
    pub active: u64,
    pub waiting: u64,
}

/// One entry of a queue index, as [`View::queue_index`] lists them for `verify`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueEntry {
    pub queue: String,
    pub run: RunId,
    /// For a waiting run, the global seq its key says it joined at.
    pub joined_global_seq: Option<u64>,
}

/// A consistent read of the journal.
///
/// Every read is made inside `contain`: a panic of redb's on damaged bytes comes back as
/// [`ReadError::Damaged`] naming the journal file, and the view may be dropped as usual.
pub struct View {
    txn: ReadTransaction,
    /// The journal file, for the words of a [`Damaged`].
    path: Arc<Path>,
}

impl View {
    pub(crate) fn new(txn: ReadTransaction, path: &Path) -> View {
        View {
            txn,
            path: Arc::from(path),
        }
    }

    /// Begins a read transaction on `db`, the journal at `path`: a panic of redb's is
    /// [`ReadError::Damaged`].
    pub(crate) fn begin(db: &impl ReadableDatabase, path: &Path) -> Result<View, ReadError> {
        let txn = contain(|| db.begin_read())
            .map_err(|panic| ReadError::Damaged(Damaged::new(path, "beginning a read", panic)))?
            .map_err(storage("beginning a read"))?;
        Ok(View::new(txn, path))
    }

    /// Runs `read` on this view, reporting a panic of redb's as [`ReadError::Damaged`].
    fn guarded<T, E: From<ReadError>>(
        &self,
        during: &'static str,
        read: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, E> {
        contain(read).unwrap_or_else(|panic| Err(E::from(self.damaged(during, panic))))
    }

    fn damaged(&self, during: &'static str, panic: StoragePanic) -> ReadError {
        ReadError::Damaged(Damaged::new(&self.path, during, panic))
    }

    fn table<K: redb::Key + 'static, V: redb::Value + 'static>(
        &self,
        definition: TableDefinition<K, V>,
    ) -> Result<ReadOnlyTable<K, V>, StorageFailure> {
        self.txn
            .open_table(definition)
            .map_err(storage("opening a table"))
    }

    /// A table that journals written before it existed lack: `None` there, as if empty.
    fn optional_table<K: redb::Key + 'static, V: redb::Value + 'static>(
        &self,
        definition: TableDefinition<K, V>,
    ) -> Result<Option<ReadOnlyTable<K, V>>, StorageFailure> {
        match self.txn.open_table(definition) {
            Ok(table) => Ok(Some(table)),
            Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
            Err(error) => Err(StorageFailure::new("opening a table", error)),
        }
    }

    /// A u64 meta entry; 0 when absent.
    fn meta_u64(&self, key: &'static str) -> Result<u64, ReadError> {
        let meta = self.table(META)?;
        let value = meta.get(key).map_err(storage("reading meta"))?;
        Ok(tables::meta_u64(value.as_ref().map(|value| value.value())).unwrap_or(0))
    }

    /// Every queue with a limit, by name, with its limit.
    pub fn queue_limits(&self) -> Result<Vec<(String, u64)>, ReadError> {
        self.guarded("reading the queues", || {
            let Some(queues) = self.optional_table(QUEUES)? else {
                return Ok(Vec::new());
            };
            let mut limits = Vec::new();
            for entry in queues.iter().map_err(storage("reading the queues"))? {
                let (name, limit) = entry.map_err(storage("reading the queues"))?;
                limits.push((name.value().to_string(), limit.value()));
            }
            Ok(limits)
        })
    }

    /// A queue's limit of active runs; `None` when none was set.
    pub fn queue_limit(&self, queue: &str) -> Result<Option<u64>, ReadError> {
        self.guarded("reading a queue's limit", || {
            let Some(queues) = self.optional_table(QUEUES)? else {
                return Ok(None);
            };
            Ok(queues
                .get(queue)
                .map_err(storage("reading a queue's limit"))?
                .map(|limit| limit.value()))
        })
    }

    /// The runs holding a slot of `queue`, in run id order.
    pub fn queue_active(&self, queue: &str) -> Result<Vec<RunId>, ReadError> {
        self.guarded("reading a queue's active runs", || {
            let Some(active) = self.optional_table(QUEUE_ACTIVE)? else {
                return Ok(Vec::new());
            };
            let low = tables::queue_prefix(queue);
            let high = tables::queue_prefix_end(queue);
            let mut runs = Vec::new();
            for entry in active
                .range(low.as_slice()..high.as_slice())
                .map_err(storage("reading a queue's active runs"))?
            {
                let (key, _) = entry.map_err(storage("reading a queue's active runs"))?;
                let bytes: [u8; 16] = key.value()[low.len()..].try_into().map_err(|_| {
                    ReadError::Corrupt(CorruptError::Index {
                        table: "queue_active",
                        reason: "a key that is not a queue and a run id".to_string(),
                    })
                })?;
                runs.push(RunId::from_bytes(bytes));
            }
            Ok(runs)
        })
    }

    /// The verdict on `state`'s dependencies as this view reads them; `None` when it waits for
    /// none (it has none, they were met, or it ended).
    pub fn dependency_verdict(
        &self,
        state: &RunState,
    ) -> Result<Option<DependencyVerdict>, ReadError> {
        let Some(dependencies) = state
            .dependencies
            .as_ref()
            .filter(|_| state.is_waiting_for_dependencies())
        else {
            return Ok(None);
        };
        let mut statuses = Vec::new();
        for dependency in dependencies.runs() {
            statuses.push((
                dependency,
                self.snapshot(dependency)?.map(|state| state.status),
            ));
        }
        Ok(Some(dependencies.verdict(|run| {
            statuses
                .iter()
                .find(|(dependency, _)| *dependency == run)
                .and_then(|(_, status)| *status)
        })))
    }

    /// The runs `state` still waits for (not yet ended), in the order named: what `list` and
    /// `status` show. Empty when it waits for none.
    pub fn waiting_for(&self, state: &RunState) -> Result<Vec<RunId>, ReadError> {
        Ok(match self.dependency_verdict(state)? {
            Some(DependencyVerdict::Waiting { pending }) => pending,
            _ => Vec::new(),
        })
    }

    /// The runs that wait for `dependency` to end: one range read of the dependents index.
    pub fn dependents_of(&self, dependency: RunId) -> Result<Vec<RunId>, ReadError> {
        self.guarded("reading the dependents index", || {
            let Some(dependents) = self.optional_table(DEPENDENTS)? else {
                return Ok(Vec::new());
            };
            let low = tables::dependents_key(dependency, RunId::from_bytes([0; 16]));
            let high = tables::dependents_key(dependency, RunId::from_bytes([0xff; 16]));
            let mut runs = Vec::new();
            for entry in dependents
                .range(&low..=&high)
                .map_err(storage("reading the dependents index"))?
            {
                let (key, _) = entry.map_err(storage("reading the dependents index"))?;
                runs.push(tables::split_dependents_key(key.value()).1);
            }
            Ok(runs)
        })
    }

    /// The run that last took `key` (`run --unique`), whether or not it still holds it.
    pub fn unique_holder(&self, key: &str) -> Result<Option<RunId>, ReadError> {
        self.guarded("reading the unique index", || {
            let Some(unique) = self.optional_table(tables::UNIQUE)? else {
                return Ok(None);
            };
            let value = unique
                .get(key)
                .map_err(storage("reading the unique index"))?;
            Ok(value.map(|run| RunId::from_bytes(*run.value())))
        })
    }

    /// Every (key, run) of the unique index, in key order.
    pub fn unique_entries(&self) -> Result<Vec<(String, RunId)>, ReadError> {
        self.guarded("reading the unique index", || {
            let Some(unique) = self.optional_table(tables::UNIQUE)? else {
                return Ok(Vec::new());
            };
            let mut entries = Vec::new();
            for entry in unique.iter().map_err(storage("reading the unique index"))? {
                let (key, run) = entry.map_err(storage("reading the unique index"))?;
                entries.push((key.value().to_string(), RunId::from_bytes(*run.value())));
            }
            Ok(entries)
        })
    }

    /// Every (dependency, dependent) pair of runs that wait for their dependencies, in
    /// dependency order: the dependents index whole.
    pub fn dependency_edges(&self) -> Result<Vec<(RunId, RunId)>, ReadError> {
        self.guarded("reading the dependents index", || {
            let Some(dependents) = self.optional_table(DEPENDENTS)? else {
                return Ok(Vec::new());
            };
            let mut edges = Vec::new();
            for entry in dependents
                .iter()
                .map_err(storage("reading the dependents index"))?
            {
                let (key, _) = entry.map_err(storage("reading the dependents index"))?;
                edges.push(tables::split_dependents_key(key.value()));
            }
            Ok(edges)
        })
    }

    /// The first `limit` runs waiting in `queue`, first in first. One range read of the index:
    /// the first costs the same however many wait.
    pub fn queue_waiting(&self, queue: &str, limit: usize) -> Result<Vec<RunId>, ReadError> {
        self.guarded("reading a queue's waiting runs", || {
            let Some(waiting) = self.optional_table(QUEUE_WAITING)? else {
                return Ok(Vec::new());
            };
            let low = tables::queue_prefix(queue);
            let high = tables::queue_prefix_end(queue);
            let mut runs = Vec::new();
            for entry in waiting
                .range(low.as_slice()..high.as_slice())
                .map_err(storage("reading a queue's waiting runs"))?
                .take(limit)
            {
                let (_, run) = entry.map_err(storage("reading a queue's waiting runs"))?;
                runs.push(RunId::from_bytes(*run.value()));
            }
            Ok(runs)
        })
    }

    /// How many runs wait in `queue` (reads its waiting entries: for showing, never on an
    /// admission's path).
    pub fn queue_waiting_count(&self, queue: &str) -> Result<u64, ReadError> {
        self.guarded("counting a queue's waiting runs", || {
            let Some(waiting) = self.optional_table(QUEUE_WAITING)? else {
                return Ok(0);
            };
            let low = tables::queue_prefix(queue);
            let high = tables::queue_prefix_end(queue);
            let mut count = 0;
            for entry in waiting
                .range(low.as_slice()..high.as_slice())
                .map_err(storage("counting a queue's waiting runs"))?
            {
                entry.map_err(storage("counting a queue's waiting runs"))?;
                count += 1;
            }
            Ok(count)
        })
    }

    /// `queue`'s limit and use.
    pub fn queue_usage(&self, queue: &str) -> Result<QueueUsage, ReadError> {
        self.guarded("reading a queue's use", || {
            Ok(QueueUsage {
                name: queue.to_string(),
                max_active: self.queue_limit(queue)?,
                active: self.queue_active(queue)?.len() as u64,
                waiting: self.queue_waiting_count(queue)?,
            })
        })
    }

    /// Every queue with a limit, with its use.
    pub fn queues(&self) -> Result<Vec<QueueUsage>, ReadError> {
        self.guarded("reading the queues", || {
            self.queue_limits()?
                .into_iter()
                .map(|(name, _)| self.queue_usage(&name))
                .collect()
        })
    }

    /// Every entry of the queue indexes: the waiting runs (with the global seq their key
    /// holds), then the active ones. For `verify`.
    pub fn queue_index(&self) -> Result<(Vec<QueueEntry>, Vec<QueueEntry>), ReadError> {
        self.guarded("reading the queue indexes", || {
            let corrupt = |table: &'static str| {
                ReadError::Corrupt(CorruptError::Index {
                    table,
                    reason: "a key that is not a queue name, a NUL and its entry".to_string(),
                })
            };
            let split = |key: &[u8], table: &'static str| -> Result<(String, Vec<u8>), ReadError> {
                let at = key
                    .iter()
                    .position(|byte| *byte == 0)
                    .ok_or_else(|| corrupt(table))?;
                let name = std::str::from_utf8(&key[..at]).map_err(|_| corrupt(table))?;
                Ok((name.to_string(), key[at + 1..].to_vec()))
            };
            let mut waiting = Vec::new();
            if let Some(table) = self.optional_table(QUEUE_WAITING)? {
                for entry in table.iter().map_err(storage("reading the waiting runs"))? {
                    let (key, run) = entry.map_err(storage("reading the waiting runs"))?;
                    let (queue, rest) = split(key.value(), "queue_waiting")?;
                    let global: [u8; 8] = rest.try_into().map_err(|_| corrupt("queue_waiting"))?;
                    waiting.push(QueueEntry {
                        queue,
                        run: RunId::from_bytes(*run.value()),
                        joined_global_seq: Some(u64::from_be_bytes(global)),
                    });
                }
            }
            let mut active = Vec::new();
            if let Some(table) = self.optional_table(QUEUE_ACTIVE)? {
                for entry in table.iter().map_err(storage("reading the active runs"))? {
                    let (key, _) = entry.map_err(storage("reading the active runs"))?;
                    let (queue, rest) = split(key.value(), "queue_active")?;
                    let run: [u8; 16] = rest.try_into().map_err(|_| corrupt("queue_active"))?;
                    active.push(QueueEntry {
                        queue,
                        run: RunId::from_bytes(run),
                        joined_global_seq: None,
                    });
                }
            }
            Ok((waiting, active))
        })
    }

    /// The environment `run`'s launcher gave it (docs/design.md, "Environment"); `None` for a
    /// run without one (created by an earlier version, or pruned). Secret: for starting its
    /// steps and hooks, and for a person who asked to see it.
    pub fn run_env(&self, run: RunId) -> Result<Option<RunEnvironment>, ReadError> {
        self.guarded("reading a run's environment", || {
            let Some(table) = self.optional_table(RUN_ENV)? else {
                return Ok(None);
            };
            let Some(bytes) = table
                .get(&run.to_bytes())
                .map_err(storage("reading a run's environment"))?
            else {
                return Ok(None);
            };
            RunEnvironment::decode(bytes.value())
                .map(Some)
                .map_err(|error| {
                    CorruptError::Index {
                        table: "run_env",
                        reason: format!("run {run}: {error}"),
                    }
                    .into()
                })
        })
    }

    /// `run`'s completion hooks (docs/design.md, "Hooks"): its own, then — once it has ended —
    /// the home's hook in force then. Empty for a run without any.
    pub fn run_hooks(&self, run: RunId) -> Result<HookCommands, ReadError> {
        self.guarded("reading a run's hooks", || {
            let Some(table) = self.optional_table(RUN_HOOKS)? else {
                return Ok(HookCommands::default());
            };
            let Some(bytes) = table
                .get(&run.to_bytes())
                .map_err(storage("reading a run's hooks"))?
            else {
                return Ok(HookCommands::default());
            };
            HookCommands::decode(bytes.value()).map_err(|error| {
                CorruptError::Index {
                    table: "run_hooks",
                    reason: format!("run {run}: {error}"),
                }
                .into()
            })
        })
    }

    /// The home's completion hook, run for every run that ends; `None` when none is set.
    pub fn home_hook(&self) -> Result<Option<String>, ReadError> {
        self.guarded("reading the home's hook", || {
            let meta = self.table(META)?;
            let Some(value) = meta
                .get(tables::META_HOME_HOOK)
                .map_err(storage("reading the home's hook"))?
            else {
                return Ok(None);
            };
            HookCommands::decode(value.value())
                .map(|hooks| hooks.home)
                .map_err(|error| {
                    CorruptError::Meta {
                        key: tables::META_HOME_HOOK,
                        reason: error.to_string(),
                    }
                    .into()
                })
        })
    }

    /// The runs that have ended with a hook neither delivered nor given up, in run id order:
    /// the work of whoever delivers hooks.
    pub fn hooks_due(&self) -> Result<Vec<RunId>, ReadError> {
        self.run_set(HOOKS_DUE, "reading the due hooks")
    }

    /// Whether `run` has ended with a hook neither delivered nor given up.
    pub fn has_hooks_due(&self, run: RunId) -> Result<bool, ReadError> {
        self.guarded("reading the due hooks", || {
            let Some(table) = self.optional_table(HOOKS_DUE)? else {
                return Ok(false);
            };
            Ok(table
                .get(&run.to_bytes())
                .map_err(storage("reading the due hooks"))?
                .is_some())
        })
    }

    /// The runs with a hook given up, in run id order, until they are pruned.
    pub fn hooks_given_up(&self) -> Result<Vec<RunId>, ReadError> {
        self.run_set(HOOKS_GIVEN_UP, "reading the given-up hooks")
    }

    fn run_set(
        &self,
        definition: TableDefinition<&'static [u8; 16], ()>,
        op: &'static str,
    ) -> Result<Vec<RunId>, ReadError> {
        self.guarded(op, || {
            let Some(table) = self.optional_table(definition)? else {
                return Ok(Vec::new());
            };
            let mut runs = Vec::new();
            for entry in table.iter().map_err(storage(op))? {
                let (key, _) = entry.map_err(storage(op))?;
                runs.push(RunId::from_bytes(*key.value()));
            }
            Ok(runs)
        })
    }

    /// The retention policy the home set, or `None` when it never set one
    /// ([`Retention::DEFAULT`] applies).
    pub fn retention_set(&self) -> Result<Option<Retention>, ReadError> {
        self.guarded("reading the retention policy", || {
            let meta = self.table(META)?;
            let Some(value) = meta
                .get(tables::META_RETENTION)
                .map_err(storage("reading the retention policy"))?
            else {
                return Ok(None);
            };
            retention::decode_retention(value.value())
                .map(Some)
                .map_err(|error| {
                    CorruptError::Meta {
                        key: tables::META_RETENTION,
                        reason: error.to_string(),
                    }
                    .into()
                })
        })
    }

    /// What a rebuild from projections chose and could not recover, when this journal was
    /// rebuilt so ([`RecoveryNote`]); a note that does not decode is shown as none.
    pub fn recovery_note(&self) -> Result<Option<RecoveryNote>, ReadError> {
        self.guarded("reading meta", || {
            let meta = self.table(META)?;
            let value = meta
                .get(tables::META_RECOVERY)
                .map_err(storage("reading meta"))?;
            Ok(value.and_then(|bytes| RecoveryNote::decode(bytes.value())))
        })
    }

    /// The retention policy in force: the one set, else [`Retention::DEFAULT`].
    pub fn retention(&self) -> Result<Retention, ReadError> {
        self.guarded("reading the retention policy", || {
            Ok(self.retention_set()?.unwrap_or_default())
        })
    }

    /// How `run` is linked by resumes: the run it resumed (its record at seq 2, where the
    /// reducer takes a `Resumed` only), and the run that resumed it (the resume index).
    pub fn resume_links(&self, run: RunId) -> Result<ResumeLinks, ReadError> {
        self.guarded("reading resume links", || {
            let records = self.table(RECORDS)?;
            let key = tables::record_key(run, 2);
            let resumed_from = match records.get(&key).map_err(storage("reading a record"))? {
                Some(value) => match decode_record(&key, value.value())?.event {
                    crate::event::Event::Resumed { from } => Some(from),
                    _ => None,
                },
                None => None,
            };
            let resumed_by = match self.optional_table(RESUMES)? {
                Some(resumes) => resumes
                    .get(&run.to_bytes())
                    .map_err(storage("reading the resume index"))?
                    .map(|entry| RunId::from_bytes(*entry.value())),
                None => None,
            };
            Ok(ResumeLinks {
                resumed_from,
                resumed_by,
            })
        })
    }

    /// Every entry of the resume index, (paused run, the run that resumed it), in run id
    /// order.
    pub fn resumes(&self) -> Result<Vec<(RunId, RunId)>, ReadError> {
        self.guarded("reading the resume index", || {
            let Some(resumes) = self.optional_table(RESUMES)? else {
                return Ok(Vec::new());
            };
            let mut out = Vec::new();
            for entry in resumes
                .iter()
                .map_err(storage("reading the resume index"))?
            {
                let (key, value) = entry.map_err(storage("reading the resume index"))?;
                out.push((
                    RunId::from_bytes(*key.value()),
                    RunId::from_bytes(*value.value()),
                ));
            }
            Ok(out)
        })
    }

    /// The tombstone of a pruned run, if it has one.
    pub fn tombstone(&self, run: RunId) -> Result<Option<Tombstone>, ReadError> {
        self.guarded("reading a tombstone", || {
            let Some(pruned) = self.optional_table(PRUNED)? else {
                return Ok(None);
            };
            let value = pruned
                .get(&run.to_bytes())
                .map_err(storage("reading a tombstone"))?;
            value
                .map(|bytes| {
                    Tombstone::decode(bytes.value())
                        .map_err(|source| CorruptError::Tombstone { run, source }.into())
                })
                .transpose()
        })
    }

    /// Every tombstone, in run id order.
    pub fn tombstones(&self) -> Result<Vec<Tombstone>, ReadError> {
        self.guarded("reading tombstones", || self.tombstones_of(PRUNED))
    }

    /// The pruned runs whose files a pass may not have removed yet.
    pub fn pruning(&self) -> Result<Vec<Tombstone>, ReadError> {
        self.guarded("reading tombstones", || self.tombstones_of(PRUNING))
    }

    fn tombstones_of(
        &self,
        definition: TableDefinition<&'static [u8; 16], &'static [u8]>,
    ) -> Result<Vec<Tombstone>, ReadError> {
        let Some(table) = self.optional_table(definition)? else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for entry in table.iter().map_err(storage("reading tombstones"))? {
            let (key, value) = entry.map_err(storage("reading tombstones"))?;
            let run = RunId::from_bytes(*key.value());
            out.push(
                Tombstone::decode(value.value())
                    .map_err(|source| CorruptError::Tombstone { run, source })?,
            );
        }
        Ok(out)
    }

    /// How many pruned runs still have their tombstone.
    pub fn tombstone_count(&self) -> Result<u64, ReadError> {
        self.guarded("counting tombstones", || {
            match self.optional_table(PRUNED)? {
                Some(table) => Ok(table.len().map_err(storage("counting tombstones"))?),
                None => Ok(0),
            }
        })
    }

    /// The highest global seq a prune removed (0: none).
    pub fn log_floor(&self) -> Result<u64, ReadError> {
        self.guarded("reading meta", || self.meta_u64(tables::META_LOG_FLOOR))
    }

    /// Whether the home ships, and through which global seq its records are proven shipped
    /// (`None`: it does not ship; `Some(0)`: it ships and nothing is proven yet). Retention
    /// keeps every record above it.
    pub fn shipped_through(&self) -> Result<Option<u64>, ReadError> {
        self.guarded("reading meta", || {
            let meta = self.table(META)?;
            let value = meta
                .get(tables::META_SHIPPED_THROUGH)
                .map_err(storage("reading meta"))?;
            Ok(value.map(|value| tables::meta_u64(Some(value.value())).unwrap_or(0)))
        })
    }

    /// How many log entries prunes removed in all.
    pub fn pruned_records(&self) -> Result<u64, ReadError> {
        self.guarded("reading meta", || {
            self.meta_u64(tables::META_PRUNED_RECORDS)
        })
    }

    /// Where record `seq` of `run` sits in the global log, when the log index knows (records
    /// committed before it existed, until the first prune indexes them, are not known).
    pub fn global_of(&self, run: RunId, seq: u64) -> Result<Option<u64>, ReadError> {
        self.guarded("reading the log index", || {
            let Some(globals) = self.optional_table(GLOBALS)? else {
                return Ok(None);
            };
            Ok(tables::global_of(&globals, &self.table(LOG)?, run, seq)?)
        })
    }

    /// Up to `limit` terminal runs, the earliest ended first, with their end times.
    pub fn oldest_terminal(&self, limit: usize) -> Result<Vec<(UnixMs, RunId)>, ReadError> {
        self.guarded("reading the terminal index", || {
            let terminal = self.table(TERMINAL)?;
            let mut out = Vec::new();
            for entry in terminal
                .iter()
                .map_err(storage("reading the terminal index"))?
                .take(limit)
            {
                let (key, _) = entry.map_err(storage("reading the terminal index"))?;
                out.push(tables::split_terminal_key(key.value()));
            }
            Ok(out)
        })
    }

    /// Up to `limit` delayed runs waiting for their due time, the soonest due first, with their
    /// due times: read from the `delayed` index, so the cost follows `limit`, never how many
    /// wait.
    pub fn soonest_delayed(&self, limit: usize) -> Result<Vec<(UnixMs, RunId)>, ReadError> {
        self.delayed_due_by(UnixMs::MAX, limit)
    }

    /// Up to `limit` terminal runs that ended after `after` (end time, run id; `None`: from
    /// the first), earliest first, with their end times.
    pub fn terminal_after(
        &self,
        after: Option<(UnixMs, RunId)>,
        limit: usize,
    ) -> Result<Vec<(UnixMs, RunId)>, ReadError> {
        self.guarded("reading the terminal index", || {
            let terminal = self.table(TERMINAL)?;
            let low = after.map(|(at, run)| tables::terminal_key(at, run));
            let entries = match &low {
                Some(low) => {
                    terminal.range((std::ops::Bound::Excluded(low), std::ops::Bound::Unbounded))
                }
                None => terminal.range(..),
            }
            .map_err(storage("reading the terminal index"))?;
            let mut out = Vec::new();
            for entry in entries.take(limit) {
                let (key, _) = entry.map_err(storage("reading the terminal index"))?;
                out.push(tables::split_terminal_key(key.value()));
            }
            Ok(out)
        })
    }

    /// Up to `limit` delayed runs due by `now_ms`, the soonest due first, with their due
    /// times: the index is read only up to the first run not yet due.
    pub fn delayed_due_by(
        &self,
        now_ms: UnixMs,
        limit: usize,
    ) -> Result<Vec<(UnixMs, RunId)>, ReadError> {
        self.guarded("reading the delayed runs", || {
            let Some(delayed) = self.optional_table(DELAYED)? else {
                return Ok(Vec::new());
            };
            let mut out = Vec::new();
            for entry in delayed
                .iter()
                .map_err(storage("reading the delayed runs"))?
                .take(limit)
            {
                let (key, _) = entry.map_err(storage("reading the delayed runs"))?;
                let (due_at_ms, run) = tables::split_terminal_key(key.value());
                if due_at_ms > now_ms {
                    break;
                }
                out.push((due_at_ms, run));
            }
            Ok(out)
        })
    }

    /// How many delayed runs wait for their due time.
    pub fn delayed_count(&self) -> Result<u64, ReadError> {
        self.guarded("counting the delayed runs", || {
            let Some(delayed) = self.optional_table(DELAYED)? else {
                return Ok(0);
            };
            Ok(delayed
                .len()
                .map_err(storage("counting the delayed runs"))?)
        })
    }

    /// The home's size as the journal keeps it (meta `home_size`, `home_size`), as
    /// stored; `None` before the first walk.
    pub fn home_size(&self) -> Result<Option<Vec<u8>>, ReadError> {
        self.guarded("reading meta", || {
            let meta = self.table(META)?;
            let value = meta
                .get(tables::META_HOME_SIZE)
                .map_err(storage("reading meta"))?;
            Ok(value.map(|value| value.value().to_vec()))
        })
    }

    /// What the home's last scrub found, as stored (meta `scrub`, [`crate::scrub`]); `None`
    /// before the first.
    pub fn scrub_record(&self) -> Result<Option<Vec<u8>>, ReadError> {
        self.meta_bytes(tables::META_SCRUB)
    }

    /// The home's scrub interval in ms (meta `scrub_every_ms`); `None`: the default.
    pub fn scrub_every_ms(&self) -> Result<Option<u64>, ReadError> {
        self.meta_u64_set(tables::META_SCRUB_EVERY)
    }

    /// The timeout a run gets when its launch names none, as the home set it (meta
    /// `run_timeout_ms`): `Some(Some(ms))`, `Some(None)` for none at all; `None` when the home
    /// never set one (the layout's default applies).
    pub fn run_timeout_set(&self) -> Result<Option<Option<u64>>, ReadError> {
        Ok(self
            .meta_u64_set(tables::META_RUN_TIMEOUT)?
            .map(|timeout_ms| (timeout_ms > 0).then_some(timeout_ms)))
    }

    /// Where retention's clock was last anchored (meta `clock`, [`crate::retention::clock`]);
    /// `None` before the first anchor, or for one that does not read (a new one replaces it).
    pub fn clock_anchor(&self) -> Result<Option<retention::ClockAnchor>, ReadError> {
        Ok(self
            .meta_bytes(tables::META_CLOCK)?
            .and_then(|bytes| retention::ClockAnchor::parse(&bytes)))
    }

    /// A meta value that is a u64, big-endian, when present; any other length is damage.
    fn meta_u64_set(&self, key: &'static str) -> Result<Option<u64>, ReadError> {
        let Some(bytes) = self.meta_bytes(key)? else {
            return Ok(None);
        };
        let bytes: [u8; 8] = bytes.as_slice().try_into().map_err(|_| {
            ReadError::Corrupt(CorruptError::Meta {
                key,
                reason: format!("{} bytes, not 8", bytes.len()),
            })
        })?;
        Ok(Some(u64::from_be_bytes(bytes)))
    }

    fn meta_bytes(&self, key: &'static str) -> Result<Option<Vec<u8>>, ReadError> {
        self.guarded("reading meta", || {
            let meta = self.table(META)?;
            let value = meta.get(key).map_err(storage("reading meta"))?;
            Ok(value.map(|value| value.value().to_vec()))
        })
    }

    /// How many runs are terminal (and not pruned).
    pub fn terminal_count(&self) -> Result<u64, ReadError> {
        self.guarded("counting ended runs", || {
            Ok(self
                .table(TERMINAL)?
                .len()
                .map_err(storage("counting ended runs"))?)
        })
    }

    /// The journal's meta entries.
    pub fn meta(&self) -> Result<JournalMeta, ReadError> {
        self.guarded("reading meta", || {
            let meta = self.table(META)?;
            let get = |key: &'static str| -> Result<Vec<u8>, ReadError> {
                match meta.get(key).map_err(storage("reading meta"))? {
                    Some(value) => Ok(value.value().to_vec()),
                    None => Err(CorruptError::Meta {
                        key,
                        reason: "missing".to_string(),
                    }
                    .into()),
                }
            };
            let fixed = |key: &'static str, bytes: Vec<u8>| -> Result<Vec<u8>, ReadError> {
                let expected = match key {
                    tables::META_FORMAT_VERSION => 2,
                    tables::META_JOURNAL_ID => 16,
                    _ => 8,
                };
                if bytes.len() == expected {
                    Ok(bytes)
                } else {
                    Err(CorruptError::Meta {
                        key,
                        reason: format!("{} bytes, expected {expected}", bytes.len()),
                    }
                    .into())
                }
            };
            let version = fixed(
                tables::META_FORMAT_VERSION,
                get(tables::META_FORMAT_VERSION)?,
            )?;
            let journal_id = fixed(tables::META_JOURNAL_ID, get(tables::META_JOURNAL_ID)?)?;
            let created_at = fixed(tables::META_CREATED_AT, get(tables::META_CREATED_AT)?)?;
            Ok(JournalMeta {
                format_version: u16::from_be_bytes([version[0], version[1]]),
                journal_id: journal_id.try_into().expect("length checked above"),
                created_at_ms: u64::from_be_bytes(
                    created_at.try_into().expect("length checked above"),
                ),
            })
        })
    }

    /// The run's folded state as stored with its last commit; `None` for an unknown run. A
    /// stored snapshot that does not decode is re-derived from the run's records (it is a
    /// cache): only records that do not decode or fold make this an error.
    pub fn snapshot(&self, run: RunId) -> Result<Option<RunState>, ReadError> {
        self.guarded("reading a snapshot", || {
            let runs = self.table(RUNS)?;
            let value = runs
                .get(&run.to_bytes())
                .map_err(storage("reading a snapshot"))?;
            match value {
                Some(bytes) => Ok(Some(state_of(run, bytes.value(), &self.table(RECORDS)?)?)),
                None => Ok(None),
            }
        })
    }

    /// The run's stored snapshot as it decodes, without re-deriving one that does not (for
    /// `verify`, which reports such a snapshot); `None` for an unknown run.
    pub fn stored_snapshot(
        &self,
        run: RunId,
    ) -> Result<Option<Result<RunState, SnapshotError>>, ReadError> {
        self.guarded("reading a snapshot", || {
            let runs = self.table(RUNS)?;
            let value = runs
                .get(&run.to_bytes())
                .map_err(storage("reading a snapshot"))?;
            Ok(value.map(|bytes| decode_snapshot(run, bytes.value())))
        })
    }

    /// Every record of the run, in seq order, each verified against its checksum and its key.
    pub fn records(&self, run: RunId) -> Result<Vec<Record>, ReadError> {
        self.guarded("reading records", || self.records_until(run, u64::MAX))
    }

    /// The run's records with seq at most `until_seq`.
    pub fn records_until(&self, run: RunId, until_seq: u64) -> Result<Vec<Record>, ReadError> {
        self.guarded("reading records", || {
            run_records(&self.table(RECORDS)?, run, until_seq)
        })
    }

    /// The run's records with `after_seq < seq <= until_seq`, in seq order: what a follower or
    /// a projector holding the run up to `after_seq` has not seen, read without the rest.
    pub fn records_between(
        &self,
        run: RunId,
        after_seq: u64,
        until_seq: u64,
    ) -> Result<Vec<Record>, ReadError> {
        self.guarded("reading records", || {
            run_records_between(&self.table(RECORDS)?, run, after_seq, until_seq)
        })
    }

    /// The seq of the run's `Terminal` record, if it has one, read backwards from its head:
    /// after a `Terminal` the reducer accepts only `ProcessTerminalObserved`, `Dismissed`, its
    /// hooks' attempts (at most two records per attempt, a bounded number of attempts) and, for
    /// a paused run, the messages kept for its resume (at most 20 waiting) and the refusals of
    /// files that asked for them, so this reads a few records, however long the run. (It
    /// stopped at the first record it did not expect, and a paused run that took a message had
    /// its result written with its head's seq.)
    pub fn terminal_seq(&self, run: RunId) -> Result<Option<u64>, ReadError> {
        self.guarded("reading records", || {
            let records = self.table(RECORDS)?;
            let low = tables::record_key(run, 0);
            let high = tables::record_key(run, u64::MAX);
            for entry in records
                .range(&low..=&high)
                .map_err(storage("reading records"))?
                .rev()
            {
                let (key, value) = entry.map_err(storage("reading records"))?;
                let record = decode_record(key.value(), value.value())?;
                // Whatever follows the end (its runner's end seen, a dismissal, hooks, a paused
                // run's messages and refusals) is walked over, back to the end itself.
                if let crate::event::Event::Terminal { .. }
                | crate::event::Event::HostEnded { .. } = record.event
                {
                    return Ok(Some(record.seq));
                }
            }
            Ok(None)
        })
    }

    /// When the newest record of the log was committed (its `time_ms`); `None` for an empty
    /// log. Two lookups, whatever the journal holds.
    pub fn latest_record_time(&self) -> Result<Option<UnixMs>, ReadError> {
        let last: Option<u64> = self.guarded("reading the log", || {
            let log = self.table(LOG)?;
            let last = log.last().map_err(storage("reading the log"))?;
            Ok::<_, ReadError>(last.map(|(global, _)| global.value()))
        })?;
        let Some(last) = last else { return Ok(None) };
        Ok(self
            .records_after(last.saturating_sub(1), 1)?
            .first()
            .map(|(_, record)| record.time_ms))
    }

    /// Up to `limit` records committed after global seq `after`, in commit order, each with
    /// its global seq.
    pub fn records_after(&self, after: u64, limit: usize) -> Result<Vec<(u64, Record)>, ReadError> {
        self.guarded("reading the log", || {
            let log = self.table(LOG)?;
            let records = self.table(RECORDS)?;
            let mut out = Vec::new();
            for entry in log
                .range(after.saturating_add(1)..)
                .map_err(storage("reading the log"))?
                .take(limit)
            {
                let (global, key) = entry.map_err(storage("reading the log"))?;
                let key = *key.value();
                let value = records.get(&key).map_err(storage("reading a record"))?;
                let Some(value) = value else {
                    let (run, seq) = tables::split_record_key(&key);
                    return Err(CorruptError::Record {
                        run,
                        seq,
                        source: crate::event::DecodeError::Malformed {
                            reason: format!(
                                "the log names it at global seq {}, but it is missing",
                                global.value()
                            ),
                        },
                    }
                    .into());
                };
                out.push((global.value(), decode_record(&key, value.value())?));
            }
            Ok(out)
        })
    }

    /// The runs that records committed after global seq `after` belong to, each once, in the
    /// order of their first such record, and the global seq of the last of those records
    /// (`after` when there is none). Reads the log only, not the records.
    pub fn runs_changed_after(&self, after: u64) -> Result<(Vec<RunId>, u64), ReadError> {
        self.guarded("reading the log", || {
            let log = self.table(LOG)?;
            let mut runs = Vec::new();
            let mut seen = std::collections::HashSet::new();
            let mut last = after;
            for entry in log
                .range(after.saturating_add(1)..)
                .map_err(storage("reading the log"))?
            {
                let (global, key) = entry.map_err(storage("reading the log"))?;
                let (run, _) = tables::split_record_key(key.value());
                if seen.insert(run) {
                    runs.push(run);
                }
                last = global.value();
            }
            Ok((runs, last))
        })
    }

    /// The global seq of the last commit (0 for an empty journal), pruned ones included.
    pub fn global_head(&self) -> Result<u64, ReadError> {
        self.guarded("reading the log head", || {
            let log = self.table(LOG)?;
            let last = log.last().map_err(storage("reading the log head"))?;
            Ok(last
                .map_or(0, |(key, _)| key.value())
                .max(self.log_floor()?))
        })
    }

    /// Runs not yet closed, oldest first.
    pub fn active_runs(&self) -> Result<Vec<RunId>, ReadError> {
        self.guarded("reading the active index", || {
            let active = self.table(ACTIVE)?;
            let mut out = Vec::new();
            for entry in active.iter().map_err(storage("reading the active index"))? {
                let (key, _) = entry.map_err(storage("reading the active index"))?;
                out.push(RunId::from_bytes(*key.value()));
            }
            Ok(out)
        })
    }

    /// Whether any run is not yet closed: one look at the active index, whatever its size.
    pub fn has_active_runs(&self) -> Result<bool, ReadError> {
        self.guarded("reading the active index", || {
            let active = self.table(ACTIVE)?;
            let first = active
                .first()
                .map_err(storage("reading the active index"))?;
            Ok(first.is_some())
        })
    }

    /// Up to `limit` terminal runs, most recently ended first, with their end times.
    pub fn recent_terminal(&self, limit: usize) -> Result<Vec<(UnixMs, RunId)>, ReadError> {
        self.guarded("reading the terminal index", || {
            let terminal = self.table(TERMINAL)?;
            let mut out = Vec::new();
            for entry in terminal
                .iter()
                .map_err(storage("reading the terminal index"))?
                .rev()
                .take(limit)
            {
                let (key, _) = entry.map_err(storage("reading the terminal index"))?;
                out.push(tables::split_terminal_key(key.value()));
            }
            Ok(out)
        })
    }

    /// Every run id, oldest first.
    pub fn all_runs(&self) -> Result<Vec<RunId>, ReadError> {
        self.guarded("reading runs", || {
            let runs = self.table(RUNS)?;
            let mut out = Vec::new();
            for entry in runs.iter().map_err(storage("reading runs"))? {
                let (key, _) = entry.map_err(storage("reading runs"))?;
                out.push(RunId::from_bytes(*key.value()));
            }
            Ok(out)
        })
    }

    /// The number of runs in the journal.
    pub fn run_count(&self) -> Result<u64, ReadError> {
        self.guarded("counting runs", || {
            Ok(self.table(RUNS)?.len().map_err(storage("counting runs"))?)
        })
    }

    /// The number of records in the journal.
    pub fn record_count(&self) -> Result<u64, ReadError> {
        self.guarded("counting records", || {
            Ok(self
                .table(RECORDS)?
                .len()
                .map_err(storage("counting records"))?)
        })
    }

    /// Every run's state, in run id order (a snapshot that does not decode is re-derived, as
    /// [`View::snapshot`] does); `f` sees each and may stop early by returning `false`.
    pub fn for_each_snapshot(&self, mut f: impl FnMut(RunState) -> bool) -> Result<(), ReadError> {
        let during = "reading runs";
        let (runs, records) = self.guarded(during, || {
            Ok::<_, ReadError>((self.table(RUNS)?, self.table(RECORDS)?))
        })?;
        let mut entries = self.guarded(during, || {
            Ok::<_, ReadError>(runs.iter().map_err(storage(during))?)
        })?;
        // Each step of the scan inside the guard, `f` outside it: a panic of `f`'s own is not
        // the journal's.
        while let Some(state) = self.guarded(during, || {
            entries
                .next()
                .map(|entry| {
                    let (key, value) = entry.map_err(storage(during))?;
                    state_of(RunId::from_bytes(*key.value()), value.value(), &records)
                })
                .transpose()
        })? {
            if !f(state) {
                break;
            }
        }
        Ok(())
    }

    /// Every stored record in key order (run, then seq), each decoded and checked against its
    /// checksum and its key. Unlike [`View::records`], a damaged record does not end the scan:
    /// `f` sees it as an `Err` naming its run and seq, and may stop early by returning `false`.
    pub fn scan_records(
        &self,
        mut f: impl FnMut(RunId, u64, Result<Record, CorruptError>) -> bool,
    ) -> Result<(), ReadError> {
        let during = "reading records";
        let records = self.guarded(during, || Ok::<_, ReadError>(self.table(RECORDS)?))?;
        let mut entries = self.guarded(during, || {
            Ok::<_, ReadError>(records.iter().map_err(storage(during))?)
        })?;
        while let Some((run, seq, record)) = self.guarded(during, || {
            entries
                .next()
                .map(|entry| {
                    let (key, value) = entry.map_err(storage(during))?;
                    let (run, seq) = tables::split_record_key(key.value());
                    Ok::<_, ReadError>((run, seq, decode_record(key.value(), value.value())))
                })
                .transpose()
        })? {
            if !f(run, seq, record) {
                break;
            }
        }
        Ok(())
    }

    /// Every run's state in run id order, as [`View::snapshot`] reads it (a snapshot that does
    /// not decode is re-derived from the records); a run whose records do not decode or fold
    /// does not end the scan: `f` sees it as an `Err` (see [`View::scan_records`]).
    pub fn scan_snapshots(
        &self,
        mut f: impl FnMut(RunId, Result<RunState, CorruptError>) -> bool,
    ) -> Result<(), ReadError> {
        let during = "reading runs";
        let (runs, records) = self.guarded(during, || {
            Ok::<_, ReadError>((self.table(RUNS)?, self.table(RECORDS)?))
        })?;
        let mut entries = self.guarded(during, || {
            Ok::<_, ReadError>(runs.iter().map_err(storage(during))?)
        })?;
        while let Some((run, state)) = self.guarded(during, || {
            entries
                .next()
                .map(|entry| {
                    let (key, value) = entry.map_err(storage(during))?;
                    let run = RunId::from_bytes(*key.value());
                    match state_of(run, value.value(), &records) {
                        Ok(state) => Ok((run, Ok(state))),
                        Err(ReadError::Corrupt(error)) => Ok((run, Err(error))),
                        Err(error) => Err(error),
                    }
                })
                .transpose()
        })? {
            if !f(run, state) {
                break;
            }
        }
        Ok(())
    }

    /// Every stored snapshot in run id order, as it decodes, without re-deriving one that does
    /// not (for `verify`); `f` may stop early by returning `false`.
    pub fn scan_stored_snapshots(
        &self,
        mut f: impl FnMut(RunId, Result<RunState, SnapshotError>) -> bool,
    ) -> Result<(), ReadError> {
        let during = "reading runs";
        let runs = self.guarded(during, || Ok::<_, ReadError>(self.table(RUNS)?))?;
        let mut entries = self.guarded(during, || {
            Ok::<_, ReadError>(runs.iter().map_err(storage(during))?)
        })?;
        while let Some((run, snapshot)) = self.guarded(during, || {
            entries
                .next()
                .map(|entry| {
                    let (key, value) = entry.map_err(storage(during))?;
                    let run = RunId::from_bytes(*key.value());
                    Ok::<_, ReadError>((run, decode_snapshot(run, value.value())))
                })
                .transpose()
        })? {
            if !f(run, snapshot) {
                break;
            }
        }
        Ok(())
    }

    /// Every entry of the global log in commit order, as (global seq, run, seq), without
    /// reading the records it names.
    pub fn scan_log(&self, mut f: impl FnMut(u64, RunId, u64) -> bool) -> Result<(), ReadError> {
        let during = "reading the log";
        let log = self.guarded(during, || Ok::<_, ReadError>(self.table(LOG)?))?;
        let mut entries = self.guarded(during, || {
            Ok::<_, ReadError>(log.iter().map_err(storage(during))?)
        })?;
        while let Some((global, run, seq)) = self.guarded(during, || {
            entries
                .next()
                .map(|entry| {
                    let (global, key) = entry.map_err(storage(during))?;
                    let (run, seq) = tables::split_record_key(key.value());
                    Ok::<_, ReadError>((global.value(), run, seq))
                })
                .transpose()
        })? {
            if !f(global, run, seq) {
                break;
            }
        }
        Ok(())
    }

    /// The run an alias points to (see [`crate::journal::tool_call_alias`], [`crate::journal::name_alias`]).
    pub fn lookup_alias(&self, alias: &str) -> Result<Option<RunId>, ReadError> {
        self.guarded("reading an alias", || {
            let aliases = self.table(ALIASES)?;
            let value = aliases.get(alias).map_err(storage("reading an alias"))?;
            Ok(value.map(|run| RunId::from_bytes(*run.value())))
        })
    }

    /// Every alias and its run.
    pub fn aliases(&self) -> Result<Vec<(String, RunId)>, ReadError> {
        self.guarded("reading aliases", || {
            let aliases = self.table(ALIASES)?;
            let mut out = Vec::new();
            for entry in aliases.iter().map_err(storage("reading aliases"))? {
                let (key, value) = entry.map_err(storage("reading aliases"))?;
                out.push((key.value().to_string(), RunId::from_bytes(*value.value())));
            }
            Ok(out)
        })
    }

    /// Every (end time, run) of the terminal index, oldest first.
    pub fn terminal_index(&self) -> Result<Vec<(UnixMs, RunId)>, ReadError> {
        self.guarded("reading the terminal index", || {
            let terminal = self.table(TERMINAL)?;
            let mut out = Vec::new();
            for entry in terminal
                .iter()
                .map_err(storage("reading the terminal index"))?
            {
                let (key, _) = entry.map_err(storage("reading the terminal index"))?;
                out.push(tables::split_terminal_key(key.value()));
            }
            Ok(out)
        })
    }

    /// The last writer seq committed by `writer`.
    pub fn writer_mark(&self, writer: WriterId) -> Result<Option<u64>, ReadError> {
        self.guarded("reading a writer mark", || {
            let writers = self.table(WRITERS)?;
            let value = writers
                .get(writer.0)
                .map_err(storage("reading a writer mark"))?;
            Ok(value.map(|seq| seq.value()))
        })
    }

    /// The one run whose id is `text` or starts with it (at least
    /// [`RunId::MIN_PREFIX_LEN`] characters).
    pub fn resolve(&self, text: &str) -> Result<RunId, ResolveError> {
        self.guarded("looking a run up", || {
            if text.len() == RunId::LEN {
                let run: RunId = text.parse()?;
                let is_known = self
                    .table(RUNS)?
                    .get(&run.to_bytes())
                    .map_err(storage("reading runs"))?
                    .is_some();
                return if is_known || self.tombstone(run)?.is_some() {
                    Ok(run)
                } else {
                    Err(ResolveError::Unknown {
                        text: text.to_string(),
                    })
                };
            }
            let (low, high) = RunId::prefix_range(text)?;
            let (low, high) = (low.to_bytes(), high.to_bytes());
            // Runs in the journal, then pruned runs that kept their tombstone.
            let runs = self.table(RUNS)?;
            let pruned = self.optional_table(PRUNED)?;
            let mut matches = Vec::new();
            let mut count = 0usize;
            for entry in runs.range(&low..=&high).map_err(storage("reading runs"))? {
                let (key, _) = entry.map_err(storage("reading runs"))?;
                if matches.len() < 4 {
                    matches.push(RunId::from_bytes(*key.value()));
                }
                count += 1;
            }
            if let Some(pruned) = &pruned {
                for entry in pruned
                    .range(&low..=&high)
                    .map_err(storage("reading tombstones"))?
                {
                    let (key, _) = entry.map_err(storage("reading tombstones"))?;
                    if matches.len() < 4 {
                        matches.push(RunId::from_bytes(*key.value()));
                    }
                    count += 1;
                }
            }
            match matches.as_slice() {
                [] => Err(ResolveError::Unknown {
                    text: text.to_string(),
                }),
                [run] => Ok(*run),
                _ => {
                    let examples = matches
                        .iter()
                        .take(3)
                        .map(RunId::to_string)
                        .collect::<Vec<_>>()
                        .join(", ");
                    Err(ResolveError::Ambiguous {
                        text: text.to_string(),
                        count,
                        examples,
                    })
                }
            }
        })
    }
}

/// The state of `run` whose stored snapshot is `bytes`: the snapshot, or, when it does not
/// decode, the fold of the run's records read from `records` (the table of the same
/// transaction).
pub(crate) fn state_of(
    run: RunId,
    bytes: &[u8],
    records: &impl ReadableTable<&'static [u8; 24], &'static [u8]>,
) -> Result<RunState, ReadError> {
    match decode_snapshot(run, bytes) {
        Ok(state) => Ok(state),
        Err(why) => rederive(run, why, records),
    }
}

/// Folds the run's records through [`state::apply`], in place of a snapshot that did not decode.
fn rederive(
    run: RunId,
    why: SnapshotError,
    records: &impl ReadableTable<&'static [u8; 24], &'static [u8]>,
) -> Result<RunState, ReadError> {
    let records = run_records(records, run, u64::MAX)?;
    let mut folded: Option<RunState> = None;
    for record in &records {
        let applied = match &mut folded {
            None => state::apply(None, record).map(|state| folded = Some(state)),
            Some(state) => state.apply_mut(record),
        };
        applied.map_err(|source| CorruptError::Unfoldable {
            run,
            seq: record.seq,
            snapshot: why.clone(),
            source: Box::new(source),
        })?;
    }
    folded.ok_or_else(|| CorruptError::NoRecords { run, snapshot: why }.into())
}

/// The run's records with seq at most `until_seq`, in seq order, from the `records` table of a
/// read or a write transaction.
pub(crate) fn run_records(
    records: &impl ReadableTable<&'static [u8; 24], &'static [u8]>,
    run: RunId,
    until_seq: u64,
) -> Result<Vec<Record>, ReadError> {
    // Seqs start at 1: "after 0" is every record.
    run_records_between(records, run, 0, until_seq)
}

/// The run's records with `after_seq < seq <= until_seq`, in seq order.
fn run_records_between(
    records: &impl ReadableTable<&'static [u8; 24], &'static [u8]>,
    run: RunId,
    after_seq: u64,
    until_seq: u64,
) -> Result<Vec<Record>, ReadError> {
    if after_seq >= until_seq {
        return Ok(Vec::new());
    }
    let low = tables::record_key(run, after_seq + 1);
    let high = tables::record_key(run, until_seq);
    let mut out = Vec::new();
    for entry in records
        .range(&low..=&high)
        .map_err(storage("reading records"))?
    {
        let (key, value) = entry.map_err(storage("reading records"))?;
        out.push(decode_record(key.value(), value.value())?);
    }
    Ok(out)
}

fn decode_record(key: &[u8; 24], value: &[u8]) -> Result<Record, CorruptError> {
    let (run, seq) = tables::split_record_key(key);
    let record =
        Record::decode(value).map_err(|source| CorruptError::Record { run, seq, source })?;
    if record.run_id != run || record.seq != seq {
        return Err(CorruptError::RecordKeyMismatch {
            key_run: run,
            key_seq: seq,
            found_run: record.run_id,
            found_seq: record.seq,
        });
    }
    Ok(record)
}
