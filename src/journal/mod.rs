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
//! Laid out by job, each folder using only those before it (`tests/it/layers.rs` checks it):
//! * `format`: the tables and their keys, the encodings of snapshots, the retention policy and
//!   tombstones, and the error families;
//! * `file`: where the bytes live ([`Location`]), opening, examining, copying and compacting
//!   the file, redb's write lock, storage backends, and containing redb's panics on damaged
//!   bytes (every call into redb that touches the file is made inside it: see [`Damaged`]);
//! * `read`: [`View`] (one read transaction) and [`JournalReader`];
//! * `write`: judging and applying batches in a write transaction, the queue of appends, the
//!   commit step, a handle's options, pruning and rebuilding;
//! * `share`: commits shared across processes through a commit leader;
//! * `handle`: [`Journal`], a read-write handle, and its writer thread.

pub(crate) mod file;
pub(crate) mod format;
pub(crate) mod handle;
pub(crate) mod read;
pub mod share;
pub(crate) mod write;

pub use file::copy::{COPY_ATTEMPTS, CopyError, copy_consistent};
pub use file::examine::{check_home_journal, examine};
pub use file::marker::{damage_marker_path, mark_damaged};
pub use file::{BackendFactory, Location, compact, examine, instrumented, lock_wait};
pub use format::error::{
    AppendError, CorruptError, DAMAGE_EXIT_CODE, DamageReported, Damaged, FileFinding,
    Inconsistency, LockHeld, OpenError, QueueRefusal, ReadError, ResumeRefusal, StorageFailure,
    StoragePanic, damage_advice, is_damage, is_damage_in_chain,
};
pub use format::recovery::{LostFact, QueueLimitChoice, RecoveryNote};
pub use format::retention::{ClockAnchor, KeepFree, MAX_TOMBSTONES, Retention, Tombstone};
pub use format::snapshot::{SNAPSHOT_LAYOUT, SnapshotError};
pub use format::tables::{name_alias, tool_call_alias};
pub use handle::{Creation, Journal};
pub use read::reader::{JournalReader, ReadJournal};
pub use read::view::{JournalMeta, QueueEntry, QueueUsage, ResolveError, ResumeLinks, View};
pub use write::append::{Appended, Batch, Condition};
pub use write::commit::{RETRY_DELAYS_MS, STOP_IN_COMMIT_ENV, WriterStats};
pub use write::options::{
    CapacityEvent, CapacityListener, CommitSharing, DEFAULT_LEADER_TIMEOUT, LEADER_TIMEOUT_ENV,
    WriterOptions, leader_timeout_from_env,
};
pub use write::{prune, rebuild};

#[cfg(test)]
mod tests;
