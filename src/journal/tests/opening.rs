//! Opening: format version and foreign files.

use super::*;
use redb::ReadableTable as _;

#[test]
fn a_journal_reopens_for_writing_and_reading_with_its_records() {
    let dir = tempfile::tempdir().expect("a temporary directory can be created");
    let path = journal_path(&dir);
    let journal = Journal::open(&path).expect("a new journal opens");
    let run = create(&journal, Some("kept"), None);
    let meta = journal.meta().expect("meta reads");
    assert_eq!(meta.format_version, crate::event::FORMAT_VERSION);
    assert!(meta.created_at_ms > 0);
    drop(journal);

    let journal = Journal::open(&path).expect("the journal reopens");
    assert_eq!(
        journal.meta().expect("meta reads"),
        meta,
        "reopening rewrites no meta"
    );
    let view = journal.view().expect("a view opens");
    assert_eq!(view.resolve(&run.to_string()).expect("resolves"), run);
    assert_eq!(
        view.lookup_alias(&name_alias("kept")).expect("reads"),
        Some(run)
    );
    drop(view);

    // A read-only handle beside a live writer sees the writer's later commits.
    let reader = JournalReader::open(&path).expect("the journal opens read-only");
    assert_eq!(reader.path(), path.as_path());
    assert_eq!(
        reader
            .view()
            .expect("a view opens")
            .meta()
            .expect("meta reads"),
        meta
    );
    journal
        .append(run, vec![runner_started("i")], Condition::none())
        .expect("a legal transition is appended");
    let view = reader.view().expect("a view opens");
    assert_eq!(seqs(&view.records(run).expect("records read")), vec![1, 2]);
    assert_eq!(
        view.snapshot(run)
            .expect("reads")
            .expect("the run exists")
            .status,
        RunStatus::Running
    );
}

#[test]
fn opening_a_missing_journal_read_only_is_an_io_error_and_creates_nothing() {
    let dir = tempfile::tempdir().expect("a temporary directory can be created");
    let path = journal_path(&dir);
    let error = refused_read_only(&path, "there is no journal");
    assert!(
        matches!(&error, OpenError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound),
        "{error:?}"
    );
    assert!(!path.exists());
}

fn rewrite_format_version(path: &Path, version: u16) {
    let db = open_raw(path);
    let txn = db.begin_write().expect("a write begins");
    {
        let mut meta = txn.open_table(META).expect("the meta table opens");
        meta.insert(tables::META_FORMAT_VERSION, &version.to_be_bytes()[..])
            .expect("the entry is written");
    }
    txn.commit().expect("the rewrite commits");
}

fn assert_newer_format(error: &OpenError, path: &Path) {
    assert!(
        matches!(error, OpenError::NewerFormat { path: p, found: 2 } if p == path),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(message.contains("upgrade runjournal"), "{message}");
    assert!(message.contains("version 2"), "{message}");
}

#[test]
fn a_journal_of_a_newer_format_is_refused_by_both_opens() {
    let dir = tempfile::tempdir().expect("a temporary directory can be created");
    let path = journal_path(&dir);
    let run = {
        let journal = Journal::open(&path).expect("a new journal opens");
        create(&journal, None, None)
    };
    rewrite_format_version(&path, 2);

    let error = Journal::open(&path).expect_err("a newer format is refused");
    assert_newer_format(&error, &path);
    let error = refused_read_only(&path, "a newer format is refused read-only too");
    assert_newer_format(&error, &path);

    // The refusal left the journal as it was: the run is there, the version is still 2.
    let db = open_raw(&path);
    let txn = db.begin_read().expect("a read begins");
    let meta = txn.open_table(META).expect("meta opens");
    let version = meta
        .get(tables::META_FORMAT_VERSION)
        .expect("reads")
        .expect("the entry exists");
    assert_eq!(version.value(), &2u16.to_be_bytes()[..]);
    let runs = txn.open_table(tables::RUNS).expect("runs opens");
    assert!(runs.get(&run.to_bytes()).expect("reads").is_some());
}

/// A closed journal whose meta says format version 2; returns the directory and path.
fn journal_of_format_two() -> (TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("a temporary directory can be created");
    let path = journal_path(&dir);
    {
        let journal = Journal::open(&path).expect("a new journal opens");
        create(&journal, None, None);
    }
    rewrite_format_version(&path, 2);
    (dir, path)
}

#[test]
fn refusing_a_newer_format_read_only_leaves_the_file_bytes_unchanged() {
    let (_dir, path) = journal_of_format_two();
    let before = read_bytes(&path);
    let error = refused_read_only(&path, "refused");
    assert_newer_format(&error, &path);
    assert!(
        read_bytes(&path) == before,
        "a read-only refusal wrote to the file"
    );
}

fn changed_bytes(before: &[u8], after: &[u8]) -> String {
    let changed = before
        .iter()
        .zip(after)
        .filter(|(old, new)| old != new)
        .count();
    format!(
        "{} -> {} bytes long, {changed} bytes differ",
        before.len(),
        after.len()
    )
}

#[test]
fn a_refused_open_for_writing_leaves_the_file_bytes_unchanged() {
    let (_dir, path) = journal_of_format_two();
    let before = read_bytes(&path);
    let error = Journal::open(&path).expect_err("refused");
    assert_newer_format(&error, &path);
    let after = read_bytes(&path);
    assert!(
        after == before,
        "refusing a newer format wrote to the file: {}",
        changed_bytes(&before, &after)
    );

    let (_dir, path) = foreign_database();
    let before = read_bytes(&path);
    let error = Journal::open(&path).expect_err("refused");
    assert!(matches!(error, OpenError::NotAJournal { .. }), "{error:?}");
    let after = read_bytes(&path);
    assert!(
        after == before,
        "refusing another program's database wrote to it: {}",
        changed_bytes(&before, &after)
    );
}

#[test]
fn a_format_version_below_one_is_reported_as_corruption() {
    let dir = tempfile::tempdir().expect("a temporary directory can be created");
    let path = journal_path(&dir);
    drop(Journal::open(&path).expect("a new journal opens"));
    rewrite_format_version(&path, 0);
    let error = Journal::open(&path).expect_err("version 0 was never written");
    assert!(matches!(error, OpenError::Corrupt { .. }), "{error:?}");
    let error = refused_read_only(&path, "version 0 was never written");
    assert!(matches!(error, OpenError::Corrupt { .. }), "{error:?}");
}

fn random_bytes(len: usize) -> Vec<u8> {
    // Not "redb..." at the start, whatever the generator gives.
    let mut bytes: Vec<u8> = (0..len).map(|_| rand::random::<u8>()).collect();
    bytes[0] = b'#';
    bytes
}

#[test]
fn what_redb_reports_for_a_file_of_random_bytes() {
    // Pins the redb behaviour the journal's error mapping depends on: redb (2.4 and later, with
    // std) reports a foreign file as an I/O error of kind InvalidData, not as `Corrupted`.
    let dir = tempfile::tempdir().expect("a temporary directory can be created");
    let path = dir.path().join("random.bin");
    std::fs::write(&path, random_bytes(8192)).expect("the file is written");
    let error = redb::Database::builder()
        .set_concurrency_mode(redb::ConcurrencyMode::MultiWriter)
        .create(&path)
        .expect_err("random bytes are not a database");
    assert!(
        matches!(
            &error,
            redb::DatabaseError::Storage(redb::StorageError::Io(io))
                if io.kind() == std::io::ErrorKind::InvalidData
                    && io.to_string().contains("magic number mismatch")
        ),
        "{error:?}"
    );
}

#[test]
fn a_file_of_random_bytes_is_not_a_journal() {
    let dir = tempfile::tempdir().expect("a temporary directory can be created");
    for len in [1, 100, 8192, 1 << 20] {
        let path = dir.path().join(format!("random-{len}.redb"));
        std::fs::write(&path, random_bytes(len)).expect("the file is written");
        let before = read_bytes(&path);
        let error = Journal::open(&path).expect_err("random bytes are no journal");
        assert!(
            matches!(&error, OpenError::NotAJournal { path: p, .. } if *p == path),
            "{len} bytes: {error:?}"
        );
        let error = refused_read_only(&path, "random bytes are no journal");
        assert!(
            matches!(&error, OpenError::NotAJournal { path: p, .. } if *p == path),
            "{len} bytes, read-only: {error:?}"
        );
        assert!(
            read_bytes(&path) == before,
            "{len} bytes: the file was written to"
        );
    }
    // An empty file is no journal to a reader either (a writer would set it up as one).
    let empty = dir.path().join("empty.redb");
    std::fs::write(&empty, b"").expect("the file is written");
    let error = refused_read_only(&empty, "an empty file is no journal");
    assert!(
        matches!(&error, OpenError::NotAJournal { path: p, .. } if *p == empty),
        "empty file, read-only: {error:?}"
    );
    assert_eq!(read_bytes(&empty).len(), 0);
}

#[test]
fn a_file_of_random_bytes_is_refused_without_being_written() {
    // The part of the contract that holds today, whatever the error variant.
    let dir = tempfile::tempdir().expect("a temporary directory can be created");
    let path = dir.path().join("random.redb");
    std::fs::write(&path, random_bytes(8192)).expect("the file is written");
    let before = read_bytes(&path);
    assert!(Journal::open(&path).is_err());
    assert!(JournalReader::open(&path).is_err());
    assert!(read_bytes(&path) == before);
}

const INVENTORY: TableDefinition<&str, u64> = TableDefinition::new("inventory");

/// Another program's redb database: one table, `inventory`, holding `widgets` = 3.
fn foreign_database() -> (TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("a temporary directory can be created");
    let path = dir.path().join("other-app.redb");
    let db = redb::Database::builder()
        .set_concurrency_mode(redb::ConcurrencyMode::MultiWriter)
        .create(&path)
        .expect("a redb database is created");
    let txn = db.begin_write().expect("a write begins");
    txn.open_table(INVENTORY)
        .expect("the table opens")
        .insert("widgets", 3)
        .expect("written");
    txn.commit().expect("commits");
    (dir, path)
}

#[test]
fn a_redb_database_with_foreign_tables_is_not_a_journal() {
    let (_dir, path) = foreign_database();
    let error = Journal::open(&path).expect_err("another program's database");
    assert!(
        matches!(&error, OpenError::NotAJournal { path: p, .. } if *p == path),
        "{error:?}"
    );
    assert!(
        error.to_string().contains("is not a runjournal journal"),
        "{error}"
    );
    let error = refused_read_only(&path, "another program's database");
    assert!(
        matches!(&error, OpenError::NotAJournal { path: p, .. } if *p == path),
        "{error:?}"
    );

    // The refusal created none of the journal's tables in the other program's file.
    let db = open_raw(&path);
    let txn = db.begin_read().expect("a read begins");
    let names: Vec<String> = txn
        .list_tables()
        .expect("tables list")
        .map(|table| table.name().to_string())
        .collect();
    assert_eq!(names, vec!["inventory".to_string()]);
    let inventory = txn.open_table(INVENTORY).expect("opens");
    assert_eq!(
        inventory.get("widgets").expect("reads").map(|v| v.value()),
        Some(3)
    );
}
