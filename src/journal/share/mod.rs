//! Commits shared across processes: one **commit leader** per journal.
//!
//! A MultiWriter commit costs two fsyncs, serialised by redb's write lock, so processes that
//! each commit alone top out at one commit's rate, however many they are. Instead, the first
//! handle that has a group to commit and finds no leader takes the journal's commit lock
//! (`journal.redb.commit.lock`, `flock`, never waited for) and, holding it, listens on a Unix
//! socket beside it (`journal.redb.commit.sock`, bound and connected through the home's held
//! directory, [`crate::durable_fs::held_path`]; or, when that path is too long to bind or this
//! system cannot name the held directory, in the user's private socket directory:
//! `private_socket_dir`). Other handles connect and
//! hand each group to it: their batches join
//! the leader's own groups, committed by its writer thread in one write transaction each, under
//! **their** writer ids and writer seqs, which the clients assign before sending. The leader
//! answers a client only after the commit holding its batches returned. Nobody starts
//! anything: leadership is held by whichever handle has it, for as long as it lives; when the
//! leader's handle is dropped it stops taking clients, answers what it took, removes its socket
//! and releases the lock, and the next handle with a group takes over.
//!
//! No process holds another hostage: a client waits on its leader only for a bound (the
//! connect not at all, the hello's answer and each frame after it for
//! `WriterOptions::leader_timeout`, each frame read whole within it; a leader at work says
//! `Working` meanwhile, or `WaitingForLock` while another process keeps the write lock). A
//! leader that is silent past it — stopped, frozen, swapped out — loses the lead: the client
//! takes it over (`lease`) and commits the group itself at once, so that the processes after
//! it do not wait for the silent one. A client with a bound of its own on the write lock (a
//! command) leaves a leader still waiting for the lock past it, its batches uncertain
//! ([`AppendError::Uncertain`]). A batch it had handed over lands once all the same, whoever
//! commits it, because every seq judged in a committed transaction raises its writer's mark,
//! refused or not:
//! * a client hands over one group at a time and waits for all its answers;
//! * a connection that fails part-way, or a leader that falls silent, leaves its batches
//!   uncertain (the leader may have taken them): they are sent again, with the same seqs, to
//!   whoever leads now, or committed by this handle. A batch the old leader did commit is then
//!   recognised by its writer seq; one it refused in a commit that landed is found "reused"
//!   and judged again under a fresh seq, as the writer does after a retry; a stopped leader
//!   that runs again finds every seq its client has since judged at or below the mark, and
//!   commits none of them — whether or not it noticed yet that it was deposed;
//! * a leader refuses a client's batch by sending the state it judged it against; the client
//!   judges its batch against that state itself (`append::judge`) and so words the
//!   very refusal its caller would have had alone.
//!
//! Full and flaky disks are the leader's writer's to ride out, as for its own batches: its
//! clients wait (hearing `Working`), and never see a capacity error. Only the leader's own
//! user, in its own user namespace, is served; a process whose uid is the overflow uid shares
//! nothing ([`platform::may_share_commits`]).
//!
//! A process with a controlling terminal does
//! not lead (job control could stop it while its clients wait), unless opened with
//! [`CommitSharing::Lead`]; runners, in sessions of their own, do. A handle opened with
//! [`CommitSharing::Alone`], or a journal that is not a file, commits alone.

mod client;
mod leader;
pub(crate) mod lease;
pub(crate) mod wire;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::durable_fs;
use crate::journal::file::Location;
use crate::journal::format::error::LockHeld;
use crate::journal::format::error::{AppendError, StorageFailure};
use crate::journal::format::snapshot::decode_snapshot;
use crate::journal::read::view::View;
use crate::journal::write::append::{self, Appended, Batch};
use crate::journal::write::commit::{self, Answer, CapacityState, Request, Shared};
use crate::journal::write::options::CommitSharing;
use crate::journal::write::queue::Queue;
use crate::platform;
use client::{Connection, ExchangeError, Exchanged, Unreachable};
use leader::Leadership;
use lease::{FileId, Lease};
use wire::{Hello, WireAnswer};

#[cfg(test)]
mod tests;

/// Where a journal's commit leader is found.
#[derive(Debug, Clone)]
pub(crate) struct Rendezvous {
    /// Beside the journal, as the journal's own path names it: a file of the home, opened
    /// relative to the home's held directory ([`durable_fs`]).
    lock: PathBuf,
    /// The Unix socket the leader listens on: beside the journal when that path fits a
    /// socket address, else in this user's private socket directory (see
    /// [`private_socket_dir`]).
    socket: PathBuf,
    /// The path the socket is bound and connected at: beside the journal, a path through the
    /// home's held directory ([`durable_fs::held_path`]), so that a directory above the home
    /// swapped since it was checked cannot have the socket made elsewhere.
    address: durable_fs::HeldPath,
    /// The journal file, as (device, inode).
    file: (u64, u64),
    /// The home the journal lies in, held while the rendezvous lives: its paths resolve there.
    _home: Option<Arc<durable_fs::HomeDir>>,
}

impl Rendezvous {
    /// The rendezvous of the journal file at `journal`; where its socket lives is decided by
    /// the journal's absolute path, so every process of this user finds the same one. `None`
    /// when its directory cannot be resolved, when the socket has nowhere private to live, or
    /// when this process may not share commits at all (see
    /// [`platform::may_share_commits`]).
    fn of(journal: &Path) -> Option<Rendezvous> {
        if !platform::may_share_commits() {
            return None;
        }
        let dir = match journal.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        };
        let absolute = dir.canonicalize().ok()?.join(journal.file_name()?);
        // Under a held home, its files are named by the path the home was opened by, which
        // resolves from the held directory; elsewhere by the absolute path.
        let journal = match durable_fs::holding(journal) {
            Some(_) => journal.to_path_buf(),
            None => absolute.clone(),
        };
        let file = durable_fs::look(&journal).ok()??.stamp.id();
        let beside = crate::home::commit_socket_path(&journal);
        let fits = |path: &Path| path.as_os_str().len() <= platform::MAX_SOCKET_PATH_BYTES;
        // Beside the journal only where every process can bind it there (its absolute path
        // fits) and this one can reach it through the home's held directory.
        let beside_address = durable_fs::held_path(&beside)
            .ok()
            .filter(|address| fits(address.path()));
        let (socket, address) = match beside_address {
            Some(address) if fits(&crate::home::commit_socket_path(&absolute)) => (beside, address),
            _ => {
                // Named after the journal's path: two journals never meet; the directory is
                // this user's alone.
                let digest = Sha256::digest(absolute.as_os_str().as_encoded_bytes());
                let hex: String = digest[..12]
                    .iter()
                    .map(|byte| format!("{byte:02x}"))
                    .collect();
                let socket = private_socket_dir()?.join(format!("{hex}.sock"));
                if !fits(&socket) {
                    return None;
                }
                let address = durable_fs::held_path(&socket).ok()?;
                (socket, address)
            }
        };
        let lock = crate::home::commit_lock_path(&journal);
        Some(Rendezvous {
            _home: durable_fs::holding(&lock),
            lock,
            socket,
            address,
            file,
        })
    }
}

/// The environment variable naming the directory under which a user's private socket
/// directory is made (`runjournal-<euid>` in it); `/tmp` when unset.
pub const RUNTIME_DIR_ENV: &str = "RUNJOURNAL_RUNTIME_DIR";

/// This user's private directory for the sockets of commit leaders whose journal's path is
/// too long to bind beside it: `runjournal-<euid>` under [`RUNTIME_DIR_ENV`] (else `/tmp`),
/// made 0700 if missing. `None` unless it is a directory (not a link) of this user that
/// neither group nor others may enter: a directory someone else made there first is never
/// used, and every handle of such a journal commits alone.
pub(crate) fn private_socket_dir() -> Option<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let base = match std::env::var_os(RUNTIME_DIR_ENV) {
        Some(base) if !base.is_empty() => PathBuf::from(base),
        _ => PathBuf::from("/tmp"),
    };
    let uid = nix::unistd::geteuid().as_raw();
    let dir = base.join(format!("runjournal-{uid}"));
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(_) => return None,
    }
    let metadata = std::fs::symlink_metadata(&dir).ok()?;
    let is_private =
        metadata.file_type().is_dir() && metadata.uid() == uid && metadata.mode() & 0o077 == 0;
    is_private.then_some(dir)
}

/// How long a handle that held the lock but could not serve, or found the leader stopped,
/// commits alone before it looks for a leader again.
const LEAD_AGAIN_AFTER: Duration = Duration::from_secs(5);

/// Most exchanges one group takes before the rest of it is committed here: each answer that
/// sends a batch again (not taken, judged again) costs one.
const MAX_EXCHANGES: usize = 16;

/// Most times a batch found "reused" is judged again under a fresh seq.
const MAX_REJUDGES: usize = 8;

/// What a handle is to the journal's commit leader. The moves between them are the ones
/// [`Role::may_move`] lists, asserted on every change ([`Sharing::set_role`]).
enum Role {
    /// Neither leading nor connected: each group looks for a leader, or leads.
    Undecided,
    /// Commits every group alone until then, without looking for a leader: the last one was
    /// silent (stopped or frozen), or this handle held the lock but could not serve.
    Alone {
        until: Instant,
    },
    Leader(Leadership),
    Client(Connection),
}

impl Role {
    /// Whether a handle may go from `from` to `to`: a handle decides only from `Undecided` (or
    /// from `Alone`, once it looks again); a client or a leader becomes `Undecided` first, when
    /// its connection breaks or the handle closes.
    fn may_move(from: &Role, to: &Role) -> bool {
        matches!(
            (from, to),
            (Role::Undecided, _)
                | (
                    Role::Alone { .. },
                    Role::Undecided | Role::Alone { .. } | Role::Client(_)
                )
                | (Role::Client(_) | Role::Leader(_), Role::Undecided)
        )
    }

    fn name(&self) -> &'static str {
        match self {
            Role::Undecided => "undecided",
            Role::Alone { .. } => "alone",
            Role::Leader(_) => "leader",
            Role::Client(_) => "client",
        }
    }
}

/// A writer thread's view of sharing: its role, and the way to a leader.
pub(crate) struct Sharing {
    shared: Arc<Shared>,
    queue: Arc<Queue<Request, Answer>>,
    /// `None`: this handle commits alone.
    rendezvous: Option<Rendezvous>,
    journal_id: Option<[u8; 16]>,
    role: Role,
    /// Whether this handle may lead, once looked at (see [`CommitSharing::Shared`]).
    may_lead: Option<bool>,
}

impl Sharing {
    pub(crate) fn new(shared: &Arc<Shared>, queue: &Arc<Queue<Request, Answer>>) -> Sharing {
        let rendezvous = match (&shared.options.commit_sharing, &shared.location) {
            (
                CommitSharing::Shared | CommitSharing::Lead | CommitSharing::Join,
                Location::Path(path),
            ) => Rendezvous::of(path),
            _ => None,
        };
        Sharing {
            shared: Arc::clone(shared),
            queue: Arc::clone(queue),
            rendezvous,
            journal_id: None,
            role: Role::Undecided,
            may_lead: None,
        }
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
        self.answer_every_pending(todo, batches.len(), capacity, renumber)
    }

    /// Stops leading (once the queue is drained) or disconnects.
    pub(crate) fn finish(&mut self) {
        if let Role::Leader(leadership) = self.set_role(Role::Undecided) {
            leadership.stop();
        }
    }

    /// Makes this handle a client if a leader answers, or the leader if there is none.
    /// Returns whether it is a client now.
    fn reach_leader(&mut self) -> bool {
        self.step_down_if_deposed();
        match self.role {
            Role::Client(_) => return true,
            Role::Leader(_) => return false,
            Role::Alone { until } if Instant::now() < until => return false,
            Role::Alone { .. } => {
                self.set_role(Role::Undecided);
            }
            Role::Undecided => {}
        }
        match self.connect() {
            Ok(()) => true,
            Err(Unreachable::NoLeader) => {
                self.try_to_lead();
                false
            }
            Err(Unreachable::Unresponsive { lock }) => {
                self.take_over(lock);
                false
            }
            Err(Unreachable::Refused) => false,
        }
    }

    /// A leader whose lead was taken over (it was stopped past its clients' timeout, see
    /// [`lease`]) stops leading: it takes no client any more, and its next group goes to the
    /// leader that took over.
    fn step_down_if_deposed(&mut self) {
        if matches!(&self.role, Role::Leader(leadership) if leadership.is_deposed())
            && let Role::Leader(leadership) = self.set_role(Role::Undecided)
        {
            leadership.step_down();
        }
    }

    /// Takes the lead over from a leader found silent, which held the lock file `from` (as
    /// this handle saw it before it found it silent): this handle leads if it may; if it may
    /// not, it removes the stopped leader's socket and lets the lock go, so that the next
    /// handle that may lead does, and no other process pays the silent leader's timeout. When
    /// the lead has moved meanwhile (someone took it over already) nothing is taken: the next
    /// group looks for the leader again.
    fn take_over(&mut self, from: Option<FileId>) {
        let (Some(rendezvous), Some(journal_id)) = (self.rendezvous.clone(), self.journal_id())
        else {
            return;
        };
        if self.may_lead() {
            match Leadership::take_over(&rendezvous, from, &self.shared, &self.queue, journal_id) {
                Ok(Some(leadership)) => {
                    self.set_role(Role::Leader(leadership));
                }
                Ok(None) => {}
                Err(_) => self.stay_alone(),
            }
            return;
        }
        match Lease::take_over(&rendezvous.lock, from) {
            Ok(Some(lease)) => {
                // Removed while the lock is held, and only if it is a socket of this user.
                if let Ok(crate::durable_fs::SocketPath::OurSocket) =
                    crate::durable_fs::inspect_socket_path(&rendezvous.socket)
                {
                    let _ = crate::durable_fs::remove_if_present(&rendezvous.socket);
                }
                drop(lease);
            }
            Ok(None) => {}
            Err(_) => self.stay_alone(),
        }
    }

    /// Whether this handle may lead (see [`CommitSharing::Shared`]), looked at once.
    fn may_lead(&mut self) -> bool {
        *self
            .may_lead
            .get_or_insert_with(|| match self.shared.options.commit_sharing {
                CommitSharing::Lead => true,
                CommitSharing::Shared => !has_controlling_terminal(),
                CommitSharing::Join | CommitSharing::Alone => false,
            })
    }

    fn connect(&mut self) -> Result<(), Unreachable> {
        let Some(rendezvous) = &self.rendezvous else {
            return Err(Unreachable::Refused);
        };
        let rendezvous = rendezvous.clone();
        let journal_id = self.journal_id().ok_or(Unreachable::Refused)?;
        let answer_timeout = self.shared.options.leader_timeout;
        let hello = Hello {
            build: wire::build(),
            journal_id,
            writer: self.shared.writer,
            pid: std::process::id(),
            journal_file: rendezvous.file,
            answer_timeout_ms: u32::try_from(answer_timeout.as_millis())
                .unwrap_or(u32::MAX)
                .max(1),
        };
        let give_up_after = self.shared.options.lock_wait.give_up_after;
        let connection = Connection::open(&rendezvous, &hello, give_up_after)?;
        self.set_role(Role::Client(connection));
        Ok(())
    }

    /// Leads if the lock is free and this handle can serve; `is_leader` tells.
    fn try_to_lead(&mut self) {
        if !self.may_lead() {
            return;
        }
        match self.role {
            Role::Alone { until } if Instant::now() < until => return,
            Role::Alone { .. } => {
                self.set_role(Role::Undecided);
            }
            _ => {}
        }
        let (Some(rendezvous), Some(journal_id)) = (self.rendezvous.clone(), self.journal_id())
        else {
            return;
        };
        match Leadership::start(&rendezvous, &self.shared, &self.queue, journal_id) {
            Ok(Some(leadership)) => {
                self.set_role(Role::Leader(leadership));
            }
            Ok(None) => {}
            Err(_) => self.stay_alone(),
        }
    }

    fn journal_id(&mut self) -> Option<[u8; 16]> {
        if self.journal_id.is_none() {
            let db = self.shared.database()?;
            let view = View::begin(db.as_ref(), self.shared.location.path()).ok()?;
            self.journal_id = Some(view.meta().ok()?.journal_id);
        }
        self.journal_id
    }

    /// Brings every pending batch to a final answer: through the leader, or, when the leader
    /// is gone, stopped or refuses, committed by this handle (as the new leader or alone) at
    /// once.
    ///
    /// A batch handed to a leader that then fell silent may still be judged by it, should it
    /// run again; committing it here under the same writer seq is safe all the same. Whoever
    /// judges a seq first, here or there, raises the writer's mark in the same transaction,
    /// whether the batch was committed or refused ([`append`]); the other then finds the seq at
    /// or below the mark, recognises the batch's records if it landed, and otherwise calls the
    /// seq reused, which only this handle, which still holds the caller, judges again under a
    /// fresh seq. So a batch lands at most once, and its caller learns its fate from the one
    /// judgement that counted.
    fn answer_every_pending(
        &mut self,
        mut todo: Vec<Pending>,
        count: usize,
        capacity: &mut CapacityState,
        renumber: &mut dyn FnMut(Batch) -> Batch,
    ) -> Option<Vec<Answer>> {
        let mut answers: Vec<Option<Answer>> = (0..count).map(|_| None).collect();
        let mut exchanges = 0usize;
        while !todo.is_empty() {
            if exchanges >= MAX_EXCHANGES {
                self.commit_here(todo, &mut answers, capacity, renumber);
                break;
            }
            debug_assert!(
                !matches!(self.role, Role::Leader(_)),
                "a leader commits its own groups; it never hands them over"
            );
            if !matches!(self.role, Role::Client(_)) {
                match self.connect() {
                    Ok(()) => {}
                    Err(unreachable) => {
                        match unreachable {
                            Unreachable::NoLeader => self.try_to_lead(),
                            // Stopped or frozen: the lead is taken from it.
                            Unreachable::Unresponsive { lock } => self.take_over(lock),
                            Unreachable::Refused => {}
                        }
                        self.commit_here(todo, &mut answers, capacity, renumber);
                        break;
                    }
                }
            }
            let Role::Client(connection) = &mut self.role else {
                unreachable!("connected just above");
            };
            let lock_id = connection.lock_id;
            exchanges += 1;
            let batches: Vec<&Batch> = todo.iter().map(|pending| &pending.batch).collect();
            let Exchanged {
                answers: replies,
                sent,
                error,
            } = connection.exchange(&batches);
            let mut unsent = todo.split_off(sent);
            let unanswered = todo.split_off(replies.len());
            let mut next = Vec::new();
            for (mut pending, reply) in todo.into_iter().zip(replies) {
                match self.final_answer(&mut pending, reply, renumber) {
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
            let Some(error) = error else {
                next.extend(unsent);
                todo = next;
                continue;
            };
            // What the leader answered is settled; the rest of the group is not.
            next.extend(unanswered.into_iter().map(|mut pending| {
                pending.may_have_landed = true;
                pending
            }));
            next.append(&mut unsent);
            todo = next;
            if !matches!(error, ExchangeError::TooLarge) {
                self.set_role(Role::Undecided);
            }
            match error {
                // Nothing of this group was sent: it is committed here.
                ExchangeError::TooLarge => {}
                // Sent again to whoever leads now, or committed here.
                ExchangeError::Broken => continue,
                ExchangeError::Silent => self.take_over(lock_id),
                ExchangeError::LeaderGone => self.try_to_lead(),
                ExchangeError::GaveUp(held) => {
                    // Its reconnecting hello would wait for the leader to settle the batches
                    // it holds; meanwhile this handle commits alone.
                    self.stay_alone();
                    give_up(todo, &mut answers, &held);
                    break;
                }
            }
            self.commit_here(todo, &mut answers, capacity, renumber);
            break;
        }
        let answers: Option<Vec<Answer>> = answers.into_iter().collect();
        debug_assert!(answers.is_some(), "every pending batch was answered");
        answers
    }

    /// Commits alone, without looking for a leader, for [`LEAD_AGAIN_AFTER`].
    fn stay_alone(&mut self) {
        self.set_role(Role::Alone {
            until: Instant::now() + LEAD_AGAIN_AFTER,
        });
    }

    /// Changes the role, asserting the move is one [`Role::may_move`] allows; returns the old.
    fn set_role(&mut self, next: Role) -> Role {
        debug_assert!(
            Role::may_move(&self.role, &next),
            "a handle moved from {} to {}",
            self.role.name(),
            next.name()
        );
        std::mem::replace(&mut self.role, next)
    }

    /// The final answer of one batch from its leader's reply, or `None` when it must be sent
    /// again (not taken, or judged again under a fresh seq).
    fn final_answer(
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
            WireAnswer::QueueRefused { refusal } => Some(answer(Err(AppendError::Queue {
                run: batch.run,
                refusal,
            }))),
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
                if is_corrupt
                    && let Err(error @ (AppendError::Corrupt(_) | AppendError::Damaged(_))) =
                        self.state_now(batch)
                {
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
        let view = View::begin(db.as_ref(), self.shared.location.path())?;
        match view.snapshot(batch.run) {
            Ok(Some(state)) => Ok(state),
            Ok(None) => Err(AppendError::UnknownRun { run: batch.run }),
            Err(error) => Err(error.into()),
        }
    }

    /// Commits the pending batches here, as the leader or alone; a batch that may have landed
    /// through a leader and is found reused is judged again (see
    /// [`commit::commit_and_rejudge`]).
    fn commit_here(
        &self,
        todo: Vec<Pending>,
        answers: &mut [Option<Answer>],
        capacity: &mut CapacityState,
        renumber: &mut dyn FnMut(Batch) -> Batch,
    ) {
        let may_have_landed = todo.iter().any(|pending| pending.may_have_landed);
        let handed: Vec<(usize, crate::event::RunId, bool)> = todo
            .iter()
            .map(|pending| (pending.slot, pending.batch.run, pending.may_have_landed))
            .collect();
        let batches = todo.into_iter().map(|pending| pending.batch).collect();
        let committed =
            commit::commit_and_rejudge(&self.shared, batches, capacity, may_have_landed, renumber);
        for ((slot, run, landed), mut answer) in handed.into_iter().zip(committed) {
            // Handed to a leader that may still commit it, then not committed here before the
            // bound: whether it lands is not this handle's to know.
            if landed && let Err(AppendError::WriteLockHeld(held)) = &answer.result {
                answer.result = Err(AppendError::Uncertain {
                    run,
                    held: held.clone(),
                });
            }
            answers[slot] = Some(answer);
        }
    }
}

/// Answers the batches of a group whose leader waited for the journal's write lock past this
/// handle's bound: those it holds may still land ([`AppendError::Uncertain`]); those never
/// sent did not ([`AppendError::WriteLockHeld`]).
fn give_up(todo: Vec<Pending>, answers: &mut [Option<Answer>], held: &LockHeld) {
    for pending in todo {
        let result = if pending.may_have_landed {
            Err(AppendError::Uncertain {
                run: pending.batch.run,
                held: held.clone(),
            })
        } else {
            Err(AppendError::WriteLockHeld(held.clone()))
        };
        answers[pending.slot] = Some(answer(result));
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
