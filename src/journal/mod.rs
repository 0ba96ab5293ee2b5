//! The journal: one redb file holding every run's records, their folded snapshots and the
//! indexes over them.
//!
//! Invariants:
//! * a record is acknowledged only when the write transaction holding it committed with
//!   `Durability::Immediate`;
//! * every record of a run passed [`crate::state::apply`] against the snapshot committed with
//!   the record before it, and the snapshot stored beside the records is their fold;
//! * a batch carries (writer id, writer seq); a batch whose writer seq is not above the writer's
//!   committed mark was already applied and is answered from the records, never applied twice.

mod append;
#[doc(hidden)]
pub mod instrumented;
mod queue;
mod read;
pub(crate) mod tables;
pub mod writer;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use redb::{ConcurrencyMode, Database, ReadableDatabase, ReadableTable, TableHandle};
use serde::{Deserialize, Serialize};

use crate::event::{
    self, DecodeError, EncodeError, Event, FORMAT_VERSION, HostIds, RunId, RunSpec, WriterId,
    decode_checked, encode_checked,
};
use crate::state::{RunState, RunStatus, TransitionError};

pub use append::{Appended, Batch, Condition};
use queue::Queue;
pub use read::{ResolveError, View};
pub use tables::{name_alias, tool_call_alias};
pub use writer::{CapacityEvent, CapacityListener, Source, WriterOptions, WriterStats};

/// redb's page cache for one journal handle. Runners, launchers and tools each open their own
/// handle, so this stays small.
const CACHE_BYTES: usize = 16 << 20;

/// A redb failure, with what we were doing when it happened.
#[derive(Debug, thiserror::Error)]
#[error("journal storage failed while {op}: {source}")]
pub struct StorageFailure {
    pub op: &'static str,
    #[source]
    pub source: redb::Error,
}

impl StorageFailure {
    pub(crate) fn new(op: &'static str, source: impl Into<redb::Error>) -> StorageFailure {
        StorageFailure {
            op,
            source: source.into(),
        }
    }

    /// Whether the failure is about capacity (ENOSPC, EDQUOT, EMFILE, ENFILE): it clears by
    /// waiting.
    pub fn is_capacity(&self) -> bool {
        crate::capacity::is_capacity_redb(&self.source)
    }

    /// A copy to hand to each caller of a failed group (redb errors are not `Clone`): the
    /// same operation, the same OS error number where there is one, the same message.
    pub(crate) fn duplicate(&self) -> StorageFailure {
        let error = match self.io_error().and_then(std::io::Error::raw_os_error) {
            Some(code) => std::io::Error::from_raw_os_error(code),
            None => std::io::Error::other(self.source.to_string()),
        };
        StorageFailure::new(self.op, redb::Error::Io(error))
    }

    /// The I/O error underneath, if the failure was one.
    pub fn io_error(&self) -> Option<&std::io::Error> {
        match &self.source {
            redb::Error::Io(error) => Some(error),
            _ => None,
        }
    }
}

/// Why a journal could not be opened. Nothing was written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    #[error("cannot open journal {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a runjournal journal ({reason})")]
    NotAJournal { path: PathBuf, reason: String },
    #[error(
        "journal {path} was written in format version {found}; this build reads version {FORMAT_VERSION} only (upgrade runjournal)"
    )]
    NewerFormat { path: PathBuf, found: u16 },
    #[error("journal {path} is corrupt: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    #[error(
        "journal {path} is held open by a process in an incompatible mode ({reason}); close it and retry"
    )]
    Locked { path: PathBuf, reason: String },
    #[error(
        "journal {path} was not shut down cleanly and cannot be repaired read-only; open it once for writing (any runjournal command) to recover it"
    )]
    NeedsRecovery { path: PathBuf },
    #[error(transparent)]
    Storage(#[from] StorageFailure),
}

impl OpenError {
    fn from_database(path: &Path, error: redb::DatabaseError) -> OpenError {
        let path = path.to_path_buf();
        match error {
            // redb reports a file that is not a database as InvalidData ("Not a redb
            // database: magic number mismatch", or an empty file opened without create).
            redb::DatabaseError::Storage(redb::StorageError::Io(source))
                if source.kind() == std::io::ErrorKind::InvalidData =>
            {
                OpenError::NotAJournal {
                    path,
                    reason: source.to_string(),
                }
            }
            redb::DatabaseError::Storage(redb::StorageError::Io(source)) => {
                OpenError::Io { path, source }
            }
            redb::DatabaseError::Storage(redb::StorageError::Corrupted(reason)) => {
                if reason.contains("magic") {
                    OpenError::NotAJournal { path, reason }
                } else {
                    OpenError::Corrupt { path, reason }
                }
            }
            redb::DatabaseError::UpgradeRequired(version) => OpenError::NotAJournal {
                path,
                reason: format!("a redb file of file format {version}"),
            },
            redb::DatabaseError::DatabaseAlreadyOpen => OpenError::Locked {
                path,
                reason: "database already open".to_string(),
            },
            redb::DatabaseError::LockProtocolMismatch => OpenError::Locked {
                path,
                reason: "another redb locking protocol".to_string(),
            },
            redb::DatabaseError::RepairAborted => OpenError::NeedsRecovery { path },
            other => OpenError::Storage(StorageFailure::new("opening the database", other)),
        }
    }
}

/// Why an append was refused or failed. A refused append wrote nothing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AppendError {
    #[error("run {run} does not exist in the journal")]
    UnknownRun { run: RunId },
    #[error("event {index} of the batch breaks a lifecycle rule: {source}")]
    Transition {
        index: usize,
        #[source]
        source: TransitionError,
    },
    #[error(
        "run {run}: expected head {expected}, but the head is {found} (someone appended first)"
    )]
    HeadMismatch {
        run: RunId,
        expected: u64,
        found: u64,
    },
    #[error("run {run} is already {state}")]
    AlreadyTerminal { run: RunId, state: RunStatus },
    #[error("an append needs at least one event")]
    EmptyBatch,
    #[error(transparent)]
    Encode(#[from] EncodeError),
    #[error(transparent)]
    Corrupt(#[from] CorruptError),
    #[error(
        "writer {writer} reused writer seq {writer_seq} for run {run}, but the run holds no batch of those events under it"
    )]
    WriterSeqReused {
        writer: WriterId,
        writer_seq: u64,
        run: RunId,
    },
    #[error(transparent)]
    Storage(#[from] StorageFailure),
}

/// Stored bytes that do not decode, or decode to something that contradicts their key.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CorruptError {
    #[error("record {seq} of run {run}: {source}")]
    Record {
        run: RunId,
        seq: u64,
        #[source]
        source: DecodeError,
    },
    #[error("record stored under run {key_run} seq {key_seq} says run {found_run} seq {found_seq}")]
    RecordKeyMismatch {
        key_run: RunId,
        key_seq: u64,
        found_run: RunId,
        found_seq: u64,
    },
    #[error("snapshot of run {run}: {source}")]
    Snapshot {
        run: RunId,
        #[source]
        source: DecodeError,
    },
    #[error("meta entry {key}: {reason}")]
    Meta { key: &'static str, reason: String },
}

/// Errors of reads.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    #[error(transparent)]
    Corrupt(#[from] CorruptError),
    #[error(transparent)]
    Storage(#[from] StorageFailure),
}

/// Facts about the journal file itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalMeta {
    pub format_version: u16,
    pub journal_id: [u8; 16],
    pub created_at_ms: u64,
}

#[derive(Serialize)]
struct SnapshotRef<'a> {
    format_version: u16,
    state: &'a RunState,
}

#[derive(Deserialize)]
struct SnapshotOwned {
    format_version: u16,
    state: RunState,
}

pub(crate) fn encode_snapshot(state: &RunState) -> Result<Vec<u8>, EncodeError> {
    let bytes = encode_checked(&SnapshotRef {
        format_version: FORMAT_VERSION,
        state,
    })
    .map_err(|error| EncodeError::Serialize {
        reason: error.to_string(),
    })?;
    if bytes.len() > event::MAX_SNAPSHOT_BYTES {
        return Err(EncodeError::TooLarge {
            event: "snapshot",
            bytes: bytes.len(),
        });
    }
    Ok(bytes)
}

pub(crate) fn decode_snapshot(run: RunId, bytes: &[u8]) -> Result<RunState, CorruptError> {
    let snapshot: SnapshotOwned = decode_checked(bytes, event::MAX_SNAPSHOT_BYTES)
        .map_err(|source| CorruptError::Snapshot { run, source })?;
    debug_assert_eq!(snapshot.format_version, FORMAT_VERSION);
    let state = &snapshot.state;
    let reason = if state.run_id != run {
        Some(format!("it holds the state of run {}", state.run_id))
    } else if state.steps.len() != state.spec.steps.len() {
        Some(format!(
            "it has {} step states for {} steps",
            state.steps.len(),
            state.spec.steps.len()
        ))
    } else {
        None
    };
    if let Some(reason) = reason {
        return Err(CorruptError::Snapshot {
            run,
            source: DecodeError::Malformed { reason },
        });
    }
    Ok(snapshot.state)
}

/// The snapshot bytes of `state`, as the `runs` table stores them. For tests that edit a
/// journal behind the library's back (to check that `verify` notices); never needed otherwise.
#[doc(hidden)]
pub fn encode_snapshot_for_tests(state: &RunState) -> Result<Vec<u8>, EncodeError> {
    encode_snapshot(state)
}

/// Bytes at the start of a redb file that hold its header (the commit slots), with room to
/// spare: redb's header is 320 bytes, in its first page.
const REDB_HEADER_BYTES: usize = 4096;

/// How many times [`copy_consistent`] copies a journal that changed while it was copied
/// before it gives up.
pub const COPY_ATTEMPTS: u32 = 8;

/// Why a journal could not be copied.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CopyError {
    #[error("copying journal {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "journal {path} changed during each of {attempts} attempts to copy it (writers are busy); try again later"
    )]
    KeptChanging { path: PathBuf, attempts: u32 },
}

/// Copies the journal file at `source` to `dest` (created 0600, or truncated) as it stood at
/// one commit, even while writers append to it. Nothing is written to `source`.
///
/// redb writes a commit's pages before the header that names them, and never writes over the
/// pages of the latest commit; so a copy during which neither the header nor the file's length
/// changed holds that commit whole. A copy that saw either change is made again, up to
/// [`COPY_ATTEMPTS`] times. The copy may still be flagged as needing recovery (its writers were
/// open when it was taken); opening it for writing recovers it, as after a crash.
pub fn copy_consistent(source: &Path, dest: &Path) -> Result<(), CopyError> {
    use std::io::{Read, Seek};
    use std::os::unix::fs::{FileExt, OpenOptionsExt};

    let at = |path: &Path| {
        let path = path.to_path_buf();
        move |source| CopyError::Io { path, source }
    };
    let state_of = |file: &std::fs::File| -> std::io::Result<(u64, Vec<u8>)> {
        let len = file.metadata()?.len();
        let mut header = vec![0u8; REDB_HEADER_BYTES];
        let mut filled = 0;
        while filled < header.len() {
            match file.read_at(&mut header[filled..], filled as u64)? {
                0 => break,
                read => filled += read,
            }
        }
        header.truncate(filled);
        Ok((len, header))
    };
    let mut file = std::fs::File::open(source).map_err(at(source))?;
    for attempt in 0..COPY_ATTEMPTS {
        let before = state_of(&file).map_err(at(source))?;
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(dest)
            .map_err(at(dest))?;
        file.rewind().map_err(at(source))?;
        std::io::copy(&mut (&mut file).take(before.0), &mut out).map_err(at(dest))?;
        drop(out);
        if state_of(&file).map_err(at(source))? == before {
            return Ok(());
        }
        // Back off a little more each time, so a burst of commits can end.
        std::thread::sleep(std::time::Duration::from_millis(
            10 * u64::from(attempt + 1),
        ));
    }
    Err(CopyError::KeptChanging {
        path: source.to_path_buf(),
        attempts: COPY_ATTEMPTS,
    })
}

fn builder() -> redb::Builder {
    let mut builder = Database::builder();
    builder
        .set_concurrency_mode(ConcurrencyMode::MultiWriter)
        .set_cache_size(CACHE_BYTES);
    builder
}

/// A journal opened for reading and writing. Any number of processes may hold one at once.
///
/// Appends from any number of threads go through one queue to this handle's writer thread,
/// which commits everything waiting as one durable write transaction (group commit) and
/// answers each caller with its own result. Reads run beside it on snapshots.
pub struct Journal {
    shared: Arc<writer::Shared>,
    queue: Arc<Queue<writer::Request, writer::Answer>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("path", &self.shared.source.path())
            .field("writer", &self.shared.writer)
            .finish()
    }
}

impl Journal {
    /// Opens the journal at `path`, creating it (and its tables) if it does not exist.
    ///
    /// A journal of a newer format, or a file that is not a journal, is refused without
    /// writing anything. A journal file this call created is removed again if the open fails.
    pub fn open(path: impl AsRef<Path>) -> Result<Journal, OpenError> {
        Journal::open_with(
            Source::Path(path.as_ref().to_path_buf()),
            WriterOptions::default(),
        )
    }

    /// Opens a journal from `source` with these writer options.
    pub fn open_with(source: Source, options: WriterOptions) -> Result<Journal, OpenError> {
        let db = open_source(&source)?;
        if let Some(reserve) = &options.reserve {
            // Best effort: without room for it, the journal still works, only without slack.
            let _ = reserve.ensure();
        }
        let shared = Arc::new(writer::Shared::new(source, db, options));
        let queue = Arc::new(Queue::new(shared.options.queue_capacity));
        let thread = std::thread::Builder::new()
            .name("runjournal-writer".to_string())
            .spawn({
                let shared = Arc::clone(&shared);
                let queue = Arc::clone(&queue);
                move || writer::run(shared, queue)
            })
            .map_err(|source| OpenError::Io {
                path: PathBuf::from("<writer thread>"),
                source,
            })?;
        Ok(Journal {
            shared,
            queue,
            thread: Some(thread),
        })
    }

    /// The file this journal lives in.
    pub fn path(&self) -> &Path {
        self.shared.source.path()
    }

    /// This handle's writer id.
    pub fn writer(&self) -> WriterId {
        self.shared.writer
    }

    /// Counters of this handle's writer.
    pub fn writer_stats(&self) -> &WriterStats {
        &self.shared.stats
    }

    pub(crate) fn database(&self) -> Result<Arc<Database>, StorageFailure> {
        if let Some(db) = self.shared.database() {
            return Ok(db);
        }
        // The writer dropped a failed handle and has not reopened yet.
        Ok(Arc::new(open_source(&self.shared.source).map_err(
            |error| {
                StorageFailure::new(
                    "opening a handle to read",
                    redb::Error::Io(std::io::Error::other(error.to_string())),
                )
            },
        )?))
    }

    /// A consistent read view of the journal as of now.
    pub fn view(&self) -> Result<View, ReadError> {
        let db = self.database()?;
        match db.begin_read() {
            Ok(txn) => Ok(View::new(txn)),
            // The shared handle failed under a write; read through a handle of our own.
            Err(_) if matches!(self.shared.source, Source::Path(_)) => {
                let reader = JournalReader::open(self.path()).map_err(|error| {
                    StorageFailure::new(
                        "opening a read-only handle",
                        redb::Error::Io(std::io::Error::other(error.to_string())),
                    )
                })?;
                reader.view()
            }
            Err(error) => Err(StorageFailure::new("beginning a read", error).into()),
        }
    }

    /// Appends `events` to `run` as one batch, atomically and durably, if `condition` holds and
    /// every event passes [`crate::state::apply`]. Returns once the commit is durable.
    ///
    /// Waits while the append queue is full, and while the disk is full: a capacity error is
    /// retried until space returns. [`AppendError::Storage`] means the writer gave up on
    /// another kind of storage failure; the batch may or may not have landed.
    pub fn append(
        &self,
        run: RunId,
        events: Vec<Event>,
        condition: Condition,
    ) -> Result<Appended, AppendError> {
        self.submit(run, events, condition)?.wait()
    }

    /// Appends several batches, each as [`Journal::append`] would, and answers each with its
    /// own result, in the order given. They are queued together before any answer is awaited,
    /// so the writer commits them in as few transactions as its bounds allow: one caller can
    /// close a thousand runs at the cost of a few commits. A refused batch fails only itself;
    /// batches for the same run land in the order given.
    pub fn append_all(
        &self,
        batches: impl IntoIterator<Item = (RunId, Vec<Event>, Condition)>,
    ) -> Vec<Result<Appended, AppendError>> {
        let tickets: Vec<_> = batches
            .into_iter()
            .map(|(run, events, condition)| self.submit(run, events, condition))
            .collect();
        tickets
            .into_iter()
            .map(|ticket| ticket.and_then(queue::Ticket::wait))
            .collect()
    }

    fn submit(
        &self,
        run: RunId,
        events: Vec<Event>,
        condition: Condition,
    ) -> Result<queue::Ticket<writer::Answer>, AppendError> {
        let ticket = self
            .queue
            .submit(writer::Request {
                run,
                events,
                condition,
            })
            .map_err(|_| {
                AppendError::Storage(StorageFailure::new(
                    "queueing an append",
                    redb::Error::Io(std::io::Error::other("the journal is closing")),
                ))
            })?;
        self.shared
            .stats
            .submitted
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(ticket)
    }

    /// Commits `batches` in one durable write transaction on the calling thread, with the
    /// writer ids and writer seqs they carry, as the writer thread does when it retries a group
    /// after a reopen.
    ///
    /// It exists for tests: the model test (`tests/it/model.rs`) commits batches of its own
    /// writer and commits them again under the same writer seq, to check that a retry is
    /// recognised. A program appends with [`Journal::append`], which numbers its batches itself.
    #[doc(hidden)]
    pub fn commit_batches_for_tests(
        &self,
        batches: &[Batch],
    ) -> Result<Vec<Result<Appended, AppendError>>, StorageFailure> {
        let db = self.database()?;
        append::commit_batches(&db, batches)
    }

    /// Creates a run: appends its `RunCreated` under a fresh id.
    pub fn create_run(&self, spec: RunSpec, hosts: HostIds) -> Result<Appended, AppendError> {
        let run = RunId::generate();
        let event = Event::RunCreated {
            spec: Arc::new(spec),
            created_at_ms: event::now_ms(),
            session_id: hosts.session_id,
            completion_owner_id: hosts.completion_owner_id,
            tool_call_id: hosts.tool_call_id,
        };
        self.append(run, vec![event], Condition::expect_head(0))
    }

    /// Facts about the journal file.
    pub fn meta(&self) -> Result<JournalMeta, ReadError> {
        self.view()?.meta()
    }

    /// Runs redb's own integrity check (every page checksum, the allocator state) through a
    /// handle of its own. The journal must be a file.
    pub fn check_integrity(&self) -> Result<bool, StorageFailure> {
        let mut db = open_source(&self.shared.source).map_err(|error| {
            // An open that failed is not damage: keep its I/O error (ENOSPC, say).
            let source = match error {
                OpenError::Io { source, .. } => redb::Error::Io(source),
                OpenError::Storage(failure) => failure.source,
                other => redb::Error::Io(std::io::Error::other(other.to_string())),
            };
            StorageFailure::new("opening a handle for the integrity check", source)
        })?;
        db.check_integrity()
            .map_err(|error| StorageFailure::new("checking integrity", error))
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        // Appends already queued are still committed and answered before the thread ends.
        self.queue.close();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Opens (or creates) the database of a source.
pub(crate) fn open_source(source: &Source) -> Result<Database, OpenError> {
    match source {
        Source::Path(path) => open_database(path),
        Source::Backend { name, factory } => {
            let io_error = |source| OpenError::Io {
                path: name.clone(),
                source,
            };
            let backend = factory().map_err(io_error)?;
            discard_unfinished_creation(backend.as_ref()).map_err(io_error)?;
            let db = builder()
                .create_with_backend(BoxedBackend(backend))
                .map_err(|error| OpenError::from_database(name, error))?;
            initialize(name, &db)?;
            Ok(db)
        }
    }
}

/// A boxed backend, as redb takes backends by value.
#[derive(Debug)]
struct BoxedBackend(Box<dyn redb::StorageBackend>);

impl redb::StorageBackend for BoxedBackend {
    fn len(&self) -> Result<u64, std::io::Error> {
        self.0.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
        self.0.read(offset, out)
    }
    fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
        self.0.set_len(len)
    }
    fn sync_data(&self) -> Result<(), std::io::Error> {
        self.0.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
        self.0.write(offset, data)
    }
    fn close(&self) -> Result<(), std::io::Error> {
        self.0.close()
    }
    fn try_lock_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> Result<bool, redb::BackendError> {
        self.0.try_lock_range(start, end)
    }
    fn try_lock_shared_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> Result<bool, redb::BackendError> {
        self.0.try_lock_shared_range(start, end)
    }
    fn lock_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> Result<(), redb::BackendError> {
        self.0.lock_range(start, end)
    }
    fn lock_shared_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> Result<(), redb::BackendError> {
        self.0.lock_shared_range(start, end)
    }
    fn unlock_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> Result<(), redb::BackendError> {
        self.0.unlock_range(start, end)
    }
    fn query_lock_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> Result<bool, redb::BackendError> {
        self.0.query_lock_range(start, end)
    }
}

fn open_database(path: &Path) -> Result<Database, OpenError> {
    create_private_file(path)?;
    discard_unfinished_file(path)?;
    precheck_read_only(path)?;
    let db = builder()
        .create(path)
        .map_err(|error| OpenError::from_database(path, error))?;
    initialize(path, &db)?;
    Ok(db)
}

/// The bytes of redb's magic number, at the start of every database it finished creating.
const REDB_MAGIC_BYTES: usize = 9;

/// The largest file [`discard_unfinished_creation`] looks into: redb creates a database at a
/// few hundred KiB.
const UNFINISHED_CREATION_MAX_BYTES: u64 = 4 << 20;

/// [`discard_unfinished_creation`] on the journal file.
fn discard_unfinished_file(path: &Path) -> Result<(), OpenError> {
    let io_error = |source| OpenError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(io_error)?;
    let backend = redb::backends::FileBackend::new(file).map_err(|error| OpenError::Io {
        path: path.to_path_buf(),
        source: std::io::Error::other(error.to_string()),
    })?;
    let discarded = discard_unfinished_creation(&backend);
    let closed = redb::StorageBackend::close(&backend);
    discarded.and(closed).map_err(io_error)
}

/// Empties a file whose creation as a database never finished, so that the open creates it
/// anew instead of refusing it.
///
/// redb writes its magic number last when it creates a database, after the rest of the header
/// is durable, so that a crash (a power cut) mid-way never leaves a file that looks like a
/// database; but it then refuses any non-empty file without the magic number. A file that
/// holds nothing but a header without it is such a creation: nothing was ever committed to it.
/// The check is made under an exclusive lock on the header's first bytes, which a creator holds
/// (redb's header lock) until the magic number is written, so a creation under way in another
/// process is never mistaken for a dead one. Anything else (a file with other bytes past the
/// header, or another program's file) is left for the open to judge.
fn discard_unfinished_creation(backend: &dyn redb::StorageBackend) -> std::io::Result<()> {
    use std::ops::Bound;
    let has_unfinished_signature = |backend: &dyn redb::StorageBackend| -> std::io::Result<bool> {
        let len = backend.len()?;
        if len < REDB_MAGIC_BYTES as u64 || len > UNFINISHED_CREATION_MAX_BYTES {
            return Ok(false);
        }
        let mut magic = [0u8; REDB_MAGIC_BYTES];
        backend.read(0, &mut magic)?;
        if magic != [0u8; REDB_MAGIC_BYTES] {
            return Ok(false);
        }
        let header_end = (REDB_HEADER_BYTES as u64).min(len);
        let len = usize::try_from(len).map_err(|_| std::io::Error::other("file too large"))?;
        let mut rest = vec![0u8; len - header_end as usize];
        backend.read(header_end, &mut rest)?;
        Ok(rest.iter().all(|&byte| byte == 0))
    };
    if !has_unfinished_signature(backend)? {
        return Ok(());
    }
    let range = (Bound::Included(0), Bound::Excluded(REDB_MAGIC_BYTES as u64));
    match backend.lock_range(range.0, range.1) {
        Ok(()) => {}
        // Without locks we cannot tell a dead creation from a live one: leave it.
        Err(redb::BackendError::Unsupported) => return Ok(()),
        Err(error) => return Err(error.into()),
    }
    let emptied = has_unfinished_signature(backend).and_then(|is_unfinished| {
        if is_unfinished {
            backend.set_len(0)?;
            backend.sync_data()?;
        }
        Ok(())
    });
    let unlocked = backend
        .unlock_range(range.0, range.1)
        .map_err(std::io::Error::from);
    emptied.and(unlocked)
}

/// Refuses a file that is not a journal of our format through a read-only open, before the
/// read-write open, which rewrites redb's header even when we then refuse the file. A journal
/// that needs recovery cannot be opened read-only; the read-write open that follows recovers
/// it and checks it again.
fn precheck_read_only(path: &Path) -> Result<(), OpenError> {
    let is_empty = std::fs::metadata(path)
        .map(|metadata| metadata.len() == 0)
        .map_err(|source| OpenError::Io {
            path: path.to_path_buf(),
            source,
        })?;
    if is_empty {
        return Ok(());
    }
    let db = match builder().open_read_only(path) {
        Ok(db) => db,
        Err(redb::DatabaseError::RepairAborted) => return Ok(()),
        Err(error) => return Err(OpenError::from_database(path, error)),
    };
    let txn = db
        .begin_read()
        .map_err(|error| StorageFailure::new("beginning a read", error))?;
    match read_format_version(path, &txn)? {
        Some(version) => check_format_version(path, version),
        None => {
            let has_tables = txn
                .list_tables()
                .map_err(|error| StorageFailure::new("listing tables", error))?
                .next()
                .is_some();
            if has_tables {
                Err(OpenError::NotAJournal {
                    path: path.to_path_buf(),
                    reason: "a redb database without runjournal's meta table".to_string(),
                })
            } else {
                Ok(())
            }
        }
    }
}

/// Creates `path` empty and 0600 if it does not exist, so redb initializes a file only its
/// owner can read.
fn create_private_file(path: &Path) -> Result<(), OpenError> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(source) => Err(OpenError::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Checks the format version and creates the tables of a new journal. A journal that is
/// already set up is only read, so opening costs no commit.
fn initialize(path: &Path, db: &Database) -> Result<(), OpenError> {
    let txn = db
        .begin_read()
        .map_err(|error| StorageFailure::new("beginning a read", error))?;
    if let Some(version) = read_format_version(path, &txn)? {
        return check_format_version(path, version);
    }
    drop(txn);
    let mut txn = db
        .begin_write()
        .map_err(|error| StorageFailure::new("beginning the set-up write", error))?;
    txn.set_durability(redb::Durability::Immediate)
        .map_err(|error| StorageFailure::new("setting durability", redb::Error::from(error)))?;
    {
        let mut meta = txn
            .open_table(tables::META)
            .map_err(|error| StorageFailure::new("creating the meta table", error))?;
        // Another process may have set the journal up since our read.
        let existing = meta
            .get(tables::META_FORMAT_VERSION)
            .map_err(|error| StorageFailure::new("reading the format version", error))?
            .map(|value| value.value().to_vec());
        match existing {
            Some(bytes) => {
                let version = parse_format_version(path, &bytes)?;
                check_format_version(path, version)?;
            }
            None => {
                let has_foreign_tables = txn
                    .list_tables()
                    .map_err(|error| StorageFailure::new("listing tables", error))?
                    .any(|table| table.name() != tables::META.name());
                if has_foreign_tables {
                    return Err(OpenError::NotAJournal {
                        path: path.to_path_buf(),
                        reason: "a redb database without runjournal's meta table".to_string(),
                    });
                }
                let journal_id: [u8; 16] = rand::random();
                let created_at = event::now_ms().to_be_bytes();
                let version = FORMAT_VERSION.to_be_bytes();
                for (key, value) in [
                    (tables::META_FORMAT_VERSION, &version[..]),
                    (tables::META_JOURNAL_ID, &journal_id[..]),
                    (tables::META_CREATED_AT, &created_at[..]),
                ] {
                    meta.insert(key, value)
                        .map_err(|error| StorageFailure::new("writing meta", error))?;
                }
            }
        }
    }
    append::create_tables(&txn)?;
    txn.commit()
        .map_err(|error| StorageFailure::new("committing the set-up", error))?;
    Ok(())
}

fn read_format_version(path: &Path, txn: &redb::ReadTransaction) -> Result<Option<u16>, OpenError> {
    let meta = match txn.open_table(tables::META) {
        Ok(meta) => meta,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(error) => return Err(StorageFailure::new("opening the meta table", error).into()),
    };
    let value = meta
        .get(tables::META_FORMAT_VERSION)
        .map_err(|error| StorageFailure::new("reading the format version", error))?;
    match value {
        None => Ok(None),
        Some(bytes) => Ok(Some(parse_format_version(path, bytes.value())?)),
    }
}

fn parse_format_version(path: &Path, bytes: &[u8]) -> Result<u16, OpenError> {
    let bytes: [u8; 2] = bytes.try_into().map_err(|_| OpenError::Corrupt {
        path: path.to_path_buf(),
        reason: format!("format version entry has {} bytes, not 2", bytes.len()),
    })?;
    Ok(u16::from_be_bytes(bytes))
}

fn check_format_version(path: &Path, version: u16) -> Result<(), OpenError> {
    if version > FORMAT_VERSION {
        return Err(OpenError::NewerFormat {
            path: path.to_path_buf(),
            found: version,
        });
    }
    if version < FORMAT_VERSION {
        // There has been only one format so far; a smaller number is damage, not history.
        return Err(OpenError::Corrupt {
            path: path.to_path_buf(),
            reason: format!("format version {version} was never written by runjournal"),
        });
    }
    Ok(())
}

/// A journal opened read-only: sees the commits of live writers, never writes.
pub struct JournalReader {
    path: PathBuf,
    db: redb::ReadOnlyDatabase,
}

impl JournalReader {
    /// Opens an existing journal read-only.
    pub fn open(path: impl AsRef<Path>) -> Result<JournalReader, OpenError> {
        let path = path.as_ref();
        if let Err(source) = std::fs::metadata(path) {
            return Err(OpenError::Io {
                path: path.to_path_buf(),
                source,
            });
        }
        let db = builder()
            .open_read_only(path)
            .map_err(|error| OpenError::from_database(path, error))?;
        let txn = db
            .begin_read()
            .map_err(|error| StorageFailure::new("beginning a read", error))?;
        match read_format_version(path, &txn)? {
            Some(version) => check_format_version(path, version)?,
            None => {
                return Err(OpenError::NotAJournal {
                    path: path.to_path_buf(),
                    reason: "no runjournal meta table".to_string(),
                });
            }
        }
        drop(txn);
        Ok(JournalReader {
            path: path.to_path_buf(),
            db,
        })
    }

    /// The file this journal lives in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A consistent read view of the journal as of now.
    pub fn view(&self) -> Result<View, ReadError> {
        let txn = self
            .db
            .begin_read()
            .map_err(|error| StorageFailure::new("beginning a read", error))?;
        Ok(View::new(txn))
    }
}

/// Anything the journal can be read through: a [`Journal`], a [`JournalReader`], or a tool's
/// own source of views. Projections and verification read through it.
pub trait ReadJournal {
    fn view(&self) -> Result<View, ReadError>;
}

impl ReadJournal for Journal {
    fn view(&self) -> Result<View, ReadError> {
        Journal::view(self)
    }
}

impl ReadJournal for JournalReader {
    fn view(&self) -> Result<View, ReadError> {
        JournalReader::view(self)
    }
}

#[cfg(test)]
mod tests;
