//! Opening a journal: creating the file private, discarding a creation that never finished,
//! refusing what is not a journal of our format, and setting up the tables of a new one.

use std::path::Path;

use redb::{ConcurrencyMode, Database, ReadableDatabase, ReadableTable, TableHandle};

use super::backend::BoxedBackend;
use super::contain::contain;
use super::copy::REDB_HEADER_BYTES;
use super::location::Location;
use super::lock_wait::PatientLocks;
use super::pages::{FileId, file_id};
use crate::durable_fs;
use crate::event::{self, FORMAT_VERSION};
use crate::journal::format::error::{Damaged, OpenError, StorageFailure};
use crate::journal::format::tables;

/// redb's page cache for one journal handle. Runners, launchers and tools each open their own
/// handle, so this stays small.
const CACHE_BYTES: usize = 16 << 20;

pub(crate) fn builder() -> redb::Builder {
    let mut builder = Database::builder();
    builder
        .set_concurrency_mode(ConcurrencyMode::MultiWriter)
        .set_cache_size(CACHE_BYTES);
    builder
}

/// Runs `open`, a call that opens the journal at `path` through redb, reporting a panic of
/// redb's on the file's bytes as [`OpenError::Damaged`].
pub(crate) fn contained_open<T>(
    path: &Path,
    open: impl FnOnce() -> Result<T, OpenError>,
) -> Result<T, OpenError> {
    match contain(open) {
        // Damage met while the open read the file's pages (a page refused by the bound on
        // page pointers, a checksum): the journal's damage, named by its path.
        Ok(Err(OpenError::Storage(failure))) if failure.is_damage() => Err(OpenError::Corrupt {
            path: path.to_path_buf(),
            reason: failure.to_string(),
        }),
        Ok(opened) => opened,
        Err(panic) => Err(OpenError::Damaged(Damaged::new(
            path,
            "opening the journal",
            panic,
        ))),
    }
}

/// Opens (or creates) the database of a source. A panic of redb's on a damaged file is
/// [`OpenError::Damaged`].
pub(crate) fn open_location(source: &Location) -> Result<Database, OpenError> {
    contained_open(source.path(), || open_location_unguarded(source))
}

fn open_location_unguarded(source: &Location) -> Result<Database, OpenError> {
    match source {
        Location::Path(path) => open_database(path),
        Location::Backend { name, factory } => {
            let io_error = |source| OpenError::Io {
                path: name.clone(),
                source,
            };
            let backend = factory().map_err(io_error)?;
            discard_unfinished_creation(backend.as_ref()).map_err(io_error)?;
            let db = builder()
                .create_with_backend(guarded(BoxedBackend(backend), None, None))
                .map_err(|error| OpenError::from_database(name, error))?;
            initialize(name, &db, Creation::Allowed)?;
            Ok(db)
        }
    }
}

/// Opens the database of a source again, for a handle that already had it open (after a
/// storage failure, or beside the writer): it must be there and be a journal. Nothing is
/// created or initialised, so a journal file that was emptied, removed or replaced meanwhile
/// is refused rather than made anew. A panic of redb's on a damaged file is
/// [`OpenError::Damaged`].
pub(crate) fn reopen_location(source: &Location) -> Result<Database, OpenError> {
    contained_open(source.path(), || reopen_location_unguarded(source))
}

fn reopen_location_unguarded(source: &Location) -> Result<Database, OpenError> {
    let refuse_empty = |path: &Path| OpenError::NotAJournal {
        path: path.to_path_buf(),
        reason: "the file is empty (it held a journal when this process opened it)".to_string(),
    };
    match source {
        Location::Path(path) => {
            // The first open's rules: no link followed, a regular file of this user that
            // nobody else can write, opened by us and handed to redb as a backend, so redb
            // never opens the path itself.
            check_journal_file(path)?;
            let file = durable_fs::open_existing_read_write(path)
                .map_err(|source| OpenError::from_io(path, source))?;
            let len = file
                .metadata()
                .map_err(|source| OpenError::Io {
                    path: path.clone(),
                    source,
                })?
                .len();
            if len == 0 {
                return Err(refuse_empty(path));
            }
            if let Some(reason) = super::marker::marked_damage(path, &file) {
                return Err(OpenError::Corrupt {
                    path: path.clone(),
                    reason,
                });
            }
            let id = file_id(&file);
            let backend = redb::backends::FileBackend::new(file);
            let db = builder()
                .create_with_backend(guarded(backend, Some(path), id))
                .map_err(|error| OpenError::from_database(path, error))?;
            initialize(path, &db, Creation::Refused)?;
            Ok(db)
        }
        Location::Backend { name, factory } => {
            let io_error = |source| OpenError::Io {
                path: name.clone(),
                source,
            };
            let backend = factory().map_err(io_error)?;
            if backend.len().map_err(|error| io_error(error.into()))? == 0 {
                return Err(refuse_empty(name));
            }
            let db = builder()
                .create_with_backend(guarded(BoxedBackend(backend), None, None))
                .map_err(|error| OpenError::from_database(name, error))?;
            initialize(name, &db, Creation::Refused)?;
            Ok(db)
        }
    }
}

/// Whether an open may set up a journal in an empty database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Creation {
    Allowed,
    Refused,
}

fn open_database(path: &Path) -> Result<Database, OpenError> {
    create_private_file(path)?;
    check_journal_file(path)?;
    discard_unfinished_file(path)?;
    precheck_read_only(path)?;
    // Opened here rather than by redb, so that a link put in the journal's place is not
    // followed.
    let file = durable_fs::open_existing_read_write(path)
        .map_err(|source| OpenError::from_io(path, source))?;
    let id = file_id(&file);
    let backend = redb::backends::FileBackend::new(file);
    let db = builder()
        .create_with_backend(guarded(backend, Some(path), id))
        .map_err(|error| OpenError::from_database(path, error))?;
    initialize(path, &db, Creation::Allowed)?;
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
    let file = durable_fs::open_existing_read_write(path).map_err(io_error)?;
    let backend = redb::backends::FileBackend::new(file);
    let discarded = discard_unfinished_creation(&backend);
    let closed = redb::StorageBackend::close(&backend).map_err(std::io::Error::from);
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
    let db = match open_read_only(path) {
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

/// Opens the journal at `path` read-only, without following a link in its place, and only a
/// regular file of this user that nobody else can write, judged on the file opened, and not
/// one a scrub found damaged ([`super::marker::marked_damage`]; the read-write open's precheck
/// comes here too). Call it inside [`contained_open`]: redb may panic on a damaged file.
pub(crate) fn open_read_only(path: &Path) -> Result<redb::ReadOnlyDatabase, redb::DatabaseError> {
    let file = durable_fs::open_existing_read_only(path)?;
    durable_fs::check_opened_private(&file, path)?;
    if let Some(reason) = super::marker::marked_damage(path, &file) {
        return Err(redb::StorageError::Corrupted(reason).into());
    }
    let id = file_id(&file);
    let backend = redb::backends::FileBackend::new(file);
    builder().open_read_only_with_backend(guarded(backend, Some(path), id))
}

/// `backend` as redb is handed every journal: its locks waited for within the scope's bound,
/// its branch pages bounded by the file's length (`file`, the journal file's identity), both by
/// [`PatientLocks`].
fn guarded<B: redb::StorageBackend>(
    backend: B,
    path: Option<&Path>,
    file: Option<FileId>,
) -> PatientLocks<B> {
    PatientLocks::new(backend, path, file)
}

/// Refuses a journal file that another user owns or could write, or a link in its place
/// ([`durable_fs::judge_private`]): its records are what runjournal acts on.
pub(crate) fn check_journal_file(path: &Path) -> Result<(), OpenError> {
    durable_fs::check_private(path, durable_fs::Expect::File)
        .map(|_| ())
        .map_err(|error| OpenError::from_io(path, error))
}

/// Creates `path` empty and 0600 if it does not exist, so redb initializes a file only its
/// owner can read; a file it creates has its directory synced, so that the file's entry is
/// durable before any commit to it is acknowledged (the commits' own syncs make only the
/// file's content durable).
fn create_private_file(path: &Path) -> Result<(), OpenError> {
    match durable_fs::create_exclusive(path) {
        Ok(_) => durable_fs::sync_parent(path).map_err(|source| OpenError::Io {
            path: path.to_path_buf(),
            source,
        }),
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(source) => Err(OpenError::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Checks the format version and, where `creation` allows, creates the tables of a new
/// journal. A journal that is already set up is only read, so opening costs no commit.
fn initialize(path: &Path, db: &Database, creation: Creation) -> Result<(), OpenError> {
    let txn = db
        .begin_read()
        .map_err(|error| StorageFailure::new("beginning a read", error))?;
    if let Some(version) = read_format_version(path, &txn)? {
        return check_format_version(path, version);
    }
    drop(txn);
    if creation == Creation::Refused {
        return Err(OpenError::NotAJournal {
            path: path.to_path_buf(),
            reason: "no runjournal meta table (it held a journal when this process opened it)"
                .to_string(),
        });
    }
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
                let now = event::now_ms();
                let created_at = now.to_be_bytes();
                let version = FORMAT_VERSION.to_be_bytes();
                // Retention's clock starts anchored: nothing older than the journal exists.
                let clock = crate::journal::format::retention::ClockAnchor::now_at(now)
                    .map(|anchor| anchor.to_bytes())
                    .unwrap_or_default();
                for (key, value) in [
                    (tables::META_FORMAT_VERSION, &version[..]),
                    (tables::META_JOURNAL_ID, &journal_id[..]),
                    (tables::META_CREATED_AT, &created_at[..]),
                    (tables::META_CLOCK, &clock[..]),
                ] {
                    if value.is_empty() {
                        continue;
                    }
                    meta.insert(key, value)
                        .map_err(|error| StorageFailure::new("writing meta", error))?;
                }
            }
        }
    }
    tables::create_tables(&txn)?;
    txn.commit()
        .map_err(|error| StorageFailure::new("committing the set-up", error))?;
    Ok(())
}

pub(crate) fn read_format_version(
    path: &Path,
    txn: &redb::ReadTransaction,
) -> Result<Option<u16>, OpenError> {
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

pub(crate) fn check_format_version(path: &Path, version: u16) -> Result<(), OpenError> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::durable_fs::UnsafePath;
    use crate::journal::Journal;
    use std::os::unix::fs::PermissionsExt;

    /// A journal made and closed in a directory of its own; returns the directory and the path.
    fn closed_journal() -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("journal.redb");
        drop(Journal::open(&path).expect("a new journal"));
        (dir, path)
    }

    #[test]
    fn a_reopen_after_a_storage_failure_opens_the_journal_it_had() {
        let (_dir, path) = closed_journal();
        let db = reopen_location(&Location::Path(path.clone())).expect("the journal reopens");
        let txn = db.begin_read().expect("a read");
        assert_eq!(
            read_format_version(&path, &txn).expect("meta"),
            Some(FORMAT_VERSION)
        );
    }

    /// redb's own `open(path)` would follow the link and open (and write the header of)
    /// whatever it points to.
    #[test]
    fn a_link_swapped_in_for_the_journal_before_a_reopen_is_refused_not_followed() {
        let (dir, path) = closed_journal();
        let elsewhere = dir.path().join("elsewhere.redb");
        std::fs::rename(&path, &elsewhere).expect("move the journal away");
        std::os::unix::fs::symlink(&elsewhere, &path).expect("a link in its place");
        let before = std::fs::read(&elsewhere).expect("read the target");

        let error = reopen_location(&Location::Path(path.clone())).expect_err("a link is refused");
        assert!(
            matches!(&error, OpenError::Unsafe(UnsafePath::LinkedFile { path: named }) if *named == path),
            "{error:?}"
        );
        assert!(error.to_string().contains("symbolic link"), "{error}");
        assert_eq!(
            std::fs::read(&elsewhere).expect("read the target"),
            before,
            "the file the link names is not written"
        );
    }

    #[test]
    fn a_journal_made_writable_by_others_before_a_reopen_is_refused() {
        let (_dir, path) = closed_journal();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o622)).expect("chmod");
        let error = reopen_location(&Location::Path(path.clone())).expect_err("refused");
        assert!(
            matches!(&error, OpenError::Unsafe(UnsafePath::Writable { .. })),
            "{error:?}"
        );
    }

    /// The check by path can be raced; the check of the file opened cannot.
    #[test]
    fn the_file_opened_for_the_journal_is_judged_itself() {
        let dir = tempfile::tempdir().expect("temp dir");
        let fifo = dir.path().join("journal.redb");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
        // A FIFO without a reader: a blocking open for writing would hang here.
        let error = durable_fs::open_existing_read_write(&fifo).expect_err("a FIFO is refused");
        assert!(
            matches!(UnsafePath::of(&error), Some(UnsafePath::WrongKind { .. })),
            "{error:?}"
        );
        let error = durable_fs::open_existing_read_only(&fifo).expect_err("a FIFO is refused");
        assert_eq!(error.kind(), std::io::ErrorKind::InvalidData, "{error}");
    }
}
