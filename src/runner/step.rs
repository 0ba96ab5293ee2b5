//! One step's process, from the command that starts it to the report of how it ended.
//!
//! Invariant: a step's task never decides the step's outcome in the journal; it reports what
//! happened ([`ProcessReport`]) and the runner's loop, the single place that records
//! `StepFinished`, turns that into an outcome.

use std::io::{self, BufRead, BufReader, Read};
use std::os::fd::OwnedFd;
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use super::external_job::{self, MAX_PROVIDER_LINE_BYTES};
use super::output::LogSink;
use super::recorder::Recorder;
use super::step_process::{self, Ended, Leader, ProcessGroup};
use crate::event::{Event, ExternalJobStatus, RunId, StepAction, StepSpec};
use crate::home::Home;
use crate::journal::Condition;

/// Environment variables a step sees, so a provider can push `runjournal job update` itself.
pub const ENV_RUN_ID: &str = "RUNJOURNAL_RUN_ID";
pub const ENV_STEP: &str = "RUNJOURNAL_STEP";
pub const ENV_HOME: &str = "RUNJOURNAL_HOME";
pub const ENV_LAYOUT: &str = crate::home::LAYOUT_ENV;

/// Most provider lines buffered between the reading thread and the step's task.
const PROVIDER_LINE_QUEUE: usize = 16;

/// The command that runs a step in `environment` (the launcher's, with runjournal's variables
/// above), with stdin from /dev/null and stdout and stderr into
/// `output`, the write end of the pipe the runner drains into the step's log (an external-job
/// provider's stdout is piped to the runner instead, which copies its lines to the log).
pub fn command(
    home: &Home,
    run: RunId,
    index: usize,
    step: &StepSpec,
    environment: &crate::run_env::StepEnvironment,
    output: OwnedFd,
) -> io::Result<Command> {
    let mut command = match &step.action {
        StepAction::Command { argv } => {
            // RunSpec::check refuses a command without a program, and nothing reaches a runner
            // unchecked; a step without one fails rather than panics all the same.
            let (program, args) = argv.split_first().ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidInput, "the step's command is empty")
            })?;
            let mut command = Command::new(program);
            command.args(args);
            command
        }
        StepAction::Shell { script } => {
            let mut command = Command::new("sh");
            command.arg("-c").arg(script);
            command
        }
        StepAction::ExternalJob { provider } => {
            let mut command = Command::new("sh");
            command.arg("-c").arg(provider);
            command
        }
    };
    // First: a recorded environment replaces the whole of the runner's, so runjournal's own
    // variables are set after it.
    environment.apply(&mut command);
    let stdout = if step.is_external_job() {
        Stdio::piped()
    } else {
        Stdio::from(output.try_clone()?)
    };
    command
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(Stdio::from(output))
        .env(ENV_RUN_ID, run.to_string())
        .env(ENV_STEP, index.to_string())
        .env(ENV_HOME, home.root())
        .env(ENV_LAYOUT, home.layout().as_str())
        .env_remove(super::ready::READY_FD_ENV);
    Ok(command)
}

/// How an external job's provider ended its report.
#[derive(Debug, Clone, PartialEq)]
pub enum JobEnd {
    /// The provider reported a terminal status.
    Reported(ExternalJobStatus),
    /// A line that is not a status, an over-long line, or a read error; the message quotes it.
    ProviderError(String),
    /// The provider closed its stdout without a terminal status; the last line it printed.
    NoTerminalStatus { last_line: Option<String> },
}

/// What happened to a step's process.
#[derive(Debug, Clone)]
pub struct ProcessReport {
    /// The leader's exit status, once reaped.
    pub status: Option<Result<ExitStatus, String>>,
    /// The runner ended the group on request (stop, timeout, a pushed job status).
    pub was_terminated: bool,
    /// The leader was still running when the runner began ending its group: its exit status
    /// says how the runner ended it, not how the step ended.
    pub was_leader_signalled: bool,
    /// How ending the group went, when it had to be ended (on request or for leftovers).
    pub ended: Option<Ended>,
    /// External-job steps: how the provider's report ended.
    pub job: Option<JobEnd>,
    /// An append the step itself made failed (external-job updates).
    pub append_error: Option<String>,
}

/// Exit code of a status: the code, or 128 + the signal as shells report it.
pub fn exit_code_of(status: ExitStatus) -> Option<i32> {
    status
        .code()
        .or_else(|| status.signal().map(|signal| 128 + signal))
}

/// Runs a command step's process to its end, or until `terminate` turns true.
pub async fn run_process(
    child: Child,
    mut terminate: watch::Receiver<Ending>,
    grace: Duration,
) -> ProcessReport {
    let group = ProcessGroup::led_by(child.id());
    let mut leader = Leader::wait_for(child);
    let was_terminated = tokio::select! {
        _ = leader.exited() => false,
        _ = terminate.wait_for(|ending| *ending != Ending::Running) => true,
    };
    let was_leader_signalled = leader.status().is_none();
    let is_interrupt = *terminate.borrow() == Ending::Interrupt;
    let ended = if was_terminated && is_interrupt {
        Some(step_process::interrupt(group, &mut leader, grace).await)
    } else if was_terminated {
        Some(step_process::terminate(group, &mut leader, grace).await)
    } else {
        step_process::end_leftovers(group, &mut leader, grace).await
    };
    ProcessReport {
        status: leader.status().cloned(),
        was_terminated,
        was_leader_signalled,
        ended,
        job: None,
        append_error: None,
    }
}

/// What the runner asks of a running step's process, through its watch channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// Nothing: let it run.
    Running,
    /// End its group: SIGTERM, the grace, SIGKILL.
    Terminate,
    /// Interrupt it: SIGINT to its group and the grace to exit, then as [`Ending::Terminate`].
    Interrupt,
}

/// One read from a provider's stdout.
#[derive(Debug)]
enum ProviderRead {
    Line(Vec<u8>),
    TooLong { head: Vec<u8>, bytes: usize },
    Failed(String),
}

/// Runs an external-job step: follows the provider's stdout, records each changed status, and
/// ends the step at a terminal one (or at a line that is not a status).
pub async fn run_external_job(
    mut child: Child,
    recorder: Arc<Recorder>,
    index: u32,
    log: LogSink,
    mut terminate: watch::Receiver<Ending>,
    grace: Duration,
) -> ProcessReport {
    let group = ProcessGroup::led_by(child.id());
    let stdout = child.stdout.take();
    let mut leader = Leader::wait_for(child);
    let (lines_tx, mut lines) = mpsc::channel(PROVIDER_LINE_QUEUE);
    if let Some(stdout) = stdout {
        tokio::task::spawn_blocking(move || read_provider(stdout, log, lines_tx));
    }
    let mut coalescer = external_job::SampleCoalescer::default();
    let mut last_line: Option<String> = None;
    // The status so far, which each provider line is merged into.
    let mut reported: Option<ExternalJobStatus> = None;
    let mut job: Option<JobEnd> = None;
    let mut append_error = None;
    let mut was_terminated = false;
    loop {
        let due = coalescer.due().map(tokio::time::Instant::from_std);
        let read = tokio::select! {
            read = lines.recv() => Some(read),
            _ = sleep_until_due(due) => None,
            _ = terminate.wait_for(|ending| *ending != Ending::Running) => {
                was_terminated = true;
                break;
            }
        };
        let Some(read) = read else {
            // The held sample's window ended: it lands now.
            let held = coalescer.take_held();
            if let Err(error) = journal_statuses(&recorder, index, &mut coalescer, held).await {
                append_error = Some(error);
                break;
            }
            continue;
        };
        let line = match line_of(read) {
            Ok(Some(line)) => line,
            Ok(None) => break,
            Err(end) => {
                job = Some(end);
                break;
            }
        };
        if line.trim_ascii().is_empty() {
            continue;
        }
        last_line = Some(external_job::quote_line(&line));
        let status = match external_job::parse_provider_line(&line) {
            Ok(status) => external_job::merged(reported.as_ref(), status),
            Err(error) => {
                job = Some(JobEnd::ProviderError(error.to_string()));
                break;
            }
        };
        reported = Some(status.clone());
        let batch = coalescer.offer(status.clone(), std::time::Instant::now());
        if let Err(error) = journal_statuses(&recorder, index, &mut coalescer, batch).await {
            append_error = Some(error);
            break;
        }
        if status.state.is_terminal() {
            job = Some(JobEnd::Reported(status));
            break;
        }
    }
    // The report ended (or the step is being ended): a sample still held lands now.
    if append_error.is_none() {
        let held = coalescer.take_held();
        if let Err(error) = journal_statuses(&recorder, index, &mut coalescer, held).await {
            append_error = Some(error);
        }
    }
    drop(lines);
    if job.is_none() && !was_terminated && append_error.is_none() {
        // The provider closed its stdout: it owes us its exit, unless we are told to stop.
        tokio::select! {
            _ = leader.exited() => {}
            _ = terminate.wait_for(|ending| *ending != Ending::Running) => was_terminated = true,
        }
        if !was_terminated {
            job = Some(JobEnd::NoTerminalStatus { last_line });
        }
    }
    let ending = if was_terminated && *terminate.borrow() == Ending::Interrupt {
        Ending::Interrupt
    } else if was_terminated
        || append_error.is_some()
        || matches!(job, Some(JobEnd::ProviderError(_)))
    {
        Ending::Terminate
    } else {
        Ending::Running
    };
    let (ended, was_leader_signalled) = end_provider(group, &mut leader, grace, ending).await;
    ProcessReport {
        status: leader.status().cloned(),
        was_terminated,
        was_leader_signalled,
        ended,
        job,
        append_error,
    }
}

/// What a read from the provider's stdout means: a line, the end of its output (`None`), or a
/// broken report that ends the job.
fn line_of(read: Option<ProviderRead>) -> Result<Option<Vec<u8>>, JobEnd> {
    match read {
        None => Ok(None),
        Some(ProviderRead::Line(line)) => Ok(Some(line)),
        Some(ProviderRead::TooLong { head, bytes }) => Err(JobEnd::ProviderError(format!(
            "provider line is over {bytes} bytes, over the limit of {MAX_PROVIDER_LINE_BYTES}: {}",
            external_job::quote_line(&head)
        ))),
        Some(ProviderRead::Failed(error)) => Err(JobEnd::ProviderError(format!(
            "reading the provider's output failed: {error}"
        ))),
    }
}

/// Ends the provider's group: interrupted or terminated as `ending` says, or, for a job that
/// ended (`Ending::Running`: nobody asked to end it), given the grace period to exit by itself
/// first. Returns how ending the group went, and whether its leader was still running when the
/// runner began to end it.
async fn end_provider(
    group: ProcessGroup,
    leader: &mut Leader,
    grace: Duration,
    ending: Ending,
) -> (Option<Ended>, bool) {
    match ending {
        Ending::Interrupt => {
            let was_leader_signalled = leader.status().is_none();
            let ended = step_process::interrupt(group, leader, grace).await;
            (Some(ended), was_leader_signalled)
        }
        Ending::Terminate => {
            let was_leader_signalled = leader.status().is_none();
            let ended = step_process::terminate(group, leader, grace).await;
            (Some(ended), was_leader_signalled)
        }
        Ending::Running => {
            let deadline = tokio::time::Instant::now() + grace;
            if leader.exited_by(deadline).await {
                (
                    step_process::end_leftovers(group, leader, grace).await,
                    false,
                )
            } else {
                (
                    Some(step_process::terminate(group, leader, grace).await),
                    true,
                )
            }
        }
    }
}

/// Journals `statuses` (what the coalescer let through) in one batch; the error to end the step
/// with if that fails.
async fn journal_statuses(
    recorder: &Recorder,
    index: u32,
    coalescer: &mut external_job::SampleCoalescer,
    statuses: impl IntoIterator<Item = ExternalJobStatus>,
) -> Result<(), String> {
    let statuses: Vec<ExternalJobStatus> = statuses.into_iter().collect();
    let Some(last) = statuses.last().cloned() else {
        return Ok(());
    };
    let events = statuses
        .into_iter()
        .map(|job| Event::ExternalJobUpdated { step: index, job })
        .collect();
    recorder
        .append(events, Condition::expect_not_terminal())
        .await
        .map_err(|error| format!("recording the job status failed: {error}"))?;
    coalescer.journaled(last, std::time::Instant::now());
    Ok(())
}

async fn sleep_until_due(due: Option<tokio::time::Instant>) {
    match due {
        Some(due) => tokio::time::sleep_until(due).await,
        None => std::future::pending().await,
    }
}

/// Reads the provider's stdout line by line, each bounded to [`MAX_PROVIDER_LINE_BYTES`],
/// copying every line to the step's output log (at best: the sink never waits on the disk).
/// Runs on a blocking thread; stops at end of file, at an over-long line, or when the step's
/// task stops listening.
fn read_provider(stdout: impl Read, log: LogSink, lines: mpsc::Sender<ProviderRead>) {
    let mut reader = BufReader::with_capacity(64 * 1024, stdout);
    loop {
        let read = read_bounded_line(&mut reader, MAX_PROVIDER_LINE_BYTES);
        let read = match read {
            Ok(None) => return,
            Ok(Some(read)) => read,
            Err(error) => ProviderRead::Failed(error.to_string()),
        };
        if let ProviderRead::Line(line) = &read {
            // The log is a convenience copy; the journal has what matters.
            let mut copy = Vec::with_capacity(line.len() + 1);
            copy.extend_from_slice(line);
            copy.push(b'\n');
            log.push(&copy);
        }
        let is_last = !matches!(read, ProviderRead::Line(_));
        if lines.blocking_send(read).is_err() || is_last {
            return;
        }
    }
}

/// Reads one line (without its newline) of at most `max_bytes`. `Ok(None)` at end of file.
fn read_bounded_line(
    reader: &mut impl BufRead,
    max_bytes: usize,
) -> io::Result<Option<ProviderRead>> {
    let mut line = Vec::new();
    loop {
        let available = match reader.fill_buf() {
            Ok(available) => available,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(error),
        };
        if available.is_empty() {
            return Ok(if line.is_empty() {
                None
            } else {
                Some(ProviderRead::Line(line))
            });
        }
        let newline = available.iter().position(|&byte| byte == b'\n');
        let take = newline.unwrap_or(available.len());
        if line.len() + take > max_bytes {
            let mut head = line;
            let room = external_job::QUOTED_LINE_BYTES.saturating_sub(head.len());
            head.extend_from_slice(&available[..take.min(room)]);
            head.truncate(external_job::QUOTED_LINE_BYTES);
            return Ok(Some(ProviderRead::TooLong {
                head,
                bytes: max_bytes,
            }));
        }
        line.extend_from_slice(&available[..take]);
        match newline {
            Some(position) => {
                reader.consume(position + 1);
                return Ok(Some(ProviderRead::Line(line)));
            }
            None => {
                let consumed = available.len();
                reader.consume(consumed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_read_whole_and_bounded() {
        let input = b"one\ntwo\n\nthree".to_vec();
        let mut reader = BufReader::with_capacity(2, input.as_slice());
        let mut lines = Vec::new();
        while let Some(read) = read_bounded_line(&mut reader, 16).expect("reads") {
            match read {
                ProviderRead::Line(line) => lines.push(String::from_utf8(line).expect("utf-8")),
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(lines, ["one", "two", "", "three"]);
    }

    #[test]
    fn an_over_long_line_stops_the_reading() {
        let input = [b'x'; 100];
        let mut reader = BufReader::with_capacity(8, input.as_slice());
        match read_bounded_line(&mut reader, 50).expect("reads") {
            Some(ProviderRead::TooLong { head, .. }) => assert!(!head.is_empty()),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn a_signal_gives_the_shell_exit_code() {
        assert_eq!(exit_code_of(ExitStatus::from_raw(3 << 8)), Some(3));
        assert_eq!(exit_code_of(ExitStatus::from_raw(15)), Some(143));
    }
}
