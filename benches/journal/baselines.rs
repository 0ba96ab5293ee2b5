//! The ways to record a transition that runjournal is measured against, each doing one
//! transition per call, on the same filesystem as the journal.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The physical limit: append the record to a plain file and `fdatasync` it.
pub struct AppendFile {
    file: File,
    record: Vec<u8>,
}

impl AppendFile {
    pub fn new(dir: &Path, record: &[u8]) -> AppendFile {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(dir.join("append.log"))
            .expect("the append file opens");
        AppendFile {
            file,
            record: record.to_vec(),
        }
    }

    pub fn transition(&mut self) {
        self.file
            .write_all(&self.record)
            .expect("the record is written");
        self.file.sync_data().expect("fdatasync succeeds");
    }
}

/// The pi-subagents way: rewrite the run's status.json through a temporary file and a rename,
/// optionally with the file and its directory fsynced (the same durability as a journal).
pub struct RewriteStatus {
    dir: PathBuf,
    status: Vec<u8>,
    is_durable: bool,
}

impl RewriteStatus {
    pub fn new(dir: &Path, status: &[u8], is_durable: bool) -> RewriteStatus {
        let dir = dir.join(if is_durable { "status-fsync" } else { "status" });
        std::fs::create_dir_all(&dir).expect("the status directory can be made");
        RewriteStatus {
            dir,
            status: status.to_vec(),
            is_durable,
        }
    }

    pub fn transition(&mut self) {
        let temp = self.dir.join(".status.json.tmp");
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&temp)
            .expect("the temporary file opens");
        file.write_all(&self.status).expect("the status is written");
        if self.is_durable {
            file.sync_all().expect("fsync of the file succeeds");
        }
        drop(file);
        std::fs::rename(&temp, self.dir.join("status.json")).expect("the rename succeeds");
        if self.is_durable {
            File::open(&self.dir)
                .and_then(|dir| dir.sync_all())
                .expect("fsync of the directory succeeds");
        }
    }
}

/// SQLite in WAL mode with `synchronous=FULL`: one transaction (one insert) per transition.
pub struct Sqlite {
    connection: rusqlite::Connection,
    record: Vec<u8>,
    seq: i64,
}

impl Sqlite {
    pub fn new(dir: &Path, record: &[u8]) -> Sqlite {
        let connection =
            rusqlite::Connection::open(dir.join("journal.sqlite")).expect("SQLite opens");
        let mode: String = connection
            .query_row("PRAGMA journal_mode=WAL", [], |row| row.get(0))
            .expect("WAL mode is set");
        assert_eq!(mode, "wal");
        connection
            .execute_batch(
                "PRAGMA synchronous=FULL;
                 CREATE TABLE IF NOT EXISTS records (
                     run_id BLOB NOT NULL, seq INTEGER NOT NULL, record BLOB NOT NULL,
                     PRIMARY KEY (run_id, seq)) WITHOUT ROWID;",
            )
            .expect("the table is made");
        Sqlite {
            connection,
            record: record.to_vec(),
            seq: 0,
        }
    }

    pub fn transition(&mut self) {
        self.seq += 1;
        self.connection
            .execute(
                "INSERT INTO records (run_id, seq, record) VALUES (?1, ?2, ?3)",
                rusqlite::params![&[7u8; 16][..], self.seq, &self.record],
            )
            .expect("the insert commits");
    }
}

/// The floor of a two-phase commit, for comparison with redb's (not a way to journal): write a
/// page in place and `fdatasync`, then write a header in place and `fdatasync` again.
pub struct TwoPhaseFloor {
    file: File,
    page: Vec<u8>,
    next_page: u64,
}

/// Pages the two-phase floor cycles through, after its header page.
const FLOOR_PAGES: u64 = 256;

impl TwoPhaseFloor {
    pub fn new(dir: &Path, record: &[u8]) -> TwoPhaseFloor {
        let mut file = OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .mode(0o600)
            .open(dir.join("two-phase.bin"))
            .expect("the two-phase file opens");
        // Allocated up front, as a database file is: the commits below only overwrite.
        file.write_all(&vec![0u8; (4096 * (FLOOR_PAGES + 1)) as usize])
            .expect("the file is filled");
        file.sync_all().expect("the file is synced");
        let mut page = vec![0u8; 4096];
        page[..record.len()].copy_from_slice(record);
        TwoPhaseFloor {
            file,
            page,
            next_page: 0,
        }
    }

    pub fn transition(&mut self) {
        use std::os::unix::fs::FileExt;
        let offset = 4096 * (1 + self.next_page % FLOOR_PAGES);
        self.next_page += 1;
        self.file
            .write_all_at(&self.page, offset)
            .expect("the page is written");
        self.file.sync_data().expect("fdatasync succeeds");
        self.file
            .write_all_at(&self.next_page.to_le_bytes(), 0)
            .expect("the header is written");
        self.file.sync_data().expect("fdatasync succeeds");
    }
}

/// redb alone, as runjournal opens it (`MultiWriter`): one insert into one table per durable
/// commit. What runjournal adds on top is the rest of its tables and its own work.
pub struct RedbInsert {
    db: redb::Database,
    record: Vec<u8>,
    key: u64,
}

const REDB_TABLE: redb::TableDefinition<u64, &[u8]> = redb::TableDefinition::new("records");

impl RedbInsert {
    pub fn new(dir: &Path, record: &[u8]) -> RedbInsert {
        let db = RedbInsert::builder()
            .create(dir.join("plain.redb"))
            .expect("redb opens");
        RedbInsert {
            db,
            record: record.to_vec(),
            key: 0,
        }
    }

    /// The same on a backend of the caller's (one that counts what redb asks of the disk).
    pub fn with_backend(backend: impl redb::StorageBackend, record: &[u8]) -> RedbInsert {
        let db = RedbInsert::builder()
            .create_with_backend(backend)
            .expect("redb opens");
        RedbInsert {
            db,
            record: record.to_vec(),
            key: 0,
        }
    }

    fn builder() -> redb::Builder {
        let mut builder = redb::Database::builder();
        // As runjournal opens its journal.
        builder
            .set_concurrency_mode(redb::ConcurrencyMode::MultiWriter)
            .set_cache_size(16 << 20);
        builder
    }

    pub fn transition(&mut self) {
        self.key += 1;
        let mut txn = self.db.begin_write().expect("a write begins");
        txn.set_durability(redb::Durability::Immediate)
            .expect("durability is set");
        {
            let mut table = txn.open_table(REDB_TABLE).expect("the table opens");
            table
                .insert(self.key, self.record.as_slice())
                .expect("the insert succeeds");
        }
        txn.commit().expect("the commit succeeds");
    }
}
