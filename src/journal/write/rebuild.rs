//! Writing a new journal from records kept elsewhere (a lost journal rebuilt from the runs'
//! events.jsonl, `crate::recover`): every record as it was — run, seq, time, writer, writer
//! seq, event — committed in the order given, each batch folded through `state::apply` with its
//! snapshot and index changes written as an append writes them.
//!
//! Before the records, one transaction sets the queues' limits the caller chose (a queue's limit
//! is kept only in the journal, and a rebuilt run may name its queue) and keeps the caller's
//! [`RecoveryNote`] in meta. Queue slots are not judged again: the records say what each queue
//! admitted.
//!
//! Invariant: the file is new (nothing is written over an existing one), and every batch is
//! written as it came or the rebuild fails: nothing is skipped, reordered or renumbered.

use std::path::{Path, PathBuf};

use redb::Database;

use super::append::{self, Batch, Marks};
use crate::event::RunId;
use crate::journal::file::Location;
use crate::journal::file::open::open_location;
use crate::journal::format::error::{AppendError, OpenError, StorageFailure, storage};
use crate::journal::format::recovery::RecoveryNote;
use crate::journal::format::tables;

/// Most events committed in one durable transaction of a rebuild.
const EVENTS_PER_COMMIT: usize = 4096;

/// Why a rebuild failed. The new file may hold part of it; the caller removes it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RebuildError {
    #[error("{path} already exists; a rebuild writes a new file only")]
    Exists { path: PathBuf },
    #[error(transparent)]
    Open(#[from] OpenError),
    #[error(transparent)]
    Storage(#[from] StorageFailure),
    #[error("run {run}: the batch of writer seq {writer_seq} was refused: {source}")]
    Refused {
        run: RunId,
        writer_seq: u64,
        /// Boxed: it is large, and most rebuilds never meet it.
        #[source]
        source: Box<AppendError>,
    },
}

/// Creates a journal at `path`, which must not exist, holding `note` (its queues' limits set
/// and the note kept in meta) and `batches` in the order given, a few thousand events per
/// durable commit. Each writer's mark ends at its highest writer seq, so a retry of any
/// rebuilt batch is recognised as a retry. Returns the records written.
///
/// `ships`: the home shipped before its journal was lost. The rebuilt journal then ships too,
/// with nothing proven shipped (its shipping mark at 0): retention keeps every run until its
/// shipper has sent this journal, which is a new one to the server.
pub fn rebuild(
    path: &Path,
    batches: &[Batch],
    note: &RecoveryNote,
    ships: bool,
) -> Result<u64, RebuildError> {
    if matches!(crate::durable_fs::look(path), Ok(Some(_))) {
        return Err(RebuildError::Exists {
            path: path.to_path_buf(),
        });
    }
    let db = open_location(&Location::Path(path.to_path_buf()))?;
    set_up(&db, note, ships)?;
    let mut written = 0u64;
    let mut start = 0;
    while start < batches.len() {
        let mut end = start;
        let mut events = 0;
        // At least one batch per commit, whatever its size.
        while end < batches.len() && (end == start || events < EVENTS_PER_COMMIT) {
            events += batches[end].events.len();
            end += 1;
        }
        let chunk = &batches[start..end];
        let results = append::commit_batches_with(&db, chunk, Marks::Rebuild)?;
        for (batch, result) in chunk.iter().zip(results) {
            let appended = result.map_err(|source| RebuildError::Refused {
                run: batch.run,
                writer_seq: batch.writer_seq,
                source: Box::new(source),
            })?;
            written += appended.last_seq + 1 - appended.first_seq;
        }
        start = end;
    }
    Ok(written)
}

/// The queues' limits, the note and (for a home that shipped) the shipping mark at 0, in one
/// durable transaction before any record.
fn set_up(db: &Database, note: &RecoveryNote, ships: bool) -> Result<(), StorageFailure> {
    let mut txn = db.begin_write().map_err(storage("beginning a write"))?;
    txn.set_durability(redb::Durability::Immediate)
        .map_err(|error| StorageFailure::new("setting durability", redb::Error::from(error)))?;
    for queue in &note.queues {
        append::set_queue_limit_in(&txn, &queue.name, queue.max_active)?;
    }
    {
        let mut meta = txn
            .open_table(tables::META)
            .map_err(storage("opening meta"))?;
        meta.insert(tables::META_RECOVERY, note.encode().as_slice())
            .map_err(storage("writing the recovery note"))?;
    }
    if ships {
        crate::journal::write::ship_mark::mark_shipped_in(&txn, 0)?;
    }
    txn.commit().map_err(storage("committing"))
}
