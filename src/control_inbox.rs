//! A run's control inbox: the files a host drops into `<run dir>/control/` to drive the run,
//! as pi-subagents' own control channel writes them — `stop-requests/*.json` (and the older
//! `stop.json`), `interrupt.json`, `timeout.json` and `steer-requests/*.json` — read as input
//! and turned into the journal's requests (docs/design.md, "Control and steering").
//!
//! Whoever takes the inbox (the run's runner, a reconcile pass for a run without a live runner,
//! a resume for its paused run) does it in three moves: [`scan`] reads each request file,
//! checked like any input; [`decide`] says what to journal for it, from the run's state; once
//! that is durable, [`settle`] removes the file (a request taken) or moves it aside into
//! `control/refused/` (a file refused). So a request is journaled before it is acted on, and a
//! taker killed between the record and the removal leaves a file that the next taker finds
//! already recorded ([`Decision::AlreadyTaken`]): it is acted on once.
//!
//! A host may write a request file in place (a shell's `>`): the file exists, empty or half
//! written, before it is whole. A file that is not JSON is therefore taken for a request not
//! yet whole, left where it is and looked at again ([`Settling`]), until it parses or has stayed
//! unchanged for [`SETTLE_MS`]; only then is it refused.
//!
//! The other end of steering lives here too, as the one rule of runner and reconciler: a
//! step's inbox holds each message as [`step_message_file_name`], and what a step took after
//! its runner died is judged by the runner's notes ([`steers_taken_without_runner`]).
//!
//! Invariants:
//! * a file is refused as not JSON only once it has stayed unchanged for [`SETTLE_MS`]: a
//!   request being written is never refused for being half written;
//! * nothing under the inbox is followed: the directories are opened without following a link
//!   and checked to be this user's directories, each file is opened relative to its directory
//!   without following a link, and checked on the open file (a regular file of this user, no
//!   larger than [`MAX_REQUEST_FILE_BYTES`]) before a byte of it is read;
//! * a file that is not a request a run takes is refused with its reason and moved aside,
//!   never read again; at most [`MAX_REFUSED_KEPT`] are kept aside, the rest removed;
//! * nothing here writes to the journal: the taker appends what [`decide`] says.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::io::{self, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::time::{Duration, Instant};

use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::Mode;
use serde_json::Value;

use crate::durable_fs::FileStamp;
use crate::event::{
    ControlAction, Event, MAX_STEER_ID_BYTES, MAX_TEXT_BYTES, RunId, SteerMode, TerminalState,
    UnixMs, truncate_text,
};
use crate::home::Home;
use crate::journal::{AppendError, Appended, Condition, ReadError};
use crate::state::{RunState, RunStatus, SteerDelivery, StepStatus, TransitionError};

/// The largest request file read: a steer message is at most 128 KiB of UTF-8, which JSON may
/// write several times longer when it escapes it.
pub const MAX_REQUEST_FILE_BYTES: u64 = 1 << 20;

/// Most refused files kept in `control/refused/`: past them a refused file is removed, so a
/// host that keeps writing bad requests cannot fill the disk.
pub const MAX_REFUSED_KEPT: usize = 64;

/// How long a request file that is not JSON must stay unchanged before it is refused. A host
/// that writes in place makes the file before it writes it, so a taker can find it empty or
/// half written; until then it is left where it is, and looked at again.
pub const SETTLE_MS: u64 = 2_000;

/// The exit code of a run stopped before a runner took it: as a runner ends a stopped run,
/// 128 + SIGTERM.
pub const STOPPED_EXIT_CODE: i32 = 128 + 15;

/// Where a request file sits in the inbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Place {
    /// `control/` itself (`interrupt.json`, `timeout.json`, `stop.json`); a found entry named
    /// `control` is the inbox directory itself, refused whole.
    Inbox,
    StopRequests,
    SteerRequests,
}

impl Place {
    fn dir_name(self) -> Option<&'static str> {
        match self {
            Place::Inbox => None,
            Place::StopRequests => Some("stop-requests"),
            Place::SteerRequests => Some("steer-requests"),
        }
    }
}

/// What a host asked, as the file says it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// A stop, an interrupt or a timeout of the whole run; `by` and `reason` say who asked,
    /// as far as the file says, why and when.
    Control {
        action: ControlAction,
        by: String,
        reason: String,
    },
    /// A stop of one step (pi-subagents' stop with a `targetIndex`).
    StepStop {
        step: u32,
        by: String,
        reason: String,
    },
    /// A message for steps of the run: `steps`, or (`None`) those the run is at.
    Steer {
        id: String,
        steps: Option<Vec<u32>>,
        mode: SteerMode,
        message: String,
        source: String,
    },
}

/// One entry of the inbox, read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub place: Place,
    /// Its name in its directory.
    pub name: OsString,
    /// The request, or why the entry is refused.
    pub request: Result<Request, String>,
}

impl Found {
    /// Its path under the run's directory, as journaled (`control/stop-requests/x.json`).
    pub fn file(&self) -> String {
        let name = self.name.to_string_lossy();
        match (self.place, self.place.dir_name()) {
            (Place::Inbox, _) if self.name == "control" => "control".to_string(),
            (_, Some(dir)) => format!("control/{dir}/{name}"),
            (_, None) => format!("control/{name}"),
        }
    }
}

/// Makes the run's inbox and its request directories (0700) if they are missing, so that a
/// host writes into directories of runjournal's making. A failure is only a later look's
/// loss: the inbox is read as it is found.
pub fn prepare(home: &Home, run: RunId) {
    for dir in [home.stop_requests_dir(run), home.steer_requests_dir(run)] {
        let _ = crate::durable_fs::make_dirs(&dir);
    }
}

/// Opens `name` under `dir` (the run's directory when `None`) as a directory of this user
/// without following a link. `Ok(None)` when it does not exist; `Err(reason)` when it is
/// something else.
fn open_dir(parent: &OwnedFd, name: &OsStr) -> Result<Option<OwnedFd>, String> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd = match nix::fcntl::openat(parent, name, flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(nix::errno::Errno::ENOENT) => return Ok(None),
        Err(nix::errno::Errno::ELOOP | nix::errno::Errno::ENOTDIR) => {
            return Err(
                "it is not a directory (a link or a file), and is not followed".to_string(),
            );
        }
        Err(error) => return Err(format!("it cannot be opened: {error}")),
    };
    let stat = nix::sys::stat::fstat(&fd).map_err(|error| format!("it cannot be read: {error}"))?;
    let euid = crate::durable_fs::effective_uid();
    if stat.st_uid != euid {
        return Err(format!(
            "it belongs to uid {}, not to uid {euid}",
            stat.st_uid
        ));
    }
    Ok(Some(fd))
}

/// What a taker remembers, from one look at an inbox to the next, of the files it found not
/// yet whole: each one's state as last seen, and since when it has seen it so. A file is
/// settled once its last change is [`SETTLE_MS`] old by the clock, or once this taker has seen
/// it unchanged that long on its own monotonic clock (which a clock set back cannot fool).
/// A taker that looks once (a reconcile pass) starts with an empty one.
#[derive(Debug, Default)]
pub struct Settling {
    seen: HashMap<(Place, OsString), (Option<FileStamp>, Instant)>,
}

impl Settling {
    /// How many files the last look left where they were, not yet whole.
    pub fn waiting(&self) -> usize {
        self.seen.len()
    }

    /// The files the last look left, by their paths under the run's directory.
    pub fn waiting_files(&self) -> Vec<String> {
        let mut files: Vec<String> = self
            .seen
            .keys()
            .map(|(place, name)| {
                Found {
                    place: *place,
                    name: name.clone(),
                    request: Err(String::new()),
                }
                .file()
            })
            .collect();
        files.sort();
        files
    }
}

/// One look at an inbox: when it is made, and what the taker remembers from its last look.
struct Look<'a> {
    now_ms: UnixMs,
    now: Instant,
    before: &'a Settling,
    after: Settling,
}

impl Look<'_> {
    /// Whether a file that is not JSON, in `state` now (`None`: it changed while it was
    /// read), is settled: unchanged for [`SETTLE_MS`], by its own times or by what this taker
    /// saw of it. One that is not is remembered for the next look.
    fn is_settled(&mut self, place: Place, name: &OsStr, state: Option<FileStamp>) -> bool {
        let key = (place, name.to_os_string());
        let Some(state) = state else {
            // Being written: its wait starts again, remembered as no state a later look finds.
            self.after.seen.insert(key, (None, self.now));
            return false;
        };
        let settle = Duration::from_millis(SETTLE_MS);
        let age_ms = i128::from(self.now_ms) - state.modified_ms();
        let since = match self.before.seen.get(&key) {
            Some((Some(seen), since)) if *seen == state => *since,
            _ => self.now,
        };
        if age_ms >= i128::from(SETTLE_MS) || self.now.saturating_duration_since(since) >= settle {
            return true;
        }
        self.after.seen.insert(key, (Some(state), since));
        false
    }
}

/// Every request of the run's inbox, read and checked, in the order a taker acts on them:
/// stops, then the timeout, then the interrupt, then steer requests by name (pi-subagents
/// names them by their time). Entries whose name does not end in `.json`, and those starting
/// with a `.` (a host's file being written), are left alone, as pi-subagents leaves them, and
/// so is a file not yet whole (not JSON, and changed within [`SETTLE_MS`]): `settling` holds
/// those for the next look. A failure to read the run's directory finds nothing: the next
/// look tries again.
pub fn scan(home: &Home, run: RunId, settling: &mut Settling) -> Vec<Found> {
    scan_at(home, run, settling, crate::event::now_ms(), Instant::now())
}

/// [`scan`] as of a given time: `now_ms` on the clock, `now` on the monotonic one.
fn scan_at(
    home: &Home,
    run: RunId,
    settling: &mut Settling,
    now_ms: UnixMs,
    now: Instant,
) -> Vec<Found> {
    let mut look = Look {
        now_ms,
        now,
        before: settling,
        after: Settling::default(),
    };
    let found = scan_with(home, run, &mut look);
    *settling = look.after;
    found
}

fn scan_with(home: &Home, run: RunId, look: &mut Look<'_>) -> Vec<Found> {
    let Ok(run_dir) = crate::durable_fs::open_dir(&home.run_dir(run)) else {
        return Vec::new();
    };
    let control = match open_dir(&run_dir, OsStr::new("control")) {
        Ok(Some(control)) => control,
        Ok(None) => return Vec::new(),
        Err(reason) => {
            return vec![Found {
                place: Place::Inbox,
                name: OsString::from("control"),
                request: Err(format!("the control inbox is refused: {reason}")),
            }];
        }
    };
    let mut found = Vec::new();
    for place in [Place::StopRequests, Place::SteerRequests] {
        let Some(dir_name) = place.dir_name() else {
            continue;
        };
        match open_dir(&control, OsStr::new(dir_name)) {
            Ok(Some(dir)) => found.extend(
                request_names(&dir)
                    .into_iter()
                    .filter_map(|name| read_request(&dir, place, name, look)),
            ),
            Ok(None) => {}
            Err(reason) => found.push(Found {
                place: Place::Inbox,
                name: OsString::from(dir_name),
                request: Err(format!("control/{dir_name} is refused: {reason}")),
            }),
        }
    }
    for name in ["stop.json", "timeout.json", "interrupt.json"] {
        let name = OsString::from(name);
        if nix::sys::stat::fstatat(&control, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW).is_ok()
        {
            found.extend(read_request(&control, Place::Inbox, name, look));
        }
    }
    // Stops first, then the timeout, then the interrupt: the first control request is what
    // the run acts on, and pi-subagents' runner looks at them in this order too.
    let rank = |found: &Found| match (found.place, found.name.as_bytes()) {
        (Place::StopRequests, _) | (Place::Inbox, b"stop.json") => 0,
        (Place::Inbox, b"timeout.json") => 1,
        (Place::Inbox, b"interrupt.json") => 2,
        (Place::Inbox, _) => 0,
        (Place::SteerRequests, _) => 3,
    };
    found.sort_by(|left, right| {
        rank(left)
            .cmp(&rank(right))
            .then_with(|| left.name.cmp(&right.name))
    });
    found
}

/// The names of the request files in `dir`, in name order.
fn request_names(dir: &OwnedFd) -> Vec<OsString> {
    let Ok(copy) = dir.try_clone() else {
        return Vec::new();
    };
    let Ok(mut entries) = nix::dir::Dir::from_fd(copy) else {
        return Vec::new();
    };
    let mut names: Vec<OsString> = entries
        .iter()
        .filter_map(Result::ok)
        .map(|entry| OsStr::from_bytes(entry.file_name().to_bytes()).to_os_string())
        .filter(|name| {
            let bytes = name.as_bytes();
            bytes.ends_with(b".json") && !bytes.starts_with(b".")
        })
        .collect();
    names.sort();
    names
}

/// Reads one request file: opened without following a link, checked on the open file, read
/// to at most [`MAX_REQUEST_FILE_BYTES`], then parsed. `None` for a file not yet whole: not
/// JSON, and not settled ([`Look::is_settled`]).
fn read_request(dir: &OwnedFd, place: Place, name: OsString, look: &mut Look<'_>) -> Option<Found> {
    let request = match read_file(dir, &name) {
        Err(reason) => Err(reason),
        Ok((bytes, state)) => {
            let request = parse(place, &name, &bytes);
            let is_json = || serde_json::from_slice::<serde::de::IgnoredAny>(&bytes).is_ok();
            if request.is_err() && !is_json() && !look.is_settled(place, &name, state) {
                return None;
            }
            request
        }
    };
    Some(Found {
        place,
        name,
        request,
    })
}

/// The file's bytes, and its state when it was read (`None` when it changed while it was).
fn read_file(dir: &OwnedFd, name: &OsStr) -> Result<(Vec<u8>, Option<FileStamp>), String> {
    let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
    let fd = match nix::fcntl::openat(dir, name, flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(nix::errno::Errno::ELOOP) => {
            return Err("it is a symbolic link, which is never followed".to_string());
        }
        Err(error) => return Err(format!("it cannot be opened: {error}")),
    };
    let stat = nix::sys::stat::fstat(&fd).map_err(|error| format!("it cannot be read: {error}"))?;
    let kind = stat.st_mode & nix::libc::S_IFMT;
    if kind != nix::libc::S_IFREG {
        return Err("it is not a regular file".to_string());
    }
    let euid = crate::durable_fs::effective_uid();
    if stat.st_uid != euid {
        return Err(format!(
            "it belongs to uid {}, not to uid {euid} who runs the run",
            stat.st_uid
        ));
    }
    let size = u64::try_from(stat.st_size).unwrap_or(u64::MAX);
    if size > MAX_REQUEST_FILE_BYTES {
        return Err(format!(
            "it is {size} bytes, over the limit of {MAX_REQUEST_FILE_BYTES}"
        ));
    }
    let mut bytes = Vec::new();
    let mut file = std::fs::File::from(fd);
    (&mut file)
        .take(MAX_REQUEST_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|error| format!("it cannot be read: {error}"))?;
    if bytes.len() as u64 > MAX_REQUEST_FILE_BYTES {
        return Err(format!(
            "it grew over the limit of {MAX_REQUEST_FILE_BYTES} bytes while it was read"
        ));
    }
    let before = FileStamp::of_stat(&stat);
    let after = nix::sys::stat::fstat(&file)
        .map(|stat| FileStamp::of_stat(&stat))
        .ok();
    Ok((bytes, after.filter(|after| *after == before)))
}

/// The largest step index a request may name (pi-subagents' bound).
const MAX_TARGET_INDEX: u32 = 1_000_000;

/// A request's step index (`targetIndex`, an entry of `targetIndexes`), if it is one.
fn step_index(value: &Value) -> Option<u32> {
    value
        .as_u64()
        .and_then(|index| u32::try_from(index).ok())
        .filter(|index| *index <= MAX_TARGET_INDEX)
}

/// A text field of a request, if it is a string.
fn text<'a>(fields: &'a serde_json::Map<String, Value>, key: &str) -> Option<&'a str> {
    fields.get(key).and_then(Value::as_str)
}

/// What a request file asks (pi-subagents' `InterruptRequest`, `TimeoutRequest`,
/// `StopRequest`, `SteerRequest`), or why it is refused. Pure.
pub fn parse(place: Place, name: &OsStr, bytes: &[u8]) -> Result<Request, String> {
    let value: Value =
        serde_json::from_slice(bytes).map_err(|error| format!("it is not JSON: {error}"))?;
    let Value::Object(fields) = value else {
        return Err("it is not a JSON object".to_string());
    };
    let expected = match (place, name.as_bytes()) {
        (Place::SteerRequests, _) => "steer",
        (Place::StopRequests, _) | (Place::Inbox, b"stop.json") => "stop",
        (Place::Inbox, b"timeout.json") => "timeout",
        (Place::Inbox, b"interrupt.json") => "interrupt",
        (Place::Inbox, _) => return Err("it is no request file of the inbox".to_string()),
    };
    if text(&fields, "type") != Some(expected) {
        return Err(format!("its type is not {expected:?}"));
    }
    let source = text(&fields, "source")
        .map(str::trim)
        .filter(|source| !source.is_empty());
    let ts = fields.get("ts").and_then(Value::as_u64);
    if expected == "steer" {
        return parse_steer(&fields, source, ts);
    }
    // pi-subagents' bound of a step index: a stop of one step names a step no further.
    let target = match fields.get("targetIndex") {
        None => None,
        Some(_) if expected != "stop" => {
            return Err(format!("a {expected} request names no step (targetIndex)"));
        }
        Some(target) => Some(step_index(target).ok_or(format!(
            "its targetIndex is not a step index (an integer from 0 to {MAX_TARGET_INDEX})"
        ))?),
    };
    let action = match expected {
        "stop" => ControlAction::Stop,
        "timeout" => ControlAction::Timeout,
        _ => ControlAction::Interrupt,
    };
    let file = match place.dir_name() {
        Some(dir) => format!("control/{dir}/{}", name.to_string_lossy()),
        None => format!("control/{}", name.to_string_lossy()),
    };
    let by = format!("{} through {file}", source.unwrap_or("a host"));
    let why = text(&fields, "reason")
        .map(str::trim)
        .filter(|reason| !reason.is_empty())
        .map_or_else(
            || {
                format!(
                    "{} requested through the run's control inbox",
                    action.as_str()
                )
            },
            str::to_string,
        );
    let reason = match ts {
        Some(ts) => format!("{why} (requested at {ts}, Unix ms)"),
        None => why,
    };
    if let Some(step) = target {
        return Ok(Request::StepStop {
            step,
            by: truncate_text(&by, MAX_TEXT_BYTES),
            reason: truncate_text(&reason, MAX_TEXT_BYTES),
        });
    }
    Ok(Request::Control {
        action,
        by: truncate_text(&by, MAX_TEXT_BYTES),
        reason: truncate_text(&reason, MAX_TEXT_BYTES),
    })
}

/// pi-subagents' `SteerRequest`, checked as its own reader checks one.
fn parse_steer(
    fields: &serde_json::Map<String, Value>,
    source: Option<&str>,
    ts: Option<UnixMs>,
) -> Result<Request, String> {
    let id = text(fields, "id")
        .map(str::trim)
        .filter(|id| !id.is_empty() && !id.chars().any(char::is_whitespace))
        .ok_or("it has no id, or one with white space")?;
    if id.len() > MAX_STEER_ID_BYTES {
        return Err(format!(
            "its id is {} bytes, over the limit of {MAX_STEER_ID_BYTES}",
            id.len()
        ));
    }
    if ts.is_none_or(|ts| ts == 0) {
        return Err("it has no time (ts)".to_string());
    }
    let message = text(fields, "message")
        .map(str::trim)
        .filter(|message| !message.is_empty())
        .ok_or("it has no message")?;
    if message.len() > crate::event::MAX_STEER_MESSAGE_BYTES {
        return Err(format!(
            "its message is {} bytes, over the limit of {}",
            message.len(),
            crate::event::MAX_STEER_MESSAGE_BYTES
        ));
    }
    let mode = match text(fields, "mode") {
        None | Some("steer" | "auto") => SteerMode::Steer,
        Some("follow_up" | "follow-up") => SteerMode::FollowUp,
        Some(other) => return Err(format!("its mode {other:?} is none of steer and follow_up")),
    };
    let index = step_index;
    let steps = match (fields.get("targetIndex"), fields.get("targetIndexes")) {
        (None, None) => None,
        (Some(target), None) => Some(vec![index(target).ok_or("its targetIndex is no step")?]),
        (None, Some(Value::Array(targets))) if !targets.is_empty() => Some(
            targets
                .iter()
                .map(|target| index(target).ok_or("its targetIndexes are not all steps"))
                .collect::<Result<Vec<u32>, _>>()?,
        ),
        _ => return Err("its targetIndex or targetIndexes are malformed".to_string()),
    };
    let source = truncate_text(source.unwrap_or("a host"), MAX_STEER_ID_BYTES);
    Ok(Request::Steer {
        id: id.to_string(),
        steps,
        mode,
        message: message.to_string(),
        source,
    })
}

/// What to journal for a found entry.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Append these events (appended on the head given when it is `Some`: a stop of a run
    /// waiting in its queue ends it in the same batch), then settle the file as
    /// [`Settle::Taken`] — or as [`Settle::Refused`] when the events are a refusal.
    Record {
        events: Vec<Event>,
        expect_head: Option<u64>,
        settle: Settle,
    },
    /// The journal already holds it (a taker was killed between the record and the file's
    /// removal, or another taker got there first, or the run already has that request): only
    /// remove the file.
    AlreadyTaken,
    /// Leave the file: the run's state does not take it now (a control request of a run that
    /// ended, which nothing acts on; its file stays for whoever looks).
    Leave,
}

/// How a file is settled once what it asked is journaled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    /// Removed: its request is in the journal.
    Taken,
    /// Moved aside into `control/refused/`.
    Refused,
}

/// The steps a steer request goes to when it names none: the running ones; else, in a run
/// that has not started them, or a paused one (its resume starts them), the first step that
/// has yet to end in a chain or a single run, every such step in a parallel one. Empty when
/// no step is left. Pure.
pub fn steer_targets(state: &RunState) -> Vec<u32> {
    let step_number = |index: usize| u32::try_from(index).unwrap_or(u32::MAX);
    let running: Vec<u32> = state
        .steps
        .iter()
        .enumerate()
        .filter(|(_, step)| step.status == StepStatus::Running)
        .map(|(index, _)| step_number(index))
        .collect();
    if !running.is_empty() {
        return running;
    }
    let is_open = |status: StepStatus| {
        if state.status == RunStatus::Paused {
            status != StepStatus::Complete
        } else {
            status == StepStatus::Pending
        }
    };
    let open = state
        .steps
        .iter()
        .enumerate()
        .filter(|(_, step)| is_open(step.status))
        .map(|(index, _)| step_number(index));
    match state.spec.mode {
        crate::event::Mode::Parallel => open.collect(),
        crate::event::Mode::Single | crate::event::Mode::Chain => open.take(1).collect(),
    }
}

/// The events a stop records: the request (unless one is recorded already), and for a run
/// waiting in its queue, for its dependencies or for its due time (no runner will start for
/// it) its end, stopped, in the same batch. The one wording of both, for `stop` and for the
/// inbox. Pure.
pub fn stop_events(state: &RunState, by: &str, reason: &str) -> Vec<Event> {
    let mut events = Vec::with_capacity(2);
    if !state.has_control(ControlAction::Stop) {
        events.push(Event::ControlRequested {
            action: ControlAction::Stop,
            by: by.to_string(),
            reason: reason.to_string(),
        });
    }
    if let Some(waiting) = waiting_text(state) {
        events.push(Event::Terminal {
            state: TerminalState::Stopped,
            error: None,
            summary: format!("stopped while it waited {waiting}"),
            exit_code: STOPPED_EXIT_CODE,
            repaired_by: None,
        });
    }
    events
}

/// What a run not started waits for, in words (`in queue NAME`, `for its dependencies`);
/// `None` when it waits for nothing. Pure.
pub fn waiting_text(state: &RunState) -> Option<String> {
    if state.is_waiting_for_dependencies() {
        return Some("for its dependencies".to_string());
    }
    if let Some(delay) = state.delay.as_ref().filter(|_| state.is_waiting_for_due()) {
        return Some(format!(
            "for its due time {}",
            crate::duration::format_time_s(delay.due_at_ms)
        ));
    }
    state
        .queue
        .as_ref()
        .filter(|_| state.is_waiting_for_slot())
        .map(|queue| format!("in queue {}", queue.name))
}

/// What to journal for `found`, from the run's state now. Pure.
pub fn decide(found: &Found, state: &RunState) -> Decision {
    let refuse = |reason: &str| Decision::Record {
        events: vec![Event::ControlRefused {
            file: truncate_text(&found.file(), MAX_TEXT_BYTES),
            reason: truncate_text(reason, MAX_TEXT_BYTES),
        }],
        expect_head: None,
        settle: Settle::Refused,
    };
    let takes_refusals = !state.is_terminal() || state.status == RunStatus::Paused;
    let request = match &found.request {
        Ok(request) => request,
        Err(reason) if takes_refusals => return refuse(reason),
        Err(_) => return Decision::Leave,
    };
    match request {
        Request::Control { action, by, reason } => {
            // A stop recorded on a run that waits again (its attempt ended after the request)
            // has no runner to take it: the waiting run is ended now.
            let ends_waiting = *action == ControlAction::Stop && state.is_waiting();
            if state.has_control(*action) && !ends_waiting {
                return Decision::AlreadyTaken;
            }
            if state.status == RunStatus::Paused {
                return refuse(&format!(
                    "the run is paused: it takes no {}; resume it, or act on the run that resumes it",
                    action.as_str()
                ));
            }
            if state.is_terminal() {
                return Decision::Leave;
            }
            let (events, expect_head) = match action {
                ControlAction::Stop if state.is_waiting() => {
                    (stop_events(state, by, reason), Some(state.head_seq))
                }
                action => (
                    vec![Event::ControlRequested {
                        action: *action,
                        by: by.clone(),
                        reason: reason.clone(),
                    }],
                    None,
                ),
            };
            Decision::Record {
                events,
                expect_head,
                settle: Settle::Taken,
            }
        }
        Request::StepStop { step, by, reason } => decide_step_stop(*step, by, reason, state)
            .unwrap_or_else(|refusal| match refusal {
                Some(reason) => refuse(&reason),
                None => Decision::Leave,
            }),
        Request::Steer {
            id,
            steps,
            mode,
            message,
            source,
        } => {
            if state.steer(id).is_some() {
                return Decision::AlreadyTaken;
            }
            if !takes_refusals {
                return Decision::Leave;
            }
            let steps = steps.clone().unwrap_or_else(|| steer_targets(state));
            if steps.is_empty() {
                return refuse("no step of the run has yet to end");
            }
            Decision::Record {
                events: vec![Event::SteerRequested {
                    id: id.clone(),
                    steps,
                    mode: *mode,
                    message: message.clone(),
                    source: source.clone(),
                }],
                expect_head: None,
                settle: Settle::Taken,
            }
        }
    }
}

/// What to journal for a stop of step `step` ([`decide`]): its request, or (`Err`) why the
/// file is refused (`None`: left for a later look, the run having ended). Pure.
fn decide_step_stop(
    step: u32,
    by: &str,
    reason: &str,
    state: &RunState,
) -> Result<Decision, Option<String>> {
    if state.step_stop(step).is_some() {
        return Ok(Decision::AlreadyTaken);
    }
    if state.status == RunStatus::Paused {
        return Err(Some(
            "the run is paused: it stops no step; resume it, or act on the run that resumes it"
                .to_string(),
        ));
    }
    if state.is_terminal() {
        return Err(None);
    }
    let Some(status) = state.steps.get(step as usize).map(|step| step.status) else {
        return Err(Some(format!(
            "the run has no step {step} (it has {})",
            state.steps.len()
        )));
    };
    if !matches!(status, StepStatus::Pending | StepStatus::Running) {
        return Err(Some(format!(
            "step {step} is {status}: only a pending or running step is stopped"
        )));
    }
    Ok(Decision::Record {
        events: vec![Event::StepStopRequested {
            step,
            by: by.to_string(),
            reason: reason.to_string(),
        }],
        expect_head: None,
        settle: Settle::Taken,
    })
}

/// What to journal when the run refused what [`decide`] said (a steer to a step that ended
/// meanwhile, a full queue of messages): the refusal of the file, with the run's reason. `None`
/// for a refusal that means the request is already there (a control action requested, a steer
/// id taken), or one that is not about the request (the run ended meanwhile: look again).
pub fn refusal_of(found: &Found, error: &TransitionError) -> Option<Event> {
    match error {
        TransitionError::ControlAlreadyRequested { .. }
        | TransitionError::StepStopAlreadyRequested { .. }
        | TransitionError::SteerIdReused { .. }
        | TransitionError::AfterTerminal { .. } => None,
        error => Some(Event::ControlRefused {
            file: truncate_text(&found.file(), MAX_TEXT_BYTES),
            reason: truncate_text(&error.to_string(), MAX_TEXT_BYTES),
        }),
    }
}

/// Removes `found`'s file (taken) or moves it aside into `control/refused/` (refused; removed
/// when [`MAX_REFUSED_KEPT`] are kept there already). A refused inbox directory is renamed
/// `control.refused-<ms>` beside it. Best effort: a file that is gone already was settled by
/// another taker, and one that cannot be moved is found again and decided again
/// ([`Decision::AlreadyTaken`] for a request).
pub fn settle(home: &Home, run: RunId, found: &Found, how: Settle) -> io::Result<()> {
    let run_dir = crate::durable_fs::open_dir(&home.run_dir(run))?;
    if found.place == Place::Inbox && found.name == "control" {
        let aside = format!("control.refused-{}", crate::event::now_ms());
        return gone_is_fine(nix::fcntl::renameat(
            &run_dir,
            "control",
            &run_dir,
            aside.as_str(),
        ));
    }
    let control = open_dir(&run_dir, OsStr::new("control"))
        .map_err(io::Error::other)?
        .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
    let (dir, is_dir) = match (found.place.dir_name(), found.place) {
        (Some(dir_name), _) => (
            open_dir(&control, OsStr::new(dir_name))
                .map_err(io::Error::other)?
                .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?,
            false,
        ),
        // A request directory refused whole sits in the inbox itself.
        (None, Place::Inbox) => (
            control.try_clone()?,
            matches!(found.name.as_bytes(), b"stop-requests" | b"steer-requests"),
        ),
        (None, _) => (control.try_clone()?, false),
    };
    if how == Settle::Taken {
        return gone_is_fine(nix::unistd::unlinkat(
            &dir,
            found.name.as_os_str(),
            nix::unistd::UnlinkatFlags::NoRemoveDir,
        ));
    }
    let refused = refused_dir(&control)?;
    if request_names_count(&refused) >= MAX_REFUSED_KEPT && !is_dir {
        return gone_is_fine(nix::unistd::unlinkat(
            &dir,
            found.name.as_os_str(),
            nix::unistd::UnlinkatFlags::NoRemoveDir,
        ));
    }
    let prefix = found.place.dir_name().unwrap_or("inbox");
    let aside = format!(
        "{prefix}-{}-{}",
        crate::event::now_ms(),
        found.name.to_string_lossy()
    );
    move_aside(&dir, found.name.as_os_str(), &refused, &aside)
}

/// Moves `name` from `dir` into `refused` as `aside`, so that a power cut keeps it in one
/// place or the other, never in neither: a host that made its file durable syncs its own
/// directory, which would make the file's removal from there durable before its new entry
/// is. So the entry is linked into `refused` and that directory synced before it is unlinked
/// from `dir`. An entry that cannot be linked (a directory) is renamed, then `refused` synced.
/// A cut between the two leaves it in both: found again, and refused again.
fn move_aside(dir: &OwnedFd, name: &OsStr, refused: &OwnedFd, aside: &str) -> io::Result<()> {
    match nix::unistd::linkat(dir, name, refused, aside, AtFlags::empty()) {
        Ok(()) => {
            nix::unistd::fsync(refused)?;
            gone_is_fine(nix::unistd::unlinkat(
                dir,
                name,
                nix::unistd::UnlinkatFlags::NoRemoveDir,
            ))
        }
        Err(nix::errno::Errno::ENOENT) => Ok(()),
        Err(_) => {
            gone_is_fine(nix::fcntl::renameat(dir, name, refused, aside))?;
            Ok(nix::unistd::fsync(refused)?)
        }
    }
}

fn gone_is_fine(result: nix::Result<()>) -> io::Result<()> {
    match result {
        Ok(()) | Err(nix::errno::Errno::ENOENT) => Ok(()),
        Err(error) => Err(error.into()),
    }
}

/// `control/refused/`, made 0700 if missing, and then synced into `control/` (what is moved
/// there must outlive a power cut).
fn refused_dir(control: &OwnedFd) -> io::Result<OwnedFd> {
    match nix::sys::stat::mkdirat(control.as_fd(), "refused", Mode::from_bits_truncate(0o700)) {
        Ok(()) => nix::unistd::fsync(control)?,
        Err(nix::errno::Errno::EEXIST) => {}
        Err(error) => return Err(error.into()),
    }
    open_dir(control, OsStr::new("refused"))
        .map_err(io::Error::other)?
        .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
}

/// How many entries a directory holds (but `.` and `..`).
fn request_names_count(dir: &OwnedFd) -> usize {
    let Ok(copy) = dir.try_clone() else {
        return 0;
    };
    let Ok(mut entries) = nix::dir::Dir::from_fd(copy) else {
        return 0;
    };
    entries
        .iter()
        .filter_map(Result::ok)
        .filter(|entry| !matches!(entry.file_name().to_bytes(), b"." | b".."))
        .count()
}

/// What one [`take`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Taken {
    /// Requests journaled now.
    pub recorded: usize,
    /// Files refused now (their refusal journaled).
    pub refused: usize,
    /// Files whose request the journal held already, removed now.
    pub already_taken: usize,
    /// Files that could not be removed or moved aside (found again by the next look).
    pub unsettled: Vec<String>,
    /// Files left where they are, not yet whole (not JSON, and changed within [`SETTLE_MS`]):
    /// looked at again by the next look.
    pub waiting: Vec<String>,
}

impl Taken {
    /// Whether it journaled anything.
    pub fn has_recorded(&self) -> bool {
        self.recorded + self.refused > 0
    }
}

/// Why a [`take`] stopped: the journal could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TakeError {
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error(transparent)]
    Append(#[from] AppendError),
    #[error("run {run} is not in the journal")]
    UnknownRun { run: RunId },
}

/// Most times one file is decided again when the run moved on under its append.
const TAKE_ATTEMPTS: usize = 8;

/// Takes the run's inbox: [`scan`], then for each file [`decide`] on the run's state as
/// `read_state` reads it, `append` what it says, and [`settle`] the file once that is durable.
/// A request the run refuses (a steer to a step that ended meanwhile, a full queue of messages)
/// is refused in its turn ([`refusal_of`]). A file not yet whole is left for a later look,
/// which `settling` carries to (a taker that looks again keeps it between its looks). The one
/// way a runner, a reconcile pass and a resume take an inbox; each brings its own reading and
/// appending.
pub fn take(
    home: &Home,
    run: RunId,
    settling: &mut Settling,
    mut read_state: impl FnMut() -> Result<Option<RunState>, ReadError>,
    mut append: impl FnMut(Vec<Event>, Condition) -> Result<Appended, AppendError>,
) -> Result<Taken, TakeError> {
    let mut taken = Taken::default();
    let found = scan(home, run, settling);
    taken.waiting = settling.waiting_files();
    for found in found {
        let mut settled = None;
        let already_taken_before = taken.already_taken;
        for _ in 0..TAKE_ATTEMPTS {
            let state = read_state()?.ok_or(TakeError::UnknownRun { run })?;
            let (events, expect_head, how) = match decide(&found, &state) {
                Decision::Leave => break,
                Decision::AlreadyTaken => {
                    taken.already_taken += 1;
                    settled = Some(Settle::Taken);
                    break;
                }
                Decision::Record {
                    events,
                    expect_head,
                    settle,
                } => (events, expect_head, settle),
            };
            let condition = expect_head.map_or_else(Condition::none, Condition::expect_head);
            fail_here_if_asked()?;
            match append(events, condition) {
                Ok(_) => {
                    match how {
                        Settle::Taken => taken.recorded += 1,
                        Settle::Refused => taken.refused += 1,
                    }
                    settled = Some(how);
                    break;
                }
                Err(AppendError::HeadMismatch { .. } | AppendError::AlreadyTerminal { .. }) => {}
                // Without a refusal it is decided again: already there, or the run ended
                // meanwhile.
                Err(AppendError::Transition { source, .. }) => {
                    if let Some(refusal) = refusal_of(&found, &source) {
                        match append(vec![refusal], Condition::none()) {
                            Ok(_) => {
                                taken.refused += 1;
                                settled = Some(Settle::Refused);
                                break;
                            }
                            // The run ended meanwhile: decided again.
                            Err(AppendError::Transition { .. }) => {}
                            Err(error) => return Err(error.into()),
                        }
                    }
                }
                Err(error) => return Err(error.into()),
            }
        }
        if settled.is_some() && taken.already_taken == already_taken_before {
            crate::liveness::die_here_if_asked(KILL_AFTER_RECORD_ENV);
        }
        if let Some(how) = settled
            && let Err(error) = settle(home, run, &found, how)
        {
            taken.unsettled.push(format!("{}: {error}", found.file()));
        }
    }
    Ok(taken)
}

/// How long [`take_whole`] looks again for a file not yet whole: a file unchanged for
/// [`SETTLE_MS`] is decided by then, so only one still being written is left.
pub const WHOLE_WAIT_MS: u64 = 2 * SETTLE_MS;

/// How long [`take_whole`] sleeps between two looks.
const WHOLE_WAIT_SLICE: Duration = Duration::from_millis(50);

/// [`take`] by a taker that cannot look again later (a resume: nothing reads a paused run's
/// inbox after it): while a file is not yet whole it looks again, for at most
/// [`WHOLE_WAIT_MS`]. What it returns says, in [`Taken::waiting`], the files still being
/// written after that wait.
pub fn take_whole(
    home: &Home,
    run: RunId,
    mut read_state: impl FnMut() -> Result<Option<RunState>, ReadError>,
    mut append: impl FnMut(Vec<Event>, Condition) -> Result<Appended, AppendError>,
) -> Result<Taken, TakeError> {
    let deadline = Instant::now() + Duration::from_millis(WHOLE_WAIT_MS);
    let mut settling = Settling::default();
    let mut all = Taken::default();
    loop {
        let taken = take(home, run, &mut settling, &mut read_state, &mut append)?;
        all.recorded += taken.recorded;
        all.refused += taken.refused;
        all.already_taken += taken.already_taken;
        all.unsettled.extend(taken.unsettled);
        all.waiting = taken.waiting;
        if all.waiting.is_empty() || Instant::now() >= deadline {
            return Ok(all);
        }
        std::thread::sleep(WHOLE_WAIT_SLICE);
    }
}

/// The name of a steer message's file in its step's inbox (`runner::steer` writes it there),
/// and of the runner's note that it wrote it: the seq of its record, so names sort in arrival
/// order, and no two messages share one.
pub fn step_message_file_name(seq: u64) -> String {
    format!("{seq:020}.json")
}

/// The deliveries of messages a running step of `state` took while no runner watched its
/// inbox (its runner died): each message waiting for the step that its runner noted as written
/// into the inbox and that is gone from there, as `SteerDelivered` events. For the reconciler,
/// once the dead runner's step groups are ended (nothing takes a message after this look);
/// the run's end then records the rest undelivered. An inbox whose directory is gone took
/// nothing, as for a live runner (`runner::steer::StepInbox::taken`).
pub fn steers_taken_without_runner(home: &Home, state: &RunState) -> Vec<Event> {
    let mut delivered = Vec::new();
    for (index, step) in state.steps.iter().enumerate() {
        if step.status != StepStatus::Running {
            continue;
        }
        let inbox = home.step_inbox_dir(state.run_id, index);
        let written = home.step_inbox_written_dir(state.run_id, index);
        if !crate::durable_fs::is_directory(&inbox) {
            continue;
        }
        let Ok(step_number) = u32::try_from(index) else {
            continue;
        };
        for steer in &state.steers {
            let is_waiting = steer.targets.iter().any(|target| {
                target.step == step_number && target.delivery == SteerDelivery::Queued
            });
            let name = step_message_file_name(steer.seq);
            let is_noted = matches!(crate::durable_fs::look(&written.join(&name)), Ok(Some(_)));
            let is_gone = matches!(crate::durable_fs::look(&inbox.join(&name)), Ok(None));
            if is_waiting && is_noted && is_gone {
                delivered.push(Event::SteerDelivered {
                    id: steer.id.clone(),
                    step: step_number,
                });
            }
        }
    }
    delivered
}

/// The environment variable of a test hook, in builds with the `testkit` feature: when it
/// names a file, the taker that finds it there removes it and SIGKILLs itself after it
/// journaled what a control file asked and before it removed the file — the kill point after
/// which the next taker must find the request journaled and only remove the file.
pub const KILL_AFTER_RECORD_ENV: &str = "RUNJOURNAL_TEST_KILL_AFTER_CONTROL_RECORD";

/// The environment variable of a test hook, in builds with the `testkit` feature: when it
/// names a file, the taker that finds it there removes it and fails its next append as one
/// fails when another process holds the journal's write lock past its bound (nothing written).
pub const FAIL_APPEND_ENV: &str = "RUNJOURNAL_TEST_FAIL_CONTROL_APPEND";

#[cfg(feature = "testkit")]
fn fail_here_if_asked() -> Result<(), TakeError> {
    let Some(path) = std::env::var_os(FAIL_APPEND_ENV) else {
        return Ok(());
    };
    if std::fs::remove_file(path).is_err() {
        return Ok(());
    }
    Err(TakeError::Append(AppendError::WriteLockHeld(
        crate::journal::LockHeld {
            since_ms: crate::event::now_ms(),
            holder: None,
        },
    )))
}

#[cfg(not(feature = "testkit"))]
fn fail_here_if_asked() -> Result<(), TakeError> {
    Ok(())
}

#[cfg(test)]
mod tests;
