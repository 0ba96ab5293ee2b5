//! The journal: one redb file holding every run's records, their folded snapshots and the
//! indexes over them.
//!
//! Invariants:
//! * a record is acknowledged only when the write transaction holding it committed with
//!   `Durability::Immediate`;
//! * every record of a run passed [`crate::state::apply`] against the snapshot committed with
//!   the record before it, and the snapshot stored beside the records is their fold (a cache:
//!   one that does not decode is re-derived from the records, never an error);
//! * a batch carries (writer id, writer seq); a batch whose writer seq is not above the writer's
//!   committed mark was already applied and is answered from the records, never applied twice.
//!
//! Parts: [`Journal`] (`handle`: a read-write handle and its writer thread, `queue` and
//! `writer`: group commit; `share`: commits shared across processes through a commit
//! leader), `append` (one write transaction of batches), `read` ([`View`]: one
//! read transaction), `reader` ([`JournalReader`], [`ReadJournal`]), `open` (opening, format
//! checks, an unfinished creation), `examine` (what a journal file holds, before opening it), `snapshot` (the snapshot codec), `compact` (shrinking the file), `prune` (pruning ended runs, tombstones, the retention policy), `tables` (tables and key
//! encoding), `copy` ([`copy_consistent`]), `error` (the error families), `backend` (a boxed
//! redb backend), `instrumented` (a counting backend for tests and benchmarks).

mod append;
mod backend;
pub mod compact;
mod copy;
mod error;
pub mod examine;
mod handle;
#[doc(hidden)]
pub mod instrumented;
pub mod lock_wait;
mod open;
pub mod prune;
mod queue;
mod read;
mod reader;
pub mod rebuild;
pub mod share;
pub(crate) mod snapshot;
pub(crate) mod tables;
pub mod writer;

pub use append::{Appended, Batch, Condition};
pub use copy::{COPY_ATTEMPTS, CopyError, copy_consistent};
pub use error::{
    AppendError, CorruptError, OpenError, QueueRefusal, ReadError, ResumeRefusal, StorageFailure,
};
pub use examine::{FileFinding, check_home_journal, examine};
pub use handle::Journal;
pub use read::{JournalMeta, QueueEntry, QueueUsage, ResolveError, ResumeLinks, View};
pub use reader::{JournalReader, ReadJournal};
pub use share::CommitSharing;
pub use snapshot::{SNAPSHOT_LAYOUT, SnapshotError};
pub use tables::{name_alias, tool_call_alias};
pub use writer::{CapacityEvent, CapacityListener, Source, WriterOptions, WriterStats};

#[cfg(test)]
mod tests;
