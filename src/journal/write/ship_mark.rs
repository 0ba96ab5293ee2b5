//! The shipping mark: whether the home ships, and through which global seq its records are
//! proven shipped (`meta` key `shipped_through`, u64 BE; docs/journal-format.md).
//!
//! The shipper writes it after the server's transaction committed, in a write transaction of
//! its own, never on an append's path. Retention reads it: with the mark present, a run is
//! pruned only when all its records are at or below it. The server's cursor and the shipper's
//! report file (`shipping.json`) are never trusted for this: a journal restored from a backup
//! keeps the mark it had then, and a lost report changes nothing.
//!
//! Invariants:
//! * the mark only rises while it is present: what was proven shipped stays proven;
//! * the mark is at most the journal's head: only a record this journal holds is proven.

use redb::{ReadableTable, WriteTransaction};

use crate::journal::format::error::{StorageFailure, storage};
use crate::journal::format::tables::{self, META};

/// Sets the mark to `through`, or leaves a higher one as it is; a home without the mark ships
/// from now on.
pub(crate) fn mark_shipped_in(txn: &WriteTransaction, through: u64) -> Result<(), StorageFailure> {
    let mut meta = txn.open_table(META).map_err(storage("opening meta"))?;
    let current = meta
        .get(tables::META_SHIPPED_THROUGH)
        .map_err(storage("reading the shipping mark"))?
        .map(|value| tables::meta_u64(Some(value.value())).unwrap_or(0));
    if current.is_some_and(|current| current >= through) {
        return Ok(());
    }
    meta.insert(tables::META_SHIPPED_THROUGH, &through.to_be_bytes()[..])
        .map_err(storage("writing the shipping mark"))?;
    Ok(())
}

/// Removes the mark: the home no longer ships.
pub(crate) fn stop_shipping_in(txn: &WriteTransaction) -> Result<(), StorageFailure> {
    let mut meta = txn.open_table(META).map_err(storage("opening meta"))?;
    meta.remove(tables::META_SHIPPED_THROUGH)
        .map_err(storage("removing the shipping mark"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::journal::Journal;

    #[test]
    fn the_mark_starts_absent_rises_only_and_goes_when_shipping_stops() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::open(dir.path().join("journal.redb")).unwrap();
        let mark = |journal: &Journal| journal.view().unwrap().shipped_through().unwrap();
        assert_eq!(mark(&journal), None, "a new home does not ship");
        journal.mark_shipped(0).unwrap();
        assert_eq!(mark(&journal), Some(0), "it ships, nothing proven");
        journal.mark_shipped(7).unwrap();
        journal.mark_shipped(3).unwrap();
        assert_eq!(mark(&journal), Some(7), "what was proven stays proven");
        journal.stop_shipping().unwrap();
        assert_eq!(mark(&journal), None);
        journal.mark_shipped(2).unwrap();
        assert_eq!(mark(&journal), Some(2));
    }
}
