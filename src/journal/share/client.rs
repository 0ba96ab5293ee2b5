//! A client's connection to its journal's commit leader: it hands over a group of batches,
//! numbered by its own writer, and reads one answer per batch.
//!
//! Nothing here waits unbounded on the leader: the connect never waits (a full backlog is a
//! leader that does not accept), the hello's answer and every word after it must begin within
//! the answer timeout and arrive whole within it of its first byte, and a send that the leader
//! does not read within it fails. A leader that is busy committing says [`ToClient::Working`]
//! well within that time; one that says nothing is stopped, frozen or gone, and is treated as
//! gone. A leader held up by the journal's write lock says [`ToClient::WaitingForLock`]
//! instead: a client with a bound of its own stops waiting at it, its batches uncertain.

use std::io::BufReader;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::Rendezvous;
use super::lease::{self, FileId};
use super::wire::{self, Hello, TimedStream, ToClient, ToLeader, WireAnswer, WireBatch};
use crate::durable_fs::{self, FileLock, SocketPath};
use crate::journal::format::error::LockHeld;
use crate::journal::write::append::Batch;
use crate::platform;

/// Why no connection to a leader was made.
#[derive(Debug)]
pub(super) enum Unreachable {
    /// Nothing listens where the leader would: there may be no leader.
    NoLeader,
    /// Something listens there but does not answer in time: a leader that is stopped (or
    /// whose backlog is full). Nothing was handed to it. `lock` is the commit lock file the
    /// lock path named before the connect: the one that leader holds, unless the lead moved.
    Unresponsive { lock: Option<FileId> },
    /// Something listens or lies there that this process will not hand batches to (another
    /// user's socket, a file that is no socket), or a leader refused the hello (busy,
    /// closing, another build or journal).
    Refused,
}

/// Why an exchange did not bring every answer.
#[derive(Debug)]
pub(super) enum ExchangeError {
    /// A batch's frame is too large to send: nothing was sent.
    TooLarge,
    /// The connection failed or ended part-way: the leader may have taken any of the batches.
    Broken,
    /// The leader said nothing for the answer timeout (stopped, frozen): it may have taken any
    /// of the batches, and may judge them should it run again.
    Silent,
    /// No answer came, and the commit lock is free: the leader is gone (it releases the lock
    /// only after answering all it took, or dies), and judges nothing any more.
    LeaderGone,
    /// The leader is alive but has waited for the journal's write lock past this client's own
    /// bound ([`Connection::give_up_after`]): it holds the batches, and may commit them once
    /// the lock is let go.
    GaveUp(LockHeld),
}

/// A connection whose hello the leader accepted.
pub(super) struct Connection {
    stream: UnixStream,
    reader: BufReader<TimedStream>,
    /// The commit lock the leader holds while it leads.
    lock: PathBuf,
    /// The lock file the lock path named before the connect (see [`Unreachable::Unresponsive`]).
    pub(super) lock_id: Option<FileId>,
    /// The longest silence of the leader taken for work in progress.
    answer_timeout: Duration,
    /// This client's own bound on a wait for the journal's write lock: past it, a group the
    /// leader says is waiting for the lock is given up ([`ExchangeError::GaveUp`]).
    give_up_after: Option<Duration>,
}

impl Connection {
    /// Connects to the leader at `rendezvous` and says hello; gives up on a leader that does
    /// not answer within `hello.answer_timeout_ms`. `give_up_after` is this client's bound on
    /// a wait for the journal's write lock.
    pub(super) fn open(
        rendezvous: &Rendezvous,
        hello: &Hello,
        give_up_after: Option<Duration>,
    ) -> Result<Connection, Unreachable> {
        let path = &rendezvous.socket;
        match durable_fs::inspect_socket_path(path) {
            Ok(SocketPath::OurSocket) => {}
            Ok(SocketPath::Missing) => return Err(Unreachable::NoLeader),
            Ok(SocketPath::Other { .. }) | Err(_) => return Err(Unreachable::Refused),
        }
        // Looked at before the connect: should the leader be silent, it is this lock file that
        // is taken from it, unless the lead moved meanwhile.
        let lock_id = lease::file_id(&rendezvous.lock).ok().flatten();
        let unresponsive = Unreachable::Unresponsive { lock: lock_id };
        let stream = match platform::connect_without_waiting(rendezvous.address.path()) {
            Ok(stream) => stream,
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {
                return Err(unresponsive);
            }
            Err(_) => return Err(Unreachable::NoLeader),
        };
        // The socket's directory is this user's alone; the peer is checked all the same (a
        // process of another user namespace shows as the overflow uid, and is never ours).
        if !platform::peer_is_this_user(&stream).unwrap_or(false) {
            return Err(Unreachable::Refused);
        }
        let answer_timeout = Duration::from_millis(u64::from(hello.answer_timeout_ms.max(1)));
        let is_ready = platform::no_sigpipe(&stream).is_ok()
            && stream.set_write_timeout(Some(answer_timeout)).is_ok();
        if !is_ready {
            return Err(Unreachable::Refused);
        }
        let reader = stream.try_clone().map_err(|_| Unreachable::Refused)?;
        let mut connection = Connection {
            stream,
            reader: BufReader::new(TimedStream::new(reader)),
            lock: rendezvous.lock.clone(),
            lock_id,
            answer_timeout,
            give_up_after,
        };
        let hello =
            wire::frame(&ToLeader::Hello(hello.clone())).map_err(|_| Unreachable::Refused)?;
        match platform::send_all(&connection.stream, &hello) {
            Ok(()) => {}
            Err(error) if is_timeout(&error) => return Err(unresponsive),
            // A leader that goes away before it answers is no leader.
            Err(_) => return Err(Unreachable::NoLeader),
        }
        match connection.next_word() {
            Ok(()) => {}
            Err(Silence::Timeout) => return Err(unresponsive),
            Err(Silence::Gone | Silence::Failed) => return Err(Unreachable::NoLeader),
        }
        match connection.read_frame() {
            Ok(Some(ToClient::Welcome { .. })) => Ok(connection),
            // Stopped part-way through its answer.
            Err(error) if wire::is_timeout(&error) => Err(unresponsive),
            Ok(None) | Err(wire::WireError::Io(_)) => Err(Unreachable::NoLeader),
            Ok(Some(_)) | Err(_) => Err(Unreachable::Refused),
        }
    }

    /// Reads the leader's next frame, which must arrive whole within the answer timeout.
    fn read_frame(&mut self) -> Result<Option<ToClient>, wire::WireError> {
        self.reader
            .get_mut()
            .set_deadline(self.answer_timeout, None);
        wire::read::<ToClient>(&mut self.reader)
    }

    /// Hands the first of `batches` to the leader as one group — as many as fit
    /// [`wire::MAX_GROUP_BATCHES`] and [`wire::MAX_GROUP_BYTES`], at least one — and reads
    /// their answers, in order: one answer for each batch sent, the first ones of `batches`.
    /// Returns when every answer is in, the connection failed, the leader fell silent, or it
    /// waited for the write lock past this client's bound; then with the answers that came
    /// before, and how many batches were sent.
    pub(super) fn exchange(&mut self, batches: &[&Batch]) -> Exchanged {
        let mut answers = Vec::new();
        let mut sent = 0;
        let error = self.exchange_into(batches, &mut answers, &mut sent).err();
        Exchanged {
            answers,
            sent,
            error,
        }
    }

    fn exchange_into(
        &mut self,
        batches: &[&Batch],
        answers: &mut Vec<WireAnswer>,
        sent: &mut usize,
    ) -> Result<(), ExchangeError> {
        assert!(!batches.is_empty(), "a group of at least one batch");
        let mut frames = Vec::new();
        let mut size = 0usize;
        for batch in batches.iter().take(wire::MAX_GROUP_BATCHES as usize) {
            let frame = match wire::frame(&ToLeader::Batch(WireBatch::of(batch))) {
                Ok(frame) => frame,
                Err(wire::WireError::TooLarge { .. }) if frames.is_empty() => {
                    return Err(ExchangeError::TooLarge);
                }
                // Sent on its own in a later group, where it is found too large.
                Err(wire::WireError::TooLarge { .. }) => break,
                Err(_) => return Err(ExchangeError::Broken),
            };
            if !frames.is_empty() && size + frame.len() > GROUP_BATCH_BYTES {
                break;
            }
            size += frame.len();
            frames.push(frame);
        }
        let count = frames.len();
        let mut bytes = wire::frame(&ToLeader::Group {
            batches: count as u32,
        })
        .map_err(|_| ExchangeError::Broken)?;
        bytes.reserve(size);
        for frame in frames {
            bytes.extend(frame);
        }
        debug_assert!(
            bytes.len() <= wire::MAX_GROUP_BYTES,
            "a group within its bound"
        );
        *sent = count;
        platform::send_all(&self.stream, &bytes).map_err(|_| ExchangeError::Broken)?;
        let sent_at = Instant::now();
        while answers.len() < count {
            self.next_word().map_err(|silence| match silence {
                Silence::Timeout => ExchangeError::Silent,
                Silence::Gone => ExchangeError::LeaderGone,
                Silence::Failed => ExchangeError::Broken,
            })?;
            match self.read_frame() {
                Ok(Some(ToClient::Answer(answer))) => answers.push(answer),
                Ok(Some(ToClient::Working)) => {}
                Ok(Some(ToClient::WaitingForLock { since_ms, holder })) => {
                    if self
                        .give_up_after
                        .is_some_and(|bound| sent_at.elapsed() >= bound)
                    {
                        return Err(ExchangeError::GaveUp(LockHeld { since_ms, holder }));
                    }
                }
                // Stopped part-way through a frame.
                Err(error) if wire::is_timeout(&error) => return Err(ExchangeError::Silent),
                // Anything else, the end of the stream or a bad frame: the connection is
                // broken, whatever the leader did with the group.
                _ => return Err(ExchangeError::Broken),
            }
        }
        Ok(())
    }

    /// Waits until the leader's next frame starts to arrive: `Timeout` when it says nothing
    /// for the answer timeout, `Gone` when the connection fails or the leader released the
    /// commit lock without a word (it answers all it took before it releases it).
    fn next_word(&self) -> Result<(), Silence> {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        use std::os::fd::AsFd;
        if !self.reader.buffer().is_empty() {
            return Ok(());
        }
        let deadline = Instant::now() + self.answer_timeout;
        // The lock is looked at now and then, for a leader gone without its connection ending
        // (a copy of its socket inherited by a child of its process, say).
        let check_every = (self.answer_timeout / 4).max(Duration::from_millis(10));
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Silence::Timeout);
            }
            let wait = PollTimeout::try_from(left.min(check_every)).unwrap_or(PollTimeout::MAX);
            let mut fds = [PollFd::new(self.stream.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, wait) {
                Ok(0) => {}
                // Readable, or ended: the read tells which.
                Ok(_) => return Ok(()),
                Err(nix::errno::Errno::EINTR) => continue,
                Err(_) => return Err(Silence::Failed),
            }
            if let Ok(Some(free)) = FileLock::try_acquire(&self.lock) {
                drop(free);
                let mut fds = [PollFd::new(self.stream.as_fd(), PollFlags::POLLIN)];
                if poll(&mut fds, PollTimeout::ZERO).is_ok_and(|ready| ready > 0) {
                    return Ok(());
                }
                return Err(Silence::Gone);
            }
        }
    }
}

/// What came of an exchange ([`Connection::exchange`]).
pub(super) struct Exchanged {
    /// The answers of the first batches sent, in order.
    pub(super) answers: Vec<WireAnswer>,
    /// How many batches were sent (or were being sent when the connection failed): the first
    /// `sent` of those given.
    pub(super) sent: usize,
    /// Why the rest of the sent batches have no answer; `None` when all have one.
    pub(super) error: Option<ExchangeError>,
}

/// The most bytes of batch frames a client puts in one group: the group's bound less room for
/// its header.
const GROUP_BATCH_BYTES: usize = wire::MAX_GROUP_BYTES - 64;

/// Why the leader's next word did not come.
enum Silence {
    /// Nothing within the answer timeout.
    Timeout,
    /// The commit lock is free.
    Gone,
    /// The connection cannot be waited on.
    Failed,
}

fn is_timeout(error: &std::io::Error) -> bool {
    matches!(
        error.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}
