//! Projections: the files hosts read, derived from the journal after each commit.
//!
//! Invariants:
//! * a projection is never read back as truth; it is rebuilt from the journal whenever it is
//!   missing, stale or damaged;
//! * projecting happens under the run's lock, from the latest snapshot read under that lock, so
//!   two projectors cannot regress a file to an older state;
//! * rendering is pure: the same records render to the same bytes (see [`plan`]).

pub mod documents;
pub mod incremental;
pub mod pending;
pub mod pi_events;

use std::io;
use std::path::{Path, PathBuf};

use crate::durable_fs::{self, FileLock};
use crate::event::{Record, RunId};
use crate::home::Home;
use crate::journal::{ReadError, ReadJournal, ResumeLinks, View};
use crate::state::RunState;

/// What kind of projected file a path is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileKind {
    Status,
    Events,
    Result,
    ResultIndex,
    ActiveMarker,
    ToolCallMarker,
    TerminalMarker,
    /// `events.jsonl` in pi-subagents' vocabulary (the pi-subagents layout only).
    PiEvents,
    /// `process-terminal.json`.
    ProcessTerminal,
    /// `control/steer-inbox-closed.json`.
    SteerInboxClosed,
    /// `subagent-log-<id>.md`, pi-subagents' markdown log of an ended run (the pi-subagents
    /// layout only).
    RunLog,
}

impl FileKind {
    pub fn as_str(self) -> &'static str {
        match self {
            FileKind::Status => "status",
            FileKind::Events => "events",
            FileKind::Result => "result",
            FileKind::ResultIndex => "result-index",
            FileKind::ActiveMarker => "active-marker",
            FileKind::ToolCallMarker => "tool-call-marker",
            FileKind::TerminalMarker => "terminal-marker",
            FileKind::PiEvents => "pi-events",
            FileKind::ProcessTerminal => "process-terminal",
            FileKind::SteerInboxClosed => "steer-inbox-closed",
            FileKind::RunLog => "run-log",
        }
    }

    /// Result files and their index entries are inboxes: a host deletes them once it has
    /// delivered the result, so their absence is not damage.
    pub fn may_be_consumed(self) -> bool {
        matches!(self, FileKind::Result | FileKind::ResultIndex)
    }
}

/// What a projected path should hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Content {
    /// Exactly these bytes.
    Bytes(Vec<u8>),
    /// An empty marker file, whose mtime tells when it was first made.
    Marker,
    /// Nothing: the file must not exist.
    Absent,
    /// A pi events file of a run no host's verdict ended: these bytes, and after them the
    /// hosts' verdicts the file on disk holds ([`pi_events::keep_host_verdicts`]), which are
    /// never removed before the journal holds them.
    KeepingHostVerdicts(Vec<u8>),
}

/// One file of a run's projection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedFile {
    pub kind: FileKind,
    pub path: PathBuf,
    pub content: Content,
    /// Where the file is written whole before it is renamed to `path`, when not beside it:
    /// a result is staged in pi-subagents' `result-pending/<session>/`, where its readers
    /// look for a result whose publication was cut short.
    pub staged_at: Option<PathBuf>,
}

impl PlannedFile {
    pub fn new(kind: FileKind, path: PathBuf, content: Content) -> PlannedFile {
        PlannedFile {
            kind,
            path,
            content,
            staged_at: None,
        }
    }
}

/// Every file of one run's projection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub run: RunId,
    pub files: Vec<PlannedFile>,
    /// Made once the run's result and its session index entry were written, so a result a
    /// host consumed is told apart from one never (or only partly) written. `None` while the
    /// run has no result.
    pub result_published_marker: Option<PathBuf>,
}

/// How a projection treats the result file and its index entry, which hosts delete once they
/// have delivered the result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResultPolicy {
    /// Write them unless they were published before and are gone now (consumed by a host).
    /// After each commit and in repairs: a result is published at least once, and a consumed
    /// one is not delivered again.
    Publish,
    /// Write them whatever happened before (an explicit replay).
    Rewrite,
}

/// Renders the projection of a run from its state, records and resume links (read in the
/// same view). Pure.
pub fn plan(home: &Home, state: &RunState, records: &[Record], links: &ResumeLinks) -> Plan {
    plan_parts(
        home,
        state,
        links,
        documents::terminal_seq(state, records),
        Some(records),
    )
}

/// [`plan`] from what it needs of the records: the seq of the run's `Terminal` (for the
/// result), and the records themselves only when events.jsonl is to be rendered whole
/// (`None` leaves that file out of the plan: the incremental projector appends to it).
pub(crate) fn plan_parts(
    home: &Home,
    state: &RunState,
    links: &ResumeLinks,
    terminal_seq: u64,
    records: Option<&[Record]>,
) -> Plan {
    let run = state.run_id;
    let mut files = Vec::new();
    // pi-subagents' order of an end: the terminal status, then the result's index entries,
    // then the result (staged in `result-pending/` and renamed into place), then the log.
    files.push(PlannedFile::new(
        FileKind::Status,
        home.status_path(run),
        Content::Bytes(documents::to_json_bytes(&documents::status_doc(
            home, state, links,
        ))),
    ));
    files.extend(result_files(home, state, terminal_seq));
    if let Some(records) = records {
        files.push(PlannedFile::new(
            FileKind::Events,
            home.events_path(run),
            Content::Bytes(documents::events_jsonl(records)),
        ));
        if let Some(path) = home.pi_events_path(run) {
            files.push(PlannedFile::new(
                FileKind::PiEvents,
                path,
                pi_events_content(state, pi_events::pi_events_jsonl(records)),
            ));
        }
    }
    files.push(PlannedFile::new(
        FileKind::ProcessTerminal,
        home.process_terminal_path(run),
        Content::Bytes(documents::to_json_bytes(
            &documents::process_terminal_file_doc(state),
        )),
    ));
    // A run leaves the active index when it ends, and when a host dismisses it while it runs
    // (pi-subagents' dismissal takes it out of the index: it shows as ended from then on).
    let marker = if state.is_terminal() || state.dismissed_at_ms.is_some() {
        Content::Absent
    } else {
        Content::Marker
    };
    files.push(PlannedFile::new(
        FileKind::ActiveMarker,
        home.active_marker_path(run),
        marker.clone(),
    ));
    if let Some(tool_call_id) = &state.tool_call_id {
        files.push(PlannedFile::new(
            FileKind::ToolCallMarker,
            home.tool_call_marker_path(tool_call_id, run),
            marker,
        ));
    }
    if let Some((session_id, ended_at, marker)) = documents::terminal_marker(state) {
        files.push(PlannedFile::new(
            FileKind::TerminalMarker,
            home.terminal_marker_path(&session_id, ended_at, run),
            Content::Bytes(documents::to_json_bytes(&marker)),
        ));
    }
    // Last: it is the one file in the run's control inbox, a directory a host may have made.
    files.push(PlannedFile::new(
        FileKind::SteerInboxClosed,
        home.steer_inbox_closed_path(run),
        match documents::steer_inbox_closed(home, state, links) {
            Some(closed) => Content::Bytes(documents::to_json_bytes(&closed)),
            None => Content::Absent,
        },
    ));
    let result_published_marker = state
        .is_terminal()
        .then(|| home.result_published_marker_path(run));
    Plan {
        run,
        files,
        result_published_marker,
    }
}

/// The files of an ended run's result, in pi-subagents' order of publication: its index
/// entries (by session, by run, by tool call), the result, staged in `result-pending/`, and the
/// markdown log. None while the run has not ended.
fn result_files(home: &Home, state: &RunState, terminal_seq: u64) -> Vec<PlannedFile> {
    let run = state.run_id;
    let mut files = Vec::new();
    if let Some(result) = documents::result_doc_at(home, state, terminal_seq) {
        let mut pending = None;
        if let Some((session_id, index)) = documents::result_index(home, state) {
            let entry = documents::to_json_bytes(&index);
            let mut paths = vec![
                home.result_session_index_path(&session_id, run),
                home.result_run_index_path(run),
            ];
            if let Some(tool_call_id) = &state.tool_call_id {
                paths.push(home.result_tool_call_index_path(tool_call_id, run));
            }
            for path in paths {
                files.push(PlannedFile::new(
                    FileKind::ResultIndex,
                    path,
                    Content::Bytes(entry.clone()),
                ));
            }
            pending = Some(home.result_pending_path(&session_id, run));
        }
        files.push(PlannedFile {
            staged_at: pending,
            ..PlannedFile::new(
                FileKind::Result,
                home.result_path(run),
                Content::Bytes(documents::to_json_bytes(&result)),
            )
        });
        if let Some(path) = home.pi_run_log_path(run) {
            files.push(PlannedFile::new(
                FileKind::RunLog,
                path,
                Content::Bytes(documents::run_log_md(state, &result).into_bytes()),
            ));
        }
    }
    files
}

/// What a run's pi events file holds: its rendering, keeping the hosts' verdicts the file has
/// until the journal holds one (then the rendering holds it).
pub(crate) fn pi_events_content(state: &RunState, rendered: Vec<u8>) -> Content {
    if state.is_ended_by_host() {
        Content::Bytes(rendered)
    } else {
        Content::KeepingHostVerdicts(rendered)
    }
}

/// How much of a pi events file's end is read for the hosts' verdicts it holds: a host appends
/// its verdict last, and a verdict line is a few KiB.
pub(crate) const HOST_VERDICT_WINDOW_BYTES: u64 = 256 * 1024;

/// Why a projection could not be written. The journal is unaffected.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProjectionError {
    #[error("run {run} is not in the journal")]
    UnknownRun { run: RunId },
    #[error("projecting run {run}: {source}")]
    Read {
        run: RunId,
        #[source]
        source: ReadError,
    },
    #[error("projecting run {run}: {path}: {source}")]
    Io {
        run: RunId,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Another process held the run's projection lock past [`RUN_LOCK_WAIT`]: the run's files
    /// were left as they are, for a later projection (the journal has every record).
    #[error("{}", lock_held_text(*run, path, holder.as_ref()))]
    LockHeld {
        run: RunId,
        path: PathBuf,
        /// The holder's pid and command name, where it could be found.
        holder: Option<(u32, String)>,
    },
}

fn lock_held_text(run: RunId, path: &Path, holder: Option<&(u32, String)>) -> String {
    let who = match holder {
        Some((pid, name)) => format!("process {pid} ({name})"),
        None => "another process".to_string(),
    };
    format!(
        "{} is held by {who}, which has not let it go for {} s (is it stopped?): run {run}'s \
         files are left as they are until it does (the journal has every record)",
        path.display(),
        RUN_LOCK_WAIT.as_secs()
    )
}

/// How long a projection waits for its run's lock (`runs/<id>/.lock`) before it leaves the
/// run's files to a later projection. A projection holds it for a few file writes; a process
/// stopped while holding it (SIGSTOP, a frozen container, a debugger) holds it for as long as it
/// stays stopped, and must not hold every reader of the home with it.
pub const RUN_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

impl ProjectionError {
    /// The I/O error underneath, if the failure was one.
    pub fn io_error(&self) -> Option<&io::Error> {
        match self {
            ProjectionError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// Whether the result of this plan's run was published before (see [`ResultPolicy`]).
fn was_published(plan: &Plan) -> bool {
    plan.result_published_marker
        .as_deref()
        .is_some_and(Path::exists)
}

/// Writes a plan's files; see [`ResultPolicy`] for the result file.
pub fn write_plan(plan: &Plan, result: ResultPolicy) -> Result<(), ProjectionError> {
    write_plan_observed(plan, result, &mut |_| {})
}

/// [`write_plan`], calling `after_file` after each file of the plan is written (or left as it
/// is). It exists for tests: a crash test kills its process there, between two files.
#[doc(hidden)]
pub fn write_plan_observed(
    plan: &Plan,
    result: ResultPolicy,
    after_file: &mut dyn FnMut(&PlannedFile),
) -> Result<(), ProjectionError> {
    // Read before writing: this write may publish the result and make the marker.
    let was_published_before = was_published(plan);
    let is_consumed = |file: &PlannedFile| {
        result == ResultPolicy::Publish
            && file.kind.may_be_consumed()
            && was_published_before
            && matches!(durable_fs::look(&file.path), Ok(None))
    };
    // The marker says that every file a host may consume (the result and its session index
    // entry) was written: made after the last of them, so a crash or a full disk between two
    // of them leaves the result unpublished, and the next projection writes them all again
    // rather than taking the missing one for consumed. At a power cut it must not outlive
    // them either ([`publish_durably`]).
    let last_consumable = plan
        .files
        .iter()
        .rposition(|file| file.kind.may_be_consumed());
    let mut made_marker = None;
    for (index, file) in plan.files.iter().enumerate() {
        if !is_consumed(file) {
            write_file(plan.run, file)?;
        }
        if Some(index) == last_consumable
            && let Some(marker) = &plan.result_published_marker
            && !was_published_before
        {
            publish_durably(plan, marker)?;
            made_marker = Some(marker);
        }
        after_file(file);
    }
    // The marker's own entry, and the run directory's, synced last: the rest of the run's
    // files are not held up by these syncs.
    if let Some(marker) = made_marker {
        sync_marker(plan.run, marker)?;
    }
    Ok(())
}

/// Makes the files a host may consume durable, then makes the marker that says they were
/// published ([`sync_marker`] makes it durable). A power cut must neither keep the marker
/// without them (the next projection would take the lost result for consumed and never write
/// it again: a run with no result) nor lose the marker of a result a host may have consumed
/// since (it would be published a second time). Once per run: a marker already there is left
/// alone.
fn publish_durably(plan: &Plan, marker: &Path) -> Result<(), ProjectionError> {
    let io_error = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ProjectionError::Io {
            run: plan.run,
            path,
            source,
        }
    };
    for file in &plan.files {
        if !file.kind.may_be_consumed() || file.content == Content::Absent {
            continue;
        }
        match durable_fs::open_existing_read_only(&file.path).and_then(|opened| opened.sync_all()) {
            Ok(()) => {}
            // A host consumed it already: it was published (its removal is the host's to
            // make durable).
            Err(error) if error.kind() == io::ErrorKind::NotFound => continue,
            Err(error) => return Err(io_error(&file.path)(error)),
        }
        durable_fs::sync_parent(&file.path).map_err(io_error(&file.path))?;
        // Its staging entry gone for good too: a cut must not bring a consumed result back
        // as a pending one, which pi-subagents' readers would publish again.
        if let Some(staged) = &file.staged_at {
            durable_fs::sync_parent(staged).map_err(io_error(staged))?;
        }
    }
    durable_fs::touch(marker).map_err(io_error(marker))
}

/// Makes a result's marker durable: its entry, and the run directory's that holds it.
fn sync_marker(run: RunId, marker: &Path) -> Result<(), ProjectionError> {
    let io_error = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ProjectionError::Io { run, path, source }
    };
    durable_fs::sync_parent(marker).map_err(io_error(marker))?;
    let run_dir = marker.parent().unwrap_or(marker);
    durable_fs::sync_parent(run_dir).map_err(io_error(run_dir))
}

fn write_file(run: RunId, file: &PlannedFile) -> Result<(), ProjectionError> {
    let io_error = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ProjectionError::Io { run, path, source }
    };
    let parent = file
        .path
        .parent()
        .expect("projected files live in a directory");
    match &file.content {
        Content::Bytes(bytes) if file.kind == FileKind::SteerInboxClosed => {
            ensure_control_dir(parent).map_err(io_error(parent))?;
            durable_fs::write_atomic(&file.path, bytes).map_err(io_error(&file.path))?;
        }
        Content::Bytes(bytes) if file.kind.may_be_consumed() => {
            // Made durable before its marker is (`publish_durably`): so are the directories
            // it is in, the session's index directory included.
            durable_fs::ensure_private_dir_durable(parent).map_err(io_error(parent))?;
            match &file.staged_at {
                Some(staged) => {
                    let staging = staged.parent().unwrap_or(parent);
                    durable_fs::ensure_private_dir(staging).map_err(io_error(staging))?;
                    durable_fs::write_atomic(staged, bytes).map_err(io_error(staged))?;
                    match durable_fs::rename(staged, &file.path) {
                        Ok(()) => {}
                        // Renamed already by whoever staged the same bytes last.
                        Err(error)
                            if error.kind() == io::ErrorKind::NotFound
                                && matches!(durable_fs::look(&file.path), Ok(Some(_))) => {}
                        Err(error) => return Err(io_error(&file.path)(error)),
                    }
                }
                None => {
                    durable_fs::write_atomic(&file.path, bytes).map_err(io_error(&file.path))?;
                }
            }
        }
        Content::Bytes(bytes) => {
            durable_fs::ensure_private_dir(parent).map_err(io_error(parent))?;
            durable_fs::write_atomic(&file.path, bytes).map_err(io_error(&file.path))?;
        }
        Content::KeepingHostVerdicts(rendered) => {
            durable_fs::ensure_private_dir(parent).map_err(io_error(parent))?;
            let on_disk = match durable_fs::read_tail(&file.path, HOST_VERDICT_WINDOW_BYTES) {
                Ok((tail, _)) => tail,
                Err(error) if error.kind() == io::ErrorKind::NotFound => Vec::new(),
                Err(error) => return Err(io_error(&file.path)(error)),
            };
            let bytes = pi_events::keep_host_verdicts(rendered, &on_disk, run);
            durable_fs::write_atomic(&file.path, &bytes).map_err(io_error(&file.path))?;
        }
        Content::Marker => {
            durable_fs::ensure_private_dir(parent).map_err(io_error(parent))?;
            durable_fs::touch(&file.path).map_err(io_error(&file.path))?;
        }
        Content::Absent => {
            durable_fs::remove_if_present(&file.path).map_err(io_error(&file.path))?;
            if file.kind == FileKind::ToolCallMarker {
                durable_fs::remove_dir_if_empty(parent);
            }
        }
    }
    Ok(())
}

/// Makes the run's control inbox directory if it is missing (0700), and checks the one there
/// is a directory of this user, not a link. Unlike the run's other directories it may be
/// writable by its group: a host makes it with its own umask when it first writes a request,
/// and the inbox reads each file as input, refusing another user's.
fn ensure_control_dir(dir: &Path) -> io::Result<()> {
    durable_fs::make_dirs(dir)?;
    let facts = durable_fs::look(dir)?
        .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?
        .facts;
    if facts.kind != durable_fs::EntryKind::Directory {
        return Err(durable_fs::UnsafePath::WrongKind {
            path: dir.to_path_buf(),
            expected: "directory",
        }
        .into());
    }
    let euid = durable_fs::effective_uid();
    if facts.owner_uid != euid {
        return Err(durable_fs::UnsafePath::NotOwned {
            path: dir.to_path_buf(),
            owner: facts.owner_uid,
            euid,
        }
        .into());
    }
    Ok(())
}

/// How a file on disk differs from its projection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// A result (or its index entry) published before and gone now: a host consumed it.
    Consumed,
    Missing,
    Unexpected,
    Differs {
        on_disk: Vec<u8>,
        expected: Vec<u8>,
    },
    Unreadable {
        reason: String,
    },
}

/// One file that differs from a fresh projection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Difference {
    pub run: RunId,
    pub kind: FileKind,
    pub path: PathBuf,
    pub problem: Problem,
}

impl Difference {
    /// Whether this difference is damage that a projection repairs (a consumed result is not).
    pub fn is_damage(&self) -> bool {
        self.problem != Problem::Consumed
    }
}

/// How far past a fresh projection's size a file on disk is read when they are compared: a
/// file larger than that differs, and is not read further (whoever replaced it, and with what,
/// `status.json` is input, and reading it must not cost more than the projection would).
pub const COMPARED_SLACK_BYTES: u64 = 64 * 1024;

/// Compares a plan with the files on disk; changes nothing. Each file is read up to its
/// fresh projection's size and [`COMPARED_SLACK_BYTES`] (a marker not at all), and only if it
/// is a regular file.
pub fn check_plan(plan: &Plan) -> Vec<Difference> {
    let mut out = Vec::new();
    let is_published = was_published(plan);
    for file in &plan.files {
        let limit = match &file.content {
            Content::Bytes(expected) | Content::KeepingHostVerdicts(expected) => {
                (expected.len() as u64).saturating_add(COMPARED_SLACK_BYTES)
            }
            Content::Marker | Content::Absent => 0,
        };
        let on_disk = match durable_fs::read_file_bounded(&file.path, limit) {
            Ok(durable_fs::Bounded::Whole(bytes)) => Ok(bytes),
            // A marker's content does not matter; a projection this much larger differs.
            Ok(durable_fs::Bounded::Over(_)) if limit == 0 => Ok(Vec::new()),
            Ok(durable_fs::Bounded::Over(_)) => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("it is over {limit} bytes, far larger than a fresh projection"),
            )),
            Err(error) => Err(error),
        };
        let problem = match (&file.content, on_disk) {
            (Content::Absent, Err(error)) if error.kind() == io::ErrorKind::NotFound => None,
            (Content::Absent, _) => Some(Problem::Unexpected),
            (_, Err(error)) if error.kind() == io::ErrorKind::NotFound => {
                if file.kind.may_be_consumed() && is_published {
                    Some(Problem::Consumed)
                } else {
                    Some(Problem::Missing)
                }
            }
            (_, Err(error)) => Some(Problem::Unreadable {
                reason: error.to_string(),
            }),
            (Content::Marker, Ok(_)) => None,
            (Content::Bytes(expected), Ok(bytes)) if bytes == *expected => None,
            (Content::KeepingHostVerdicts(expected), Ok(bytes))
                if pi_events::without_host_verdicts(&bytes, plan.run) == *expected =>
            {
                None
            }
            (Content::KeepingHostVerdicts(expected), Ok(bytes)) => Some(Problem::Differs {
                on_disk: bytes,
                expected: expected.clone(),
            }),
            // A live runner's heartbeat moved `lastUpdate` on: the file is fresh.
            (Content::Bytes(expected), Ok(bytes))
                if file.kind == FileKind::Status
                    && documents::is_heartbeat_of(&bytes, expected) =>
            {
                None
            }
            (Content::Bytes(expected), Ok(bytes)) => Some(Problem::Differs {
                on_disk: bytes,
                expected: expected.clone(),
            }),
        };
        if let Some(problem) = problem {
            out.push(Difference {
                run: plan.run,
                kind: file.kind,
                path: file.path.clone(),
                problem,
            });
        }
    }
    out
}

/// Reads a run's state, records and resume links from one view.
pub fn load(
    view: &View,
    run: RunId,
) -> Result<(RunState, Vec<Record>, ResumeLinks), ProjectionError> {
    let read = |source| ProjectionError::Read { run, source };
    let state = view
        .snapshot(run)
        .map_err(read)?
        .ok_or(ProjectionError::UnknownRun { run })?;
    let records = view.records(run).map_err(read)?;
    let links = view.resume_links(run).map_err(read)?;
    Ok((state, records, links))
}

/// The error of a projection whose run the journal does not hold: pruned while this process
/// was about to project it. Taking the run's lock made its directory and lock file again;
/// both go (the directory only when nothing else is in it), so a pruned run's directory is not
/// left behind by a projection that came too late.
pub(crate) fn unknown_run(home: &Home, run: RunId) -> ProjectionError {
    let _ = std::fs::remove_file(home.lock_path(run));
    let _ = std::fs::remove_dir(home.run_dir(run));
    ProjectionError::UnknownRun { run }
}

/// Takes the run's projection lock (`runs/<id>/.lock`), making its directory if needed,
/// waiting for it at most [`RUN_LOCK_WAIT`] ([`lock_run_within`]).
pub(crate) fn lock_run(home: &Home, run: RunId) -> Result<FileLock, ProjectionError> {
    let run_dir = home.run_dir(run);
    durable_fs::ensure_private_dir(&run_dir).map_err(|source| ProjectionError::Io {
        run,
        path: run_dir.clone(),
        source,
    })?;
    lock_run_within(run, &home.lock_path(run), RUN_LOCK_WAIT)
}

/// The run locks this process found held past their wait: each is tried once from then on,
/// without waiting, until it is taken again. A stopped holder so costs a process one wait,
/// however many of the run's projections it then tries (retries, a maintenance pass after a
/// write).
static HELD_RUN_LOCKS: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

/// The most run locks [`HELD_RUN_LOCKS`] remembers.
const MAX_HELD_RUN_LOCKS: usize = 256;

/// Takes the run lock at `path`, waiting at most `bound` (none for a lock this process found
/// held before and has not taken since); [`ProjectionError::LockHeld`] past it.
pub(crate) fn lock_run_within(
    run: RunId,
    path: &Path,
    bound: std::time::Duration,
) -> Result<FileLock, ProjectionError> {
    let held = || {
        HELD_RUN_LOCKS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    };
    let was_held = held().iter().any(|known| known == path);
    let wait = if was_held {
        std::time::Duration::ZERO
    } else {
        bound
    };
    let taken = FileLock::acquire_within(path, wait).map_err(|source| ProjectionError::Io {
        run,
        path: path.to_path_buf(),
        source,
    })?;
    match taken {
        Some(lock) => {
            if was_held {
                held().retain(|known| known != path);
            }
            Ok(lock)
        }
        None => {
            if !was_held {
                let mut held = held();
                // Bounded: the oldest is forgotten first (it is waited for once more).
                if held.len() >= MAX_HELD_RUN_LOCKS {
                    held.remove(0);
                }
                held.push(path.to_path_buf());
            }
            Err(ProjectionError::LockHeld {
                run,
                path: path.to_path_buf(),
                holder: crate::platform::flock_holder(path),
            })
        }
    }
}

/// A live runner's heartbeat: under the run's lock, from its latest state, writes status.json
/// with `lastUpdate` and `runnerHeardAt` at `heard_at_ms` ([`documents::heartbeat_status_doc`]).
/// Nothing is written for a terminal run (`Ok(false)`). No record is appended: a heartbeat
/// is a projection write, and [`check_plan`] takes its file as fresh.
pub fn heartbeat(
    home: &Home,
    journal: &impl ReadJournal,
    run: RunId,
    heard_at_ms: crate::event::UnixMs,
) -> Result<bool, ProjectionError> {
    let _lock = lock_run(home, run)?;
    stop_here_if_asked();
    let view = journal
        .view()
        .map_err(|source| ProjectionError::Read { run, source })?;
    let state = view
        .snapshot(run)
        .map_err(|source| ProjectionError::Read { run, source })?
        .ok_or_else(|| unknown_run(home, run))?;
    if state.is_terminal() {
        return Ok(false);
    }
    let links = view
        .resume_links(run)
        .map_err(|source| ProjectionError::Read { run, source })?;
    drop(view);
    let path = home.status_path(run);
    let doc = documents::heartbeat_status_doc(home, &state, &links, heard_at_ms);
    durable_fs::write_atomic(&path, &documents::to_json_bytes(&doc)).map_err(|source| {
        ProjectionError::Io {
            run,
            path: path.clone(),
            source,
        }
    })?;
    Ok(true)
}

/// The environment variable of a test hook (compiled in with the `testkit` feature, which the
/// tests turn on, in every profile): while a file exists at the path it names, the next
/// heartbeat removes it and stops this whole process (SIGSTOP) holding the run's projection
/// lock, as a process stopped by a debugger or a frozen container would.
pub const STOP_IN_HEARTBEAT_ENV: &str = "RUNJOURNAL_TEST_STOP_IN_HEARTBEAT";

#[cfg(feature = "testkit")]
fn stop_here_if_asked() {
    if let Some(path) = std::env::var_os(STOP_IN_HEARTBEAT_ENV)
        && std::fs::remove_file(path).is_ok()
    {
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGSTOP);
    }
}

#[cfg(not(feature = "testkit"))]
fn stop_here_if_asked() {}

/// When the run's runner was last heard from by its heartbeat, as its status.json says
/// (`runnerHeardAt`); `None` when the file is missing, unreadable or holds none. Only for
/// showing people: a projection is never read back as truth, and nothing acts on this.
pub fn read_runner_heard_at(home: &Home, run: RunId) -> Option<crate::event::UnixMs> {
    let durable_fs::Bounded::Whole(bytes) =
        durable_fs::read_file_bounded(&home.status_path(run), STATUS_READ_LIMIT_BYTES).ok()?
    else {
        return None;
    };
    serde_json::from_slice::<documents::StatusDoc>(&bytes)
        .ok()?
        .runner_heard_at
}

/// The most of a status.json [`read_runner_heard_at`] reads: far more than any we write.
const STATUS_READ_LIMIT_BYTES: u64 = 4 << 20;

/// Projects one run: under its lock, reads its latest state and writes every file. Returns the
/// head seq the files now reflect.
pub fn project(
    home: &Home,
    journal: &impl ReadJournal,
    run: RunId,
    result: ResultPolicy,
) -> Result<u64, ProjectionError> {
    let _lock = lock_run(home, run)?;
    let view = journal
        .view()
        .map_err(|source| ProjectionError::Read { run, source })?;
    let (state, records, links) = match load(&view, run) {
        Err(ProjectionError::UnknownRun { run }) => return Err(unknown_run(home, run)),
        loaded => loaded?,
    };
    drop(view);
    write_plan(&plan(home, &state, &records, &links), result)?;
    Ok(state.head_seq)
}
