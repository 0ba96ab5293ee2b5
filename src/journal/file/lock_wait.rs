//! Beginning a write transaction while another process may hold the journal's write lock.
//!
//! redb's `begin_write` waits, unbounded, while another process is inside a write transaction
//! of the same file (in `MultiWriter` mode the lock is a byte-range lock of the file). A
//! process stopped inside one (SIGSTOP, a frozen cgroup, a debugger) would so hold every
//! other process of the home for as long as it stays stopped. Here the wait is seen: after
//! [`LockWait::notice_after`] the caller is told (a runner marks itself blocked, for `status`
//! and `list` to show), and a caller with [`LockWait::give_up_after`] (a command) stops
//! waiting then, having written nothing.
//!
//! Invariants:
//! * an uncontended begin costs what redb's `try_begin_write` costs: no thread, no timer;
//! * a wait that is given up leaves nothing behind that could write: the helper thread that
//!   still waits for the lock drops the transaction it eventually gets, uncommitted.

use std::path::Path;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use redb::{Database, TransactionError, WriteTransaction};

use crate::event::now_ms;
use crate::journal::format::error::LockHeld;

/// How long a commit waits for the journal's write lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockWait {
    /// After this long the wait is reported (see [`LockHeld`]).
    pub notice_after: Duration,
    /// After this long the commit gives up, nothing written; `None`: it waits on.
    pub give_up_after: Option<Duration>,
}

impl LockWait {
    /// What a runner does: report after a moment, wait on.
    pub const WAIT_ON: LockWait = LockWait {
        notice_after: DEFAULT_NOTICE_AFTER,
        give_up_after: None,
    };

    /// What a command does: report after a moment, give up after `bound`.
    pub fn give_up_after(bound: Duration) -> LockWait {
        LockWait {
            notice_after: DEFAULT_NOTICE_AFTER.min(bound),
            give_up_after: Some(bound),
        }
    }
}

impl Default for LockWait {
    fn default() -> LockWait {
        LockWait::WAIT_ON
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
    db: &Arc<Database>,
    path: Option<&Path>,
    wait: &LockWait,
    on_notice: &mut dyn FnMut(&LockHeld),
) -> Result<WriteTransaction, BeginError> {
    match db.try_begin_write() {
        Ok(txn) => return Ok(txn),
        Err(TransactionError::WouldBlock) => {}
        Err(error) => return Err(BeginError::Redb(error)),
    }
    let started = Instant::now();
    let since_ms = now_ms();
    // redb's own wait, on a thread of its own so that this one can stop waiting.
    let (sender, receiver) = mpsc::sync_channel(1);
    let waiter = Arc::clone(db);
    let spawned = std::thread::Builder::new()
        .name("runjournal-write-lock".to_string())
        .spawn(move || {
            // Nobody left to take it (the caller gave up): the transaction is dropped,
            // uncommitted, which writes nothing. A panic of redb's on damaged bytes is
            // damage, answered as such rather than as a thread that vanished.
            let begun = super::contain::contain(|| waiter.begin_write()).unwrap_or_else(|panic| {
                Err(TransactionError::Storage(redb::StorageError::Corrupted(
                    panic.to_string(),
                )))
            });
            let _ = sender.send(begun);
        });
    if spawned.is_err() {
        // No thread to wait on: wait here, unbounded, as redb would.
        return db.begin_write().map_err(BeginError::Redb);
    }
    // Who holds the lock, looked for once (a scan of /proc), at the notice.
    let mut noticed: Option<LockHeld> = None;
    loop {
        let elapsed = started.elapsed();
        let next = match noticed {
            Some(_) => wait.give_up_after,
            None => Some(wait.notice_after),
        };
        let received = match next {
            Some(at) => receiver.recv_timeout(at.saturating_sub(elapsed)),
            None => receiver
                .recv()
                .map_err(|_| mpsc::RecvTimeoutError::Disconnected),
        };
        match received {
            Ok(result) => return result.map_err(BeginError::Redb),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(BeginError::Redb(TransactionError::Storage(
                    redb::StorageError::Io(std::io::Error::other(
                        "the thread waiting for the journal's write lock ended without an answer",
                    )),
                )));
            }
            Err(mpsc::RecvTimeoutError::Timeout) => match noticed.take() {
                Some(held) => return Err(BeginError::GaveUp(held)),
                None => {
                    let held = LockHeld {
                        since_ms,
                        holder: path.and_then(crate::platform::journal_write_lock_holder),
                    };
                    on_notice(&held);
                    noticed = Some(held);
                }
            },
        }
    }
}
