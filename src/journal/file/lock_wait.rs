//! Waiting for redb's locks on the journal file while another process may hold them.
//!
//! redb serialises the processes of a journal with byte-range locks of the file: a write
//! transaction holds the writer byte from its begin to its commit, a handle opened for writing
//! takes that byte for a moment, and a commit holds the header lock while it writes the header.
//! redb's own waits for these locks are unbounded. A process stopped while it holds one
//! (SIGSTOP, a frozen cgroup, a debugger) would so hold every other process of the home for as
//! long as it stays stopped. Here every such wait is bounded, as [`LockWait`] says: after
//! [`LockWait::notice_after`] the waiter is told (a runner marks itself blocked, for `status`
//! and `list` to show, and says so in its log), and after [`LockWait::give_up_after`] it stops
//! waiting, having written nothing.
//!
//! The waits poll: a lock is tried, and tried again after a short sleep that grows to
//! [`MAX_POLL_DELAY`], as SQLite's busy handler does. There is no way to bound a blocking
//! `fcntl` lock (redb retries it when a signal interrupts it), and a thread per wait costs more
//! than the wait it bounds when many processes commit alone.
//!
//! Two places wait: `begin_write`, through redb's `try_begin_write`, and the backend every
//! journal file is handed to redb through (`PatientLocks`), whose blocking lock methods wait
//! as the calling thread's `within` scope says (an open, a reopen), and otherwise for the
//! bound the handle was opened with.
//!
//! Invariants:
//! * an uncontended lock costs one try: no thread, no timer, no sleep;
//! * a wait that is given up leaves nothing behind that could write: nothing was locked, and
//!   the caller is told nothing was begun;
//! * every wait of a handle is bounded once its bound is set; only a handle opened outside any
//!   scope with a bound of `None` waits as redb would.

use std::cell::RefCell;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

use redb::{BackendError, Database, TransactionError, WriteTransaction};

use super::pages::{FileId, PageBound};
use crate::event::now_ms;
use crate::journal::format::error::LockHeld;

/// How long a wait for one of the journal's locks lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockWait {
    /// After this long the wait is reported (see [`LockHeld`]).
    pub notice_after: Duration,
    /// After this long the wait is given up, nothing written; `None`: it waits on, as redb
    /// would (nothing in runjournal asks for that).
    pub give_up_after: Option<Duration>,
}

impl LockWait {
    /// Reports after a moment, gives up after `bound`: a command's bound
    /// ([`command_bound_from_env`]), a runner's (its I/O retry window: it cannot record its
    /// transitions, as on flaky storage).
    pub fn give_up_after(bound: Duration) -> LockWait {
        LockWait {
            notice_after: DEFAULT_NOTICE_AFTER.min(bound),
            give_up_after: Some(bound),
        }
    }
}

impl Default for LockWait {
    /// A runner's: gives up after the default I/O retry window.
    fn default() -> LockWait {
        LockWait::give_up_after(crate::capacity::DEFAULT_IO_RETRY_WINDOW)
    }
}

/// How long a wait for the write lock goes unreported: a commit of another process takes two
/// fsyncs, far less than this even on a slow disk.
pub const DEFAULT_NOTICE_AFTER: Duration = Duration::from_secs(2);

/// How long a command waits for the write lock by default before it gives up.
pub const DEFAULT_COMMAND_BOUND: Duration = Duration::from_secs(10);

/// The environment variable that sets how long a command waits for the write lock (a
/// duration: `10s`, `1m`).
pub const LOCK_TIMEOUT_ENV: &str = "RUNJOURNAL_LOCK_TIMEOUT";

/// A command's bound from [`LOCK_TIMEOUT_ENV`]; unset or blank, the default.
pub fn command_bound_from_env() -> Result<Duration, String> {
    match std::env::var(LOCK_TIMEOUT_ENV) {
        Ok(text) if !text.trim().is_empty() => crate::duration::parse_duration(&text)
            .map_err(|error| format!("{LOCK_TIMEOUT_ENV}={text:?}: {error}")),
        Ok(_) | Err(std::env::VarError::NotPresent) => Ok(DEFAULT_COMMAND_BOUND),
        Err(std::env::VarError::NotUnicode(text)) => {
            Err(format!("{LOCK_TIMEOUT_ENV}={text:?}: not UTF-8"))
        }
    }
}

/// The sleeps between two tries of a lock: short at first, for a lock that another process's
/// commit frees within a millisecond, then [`MAX_POLL_DELAY`].
const POLL_DELAYS_US: [u64; 6] = [20, 50, 100, 200, 500, 1000];

/// The longest sleep between two tries of a lock: what a waiter may lose of a lock freed
/// meanwhile, and a bound on how often a long wait tries (500 times a second).
pub const MAX_POLL_DELAY: Duration = Duration::from_millis(2);

/// One wait for a lock: when to sleep, when to report, when to give up.
struct Waiting<'a> {
    wait: LockWait,
    path: Option<&'a Path>,
    started: Instant,
    since_ms: u64,
    tries: usize,
    /// Who holds the lock, looked for once (a scan of /proc), at the notice.
    noticed: Option<LockHeld>,
}

impl<'a> Waiting<'a> {
    fn new(wait: LockWait, path: Option<&'a Path>) -> Waiting<'a> {
        Waiting {
            wait,
            path,
            started: Instant::now(),
            since_ms: now_ms(),
            tries: 0,
            noticed: None,
        }
    }

    /// After a refused try: tells `on_notice` once the wait has lasted its notice, then sleeps
    /// until the next try; `Err` once the wait has lasted its bound.
    fn after_refusal(&mut self, on_notice: &mut dyn FnMut(&LockHeld)) -> Result<(), LockHeld> {
        let elapsed = self.started.elapsed();
        if self.noticed.is_none() && elapsed >= self.wait.notice_after {
            let held = self.held();
            on_notice(&held);
            self.noticed = Some(held);
        }
        if let Some(bound) = self.wait.give_up_after
            && elapsed >= bound
        {
            return Err(self.noticed.take().unwrap_or_else(|| self.held()));
        }
        let delay = POLL_DELAYS_US
            .get(self.tries)
            .map_or(MAX_POLL_DELAY, |&us| Duration::from_micros(us));
        self.tries += 1;
        // Never past the next moment something is due.
        let due = match (self.noticed.is_none(), self.wait.give_up_after) {
            (true, _) => Some(self.wait.notice_after),
            (false, bound) => bound,
        };
        let delay = due.map_or(delay, |due| delay.min(due.saturating_sub(elapsed)));
        std::thread::sleep(delay);
        Ok(())
    }

    fn held(&self) -> LockHeld {
        LockHeld {
            since_ms: self.since_ms,
            holder: self
                .path
                .and_then(crate::platform::journal_write_lock_holder),
        }
    }
}

/// Why no write transaction was begun.
#[derive(Debug)]
pub(crate) enum BeginError {
    /// redb refused (an I/O error, a closed handle, ...).
    Redb(TransactionError),
    /// The lock stayed held past [`LockWait::give_up_after`].
    GaveUp(LockHeld),
}

/// Begins a write transaction on `db` (the journal file at `path`), waiting for the write lock
/// as `wait` says; `on_notice` is told once the wait has lasted `wait.notice_after`.
pub(crate) fn begin_write(
    db: &Database,
    path: Option<&Path>,
    wait: &LockWait,
    on_notice: &mut dyn FnMut(&LockHeld),
) -> Result<WriteTransaction, BeginError> {
    let mut waiting: Option<Waiting> = None;
    loop {
        // A panic of redb's on damaged bytes is damage, answered as such.
        let begun = super::contain::contain(|| db.try_begin_write()).unwrap_or_else(|panic| {
            Err(TransactionError::Storage(redb::StorageError::Corrupted(
                panic.to_string(),
            )))
        });
        match begun {
            Ok(txn) => return Ok(txn),
            Err(TransactionError::WouldBlock) => {}
            Err(error) => return Err(BeginError::Redb(error)),
        }
        waiting
            .get_or_insert_with(|| Waiting::new(*wait, path))
            .after_refusal(on_notice)
            .map_err(BeginError::GaveUp)?;
    }
}

/// What a [`within`] scope is told of its lock waits.
pub(crate) type OnNotice = Box<dyn FnMut(&LockHeld)>;

/// A scope of [`within`]: how its lock waits go, and whether one was given up.
struct Scope {
    wait: LockWait,
    on_notice: OnNotice,
    gave_up: Option<LockHeld>,
}

thread_local! {
    /// The scope of the innermost [`within`] on this thread.
    static SCOPE: RefCell<Option<Rc<RefCell<Scope>>>> = const { RefCell::new(None) };
}

/// Whether a call made [`within`] a bound gave up a lock wait.
#[derive(Debug)]
pub(crate) enum Within<E> {
    /// The call failed otherwise.
    Failed(E),
    /// A lock of the journal stayed held past the bound; the call failed for it.
    GaveUp(LockHeld),
}

/// Runs `call` (an open or a reopen of the journal) with every wait for the journal file's locks
/// bounded as `wait` says: `on_notice` is told of a wait past its notice, and a wait past its
/// bound fails the call, which then returns [`Within::GaveUp`]. Handles opened during the call
/// keep `wait`'s bound for their later waits.
pub(crate) fn within<T, E>(
    wait: &LockWait,
    on_notice: OnNotice,
    call: impl FnOnce() -> Result<T, E>,
) -> Result<T, Within<E>> {
    let scope = Rc::new(RefCell::new(Scope {
        wait: *wait,
        on_notice,
        gave_up: None,
    }));
    let outer = SCOPE.with(|current| current.replace(Some(Rc::clone(&scope))));
    // Put back on the way out, a panic included.
    struct Restore(Option<Option<Rc<RefCell<Scope>>>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            if let Some(outer) = self.0.take() {
                SCOPE.with(|current| *current.borrow_mut() = outer);
            }
        }
    }
    let restore = Restore(Some(outer));
    let result = call();
    drop(restore);
    let gave_up = scope.borrow_mut().gave_up.take();
    match (result, gave_up) {
        (Ok(value), _) => Ok(value),
        (Err(_), Some(held)) => Err(Within::GaveUp(held)),
        (Err(error), None) => Err(Within::Failed(error)),
    }
}

/// The bound of the innermost [`within`] scope on this thread, if any.
fn scope_bound() -> Option<Option<Duration>> {
    SCOPE.with(|current| {
        current
            .borrow()
            .as_ref()
            .map(|scope| scope.borrow().wait.give_up_after)
    })
}

/// A journal file's backend whose blocking lock methods wait with a bound (see the module's
/// docs): inside a [`within`] scope as the scope says, outside one for the bound of the scope
/// it was made in (none: as redb would).
#[derive(Debug)]
pub(crate) struct PatientLocks<B> {
    inner: B,
    path: Option<PathBuf>,
    /// The bound of waits made outside any scope.
    bound: Option<Duration>,
    /// What every page read through it is checked against before redb sees it.
    pages: PageBound,
}

impl<B: redb::StorageBackend> PatientLocks<B> {
    /// `inner`, the journal file at `path` (of identity `file`, when it is a file), with the
    /// bound of the current scope.
    pub(crate) fn new(inner: B, path: Option<&Path>, file: Option<FileId>) -> PatientLocks<B> {
        PatientLocks {
            inner,
            path: path.map(Path::to_path_buf),
            bound: scope_bound().flatten(),
            pages: PageBound::new(file),
        }
    }

    /// Takes a lock with `try_once`, waiting between tries as the current scope (or this
    /// backend's bound) says; `blocking` for a backend that cannot try.
    fn wait(
        &self,
        try_once: impl Fn() -> Result<bool, BackendError>,
        blocking: impl FnOnce() -> Result<(), BackendError>,
    ) -> Result<(), BackendError> {
        match try_once() {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(BackendError::Unsupported) => return blocking(),
            Err(error) => return Err(error),
        }
        let scope = SCOPE.with(|current| current.borrow().clone());
        let wait = match &scope {
            Some(scope) => scope.borrow().wait,
            None => match self.bound {
                Some(bound) => LockWait::give_up_after(bound),
                None => return blocking(),
            },
        };
        let mut waiting = Waiting::new(wait, self.path.as_deref());
        let mut on_notice = |held: &LockHeld| {
            if let Some(scope) = &scope {
                (scope.borrow_mut().on_notice)(held);
            }
        };
        loop {
            if let Err(held) = waiting.after_refusal(&mut on_notice) {
                let message = held.to_string();
                if let Some(scope) = &scope {
                    scope.borrow_mut().gave_up = Some(held);
                }
                return Err(BackendError::Io(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    message,
                )));
            }
            if try_once()? {
                return Ok(());
            }
        }
    }
}

impl<B: redb::StorageBackend> redb::StorageBackend for PatientLocks<B> {
    fn len(&self) -> Result<u64, redb::BackendError> {
        self.inner.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), redb::BackendError> {
        self.inner.read(offset, out)?;
        Ok(self.pages.check(&self.inner, offset, out)?)
    }
    fn set_len(&self, len: u64) -> Result<(), redb::BackendError> {
        self.inner.set_len(len)
    }
    fn sync_data(&self) -> Result<(), redb::BackendError> {
        self.inner.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), redb::BackendError> {
        self.inner.write(offset, data)
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
        self.wait(
            || self.inner.try_lock_range(start, end),
            || self.inner.lock_range(start, end),
        )
    }
    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.wait(
            || self.inner.try_lock_shared_range(start, end),
            || self.inner.lock_shared_range(start, end),
        )
    }
    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.unlock_range(start, end)
    }
    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.query_lock_range(start, end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::file::open::builder;

    /// A journal file, a handle of it (opened through [`PatientLocks`] while nothing holds the
    /// lock: opening takes it), and a second handle inside a write transaction, holding the
    /// writer byte as a stopped process would.
    fn held_journal() -> (
        tempfile::TempDir,
        PathBuf,
        Database,
        Database,
        WriteTransaction,
    ) {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("journal.redb");
        drop(crate::journal::Journal::open(&path).expect("a journal"));
        let db = opened(&path);
        let holder = builder().create(&path).expect("a second handle");
        let txn = holder.begin_write().expect("the writer byte");
        (dir, path, db, holder, txn)
    }

    fn opened(path: &Path) -> Database {
        let file = crate::durable_fs::open_existing_read_write(path).expect("open");
        let backend = redb::backends::FileBackend::new(file);
        builder()
            .create_with_backend(PatientLocks::new(backend, Some(path), None))
            .expect("opens")
    }

    /// A wait that reports at once and gives up after `bound`.
    fn short(bound: Duration) -> LockWait {
        LockWait {
            notice_after: Duration::ZERO,
            give_up_after: Some(bound),
        }
    }

    #[test]
    fn a_write_begun_while_another_handle_holds_the_lock_is_given_up_after_its_bound() {
        let (_dir, path, db, _holder, _txn) = held_journal();
        let mut notices = 0;
        let begun = begin_write(
            &db,
            Some(&path),
            &short(Duration::from_millis(50)),
            &mut |_| notices += 1,
        );
        assert!(
            matches!(begun, Err(BeginError::GaveUp(_))),
            "given up: {:?}",
            begun.map(|_| ())
        );
        assert_eq!(notices, 1, "told once");
    }

    #[test]
    fn a_write_begins_as_soon_as_the_lock_is_let_go() {
        let (_dir, path, db, holder, txn) = held_journal();
        let letting_go = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            drop(txn);
            holder
        });
        let begun = begin_write(
            &db,
            Some(&path),
            &short(Duration::from_secs(30)),
            &mut |_| {},
        );
        assert!(begun.is_ok(), "begun once let go");
        drop(letting_go.join().expect("the holder"));
    }

    #[test]
    fn an_open_for_writing_while_the_lock_is_held_is_given_up_within_its_scope() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};
        let (_dir, path, _db, _holder, _txn) = held_journal();
        let told = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&told);
        let location = crate::journal::file::Location::Path(path.clone());
        let opened = within(
            &short(Duration::from_millis(50)),
            Box::new(move |_| {
                counter.fetch_add(1, Ordering::Relaxed);
            }),
            || crate::journal::file::open::reopen_location(&location),
        );
        assert!(
            matches!(opened, Err(Within::GaveUp(_))),
            "given up: {:?}",
            opened.map(|_| ())
        );
        assert_eq!(told.load(Ordering::Relaxed), 1, "told once");
    }

    /// A thread started for each contended wait cost more than the wait it bounded when many
    /// processes commit alone: a wait (to begin a write, or an open's) polls on the waiting
    /// thread and starts none. Counted in a child test process of its own, where no other test
    /// starts threads meanwhile.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_contended_wait_starts_no_thread() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        const CHILD: &str = "RUNJOURNAL_TEST_LOCK_WAIT_THREADS";
        let Some(report) = std::env::var_os(CHILD) else {
            let dir = tempfile::tempdir().expect("temp dir");
            let report = dir.path().join("report");
            let mut child =
                std::process::Command::new(std::env::current_exe().expect("the binary"))
                    .args([
                        "--exact",
                        "journal::file::lock_wait::tests::a_contended_wait_starts_no_thread",
                        "--test-threads=1",
                    ])
                    .env(CHILD, &report)
                    .stdout(std::process::Stdio::null())
                    .spawn()
                    .expect("runs");
            let deadline = Instant::now() + Duration::from_secs(120);
            let status = loop {
                if let Some(status) = child.try_wait().expect("waits") {
                    break status;
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    panic!("the child test overran its bound");
                }
                std::thread::sleep(Duration::from_millis(20));
            };
            assert!(status.success(), "the child test: {status}");
            let counted = std::fs::read_to_string(&report).expect("the child counted");
            assert_eq!(counted, "no thread started", "{counted}");
            return;
        };
        let tasks = || crate::platform::thread_count().ok().flatten().unwrap_or(0);
        let (_dir, path, db, _holder, _txn) = held_journal();
        let waiting = Arc::new(AtomicBool::new(true));
        let most = Arc::new(AtomicUsize::new(0));
        let sampler = {
            let (waiting, most) = (Arc::clone(&waiting), Arc::clone(&most));
            std::thread::spawn(move || {
                while waiting.load(Ordering::Acquire) {
                    most.fetch_max(tasks(), Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(1));
                }
            })
        };
        // The sampler is running: every thread there is now is counted here.
        std::thread::sleep(Duration::from_millis(20));
        let before = tasks();
        let begun = begin_write(
            &db,
            Some(&path),
            &short(Duration::from_millis(300)),
            &mut |_| {
                most.fetch_max(tasks(), Ordering::Relaxed);
            },
        );
        assert!(matches!(begun, Err(BeginError::GaveUp(_))), "given up");
        let location = crate::journal::file::Location::Path(path.clone());
        let opened = within(
            &short(Duration::from_millis(300)),
            Box::new(move |_| {}),
            || crate::journal::file::open::reopen_location(&location),
        );
        assert!(matches!(opened, Err(Within::GaveUp(_))), "given up");
        waiting.store(false, Ordering::Release);
        sampler.join().expect("the sampler");
        let most = most.load(Ordering::Relaxed);
        let counted = if most <= before {
            "no thread started".to_owned()
        } else {
            format!("{most} threads while waiting, {before} before")
        };
        std::fs::write(report, counted).expect("report");
    }
}
