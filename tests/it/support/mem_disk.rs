//! A disk in memory for the journal's redb storage backend, with the faults the crash tests
//! need: power cuts (only synced bytes survive, in the manner of redb's own crash-consistency
//! test), torn syncs, and an error (ENOSPC, EIO, ...) at a chosen write, sync, read, `len`,
//! `set_len` or open, once or until the test heals the disk.
//!
//! The disk keeps two images: `written`, what the process sees (the page cache), and `synced`,
//! what a power cut leaves. `sync_data` makes the written image durable. Every backend made by
//! [`MemDisk::backend`] is one open file: redb's byte-range locks are kept per backend on the
//! shared disk, so two handles over the same disk exclude each other as two processes on one
//! file would (the journal opens redb in `MultiWriter` mode, which requires range locks).

use std::io;
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use redb::{BackendError, StorageBackend};
use runjournal::journal::Location;

/// A write or a length change that has not been synced yet, in the order it was made.
#[derive(Debug, Clone)]
enum Change {
    Write { offset: usize, data: Vec<u8> },
    SetLen(usize),
}

impl Change {
    fn apply(&self, image: &mut Vec<u8>) {
        match self {
            Change::Write { offset, data } => {
                if image.len() < offset + data.len() {
                    image.resize(offset + data.len(), 0);
                }
                image[*offset..offset + data.len()].copy_from_slice(data);
            }
            Change::SetLen(len) => image.resize(*len, 0),
        }
    }
}

/// Which calls a fault counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    Write,
    Sync,
    Read,
    Len,
    SetLen,
    /// A new backend made by [`MemDisk::source`]'s factory: opening the journal file.
    Open,
}

impl Call {
    pub const ALL: [Call; 6] = [
        Call::Write,
        Call::Sync,
        Call::Read,
        Call::Len,
        Call::SetLen,
        Call::Open,
    ];

    pub fn index(self) -> usize {
        match self {
            Call::Write => 0,
            Call::Sync => 1,
            Call::Read => 2,
            Call::Len => 3,
            Call::SetLen => 4,
            Call::Open => 5,
        }
    }
}

/// ENOSPC.
pub const ENOSPC: i32 = 28;
/// EIO.
pub const EIO: i32 = 5;

/// What goes wrong, and when. Calls are counted from 1 over the disk's life, whichever backend
/// made them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fault {
    #[default]
    None,
    /// The `sync`-th sync completes; then the power goes: every later call fails with EIO and
    /// nothing more reaches the synced image.
    CutAfterSync { sync: u64 },
    /// The power goes during the `sync`-th sync: of the changes made since the sync before it,
    /// only the first `kept` reach the synced image (0: the written but unsynced is lost), and
    /// the sync and every later call fail with EIO.
    TornSync { sync: u64, kept: usize },
    /// ENOSPC at the `at`-th call of kind `on`. Persistent: that call and every later write and
    /// sync fail until [`MemDisk::free_space`]; otherwise only that one call fails.
    Enospc {
        on: Call,
        at: u64,
        is_persistent: bool,
    },
    /// The OS error `errno` at the `at`-th call of kind `on`. Persistent: that call and every
    /// later call of every kind (writes, syncs, reads, `len`, `set_len`, opens) fail with it
    /// until [`MemDisk::free_space`] heals the disk, as a flaky disk fails; otherwise only that
    /// one call fails.
    Fail {
        on: Call,
        at: u64,
        errno: i32,
        is_persistent: bool,
    },
}

#[derive(Debug, Default)]
struct State {
    written: Vec<u8>,
    synced: Vec<u8>,
    unsynced: Vec<Change>,
    /// Calls so far, per [`Call::index`].
    calls: [u64; 6],
    fault: Fault,
    /// The power was cut: every call fails.
    is_dead: bool,
    /// A persistent fault is in force.
    is_full: bool,
    injected: u64,
    /// Failures injected, per [`Call::index`].
    injected_by_call: [u64; 6],
    locks: Vec<Held>,
    lock_waiters: u64,
    lock_refusals: u64,
    next_backend: u64,
}

/// A byte-range lock held by one backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Held {
    backend: u64,
    start: u64,
    /// Exclusive end; `None` reaches past any length.
    end: Option<u64>,
    is_exclusive: bool,
}

impl Held {
    fn overlaps(&self, start: u64, end: Option<u64>) -> bool {
        let starts_before_their_end = end.is_none_or(|end| self.start < end);
        let ends_after_their_start = self.end.is_none_or(|own_end| start < own_end);
        starts_before_their_end && ends_after_their_start
    }
}

/// Longest a blocking lock waits before the backend reports the test as stuck.
const LOCK_WAIT: Duration = Duration::from_secs(30);

/// The shared disk.
#[derive(Debug, Default)]
pub struct MemDisk {
    state: Mutex<State>,
    lock_released: Condvar,
    is_space_freed: AtomicBool,
}

fn eio() -> io::Error {
    io::Error::from_raw_os_error(5)
}

fn range_of(start: Bound<u64>, end: Bound<u64>) -> Result<(u64, Option<u64>), BackendError> {
    let start = match start {
        Bound::Unbounded => 0,
        Bound::Included(start) => start,
        Bound::Excluded(start) => start + 1,
    };
    let end = match end {
        Bound::Unbounded => None,
        Bound::Included(end) => Some(end + 1),
        Bound::Excluded(end) => Some(end),
    };
    if end.is_some_and(|end| end <= start) {
        return Err(BackendError::Io(io::Error::new(
            io::ErrorKind::InvalidInput,
            "empty lock range",
        )));
    }
    Ok((start, end))
}

impl MemDisk {
    /// An empty disk with `fault` armed.
    pub fn new(fault: Fault) -> Arc<MemDisk> {
        let disk = MemDisk::default();
        disk.lock().fault = fault;
        Arc::new(disk)
    }

    /// A disk holding `image`, written and synced, without faults.
    pub fn with_image(image: Vec<u8>) -> Arc<MemDisk> {
        let disk = MemDisk::default();
        {
            let mut state = disk.lock();
            state.written = image.clone();
            state.synced = image;
        }
        Arc::new(disk)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A new open file on this disk.
    pub fn backend(self: &Arc<MemDisk>) -> DiskBackend {
        let mut state = self.lock();
        state.next_backend += 1;
        DiskBackend {
            disk: Arc::clone(self),
            id: state.next_backend,
        }
    }

    /// The journal source over this disk: each (re)open is a new file handle, and counts as
    /// a [`Call::Open`], which a fault may fail.
    pub fn source(self: &Arc<MemDisk>) -> Location {
        let disk = Arc::clone(self);
        Location::Backend {
            name: "mem-disk/journal.redb".into(),
            factory: Arc::new(move || {
                {
                    let mut state = disk.lock();
                    MemDisk::check_alive(&state)?;
                    disk.count_call(&mut state, Call::Open)?;
                }
                Ok(Box::new(disk.backend()) as Box<dyn StorageBackend>)
            }),
        }
    }

    /// What survives a power cut now.
    pub fn synced_image(&self) -> Vec<u8> {
        self.lock().synced.clone()
    }

    /// Calls of each kind so far: (writes, syncs).
    pub fn counts(&self) -> (u64, u64) {
        let state = self.lock();
        (
            state.calls[Call::Write.index()],
            state.calls[Call::Sync.index()],
        )
    }

    /// Calls of kind `call` so far.
    pub fn count(&self, call: Call) -> u64 {
        self.lock().calls[call.index()]
    }

    /// How many calls failed by design.
    pub fn injected(&self) -> u64 {
        self.lock().injected
    }

    /// How many calls of kind `call` failed by design.
    pub fn injected_on(&self, call: Call) -> u64 {
        self.lock().injected_by_call[call.index()]
    }

    /// Whether the power was cut.
    pub fn is_dead(&self) -> bool {
        self.lock().is_dead
    }

    /// Ends a persistent fault (frees space, heals a flaky disk).
    pub fn free_space(&self) {
        self.is_space_freed.store(true, Ordering::SeqCst);
        self.lock().is_full = false;
    }

    /// How many lock requests are waiting for a lock another handle holds.
    pub fn lock_waiters(&self) -> u64 {
        self.lock().lock_waiters
    }

    /// How many tries of a lock found it held by another handle so far: a bounded wait (the
    /// journal's, for its write lock) tries again and again instead of waiting in a request.
    pub fn lock_refusals(&self) -> u64 {
        self.lock().lock_refusals
    }

    /// Arms `fault` from now on (calls are still counted from the disk's first).
    pub fn set_fault(&self, fault: Fault) {
        self.is_space_freed.store(false, Ordering::SeqCst);
        let mut state = self.lock();
        state.fault = fault;
        state.is_full = false;
    }

    /// Ends every fault: calls from now on succeed (the power stays cut, though).
    pub fn disarm(&self) {
        self.free_space();
        self.lock().fault = Fault::None;
    }

    fn check_alive(state: &State) -> io::Result<()> {
        if state.is_dead { Err(eio()) } else { Ok(()) }
    }

    /// Counts a call of kind `call` and fails it if the fault says so.
    fn count_call(&self, state: &mut State, call: Call) -> io::Result<()> {
        state.calls[call.index()] += 1;
        let count = state.calls[call.index()];
        match self.injected_error(state, call, count) {
            Some(error) => {
                state.injected += 1;
                state.injected_by_call[call.index()] += 1;
                Err(error)
            }
            None => Ok(()),
        }
    }

    /// The error the `count`-th call of kind `call` fails with, if any.
    fn injected_error(&self, state: &mut State, call: Call, count: u64) -> Option<io::Error> {
        let (on, at, errno, is_persistent) = match state.fault {
            Fault::Enospc {
                on,
                at,
                is_persistent,
            } => (on, at, ENOSPC, is_persistent),
            Fault::Fail {
                on,
                at,
                errno,
                is_persistent,
            } => (on, at, errno, is_persistent),
            _ => return None,
        };
        if on == call && count == at {
            state.is_full = is_persistent && !self.is_space_freed.load(Ordering::SeqCst);
            return Some(io::Error::from_raw_os_error(errno));
        }
        // A full disk fails what needs space; a flaky one fails everything.
        let is_covered = match state.fault {
            Fault::Enospc { .. } => matches!(call, Call::Write | Call::Sync),
            _ => true,
        };
        if state.is_full && is_covered {
            return Some(io::Error::from_raw_os_error(errno));
        }
        None
    }
}

/// One open file on a [`MemDisk`].
#[derive(Debug)]
pub struct DiskBackend {
    disk: Arc<MemDisk>,
    id: u64,
}

impl DiskBackend {
    fn conflicts(&self, state: &State, start: u64, end: Option<u64>, is_exclusive: bool) -> bool {
        state.locks.iter().any(|held| {
            held.backend != self.id
                && held.overlaps(start, end)
                && (is_exclusive || held.is_exclusive)
        })
    }

    fn try_lock(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
        is_exclusive: bool,
    ) -> Result<bool, BackendError> {
        let (start, end) = range_of(start, end)?;
        let mut state = self.disk.lock();
        if self.conflicts(&state, start, end, is_exclusive) {
            state.lock_refusals += 1;
            return Ok(false);
        }
        state.locks.push(Held {
            backend: self.id,
            start,
            end,
            is_exclusive,
        });
        Ok(true)
    }

    fn wait_lock(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
        is_exclusive: bool,
    ) -> Result<(), BackendError> {
        let (start, end) = range_of(start, end)?;
        let deadline = Instant::now() + LOCK_WAIT;
        let mut state = self.disk.lock();
        state.lock_waiters += 1;
        while self.conflicts(&state, start, end, is_exclusive) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                state.lock_waiters -= 1;
                return Err(BackendError::Io(io::Error::other(format!(
                    "test disk: waited {} s for a lock on {start}..{end:?}; a handle leaked it",
                    LOCK_WAIT.as_secs()
                ))));
            }
            state = self
                .disk
                .lock_released
                .wait_timeout(state, left)
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .0;
        }
        state.lock_waiters -= 1;
        state.locks.push(Held {
            backend: self.id,
            start,
            end,
            is_exclusive,
        });
        Ok(())
    }
}

impl StorageBackend for DiskBackend {
    fn len(&self) -> Result<u64, redb::BackendError> {
        let mut state = self.disk.lock();
        MemDisk::check_alive(&state)?;
        self.disk.count_call(&mut state, Call::Len)?;
        Ok(state.written.len() as u64)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), redb::BackendError> {
        let mut state = self.disk.lock();
        MemDisk::check_alive(&state)?;
        self.disk.count_call(&mut state, Call::Read)?;
        let offset =
            usize::try_from(offset).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let Some(bytes) = state.written.get(offset..offset + out.len()) else {
            return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into());
        };
        out.copy_from_slice(bytes);
        Ok(())
    }

    fn set_len(&self, len: u64) -> Result<(), redb::BackendError> {
        let mut state = self.disk.lock();
        MemDisk::check_alive(&state)?;
        self.disk.count_call(&mut state, Call::SetLen)?;
        let len = usize::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let change = Change::SetLen(len);
        change.apply(&mut state.written);
        state.unsynced.push(change);
        Ok(())
    }

    fn sync_data(&self) -> Result<(), redb::BackendError> {
        let mut state = self.disk.lock();
        MemDisk::check_alive(&state)?;
        self.disk.count_call(&mut state, Call::Sync)?;
        let count = state.calls[Call::Sync.index()];
        match state.fault {
            Fault::TornSync { sync, kept } if sync == count => {
                let changes = std::mem::take(&mut state.unsynced);
                for change in changes.iter().take(kept) {
                    change.apply(&mut state.synced);
                }
                state.is_dead = true;
                state.injected += 1;
                return Err(eio().into());
            }
            _ => {}
        }
        state.synced = state.written.clone();
        state.unsynced.clear();
        if matches!(state.fault, Fault::CutAfterSync { sync } if sync == count) {
            state.is_dead = true;
            state.injected += 1;
        }
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), redb::BackendError> {
        let mut state = self.disk.lock();
        MemDisk::check_alive(&state)?;
        self.disk.count_call(&mut state, Call::Write)?;
        let offset =
            usize::try_from(offset).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let change = Change::Write {
            offset,
            data: data.to_vec(),
        };
        change.apply(&mut state.written);
        state.unsynced.push(change);
        Ok(())
    }

    fn close(&self) -> Result<(), redb::BackendError> {
        let mut state = self.disk.lock();
        state.locks.retain(|held| held.backend != self.id);
        drop(state);
        self.disk.lock_released.notify_all();
        Ok(())
    }

    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.try_lock(start, end, true)
    }

    fn try_lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, BackendError> {
        self.try_lock(start, end, false)
    }

    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.wait_lock(start, end, true)
    }

    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.wait_lock(start, end, false)
    }

    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        let (start, end) = range_of(start, end)?;
        let mut state = self.disk.lock();
        let position = state
            .locks
            .iter()
            .position(|held| held.backend == self.id && held.start == start && held.end == end);
        let Some(position) = position else {
            return Err(BackendError::Io(io::Error::other(format!(
                "test disk: unlock of {start}..{end:?}, which this handle does not hold"
            ))));
        };
        state.locks.remove(position);
        drop(state);
        self.disk.lock_released.notify_all();
        Ok(())
    }

    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        let (start, end) = range_of(start, end)?;
        let state = self.disk.lock();
        Ok(state
            .locks
            .iter()
            .any(|held| held.backend != self.id && held.overlaps(start, end)))
    }
}
