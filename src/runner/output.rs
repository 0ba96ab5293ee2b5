//! Best-effort logs: a step's output (`output-<i>.log`) and the runner's own log
//! (`runner.log`). Neither is the truth — the journal is — so neither may end a run.
//!
//! A step never writes to a file. Its stdout and stderr are one pipe (an external job's
//! provider: its stderr; its stdout is read line by line by `step`, which copies each line
//! here too); a *drain* thread of the runner reads the pipe as fast as the step writes and
//! hands each chunk to the step's [`LogSink`]; the sink's writer thread appends what it is
//! handed to the log ([`LogFile`]). So:
//!
//! * a step's writes never fail because the disk is full or the log is slow; they fail only
//!   when the runner is gone — the pipe's read end closes with it, and the step's next write
//!   gets SIGPIPE (or EPIPE where SIGPIPE is ignored);
//! * the runner never waits on the disk: a sink queues at most `max_queued_bytes`. A drain
//!   whose queue is full waits for room while the writer is writing — a slow disk slows the
//!   step, as a file would — but only up to [`DRAIN_PATIENCE`], and not at all while the
//!   writer's writes fail: then the chunk is dropped and counted, and the pipe is still read;
//! * a write that fails (a full disk, EIO, a log that cannot even be created) is counted, and
//!   noted in the log before the next bytes that can be written:
//!   `[runjournal: 2048 bytes of output lost: No space left on device]`.
//!
//! The runner's own lines (`runner::log`) go through a sink of the same kind, opened by the
//! runner itself, so a runner whose log cannot be created at launch starts all the same and
//! writes its log once it can.
//!
//! Invariant: nothing here panics on a failed write or hands the failure to the runner.
//! Invariant: [`LogSink::push`] never waits on I/O.
//! Invariant: bytes lost are noted in the log before any byte written after them.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::durable_fs;
use crate::platform;

/// The most bytes a step's sink holds for its writer; beyond it, output is dropped and counted.
pub const STEP_QUEUE_BYTES: usize = 256 * 1024;

/// The most bytes the runner log's sink holds for its writer.
pub const RUNNER_LOG_QUEUE_BYTES: usize = 64 * 1024;

/// How much a drain reads from a step's pipe at once.
const DRAIN_CHUNK_BYTES: usize = 64 * 1024;

/// How long a drain waits for room in a full queue whose writer is writing, before it drops
/// the chunk: long enough for a busy disk, short enough that a hung one cannot stall the step.
pub const DRAIN_PATIENCE: Duration = Duration::from_secs(5);

/// The most distinct reasons a note of lost bytes lists.
const MAX_LOSS_REASONS: usize = 3;

/// Why bytes dropped by a full queue were lost.
const FELL_BEHIND: &str = "the log's writer fell behind";

/// A log written at best: every failure is counted and noted later, never returned.
#[derive(Debug)]
pub struct LogFile {
    path: PathBuf,
    /// What a note calls the bytes: "output", "the runner's log".
    what: &'static str,
    /// `None` until it could be opened (it is tried again at every write).
    file: Option<File>,
    /// Bytes lost since the last note that was written.
    lost_bytes: u64,
    lost_reasons: Vec<String>,
    /// Whether the last byte written was a newline, so a note starts on a line of its own.
    ends_in_newline: bool,
}

impl LogFile {
    /// A log at `path`, opened (and created, with its directory) at the first write.
    pub fn new(path: PathBuf, what: &'static str) -> LogFile {
        LogFile {
            path,
            what,
            file: None,
            lost_bytes: 0,
            lost_reasons: Vec::new(),
            ends_in_newline: true,
        }
    }

    /// Appends `bytes`, after the note of any bytes lost before. Never fails: what cannot be
    /// written is counted.
    pub fn write(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        if self.lost_bytes > 0 {
            let note = self.note();
            match self.write_raw(note.as_bytes()) {
                Ok(()) => {
                    self.lost_bytes = 0;
                    self.lost_reasons.clear();
                    self.ends_in_newline = true;
                }
                Err((_, error)) => {
                    self.lose(bytes.len() as u64, &reason_of(&error));
                    return;
                }
            }
        }
        match self.write_raw(bytes) {
            Ok(()) => self.ends_in_newline = bytes.ends_with(b"\n"),
            Err((written, error)) => {
                if written > 0 {
                    self.ends_in_newline = bytes[..written].ends_with(b"\n");
                }
                self.lose((bytes.len() - written) as u64, &reason_of(&error));
            }
        }
    }

    /// Counts `bytes` as lost for `reason`.
    pub fn lose(&mut self, bytes: u64, reason: &str) {
        if bytes == 0 {
            return;
        }
        self.lost_bytes = self.lost_bytes.saturating_add(bytes);
        let is_known = self.lost_reasons.iter().any(|known| known == reason);
        if !is_known && self.lost_reasons.len() < MAX_LOSS_REASONS {
            self.lost_reasons.push(reason.to_string());
        }
    }

    /// Bytes lost and not noted in the log yet.
    pub fn lost_bytes(&self) -> u64 {
        self.lost_bytes
    }

    /// The line that notes the bytes lost, on a line of its own.
    fn note(&self) -> String {
        let start = if self.ends_in_newline { "" } else { "\n" };
        format!(
            "{start}{}\n",
            loss_note(self.lost_bytes, self.what, &self.lost_reasons.join("; "))
        )
    }

    /// Writes all of `bytes`, or says how many were written before what error.
    fn write_raw(&mut self, bytes: &[u8]) -> Result<(), (usize, io::Error)> {
        let file = match self.file.as_mut() {
            Some(file) => file,
            None => {
                let opened = self.open().map_err(|error| (0, error))?;
                self.file.insert(opened)
            }
        };
        let mut written = 0;
        while written < bytes.len() {
            match file.write(&bytes[written..]) {
                Ok(0) => return Err((written, io::ErrorKind::WriteZero.into())),
                Ok(count) => written += count,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return Err((written, error)),
            }
        }
        Ok(())
    }

    /// Opens the log for appending, making its directory (one level: the run's) if it could
    /// not be made before.
    fn open(&self) -> io::Result<File> {
        if let Some(dir) = self.path.parent() {
            durable_fs::make_private_dir(dir)?;
        }
        durable_fs::open_append(&self.path)
    }
}

/// The words of a note of lost bytes: `[runjournal: N bytes of output lost: REASON]`.
pub fn loss_note(bytes: u64, what: &str, reason: &str) -> String {
    let unit = if bytes == 1 { "byte" } else { "bytes" };
    format!("[runjournal: {bytes} {unit} of {what} lost: {reason}]")
}

/// An error as a note gives it: the system's words for an errno ("No space left on device"),
/// else the error's own.
fn reason_of(error: &io::Error) -> String {
    match error.raw_os_error() {
        Some(code) => nix::errno::Errno::from_raw(code).desc().to_string(),
        None => error.to_string(),
    }
}

/// What a sink's writer has not written yet.
#[derive(Debug, Default)]
struct Queue {
    chunks: VecDeque<Vec<u8>>,
    queued_bytes: usize,
    /// Bytes refused because the queue was full, not yet handed to the writer.
    dropped_bytes: u64,
    is_closed: bool,
    /// The writer holds chunks it took from the queue.
    is_writing: bool,
    /// The writer has exited.
    is_finished: bool,
    /// Bytes lost and not yet noted, as of the writer's last pass.
    lost_bytes: u64,
    /// Live [`LogSink`] handles: the sink closes when the last one goes.
    handles: usize,
    /// Drains waiting for room ([`LogSink::push_waiting`]).
    waiting_pushes: usize,
    /// When bytes were last pushed (taken or dropped): the step's last sign of activity.
    last_push: Option<Instant>,
}

impl Queue {
    fn is_empty(&self) -> bool {
        self.chunks.is_empty() && self.dropped_bytes == 0 && !self.is_writing
    }
}

#[derive(Debug)]
struct Shared {
    queue: Mutex<Queue>,
    changed: Condvar,
    max_queued_bytes: usize,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        // A panic elsewhere while holding the lock leaves a queue that is still consistent
        // (every change is a single field update); keep logging.
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The writing half of a best-effort log: a bounded queue and a thread that appends it to a
/// [`LogFile`]. Cheap to clone; every clone feeds the same log, and once the last one is
/// dropped the writer writes what it holds and exits.
#[derive(Debug)]
pub struct LogSink {
    shared: Arc<Shared>,
}

impl Clone for LogSink {
    fn clone(&self) -> LogSink {
        self.shared.lock().handles += 1;
        LogSink {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl Drop for LogSink {
    fn drop(&mut self) {
        let mut queue = self.shared.lock();
        queue.handles = queue.handles.saturating_sub(1);
        if queue.handles == 0 {
            queue.is_closed = true;
            drop(queue);
            self.shared.changed.notify_all();
        }
    }
}

impl LogSink {
    /// Starts the writer thread of `file`, holding at most `max_queued_bytes` for it.
    pub fn start(file: LogFile, max_queued_bytes: usize) -> io::Result<LogSink> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                handles: 1,
                ..Queue::default()
            }),
            changed: Condvar::new(),
            max_queued_bytes,
        });
        let writer_shared = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("log-writer".to_string())
            .spawn(move || write_queue(&writer_shared, file))?;
        Ok(LogSink { shared })
    }

    /// Hands `bytes` to the writer; drops and counts them when the queue is full. Never waits
    /// on I/O.
    pub fn push(&self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        let mut queue = self.shared.lock();
        if queue.is_closed {
            return;
        }
        queue.last_push = Some(Instant::now());
        if queue.queued_bytes + bytes.len() > self.shared.max_queued_bytes {
            queue.dropped_bytes = queue.dropped_bytes.saturating_add(bytes.len() as u64);
        } else {
            queue.queued_bytes += bytes.len();
            queue.chunks.push_back(bytes.to_vec());
        }
        drop(queue);
        self.shared.changed.notify_all();
    }

    /// Hands `bytes` to the writer like [`LogSink::push`], but when the queue is full waits
    /// for room while the writer's writes succeed, up to `patience`; drops and counts them
    /// once that ran out or a write failed (the disk is full or failing: waiting would only
    /// stall the step). Blocks the calling thread: for drains, never for the runner's loop.
    pub fn push_waiting(&self, bytes: &[u8], patience: Duration) {
        if bytes.is_empty() {
            return;
        }
        let deadline = Instant::now() + patience;
        let mut queue = self.shared.lock();
        loop {
            if queue.is_closed {
                return;
            }
            let has_room = queue.queued_bytes + bytes.len() <= self.shared.max_queued_bytes;
            // Bytes counted lost and not yet noted mean the writer's last write failed.
            let is_failing = queue.lost_bytes > 0 || queue.is_finished;
            let left = deadline.saturating_duration_since(Instant::now());
            if has_room || is_failing || left.is_zero() {
                break;
            }
            queue.waiting_pushes += 1;
            queue = self
                .shared
                .changed
                .wait_timeout(queue, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
            queue.waiting_pushes -= 1;
        }
        drop(queue);
        self.push(bytes);
    }

    /// When bytes were last pushed, whether the log could take them or not; `None` before
    /// the first.
    pub fn last_push(&self) -> Option<Instant> {
        self.shared.lock().last_push
    }

    /// No more bytes are taken; the writer writes what it holds and exits.
    pub fn close(&self) {
        self.shared.lock().is_closed = true;
        self.shared.changed.notify_all();
    }

    /// Waits until everything pushed so far was written (or counted lost), at most `timeout`.
    /// Whether it was. Blocks the calling thread.
    pub fn flush(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut queue = self.shared.lock();
        loop {
            if queue.is_empty() || queue.is_finished {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            queue = self
                .shared
                .changed
                .wait_timeout(queue, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Bytes lost and not noted in the log yet, as of the writer's last pass.
    pub fn lost_bytes(&self) -> u64 {
        let queue = self.shared.lock();
        queue.lost_bytes.saturating_add(queue.dropped_bytes)
    }
}

/// The writer thread: takes everything queued, writes it, until the sink is closed and empty.
fn write_queue(shared: &Shared, mut file: LogFile) {
    loop {
        let (chunks, dropped_bytes) = {
            let mut queue = shared.lock();
            while queue.chunks.is_empty() && queue.dropped_bytes == 0 && !queue.is_closed {
                queue = shared
                    .changed
                    .wait(queue)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            if queue.chunks.is_empty() && queue.dropped_bytes == 0 {
                // Closed, and nothing left.
                queue.is_finished = true;
                drop(queue);
                shared.changed.notify_all();
                return;
            }
            queue.is_writing = true;
            queue.queued_bytes = 0;
            (
                std::mem::take(&mut queue.chunks),
                std::mem::take(&mut queue.dropped_bytes),
            )
        };
        file.lose(dropped_bytes, FELL_BEHIND);
        for chunk in chunks {
            file.write(&chunk);
        }
        let mut queue = shared.lock();
        queue.is_writing = false;
        queue.lost_bytes = file.lost_bytes();
        drop(queue);
        shared.changed.notify_all();
    }
}

/// A step's output: its sink and the drains that feed it.
#[derive(Debug)]
pub struct StepOutput {
    sink: LogSink,
    /// One per pipe: fires when the drain has read the pipe to its end.
    drained: Vec<oneshot::Receiver<()>>,
}

/// How a step's output ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputEnd {
    /// Every pipe was read to its end and everything written (or counted lost) in time.
    pub is_complete: bool,
    /// Bytes lost and not noted in the log (the disk never came back while the step ran).
    pub lost_bytes: u64,
}

impl StepOutput {
    /// Starts the sink of a step's log at `path` (opened at its first write).
    pub fn start(path: PathBuf) -> io::Result<StepOutput> {
        Ok(StepOutput {
            sink: LogSink::start(LogFile::new(path, "output"), STEP_QUEUE_BYTES)?,
            drained: Vec::new(),
        })
    }

    /// A new pipe whose read end a drain thread reads into the log; its write end, which is
    /// close-on-exec (a spawn's `Stdio` duplicates it onto the child's descriptors).
    pub fn pipe(&mut self) -> io::Result<OwnedFd> {
        let (read_end, write_end) = platform::pipe_cloexec()?;
        let (done, drained) = oneshot::channel();
        let sink = self.sink.clone();
        std::thread::Builder::new()
            .name("output-drain".to_string())
            .spawn(move || {
                drain(File::from(read_end), &sink);
                let _ = done.send(());
            })?;
        self.drained.push(drained);
        Ok(write_end)
    }

    /// When the step last wrote output (or had a status line copied in); `None` before.
    pub fn last_push(&self) -> Option<Instant> {
        self.sink.last_push()
    }

    /// The sink, for output copied in by other code (an external job's status lines).
    pub fn sink(&self) -> LogSink {
        self.sink.clone()
    }

    /// Waits, up to `timeout` in all, for the drains to reach the end of their pipes (every
    /// writer of the step gone) and the log to be written. A pipe still held open then (by a
    /// process the runner could not end) keeps its drain running, and the log open for it
    /// until that drain ends.
    pub async fn finish(self, timeout: Duration) -> OutputEnd {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut is_drained = true;
        for drained in self.drained {
            if tokio::time::timeout_at(deadline, drained).await.is_err() {
                is_drained = false;
            }
        }
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let sink = self.sink.clone();
        let is_flushed = tokio::task::spawn_blocking(move || sink.flush(left))
            .await
            .unwrap_or(false);
        OutputEnd {
            is_complete: is_drained && is_flushed,
            lost_bytes: self.sink.lost_bytes(),
        }
    }
}

/// Reads `pipe` to its end into `sink`. A failure to read (which a pipe does not give but for
/// EINTR) ends the drain.
fn drain(mut pipe: File, sink: &LogSink) {
    let mut buffer = vec![0u8; DRAIN_CHUNK_BYTES];
    loop {
        match pipe.read(&mut buffer) {
            Ok(0) => return,
            Ok(count) => sink.push_waiting(&buffer[..count], DRAIN_PATIENCE),
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

/// The runner's own log, once [`open_runner_log`] has opened it.
static RUNNER_LOG: OnceLock<LogSink> = OnceLock::new();

/// Sends the runner's lines to `path` from now on (once per process: a runner runs one run).
/// Until then, and if its writer thread cannot start, lines go to stderr, at best.
pub fn open_runner_log(path: PathBuf) -> io::Result<()> {
    let sink = LogSink::start(
        LogFile::new(path, "the runner's log"),
        RUNNER_LOG_QUEUE_BYTES,
    )?;
    // A second call keeps the first log.
    let _ = RUNNER_LOG.set(sink);
    Ok(())
}

/// Writes one line of the runner's log. Never fails, never waits on I/O once the log is open.
pub fn runner_log_line(line: &str) {
    let mut bytes = Vec::with_capacity(line.len() + 1);
    bytes.extend_from_slice(line.as_bytes());
    bytes.push(b'\n');
    match RUNNER_LOG.get() {
        Some(sink) => sink.push(&bytes),
        None => {
            // Best effort by definition: a closed or full stderr loses the line.
            let _ = io::stderr().write_all(&bytes);
        }
    }
}

/// Waits up to `timeout` for the runner's log to be written out (before the runner exits).
pub fn flush_runner_log(timeout: Duration) -> bool {
    RUNNER_LOG.get().is_none_or(|sink| sink.flush(timeout))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log_in(dir: &std::path::Path) -> (PathBuf, LogFile) {
        let path = dir.join("output-0.log");
        (path.clone(), LogFile::new(path, "output"))
    }

    #[test]
    fn a_log_is_made_at_its_first_write_with_its_directory() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("run").join("output-0.log");
        let mut log = LogFile::new(path.clone(), "output");
        assert!(!path.exists(), "nothing is made before a write");
        log.write(b"hello\n");
        assert_eq!(std::fs::read(&path).expect("read"), b"hello\n");
        assert_eq!(log.lost_bytes(), 0);
    }

    #[test]
    fn bytes_that_cannot_be_written_are_counted_and_noted_once_writing_works() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (path, mut log) = log_in(dir.path());
        // A log that cannot be created: a directory is in its place.
        std::fs::create_dir(&path).expect("a directory in the log's place");
        log.write(b"lost one\n");
        log.write(b"lost two");
        assert_eq!(log.lost_bytes(), 17);
        std::fs::remove_dir(&path).expect("the log can be made now");
        log.write(b"after\n");
        assert_eq!(log.lost_bytes(), 0);
        let text = std::fs::read_to_string(&path).expect("read");
        assert_eq!(
            text,
            "[runjournal: 17 bytes of output lost: Is a directory]\nafter\n"
        );
    }

    #[test]
    fn a_full_disk_is_named_in_the_note_and_a_partial_line_is_ended_first() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("output-0.log");
        let mut log = LogFile::new(path.clone(), "output");
        log.write(b"no newline yet");
        // Every write to /dev/full fails with ENOSPC.
        log.file = Some(
            std::fs::OpenOptions::new()
                .append(true)
                .open("/dev/full")
                .expect("/dev/full"),
        );
        log.write(b"0123456789");
        assert_eq!(log.lost_bytes(), 10);
        log.file = None;
        log.write(b"back\n");
        let text = std::fs::read_to_string(&path).expect("read");
        assert_eq!(
            text,
            "no newline yet\n[runjournal: 10 bytes of output lost: No space left on device]\nback\n"
        );
    }

    #[test]
    fn a_full_queue_drops_and_counts_instead_of_waiting() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("output-0.log");
        // A FIFO without a reader: the writer's open blocks until the test reads it, so the
        // writer is stuck as on a hung disk.
        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
        let sink = LogSink::start(LogFile::new(path.clone(), "output"), 8).expect("sink");
        sink.push(b"a");
        let mut is_stuck = false;
        for _ in 0..3000 {
            if sink.shared.lock().is_writing {
                is_stuck = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(is_stuck, "the writer took the first chunk");
        sink.push(b"12345678");
        sink.push(b"9");
        assert_eq!(
            sink.lost_bytes(),
            1,
            "the chunk over the bound is counted at once"
        );
        sink.close();
        let mut text = String::new();
        File::open(&path)
            .expect("open the FIFO")
            .read_to_string(&mut text)
            .expect("read");
        assert_eq!(
            text,
            "a\n[runjournal: 1 byte of output lost: the log's writer fell behind]\n12345678"
        );
    }

    /// A sink of `bound` bytes on a FIFO nobody reads yet, its writer stuck opening it with
    /// the first chunk (`a`) taken, and the queue then filled: the log is slow, not failing.
    fn sink_stuck_on_a_fifo(path: &std::path::Path, bound: usize) -> LogSink {
        nix::unistd::mkfifo(path, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
        let sink = LogSink::start(LogFile::new(path.to_path_buf(), "output"), bound).expect("sink");
        sink.push(b"a");
        let is_stuck = (0..3000).any(|_| {
            let is_writing = sink.shared.lock().is_writing;
            if !is_writing {
                std::thread::sleep(Duration::from_millis(10));
            }
            is_writing
        });
        assert!(is_stuck, "the writer took the first chunk");
        sink.push(&vec![b'1'; bound]);
        sink
    }

    #[test]
    fn a_drain_waits_for_room_while_the_writer_is_only_slow() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("output-0.log");
        let sink = sink_stuck_on_a_fifo(&path, 8);
        let reader = std::thread::spawn({
            let sink = sink.clone();
            let path = path.clone();
            move || {
                // Read only once the drain below waits for room, so its chunk met a full queue.
                let is_waiting = (0..3000).any(|_| {
                    let is_waiting = sink.shared.lock().waiting_pushes == 1;
                    if !is_waiting {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    is_waiting
                });
                assert!(is_waiting, "the drain waits for room");
                let mut text = String::new();
                File::open(&path)
                    .expect("open the FIFO")
                    .read_to_string(&mut text)
                    .expect("read");
                text
            }
        });
        sink.push_waiting(b"9", Duration::from_secs(60));
        assert_eq!(
            sink.lost_bytes(),
            0,
            "nothing dropped while the writer writes"
        );
        sink.close();
        drop(sink);
        assert_eq!(reader.join().expect("the reader"), "a111111119");
    }

    #[test]
    fn a_drain_drops_once_its_patience_ran_out() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("output-0.log");
        let sink = sink_stuck_on_a_fifo(&path, 8);
        sink.push_waiting(b"9", Duration::from_millis(1));
        assert_eq!(sink.lost_bytes(), 1, "the chunk over the bound is counted");
        sink.close();
        let mut text = String::new();
        File::open(&path)
            .expect("open the FIFO")
            .read_to_string(&mut text)
            .expect("read");
        assert_eq!(
            text,
            "a\n[runjournal: 1 byte of output lost: the log's writer fell behind]\n11111111"
        );
    }

    #[test]
    fn a_drained_pipe_lands_in_the_log_and_finish_reports_it_complete() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("output-0.log");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let mut output = StepOutput::start(path.clone()).expect("output");
            let write_end = output.pipe().expect("pipe");
            let status = std::process::Command::new("sh")
                .args(["-c", "echo out; echo err >&2"])
                .stdout(std::process::Stdio::from(
                    write_end.try_clone().expect("dup"),
                ))
                .stderr(std::process::Stdio::from(write_end))
                .status()
                .expect("run sh");
            assert!(status.success());
            let end = output.finish(Duration::from_secs(30)).await;
            assert_eq!(
                end,
                OutputEnd {
                    is_complete: true,
                    lost_bytes: 0
                }
            );
        });
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "out\nerr\n");
    }

    #[test]
    fn a_step_writing_into_a_pipe_on_a_full_disk_does_not_fail() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("output-0.log");
        // /dev/full stands for a full disk: the log fails every write with ENOSPC.
        std::os::unix::fs::symlink("/dev/full", &path).expect("symlink");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let mut output = StepOutput::start(path.clone()).expect("output");
            let write_end = output.pipe().expect("pipe");
            let status = std::process::Command::new("sh")
                .args(["-c", "echo one; echo two >&2"])
                .stdout(std::process::Stdio::from(
                    write_end.try_clone().expect("dup"),
                ))
                .stderr(std::process::Stdio::from(write_end))
                .status()
                .expect("run sh");
            assert!(status.success(), "the step's writes succeeded: {status}");
            let end = output.finish(Duration::from_secs(30)).await;
            assert!(end.is_complete);
            assert_eq!(end.lost_bytes, 8, "both lines counted");
        });
    }

    #[test]
    fn a_note_reads_as_the_readme_shows_it() {
        assert_eq!(
            loss_note(2048, "output", "No space left on device"),
            "[runjournal: 2048 bytes of output lost: No space left on device]"
        );
    }
}
