//! The commit leader's protocol: the messages a client and its leader exchange over the Unix
//! socket, and their frames (docs/journal-format.md, "Commit sharing").
//!
//! A frame is a 4-byte little-endian length, then that many bytes: the postcard encoding of
//! `{protocol: u16, message}`, then its CRC-32C, as records are laid out. A frame longer than
//! [`MAX_FRAME_BYTES`], of another protocol version, failing its checksum or not decoding ends
//! the connection: neither side guesses at what the other meant.
//!
//! Invariant: variants and fields are only ever added at the end, under a new
//! [`PROTOCOL_VERSION`]; a peer of another version is refused, never half understood.

use std::io::{self, Read};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::event::{self, Event, FORMAT_VERSION, MAX_SNAPSHOT_BYTES, RunId, UnixMs, WriterId};
use crate::journal::format::snapshot::SNAPSHOT_LAYOUT;
use crate::journal::write::append::{Batch, Condition};

/// The version of this protocol. Version 1 is the first; version 2 added
/// [`WireBatch::pid_namespaces`] (version 1 lost a process identity's PID namespace on the
/// way to the leader); version 3 added [`Hello::journal_file`], [`Hello::answer_timeout_ms`]
/// and [`ToClient::Working`], so that a client can tell a stopped leader from a busy one;
/// version 4 added [`WireAnswer::QueueRefused`] and the queue events; version 5 added
/// [`ToClient::WaitingForLock`], so that a client with a bound of its own (a command) can tell
/// a leader held up by another process's write lock from one at work; version 6 added
/// [`WireBatch::private`] and the hook events; version 7 added the dependency events and the
/// dependencies' refusals among [`WireAnswer::QueueRefused`]'s; version 8 the key of a run
/// launched once; version 9 the retry events.
pub(crate) const PROTOCOL_VERSION: u16 = 9;

/// The largest frame either side sends or reads: room for the largest snapshot (an answer
/// carries one) and then some. A batch whose frame would be larger is committed by its own
/// process instead.
pub(crate) const MAX_FRAME_BYTES: usize = 2 * MAX_SNAPSHOT_BYTES;

/// The most batches one group message may announce.
pub(crate) const MAX_GROUP_BATCHES: u32 = 4096;

/// The most bytes of frames one group may take, header and batches together: a client keeps
/// its groups under it (the rest goes in the next group), and a leader ends a connection
/// whose group would pass it, so that no client holds more of a leader's memory.
pub(crate) const MAX_GROUP_BYTES: usize = 4 * MAX_FRAME_BYTES;

/// What a client says it is built as: the leader commits a client's batches only if it judges
/// them by the same rules, records and snapshots.
pub(crate) fn build() -> String {
    format!(
        "runjournal {} records {FORMAT_VERSION} snapshots {SNAPSHOT_LAYOUT}",
        env!("CARGO_PKG_VERSION")
    )
}

#[derive(Debug, Serialize, Deserialize)]
struct Envelope<T> {
    protocol: u16,
    message: T,
}

/// From a client to its leader.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) enum ToLeader {
    /// The first message of a connection.
    Hello(Hello),
    /// A group follows: this many [`ToLeader::Batch`] messages, answered in their order once
    /// all have arrived.
    Group {
        batches: u32,
    },
    Batch(WireBatch),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Hello {
    /// [`build`] of the client.
    pub(crate) build: String,
    /// The journal the client has open (`meta.journal_id`).
    pub(crate) journal_id: [u8; 16],
    /// The client's writer: every batch of the connection is this writer's.
    pub(crate) writer: WriterId,
    pub(crate) pid: u32,
    /// The journal file the client has open, as (device, inode): two homes copied from one
    /// share a journal id, never a file.
    pub(crate) journal_file: (u64, u64),
    /// How long the client waits for a word from the leader before it takes the leader for
    /// stopped: the leader says [`ToClient::Working`] well within it while a group of the
    /// client's is being committed.
    pub(crate) answer_timeout_ms: u32,
}

/// A batch as its own writer numbered it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct WireBatch {
    pub(crate) run: RunId,
    /// The events as postcard writes them, which is without the PID namespace of a process
    /// identity (records carry it after their event): see `pid_namespaces`.
    pub(crate) events: Vec<Event>,
    pub(crate) expect_head: Option<u64>,
    pub(crate) expect_not_terminal: bool,
    pub(crate) writer_seq: u64,
    pub(crate) time_ms: UnixMs,
    /// One per event, in order: the PID namespace of the process identity it records (`None`
    /// when it records none, or one without a namespace). Without it the leader would commit
    /// other events than the client's, and a batch sent again could not be recognised as the
    /// one the leader committed.
    pub(crate) pid_namespaces: Vec<Option<u64>>,
    /// What a new run keeps in the home only (its environment, its own hooks): the leader
    /// writes it in the transaction of the creation batch, as the client would have.
    pub(crate) private: Option<crate::run_env::RunPrivate>,
}

impl WireBatch {
    pub(crate) fn of(batch: &Batch) -> WireBatch {
        WireBatch {
            run: batch.run,
            events: batch.events.clone(),
            expect_head: batch.condition.expect_head,
            expect_not_terminal: batch.condition.expect_not_terminal,
            writer_seq: batch.writer_seq,
            time_ms: batch.time_ms,
            pid_namespaces: batch
                .events
                .iter()
                .map(|event| {
                    event
                        .process_identity()
                        .and_then(|process| process.pid_namespace)
                })
                .collect(),
            private: batch.private.as_deref().cloned(),
        }
    }

    /// The batch as its writer made it, committed under `writer`; `Malformed` when the PID
    /// namespaces do not fit the events (not one per event, or one for an event that records
    /// no process).
    pub(crate) fn into_batch(self, writer: WriterId) -> Result<Batch, WireError> {
        if self.pid_namespaces.len() != self.events.len() {
            return Err(WireError::Malformed {
                reason: format!(
                    "{} PID namespaces for {} events",
                    self.pid_namespaces.len(),
                    self.events.len()
                ),
            });
        }
        let mut events = self.events;
        for (event, namespace) in events.iter_mut().zip(self.pid_namespaces) {
            let Some(namespace) = namespace else {
                continue;
            };
            let name = event.name();
            let process = event
                .process_identity_mut()
                .ok_or_else(|| WireError::Malformed {
                    reason: format!("a PID namespace for {name}, which records no process"),
                })?;
            process.pid_namespace = Some(namespace);
        }
        Ok(Batch {
            run: self.run,
            events,
            condition: Condition {
                expect_head: self.expect_head,
                expect_not_terminal: self.expect_not_terminal,
            },
            writer,
            writer_seq: self.writer_seq,
            time_ms: self.time_ms,
            private: self.private.map(std::sync::Arc::new),
        })
    }
}

/// From a leader to a client.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) enum ToClient {
    /// The hello is accepted: groups may follow.
    Welcome { leader_pid: u32 },
    /// The hello is refused; the leader closes the connection.
    Refuse(Refusal),
    /// One batch's answer, in the order of the group.
    Answer(WireAnswer),
    /// The group is still being committed: the leader is alive and at work on it.
    Working,
    /// The group is still waiting: the leader is alive, but its commit has waited for the
    /// journal's write lock since `since_ms` (past its notice), held by `holder` (its pid and
    /// command name, where the leader could find it). Said instead of `Working` meanwhile.
    WaitingForLock {
        since_ms: u64,
        holder: Option<(u32, String)>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Refusal {
    /// Another build: it may judge batches by other rules.
    OtherBuild,
    /// The leader has another journal open (the file was replaced, say).
    OtherJournal,
    /// The leader serves as many clients as it may.
    Busy,
    /// The leader's handle is closing.
    Closing,
    /// The client announced the leader's own writer id.
    SameWriter,
    /// The client has another journal file open (a copy of the leader's home, say).
    OtherFile,
}

/// What became of one batch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) enum WireAnswer {
    /// Committed now or by an earlier attempt (`was_duplicate`): durable.
    Committed {
        first_seq: u64,
        last_seq: u64,
        was_duplicate: bool,
        /// The run's state after the batch, as snapshot bytes.
        state: Vec<u8>,
    },
    /// Refused; nothing was written. `against` is the run's state it was judged against, as
    /// snapshot bytes (`None`: the run did not exist): the client words the refusal itself
    /// by judging its batch against it, exactly as the leader did.
    Refused { against: Option<Vec<u8>> },
    /// Refused by its queue (full, another run first, no limit): judged against the journal's
    /// queue indexes, which the client cannot judge again itself, so the leader sends the
    /// refusal whole. Nothing was written.
    QueueRefused {
        refusal: crate::journal::format::error::QueueRefusal,
    },
    /// The writer seq is at or below the writer's mark, and the run holds no batch of these
    /// events under it. After a retry (`was_retried`) or a resend, the batch was refused in a
    /// commit that landed unacknowledged: the client judges it again under a fresh seq.
    SeqReused { was_retried: bool },
    /// The leader's handle closed before the batch was queued: nobody judged it.
    NotTaken,
    /// The commit failed for a reason other than capacity and the leader gave up on it (the
    /// batch may or may not have landed), or the run's records are damaged (`is_corrupt`:
    /// nothing was written).
    Failed {
        op: String,
        errno: Option<i32>,
        message: String,
        is_corrupt: bool,
    },
}

/// Why a frame was not read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WireError {
    #[error(transparent)]
    Io(#[from] io::Error),
    #[error("a frame of {bytes} bytes, over the limit of {MAX_FRAME_BYTES}")]
    TooLarge { bytes: usize },
    #[error("a frame fails its checksum")]
    Checksum,
    #[error("a frame of protocol version {found}; this build speaks version {PROTOCOL_VERSION}")]
    OtherProtocol { found: u16 },
    #[error("a frame does not decode: {reason}")]
    Malformed { reason: String },
}

/// The frame of `message`: its length, then its bytes; `TooLarge` past [`MAX_FRAME_BYTES`].
pub(crate) fn frame<T: Serialize>(message: &T) -> Result<Vec<u8>, WireError> {
    let envelope = Envelope {
        protocol: PROTOCOL_VERSION,
        message,
    };
    let body = event::encode_checked(&envelope).map_err(|error| WireError::Malformed {
        reason: error.to_string(),
    })?;
    if body.len() > MAX_FRAME_BYTES {
        return Err(WireError::TooLarge { bytes: body.len() });
    }
    let length = u32::try_from(body.len()).expect("MAX_FRAME_BYTES fits a u32");
    let mut bytes = Vec::with_capacity(4 + body.len());
    bytes.extend_from_slice(&length.to_le_bytes());
    bytes.extend_from_slice(&body);
    Ok(bytes)
}

/// A socket read with a deadline for all that is read through it until the deadline is
/// moved: each read waits at most until the deadline (the socket's read timeout is set to what
/// is left of it), then fails with `TimedOut`; and at most a byte budget, past which a read
/// fails. A peer that sends one byte of a frame and stalls costs a reader its deadline, never
/// more, however it spaces its bytes.
#[derive(Debug)]
pub(crate) struct TimedStream {
    stream: UnixStream,
    deadline: Option<Instant>,
    /// Bytes still allowed before the deadline is next set; `None`: no bound.
    budget: Option<usize>,
}

impl TimedStream {
    /// `stream`, with no deadline yet: set one before each read across processes.
    pub(crate) fn new(stream: UnixStream) -> TimedStream {
        TimedStream {
            stream,
            deadline: None,
            budget: None,
        }
    }

    /// Reads through it from now on must be done within `within`, and read at most `budget`
    /// bytes.
    pub(crate) fn set_deadline(&mut self, within: Duration, budget: Option<usize>) {
        self.deadline = Some(Instant::now() + within);
        self.budget = budget;
    }
}

impl Read for TimedStream {
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        let Some(deadline) = self.deadline else {
            return Err(io::Error::other(
                "a read across processes without a deadline",
            ));
        };
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        self.stream.set_read_timeout(Some(left))?;
        let count = match (&self.stream).read(buffer) {
            Ok(count) => count,
            // A read timeout shows as EAGAIN.
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                return Err(io::ErrorKind::TimedOut.into());
            }
            Err(error) => return Err(error),
        };
        if let Some(budget) = &mut self.budget {
            *budget = budget
                .checked_sub(count)
                .ok_or_else(|| io::Error::other("more bytes than the peer may send"))?;
        }
        Ok(count)
    }
}

/// Whether a read failed for its deadline.
pub(crate) fn is_timeout(error: &WireError) -> bool {
    matches!(error, WireError::Io(error) if matches!(error.kind(), io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock))
}

/// Reads one frame; `None` at a clean end of the stream (no byte of a next frame).
pub(crate) fn read<T: DeserializeOwned>(reader: &mut impl Read) -> Result<Option<T>, WireError> {
    let mut length = [0u8; 4];
    let mut filled = 0;
    while filled < length.len() {
        match reader.read(&mut length[filled..]) {
            Ok(0) if filled == 0 => return Ok(None),
            Ok(0) => return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into()),
            Ok(count) => filled += count,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error.into()),
        }
    }
    let bytes = u32::from_le_bytes(length) as usize;
    if bytes > MAX_FRAME_BYTES {
        return Err(WireError::TooLarge { bytes });
    }
    let mut body = vec![0u8; bytes];
    reader.read_exact(&mut body)?;
    decode(&body).map(Some)
}

fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, WireError> {
    let malformed = |error: postcard::Error| WireError::Malformed {
        reason: error.to_string(),
    };
    let (payload, is_intact) = event::split_checksum(body).ok_or(WireError::Malformed {
        reason: "shorter than its checksum".to_string(),
    })?;
    if !is_intact {
        return Err(WireError::Checksum);
    }
    let (protocol, _) = postcard::take_from_bytes::<u16>(payload).map_err(malformed)?;
    if protocol != PROTOCOL_VERSION {
        return Err(WireError::OtherProtocol { found: protocol });
    }
    match postcard::take_from_bytes::<Envelope<T>>(payload).map_err(malformed)? {
        (envelope, []) => Ok(envelope.message),
        (_, rest) => Err(WireError::Malformed {
            reason: format!("{} bytes after the message", rest.len()),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::ProcessIdentity;

    fn hello() -> ToLeader {
        ToLeader::Hello(Hello {
            build: build(),
            journal_id: [7; 16],
            writer: WriterId(42),
            pid: 4242,
            journal_file: (5, 6),
            answer_timeout_ms: 2000,
        })
    }

    #[test]
    fn a_frame_reads_back_as_its_message_and_then_the_stream_ends() {
        let mut bytes = frame(&hello()).expect("frames");
        bytes.extend(frame(&ToLeader::Group { batches: 3 }).expect("frames"));
        let mut reader = bytes.as_slice();
        assert_eq!(read::<ToLeader>(&mut reader).expect("reads"), Some(hello()));
        assert_eq!(
            read::<ToLeader>(&mut reader).expect("reads"),
            Some(ToLeader::Group { batches: 3 })
        );
        assert_eq!(read::<ToLeader>(&mut reader).expect("clean end"), None);
    }

    #[test]
    fn a_damaged_cut_oversized_or_foreign_frame_is_refused() {
        let good = frame(&hello()).expect("frames");
        let mut flipped = good.clone();
        let last = flipped.len() - 6;
        flipped[last] ^= 0x40;
        assert!(matches!(
            read::<ToLeader>(&mut flipped.as_slice()),
            Err(WireError::Checksum)
        ));
        let cut = &good[..good.len() - 1];
        assert!(matches!(
            read::<ToLeader>(&mut &cut[..]),
            Err(WireError::Io(error)) if error.kind() == io::ErrorKind::UnexpectedEof
        ));
        let mut huge = ((MAX_FRAME_BYTES + 1) as u32).to_le_bytes().to_vec();
        huge.extend([0; 16]);
        assert!(matches!(
            read::<ToLeader>(&mut huge.as_slice()),
            Err(WireError::TooLarge { .. })
        ));
        let other = Envelope {
            protocol: PROTOCOL_VERSION + 1,
            message: hello(),
        };
        let body = event::encode_checked(&other).expect("encodes");
        let mut foreign = (body.len() as u32).to_le_bytes().to_vec();
        foreign.extend(body);
        assert!(matches!(
            read::<ToLeader>(&mut foreign.as_slice()),
            Err(WireError::OtherProtocol { found }) if found == PROTOCOL_VERSION + 1
        ));
    }

    /// The bytes of a hello are pinned: a change to them is a new protocol version.
    #[test]
    fn the_hello_of_protocol_nine_is_these_bytes() {
        let bytes = frame(&ToLeader::Hello(Hello {
            build: "b".to_string(),
            journal_id: [1; 16],
            writer: WriterId(2),
            pid: 3,
            journal_file: (4, 5),
            answer_timeout_ms: 6,
        }))
        .expect("frames");
        let body = &bytes[4..bytes.len() - 4];
        let mut expected = vec![9, 0, 1, b'b'];
        expected.extend([1; 16]);
        expected.extend([2, 3, 4, 5, 6]);
        assert_eq!(body, expected.as_slice());
    }

    fn identity(pid_namespace: Option<u64>) -> ProcessIdentity {
        ProcessIdentity {
            pid: 4242,
            start_time: 7,
            boot_id: "boot".to_string(),
            pid_namespace,
        }
    }

    fn batch(events: Vec<Event>) -> Batch {
        Batch {
            run: RunId::generate(),
            events,
            condition: Condition {
                expect_head: Some(3),
                expect_not_terminal: true,
            },
            writer: WriterId(42),
            writer_seq: 9,
            time_ms: 1_700_000_000_000,
            private: None,
        }
    }

    /// A leader commits exactly the batch its client made: every event, a process identity's
    /// PID namespace included (postcard alone leaves it out, as records' fields do), comes out
    /// of the frame as it went in.
    #[test]
    fn a_batch_reads_back_as_its_writer_made_it_pid_namespaces_included() {
        let mut events: Vec<Event> = crate::event::tests::every_variant()
            .into_iter()
            .map(|(_, event)| event)
            .collect();
        events.extend([
            Event::RunnerStarted {
                runner: identity(Some(4_026_531_836)),
                instance_id: "instance".to_string(),
            },
            Event::StepRunning {
                step: 0,
                process: Some(identity(Some(9))),
            },
            Event::StepRunning {
                step: 1,
                process: Some(identity(None)),
            },
            Event::HookAttempted {
                hook: 0,
                attempt: 1,
                claimant: identity(Some(11)),
                by: "runner".to_string(),
                lease_ms: 1,
            },
        ]);
        for event in events {
            let made = batch(vec![event]);
            let bytes = frame(&ToLeader::Batch(WireBatch::of(&made))).expect("frames");
            let Some(ToLeader::Batch(read)) =
                read::<ToLeader>(&mut bytes.as_slice()).expect("reads")
            else {
                panic!("a batch");
            };
            assert_eq!(read.into_batch(made.writer).expect("fits"), made);
        }
    }

    /// A creation batch handed to a leader carries what its run keeps in the home only (its
    /// environment, its own hooks), for the leader to write in the same transaction.
    #[test]
    fn a_creation_batch_carries_what_its_run_keeps_in_the_home() {
        let environment = crate::run_env::RunEnvironment::of(
            [(b"SECRET".to_vec(), b"value".to_vec())],
            &[],
            Some(std::path::Path::new("/work")),
            Some(0o027),
        )
        .expect("small");
        let mut made = batch(vec![Event::Dismissed { at_ms: 5 }]);
        made.private = Some(std::sync::Arc::new(crate::run_env::RunPrivate {
            env: Some(environment),
            on_exit: vec!["echo done".to_string()],
        }));
        let bytes = frame(&ToLeader::Batch(WireBatch::of(&made))).expect("frames");
        let Some(ToLeader::Batch(read)) = read::<ToLeader>(&mut bytes.as_slice()).expect("reads")
        else {
            panic!("a batch");
        };
        assert_eq!(read.into_batch(made.writer).expect("fits"), made);
    }

    #[test]
    fn pid_namespaces_that_do_not_fit_the_events_are_refused() {
        let made = batch(vec![Event::StepRunning {
            step: 0,
            process: Some(identity(Some(9))),
        }]);
        let mut short = WireBatch::of(&made);
        short.pid_namespaces.clear();
        assert!(matches!(
            short.into_batch(made.writer),
            Err(WireError::Malformed { .. })
        ));
        let mut misplaced = WireBatch::of(&batch(vec![Event::Dismissed { at_ms: 5 }]));
        misplaced.pid_namespaces = vec![Some(9)];
        assert!(matches!(
            misplaced.into_batch(made.writer),
            Err(WireError::Malformed { reason }) if reason.contains("Dismissed")
        ));
    }
}
