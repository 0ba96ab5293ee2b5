//! Wire format v1: the lifecycle events of a run and the record envelope they travel in.
//!
//! Everything here is a wire type. Its postcard encoding is what the journal stores, so enums are
//! only ever extended at the end and fields are never reordered; the golden-bytes tests at the
//! bottom of this file fail on any change to the encoding. Domain state lives in [`crate::state`].
//!
//! # Record layout
//!
//! A stored record is the postcard encoding of [`RecordEnvelope`] followed by a CRC-32C
//! (Castagnoli) of those bytes, little-endian:
//!
//! ```text
//! varint format_version (= 1)
//! [u8; 16] run id (big-endian ULID)
//! varint seq · varint time_ms · varint writer · varint writer_seq
//! event: varint variant index, then the variant's fields in declaration order
//! u32 LE crc32c of everything above
//! ```
//!
//! The format version comes first so a reader can refuse a record of a newer format before it
//! tries to decode the rest.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// The version of the record encoding this build writes and reads.
pub const FORMAT_VERSION: u16 = 1;

/// Upper bound on the encoded size of one record, checksum included.
pub const MAX_RECORD_BYTES: usize = 1 << 20;

/// Most steps a run may have.
pub const MAX_STEPS: usize = 128;

/// Longest accepted free text (a summary, an error, a message, an id), in bytes.
pub const MAX_TEXT_BYTES: usize = 4096;

/// Most bytes of one step's spec: its name plus its command, script or provider text.
pub const MAX_STEP_BYTES: usize = 4096;

/// Longest argument vector of a command step.
pub const MAX_ARGS: usize = 128;

/// Longest message of a steer request, in bytes (pi-subagents' limit for one steering
/// message).
pub const MAX_STEER_MESSAGE_BYTES: usize = 128 * 1024;

/// Longest id of a steer request, and longest text naming where it came from, in bytes
/// (pi-subagents' limits, which it counts in characters).
pub const MAX_STEER_ID_BYTES: usize = 256;

/// Most steer requests of a run waiting to be taken at once (pi-subagents' limit).
pub const MAX_PENDING_STEERS: usize = 20;

/// Most steer requests one run takes in its life: each stays in its snapshot (without its
/// message, but for its first [`STEER_PREVIEW_CHARS`]), which this bounds.
pub const MAX_STEERS_PER_RUN: usize = 128;

/// How much of a steer message its run's state keeps to show it (pi-subagents'
/// `messagePreview`), in characters.
pub const STEER_PREVIEW_CHARS: usize = 160;

// The largest steer request must fit the record limit: its message, its id and source with
// their length prefixes, a target per step (a varint of up to 5 bytes each), and the envelope.
const _: () = assert!(
    MAX_STEER_MESSAGE_BYTES + 2 * (MAX_STEER_ID_BYTES + 2) + MAX_STEPS * 5 + 256
        <= MAX_RECORD_BYTES
);

// The largest legal record must fit the record limit. RunCreated is the largest: every step at
// its largest, each argument with a varint length prefix of up to 2 bytes, plus 16 bytes of step
// overhead, plus the run's own texts (name, cwd, three ids) and the envelope.
const _: () = assert!(
    MAX_STEPS * (MAX_STEP_BYTES + MAX_ARGS * 2 + 16) + 8 * MAX_TEXT_BYTES + 256 <= MAX_RECORD_BYTES
);

/// Upper bound on the encoded size of one run's snapshot (its folded state), checksum included.
pub const MAX_SNAPSHOT_BYTES: usize = 4 << 20;

// The largest legal snapshot must fit the snapshot limit, or a legal transition of a run whose
// texts are all at their limits would be refused and the run could never end. It holds the spec
// (at most a record); per step, five texts (process boot id, error, job id, message, url), each
// with a length prefix of up to 2 bytes, plus 64 bytes of fixed fields; the run's own fifteen
// texts (three host ids, the runner's boot id and instance id, three controls' `by` and `reason`,
// the terminal error and summary, the observed instance id) plus 1 KiB for the rest; and its
// steer requests without their messages: an id and a source with their prefixes, a preview of
// up to four bytes a character, 32 bytes of fixed fields, and per target step its number and
// its delivery (16 bytes).
const _: () = assert!(
    MAX_RECORD_BYTES
        + MAX_STEPS * (5 * (MAX_TEXT_BYTES + 2) + 64)
        + 15 * (MAX_TEXT_BYTES + 2)
        + 1024
        + MAX_STEERS_PER_RUN
            * (2 * (MAX_STEER_ID_BYTES + 2) + (4 * STEER_PREVIEW_CHARS + 2) + 32 + MAX_STEPS * 16)
        <= MAX_SNAPSHOT_BYTES
);

/// The first [`STEER_PREVIEW_CHARS`] characters of a steer message, its white space runs made
/// one space: what a state keeps of it. Pure.
pub fn steer_preview(message: &str) -> String {
    let one_line = message.split_whitespace().collect::<Vec<_>>().join(" ");
    match one_line.char_indices().nth(STEER_PREVIEW_CHARS) {
        Some((cut, _)) => one_line[..cut].to_string(),
        None => one_line,
    }
}

const CRC: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISCSI);

/// Milliseconds since the Unix epoch.
pub type UnixMs = u64;

/// The current time in Unix milliseconds.
pub fn now_ms() -> UnixMs {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(since_epoch.as_millis()).unwrap_or(u64::MAX)
}

/// A run's identity: a ULID, so ids sort by creation time, print as 26 Crockford base32
/// characters, and can be abbreviated to any unique prefix of [`RunId::MIN_PREFIX_LEN`] or more.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RunId([u8; 16]);

impl RunId {
    /// Length of the printed form.
    pub const LEN: usize = ulid::ULID_LEN;
    /// Shortest prefix accepted in place of a full id.
    pub const MIN_PREFIX_LEN: usize = 8;

    /// A fresh id for a run created now.
    pub fn generate() -> RunId {
        RunId(ulid::Ulid::generate().to_bytes())
    }

    /// The id made of these bytes (big-endian ULID).
    pub const fn from_bytes(bytes: [u8; 16]) -> RunId {
        RunId(bytes)
    }

    /// The key bytes: big-endian, so byte order is creation order.
    pub const fn to_bytes(self) -> [u8; 16] {
        self.0
    }

    /// Creation time embedded in the id.
    pub fn created_at_ms(self) -> UnixMs {
        ulid::Ulid::from_bytes(self.0).timestamp_ms()
    }

    /// The range of ids `[low, high]` whose printed form starts with `prefix`.
    ///
    /// The prefix is checked against the id alphabet first, so a caller may build paths only
    /// from ids that went through here or through [`RunId::from_str`].
    pub fn prefix_range(prefix: &str) -> Result<(RunId, RunId), RunIdError> {
        check_id_text(prefix)?;
        if prefix.len() < RunId::MIN_PREFIX_LEN {
            return Err(RunIdError::PrefixTooShort {
                text: prefix.to_string(),
            });
        }
        let pad = RunId::LEN - prefix.len();
        let low: String = prefix.to_ascii_uppercase() + &"0".repeat(pad);
        let high: String = prefix.to_ascii_uppercase() + &"Z".repeat(pad);
        let low = RunId::from_str(&low)?;
        let high = RunId::from_str(&high)?;
        Ok((low, high))
    }
}

fn check_id_text(text: &str) -> Result<(), RunIdError> {
    const ALPHABET: &str = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";
    if text.len() > RunId::LEN {
        return Err(RunIdError::TooLong {
            text: text.chars().take(64).collect(),
        });
    }
    match text
        .chars()
        .find(|c| !ALPHABET.contains(c.to_ascii_uppercase()))
    {
        Some(bad) => Err(RunIdError::BadCharacter {
            text: text.chars().take(64).collect(),
            bad,
        }),
        None => Ok(()),
    }
}

impl FromStr for RunId {
    type Err = RunIdError;

    /// Parses a full id; lower case is accepted.
    fn from_str(text: &str) -> Result<RunId, RunIdError> {
        check_id_text(text)?;
        if text.len() != RunId::LEN {
            return Err(RunIdError::WrongLength {
                text: text.to_string(),
            });
        }
        // 26 base32 characters hold 130 bits; the first may only carry the top 3 of 128.
        if text.as_bytes()[0] > b'7' {
            return Err(RunIdError::Overflow {
                text: text.to_string(),
            });
        }
        ulid::Ulid::from_string(&text.to_ascii_uppercase())
            .map(|id| RunId(id.to_bytes()))
            .map_err(|_| RunIdError::Overflow {
                text: text.to_string(),
            })
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut buffer = [0u8; ulid::ULID_LEN];
        f.write_str(ulid::Ulid::from_bytes(self.0).array_to_str(&mut buffer))
    }
}

impl fmt::Debug for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RunId({self})")
    }
}

/// Why a text is not a run id or id prefix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RunIdError {
    #[error(
        "run id {text:?} contains {bad:?}, which is not in the run id alphabet (0-9, A-Z without I, L, O, U)"
    )]
    BadCharacter { text: String, bad: char },
    #[error("run id {text:?} is longer than {} characters", RunId::LEN)]
    TooLong { text: String },
    #[error("run id {text:?} must be {} characters long", RunId::LEN)]
    WrongLength { text: String },
    #[error(
        "run id prefix {text:?} is shorter than {} characters",
        RunId::MIN_PREFIX_LEN
    )]
    PrefixTooShort { text: String },
    #[error("run id {text:?} is out of range (its first character must be 0-7)")]
    Overflow { text: String },
}

/// Identifies one writer: a journal handle in one process. Together with the writer's own
/// sequence number it makes a batch recognisable when it is appended again after an I/O error.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct WriterId(pub u64);

impl WriterId {
    /// A fresh random writer id.
    pub fn generate() -> WriterId {
        WriterId(rand::random())
    }
}

impl fmt::Display for WriterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl fmt::Debug for WriterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "WriterId({self})")
    }
}

/// A process is the same process only if all its fields match: pids are reused, a reboot
/// resets both pids and start times, and a pid names a process only within its PID namespace.
///
/// On the wire (postcard: records and snapshots) an identity is the three fields of format 1,
/// `pid`, `start_time`, `boot_id`; the PID namespace travels at the end of the record or the
/// snapshot that holds the identity (see [`RecordEnvelope::encode`]), so that records written
/// before it existed decode unchanged, with `pid_namespace: None`. As JSON (events.jsonl, the
/// binaries' `--json`) it is `{pid, startTime, bootId, pidNamespace?}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ProcessIdentity {
    pub pid: u32,
    /// Start time: on Linux in clock ticks since boot (`/proc/<pid>/stat` field 22), on
    /// macOS in microseconds since the Unix epoch (`pbi_start_tvsec`, `pbi_start_tvusec`).
    pub start_time: u64,
    /// The id of the boot the process ran in: Linux's `/proc/sys/kernel/random/boot_id`,
    /// macOS's `kern.bootsessionuuid` (or `boottime-<s>-<us>` where it is missing).
    pub boot_id: String,
    /// The PID namespace `pid` was read in — the recorder's, which is where the number means
    /// this process (on Linux the inode of `/proc/self/ns/pid`; see
    /// `platform::pid_namespace`). `None` on a platform without PID namespaces, and in records
    /// written before runjournal recorded it: those are judged as in the observer's own
    /// namespace, as the version that wrote them judged them.
    pub pid_namespace: Option<u64>,
}

/// [`ProcessIdentity`] as format 1 encodes it: what postcard writes and reads.
#[derive(Serialize, Deserialize)]
struct ProcessIdentityV1<S> {
    pid: u32,
    start_time: u64,
    boot_id: S,
}

/// [`ProcessIdentity`] as JSON.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ProcessIdentityJson<S> {
    pid: u32,
    start_time: u64,
    boot_id: S,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pid_namespace: Option<u64>,
}

impl Serialize for ProcessIdentity {
    fn serialize<Ser: serde::Serializer>(&self, serializer: Ser) -> Result<Ser::Ok, Ser::Error> {
        // postcard is the one format that is not human-readable: the wire's three fields.
        if serializer.is_human_readable() {
            ProcessIdentityJson {
                pid: self.pid,
                start_time: self.start_time,
                boot_id: self.boot_id.as_str(),
                pid_namespace: self.pid_namespace,
            }
            .serialize(serializer)
        } else {
            ProcessIdentityV1 {
                pid: self.pid,
                start_time: self.start_time,
                boot_id: self.boot_id.as_str(),
            }
            .serialize(serializer)
        }
    }
}

impl<'de> Deserialize<'de> for ProcessIdentity {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        if deserializer.is_human_readable() {
            let json = ProcessIdentityJson::<String>::deserialize(deserializer)?;
            Ok(ProcessIdentity {
                pid: json.pid,
                start_time: json.start_time,
                boot_id: json.boot_id,
                pid_namespace: json.pid_namespace,
            })
        } else {
            let wire = ProcessIdentityV1::<String>::deserialize(deserializer)?;
            Ok(ProcessIdentity {
                pid: wire.pid,
                start_time: wire.start_time,
                boot_id: wire.boot_id,
                pid_namespace: None,
            })
        }
    }
}

/// How a run's steps are scheduled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Exactly one step.
    Single,
    /// Steps in order; the first failure ends the run.
    Chain,
    /// Steps at once, at most `concurrency` running.
    Parallel,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Single => "single",
            Mode::Chain => "chain",
            Mode::Parallel => "parallel",
        }
    }
}

/// What a step runs.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", rename_all_fields = "camelCase")]
pub enum StepAction {
    /// A program and its arguments, run without a shell.
    Command { argv: Vec<String> },
    /// A script run by `sh -c`.
    Shell { script: String },
    /// A provider command whose stdout reports an external job, one JSON status per line.
    ExternalJob { provider: String },
}

/// One step of a run's spec.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct StepSpec {
    /// Shown as the step's `agent` in status.json.
    pub name: String,
    pub action: StepAction,
}

impl StepSpec {
    pub fn is_external_job(&self) -> bool {
        matches!(self.action, StepAction::ExternalJob { .. })
    }
}

/// What a run is: fixed at creation.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunSpec {
    pub name: Option<String>,
    pub mode: Mode,
    /// Most steps running at once in `parallel` mode; ignored otherwise.
    pub concurrency: u32,
    pub timeout_ms: Option<u64>,
    /// Working directory of the steps; the runner's own when absent.
    pub cwd: Option<String>,
    pub steps: Vec<StepSpec>,
}

/// Why a run spec cannot be run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SpecError {
    #[error("the run has no steps")]
    NoSteps,
    #[error("the run has {count} steps, over the limit of {MAX_STEPS}")]
    TooManySteps { count: usize },
    #[error("mode single takes exactly one step, not {count}")]
    SingleNeedsOneStep { count: usize },
    #[error("mode parallel needs a concurrency of at least 1")]
    ZeroConcurrency,
    #[error("step {step} has an empty name")]
    EmptyStepName { step: usize },
    #[error("step {step} ({name}) has nothing to run")]
    EmptyAction { step: usize, name: String },
    #[error("step {step} ({name}) has {count} arguments, over the limit of {MAX_ARGS}")]
    TooManyArgs {
        step: usize,
        name: String,
        count: usize,
    },
    #[error("step {step} ({name}) is {bytes} bytes, over the limit of {MAX_STEP_BYTES}")]
    StepTooLarge {
        step: usize,
        name: String,
        bytes: usize,
    },
    #[error("the run's {field} is {bytes} bytes, over the limit of {MAX_TEXT_BYTES}")]
    TextTooLong { field: &'static str, bytes: usize },
}

impl RunSpec {
    /// Checks everything a runner relies on: the step count for the mode, a concurrency for
    /// `parallel`, something to run in every step, and the size limits.
    pub fn check(&self) -> Result<(), SpecError> {
        let count = self.steps.len();
        if count == 0 {
            return Err(SpecError::NoSteps);
        }
        if count > MAX_STEPS {
            return Err(SpecError::TooManySteps { count });
        }
        if self.mode == Mode::Single && count != 1 {
            return Err(SpecError::SingleNeedsOneStep { count });
        }
        if self.mode == Mode::Parallel && self.concurrency == 0 {
            return Err(SpecError::ZeroConcurrency);
        }
        for (field, text) in [("name", &self.name), ("cwd", &self.cwd)] {
            if let Some(text) = text {
                check_text(text).map_err(|bytes| SpecError::TextTooLong { field, bytes })?;
            }
        }
        for (step, spec) in self.steps.iter().enumerate() {
            if spec.name.trim().is_empty() {
                return Err(SpecError::EmptyStepName { step });
            }
            let name = || spec.name.chars().take(64).collect::<String>();
            let (is_empty, action_bytes) = match &spec.action {
                StepAction::Command { argv } => {
                    if argv.len() > MAX_ARGS {
                        return Err(SpecError::TooManyArgs {
                            step,
                            name: name(),
                            count: argv.len(),
                        });
                    }
                    (
                        argv.first().is_none_or(|program| program.is_empty()),
                        argv.iter().map(String::len).sum(),
                    )
                }
                StepAction::Shell { script } => (script.trim().is_empty(), script.len()),
                StepAction::ExternalJob { provider } => {
                    (provider.trim().is_empty(), provider.len())
                }
            };
            if is_empty {
                return Err(SpecError::EmptyAction { step, name: name() });
            }
            let bytes = spec.name.len() + action_bytes;
            if bytes > MAX_STEP_BYTES {
                return Err(SpecError::StepTooLarge {
                    step,
                    name: name(),
                    bytes,
                });
            }
        }
        Ok(())
    }
}

/// The host's own ids for a run, recorded in [`Event::RunCreated`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostIds {
    pub session_id: Option<String>,
    pub completion_owner_id: Option<String>,
    pub tool_call_id: Option<String>,
}

impl HostIds {
    /// Checks each id against [`MAX_TEXT_BYTES`], as `RunCreated` will: an id over it is
    /// refused as input, naming the id and the limit, before anything is written.
    pub fn check(&self) -> Result<(), SpecError> {
        for (field, text) in [
            ("session id", &self.session_id),
            ("owner id", &self.completion_owner_id),
            ("tool-call id", &self.tool_call_id),
        ] {
            if let Some(text) = text {
                check_text(text).map_err(|bytes| SpecError::TextTooLong { field, bytes })?;
            }
        }
        Ok(())
    }
}

/// `Err(len)` when `text` is over [`MAX_TEXT_BYTES`].
fn check_text(text: &str) -> Result<(), usize> {
    if text.len() > MAX_TEXT_BYTES {
        Err(text.len())
    } else {
        Ok(())
    }
}

/// A text field of an event over its limit ([`MAX_TEXT_BYTES`] for most).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{event}.{field} is {bytes} bytes, over the limit of {limit}")]
pub struct TextTooLong {
    pub event: &'static str,
    pub field: &'static str,
    pub bytes: usize,
    pub limit: usize,
}

/// Cuts `text` to at most `max_bytes`, on a character boundary, marking the cut.
pub fn truncate_text(text: &str, max_bytes: usize) -> String {
    const MARK: &str = "…[truncated]";
    if text.len() <= max_bytes {
        return text.to_string();
    }
    let mut end = max_bytes.saturating_sub(MARK.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{MARK}", &text[..end])
}

/// State reported by an external job's provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    Queued,
    Running,
    Succeeded,
    Failed,
    Cancelled,
    /// Waiting on another job (pi-subagents' `blocked`): not ended.
    Blocked,
}

impl JobState {
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobState::Succeeded | JobState::Failed | JobState::Cancelled
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Running => "running",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
            JobState::Blocked => "blocked",
        }
    }
}

impl FromStr for JobState {
    type Err = String;

    fn from_str(text: &str) -> Result<JobState, String> {
        match text {
            "queued" => Ok(JobState::Queued),
            "running" => Ok(JobState::Running),
            "succeeded" => Ok(JobState::Succeeded),
            "failed" => Ok(JobState::Failed),
            "cancelled" => Ok(JobState::Cancelled),
            "blocked" => Ok(JobState::Blocked),
            // pi-subagents' words for the same ends.
            "completed" => Ok(JobState::Succeeded),
            "stopped" => Ok(JobState::Cancelled),
            other => Err(format!(
                "unknown job state {other:?} (expected queued, running, blocked, succeeded or completed, failed, cancelled or stopped)"
            )),
        }
    }
}

/// An external job's status as last reported; replaced whole by each update.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExternalJobStatus {
    pub state: JobState,
    /// The provider's id of the job.
    pub id: Option<String>,
    /// Progress as the provider reports it; must be finite.
    pub progress: Option<f64>,
    pub message: Option<String>,
    pub url: Option<String>,
}

/// How a step ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StepEnd {
    Complete,
    Failed,
    Stopped,
    /// Never ran; recorded for a step that is still pending.
    Skipped,
}

/// The outcome carried by [`Event::StepFinished`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StepOutcome {
    pub end: StepEnd,
    pub exit_code: Option<i32>,
    pub error: Option<String>,
}

/// What a control request asks of the runner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ControlAction {
    Stop,
    Timeout,
    Interrupt,
}

impl ControlAction {
    pub fn as_str(self) -> &'static str {
        match self {
            ControlAction::Stop => "stop",
            ControlAction::Timeout => "timeout",
            ControlAction::Interrupt => "interrupt",
        }
    }
}

/// The terminal states of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TerminalState {
    Complete,
    Failed,
    Stopped,
    Paused,
}

impl TerminalState {
    pub fn as_str(self) -> &'static str {
        match self {
            TerminalState::Complete => "complete",
            TerminalState::Failed => "failed",
            TerminalState::Stopped => "stopped",
            TerminalState::Paused => "paused",
        }
    }
}

/// Who recorded a `Terminal` on the runner's behalf.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Repairer {
    Reconciler,
    Launcher,
    /// A host's own repair ended the run before runjournal's reconciler did (pi-subagents'
    /// stale-run reconciler), and runjournal recorded its verdict ([`Event::HostEnded`]).
    Host,
}

/// How a step should take a steer message: pi-subagents' two delivery modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SteerMode {
    /// Now, into what the step is doing.
    Steer,
    /// Once the step is done with what it is doing.
    FollowUp,
}

impl SteerMode {
    /// Its name on the command line and in a step's inbox (`steer`, `follow-up`).
    pub fn as_str(self) -> &'static str {
        match self {
            SteerMode::Steer => "steer",
            SteerMode::FollowUp => "follow-up",
        }
    }
}

impl FromStr for SteerMode {
    type Err = String;

    fn from_str(text: &str) -> Result<SteerMode, String> {
        match text {
            "steer" => Ok(SteerMode::Steer),
            "follow-up" => Ok(SteerMode::FollowUp),
            other => Err(format!(
                "unknown steer mode {other:?} (expected steer or follow-up)"
            )),
        }
    }
}

/// Why a steer request is not one a run takes, whatever its state: its id, its message or its
/// targets. Pure; `None` when it is well formed.
pub fn steer_request_flaw(id: &str, steps: &[u32], message: &str) -> Option<&'static str> {
    if id.is_empty() || id.chars().any(char::is_whitespace) {
        return Some("its id is empty or holds white space");
    }
    if message.trim().is_empty() {
        return Some("its message is empty");
    }
    if steps.is_empty() {
        return Some("it names no step");
    }
    if steps.len() > MAX_STEPS {
        return Some("it names more steps than a run has");
    }
    if steps
        .iter()
        .enumerate()
        .any(|(index, step)| steps[..index].contains(step))
    {
        return Some("it names a step twice");
    }
    None
}

/// How the runner process ended, as far as the observer knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ProcessExit {
    pub code: Option<i32>,
    pub signal: Option<i32>,
}

/// How sure the observer is that the runner is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Proof {
    /// The observer saw the exact runner instance exit (it was its parent).
    Observed,
    /// The runner is gone, but nobody saw how.
    Unknown,
    /// No runner ever took the run.
    NotStarted,
}

impl Proof {
    pub fn as_str(self) -> &'static str {
        match self {
            Proof::Observed => "observed",
            Proof::Unknown => "unknown",
            Proof::NotStarted => "not-started",
        }
    }
}

/// Who observed the runner gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Observer {
    RunnerParent,
    Launcher,
    Reconciler,
    /// The home's watcher, through a handle on exactly that process (Linux's pidfd): it saw
    /// the process exit, but not how, not being its parent.
    Watcher,
}

/// One lifecycle transition. Variants are only ever added at the end: the variant index is part
/// of the wire format. (Field names are not: postcard does not encode them, so the camelCase
/// renaming only shapes the JSON of events.jsonl.)
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all_fields = "camelCase")]
pub enum Event {
    RunCreated {
        spec: Arc<RunSpec>,
        created_at_ms: UnixMs,
        session_id: Option<String>,
        completion_owner_id: Option<String>,
        tool_call_id: Option<String>,
    },
    RunnerStarted {
        runner: ProcessIdentity,
        instance_id: String,
    },
    StepRunning {
        step: u32,
        process: Option<ProcessIdentity>,
    },
    ExternalJobUpdated {
        step: u32,
        job: ExternalJobStatus,
    },
    StepFinished {
        step: u32,
        outcome: StepOutcome,
    },
    ControlRequested {
        action: ControlAction,
        by: String,
        reason: String,
    },
    Terminal {
        state: TerminalState,
        error: Option<String>,
        summary: String,
        exit_code: i32,
        repaired_by: Option<Repairer>,
    },
    ProcessTerminalObserved {
        instance_id: String,
        exit: Option<ProcessExit>,
        proof: Proof,
        observer: Observer,
    },
    Dismissed {
        at_ms: UnixMs,
    },
    /// The run carries on from `from`, a run that ended `paused`: recorded in the new run's
    /// creation batch, right after its `RunCreated`. The old run's records are not touched; the
    /// journal's resume index, written in the same transaction, links it to the new run.
    Resumed {
        #[serde(with = "run_id_text")]
        from: RunId,
    },
    /// The run waits in a queue for a slot (docs/design.md, "Queues"): only in the run's
    /// creation batch, right after `RunCreated`. It also keeps what a later starter needs to
    /// start the runner as the launcher would have, which the spec does not hold.
    QueueJoined {
        queue: String,
        idle_timeout_ms: Option<u64>,
        heartbeat_ms: Option<u64>,
    },
    /// The run took a slot of its queue: appended only while the queue has fewer active runs
    /// than its limit and the run is the first waiting, which the journal checks inside the
    /// transaction that commits it. `by` says who admitted it.
    QueueAdmitted {
        by: String,
    },
    /// An attempt to deliver one of the run's completion hooks is claimed (docs/design.md,
    /// "Hooks"): attempt `attempt` (1, 2, ...) of hook `hook` (its place in the run's hook
    /// list, fixed when the run ended) is run by `claimant` now. Only after the run's
    /// `Terminal`. The claim holds until the attempt's `HookEnded`, or until `lease_ms` after
    /// this record if the claimant is still alive; a claimant found dead loses it at once.
    HookAttempted {
        hook: u32,
        attempt: u32,
        claimant: ProcessIdentity,
        /// Who claimed it, for people: a runner, a deliverer, a host.
        by: String,
        lease_ms: u64,
    },
    /// How a claimed attempt ended. `retry_at_ms`: when the next attempt is due; `None` when
    /// there is none — the hook was delivered, or it failed its last attempt and is given up.
    HookEnded {
        hook: u32,
        attempt: u32,
        outcome: HookOutcome,
        retry_at_ms: Option<UnixMs>,
    },
    /// A message for steps of the run (pi-subagents' steering), handed to each through its
    /// inbox. `steps` are the target steps; `source` says who sent it. Its message is kept
    /// here only: the state keeps the request's place ([`RecordEnvelope::seq`]).
    SteerRequested {
        id: String,
        steps: Vec<u32>,
        mode: SteerMode,
        message: String,
        source: String,
    },
    /// Step `step` took steer request `id`: it removed the message's file from its inbox.
    SteerDelivered {
        id: String,
        step: u32,
    },
    /// A file of the run's control inbox was refused (malformed, too large, a link, not a
    /// regular file, another user's, or asking what a run cannot do) and moved aside.
    ControlRefused {
        file: String,
        reason: String,
    },
    /// A host's own repair ended the run before runjournal's reconciler did: its verdict,
    /// recorded as the run's end (a `Terminal` by [`Repairer::Host`] at `ended_at_ms`, the
    /// host's time). `result_path` is the result the host published, if it published one:
    /// runjournal then publishes none.
    HostEnded {
        state: TerminalState,
        exit_code: i32,
        message: String,
        ended_at_ms: UnixMs,
        result_path: Option<String>,
    },
    /// The run waits for other runs to end before it starts (docs/design.md, "Dependencies"):
    /// only in its creation batch, right after `RunCreated` or its `QueueJoined`. It starts
    /// once every run of `after` ended `complete` and every run of `after_any` ended however;
    /// it ends without starting once one of `after` ended otherwise. It also keeps what a later
    /// starter needs to start the runner as the launcher would have (as `QueueJoined` does).
    DependsOn {
        #[serde(with = "run_ids_text")]
        after: Vec<RunId>,
        #[serde(with = "run_ids_text")]
        after_any: Vec<RunId>,
        idle_timeout_ms: Option<u64>,
        heartbeat_ms: Option<u64>,
    },
    /// Every dependency of the run ended as it asked: appended only when the journal, inside
    /// the transaction that commits it, reads each of them ended so. The run may start (or,
    /// in a queue, wait for a slot). `by` says who found it so.
    DependenciesMet {
        by: String,
    },
    /// The run starts no sooner than `due_at_ms` (`run --at`, `--delay`; docs/design.md,
    /// "Delayed starts"): only in the run's creation batch, right after `RunCreated`. Until its
    /// [`Event::DelayEnded`] the run is `queued` and has no runner. It also keeps the runner
    /// settings its later starter needs, as [`Event::QueueJoined`] does.
    StartDelayed {
        due_at_ms: UnixMs,
        idle_timeout_ms: Option<u64>,
        heartbeat_ms: Option<u64>,
    },
    /// The delayed run's due time came and `by` takes it to start its runner: accepted only
    /// once, and only in a record whose time is at or past the due time, so no runner starts
    /// before it.
    DelayEnded {
        by: String,
    },
    /// The run holds `key` (`run --unique`; docs/design.md, "Launched once"): only in its
    /// creation batch, its last event. While the run has not ended, and with `hold_ms` until
    /// that long after its creation as well, the journal refuses another run's creation batch
    /// that holds the same key, inside the transaction that would commit it; that launch is
    /// answered this run.
    UniqueKey {
        key: String,
        hold_ms: Option<u64>,
    },
    /// The run is tried again when an attempt fails so (`run --retries`; docs/design.md,
    /// "Retries"): only in its creation batch, after its other events and before its
    /// `UniqueKey`. Up to `retries` attempts follow the first; the k-th retry is due
    /// `backoff_ms · 2^(k-1)` (at most `backoff_max_ms`, less a random part of up to a half)
    /// after its attempt ended. It also keeps the runner settings a later starter needs, as
    /// [`Event::QueueJoined`] does.
    RetryPolicy {
        retries: u32,
        backoff_ms: u64,
        backoff_max_ms: u64,
        on: RetryOn,
        idle_timeout_ms: Option<u64>,
        heartbeat_ms: Option<u64>,
    },
    /// Attempt `attempt` (1, 2, ...) ended without ending the run: it failed so (`cause`), and
    /// the run's policy tries it again. The run is `queued` again, its steps `pending`, with no
    /// runner, and waits for `retry_at_ms` as a delayed run waits for its due time (a run in a
    /// queue then waits for a slot again). One record, so an attempt's end and the wait for
    /// the next are one commit: no state lies between them.
    AttemptEnded {
        attempt: u32,
        cause: AttemptCause,
        error: Option<String>,
        summary: String,
        exit_code: i32,
        retry_at_ms: UnixMs,
    },
    /// A host asks that step `step` alone end (pi-subagents' stop with a `targetIndex`;
    /// docs/design.md, "Stopping one step"): accepted while the step is pending or running, once
    /// per step. The runner ends a running step as a stop ends it, `stopped`, and skips a
    /// pending one when its turn comes; the other steps of a parallel run go on, a chain ends
    /// there. A run one of whose steps was stopped ends `failed` (not every step ran) and is not
    /// tried again.
    StepStopRequested {
        step: u32,
        by: String,
        reason: String,
    },
}

/// Most retries a run may have.
pub const MAX_RETRIES: u32 = 100;

/// Which failures of an attempt its run's policy tries again ([`Event::RetryPolicy`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RetryOn {
    /// A step that exited non-zero (with `exit_codes`, only those codes).
    pub exit: bool,
    /// The runner died without recording an outcome (killed, the host restarted).
    pub crash: bool,
    /// The run's timeout ended it.
    pub timeout: bool,
    /// The exit codes tried again; empty: every non-zero one.
    pub exit_codes: Vec<i32>,
}

impl RetryOn {
    /// The default: a failed exit and a crash.
    pub fn default_causes() -> RetryOn {
        RetryOn {
            exit: true,
            crash: true,
            timeout: false,
            exit_codes: Vec::new(),
        }
    }

    /// Whether an attempt that failed by `cause` (with `exit_code`, for an exit) is tried again.
    pub fn covers(&self, cause: AttemptCause, exit_code: i32) -> bool {
        match cause {
            AttemptCause::Exit => {
                self.exit && (self.exit_codes.is_empty() || self.exit_codes.contains(&exit_code))
            }
            AttemptCause::Crash => self.crash,
            AttemptCause::Timeout => self.timeout,
        }
    }

    /// Its words, as `--retry-on` takes them: `exit,crash`, `exit:3:75`, `any`.
    pub fn text(&self) -> String {
        let mut parts = Vec::new();
        if self.exit {
            let codes: Vec<String> = self.exit_codes.iter().map(i32::to_string).collect();
            parts.push(if codes.is_empty() {
                "exit".to_string()
            } else {
                format!("exit:{}", codes.join(":"))
            });
        }
        if self.crash {
            parts.push("crash".to_string());
        }
        if self.timeout {
            parts.push("timeout".to_string());
        }
        parts.join(",")
    }
}

impl FromStr for RetryOn {
    type Err = String;

    /// `exit`, `crash`, `timeout` or `any`, comma-separated; `exit:3:75` tries again only on
    /// those exit codes.
    fn from_str(text: &str) -> Result<RetryOn, String> {
        let mut on = RetryOn {
            exit: false,
            crash: false,
            timeout: false,
            exit_codes: Vec::new(),
        };
        for part in text.split(',').map(str::trim) {
            let mut words = part.split(':');
            match words.next() {
                Some("any") if part == "any" => {
                    on.exit = true;
                    on.crash = true;
                    on.timeout = true;
                }
                Some("exit") => {
                    on.exit = true;
                    for code in words {
                        let code: i32 = code.parse().map_err(|_| {
                            format!("{part:?}: {code:?} is not an exit code (a number)")
                        })?;
                        if code == 0 {
                            return Err(format!("{part:?}: exit code 0 is a success"));
                        }
                        if !on.exit_codes.contains(&code) {
                            on.exit_codes.push(code);
                        }
                    }
                }
                Some("crash") if part == "crash" => on.crash = true,
                Some("timeout") if part == "timeout" => on.timeout = true,
                _ => {
                    return Err(format!(
                        "unknown retry cause {part:?} (expected exit, exit:CODE[:CODE...], crash, timeout or any)"
                    ));
                }
            }
        }
        Ok(on)
    }
}

/// How an attempt failed ([`Event::AttemptEnded`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AttemptCause {
    /// A step exited non-zero, or failed to start.
    Exit,
    /// The runner died without recording an outcome.
    Crash,
    /// The run's timeout ended it.
    Timeout,
}

impl AttemptCause {
    pub fn as_str(self) -> &'static str {
        match self {
            AttemptCause::Exit => "exit",
            AttemptCause::Crash => "crash",
            AttemptCause::Timeout => "timeout",
        }
    }
}

/// What is wrong with a retry policy's numbers, if anything.
pub fn retry_policy_flaw(retries: u32, backoff_ms: u64, backoff_max_ms: u64) -> Option<String> {
    if retries == 0 || retries > MAX_RETRIES {
        return Some(format!(
            "{retries} retries is not between 1 and {MAX_RETRIES}"
        ));
    }
    if backoff_max_ms < backoff_ms {
        return Some(format!(
            "its longest backoff ({backoff_max_ms} ms) is shorter than its first ({backoff_ms} ms)"
        ));
    }
    None
}

/// Longest key of a run launched once ([`Event::UniqueKey`]), in bytes.
pub const MAX_UNIQUE_KEY_BYTES: usize = 256;

/// What is wrong with a unique key, if anything: empty, too long, or holding a control
/// character.
pub fn unique_key_flaw(key: &str) -> Option<String> {
    if key.is_empty() {
        return Some("is empty".to_string());
    }
    if key.len() > MAX_UNIQUE_KEY_BYTES {
        return Some(format!(
            "is {} bytes, over the limit of {MAX_UNIQUE_KEY_BYTES}",
            key.len()
        ));
    }
    if key.chars().any(char::is_control) {
        return Some("holds a control character".to_string());
    }
    None
}

/// Most runs one run may wait for (`run --after` and `--after-any` together).
pub const MAX_DEPENDENCIES: usize = 64;

/// What is wrong with a `DependsOn`'s lists on their own, if anything: none at all, more than
/// [`MAX_DEPENDENCIES`], or a run named twice (in one list or both).
pub fn dependencies_flaw(after: &[RunId], after_any: &[RunId]) -> Option<&'static str> {
    let count = after.len() + after_any.len();
    if count == 0 {
        return Some("name no run");
    }
    if count > MAX_DEPENDENCIES {
        return Some("name more runs than a run may wait for");
    }
    let mut all: Vec<RunId> = after.iter().chain(after_any).copied().collect();
    all.sort_unstable();
    if all.windows(2).any(|pair| pair[0] == pair[1]) {
        return Some("name a run twice");
    }
    None
}

/// Most bytes of the environment a run keeps (`run --env`, the launcher's variables): names and
/// values with one byte each for `=` and the end.
pub const MAX_ENV_BYTES: usize = 256 * 1024;

/// Most variables of the environment a run keeps.
pub const MAX_ENV_VARS: usize = 4096;

/// Most completion hooks a run may give itself (`run --on-exit`, a spec's `onExit`).
pub const MAX_RUN_HOOKS: usize = 16;

/// Most completion hooks a run has: its own, and the home's hook in force when it ended.
pub const MAX_HOOKS: u32 = MAX_RUN_HOOKS as u32 + 1;

/// Most attempts to deliver one hook; a hook whose last attempt failed is given up.
pub const MAX_HOOK_ATTEMPTS: u32 = 5;

/// How an attempt to deliver a completion hook ended.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", rename_all_fields = "camelCase")]
pub enum HookOutcome {
    /// The hook exited 0: delivered. No attempt follows.
    Delivered,
    /// It exited with another code, or was killed by a signal.
    Failed { exit: ProcessExit },
    /// It ran past its timeout; its process group was ended.
    TimedOut,
    /// It could not be started (its shell missing, no process left); why.
    NotStarted { error: String },
    /// Its claimant died, or its lease ran out, before the attempt's end was recorded: the
    /// hook may or may not have run. Recorded by whoever takes the claim over.
    Abandoned { reason: String },
}

impl HookOutcome {
    pub fn as_str(&self) -> &'static str {
        match self {
            HookOutcome::Delivered => "delivered",
            HookOutcome::Failed { .. } => "failed",
            HookOutcome::TimedOut => "timed-out",
            HookOutcome::NotStarted { .. } => "not-started",
            HookOutcome::Abandoned { .. } => "abandoned",
        }
    }

    pub fn is_delivered(&self) -> bool {
        matches!(self, HookOutcome::Delivered)
    }
}

/// A run id inside an event: its 16 bytes on the wire (postcard), its printed form in JSON
/// (events.jsonl), as people and `recover` read it.
mod run_ids_text {
    use super::RunId;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub(super) fn serialize<S: Serializer>(
        runs: &[RunId],
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        if serializer.is_human_readable() {
            serializer.collect_seq(runs.iter().map(RunId::to_string))
        } else {
            runs.serialize(serializer)
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Vec<RunId>, D::Error> {
        if deserializer.is_human_readable() {
            let texts = Vec::<String>::deserialize(deserializer)?;
            texts
                .iter()
                .map(|text| text.parse().map_err(serde::de::Error::custom))
                .collect()
        } else {
            Vec::<RunId>::deserialize(deserializer)
        }
    }
}

mod run_id_text {
    use super::RunId;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub(super) fn serialize<S: Serializer>(run: &RunId, serializer: S) -> Result<S::Ok, S::Error> {
        if serializer.is_human_readable() {
            serializer.collect_str(run)
        } else {
            run.serialize(serializer)
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<RunId, D::Error> {
        if deserializer.is_human_readable() {
            let text = String::deserialize(deserializer)?;
            text.parse().map_err(serde::de::Error::custom)
        } else {
            RunId::deserialize(deserializer)
        }
    }
}

/// The longest queue name, in bytes.
pub const MAX_QUEUE_NAME_BYTES: usize = 64;

/// Why a queue name is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "queue name {name:?} is not 1 to {MAX_QUEUE_NAME_BYTES} characters of letters, digits, '.', '_' and '-'"
)]
pub struct QueueNameError {
    pub name: String,
}

/// Checks a queue name: 1 to [`MAX_QUEUE_NAME_BYTES`] ASCII letters, digits, `.`, `_` or `-`
/// (never a NUL, which the journal's queue keys use as a separator).
pub fn check_queue_name(name: &str) -> Result<(), QueueNameError> {
    let is_valid = !name.is_empty()
        && name.len() <= MAX_QUEUE_NAME_BYTES
        && name
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'-'));
    if is_valid {
        Ok(())
    } else {
        Err(QueueNameError {
            name: truncate_text(name, MAX_QUEUE_NAME_BYTES * 2),
        })
    }
}

/// Pushes each text of `texts` that is there, under its field's name.
fn push_present<'a, const N: usize>(
    fields: &mut Vec<(&'static str, &'a str)>,
    texts: [(&'static str, &'a Option<String>); N],
) {
    fields.extend(
        texts
            .into_iter()
            .filter_map(|(field, value)| value.as_deref().map(|value| (field, value))),
    );
}

impl Event {
    /// Checks every free-text field against [`MAX_TEXT_BYTES`]. The spec of `RunCreated` is
    /// checked by [`RunSpec::check`].
    pub fn check_text_limits(&self) -> Result<(), TextTooLong> {
        if matches!(
            self,
            Event::SteerRequested { .. } | Event::SteerDelivered { .. }
        ) {
            return self.check_steer_limits();
        }
        let event = self.name();
        for (field, value) in self.bounded_texts() {
            check_text(value).map_err(|bytes| TextTooLong {
                event,
                field,
                bytes,
                limit: MAX_TEXT_BYTES,
            })?;
        }
        Ok(())
    }

    /// The event's texts that [`MAX_TEXT_BYTES`] bounds, each with its field's name (a steer
    /// request's have limits of their own: [`Event::check_steer_limits`]).
    fn bounded_texts(&self) -> Vec<(&'static str, &str)> {
        let mut fields: Vec<(&'static str, &str)> = Vec::new();
        match self {
            Event::RunCreated {
                session_id,
                completion_owner_id,
                tool_call_id,
                ..
            } => push_present(
                &mut fields,
                [
                    ("session_id", session_id),
                    ("completion_owner_id", completion_owner_id),
                    ("tool_call_id", tool_call_id),
                ],
            ),
            Event::RunnerStarted {
                runner,
                instance_id,
            } => {
                fields.push(("runner.boot_id", &runner.boot_id));
                fields.push(("instance_id", instance_id));
            }
            Event::StepRunning { process, .. } => {
                if let Some(process) = process {
                    fields.push(("process.boot_id", &process.boot_id));
                }
            }
            Event::ExternalJobUpdated { job, .. } => push_present(
                &mut fields,
                [
                    ("id", &job.id),
                    ("message", &job.message),
                    ("url", &job.url),
                ],
            ),
            Event::StepFinished { outcome, .. } => {
                if let Some(error) = &outcome.error {
                    fields.push(("error", error));
                }
            }
            Event::ControlRequested { by, reason, .. }
            | Event::StepStopRequested { by, reason, .. } => {
                fields.push(("by", by));
                fields.push(("reason", reason));
            }
            Event::Terminal { error, summary, .. } => {
                fields.push(("summary", summary));
                if let Some(error) = error {
                    fields.push(("error", error));
                }
            }
            Event::ProcessTerminalObserved { instance_id, .. } => {
                fields.push(("instance_id", instance_id));
            }
            Event::Dismissed { .. }
            | Event::Resumed { .. }
            | Event::DependsOn { .. }
            | Event::SteerRequested { .. }
            | Event::SteerDelivered { .. }
            | Event::StartDelayed { .. }
            | Event::RetryPolicy { .. } => {}
            Event::QueueJoined { queue, .. } => fields.push(("queue", queue)),
            Event::QueueAdmitted { by } | Event::DependenciesMet { by } => fields.push(("by", by)),
            Event::HookAttempted { claimant, by, .. } => {
                fields.push(("claimant.boot_id", &claimant.boot_id));
                fields.push(("by", by));
            }
            Event::HookEnded { outcome, .. } => match outcome {
                HookOutcome::NotStarted { error: text }
                | HookOutcome::Abandoned { reason: text } => {
                    fields.push(("outcome", text));
                }
                HookOutcome::Delivered | HookOutcome::Failed { .. } | HookOutcome::TimedOut => {}
            },
            Event::ControlRefused { file, reason } => {
                fields.push(("file", file));
                fields.push(("reason", reason));
            }
            Event::HostEnded {
                message,
                result_path,
                ..
            } => {
                fields.push(("message", message));
                if let Some(path) = result_path {
                    fields.push(("result_path", path));
                }
            }
            Event::DelayEnded { by } => fields.push(("by", by)),
            Event::UniqueKey { key, .. } => fields.push(("key", key)),
            Event::AttemptEnded { error, summary, .. } => {
                fields.push(("summary", summary));
                if let Some(error) = error {
                    fields.push(("error", error));
                }
            }
        }
        fields
    }

    /// The limits of a steer request's texts, which are pi-subagents' rather than
    /// [`MAX_TEXT_BYTES`].
    fn check_steer_limits(&self) -> Result<(), TextTooLong> {
        let event = self.name();
        let limited: Vec<(&'static str, &str, usize)> = match self {
            Event::SteerRequested {
                id,
                message,
                source,
                ..
            } => vec![
                ("id", id, MAX_STEER_ID_BYTES),
                ("source", source, MAX_STEER_ID_BYTES),
                ("message", message, MAX_STEER_MESSAGE_BYTES),
            ],
            Event::SteerDelivered { id, .. } => vec![("id", id, MAX_STEER_ID_BYTES)],
            _ => Vec::new(),
        };
        match limited
            .into_iter()
            .find(|(_, value, limit)| value.len() > *limit)
        {
            Some((field, value, limit)) => Err(TextTooLong {
                event,
                field,
                bytes: value.len(),
                limit,
            }),
            None => Ok(()),
        }
    }

    /// The process identity this event records, if any (`RunnerStarted`'s runner,
    /// `StepRunning`'s process, `HookAttempted`'s claimant).
    pub fn process_identity(&self) -> Option<&ProcessIdentity> {
        match self {
            Event::RunnerStarted { runner, .. } => Some(runner),
            Event::StepRunning { process, .. } => process.as_ref(),
            Event::HookAttempted { claimant, .. } => Some(claimant),
            _ => None,
        }
    }

    /// [`Event::process_identity`], to give back what a format without it left out (the PID
    /// namespace).
    pub(crate) fn process_identity_mut(&mut self) -> Option<&mut ProcessIdentity> {
        match self {
            Event::RunnerStarted { runner, .. } => Some(runner),
            Event::StepRunning { process, .. } => process.as_mut(),
            Event::HookAttempted { claimant, .. } => Some(claimant),
            _ => None,
        }
    }

    /// Checks what an append checks of the event alone: a `RunCreated`'s spec
    /// ([`RunSpec::check`]) and every text's limit ([`Event::check_text_limits`]).
    pub fn check_shape(&self) -> Result<(), DecodeError> {
        if let Event::RunCreated { spec, .. } = self {
            spec.check().map_err(|error| DecodeError::Invalid {
                reason: error.to_string(),
            })?;
        }
        if let Event::QueueJoined { queue, .. } = self {
            check_queue_name(queue).map_err(|error| DecodeError::Invalid {
                reason: error.to_string(),
            })?;
        }
        if let Event::DependsOn {
            after, after_any, ..
        } = self
            && let Some(flaw) = dependencies_flaw(after, after_any)
        {
            return Err(DecodeError::Invalid {
                reason: format!("dependencies {flaw}"),
            });
        }
        if let Event::UniqueKey { key, .. } = self
            && let Some(flaw) = unique_key_flaw(key)
        {
            return Err(DecodeError::Invalid {
                reason: format!("a unique key {flaw}"),
            });
        }
        if let Event::RetryPolicy {
            retries,
            backoff_ms,
            backoff_max_ms,
            ..
        } = self
            && let Some(flaw) = retry_policy_flaw(*retries, *backoff_ms, *backoff_max_ms)
        {
            return Err(DecodeError::Invalid {
                reason: format!("a retry policy: {flaw}"),
            });
        }
        if let Event::SteerRequested {
            id, steps, message, ..
        } = self
            && let Some(flaw) = steer_request_flaw(id, steps, message)
        {
            return Err(DecodeError::Invalid {
                reason: format!("a steer request {flaw}"),
            });
        }
        self.check_text_limits()
            .map_err(|error| DecodeError::Invalid {
                reason: error.to_string(),
            })
    }

    /// The event's name as written in logs and in events.jsonl.
    pub fn name(&self) -> &'static str {
        match self {
            Event::RunCreated { .. } => "RunCreated",
            Event::RunnerStarted { .. } => "RunnerStarted",
            Event::StepRunning { .. } => "StepRunning",
            Event::ExternalJobUpdated { .. } => "ExternalJobUpdated",
            Event::StepFinished { .. } => "StepFinished",
            Event::ControlRequested { .. } => "ControlRequested",
            Event::Terminal { .. } => "Terminal",
            Event::ProcessTerminalObserved { .. } => "ProcessTerminalObserved",
            Event::Dismissed { .. } => "Dismissed",
            Event::Resumed { .. } => "Resumed",
            Event::QueueJoined { .. } => "QueueJoined",
            Event::QueueAdmitted { .. } => "QueueAdmitted",
            Event::HookAttempted { .. } => "HookAttempted",
            Event::HookEnded { .. } => "HookEnded",
            Event::SteerRequested { .. } => "SteerRequested",
            Event::SteerDelivered { .. } => "SteerDelivered",
            Event::ControlRefused { .. } => "ControlRefused",
            Event::HostEnded { .. } => "HostEnded",
            Event::DependsOn { .. } => "DependsOn",
            Event::DependenciesMet { .. } => "DependenciesMet",
            Event::StartDelayed { .. } => "StartDelayed",
            Event::DelayEnded { .. } => "DelayEnded",
            Event::UniqueKey { .. } => "UniqueKey",
            Event::RetryPolicy { .. } => "RetryPolicy",
            Event::AttemptEnded { .. } => "AttemptEnded",
            Event::StepStopRequested { .. } => "StepStopRequested",
        }
    }
}

/// An event in its envelope, as stored in the journal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordEnvelope {
    pub format_version: u16,
    pub run_id: RunId,
    /// Position in the run: 1 for `RunCreated`, then rising by exactly one.
    pub seq: u64,
    pub time_ms: UnixMs,
    pub writer: WriterId,
    pub writer_seq: u64,
    pub event: Event,
}

/// A record as the rest of the crate uses it.
pub type Record = RecordEnvelope;

/// Why a stored record could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    #[error("record is empty")]
    Empty,
    #[error(
        "record was written in format version {found}; this build reads version {FORMAT_VERSION} only (upgrade runjournal)"
    )]
    UnknownFormat { found: u16 },
    #[error("record fails its checksum (the stored bytes were damaged)")]
    Checksum,
    #[error("record does not decode: {reason}")]
    Malformed { reason: String },
    #[error("record has {count} bytes after its checksum")]
    TrailingBytes { count: usize },
    #[error("stored value is {bytes} bytes, over the limit of {limit}")]
    TooLarge { bytes: usize, limit: usize },
    /// It decodes, but holds an event no append would have accepted (a spec that fails
    /// [`RunSpec::check`], a text over its limit): a forged or damaged record, never acted on.
    #[error("record holds an event no run accepts: {reason}")]
    Invalid { reason: String },
}

/// Why a record could not be encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EncodeError {
    #[error("record of {event} is {bytes} bytes, over the limit of {MAX_RECORD_BYTES}")]
    TooLarge { event: &'static str, bytes: usize },
    #[error("record does not encode: {reason}")]
    Serialize { reason: String },
}

/// Encodes a value with the record checksum appended.
pub(crate) fn encode_checked<T: Serialize>(value: &T) -> Result<Vec<u8>, postcard::Error> {
    postcard::to_allocvec_crc32(value, CRC.digest())
}

/// Decodes a value written by [`encode_checked`] of at most `limit` bytes, after checking its
/// leading format version.
pub(crate) fn decode_checked<'a, T: Deserialize<'a>>(
    bytes: &'a [u8],
    limit: usize,
) -> Result<T, DecodeError> {
    if bytes.is_empty() {
        return Err(DecodeError::Empty);
    }
    if bytes.len() > limit {
        return Err(DecodeError::TooLarge {
            bytes: bytes.len(),
            limit,
        });
    }
    match postcard::take_from_bytes::<u16>(bytes) {
        Ok((FORMAT_VERSION, _)) => {}
        Ok((found, _)) => return Err(DecodeError::UnknownFormat { found }),
        Err(error) => {
            return Err(DecodeError::Malformed {
                reason: error.to_string(),
            });
        }
    }
    match postcard::take_from_bytes_crc32::<T>(bytes, CRC.digest()) {
        Ok((value, [])) => Ok(value),
        Ok((_, rest)) => Err(DecodeError::TrailingBytes { count: rest.len() }),
        Err(postcard::Error::DeserializeBadCrc) => Err(DecodeError::Checksum),
        Err(error) => Err(DecodeError::Malformed {
            reason: error.to_string(),
        }),
    }
}

/// Splits bytes written by [`encode_checked`] into what the checksum covers and whether their
/// trailing CRC-32C matches it, decoding nothing; `None` for bytes shorter than a checksum.
pub(crate) fn split_checksum(bytes: &[u8]) -> Option<(&[u8], bool)> {
    let split = bytes.len().checked_sub(4)?;
    let (payload, stored) = bytes.split_at(split);
    Some((payload, CRC.checksum(payload).to_le_bytes() == stored))
}

/// Appends the CRC-32C of `bytes` to them, as [`encode_checked`] lays out what it encodes.
pub(crate) fn push_checksum(bytes: &mut Vec<u8>) {
    let checksum = CRC.checksum(bytes);
    bytes.extend_from_slice(&checksum.to_le_bytes());
}

/// `payload` followed by its CRC-32C, as [`push_checksum`] lays it out in place: for the tests
/// and fuzz targets that forge stored bytes.
#[cfg(any(test, feature = "testkit", feature = "fuzz"))]
pub(crate) fn with_checksum(payload: &[u8]) -> Vec<u8> {
    let mut bytes = payload.to_vec();
    bytes.extend_from_slice(&CRC.checksum(payload).to_le_bytes());
    bytes
}

/// What a record's buffer starts with: most records are smaller, so it is seldom grown.
const RECORD_ENCODE_CAPACITY: usize = 256;

/// What follows a record's event when the process identity it records has a PID namespace
/// (the extension of format 1 at its end): `varint pid_namespace`. A record without it is
/// byte for byte a record of the first release.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct RecordTrailer {
    pid_namespace: u64,
}

impl RecordEnvelope {
    /// The stored bytes of this record: postcard, then — only when the event records a
    /// process identity with a PID namespace — that namespace as a varint, then a CRC-32C of
    /// everything before it.
    pub fn encode(&self) -> Result<Vec<u8>, EncodeError> {
        let serialize_error = |error: postcard::Error| EncodeError::Serialize {
            reason: error.to_string(),
        };
        let namespace = self
            .event
            .process_identity()
            .and_then(|identity| identity.pid_namespace);
        // Into one buffer sized for most records, the checksum taken over it whole at the end:
        // the same bytes as `encode_checked`'s, which feeds its checksum a byte at a time.
        let mut bytes = Vec::with_capacity(RECORD_ENCODE_CAPACITY);
        bytes = postcard::to_extend(self, bytes).map_err(serialize_error)?;
        if let Some(pid_namespace) = namespace {
            bytes = postcard::to_extend(&RecordTrailer { pid_namespace }, bytes)
                .map_err(serialize_error)?;
        }
        push_checksum(&mut bytes);
        if bytes.len() > MAX_RECORD_BYTES {
            return Err(EncodeError::TooLarge {
                event: self.event.name(),
                bytes: bytes.len(),
            });
        }
        Ok(bytes)
    }

    /// Decodes stored bytes, verifying the format version and the checksum, then the event as
    /// an append would (a run's spec by [`RunSpec::check`], every text by its limit): what
    /// comes from disk is checked like input. A record of the first release decodes as it
    /// always did (its identities without a PID namespace); one with a trailer after its event
    /// gets the trailer's namespace in its identity.
    pub fn decode(bytes: &[u8]) -> Result<RecordEnvelope, DecodeError> {
        let record = match decode_checked(bytes, MAX_RECORD_BYTES) {
            // The checksum is read right after the event: a trailer sits there instead.
            Err(DecodeError::Checksum) => Self::decode_with_trailer(bytes),
            decoded => decoded,
        }?;
        record.event.check_shape()?;
        Ok(record)
    }

    fn decode_with_trailer(bytes: &[u8]) -> Result<RecordEnvelope, DecodeError> {
        let malformed = |reason: String| DecodeError::Malformed { reason };
        let (payload, is_intact) = split_checksum(bytes).ok_or(DecodeError::Checksum)?;
        if !is_intact {
            return Err(DecodeError::Checksum);
        }
        let (mut record, rest) = postcard::take_from_bytes::<RecordEnvelope>(payload)
            .map_err(|error| malformed(error.to_string()))?;
        let (trailer, rest) = postcard::take_from_bytes::<RecordTrailer>(rest)
            .map_err(|error| malformed(format!("its trailer does not decode: {error}")))?;
        if !rest.is_empty() {
            return Err(malformed(format!("{} bytes after its trailer", rest.len())));
        }
        let event = record.event.name();
        let identity = record.event.process_identity_mut().ok_or_else(|| {
            malformed(format!(
                "a PID namespace after {event}, which records no process"
            ))
        })?;
        identity.pid_namespace = Some(trailer.pid_namespace);
        Ok(record)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn identity() -> ProcessIdentity {
        ProcessIdentity {
            pid: 4242,
            start_time: 987_654,
            boot_id: "b".to_string(),
            pid_namespace: None,
        }
    }

    fn record(event: Event) -> RecordEnvelope {
        RecordEnvelope {
            format_version: FORMAT_VERSION,
            run_id: RunId::from_bytes([1; 16]),
            seq: 3,
            time_ms: 1_700_000_000_000,
            writer: WriterId(0x0102_0304_0506_0708),
            writer_seq: 9,
            event,
        }
    }

    /// One record of every variant, each with its fields filled so every field is encoded.
    pub(crate) fn every_variant() -> Vec<(&'static str, Event)> {
        vec![
            (
                "RunCreated",
                Event::RunCreated {
                    spec: Arc::new(RunSpec {
                        name: Some("n".to_string()),
                        mode: Mode::Chain,
                        concurrency: 2,
                        timeout_ms: Some(1000),
                        cwd: Some("/".to_string()),
                        steps: vec![
                            StepSpec {
                                name: "a".to_string(),
                                action: StepAction::Command {
                                    argv: vec!["x".to_string()],
                                },
                            },
                            StepSpec {
                                name: "b".to_string(),
                                action: StepAction::Shell {
                                    script: "s".to_string(),
                                },
                            },
                            StepSpec {
                                name: "c".to_string(),
                                action: StepAction::ExternalJob {
                                    provider: "p".to_string(),
                                },
                            },
                        ],
                    }),
                    created_at_ms: 5,
                    session_id: Some("s".to_string()),
                    completion_owner_id: Some("o".to_string()),
                    tool_call_id: Some("t".to_string()),
                },
            ),
            (
                "RunnerStarted",
                Event::RunnerStarted {
                    runner: identity(),
                    instance_id: "i".to_string(),
                },
            ),
            (
                "StepRunning",
                Event::StepRunning {
                    step: 1,
                    process: Some(identity()),
                },
            ),
            (
                "ExternalJobUpdated",
                Event::ExternalJobUpdated {
                    step: 2,
                    job: ExternalJobStatus {
                        state: JobState::Running,
                        id: Some("j".to_string()),
                        progress: Some(0.5),
                        message: Some("m".to_string()),
                        url: Some("u".to_string()),
                    },
                },
            ),
            (
                "StepFinished",
                Event::StepFinished {
                    step: 1,
                    outcome: StepOutcome {
                        end: StepEnd::Failed,
                        exit_code: Some(-1),
                        error: Some("e".to_string()),
                    },
                },
            ),
            (
                "ControlRequested",
                Event::ControlRequested {
                    action: ControlAction::Timeout,
                    by: "b".to_string(),
                    reason: "r".to_string(),
                },
            ),
            (
                "Terminal",
                Event::Terminal {
                    state: TerminalState::Stopped,
                    error: Some("e".to_string()),
                    summary: "s".to_string(),
                    exit_code: 143,
                    repaired_by: Some(Repairer::Reconciler),
                },
            ),
            (
                "ProcessTerminalObserved",
                Event::ProcessTerminalObserved {
                    instance_id: "i".to_string(),
                    exit: Some(ProcessExit {
                        code: None,
                        signal: Some(9),
                    }),
                    proof: Proof::Unknown,
                    observer: Observer::Reconciler,
                },
            ),
            ("Dismissed", Event::Dismissed { at_ms: 7 }),
            (
                "Resumed",
                Event::Resumed {
                    from: RunId::from_bytes([2; 16]),
                },
            ),
            (
                "QueueJoined",
                Event::QueueJoined {
                    queue: "q".to_string(),
                    idle_timeout_ms: Some(5),
                    heartbeat_ms: Some(6),
                },
            ),
            (
                "QueueAdmitted",
                Event::QueueAdmitted {
                    by: "b".to_string(),
                },
            ),
            (
                "HookAttempted",
                Event::HookAttempted {
                    hook: 1,
                    attempt: 2,
                    claimant: identity(),
                    by: "b".to_string(),
                    lease_ms: 60_000,
                },
            ),
            (
                "HookEnded",
                Event::HookEnded {
                    hook: 1,
                    attempt: 2,
                    outcome: HookOutcome::Failed {
                        exit: ProcessExit {
                            code: Some(3),
                            signal: None,
                        },
                    },
                    retry_at_ms: Some(7),
                },
            ),
            (
                "SteerRequested",
                Event::SteerRequested {
                    id: "i".to_string(),
                    steps: vec![0, 2],
                    mode: SteerMode::FollowUp,
                    message: "m".to_string(),
                    source: "s".to_string(),
                },
            ),
            (
                "SteerDelivered",
                Event::SteerDelivered {
                    id: "i".to_string(),
                    step: 2,
                },
            ),
            (
                "ControlRefused",
                Event::ControlRefused {
                    file: "f".to_string(),
                    reason: "r".to_string(),
                },
            ),
            (
                "HostEnded",
                Event::HostEnded {
                    state: TerminalState::Failed,
                    exit_code: 1,
                    message: "m".to_string(),
                    ended_at_ms: 8,
                    result_path: Some("p".to_string()),
                },
            ),
            (
                "DependsOn",
                Event::DependsOn {
                    after: vec![RunId::from_bytes([2; 16])],
                    after_any: vec![RunId::from_bytes([3; 16])],
                    idle_timeout_ms: Some(5),
                    heartbeat_ms: None,
                },
            ),
            (
                "DependenciesMet",
                Event::DependenciesMet {
                    by: "b".to_string(),
                },
            ),
            (
                "StartDelayed",
                Event::StartDelayed {
                    due_at_ms: 9,
                    idle_timeout_ms: Some(5),
                    heartbeat_ms: None,
                },
            ),
            (
                "DelayEnded",
                Event::DelayEnded {
                    by: "b".to_string(),
                },
            ),
            (
                "UniqueKey",
                Event::UniqueKey {
                    key: "k".to_string(),
                    hold_ms: Some(7),
                },
            ),
            (
                "RetryPolicy",
                Event::RetryPolicy {
                    retries: 2,
                    backoff_ms: 3,
                    backoff_max_ms: 4,
                    on: RetryOn {
                        exit: true,
                        crash: false,
                        timeout: true,
                        exit_codes: vec![5],
                    },
                    idle_timeout_ms: None,
                    heartbeat_ms: Some(6),
                },
            ),
            (
                "AttemptEnded",
                Event::AttemptEnded {
                    attempt: 1,
                    cause: AttemptCause::Crash,
                    error: None,
                    summary: "s".to_string(),
                    exit_code: 1,
                    retry_at_ms: 9,
                },
            ),
            (
                "StepStopRequested",
                Event::StepStopRequested {
                    step: 1,
                    by: "b".to_string(),
                    reason: "r".to_string(),
                },
            ),
        ]
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Pins the encoding of every variant: a change to the wire format fails here. Each record
    /// shares the envelope `01` (version 1), sixteen `01` (run id), `03` (seq),
    /// `80d095ffbc31` (time), `888e98a8c0e0808101` (writer), `09` (writer seq); then come the
    /// variant index, its fields and the CRC-32C.
    #[test]
    fn golden_bytes_of_every_variant() {
        const ENVELOPE: &str =
            "01010101010101010101010101010101010380d095ffbc31888e98a8c0e080810109";
        let golden: &[(&str, &str)] = &[
            (
                "RunCreated",
                "0001016e010201e80701012f03016100010178016201017301630201700501017301016f01017466628170",
            ),
            ("RunnerStarted", "01922186a43c01620169f38ce3c7"),
            ("StepRunning", "020101922186a43c0162f2506e8b"),
            (
                "ExternalJobUpdated",
                "03020101016a01000000000000e03f01016d010175efaeb3dc",
            ),
            ("StepFinished", "0401010101010165c30111e4"),
            ("ControlRequested", "05010162017223eabf76"),
            ("Terminal", "060201016501739e020100ae189f7a"),
            ("ProcessTerminalObserved", "070169010001120102a5049a1f"),
            ("Dismissed", "08078310debb"),
            ("Resumed", "0902020202020202020202020202020202aeffd00f"),
            ("QueueJoined", "0a017101050106d89f95bc"),
            ("QueueAdmitted", "0b016219377cc0"),
            ("HookAttempted", "0c0102922186a43c01620162e0d403de19dd20"),
            ("HookEnded", "0d010201010600010762cc91d0"),
            ("SteerRequested", "0e016902000201016d0173710ed7e7"),
            ("SteerDelivered", "0f016902e019bb09"),
            ("ControlRefused", "10016601729bf292bb"),
            ("HostEnded", "110102016d08010170cdd6eff8"),
            (
                "DependsOn",
                "1201020202020202020202020202020202020103030303030303030303030303030303010500794e7444",
            ),
            ("DependenciesMet", "13016256748f88"),
            ("StartDelayed", "14090105004f756b21"),
            ("DelayEnded", "15016241823e59"),
            ("UniqueKey", "16016b0107c3db526c"),
            ("RetryPolicy", "17020304010001010a000106e3bd24e9"),
            ("AttemptEnded", "18010100017302090d41de3a"),
            ("StepStopRequested", "19010162017275f54064"),
        ];
        let variants = every_variant();
        assert_eq!(
            variants.len(),
            golden.len(),
            "every variant has golden bytes"
        );
        let mut mismatches = Vec::new();
        for ((name, event), (golden_name, golden_hex)) in variants.into_iter().zip(golden) {
            assert_eq!(name, *golden_name);
            let bytes = record(event).encode().expect("a small record encodes");
            let actual = hex(&bytes);
            match actual.strip_prefix(ENVELOPE) {
                Some(rest) if rest == *golden_hex => {}
                _ => mismatches.push(format!("{name}: {actual}")),
            }
        }
        assert!(
            mismatches.is_empty(),
            "encodings changed:\n{}",
            mismatches.join("\n")
        );
    }

    /// Pins the encoding of the two events that record a process, with its PID namespace: the
    /// bytes of format 1 (as above), then the namespace as a varint (4026531836, Linux's
    /// initial PID namespace, is `fcffffff0e`), then the CRC-32C of everything before.
    #[test]
    fn golden_bytes_of_identities_with_a_pid_namespace() {
        const ENVELOPE: &str =
            "01010101010101010101010101010101010380d095ffbc31888e98a8c0e080810109";
        let with_namespace = ProcessIdentity {
            pid_namespace: Some(4_026_531_836),
            ..identity()
        };
        let golden: &[(Event, &str)] = &[
            (
                Event::RunnerStarted {
                    runner: with_namespace.clone(),
                    instance_id: "i".to_string(),
                },
                "01922186a43c01620169fcffffff0ec189a978",
            ),
            (
                Event::StepRunning {
                    step: 1,
                    process: Some(with_namespace),
                },
                "020101922186a43c0162fcffffff0e1f88dc79",
            ),
        ];
        let mut mismatches = Vec::new();
        for (event, golden_hex) in golden {
            let original = record(event.clone());
            let bytes = original.encode().expect("a small record encodes");
            let actual = hex(&bytes);
            match actual.strip_prefix(ENVELOPE) {
                Some(rest) if rest == *golden_hex => {}
                _ => mismatches.push(format!("{}: {actual}", event.name())),
            }
            assert_eq!(RecordEnvelope::decode(&bytes), Ok(original.clone()));
            // Without the trailer, the same record is one of the first release.
            let mut without = original.clone();
            if let Some(identity) = without.event.process_identity_mut() {
                identity.pid_namespace = None;
            }
            let first_release = without.encode().expect("encodes");
            assert_eq!(
                bytes.len(),
                first_release.len() + 5,
                "the namespace is 5 varint bytes after the event"
            );
            assert_eq!(
                bytes[..first_release.len() - 4],
                first_release[..first_release.len() - 4],
                "the bytes of format 1 come first"
            );
        }
        assert!(
            mismatches.is_empty(),
            "encodings changed:\n{}",
            mismatches.join("\n")
        );
    }

    #[test]
    fn a_pid_namespace_after_an_event_without_a_process_is_refused() {
        let plain = record(Event::Dismissed { at_ms: 7 })
            .encode()
            .expect("encodes");
        let mut payload = plain[..plain.len() - 4].to_vec();
        payload
            .extend(postcard::to_allocvec(&RecordTrailer { pid_namespace: 9 }).expect("encodes"));
        let forged = with_checksum(&payload);
        assert!(
            matches!(
                RecordEnvelope::decode(&forged),
                Err(DecodeError::Malformed { reason }) if reason.contains("records no process")
            ),
            "{:?}",
            RecordEnvelope::decode(&forged)
        );
        let none_process = record(Event::StepRunning {
            step: 0,
            process: None,
        })
        .encode()
        .expect("encodes");
        let mut payload = none_process[..none_process.len() - 4].to_vec();
        payload
            .extend(postcard::to_allocvec(&RecordTrailer { pid_namespace: 9 }).expect("encodes"));
        assert!(matches!(
            RecordEnvelope::decode(&with_checksum(&payload)),
            Err(DecodeError::Malformed { .. })
        ));
    }

    #[test]
    fn an_identity_as_json_carries_its_namespace_only_when_known() {
        let known = ProcessIdentity {
            pid_namespace: Some(7),
            ..identity()
        };
        let text = serde_json::to_string(&known).expect("serializes");
        assert_eq!(
            text,
            r#"{"pid":4242,"startTime":987654,"bootId":"b","pidNamespace":7}"#
        );
        assert_eq!(
            serde_json::from_str::<ProcessIdentity>(&text).expect("parses"),
            known
        );
        let unknown = identity();
        let text = serde_json::to_string(&unknown).expect("serializes");
        assert_eq!(text, r#"{"pid":4242,"startTime":987654,"bootId":"b"}"#);
        assert_eq!(
            serde_json::from_str::<ProcessIdentity>(&text).expect("parses"),
            unknown
        );
    }

    #[test]
    fn every_variant_round_trips() {
        for (name, event) in every_variant() {
            let original = record(event);
            let bytes = original.encode().expect("a small record encodes");
            let decoded = RecordEnvelope::decode(&bytes).expect(name);
            assert_eq!(decoded, original, "{name}");
        }
    }

    #[test]
    fn a_flipped_byte_fails_the_checksum() {
        let bytes = record(Event::Dismissed { at_ms: 7 })
            .encode()
            .expect("a small record encodes");
        for position in 1..bytes.len() {
            let mut damaged = bytes.clone();
            damaged[position] ^= 0x40;
            let result = RecordEnvelope::decode(&damaged);
            assert!(
                matches!(
                    result,
                    Err(DecodeError::Checksum | DecodeError::Malformed { .. })
                ),
                "byte {position}: {result:?}"
            );
        }
    }

    #[test]
    fn a_newer_format_version_is_refused_before_decoding() {
        let mut newer = record(Event::Dismissed { at_ms: 7 });
        newer.format_version = 2;
        let bytes = encode_checked(&newer).expect("encodes");
        assert_eq!(
            RecordEnvelope::decode(&bytes),
            Err(DecodeError::UnknownFormat { found: 2 })
        );
    }

    #[test]
    fn trailing_bytes_are_refused() {
        let mut bytes = record(Event::Dismissed { at_ms: 7 })
            .encode()
            .expect("encodes");
        bytes.push(0);
        assert_eq!(
            RecordEnvelope::decode(&bytes),
            Err(DecodeError::TrailingBytes { count: 1 })
        );
    }

    #[test]
    fn run_ids_are_time_ordered_and_round_trip() {
        let first = RunId::generate();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let second = RunId::generate();
        assert!(first < second);
        assert!(first.to_string() < second.to_string());
        let parsed: RunId = first
            .to_string()
            .to_ascii_lowercase()
            .parse()
            .expect("parses");
        assert_eq!(parsed, first);
    }

    #[test]
    fn prefix_range_covers_exactly_the_ids_with_that_prefix() {
        let id = RunId::generate();
        let text = id.to_string();
        let (low, high) = RunId::prefix_range(&text[..10]).expect("valid prefix");
        assert!(low <= id && id <= high);
        assert!(low.to_string().starts_with(&text[..10]));
        assert!(high.to_string().starts_with(&text[..10]));
    }

    #[test]
    fn bad_run_id_text_is_refused() {
        assert!(matches!(
            RunId::prefix_range("01ARZ3N"),
            Err(RunIdError::PrefixTooShort { .. })
        ));
        assert!(matches!(
            RunId::prefix_range("../../etc"),
            Err(RunIdError::BadCharacter { bad: '.', .. })
        ));
        assert!(matches!(
            "01ARZ3NDEKTSV4RRFFQ69G5FAVX".parse::<RunId>(),
            Err(RunIdError::TooLong { .. })
        ));
        assert!(matches!(
            "81ARZ3NDEKTSV4RRFFQ69G5FAV".parse::<RunId>(),
            Err(RunIdError::Overflow { .. })
        ));
        assert!(matches!(
            "01ARZ3NDEKTSV4RRFFQ69G5FAU".parse::<RunId>(),
            Err(RunIdError::BadCharacter { bad: 'U', .. })
        ));
    }
}
