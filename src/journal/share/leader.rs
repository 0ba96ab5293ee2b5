//! The commit leader's side: holding the journal's commit lock, it listens on the journal's
//! socket and puts every client's batches into its own handle's queue, where its writer
//! commits them in its groups; each client is answered once the commit holding its batches
//! returned.
//!
//! Invariants:
//! * the socket is bound, and a stale one removed, only while the lock is held; the lock is
//!   released only after every client batch the leader took was answered (or the process died,
//!   which commits nothing more);
//! * a client's group is queued only once all of it has arrived: a group cut short is never
//!   judged;
//! * one writer has at most one connection served at a time: the hello of a writer's new
//!   connection is answered only after its earlier connection's batches were all answered, so
//!   a batch the client sends again is judged after every earlier copy of it;
//! * nothing of another user is served, and nothing that is not our socket is removed.

use std::collections::HashSet;
use std::io::{BufReader, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use super::wire::{self, Hello, Refusal, ToClient, ToLeader, WireAnswer};
use super::{Rendezvous, SocketAt};
use crate::durable_fs::{self, FileLock, SocketPath};
use crate::event::WriterId;
use crate::journal::append::Batch;
use crate::journal::error::AppendError;
use crate::journal::queue::{Queue, Ticket};
use crate::journal::snapshot::encode_snapshot;
use crate::journal::writer::{Answer, Origin, Request, Shared};
use crate::platform;

/// The most clients served at once; a client past it is refused as busy and commits alone.
pub(crate) const MAX_CLIENTS: usize = 256;

/// How long a write to a client may block (a client that stopped reading): the connection is
/// then dropped, and the client, once it reads again, finds it broken and sends again.
const CLIENT_WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a hello may take to arrive after a connection is accepted.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// How often a hello waiting for its writer's earlier connection looks whether the leader is
/// stopping.
const CLAIM_POLL: Duration = Duration::from_millis(100);

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
    /// The socket file to remove on stopping (none in the abstract namespace).
    socket_path: Option<PathBuf>,
    /// Held until everything the leader took was answered; released last.
    lock: Option<FileLock>,
}

struct Server {
    shared: Arc<Shared>,
    queue: Arc<Queue<Request, Answer>>,
    journal_id: [u8; 16],
    uid: u32,
    is_stopping: AtomicBool,
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
        let Some(lock) = FileLock::try_acquire(&rendezvous.lock)? else {
            return Ok(None);
        };
        let (listener, socket_path) = match &rendezvous.socket {
            SocketAt::Path(path) => {
                match durable_fs::inspect_socket_path(path)? {
                    SocketPath::Missing => {}
                    // A socket of ours that nobody serves: the leader that made it is gone
                    // (the lock was free). Safe to remove while we hold the lock.
                    SocketPath::OurSocket => durable_fs::remove_if_present(path)?,
                    SocketPath::Other { what } => {
                        return Err(ServeError::Occupied {
                            path: path.clone(),
                            what,
                        });
                    }
                }
                (durable_fs::bind_private_socket(path)?, Some(path.clone()))
            }
            SocketAt::Abstract(name) => (platform::bind_abstract(name)?, None),
        };
        listener.set_nonblocking(true)?;
        // Informational: who leads, for people and tests; nothing decides by it.
        let _ = lock.write_note(format!("{}\n", std::process::id()).as_bytes());
        let (wake, woken) = UnixStream::pair()?;
        let server = Arc::new(Server {
            shared: Arc::clone(shared),
            queue: Arc::clone(queue),
            journal_id,
            uid: nix::unistd::geteuid().as_raw(),
            is_stopping: AtomicBool::new(false),
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
                if let Some(path) = &socket_path {
                    let _ = durable_fs::remove_if_present(path);
                }
                return Err(error.into());
            }
        };
        Ok(Some(Leadership {
            server,
            accept_thread: Some(accept_thread),
            wake,
            socket_path,
            lock: Some(lock),
        }))
    }

    /// Stops leading. Call it once the handle's queue is closed and drained, so that every
    /// batch a client handed over was answered: takes no new client, removes the socket, ends
    /// every connection, waits for their threads, then releases the lock.
    pub(super) fn stop(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        self.server.is_stopping.store(true, Ordering::Release);
        self.server.writers_changed.notify_all();
        let _ = (&self.wake).write_all(&[1]);
        if let Some(thread) = self.accept_thread.take() {
            let _ = thread.join();
        }
        if let Some(path) = &self.socket_path {
            let _ = durable_fs::remove_if_present(path);
        }
        let threads = {
            let mut clients = lock(&self.server.clients);
            for (_, stream) in &clients.live {
                let _ = stream.shutdown(std::net::Shutdown::Read);
            }
            std::mem::take(&mut clients.threads)
        };
        for thread in threads {
            let _ = thread.join();
        }
        drop(self.lock.take());
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        if self.lock.is_some() {
            self.stop_now();
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Server {
    fn accept_loop(self: &Arc<Server>, listener: &UnixListener, woken: &UnixStream) {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        loop {
            if self.is_stopping.load(Ordering::Acquire) {
                return;
            }
            let mut fds = [
                PollFd::new(listener.as_fd(), PollFlags::POLLIN),
                PollFd::new(woken.as_fd(), PollFlags::POLLIN),
            ];
            match poll(&mut fds, PollTimeout::NONE) {
                Ok(_) => {}
                Err(nix::errno::Errno::EINTR) => continue,
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
            if fds[1].any().unwrap_or(false) || self.is_stopping.load(Ordering::Acquire) {
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
        let is_ours = platform::peer_uid(&stream).is_ok_and(|peer| peer == self.uid);
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

    /// One client: its hello, then its groups until it goes away or the leader stops.
    fn serve(&self, stream: UnixStream) {
        let Ok(reader) = stream.try_clone() else {
            return;
        };
        let mut reader = BufReader::new(reader);
        let _ = stream.set_read_timeout(Some(HELLO_TIMEOUT));
        let Ok(Some(ToLeader::Hello(hello))) = wire::read::<ToLeader>(&mut reader) else {
            return;
        };
        let _ = stream.set_read_timeout(None);
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
        if send(&stream, &welcome).is_ok() {
            while let Some(batches) = read_group(&mut reader, hello.writer) {
                let answers = self.commit(batches);
                if send_all(&stream, answers).is_err() {
                    break;
                }
            }
        }
        self.release(hello.writer);
    }

    fn check(&self, hello: &Hello) -> Result<(), Refusal> {
        if hello.build != wire::build() {
            return Err(Refusal::OtherBuild);
        }
        if hello.journal_id != self.journal_id {
            return Err(Refusal::OtherJournal);
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

    /// Queues a client's group into this handle's writer and waits for every answer. Once the
    /// queue is closed, the rest of the group is not taken.
    fn commit(&self, batches: Vec<Batch>) -> Vec<WireAnswer> {
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
                    })
                    .ok();
                (ticket, writer, writer_seq)
            })
            .collect();
        tickets
            .into_iter()
            .map(|(ticket, writer, writer_seq)| match ticket {
                Some(ticket) => to_wire(ticket.wait(), writer, writer_seq),
                None => WireAnswer::NotTaken,
            })
            .collect()
    }
}

/// Reads a group header and all its batches; `None` when the client went away, or sent
/// anything but a well-formed group (a batch whose PID namespaces do not fit its events
/// included).
fn read_group(reader: &mut impl Read, writer: WriterId) -> Option<Vec<Batch>> {
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

fn send_all(stream: &UnixStream, answers: Vec<WireAnswer>) -> std::io::Result<()> {
    let mut bytes = Vec::new();
    for answer in answers {
        let frame = wire::frame(&ToClient::Answer(answer)).map_err(std::io::Error::other)?;
        bytes.extend(frame);
    }
    platform::send_all(stream, &bytes)
}
