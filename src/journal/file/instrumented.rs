//! A file backend that counts what redb asks of the disk, and can hold its syncs at a gate.
//!
//! Tests use the gate to make appends pile up behind a commit, so that the writer's next group
//! is known exactly; benchmarks use the counters to report how many `fdatasync`s and bytes one
//! commit costs. The bytes go to a real file through redb's own [`FileBackend`], so locking and
//! durability are those of a journal opened by path. Not meant for production use.

use std::fs::File;
use std::io;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use redb::backends::FileBackend;
use redb::{BackendError, StorageBackend};

use super::location::Location;

/// What redb asked of the file, counted since the counters were made.
#[derive(Debug, Default)]
pub struct DiskCounters {
    /// `sync_data` calls: one `fdatasync` each.
    pub syncs: AtomicU64,
    /// `write` calls.
    pub writes: AtomicU64,
    /// Bytes passed to `write`.
    pub bytes_written: AtomicU64,
    /// `set_len` calls (the file grew or shrank).
    pub set_lens: AtomicU64,
    /// Nanoseconds spent inside `sync_data` (gate waits excluded).
    pub sync_ns: AtomicU64,
    /// Nanoseconds spent inside `write`.
    pub write_ns: AtomicU64,
    /// Bytes redb read from the file (what its page cache did not hold).
    pub bytes_read: AtomicU64,
}

impl DiskCounters {
    /// Every counter now: (syncs, writes, bytes written, set_lens, sync ns, write ns).
    pub fn read(&self) -> [u64; 6] {
        [
            &self.syncs,
            &self.writes,
            &self.bytes_written,
            &self.set_lens,
            &self.sync_ns,
            &self.write_ns,
        ]
        .map(|counter| counter.load(Ordering::Relaxed))
    }
}

#[derive(Debug, Default)]
struct GateState {
    is_closed: bool,
    /// Syncs held at the gate right now.
    held: usize,
}

/// Holds every `sync_data` while closed, so the commit calling it cannot return.
#[derive(Debug, Default)]
pub struct SyncGate {
    state: Mutex<GateState>,
    changed: Condvar,
}

impl SyncGate {
    /// Syncs from now on wait until [`SyncGate::open`].
    pub fn close(&self) {
        self.lock().is_closed = true;
    }

    /// Lets every held sync go on, and every later one pass.
    pub fn open(&self) {
        self.lock().is_closed = false;
        self.changed.notify_all();
    }

    /// Waits until at least `count` syncs are held, or `within` has passed; returns whether
    /// they are. The bound only keeps a broken test from hanging.
    pub fn wait_until_held(&self, count: usize, within: Duration) -> bool {
        let state = self.lock();
        let (state, _) = self
            .changed
            .wait_timeout_while(state, within, |state| state.held < count)
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        state.held >= count
    }

    fn pass(&self) {
        let mut state = self.lock();
        if !state.is_closed {
            return;
        }
        state.held += 1;
        self.changed.notify_all();
        while state.is_closed {
            state = self
                .changed
                .wait(state)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
        state.held -= 1;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

fn add_elapsed(counter: &AtomicU64, started: Instant) {
    let elapsed = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
    counter.fetch_add(elapsed, Ordering::Relaxed);
}

/// redb's file backend, counted, with an optional gate on its syncs.
#[derive(Debug)]
pub struct InstrumentedFile {
    inner: FileBackend,
    counters: Arc<DiskCounters>,
    gate: Option<Arc<SyncGate>>,
}

impl InstrumentedFile {
    /// Opens (or creates, 0600) the file at `path`.
    pub fn open(
        path: &Path,
        counters: Arc<DiskCounters>,
        gate: Option<Arc<SyncGate>>,
    ) -> io::Result<InstrumentedFile> {
        use std::os::unix::fs::OpenOptionsExt;
        let file: File = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)?;
        let inner = FileBackend::new(file);
        Ok(InstrumentedFile {
            inner,
            counters,
            gate,
        })
    }

    /// A journal source that opens `path` through this backend, on every (re)open.
    pub fn source(
        path: PathBuf,
        counters: Arc<DiskCounters>,
        gate: Option<Arc<SyncGate>>,
    ) -> Location {
        let name = path.clone();
        Location::Backend {
            name,
            factory: Arc::new(move || {
                let backend = InstrumentedFile::open(&path, Arc::clone(&counters), gate.clone())?;
                Ok(Box::new(backend) as Box<dyn StorageBackend>)
            }),
        }
    }
}

impl StorageBackend for InstrumentedFile {
    fn len(&self) -> Result<u64, redb::BackendError> {
        self.inner.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), redb::BackendError> {
        self.counters
            .bytes_read
            .fetch_add(out.len() as u64, Ordering::Relaxed);
        self.inner.read(offset, out)
    }
    fn set_len(&self, len: u64) -> Result<(), redb::BackendError> {
        self.counters.set_lens.fetch_add(1, Ordering::Relaxed);
        self.inner.set_len(len)
    }
    fn sync_data(&self) -> Result<(), redb::BackendError> {
        if let Some(gate) = &self.gate {
            gate.pass();
        }
        self.counters.syncs.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        let result = self.inner.sync_data();
        add_elapsed(&self.counters.sync_ns, started);
        result
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), redb::BackendError> {
        self.counters.writes.fetch_add(1, Ordering::Relaxed);
        self.counters
            .bytes_written
            .fetch_add(data.len() as u64, Ordering::Relaxed);
        let started = Instant::now();
        let result = self.inner.write(offset, data);
        add_elapsed(&self.counters.write_ns, started);
        result
    }
    fn close(&self) -> Result<(), redb::BackendError> {
        self.inner.close()
    }
    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.try_lock_range(start, end)
    }
    fn try_lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, BackendError> {
        self.inner.try_lock_shared_range(start, end)
    }
    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_range(start, end)
    }
    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_shared_range(start, end)
    }
    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.unlock_range(start, end)
    }
    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.query_lock_range(start, end)
    }
}
