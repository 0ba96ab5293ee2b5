//! How a journal handle writes: its options, what its writer reports while it fights a full
//! disk or flaky storage, and whether it shares its commits with other processes.

use std::sync::Arc;
use std::time::Duration;

use crate::capacity::{self, BlockCause, Reserve};
use crate::journal::file::lock_wait::LockWait;

/// What the writer reports while it fights a full disk or flaky storage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CapacityEvent {
    /// A commit failed for lack of space (or file handles), or on a storage error; the writer
    /// keeps trying (for a storage error, until its retry window ends). Reported again when
    /// the cause changes.
    Blocked {
        since_ms: u64,
        error: String,
        cause: BlockCause,
    },
    /// The reserve file was deleted to make room.
    ReserveReleased { bytes: u64 },
    /// A commit landed again after being blocked.
    Unblocked { blocked_ms: u64 },
    /// The reserve file is back.
    ReserveRestored { bytes: u64 },
    /// Storage errors outlasted the retry window: the waiting callers get the error, and until
    /// a commit lands again each group is tried once.
    GaveUp { blocked_ms: u64, error: String },
}

/// Receives [`CapacityEvent`]s, e.g. to write a line to the runner's log.
pub type CapacityListener = Arc<dyn Fn(&CapacityEvent) + Send + Sync>;

/// How a journal handle writes.
#[derive(Clone)]
pub struct WriterOptions {
    /// Most appends waiting in the queue before callers wait to submit.
    pub queue_capacity: usize,
    /// Most events committed in one write transaction (a single larger batch goes alone).
    pub max_group_events: usize,
    /// The space reserve released on a capacity error.
    pub reserve: Option<Reserve>,
    /// Where to mark this writer blocked for other processes to see (a home's root).
    pub blocked_markers: Option<crate::home::Home>,
    pub listener: Option<CapacityListener>,
    /// How long storage errors that are not about capacity (EIO, EROFS, ETIMEDOUT, ...) are
    /// retried, from the first failure of a streak, before the waiting callers get the error.
    /// Zero: one attempt.
    pub io_retry_window: Duration,
    /// Whether this handle's commits are shared with the other processes that have the same
    /// journal open (through a commit leader: see `share`), or made alone.
    pub commit_sharing: CommitSharing,
    /// How long this handle, as a client, waits for a word from the commit leader before it
    /// takes it for stopped and commits alone.
    pub leader_timeout: Duration,
    /// How long a commit waits for the journal's write lock held by another process.
    pub lock_wait: LockWait,
}

impl Default for WriterOptions {
    fn default() -> WriterOptions {
        WriterOptions {
            queue_capacity: 1024,
            max_group_events: 4096,
            reserve: None,
            blocked_markers: None,
            listener: None,
            io_retry_window: capacity::DEFAULT_IO_RETRY_WINDOW,
            commit_sharing: CommitSharing::default(),
            leader_timeout: DEFAULT_LEADER_TIMEOUT,
            lock_wait: LockWait::default(),
        }
    }
}

/// Whether a journal handle shares its commits with other processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CommitSharing {
    /// Hand groups to the journal's commit leader when there is one; when there is none, lead
    /// unless this process has a controlling terminal (the default). Job control (Ctrl-Z)
    /// stops a process of a terminal, and a stopped leader would hold up every client until
    /// it is resumed; a runner, in a session of its own, has no terminal and leads.
    #[default]
    Shared,
    /// As `Shared`, and lead even with a controlling terminal: for a process that knows it will
    /// not be stopped (tests, benchmarks).
    Lead,
    /// Hand groups to the leader when there is one, never lead: for short-lived commands (the
    /// `runjournal` CLI's own), whose leadership would pass on at once, and which a user may
    /// stop; the runners they start lead.
    Join,
    /// Commit every group in a write transaction of this handle's own.
    Alone,
}

impl CommitSharing {
    /// The environment variable that turns sharing off for a process: `off` (or `on`).
    pub const ENV: &'static str = "RUNJOURNAL_COMMIT_SHARING";

    /// From [`CommitSharing::ENV`]: `on` (or unset) shares, `lead` shares and leads even
    /// from a terminal, `join` shares without leading, `off` commits alone.
    pub fn from_env() -> Result<CommitSharing, String> {
        match std::env::var(Self::ENV) {
            Err(std::env::VarError::NotPresent) => Ok(CommitSharing::Shared),
            Ok(value) if value == "on" => Ok(CommitSharing::Shared),
            Ok(value) if value == "lead" => Ok(CommitSharing::Lead),
            Ok(value) if value == "join" => Ok(CommitSharing::Join),
            Ok(value) if value == "off" => Ok(CommitSharing::Alone),
            Ok(value) => Err(format!(
                "{}={value:?}: expected on, lead, join or off",
                Self::ENV
            )),
            Err(std::env::VarError::NotUnicode(value)) => Err(format!(
                "{}={value:?}: expected on, lead, join or off",
                Self::ENV
            )),
        }
    }

    /// The value of [`CommitSharing::ENV`] that means this.
    pub fn as_env_value(self) -> &'static str {
        match self {
            CommitSharing::Shared => "on",
            CommitSharing::Lead => "lead",
            CommitSharing::Join => "join",
            CommitSharing::Alone => "off",
        }
    }
}

/// How long a client waits for a word from its leader (the hello's answer, or any frame while
/// a group is out) before it takes the leader for stopped and commits alone, by default. A
/// leader at work says so four times within it.
pub const DEFAULT_LEADER_TIMEOUT: Duration = Duration::from_secs(2);

/// The environment variable that sets [`WriterOptions::leader_timeout`] (a duration: `2s`,
/// `500ms`).
///
/// [`WriterOptions::leader_timeout`]: WriterOptions::leader_timeout
pub const LEADER_TIMEOUT_ENV: &str = "RUNJOURNAL_LEADER_TIMEOUT";

/// The leader timeout from [`LEADER_TIMEOUT_ENV`]; unset or blank, the default. At least a
/// millisecond.
pub fn leader_timeout_from_env() -> Result<Duration, String> {
    match std::env::var(LEADER_TIMEOUT_ENV) {
        Ok(text) if !text.trim().is_empty() => match crate::duration::parse_duration(&text) {
            Ok(timeout) if timeout >= Duration::from_millis(1) => Ok(timeout),
            Ok(_) => Err(format!("{LEADER_TIMEOUT_ENV}={text:?}: at least 1ms")),
            Err(error) => Err(format!("{LEADER_TIMEOUT_ENV}={text:?}: {error}")),
        },
        Ok(_) | Err(std::env::VarError::NotPresent) => Ok(DEFAULT_LEADER_TIMEOUT),
        Err(std::env::VarError::NotUnicode(text)) => {
            Err(format!("{LEADER_TIMEOUT_ENV}={text:?}: not UTF-8"))
        }
    }
}

/// What a handle opened with `options` does when its open (or a reopen) has waited for the
/// journal's write lock past its notice: its listener hears that it is blocked on the lock,
/// and other processes see it blocked through its marker until the open is over, whether it
/// then got the lock or gave up.
pub(crate) fn open_lock_notice(
    options: &WriterOptions,
) -> crate::journal::file::lock_wait::OnNotice {
    struct OpenNotice {
        listener: Option<CapacityListener>,
        home: Option<crate::home::Home>,
        marked: Option<capacity::Blocked>,
    }
    impl Drop for OpenNotice {
        fn drop(&mut self) {
            if let (Some(home), Some(blocked)) = (&self.home, self.marked.take()) {
                let _ = capacity::clear_blocked(home, &blocked);
            }
        }
    }
    let mut notice = OpenNotice {
        listener: options.listener.clone(),
        home: options.blocked_markers.clone(),
        marked: None,
    };
    Box::new(move |held: &crate::journal::format::error::LockHeld| {
        if let Some(home) = &notice.home
            && let Ok(writer) = crate::liveness::current()
        {
            let blocked = capacity::Blocked {
                writer,
                since_ms: held.since_ms,
                cause: BlockCause::WriteLock,
            };
            // Best effort, as every marker: for others to see.
            if capacity::mark_blocked(home, &blocked).is_ok() {
                notice.marked = Some(blocked);
            }
        }
        if let Some(listener) = &notice.listener {
            listener(&CapacityEvent::Blocked {
                since_ms: held.since_ms,
                error: format!("opening the journal: {held}"),
                cause: BlockCause::WriteLock,
            });
        }
    })
}
