//! The commit leader's side: holding the journal's commit lock, it listens on the journal's
//! socket and puts every client's batches into its own handle's queue, where its writer
//! commits them in its groups; each client is answered once the commit holding its batches
//! returned.
//!
//! Invariants:
//! * the socket is bound, and a stale one removed, only while the lock is held; the lock is
//!   released only after every client batch the leader took was answered (or the process died,
//!   which commits nothing more);
//! * a leader whose lead was taken over (see [`super::lease`]) takes no client and no group
//!   once it has looked (at every wake of its accept loop, at least every
//!   [`DEPOSED_CHECK_INTERVAL`], and before each group it takes), and removes no socket but
//!   the one it bound;
//! * a client's group is queued only once all of it has arrived: a group cut short is never
//!   judged;
//! * one writer has at most one connection served at a time: the hello of a writer's new
//!   connection is answered only after its earlier connection's batches were all answered;
//! * nothing of another user (or user namespace) is served, nor a client of another journal
//!   file, and nothing that is not our socket is removed;
//! * no client holds more than its share: a hello must arrive whole within [`HELLO_TIMEOUT`]
//!   of the connect, a group is at most [`wire::MAX_GROUP_BYTES`] and must arrive whole within
//!   [`GROUP_ARRIVAL_TIMEOUT`] of its first byte, and a connection idle for [`IDLE_TIMEOUT`]
//!   is closed: a client that sends one byte and stalls costs its own thread that long;
//! * while a client's group is being committed, the client hears [`ToClient::Working`] (or
//!   [`ToClient::WaitingForLock`], while the writer waits for another process's write lock)
//!   at least four times per its answer timeout, so that it can tell this leader from a
//!   stopped one.

use std::collections::HashSet;
use std::io::{BufReader, Write};
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;
use std::time::Instant;

use super::Rendezvous;
use super::lease::{self, FileId, Lease};
use super::wire::{self, Hello, Refusal, TimedStream, ToClient, ToLeader, WireAnswer};
use crate::durable_fs::{self, SocketPath};
use crate::event::WriterId;
use crate::journal::format::error::AppendError;
use crate::journal::format::snapshot::encode_snapshot;
use crate::journal::write::append::Batch;
use crate::journal::write::commit::{Answer, Origin, Request, Shared};
use crate::journal::write::queue::{Queue, Ticket};
use crate::platform;

/// The most clients served at once; a client past it is refused as busy and commits alone.
pub(crate) const MAX_CLIENTS: usize = 256;

/// How long a write to a client may block (a client that stopped reading): the connection is
/// then dropped, and the client, once it reads again, finds it broken and sends again.
const CLIENT_WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a hello may take to arrive after a connection is accepted.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a connection may go without a group before it is closed (the client connects
/// again when it has one).
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a group may take to arrive whole once its first byte did: a client that sends
/// half a frame and stops is dropped then, and nothing of its group is judged.
pub(crate) const GROUP_ARRIVAL_TIMEOUT: Duration = Duration::from_secs(10);

/// The shortest interval between two [`ToClient::Working`] frames.
const MIN_WORKING_INTERVAL: Duration = Duration::from_millis(5);

/// How often a hello waiting for its writer's earlier connection looks whether the leader is
/// stopping.
const CLAIM_POLL: Duration = Duration::from_millis(100);

/// How often, at most, a leader with no connection to accept looks whether its lead was taken
/// over (it looks at every connection too).
pub(crate) const DEPOSED_CHECK_INTERVAL: Duration = Duration::from_millis(500);

/// Why this process does not lead although it holds the lock.
#[derive(Debug, thiserror::Error)]
pub(super) enum ServeError {
    #[error("{path}: {what}; it is left as it is")]
    Occupied { path: PathBuf, what: String },
    #[error("cannot listen for clients: {0}")]
    Io(#[from] std::io::Error),
}

/// A live leadership: the lock, the listening socket and its threads.
pub(super) struct Leadership {
    server: Arc<Server>,
    accept_thread: Option<JoinHandle<()>>,
    /// Written to wake the accept thread when stopping.
    wake: UnixStream,
    /// The socket file to remove on stopping, and which file it was when bound: a socket put
    /// in its place by a leader that took over is not ours to remove.
    socket_path: PathBuf,
    socket_id: Option<FileId>,
    /// Held until everything the leader took was answered; released last.
    lock: Option<Lease>,
}

struct Server {
    shared: Arc<Shared>,
    queue: Arc<Queue<Request, Answer>>,
    journal_id: [u8; 16],
    /// The journal file, as (device, inode).
    journal_file: (u64, u64),
    is_stopping: AtomicBool,
    /// The commit lock's path, and the lock file this leader holds: when the path names
    /// another, the lead was taken over.
    lock_path: PathBuf,
    lock_id: FileId,
    /// Set once this leader found its lead taken over.
    is_deposed: AtomicBool,
    clients: Mutex<Clients>,
    /// Writers with a connection being served, and its change.
    writers: Mutex<HashSet<WriterId>>,
    writers_changed: Condvar,
}

#[derive(Default)]
struct Clients {
    next_id: u64,
    /// Live connections (to end their reads when stopping) and their threads.
    live: Vec<(u64, UnixStream)>,
    threads: Vec<JoinHandle<()>>,
}

impl Leadership {
    /// Becomes the journal's commit leader if nobody is: takes the lock, then listens.
    /// `Ok(None)` when another process holds the lock. An error means the lock was free but
    /// this process cannot serve; it holds no lock then.
    pub(super) fn start(
        rendezvous: &Rendezvous,
        shared: &Arc<Shared>,
        queue: &Arc<Queue<Request, Answer>>,
        journal_id: [u8; 16],
    ) -> Result<Option<Leadership>, ServeError> {
        let Some(lock) = Lease::try_take(&rendezvous.lock)? else {
            return Ok(None);
        };
        Leadership::serve(lock, rendezvous, shared, queue, journal_id).map(Some)
    }

    /// Takes the lead over from a leader found silent that held the lock file `from` (see
    /// [`Lease::take_over`]), then listens in its place. `Ok(None)` when the lead moved
    /// meanwhile.
    pub(super) fn take_over(
        rendezvous: &Rendezvous,
        from: Option<FileId>,
        shared: &Arc<Shared>,
        queue: &Arc<Queue<Request, Answer>>,
        journal_id: [u8; 16],
    ) -> Result<Option<Leadership>, ServeError> {
        let Some(lock) = Lease::take_over(&rendezvous.lock, from)? else {
            return Ok(None);
        };
        Leadership::serve(lock, rendezvous, shared, queue, journal_id).map(Some)
    }

    /// Listens at the rendezvous's socket, holding `lock`.
    fn serve(
        lock: Lease,
        rendezvous: &Rendezvous,
        shared: &Arc<Shared>,
        queue: &Arc<Queue<Request, Answer>>,
        journal_id: [u8; 16],
    ) -> Result<Leadership, ServeError> {
        let path = &rendezvous.socket;
        match durable_fs::inspect_socket_path(path)? {
            SocketPath::Missing => {}
            // A socket of ours that nobody serves, or that a leader whose lead this one took
            // over serves: safe to remove while we hold the lock.
            SocketPath::OurSocket => durable_fs::remove_if_present(path)?,
            SocketPath::Other { what } => {
                return Err(ServeError::Occupied {
                    path: path.clone(),
                    what,
                });
            }
        }
        let listener = durable_fs::bind_private_socket(&rendezvous.address)?;
        let socket_path = path.clone();
        let socket_id = lease::file_id(path).ok().flatten();
        listener.set_nonblocking(true)?;
        // Informational: who leads, for people and tests; nothing decides by it.
        let _ = lock.write_note(format!("{}\n", std::process::id()).as_bytes());
        let (wake, woken) = UnixStream::pair()?;
        let server = Arc::new(Server {
            shared: Arc::clone(shared),
            queue: Arc::clone(queue),
            journal_id,
            journal_file: rendezvous.file,
            is_stopping: AtomicBool::new(false),
            lock_path: rendezvous.lock.clone(),
            lock_id: lock.id(),
            is_deposed: AtomicBool::new(false),
            clients: Mutex::new(Clients::default()),
            writers: Mutex::new(HashSet::new()),
            writers_changed: Condvar::new(),
        });
        let accept_thread = std::thread::Builder::new()
            .name("runjournal-commit-leader".to_string())
            .spawn({
                let server = Arc::clone(&server);
                move || server.accept_loop(&listener, &woken)
            });
        let accept_thread = match accept_thread {
            Ok(thread) => thread,
            Err(error) => {
                let _ = durable_fs::remove_if_present(&socket_path);
                return Err(error.into());
            }
        };
        Ok(Leadership {
            server,
            accept_thread: Some(accept_thread),
            wake,
            socket_path,
            socket_id,
            lock: Some(lock),
        })
    }

    /// Whether this leader found its lead taken over: it serves nobody any more.
    pub(super) fn is_deposed(&self) -> bool {
        self.server.is_deposed.load(Ordering::Acquire)
    }

    /// Stops leading. Call it once the handle's queue is closed and drained, so that every
    /// batch a client handed over was answered: takes no new client, removes the socket, ends
    /// every connection, waits for their threads, then releases the lock.
    pub(super) fn stop(mut self) {
        self.stop_now(true);
    }

    /// Stops leading once the lead was taken over, from the writer thread while its handle
    /// lives: takes no new client, removes its socket if it is still the one it bound, and ends
    /// every connection's reads. A connection's thread that waits for the answers of batches it
    /// queued is not waited for: the writer (the caller) answers them as it commits them, and
    /// the thread then ends by itself. The lock, on a file no path names any more, goes at once.
    pub(super) fn step_down(mut self) {
        self.stop_now(false);
    }

    fn stop_now(&mut self, waits_for_connections: bool) {
        self.server.is_stopping.store(true, Ordering::Release);
        self.server.writers_changed.notify_all();
        let _ = (&self.wake).write_all(&[1]);
        if let Some(thread) = self.accept_thread.take() {
            let _ = thread.join();
        }
        // Only the socket this leader bound: a leader that took over has its own there.
        if self.socket_id.is_some()
            && lease::file_id(&self.socket_path).ok().flatten() == self.socket_id
        {
            let _ = durable_fs::remove_if_present(&self.socket_path);
        }
        let threads = {
            let mut clients = lock(&self.server.clients);
            for (_, stream) in &clients.live {
                let _ = stream.shutdown(std::net::Shutdown::Read);
            }
            std::mem::take(&mut clients.threads)
        };
        if waits_for_connections {
            for thread in threads {
                let _ = thread.join();
            }
        }
        drop(self.lock.take());
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        if self.lock.is_some() {
            self.stop_now(true);
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Server {
    /// Whether the lead was taken over: the lock path names another lock file than this
    /// leader's (a failure to look counts as not). Once found, it stays so.
    fn check_deposed(&self) -> bool {
        if self.is_deposed.load(Ordering::Acquire) {
            return true;
        }
        let is_deposed = lease::is_deposed(&self.lock_path, self.lock_id);
        if is_deposed {
            self.is_deposed.store(true, Ordering::Release);
        }
        is_deposed
    }

    fn accept_loop(self: &Arc<Server>, listener: &UnixListener, woken: &UnixStream) {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        let check_every = PollTimeout::try_from(DEPOSED_CHECK_INTERVAL).unwrap_or(PollTimeout::MAX);
        loop {
            if self.is_stopping.load(Ordering::Acquire) {
                return;
            }
            let mut fds = [
                PollFd::new(listener.as_fd(), PollFlags::POLLIN),
                PollFd::new(woken.as_fd(), PollFlags::POLLIN),
            ];
            match poll(&mut fds, check_every) {
                Ok(_) => {}
                Err(nix::errno::Errno::EINTR) => continue,
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
            if fds[1].any().unwrap_or(false) || self.is_stopping.load(Ordering::Acquire) {
                return;
            }
            // A leader that ran again after a stop looks before it takes anyone.
            if self.check_deposed() {
                return;
            }
            match listener.accept() {
                Ok((stream, _)) => self.admit(stream),
                Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
                // Out of descriptors, say: the client waits in the backlog meanwhile.
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    }

    /// Serves a new connection on a thread of its own, if it is of this user and there is
    /// room.
    fn admit(self: &Arc<Server>, stream: UnixStream) {
        let is_ours = platform::peer_is_this_user(&stream).unwrap_or(false);
        let is_ready = stream.set_nonblocking(false).is_ok()
            && platform::no_sigpipe(&stream).is_ok()
            && stream.set_write_timeout(Some(CLIENT_WRITE_TIMEOUT)).is_ok();
        if !is_ours || !is_ready {
            return;
        }
        let mut clients = lock(&self.clients);
        // Threads of connections that ended are joined here, so they do not pile up.
        let (ended, running): (Vec<_>, Vec<_>) = std::mem::take(&mut clients.threads)
            .into_iter()
            .partition(JoinHandle::is_finished);
        clients.threads = running;
        for thread in ended {
            let _ = thread.join();
        }
        if clients.live.len() >= MAX_CLIENTS {
            drop(clients);
            let _ = send(&stream, &ToClient::Refuse(Refusal::Busy));
            return;
        }
        let Ok(registered) = stream.try_clone() else {
            return;
        };
        let id = clients.next_id;
        clients.next_id += 1;
        clients.live.push((id, registered));
        let thread = std::thread::Builder::new()
            .name("runjournal-commit-client".to_string())
            .stack_size(256 * 1024)
            .spawn({
                let server = Arc::clone(self);
                move || {
                    server.serve(stream);
                    lock(&server.clients).live.retain(|(live, _)| *live != id);
                }
            });
        match thread {
            Ok(thread) => clients.threads.push(thread),
            Err(_) => clients.live.retain(|(live, _)| *live != id),
        }
    }

    /// One client: its hello, then its groups until it goes away, the leader stops, or its
    /// lead is taken over.
    fn serve(&self, stream: UnixStream) {
        let Ok(reader) = stream.try_clone() else {
            return;
        };
        let mut reader = BufReader::new(TimedStream::new(reader));
        reader
            .get_mut()
            .set_deadline(HELLO_TIMEOUT, Some(wire::MAX_FRAME_BYTES + 4));
        let Ok(Some(ToLeader::Hello(hello))) = wire::read::<ToLeader>(&mut reader) else {
            return;
        };
        if let Err(refusal) = self.check(&hello) {
            let _ = send(&stream, &ToClient::Refuse(refusal));
            return;
        }
        if !self.claim(hello.writer) {
            let _ = send(&stream, &ToClient::Refuse(Refusal::Closing));
            return;
        }
        let welcome = ToClient::Welcome {
            leader_pid: std::process::id(),
        };
        let working_every = (Duration::from_millis(u64::from(hello.answer_timeout_ms)) / 4)
            .max(MIN_WORKING_INTERVAL);
        if send(&stream, &welcome).is_ok() {
            while is_group_coming(&stream, &reader) {
                let Some(batches) = read_group(&mut reader, hello.writer) else {
                    break;
                };
                // Deposed meanwhile: nothing more is judged here. The client finds the
                // connection closed and sends the group to whoever leads now.
                if self.check_deposed() {
                    break;
                }
                if self.commit(&stream, batches, working_every).is_err() {
                    break;
                }
            }
        }
        self.release(hello.writer);
    }

    /// What a client waiting for its group hears: that the leader works on it, or that it
    /// waits for the journal's write lock and since when.
    fn working(&self) -> ToClient {
        let waiting = self
            .shared
            .waiting_for_lock
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        match waiting {
            Some(held) => ToClient::WaitingForLock {
                since_ms: held.since_ms,
                holder: held.holder,
            },
            None => ToClient::Working,
        }
    }

    fn check(&self, hello: &Hello) -> Result<(), Refusal> {
        if hello.build != wire::build() {
            return Err(Refusal::OtherBuild);
        }
        if hello.journal_id != self.journal_id {
            return Err(Refusal::OtherJournal);
        }
        if hello.journal_file != self.journal_file {
            return Err(Refusal::OtherFile);
        }
        if hello.writer == self.shared.writer {
            return Err(Refusal::SameWriter);
        }
        if self.shared.is_closing.load(Ordering::Acquire) {
            return Err(Refusal::Closing);
        }
        Ok(())
    }

    /// Marks `writer` as served, after its earlier connection (if any) ended; `false` if the
    /// leader stops first.
    fn claim(&self, writer: WriterId) -> bool {
        let mut writers = lock(&self.writers);
        while writers.contains(&writer) {
            if self.is_stopping.load(Ordering::Acquire) {
                return false;
            }
            writers = self
                .writers_changed
                .wait_timeout(writers, CLAIM_POLL)
                .map_or_else(|poisoned| poisoned.into_inner().0, |(guard, _)| guard);
        }
        writers.insert(writer);
        true
    }

    fn release(&self, writer: WriterId) {
        lock(&self.writers).remove(&writer);
        self.writers_changed.notify_all();
    }

    /// Queues a client's group into this handle's writer and sends each answer as it comes, in
    /// order, saying [`ToClient::Working`] every `working_every` meanwhile. Once the queue is
    /// closed, the rest of the group is not taken. An error: the client is gone (every answer
    /// is still waited for, so that the group is settled before its writer's next hello).
    fn commit(
        &self,
        stream: &UnixStream,
        batches: Vec<Batch>,
        working_every: Duration,
    ) -> std::io::Result<()> {
        let tickets: Vec<(Option<Ticket<Answer>>, WriterId, u64)> = batches
            .into_iter()
            .map(|batch| {
                let (writer, writer_seq) = (batch.writer, batch.writer_seq);
                let ticket = self
                    .queue
                    .submit(Request {
                        run: batch.run,
                        events: batch.events,
                        condition: batch.condition,
                        origin: Origin::Remote {
                            writer,
                            writer_seq,
                            time_ms: batch.time_ms,
                        },
                        private: batch.private,
                    })
                    .ok();
                (ticket, writer, writer_seq)
            })
            .collect();
        let mut sent = Ok(());
        for (ticket, writer, writer_seq) in tickets {
            let answer = match ticket {
                Some(ticket) => loop {
                    if let Some(answer) = ticket.wait_timeout(working_every) {
                        break to_wire(answer, writer, writer_seq);
                    }
                    if sent.is_ok() {
                        sent = send(stream, &self.working());
                    }
                },
                None => WireAnswer::NotTaken,
            };
            if sent.is_ok() {
                sent = send(stream, &ToClient::Answer(answer));
            }
        }
        sent
    }
}

/// Waits up to [`IDLE_TIMEOUT`] for the first byte of the client's next group; `false` when
/// none came (the connection is then closed), or the connection ended or failed.
fn is_group_coming(stream: &UnixStream, buffered: &BufReader<TimedStream>) -> bool {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    if !buffered.buffer().is_empty() {
        return true;
    }
    let deadline = Instant::now() + IDLE_TIMEOUT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        let mut fds = [PollFd::new(stream.as_fd(), PollFlags::POLLIN)];
        match poll(
            &mut fds,
            PollTimeout::try_from(left).unwrap_or(PollTimeout::MAX),
        ) {
            // Readable, or ended: the read tells which.
            Ok(ready) if ready > 0 => return true,
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return false,
        }
    }
}

/// Reads a group header and all its batches, within [`GROUP_ARRIVAL_TIMEOUT`] and
/// [`wire::MAX_GROUP_BYTES`]; `None` when the client went away, was too slow or too large, or
/// sent anything but a well-formed group (a batch whose PID namespaces do not fit its events
/// included).
fn read_group(reader: &mut BufReader<TimedStream>, writer: WriterId) -> Option<Vec<Batch>> {
    // What the reader buffered already counts against the group's bytes.
    let budget = wire::MAX_GROUP_BYTES.saturating_sub(reader.buffer().len());
    reader
        .get_mut()
        .set_deadline(GROUP_ARRIVAL_TIMEOUT, Some(budget));
    let Ok(Some(ToLeader::Group { batches: count })) = wire::read::<ToLeader>(reader) else {
        return None;
    };
    if count == 0 || count > wire::MAX_GROUP_BATCHES {
        return None;
    }
    let mut batches = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let Ok(Some(ToLeader::Batch(batch))) = wire::read::<ToLeader>(reader) else {
            return None;
        };
        batches.push(batch.into_batch(writer).ok()?);
    }
    Some(batches)
}

/// The client's answer to its batch (its writer's `writer_seq`), from the writer's.
fn to_wire(answer: Answer, writer: WriterId, writer_seq: u64) -> WireAnswer {
    let failed =
        |op: &str, errno: Option<i32>, message: String, is_corrupt: bool| WireAnswer::Failed {
            op: op.to_string(),
            errno,
            message,
            is_corrupt,
        };
    match answer.result {
        Ok(appended) => match encode_snapshot(&appended.state) {
            Ok(state) => WireAnswer::Committed {
                first_seq: appended.first_seq,
                last_seq: appended.last_seq,
                was_duplicate: appended.was_duplicate,
                state,
            },
            // The state was just stored as a snapshot, so it encodes; if it did not, the
            // client learns the batch may have landed, which is true.
            Err(error) => failed("encoding the answer", None, error.to_string(), false),
        },
        Err(AppendError::WriterSeqReused {
            writer: reused_writer,
            writer_seq: reused_seq,
            ..
        }) if reused_writer == writer && reused_seq == writer_seq => WireAnswer::SeqReused {
            was_retried: answer.was_retried,
        },
        Err(AppendError::Storage(failure)) => failed(
            failure.op,
            failure.io_error().and_then(std::io::Error::raw_os_error),
            failure.source.to_string(),
            false,
        ),
        Err(AppendError::Corrupt(error)) => {
            failed("reading the run", None, error.to_string(), true)
        }
        Err(AppendError::Damaged(damaged)) => {
            failed("committing", None, damaged.panic.to_string(), true)
        }
        Err(AppendError::Queue { refusal, .. }) => WireAnswer::QueueRefused { refusal },
        Err(error) => match answer.refused_against {
            Some(against) => match against.as_ref().map(encode_snapshot).transpose() {
                Ok(against) => WireAnswer::Refused { against },
                Err(encode) => failed("encoding the answer", None, encode.to_string(), false),
            },
            // Every refusal of a client's batch keeps its state; without one the client gets
            // the refusal's words.
            None => failed("judging the batch", None, error.to_string(), false),
        },
    }
}

fn send(stream: &UnixStream, message: &ToClient) -> std::io::Result<()> {
    let bytes = wire::frame(message).map_err(std::io::Error::other)?;
    platform::send_all(stream, &bytes)
}
