//! The journal's error families: storage failures, and why an open, an append or a read
//! failed.

use std::path::{Path, PathBuf};

use super::snapshot::SnapshotError;
use crate::event::{DecodeError, EncodeError, FORMAT_VERSION, RunId, UnixMs, WriterId};
use crate::state::{RunStatus, ShapeError, TransitionError};

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

    /// How the failure is ridden out: capacity, another storage error, or not about storage
    /// ([`crate::capacity::classify_redb`]).
    pub fn class(&self) -> crate::capacity::FailureClass {
        crate::capacity::classify_redb(&self.source)
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
    /// Another process held the journal's write lock (which opening takes for a moment) for
    /// longer than this handle waits (a command's bound).
    #[error("cannot open the journal: {0}")]
    WriteLockHeld(LockHeld),
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
    /// The journal file is gone, empty, zeroed, cut short or not a database, while the home
    /// holds runs or results: it was lost, and opening it would make a new, empty journal
    /// over the history. Nothing was changed.
    #[error(
        "journal {path} is {found}, but the home holds {}: it was lost, and nothing was changed; rebuild it from the runs' events.jsonl with `journal-tools recover --from-projections` (which moves the damaged file aside)",
        held_text(*.runs, *.results)
    )]
    Lost {
        path: PathBuf,
        found: FileFinding,
        /// Run directories in the home.
        runs: usize,
        /// Result files in the home.
        results: usize,
    },
    #[error(transparent)]
    Storage(#[from] StorageFailure),
    /// The journal file, or a directory of its home, is not safe to trust: another user owns
    /// it or may write it, or it is a link (see [`crate::durable_fs::judge_private`]).
    #[error("refusing an unsafe home: {0}")]
    Unsafe(crate::durable_fs::UnsafePath),
}

/// "3 runs and 1 result".
fn held_text(runs: usize, results: usize) -> String {
    let count = |n: usize, what: &str| {
        if n == 1 {
            format!("1 {what}")
        } else {
            format!("{n} {what}s")
        }
    };
    match (runs, results) {
        (_, 0) => count(runs, "run"),
        (0, _) => count(results, "result"),
        _ => format!("{} and {}", count(runs, "run"), count(results, "result")),
    }
}

impl OpenError {
    /// An I/O error at `path`, or the [`crate::durable_fs::UnsafePath`] it carries.
    pub fn from_io(path: &Path, source: std::io::Error) -> OpenError {
        match crate::durable_fs::UnsafePath::of(&source) {
            Some(unsafe_path) => OpenError::Unsafe(unsafe_path.clone()),
            None => OpenError::Io {
                path: path.to_path_buf(),
                source,
            },
        }
    }

    pub(crate) fn from_database(path: &Path, error: redb::DatabaseError) -> OpenError {
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
    /// Another process held the journal's write lock for longer than this handle waits (a
    /// command's bound): nothing was written.
    #[error("{0}; nothing was written")]
    WriteLockHeld(LockHeld),
    /// The batch was handed to the journal's commit leader, and this handle stopped waiting
    /// for its answer at its bound, the journal's write lock being held all the while (by the
    /// leader itself, or by another process the leader waits for): the leader may still commit
    /// it once the lock is let go, or may not. Whether it was recorded is unknown.
    #[error(
        "run {run}: {held}; the batch was handed to the commit leader, which may still commit it: whether it was recorded is unknown"
    )]
    Uncertain { run: RunId, held: LockHeld },
    /// The batch records that `run` resumes `from`, which the journal does not allow as it
    /// stands in the transaction that would link them (another run's state: not judged from
    /// the batch's run alone).
    #[error("run {run} cannot resume run {from}: {refusal}")]
    Resume {
        run: RunId,
        from: RunId,
        refusal: ResumeRefusal,
    },
    /// The batch joins or takes a slot of a queue, and the queue, as this transaction sees it,
    /// does not allow it: nothing was written.
    #[error("run {run}: {refusal}")]
    Queue { run: RunId, refusal: QueueRefusal },
    /// A check of what the journal itself stored failed while the batch was judged: the run's
    /// stored state is not one the journal writes (damage, a snapshot left behind its records,
    /// a fault in this build). Kept on in every build; nothing was written.
    #[error(
        "run {run}: {broken}; the batch was refused and nothing was written (`journal-tools verify` examines the journal)"
    )]
    Inconsistent { run: RunId, broken: Inconsistency },
    /// The journal's writer gave this batch no answer of its own (a fault in this build): it
    /// may or may not have landed. Read the run before appending again.
    #[error(
        "run {run}: the journal's writer gave no answer for this batch, which may or may not have landed; read the run before appending again"
    )]
    Unanswered { run: RunId },
}

/// What [`AppendError::Inconsistent`] found.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Inconsistency {
    /// A record is already stored under the seq the batch would take: the run's snapshot is
    /// behind its records, and writing would replace a record.
    #[error("its record {seq} is already stored, though its snapshot's head is {head}")]
    SeqTaken { head: u64, seq: u64 },
    /// Applying a record did not move the head to the record's seq.
    #[error("record {seq} left the head at {found}, not at its seq")]
    HeadNotAdvanced { seq: u64, found: u64 },
    /// The state after the batch is not one a snapshot may hold.
    #[error("the state after the batch has no snapshot's shape: {0}")]
    Shape(ShapeError),
    /// The batch would give the run a slot of its queue without the admission that is judged
    /// against the queue's limit.
    #[error("the batch would take a slot of queue {queue} without an admission")]
    SlotWithoutAdmission { queue: String },
}

/// Why a run cannot be resumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ResumeRefusal {
    #[error("it is not in the journal")]
    Unknown,
    #[error("it is {state}; only a paused run can be resumed")]
    NotPaused { state: RunStatus },
    #[error("it was already resumed by run {by}")]
    AlreadyResumed { by: RunId },
}

/// Why a queue refused a run: judged inside the write transaction, against the journal's
/// queue indexes, so two processes racing for the last slot cannot both win.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[non_exhaustive]
pub enum QueueRefusal {
    #[error(
        "queue {queue} has no limit set (set one with `runjournal queue {queue} --max-active N`)"
    )]
    NoSuchQueue { queue: String },
    #[error("queue {queue} is full: {active} of {max_active} active")]
    Full {
        queue: String,
        active: u64,
        max_active: u64,
    },
    #[error("run {first} waits before it in queue {queue}")]
    NotFirst { queue: String, first: RunId },
}

impl From<ReadError> for AppendError {
    fn from(error: ReadError) -> AppendError {
        match error {
            ReadError::Corrupt(error) => AppendError::Corrupt(error),
            ReadError::Storage(failure) => AppendError::Storage(failure),
        }
    }
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
    /// The run's snapshot does not decode (a cache, re-derived from the records), and the
    /// records do not fold either.
    #[error(
        "run {run}: its snapshot is unreadable ({snapshot}), and its record {seq} does not fold: {source}"
    )]
    Unfoldable {
        run: RunId,
        seq: u64,
        snapshot: SnapshotError,
        /// Boxed: it is large, and every read's error carries this enum.
        #[source]
        source: Box<TransitionError>,
    },
    /// The run's snapshot does not decode, and it has no records to re-derive it from.
    #[error("run {run}: its snapshot is unreadable ({snapshot}), and it has no records")]
    NoRecords { run: RunId, snapshot: SnapshotError },
    #[error("meta entry {key}: {reason}")]
    Meta { key: &'static str, reason: String },
    #[error("the tombstone of pruned run {run}: {source}")]
    Tombstone {
        run: RunId,
        #[source]
        source: DecodeError,
    },
    #[error("index {table}: {reason}")]
    Index { table: &'static str, reason: String },
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

/// Wraps a redb error with what we were doing, for `map_err`.
pub(crate) fn storage<E: Into<redb::Error>>(op: &'static str) -> impl FnOnce(E) -> StorageFailure {
    move |error| StorageFailure::new(op, error)
}

/// What a journal file was found to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileFinding {
    Missing,
    Empty,
    /// Every byte is zero.
    Zeroed {
        bytes: u64,
    },
    /// Bytes that do not start with redb's magic number (another program's file, a creation
    /// cut short, or damage).
    NotRedb {
        bytes: u64,
    },
    /// redb's magic number, but fewer bytes than its header describes.
    Truncated {
        bytes: u64,
        expected_bytes: u64,
    },
    /// A redb database as far as its length and header tell; redb judges the rest.
    Plausible,
}

impl FileFinding {
    /// Whether the file is certainly not a journal that can be opened: everything but
    /// [`FileFinding::Plausible`].
    pub fn is_lost(&self) -> bool {
        !matches!(self, FileFinding::Plausible)
    }
}

impl std::fmt::Display for FileFinding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FileFinding::Missing => f.write_str("missing"),
            FileFinding::Empty => f.write_str("empty (0 bytes)"),
            FileFinding::Zeroed { bytes } => write!(f, "zero-filled ({bytes} bytes, all zero)"),
            FileFinding::NotRedb { bytes } => write!(
                f,
                "not a redb database ({bytes} bytes that do not start with redb's magic number)"
            ),
            FileFinding::Truncated {
                bytes,
                expected_bytes,
            } => write!(
                f,
                "truncated ({bytes} bytes of the {expected_bytes} its header describes)"
            ),
            FileFinding::Plausible => f.write_str("a redb database"),
        }
    }
}

/// Another process has held the journal's write lock for a while.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockHeld {
    /// Since when this process has waited.
    pub since_ms: UnixMs,
    /// The process holding the lock, where it could be found: its pid and command name.
    pub holder: Option<(u32, String)>,
}

impl std::fmt::Display for LockHeld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let since = jiff::Timestamp::from_millisecond(self.since_ms as i64)
            .map(|at| at.strftime("%Y-%m-%d %H:%M:%S UTC").to_string())
            .unwrap_or_else(|_| format!("{} ms", self.since_ms));
        match &self.holder {
            Some((pid, name)) => write!(
                f,
                "the journal's write lock is held by process {pid} ({name}), which has not \
                 let it go since {since} (is it stopped?)"
            ),
            None => write!(
                f,
                "the journal's write lock is held by another process, which has not let it go \
                 since {since} (is it stopped?)"
            ),
        }
    }
}
