//! Checking a journal's pages before redb reads them in place.
//!
//! redb trusts a page pointer it reads from its file. A damaged pointer can carry a page order
//! up to redb's largest (a page of 2^20 pages, 4 GiB), and redb allocates a buffer of the whole
//! page before it asks the storage backend for the bytes and before it compares the page with
//! the file's length. Where that allocation fails the process aborts, which no [`contain`] can
//! catch; where it succeeds it costs gigabytes, and only then does the read fail as damage.
//! Nothing behind redb's `StorageBackend` can refuse it: the buffer exists before the backend is
//! called.
//!
//! redb's integrity check walks the same trees differently: it verifies each page against the
//! checksum its parent keeps for it (the root's is in the commit slot, which has a checksum of
//! its own) before it follows any pointer inside the page. A damaged pointer is inside a page
//! whose checksum no longer matches, so the walk stops before it. So before the journal is opened
//! in place, [`check_pages`] reads the file into memory and opens that copy with redb's
//! integrity check: a copy that fails it is damage ([`OpenError::Corrupt`] through
//! [`OpenError::from_database`]), and the journal itself is never written by the check.
//!
//! Limits: the check covers the pages of the commit the copy holds. A commit made afterwards
//! by a writer is written whole by redb and needs none. A file that changes during each of
//! [`CHECK_ATTEMPTS`] copies (writers busy committing) is opened unchecked rather than refused:
//! a torn copy would be judged damaged while the file is whole. A journal opened through a
//! [`Location::Backend`] (the tests' fault-injecting backends) is not checked: only files are.
//!
//! [`Location::Backend`]: super::Location::Backend
//! [`contain`]: super::contain::contain
//! [`OpenError::Corrupt`]: crate::journal::OpenError::Corrupt
//! [`OpenError::from_database`]: crate::journal::OpenError

use std::fs::File;
use std::os::unix::fs::FileExt;

use super::copy::REDB_HEADER_BYTES;

/// How many times [`check_pages`] copies a file that changed while it was copied.
pub(crate) const CHECK_ATTEMPTS: u32 = 4;

/// redb's page cache for the copy being checked: the check reads each page once.
const CHECK_CACHE_BYTES: usize = 1 << 20;

/// Checks the pages of the journal open as `file` ([module docs](self)). `Ok` when they pass,
/// when the file is empty (nothing to read), or when it kept changing while it was copied; the
/// error redb's check returned otherwise. Call it inside [`super::open::contained_open`].
pub(crate) fn check_pages(file: &File) -> Result<(), redb::DatabaseError> {
    for _ in 0..CHECK_ATTEMPTS {
        let Some(copy) = copy_of(file)? else {
            continue;
        };
        if redb::StorageBackend::len(&copy).map_err(redb::StorageError::from)? == 0 {
            return Ok(());
        }
        return check_copy(copy);
    }
    Ok(())
}

/// Bytes copied at a time, so the copy costs the file's size in memory and little more.
const COPY_CHUNK_BYTES: usize = 1 << 20;

/// The whole file in memory as it stood at one commit, or `None` if its header or length
/// changed while it was read (redb writes a commit's pages, then the header that names them).
fn copy_of(file: &File) -> std::io::Result<Option<redb::backends::InMemoryBackend>> {
    use redb::StorageBackend;
    let Some(before) = state_of(file)? else {
        return Ok(None);
    };
    let copy = redb::backends::InMemoryBackend::new();
    copy.set_len(before.0)?;
    let mut chunk = vec![0u8; COPY_CHUNK_BYTES];
    let mut offset = 0;
    while offset < before.0 {
        let len =
            usize::try_from(before.0 - offset).map_or(chunk.len(), |left| left.min(chunk.len()));
        match file.read_exact_at(&mut chunk[..len], offset) {
            Ok(()) => {}
            // Cut short while it was read: a change like any other.
            Err(error) if error.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(error) => return Err(error),
        }
        copy.write(offset, &chunk[..len])?;
        offset += len as u64;
    }
    Ok((state_of(file)? == Some(before)).then_some(copy))
}

/// The file's length and the bytes of redb's header; `None` if the file was cut short while
/// they were read.
fn state_of(file: &File) -> std::io::Result<Option<(u64, Vec<u8>)>> {
    let len = file.metadata()?.len();
    let header_len =
        usize::try_from(len).map_or(REDB_HEADER_BYTES, |len| len.min(REDB_HEADER_BYTES));
    let mut header = vec![0u8; header_len];
    match file.read_exact_at(&mut header, 0) {
        Ok(()) => Ok(Some((len, header))),
        Err(error) if error.kind() == std::io::ErrorKind::UnexpectedEof => Ok(None),
        Err(error) => Err(error),
    }
}

/// Opens the copy with redb's integrity check on open.
fn check_copy(copy: redb::backends::InMemoryBackend) -> Result<(), redb::DatabaseError> {
    let db = redb::Database::builder()
        .set_check_integrity_on_open(true)
        .set_cache_size(CHECK_CACHE_BYTES)
        .create_with_backend(copy)
        .map_err(past_the_end_is_damage)?;
    drop(db);
    Ok(())
}

/// The copy is in memory, so no read of it fails as storage does: one that fails is a read past
/// its end, of a page the file's trees name and the file does not hold. That is damage, as a
/// read past the end of the file itself is.
fn past_the_end_is_damage(error: redb::DatabaseError) -> redb::DatabaseError {
    use redb::{DatabaseError, StorageError};
    match error {
        DatabaseError::Storage(
            StorageError::Io(_) | StorageError::Backend(_) | StorageError::PreviousIo,
        ) => DatabaseError::Storage(StorageError::Corrupted(format!(
            "a page lies past the end of the file ({error})"
        ))),
        other => other,
    }
}
