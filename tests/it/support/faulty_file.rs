//! A real journal file behind redb's own [`FileBackend`], with one fault armed on cue: the
//! k-th call of one kind (write, sync, read, len, set_len, or opening the file) from the moment
//! it is armed fails once, with the errno chosen (ENOSPC,
//! EIO). Every backend a [`Faults`] makes shares it, so a journal's writer reopening after the
//! failure goes through the same counters, and the next attempt succeeds.
//!
//! Unlike [`super::mem_disk`], the bytes are in a real file, so other handles (a `Store` for a
//! reconcile pass, a plain `Journal::open`) can open the same journal beside it.

use std::io;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use redb::backends::FileBackend;
use redb::{BackendError, StorageBackend};
use runjournal::journal::Location;

use super::mem_disk::Call;

/// One fault: the `at`-th call of kind `on`, counted from when it was armed, fails with `errno`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    pub on: Call,
    pub at: u64,
    pub errno: i32,
}

#[derive(Debug, Default)]
struct State {
    armed: Option<Fault>,
    /// Calls of each kind since arming, by [`Call::index`].
    counts: [u64; Call::ALL.len()],
    has_fired: bool,
}

/// The fault shared by every backend of one journal.
#[derive(Debug, Default)]
pub struct Faults {
    state: Mutex<State>,
}

impl Faults {
    pub fn new() -> Arc<Faults> {
        Arc::new(Faults::default())
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Arms `fault`, counting calls from now.
    pub fn arm(&self, fault: Fault) {
        let mut state = self.lock();
        *state = State {
            armed: Some(fault),
            ..State::default()
        };
    }

    /// Disarms; returns whether the fault fired since it was armed.
    pub fn disarm(&self) -> bool {
        let mut state = self.lock();
        state.armed = None;
        std::mem::take(&mut state.has_fired)
    }

    /// Calls since the fault was last armed: (writes, syncs).
    pub fn counts(&self) -> (u64, u64) {
        let state = self.lock();
        (
            state.counts[Call::Write.index()],
            state.counts[Call::Sync.index()],
        )
    }

    /// Counts a call; the error to fail it with, if it is the armed one.
    fn count(&self, call: Call) -> Option<io::Error> {
        let mut state = self.lock();
        state.counts[call.index()] += 1;
        let count = state.counts[call.index()];
        let fault = state.armed?;
        if fault.on != call || fault.at != count || state.has_fired {
            return None;
        }
        state.has_fired = true;
        Some(io::Error::from_raw_os_error(fault.errno))
    }

    /// A journal source over the file at `path` whose every (re)open is a backend of these
    /// faults.
    pub fn source(self: &Arc<Faults>, path: &Path) -> Location {
        let faults = Arc::clone(self);
        let file = path.to_path_buf();
        Location::Backend {
            name: path.to_path_buf(),
            factory: Arc::new(move || {
                if let Some(error) = faults.count(Call::Open) {
                    return Err(error);
                }
                Ok(Box::new(FaultyFile::open(&file, Arc::clone(&faults))?)
                    as Box<dyn StorageBackend>)
            }),
        }
    }
}

/// redb's file backend with the shared fault in front of every call that reaches the file.
#[derive(Debug)]
pub struct FaultyFile {
    inner: FileBackend,
    faults: Arc<Faults>,
}

impl FaultyFile {
    fn open(path: &PathBuf, faults: Arc<Faults>) -> io::Result<FaultyFile> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)?;
        let inner = FileBackend::new(file);
        Ok(FaultyFile { inner, faults })
    }
}

impl StorageBackend for FaultyFile {
    fn len(&self) -> Result<u64, redb::BackendError> {
        match self.faults.count(Call::Len) {
            Some(error) => Err(error.into()),
            None => self.inner.len(),
        }
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), redb::BackendError> {
        match self.faults.count(Call::Read) {
            Some(error) => Err(error.into()),
            None => self.inner.read(offset, out),
        }
    }
    fn set_len(&self, len: u64) -> Result<(), redb::BackendError> {
        match self.faults.count(Call::SetLen) {
            Some(error) => Err(error.into()),
            None => self.inner.set_len(len),
        }
    }
    fn sync_data(&self) -> Result<(), redb::BackendError> {
        match self.faults.count(Call::Sync) {
            Some(error) => Err(error.into()),
            None => self.inner.sync_data(),
        }
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), redb::BackendError> {
        match self.faults.count(Call::Write) {
            Some(error) => Err(error.into()),
            None => self.inner.write(offset, data),
        }
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
