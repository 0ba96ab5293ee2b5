//! A client's connection to its journal's commit leader: it hands over a group of batches,
//! numbered by its own writer, and reads one answer per batch.

use std::io::BufReader;
use std::os::unix::net::UnixStream;

use super::wire::{self, Hello, ToClient, ToLeader, WireAnswer, WireBatch};
use super::{Rendezvous, SocketAt};
use crate::durable_fs::{self, SocketPath};
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
}

/// A connection whose hello the leader accepted.
pub(super) struct Connection {
    stream: UnixStream,
    reader: BufReader<UnixStream>,
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
        };
        let hello =
            wire::frame(&ToLeader::Hello(hello.clone())).map_err(|_| Unreachable::Refused)?;
        // A leader that goes away before it answers is no leader.
        platform::send_all(&connection.stream, &hello).map_err(|_| Unreachable::NoLeader)?;
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
            match wire::read::<ToClient>(&mut self.reader) {
                Ok(Some(ToClient::Answer(answer))) => answers.push(answer),
                // Anything else, the end of the stream or a bad frame: the connection is
                // broken, whatever the leader did with the group.
                _ => return Err(ExchangeError::Broken),
            }
        }
        Ok(answers)
    }
}
