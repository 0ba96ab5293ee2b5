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
    /// A read past the end of the file is corruption, not an I/O error: the file is shorter
    /// than its own pages say ([`past_the_end`]); so is a table whose stored definition is not
    /// the one this format made it with. The same bytes fail the same way again.
    pub(crate) fn new(op: &'static str, source: impl Into<redb::Error>) -> StorageFailure {
        let source = match source.into() {
            redb::Error::Io(error) if past_the_end(&error) => {
                redb::Error::Corrupted(past_the_end_reason(&error))
            }
            // The journal's tables are made by this format with these definitions: a stored
            // definition that differs is bytes that changed under it, and the same bytes
            // fail the same way again.
            source @ (redb::Error::TableTypeMismatch { .. }
            | redb::Error::TypeDefinitionChanged { .. }
            | redb::Error::TableIsMultimap(_)
            | redb::Error::TableIsNotMultimap(_)) => {
                redb::Error::Corrupted(format!("a table's stored definition changed ({source})"))
            }
            source => source,
        };
        StorageFailure { op, source }
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
    /// same operation, the same OS error number where there is one, corruption still
    /// corruption (so the copy is classed as the original: damage is never retried), the same
    /// message.
    pub(crate) fn duplicate(&self) -> StorageFailure {
        if let redb::Error::Corrupted(reason) = &self.source {
            return StorageFailure::new(self.op, redb::Error::Corrupted(reason.clone()));
        }
        let error = match self.io_error().and_then(std::io::Error::raw_os_error) {
            Some(code) => std::io::Error::from_raw_os_error(code),
            None => std::io::Error::other(self.source.to_string()),
        };
        StorageFailure::new(self.op, redb::Error::Io(error))
    }

    /// Whether redb found the file's bytes corrupt (a checksum, a commit slot): damage, never
    /// retried.
    pub fn is_damage(&self) -> bool {
        matches!(self.source, redb::Error::Corrupted(_))
    }

    /// The I/O error underneath, if the failure was one.
    pub fn io_error(&self) -> Option<&std::io::Error> {
        match &self.source {
            redb::Error::Io(error) => Some(error),
            _ => None,
        }
    }
}

/// A panic caught inside a call into redb (`journal::file`'s containment): what it
/// said and where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("redb panicked: {message}")]
pub struct StoragePanic {
    /// The panic's message and the source line it came from, bounded.
    pub message: String,
}

/// The journal file is damaged: redb panicked on its bytes while runjournal was `during`
/// something. Never retried: the same bytes make the same panic. The journal is left as it is;
/// `journal-tools inspect verify` says what is damaged, and `journal-tools recover
/// --from-projections` rebuilds the journal from the runs' events.jsonl, moving this file
/// aside.
///
/// Wrapped, transparently, in the error families (`OpenError::Damaged`, `ReadError::Damaged`,
/// `AppendError::Damaged`), so its [`StoragePanic`] is in every error chain that holds it,
/// however it is wrapped ([`is_damage`] looks for it there).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "journal {} is damaged: redb failed while {during} ({REMEDY})",
    .path.display()
)]
pub struct Damaged {
    /// The journal file (for a journal on another backend, its name).
    pub path: PathBuf,
    /// What runjournal was doing: "opening the journal", "reading runs", "committing".
    pub during: &'static str,
    #[source]
    pub panic: StoragePanic,
}

impl Damaged {
    pub(crate) fn new(path: &Path, during: &'static str, panic: StoragePanic) -> Damaged {
        Damaged {
            path: path.to_path_buf(),
            during,
            panic,
        }
    }
}

/// The exit code of a process that stops on a damaged, lost or unknown journal: every command
/// of both binaries, and a runner ([`is_damage`] is the rule).
pub const DAMAGE_EXIT_CODE: u8 = 4;

/// A process this one started stopped on the journal as damaged: it exited with
/// [`DAMAGE_EXIT_CODE`] (a runner before taking its run). Its launcher reports the damage as
/// its own, though it may not have met it: the damaged page may be one only the runner read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "journal {} is damaged: {by} stopped on it ({REMEDY})",
    .path.display()
)]
pub struct DamageReported {
    /// The journal file.
    pub path: PathBuf,
    /// Who stopped on it, and where it said why: "its runner (see …/runner.log)".
    pub by: String,
}

/// Whether any link of `error`'s chain says the journal is damaged ([`is_damage`]).
pub fn is_damage_in_chain(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(error);
    while let Some(error) = cause {
        if is_damage(error) {
            return true;
        }
        cause = error.source();
    }
    false
}

/// Whether `cause`, one link of an error chain, says the journal is damaged, lost or of an
/// unknown format: a panic redb met on its bytes ([`Damaged`]), bytes redb or runjournal found
/// corrupt, a process that stopped on such a journal ([`DamageReported`]), a file that is not
/// a journal, a journal lost beside runs, one of a newer format. Both binaries exit 4 for such an error (docs/design.md, "Failures and guarantees"); walk a
/// chain with `error.chain().any(is_damage)`.
pub fn is_damage(cause: &(dyn std::error::Error + 'static)) -> bool {
    if cause.is::<StoragePanic>()
        || cause.is::<Damaged>()
        || cause.is::<DamageReported>()
        || cause.is::<CorruptError>()
    {
        return true;
    }
    // Transparent wrappers hand on their source, so redb's own word may be all a chain holds.
    if let Some(redb::Error::Corrupted(_)) = cause.downcast_ref::<redb::Error>() {
        return true;
    }
    if let Some(error) = cause.downcast_ref::<OpenError>() {
        return error.is_damage();
    }
    if let Some(error) = cause.downcast_ref::<ReadError>() {
        return error.is_damage();
    }
    if let Some(error) = cause.downcast_ref::<AppendError>() {
        return error.is_damage();
    }
    cause
        .downcast_ref::<StorageFailure>()
        .is_some_and(StorageFailure::is_damage)
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
    #[error("journal {path} is corrupt: {reason} ({REMEDY})")]
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
        "journal {path} is {found}, but the home holds {}: it was lost, and nothing was changed; rebuild it from the runs' events.jsonl with `journal-tools {home_args}recover --from-projections` (which moves the damaged file aside)",
        held_text(*.runs, *.results)
    )]
    Lost {
        path: PathBuf,
        found: FileFinding,
        /// Run directories in the home.
        runs: usize,
        /// Result files in the home.
        results: usize,
        /// The arguments that name this home to `journal-tools` (`--home DIR `, and the layout
        /// when it is not runjournal's own), with a space after them.
        home_args: String,
    },
    #[error(transparent)]
    Storage(#[from] StorageFailure),
    /// The journal file, or a directory of its home, is not safe to trust: another user owns
    /// it or may write it, or it is a link (see [`crate::durable_fs::judge_private`]).
    #[error("refusing an unsafe home: {0}")]
    Unsafe(crate::durable_fs::UnsafePath),
    /// redb panicked on the file's bytes while opening it.
    #[error(transparent)]
    Damaged(Damaged),
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
    /// Whether the journal is damaged, lost, not a journal or of a newer format (see
    /// [`is_damage`]).
    pub fn is_damage(&self) -> bool {
        match self {
            OpenError::NotAJournal { .. }
            | OpenError::NewerFormat { .. }
            | OpenError::Corrupt { .. }
            | OpenError::Lost { .. }
            | OpenError::Damaged(_) => true,
            OpenError::Storage(failure) => failure.is_damage(),
            _ => false,
        }
    }

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
            redb::DatabaseError::Storage(redb::StorageError::Io(source))
                if past_the_end(&source) =>
            {
                OpenError::Corrupt {
                    path,
                    reason: past_the_end_reason(&source),
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

/// What to do about a damaged journal, as every report of damage ends.
const REMEDY: &str = "see what is damaged with `journal-tools inspect verify`; rebuild the journal from the runs' events.jsonl with `journal-tools recover --from-projections`, which keeps the damaged file aside";

/// The journal at `path` is damaged, and what to do: for a report of damage met past the
/// open (a read that reached a damaged page), which names neither.
pub fn damage_advice(path: &Path) -> String {
    format!("journal {} is damaged ({REMEDY})", path.display())
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
    /// redb panicked on the journal's bytes: the batch may or may not have landed (a panic in
    /// the commit itself), and the handle writes no more (its writer has stopped).
    #[error(transparent)]
    Damaged(Damaged),
}

impl AppendError {
    /// Whether the journal is damaged (see [`is_damage`]).
    pub fn is_damage(&self) -> bool {
        match self {
            AppendError::Damaged(_) | AppendError::Corrupt(_) => true,
            AppendError::Storage(failure) => failure.is_damage(),
            _ => false,
        }
    }
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
    /// A run's dependencies are judged with its admission (docs/design.md, "Dependencies"):
    /// a dependency that is not in the journal.
    #[error("dependency {dependency} is not in the journal")]
    UnknownDependency { dependency: RunId },
    /// A dependency has yet to end.
    #[error("dependency {dependency} has not ended yet")]
    DependencyNotEnded { dependency: RunId },
    /// A dependency the run needs `complete` ended otherwise.
    #[error("dependency {dependency} ended {state}, not complete")]
    DependencyFailed { dependency: RunId, state: String },
    /// A run launched once (docs/design.md, "Launched once"): another run holds its key.
    #[error("run {holder} holds the key {key:?}")]
    UniqueHeld { key: String, holder: RunId },
}

impl From<ReadError> for AppendError {
    fn from(error: ReadError) -> AppendError {
        match error {
            ReadError::Corrupt(error) => AppendError::Corrupt(error),
            ReadError::Storage(failure) => AppendError::Storage(failure),
            ReadError::Damaged(damaged) => AppendError::Damaged(damaged),
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
    /// redb panicked on the journal's bytes while reading.
    #[error(transparent)]
    Damaged(Damaged),
}

impl ReadError {
    /// Whether the journal is damaged (see [`is_damage`]).
    pub fn is_damage(&self) -> bool {
        match self {
            ReadError::Damaged(_) | ReadError::Corrupt(_) => true,
            ReadError::Storage(failure) => failure.is_damage(),
        }
    }
}

/// Whether redb's read of the journal ended at the file's end before the bytes it wanted: its
/// header or a page points past the end of the file, so the file is damaged (or was cut), and
/// reading it again ends there again. A journal file is always a regular file (never a pipe
/// or a device), so this is never a short read that clears by retrying.
fn past_the_end(error: &std::io::Error) -> bool {
    error.kind() == std::io::ErrorKind::UnexpectedEof
}

fn past_the_end_reason(error: &std::io::Error) -> String {
    format!("a page lies past the end of the file ({error})")
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression (a fuzz find): a page past the end of a damaged journal made redb's open
    /// fail with "failed to fill whole buffer", an I/O error, so recovery called the journal
    /// unjudgeable and rebuilt nothing, and a commit would have retried it for its window.
    #[test]
    fn a_read_past_the_end_of_the_file_is_damage_never_retried() {
        let eof = || std::io::Error::from(std::io::ErrorKind::UnexpectedEof);
        let failure = StorageFailure::new("reading runs", redb::Error::Io(eof()));
        assert!(failure.is_damage(), "{failure}");
        assert_eq!(failure.class(), crate::capacity::FailureClass::NotStorage);
        assert!(failure.duplicate().is_damage());

        let opened = OpenError::from_database(
            Path::new("journal.redb"),
            redb::DatabaseError::Storage(redb::StorageError::Io(eof())),
        );
        assert!(
            matches!(&opened, OpenError::Corrupt { reason, .. } if reason.contains("past the end")),
            "{opened:?}"
        );
        assert!(opened.is_damage());

        let other = StorageFailure::new(
            "reading runs",
            redb::Error::Io(std::io::Error::from_raw_os_error(5)),
        );
        assert!(!other.is_damage(), "an OS error is no damage: {other}");
    }

    /// Regression (a fuzz find): a damaged page made a table's stored definition differ from
    /// ours ("Current definition of () does not match stored definition"); the copy handed to
    /// each caller of the group was an I/O error without an errno, retried for the window.
    #[test]
    fn a_table_whose_stored_definition_changed_is_damage_never_retried() {
        let failure = StorageFailure::new(
            "opening tables",
            redb::Error::TableIsMultimap("records".to_string()),
        );
        assert!(failure.is_damage(), "{failure}");
        let copy = failure.duplicate();
        assert!(copy.is_damage(), "{copy}");
        assert_eq!(copy.class(), crate::capacity::FailureClass::NotStorage);
    }

    /// The copy each caller of a failed group gets used to turn redb's "corrupted" into an I/O
    /// error without an errno, which the writer retries for its whole window: a damaged
    /// journal made `run` wait ten minutes (the fuzz target `damaged_journal` found it).
    #[test]
    fn a_copy_of_a_corruption_is_still_damage_and_never_retried() {
        let failure = StorageFailure::new("committing", redb::Error::Corrupted("bad".to_string()));
        let copy = failure.duplicate();
        assert!(copy.is_damage(), "{copy}");
        assert_eq!(copy.class(), crate::capacity::FailureClass::NotStorage);
        assert_eq!(copy.to_string(), failure.to_string());

        let io = StorageFailure::new(
            "committing",
            redb::Error::Io(std::io::Error::from_raw_os_error(5)),
        );
        assert_eq!(
            io.duplicate().class(),
            io.class(),
            "an OS error keeps its class"
        );
    }

    /// Transparent wrappers hand on their source, so the panic (or redb's own "corrupted") is
    /// what a chain holds: both are damage wherever they are found.
    #[test]
    fn damage_is_found_in_a_chain_however_it_is_wrapped() {
        let damaged = Damaged::new(
            Path::new("/h/journal.redb"),
            "reading runs",
            StoragePanic {
                message: "index out of bounds".to_string(),
            },
        );
        let read = ReadError::Damaged(damaged.clone());
        let append = AppendError::from(read);
        let chain: Vec<&(dyn std::error::Error + 'static)> = std::iter::successors(
            Some(&append as &(dyn std::error::Error + 'static)),
            |error| error.source(),
        )
        .collect();
        assert!(chain.iter().any(|cause| is_damage(*cause)));
        assert!(chain.iter().any(|cause| cause.is::<StoragePanic>()));
        assert!(
            append
                .to_string()
                .contains("journal /h/journal.redb is damaged")
        );
        assert!(
            append
                .to_string()
                .contains("journal-tools recover --from-projections")
        );
        let corrupted = redb::Error::Corrupted("slot".to_string());
        assert!(is_damage(&corrupted));
        let io = redb::Error::Io(std::io::Error::from_raw_os_error(5));
        assert!(!is_damage(&io), "an I/O error is no damage");
    }
}
