//! A client's connection to its journal's commit leader: it hands over a group of batches,
//! numbered by its own writer, and reads one answer per batch.

use std::io::BufReader;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use super::wire::{self, Hello, ToClient, ToLeader, WireAnswer, WireBatch};
use super::{Rendezvous, SocketAt};
use crate::durable_fs::{self, FileLock, SocketPath};
use crate::journal::append::Batch;
use crate::platform;

/// Why no connection to a leader was made.
#[derive(Debug)]
pub(super) enum Unreachable {
    /// Nothing listens where the leader would: there may be no leader.
    NoLeader,
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
    /// The connection failed part-way: the leader may have taken any of the batches.
    Broken,
    /// No answer came, and the commit lock is free: the leader is gone (it released the lock
    /// only after answering all it took, or died), and judges nothing any more.
    LeaderGone,
}

/// How long a client waits for an answer before it looks whether its leader still holds the
/// lock. A leader riding out a full disk keeps it waiting for as long as that takes; a leader
/// that is gone without its connection ending (a copy of its socket inherited by a child of
/// its process, say) is noticed by its free lock.
const ANSWER_CHECK_INTERVAL_MS: u16 = 1000;

/// A connection whose hello the leader accepted.
pub(super) struct Connection {
    stream: UnixStream,
    reader: BufReader<UnixStream>,
    /// The commit lock the leader holds while it leads.
    lock: PathBuf,
}

impl Connection {
    /// Connects to the leader at `rendezvous` and says hello. Waits while the leader finishes
    /// an earlier connection of the same writer (it answers only then).
    pub(super) fn open(rendezvous: &Rendezvous, hello: &Hello) -> Result<Connection, Unreachable> {
        let stream = match &rendezvous.socket {
            SocketAt::Path(path) => {
                match durable_fs::inspect_socket_path(path) {
                    Ok(SocketPath::OurSocket) => {}
                    Ok(SocketPath::Missing) => return Err(Unreachable::NoLeader),
                    Ok(SocketPath::Other { .. }) | Err(_) => return Err(Unreachable::Refused),
                }
                UnixStream::connect(path).map_err(|_| Unreachable::NoLeader)?
            }
            SocketAt::Abstract(name) => {
                platform::connect_abstract(name).map_err(|_| Unreachable::NoLeader)?
            }
        };
        // A socket of ours can only have been made by our user; in the abstract namespace,
        // anyone could have taken the name.
        let uid = nix::unistd::geteuid().as_raw();
        if !platform::peer_uid(&stream).is_ok_and(|peer| peer == uid) {
            return Err(Unreachable::Refused);
        }
        platform::no_sigpipe(&stream).map_err(|_| Unreachable::Refused)?;
        let reader = stream.try_clone().map_err(|_| Unreachable::Refused)?;
        let mut connection = Connection {
            stream,
            reader: BufReader::new(reader),
            lock: rendezvous.lock.clone(),
        };
        let hello =
            wire::frame(&ToLeader::Hello(hello.clone())).map_err(|_| Unreachable::Refused)?;
        // A leader that goes away before it answers is no leader.
        platform::send_all(&connection.stream, &hello).map_err(|_| Unreachable::NoLeader)?;
        connection
            .wait_for_answer()
            .map_err(|_| Unreachable::NoLeader)?;
        match wire::read::<ToClient>(&mut connection.reader) {
            Ok(Some(ToClient::Welcome { .. })) => Ok(connection),
            Ok(None) | Err(wire::WireError::Io(_)) => Err(Unreachable::NoLeader),
            Ok(Some(_)) | Err(_) => Err(Unreachable::Refused),
        }
    }

    /// Hands `batches` (at most [`wire::MAX_GROUP_BATCHES`]) to the leader as one group and
    /// reads their answers, in order. Returns only when every answer is in, or the connection
    /// failed.
    pub(super) fn exchange(&mut self, batches: &[Batch]) -> Result<Vec<WireAnswer>, ExchangeError> {
        assert!(
            !batches.is_empty() && batches.len() <= wire::MAX_GROUP_BATCHES as usize,
            "a group of 1 to MAX_GROUP_BATCHES batches"
        );
        let count = batches.len() as u32;
        let mut bytes =
            wire::frame(&ToLeader::Group { batches: count }).map_err(|_| ExchangeError::Broken)?;
        for batch in batches {
            match wire::frame(&ToLeader::Batch(WireBatch::of(batch))) {
                Ok(frame) => bytes.extend(frame),
                Err(wire::WireError::TooLarge { .. }) => return Err(ExchangeError::TooLarge),
                Err(_) => return Err(ExchangeError::Broken),
            }
        }
        platform::send_all(&self.stream, &bytes).map_err(|_| ExchangeError::Broken)?;
        let mut answers = Vec::with_capacity(batches.len());
        for _ in batches {
            self.wait_for_answer()?;
            match wire::read::<ToClient>(&mut self.reader) {
                Ok(Some(ToClient::Answer(answer))) => answers.push(answer),
                // Anything else, the end of the stream or a bad frame: the connection is
                // broken, whatever the leader did with the group.
                _ => return Err(ExchangeError::Broken),
            }
        }
        Ok(answers)
    }

    /// Waits until an answer starts to arrive, or the leader is found gone.
    fn wait_for_answer(&self) -> Result<(), ExchangeError> {
        use nix::poll::{PollFd, PollFlags, poll};
        use std::os::fd::AsFd;
        while self.reader.buffer().is_empty() {
            let mut fds = [PollFd::new(self.stream.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, ANSWER_CHECK_INTERVAL_MS) {
                Ok(0) => {}
                // Readable, or ended: the read tells which.
                Ok(_) => return Ok(()),
                Err(nix::errno::Errno::EINTR) => continue,
                Err(_) => return Err(ExchangeError::Broken),
            }
            if let Ok(Some(free)) = FileLock::try_acquire(&self.lock) {
                drop(free);
                // A leader answers before it releases the lock: look once more.
                let mut fds = [PollFd::new(self.stream.as_fd(), PollFlags::POLLIN)];
                if poll(&mut fds, 0u8).is_ok_and(|ready| ready > 0) {
                    return Ok(());
                }
                return Err(ExchangeError::LeaderGone);
            }
        }
        Ok(())
    }
}
