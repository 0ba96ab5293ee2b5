//! Commits shared across processes: one **commit leader** per journal.
//!
//! A MultiWriter commit costs two fsyncs, serialised by redb's write lock, so processes that
//! each commit alone top out at one commit's rate, however many they are. Instead, the first
//! handle that has a group to commit and finds no leader takes the journal's commit lock
//! (`journal.redb.commit.lock`, `flock`, never waited for) and, holding it, listens on a Unix
//! socket beside it (`journal.redb.commit.sock`, or on Linux an abstract name when that path
//! is too long to bind). Other handles connect and hand each group to it: their batches join
//! the leader's own groups, committed by its writer thread in one write transaction each, under
//! **their** writer ids and writer seqs, which the clients assign before sending. The leader
//! answers a client only after the commit holding its batches returned. Nobody starts
//! anything: leadership is held by whichever handle has it, for as long as it lives; when the
//! leader's handle is dropped it stops taking clients, answers what it took, removes its socket
//! and releases the lock, and the next handle with a group takes over.
//!
//! A client's batch is judged by one committer at a time, so the writer mark (the highest
//! committed writer seq) never lets a later seq land before an earlier one's fate is known:
//! * a client hands over one group at a time and waits for all its answers;
//! * a connection that fails part-way leaves its batches uncertain (the leader may have
//!   taken them): they are sent again, with the same seqs, only to a leader that answered a
//!   hello since — the same leader, which answers a writer's new hello only after its earlier
//!   connection's batches were all answered, or a new one, which holds the lock only after the
//!   old leader released it, which it does only after answering all it took — or committed by
//!   this handle once it holds the lock itself. A batch the old leader did commit is then
//!   recognised by its writer seq; one it refused in a commit that landed is found "reused"
//!   and judged again under a fresh seq, as the writer does after a retry;
//! * a leader refuses a client's batch by sending the state it judged it against; the client
//!   judges its batch against that state itself ([`super::append::judge`]) and so words the
//!   very refusal its caller would have had alone.
//!
//! Full and flaky disks are the leader's writer's to ride out, as for its own batches: its
//! clients wait, and never see a capacity error. A process with a controlling terminal does
//! not lead (job control could stop it while its clients wait), unless opened with
//! [`CommitSharing::Lead`]; runners, in sessions of their own, do. A handle opened with
//! [`CommitSharing::Alone`], or a journal that is not a file, commits alone.

mod client;
mod leader;
pub(crate) mod wire;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use redb::ReadableDatabase;
use sha2::{Digest, Sha256};

use super::append::{self, Appended, Batch};
use super::error::{AppendError, ReadError, StorageFailure};
use super::queue::Queue;
use super::read::View;
use super::snapshot::decode_snapshot;
use super::writer::{self, Answer, CapacityState, Request, Shared, Source};
use crate::durable_fs::FileLock;
use crate::platform;
use client::{Connection, ExchangeError, Unreachable};
use leader::Leadership;
use wire::{Hello, WireAnswer};

#[cfg(test)]
mod tests;

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

/// Where a journal's commit leader is found.
#[derive(Debug, Clone)]
pub(crate) struct Rendezvous {
    lock: PathBuf,
    socket: SocketAt,
}

#[derive(Debug, Clone)]
enum SocketAt {
    Path(PathBuf),
    /// An abstract name (Linux), for a socket path too long to bind.
    Abstract(Vec<u8>),
}

impl Rendezvous {
    /// The rendezvous of the journal file at `journal`, named after its absolute path; `None`
    /// when its directory cannot be resolved.
    fn of(journal: &Path) -> Option<Rendezvous> {
        let dir = match journal.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        };
        let journal = dir.canonicalize().ok()?.join(journal.file_name()?);
        let socket = crate::home::commit_socket_path(&journal);
        let socket = if socket.as_os_str().len() <= platform::MAX_SOCKET_PATH_BYTES {
            SocketAt::Path(socket)
        } else {
            // Named after the path and the user, so that two users' journals never meet.
            let digest = Sha256::digest(socket.as_os_str().as_encoded_bytes());
            let hex: String = digest[..16]
                .iter()
                .map(|byte| format!("{byte:02x}"))
                .collect();
            let uid = nix::unistd::geteuid().as_raw();
            SocketAt::Abstract(format!("runjournal-commit-{hex}-{uid}").into_bytes())
        };
        Some(Rendezvous {
            lock: crate::home::commit_lock_path(&journal),
            socket,
        })
    }
}

/// Delays between attempts to reach a leader while batches handed to a leader are uncertain
/// and the lock is held by a process that does not answer yet.
const WAIT_DELAYS_MS: [u64; 6] = [1, 2, 5, 10, 25, 50];

/// How long batches may go without an answer from any leader, once an exchange failed or the
/// lock's holder did not answer while they were uncertain, before their callers are told the
/// commit failed (the batches may or may not have landed). The holder either serves, is
/// starting or stopping (moments), or is stopped by a signal.
const MAX_UNCERTAIN_WAIT: Duration = Duration::from_secs(60);

/// How long a handle that held the lock but could not serve commits alone before it tries to
/// lead again.
const LEAD_AGAIN_AFTER: Duration = Duration::from_secs(5);

/// Most times a batch found "reused" is judged again under a fresh seq.
const MAX_REJUDGES: usize = 8;

enum Role {
    /// Neither leading nor connected: each group looks for a leader, or leads.
    Undecided,
    Leader(Leadership),
    Client(Connection),
}

/// A writer thread's view of sharing: its role, and the way to a leader.
pub(crate) struct Sharing {
    shared: Arc<Shared>,
    queue: Arc<Queue<Request, Answer>>,
    /// `None`: this handle commits alone.
    rendezvous: Option<Rendezvous>,
    journal_id: Option<[u8; 16]>,
    role: Role,
    lead_again_at: Option<Instant>,
    /// Whether this handle may lead, once looked at (see [`CommitSharing::Shared`]).
    may_lead: Option<bool>,
}

impl Sharing {
    pub(crate) fn new(shared: &Arc<Shared>, queue: &Arc<Queue<Request, Answer>>) -> Sharing {
        let rendezvous = match (&shared.options.commit_sharing, &shared.source) {
            (
                CommitSharing::Shared | CommitSharing::Lead | CommitSharing::Join,
                Source::Path(path),
            ) => Rendezvous::of(path),
            _ => None,
        };
        Sharing {
            shared: Arc::clone(shared),
            queue: Arc::clone(queue),
            rendezvous,
            journal_id: None,
            role: Role::Undecided,
            lead_again_at: None,
            may_lead: None,
        }
    }

    /// Whether this handle is its journal's commit leader now.
    pub(crate) fn is_leader(&self) -> bool {
        matches!(self.role, Role::Leader(_))
    }

    /// Hands a group of this handle's batches to the journal's commit leader, and returns their
    /// answers; `None` when this handle commits the group itself, as the leader or alone
    /// (nothing of it was handed to anyone then).
    pub(crate) fn commit_through_leader(
        &mut self,
        batches: &[Batch],
        capacity: &mut CapacityState,
        renumber: &mut dyn FnMut(Batch) -> Batch,
    ) -> Option<Vec<Answer>> {
        if batches
            .iter()
            .any(|batch| batch.writer != self.shared.writer)
        {
            // Other processes' batches: this handle leads.
            return None;
        }
        if !self.reach_leader() {
            return None;
        }
        let todo = batches
            .iter()
            .cloned()
            .enumerate()
            .map(|(slot, batch)| Pending {
                slot,
                batch,
                may_have_landed: false,
                rejudges: 0,
            })
            .collect();
        self.settle(todo, batches.len(), capacity, renumber)
    }

    /// Stops leading (once the queue is drained) or disconnects.
    pub(crate) fn finish(&mut self) {
        if let Role::Leader(leadership) = std::mem::replace(&mut self.role, Role::Undecided) {
            leadership.stop();
        }
    }

    /// Makes this handle a client if a leader answers, or the leader if there is none.
    /// Returns whether it is a client now.
    fn reach_leader(&mut self) -> bool {
        match self.role {
            Role::Client(_) => return true,
            Role::Leader(_) => return false,
            Role::Undecided => {}
        }
        match self.connect() {
            Ok(()) => true,
            Err(Unreachable::NoLeader) => {
                self.try_to_lead();
                false
            }
            Err(Unreachable::Refused) => false,
        }
    }

    fn connect(&mut self) -> Result<(), Unreachable> {
        let Some(rendezvous) = &self.rendezvous else {
            return Err(Unreachable::Refused);
        };
        let rendezvous = rendezvous.clone();
        let journal_id = self.journal_id().ok_or(Unreachable::Refused)?;
        let hello = Hello {
            build: wire::build(),
            journal_id,
            writer: self.shared.writer,
            pid: std::process::id(),
        };
        let connection = Connection::open(&rendezvous, &hello)?;
        self.role = Role::Client(connection);
        Ok(())
    }

    /// Leads if the lock is free and this handle can serve; `is_leader` tells.
    fn try_to_lead(&mut self) {
        let may_lead =
            *self
                .may_lead
                .get_or_insert_with(|| match self.shared.options.commit_sharing {
                    CommitSharing::Lead => true,
                    CommitSharing::Shared => !has_controlling_terminal(),
                    CommitSharing::Join | CommitSharing::Alone => false,
                });
        if !may_lead
            || self
                .lead_again_at
                .is_some_and(|again| Instant::now() < again)
        {
            return;
        }
        let (Some(rendezvous), Some(journal_id)) = (self.rendezvous.clone(), self.journal_id())
        else {
            return;
        };
        match Leadership::start(&rendezvous, &self.shared, &self.queue, journal_id) {
            Ok(Some(leadership)) => self.role = Role::Leader(leadership),
            Ok(None) => {}
            Err(_) => self.lead_again_at = Some(Instant::now() + LEAD_AGAIN_AFTER),
        }
    }

    /// Whether nobody holds the commit lock (it is taken and let go at once to tell).
    fn is_lock_free(&self) -> bool {
        let Some(rendezvous) = &self.rendezvous else {
            return true;
        };
        matches!(FileLock::try_acquire(&rendezvous.lock), Ok(Some(_)))
    }

    fn journal_id(&mut self) -> Option<[u8; 16]> {
        if self.journal_id.is_none() {
            let db = self.shared.database()?;
            let view = View::new(db.begin_read().ok()?);
            self.journal_id = Some(view.meta().ok()?.journal_id);
        }
        self.journal_id
    }

    /// Brings every pending batch to a final answer: through the leader, or, when there is
    /// none any more, committed by this handle (as the new leader or alone).
    fn settle(
        &mut self,
        mut todo: Vec<Pending>,
        count: usize,
        capacity: &mut CapacityState,
        renumber: &mut dyn FnMut(Batch) -> Batch,
    ) -> Option<Vec<Answer>> {
        let mut answers: Vec<Option<Answer>> = (0..count).map(|_| None).collect();
        // Batches were handed to a leader over a connection that failed, and no leader has
        // answered a hello since: that leader may still judge them.
        let mut may_be_judged_elsewhere = false;
        // Since when no exchange succeeded, and how many attempts failed meanwhile.
        let mut trouble_since: Option<Instant> = None;
        let mut failed_attempts = 0usize;
        while !todo.is_empty() {
            if trouble_since.is_some_and(|since| since.elapsed() >= MAX_UNCERTAIN_WAIT) {
                let failure = StorageFailure::new(
                    "handing batches to the commit leader",
                    redb::Error::Io(std::io::Error::other(format!(
                        "no commit leader answered within {} s; the batch may or may not \
                         have landed",
                        MAX_UNCERTAIN_WAIT.as_secs()
                    ))),
                );
                for pending in todo {
                    answers[pending.slot] =
                        Some(answer(Err(AppendError::Storage(failure.duplicate()))));
                }
                break;
            }
            if failed_attempts > 0 {
                std::thread::sleep(Duration::from_millis(
                    WAIT_DELAYS_MS[(failed_attempts - 1).min(WAIT_DELAYS_MS.len() - 1)],
                ));
            }
            if !matches!(self.role, Role::Client(_)) {
                match self.connect() {
                    Ok(()) => may_be_judged_elsewhere = false,
                    Err(unreachable) => {
                        if matches!(unreachable, Unreachable::NoLeader) {
                            self.try_to_lead();
                        }
                        // A free lock: the leader that had them released it, which it does
                        // only once it answered all it took, or died. Nobody else will judge
                        // them (a handle that may not lead commits them alone).
                        if may_be_judged_elsewhere && !self.is_leader() && self.is_lock_free() {
                            may_be_judged_elsewhere = false;
                        }
                        if self.is_leader() || !may_be_judged_elsewhere {
                            self.commit_here(todo, &mut answers, capacity, renumber);
                            break;
                        }
                        // The lock's holder does not answer yet: it is starting, stopping, or
                        // is the leader whose connection failed, which may still judge them.
                        trouble_since.get_or_insert_with(Instant::now);
                        failed_attempts += 1;
                        continue;
                    }
                }
            }
            let Role::Client(connection) = &mut self.role else {
                unreachable!("connected just above");
            };
            let chunk = todo.len().min(wire::MAX_GROUP_BATCHES as usize);
            let batches: Vec<Batch> = todo[..chunk].iter().map(|p| p.batch.clone()).collect();
            let replies = match connection.exchange(&batches) {
                Ok(replies) => replies,
                Err(ExchangeError::TooLarge) if !may_be_judged_elsewhere => {
                    // Nothing was sent: too large for a frame, the group is committed here.
                    self.commit_here(todo, &mut answers, capacity, renumber);
                    break;
                }
                Err(error) => {
                    for pending in &mut todo[..chunk] {
                        pending.may_have_landed = true;
                    }
                    may_be_judged_elsewhere = !matches!(error, ExchangeError::LeaderGone);
                    self.role = Role::Undecided;
                    trouble_since.get_or_insert_with(Instant::now);
                    failed_attempts += 1;
                    continue;
                }
            };
            trouble_since = None;
            failed_attempts = 0;
            let rest = todo.split_off(chunk);
            let mut next = Vec::new();
            for (mut pending, reply) in todo.into_iter().zip(replies) {
                match self.settle_one(&mut pending, reply, renumber) {
                    Some(answer) => {
                        self.shared
                            .stats
                            .through_leader
                            .fetch_add(1, Ordering::Relaxed);
                        answers[pending.slot] = Some(answer);
                    }
                    None => next.push(pending),
                }
            }
            next.extend(rest);
            todo = next;
        }
        Some(
            answers
                .into_iter()
                .map(|answer| answer.expect("every pending batch was answered"))
                .collect(),
        )
    }

    /// The final answer of one batch from its leader's reply, or `None` when it must be sent
    /// again (not taken, or judged again under a fresh seq).
    fn settle_one(
        &self,
        pending: &mut Pending,
        reply: WireAnswer,
        renumber: &mut dyn FnMut(Batch) -> Batch,
    ) -> Option<Answer> {
        let batch = &pending.batch;
        match reply {
            WireAnswer::Committed {
                first_seq,
                last_seq,
                was_duplicate,
                state,
            } => {
                let state = match decode_snapshot(batch.run, &state) {
                    Ok(state) => state,
                    // Checksummed bytes of the same build decode; should they not, the state
                    // now is the best answer left, the batch being durable.
                    Err(_) => match self.state_now(batch) {
                        Ok(state) => state,
                        Err(error) => return Some(answer(Err(error))),
                    },
                };
                Some(answer(Ok(Appended {
                    run: batch.run,
                    first_seq,
                    last_seq,
                    state,
                    was_duplicate,
                })))
            }
            WireAnswer::Refused { against } => {
                let before = match against.map(|bytes| decode_snapshot(batch.run, &bytes)) {
                    None => None,
                    Some(Ok(state)) => Some(state),
                    Some(Err(error)) => {
                        return Some(answer(Err(leader_failure(format!(
                            "the commit leader refused the batch against a state that does \
                             not decode ({error}); nothing was written"
                        )))));
                    }
                };
                match append::judge(before, batch) {
                    Err(refusal) => Some(answer(Err(refusal))),
                    Ok(_) => Some(answer(Err(leader_failure(
                        "the commit leader refused a batch that this process accepts against \
                         the same state; nothing was written"
                            .to_string(),
                    )))),
                }
            }
            WireAnswer::SeqReused { was_retried } => {
                let is_rejudged =
                    (was_retried || pending.may_have_landed) && pending.rejudges < MAX_REJUDGES;
                if !is_rejudged {
                    return Some(answer(Err(AppendError::WriterSeqReused {
                        writer: batch.writer,
                        writer_seq: batch.writer_seq,
                        run: batch.run,
                    })));
                }
                pending.batch = renumber(pending.batch.clone());
                pending.may_have_landed = false;
                pending.rejudges += 1;
                None
            }
            WireAnswer::NotTaken => None,
            WireAnswer::Failed {
                op,
                errno,
                message,
                is_corrupt,
            } => {
                if is_corrupt && let Err(error @ AppendError::Corrupt(_)) = self.state_now(batch) {
                    return Some(answer(Err(error)));
                }
                let source = match errno {
                    Some(errno) => std::io::Error::from_raw_os_error(errno),
                    None => std::io::Error::other(format!("{op}: {message}")),
                };
                Some(answer(Err(AppendError::Storage(StorageFailure::new(
                    "committing through the commit leader",
                    redb::Error::Io(source),
                )))))
            }
        }
    }

    /// The run's state as the journal holds it now.
    fn state_now(&self, batch: &Batch) -> Result<crate::state::RunState, AppendError> {
        let db = self
            .shared
            .database()
            .ok_or_else(|| leader_failure("the journal handle is being reopened".to_string()))?;
        let txn = db.begin_read().map_err(|error| {
            AppendError::Storage(StorageFailure::new("beginning a read", error))
        })?;
        match View::new(txn).snapshot(batch.run) {
            Ok(Some(state)) => Ok(state),
            Ok(None) => Err(AppendError::UnknownRun { run: batch.run }),
            Err(ReadError::Corrupt(error)) => Err(AppendError::Corrupt(error)),
            Err(ReadError::Storage(failure)) => Err(AppendError::Storage(failure)),
        }
    }

    /// Commits the pending batches here, as the leader or alone; a batch that may have landed
    /// through a leader and is found reused is judged again (see
    /// [`writer::commit_and_rejudge`]).
    fn commit_here(
        &self,
        todo: Vec<Pending>,
        answers: &mut [Option<Answer>],
        capacity: &mut CapacityState,
        renumber: &mut dyn FnMut(Batch) -> Batch,
    ) {
        let may_have_landed = todo.iter().any(|pending| pending.may_have_landed);
        let slots: Vec<usize> = todo.iter().map(|pending| pending.slot).collect();
        let batches = todo.into_iter().map(|pending| pending.batch).collect();
        let committed =
            writer::commit_and_rejudge(&self.shared, batches, capacity, may_have_landed, renumber);
        for (slot, answer) in slots.into_iter().zip(committed) {
            answers[slot] = Some(answer);
        }
    }
}

/// A batch on its way to a final answer.
struct Pending {
    /// Its place in the group.
    slot: usize,
    batch: Batch,
    /// It was handed to a leader over a connection that failed: it may have been committed,
    /// or refused in a commit that landed.
    may_have_landed: bool,
    rejudges: usize,
}

/// Whether this process has a controlling terminal: opening `/dev/tty` succeeds exactly then
/// (ENXIO otherwise). Any failure to look counts as none.
fn has_controlling_terminal() -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(nix::libc::O_NOCTTY)
        .open("/dev/tty")
        .is_ok()
}

fn answer(result: Result<Appended, AppendError>) -> Answer {
    Answer {
        result,
        refused_against: None,
        was_retried: false,
    }
}

fn leader_failure(message: String) -> AppendError {
    AppendError::Storage(StorageFailure::new(
        "committing through the commit leader",
        redb::Error::Io(std::io::Error::other(message)),
    ))
}
