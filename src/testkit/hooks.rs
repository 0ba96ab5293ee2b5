//! What tests reach inside the library for, and a program never needs: the snapshot codec, to
//! forge or damage a stored snapshot behind the journal's back; a commit of batches with the
//! writer ids and seqs they carry, to replay a retry; a tombstone.

use crate::event::{EncodeError, RunId, TerminalState};
use crate::journal::Tombstone;
use crate::journal::format::snapshot;
use crate::journal::{AppendError, Appended, Batch, Journal, SnapshotError, StorageFailure};
use crate::state::RunState;

/// The snapshot bytes of `state`, as the `runs` table stores them.
pub fn encode_snapshot(state: &RunState) -> Result<Vec<u8>, EncodeError> {
    snapshot::encode_snapshot_for_tests(state)
}

/// What stored snapshot bytes of run `run` decode to.
pub fn decode_snapshot(run: RunId, bytes: &[u8]) -> Result<RunState, SnapshotError> {
    snapshot::decode_snapshot_for_tests(run, bytes)
}

/// `payload` followed by its CRC-32C, as snapshots and records end.
pub fn with_checksum(payload: &[u8]) -> Vec<u8> {
    snapshot::with_checksum_for_tests(payload)
}

/// Snapshot bytes of layout 1 relabelled as a later layout this build does not read, with one
/// field added (`last_heartbeat_ms`), under a checksum that matches; `None` if `layout_one` is
/// not a layout-1 snapshot.
pub fn snapshot_of_layout_two(
    layout_one: &[u8],
    last_heartbeat_ms: Option<u64>,
) -> Option<Vec<u8>> {
    snapshot::snapshot_of_layout_two_for_tests(layout_one, last_heartbeat_ms)
}

/// Commits `batches` through `journal` in one durable write transaction on the calling
/// thread, with the writer ids and writer seqs they carry, as the writer thread does when it
/// retries a group after a reopen.
pub fn commit_batches(
    journal: &Journal,
    batches: &[Batch],
) -> Result<Vec<Result<Appended, AppendError>>, StorageFailure> {
    journal.commit_batches_for_tests(batches)
}

/// A tombstone of run `run`, ended as `state` with `exit_code`, every other field empty.
pub fn tombstone(run: RunId, state: TerminalState, exit_code: i32) -> Tombstone {
    Tombstone::for_tests(run, state, exit_code)
}
