//! Projecting after a commit in proportion to what the commit changed.
//!
//! A process that appends to a run remembers, per run, what it last left on disk: the stamp
//! (inode, length, mtime) and last seq of events.jsonl, the shape of the last projection it
//! wrote whole and when it last wrote status.json. After a commit it then
//!
//! * appends the new records to events.jsonl, when the file is the one it left (same stamp)
//!   or, written by someone else, its last line is the journal's record of that seq; any
//!   other file (missing, torn, edited, ahead of the journal) is rewritten whole, as before;
//! * writes every file of the projection when the run's *shape* changed — its status document
//!   with the fields a sample moves (a job's progress, message and update time, `lastUpdate`,
//!   `journalSeq`) left out, which is everything the result, the index and the markers are
//!   made of — or when someone else wrote events.jsonl since (it cannot tell what they left);
//! * and otherwise (only samples: `ExternalJobUpdated` records that keep their step's job
//!   state, id and URL as the last shape shows them) writes status.json at once if it has not in the last [`STATUS_COALESCE`] (the
//!   leading edge), else puts it off until then, and says so ([`Projected::status_due`]): the
//!   caller writes it when it is due ([`Projector::due_runs`]), with the state of then.
//!
//! Invariants:
//! * everything happens under the run's projection lock, from the latest snapshot read under
//!   it, as [`super::project`] does: the remembered state is only read and changed under it;
//! * a file is appended to only when its end is known to be the journal's record at the seq
//!   it ends with: the bytes on disk are then exactly [`super::plan`]'s;
//! * a status write is put off at most [`STATUS_COALESCE`], and only for samples: a state
//!   change, a step boundary, a terminal transition is written with its commit.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use super::documents::{self, StatusDoc};
use super::{
    FileKind, PlannedFile, ProjectionError, ResultPolicy, lock_run, pi_events, pi_events_content,
    plan_parts, write_file, write_plan,
};
use crate::durable_fs::{self, FileStamp};
use crate::event::{Event, JobState, Record, RunId};
use crate::home::Home;
use crate::journal::{ReadJournal, View};
use crate::state::RunState;

/// Locks the memory, recovering it from a panic elsewhere: it is consistent between
/// statements, and at worst costs a check of the files.
fn lock(
    runs: &std::sync::Mutex<HashMap<RunId, Remembered>>,
) -> std::sync::MutexGuard<'_, HashMap<RunId, Remembered>> {
    runs.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The longest a sample's status.json write is put off after the last one.
pub const STATUS_COALESCE: Duration = Duration::from_millis(100);

/// How much of events.jsonl's end is read to check its last line. A longer last line (only a
/// huge `RunCreated` can make one) gets the file rewritten whole.
const EVENTS_TAIL_WINDOW_BYTES: u64 = 64 * 1024;

/// Most runs remembered; past it the memory is dropped (runs with a status write put off
/// excepted), which costs the next projection of each a check of events.jsonl's last line.
const MAX_REMEMBERED_RUNS: usize = 4096;

/// What this process last left of one run's events.jsonl.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct EventsWritten {
    stamp: FileStamp,
    last_seq: u64,
}

/// What this process last left of one run's pi events file: its stamp, the seq of the last
/// record it renders, and the run's state there (what the next record's lines are rendered
/// after).
#[derive(Debug, Clone)]
struct PiEventsWritten {
    stamp: FileStamp,
    last_seq: u64,
    state: RunState,
}

/// What this process last left on disk of one run.
#[derive(Debug, Clone, Default)]
struct Remembered {
    events: Option<EventsWritten>,
    pi_events: Option<PiEventsWritten>,
    /// The shape of the last projection written whole.
    shape: Option<StatusDoc>,
    status_written_at: Option<Instant>,
    /// When a put-off status.json write is due.
    status_due: Option<Instant>,
}

/// The projections one process writes after its commits, and what it remembers of them.
#[derive(Debug, Default)]
pub struct Projector {
    runs: std::sync::Mutex<HashMap<RunId, Remembered>>,
}

/// What a projection after a commit did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Projected {
    /// The head seq the run's files reflect (status.json excepted while its write is put off).
    pub head_seq: u64,
    /// When the status.json write that was put off is due; `None` when it was written.
    pub status_due: Option<Instant>,
}

/// How events.jsonl is brought up to the head.
enum EventsUpdate {
    UpToDate {
        left: EventsWritten,
        /// The file is the one this process left: no record came since its last projection.
        is_ours: bool,
    },
    Append {
        records: Vec<Record>,
        last_seq: u64,
        /// The file is the one this process left: `records` are all that came since.
        is_ours: bool,
    },
    Rewrite,
}

/// The status document without what a sample moves: two documents of the same shape differ
/// at most in jobs' progress, message and update time, and in `lastUpdate` and `journalSeq`.
/// A sample (see [`are_samples_of`]) changes nothing else: after one the shape is the same.
fn shape_of(doc: &StatusDoc) -> StatusDoc {
    let mut shape = doc.clone();
    shape.last_update = 0;
    shape.journal_seq = 0;
    for step in &mut shape.steps {
        if let Some(job) = &mut step.external_job {
            job.progress = None;
            job.message = None;
            job.updated_at = None;
        }
    }
    shape
}

/// Whether every record is a sample of a run of this shape: an `ExternalJobUpdated` that keeps
/// its step's job state, id and URL as the shape shows them (a failed or cancelled job is no
/// sample: its message is its failure message, part of the shape). Decided from the records,
/// so that a sample costs no status document unless one is written.
fn are_samples_of(shape: &StatusDoc, records: &[Record]) -> bool {
    records.iter().all(|record| {
        let Event::ExternalJobUpdated { step, job } = &record.event else {
            return false;
        };
        let shown = usize::try_from(*step)
            .ok()
            .and_then(|step| shape.steps.get(step))
            .and_then(|step| step.external_job.as_ref());
        let Some(shown) = shown else {
            return false;
        };
        !matches!(job.state, JobState::Failed | JobState::Cancelled)
            && shown.state == documents::job_state_name(job.state)
            && shown.provider_job_id == job.id
            && shown.handle_url == job.url
    })
}

fn io_error(run: RunId, path: &Path) -> impl FnOnce(std::io::Error) -> ProjectionError {
    let path = path.to_path_buf();
    move |source| ProjectionError::Io { run, path, source }
}

fn read_error(run: RunId) -> impl Fn(crate::journal::ReadError) -> ProjectionError {
    move |source| ProjectionError::Read { run, source }
}

/// The seq of events.jsonl's last line if that line is exactly the journal's record of that
/// seq (and the file ends with it); `None` for anything else.
fn verified_last_seq(
    view: &View,
    run: RunId,
    head_seq: u64,
    path: &Path,
) -> Result<Option<u64>, ProjectionError> {
    let (tail, len) =
        durable_fs::read_tail(path, EVENTS_TAIL_WINDOW_BYTES).map_err(io_error(run, path))?;
    let Some(body) = tail.strip_suffix(b"\n") else {
        return Ok(None);
    };
    let line = match body.iter().rposition(|&byte| byte == b'\n') {
        Some(newline) => &body[newline + 1..],
        // The whole window is one line: it is the file's first only if the window is the file.
        None if (tail.len() as u64) == len => body,
        None => return Ok(None),
    };
    let Some(seq) = serde_json::from_slice::<serde_json::Value>(line)
        .ok()
        .and_then(|value| value.get("seq")?.as_u64())
    else {
        return Ok(None);
    };
    if seq == 0 || seq > head_seq {
        return Ok(None);
    }
    let record = view
        .records_between(run, seq - 1, seq)
        .map_err(read_error(run))?;
    let expected = documents::events_jsonl(&record);
    Ok((expected.strip_suffix(b"\n") == Some(line)).then_some(seq))
}

impl Projector {
    pub fn new() -> Projector {
        Projector::default()
    }

    /// Projects `run` after a commit (see the module's documentation). With `may_defer_status`
    /// false, status.json is written now whatever it holds (a due write, a flush at exit).
    pub fn project(
        &self,
        home: &Home,
        journal: &impl ReadJournal,
        run: RunId,
        now: Instant,
        may_defer_status: bool,
    ) -> Result<Projected, ProjectionError> {
        let _lock = lock_run(home, run)?;
        // Taken out until this projection succeeds: a failure halfway leaves files this memory
        // would not describe.
        let remembered = lock(&self.runs).remove(&run).unwrap_or_default();
        let view = journal.view().map_err(read_error(run))?;
        let state = view
            .snapshot(run)
            .map_err(read_error(run))?
            .ok_or_else(|| super::unknown_run(home, run))?;
        let links = view.resume_links(run).map_err(read_error(run))?;
        let head_seq = state.head_seq;
        let events_path = home.events_path(run);
        let update = self.events_update(&view, run, head_seq, remembered.events, &events_path)?;
        // Only where this process saw every record since its last projection can it tell what
        // the files on disk show; after someone else's projection it writes them all.
        let is_sample_only = remembered
            .shape
            .as_ref()
            .is_some_and(|shape| match &update {
                EventsUpdate::UpToDate { is_ours, .. } => *is_ours,
                EventsUpdate::Append {
                    records, is_ours, ..
                } => *is_ours && are_samples_of(shape, records),
                EventsUpdate::Rewrite => false,
            });
        let mut next = Remembered {
            events: None,
            pi_events: None,
            shape: remembered.shape,
            status_written_at: remembered.status_written_at,
            status_due: None,
        };
        if is_sample_only {
            let due = remembered
                .status_written_at
                .map(|written_at| written_at + STATUS_COALESCE)
                .filter(|due| may_defer_status && now < *due);
            match due {
                Some(due) => next.status_due = Some(due),
                None => {
                    let path = home.status_path(run);
                    let doc = documents::status_doc(home, &state, &links);
                    durable_fs::write_atomic(&path, &documents::to_json_bytes(&doc))
                        .map_err(io_error(run, &path))?;
                    next.status_written_at = Some(now);
                }
            }
        } else {
            let terminal_seq = if state.is_terminal() {
                view.terminal_seq(run)
                    .map_err(read_error(run))?
                    .unwrap_or(head_seq)
            } else {
                head_seq
            };
            write_plan(
                &plan_parts(home, &state, &links, terminal_seq, None),
                ResultPolicy::Publish,
            )?;
            next.shape = Some(shape_of(&documents::status_doc(home, &state, &links)));
            next.status_written_at = Some(now);
        }
        next.events = Some(self.write_events(&view, run, update, &events_path)?);
        if let Some(path) = home.pi_events_path(run) {
            next.pi_events = Some(write_pi_events(&view, &state, remembered.pi_events, &path)?);
        }
        drop(view);
        let projected = Projected {
            head_seq,
            status_due: next.status_due,
        };
        self.remember(run, &state, next);
        Ok(projected)
    }

    /// What to do to events.jsonl, from what this process left of it and what is there now.
    fn events_update(
        &self,
        view: &View,
        run: RunId,
        head_seq: u64,
        remembered: Option<EventsWritten>,
        path: &Path,
    ) -> Result<EventsUpdate, ProjectionError> {
        let Some(stamp) = durable_fs::stamp(path).map_err(io_error(run, path))? else {
            return Ok(EventsUpdate::Rewrite);
        };
        let (last_seq, is_ours) = match remembered {
            Some(left) if left.stamp == stamp && left.last_seq <= head_seq => (left.last_seq, true),
            _ => match verified_last_seq(view, run, head_seq, path)? {
                Some(seq) => (seq, false),
                None => return Ok(EventsUpdate::Rewrite),
            },
        };
        if last_seq == head_seq {
            return Ok(EventsUpdate::UpToDate {
                left: EventsWritten { stamp, last_seq },
                is_ours,
            });
        }
        let records = view
            .records_between(run, last_seq, head_seq)
            .map_err(read_error(run))?;
        Ok(EventsUpdate::Append {
            records,
            last_seq: head_seq,
            is_ours,
        })
    }

    fn write_events(
        &self,
        view: &View,
        run: RunId,
        update: EventsUpdate,
        path: &Path,
    ) -> Result<EventsWritten, ProjectionError> {
        let last_seq = match update {
            EventsUpdate::UpToDate { left, .. } => return Ok(left),
            EventsUpdate::Append {
                records, last_seq, ..
            } => {
                let bytes = documents::events_jsonl(&records);
                match durable_fs::append_existing(path, &bytes) {
                    Ok(stamp) => return Ok(EventsWritten { stamp, last_seq }),
                    // Gone since it was looked at: written whole below.
                    Err(error) if error.kind() == std::io::ErrorKind::NotFound => last_seq,
                    Err(error) => return Err(io_error(run, path)(error)),
                }
            }
            EventsUpdate::Rewrite => 0,
        };
        let records = view.records(run).map_err(read_error(run))?;
        let last_seq = records.last().map_or(last_seq, |record| record.seq);
        durable_fs::write_atomic(path, &documents::events_jsonl(&records))
            .map_err(io_error(run, path))?;
        let stamp = durable_fs::stamp(path)
            .map_err(io_error(run, path))?
            .ok_or_else(|| {
                io_error(run, path)(std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "gone right after it was written",
                ))
            })?;
        Ok(EventsWritten { stamp, last_seq })
    }

    fn remember(&self, run: RunId, state: &RunState, next: Remembered) {
        let mut runs = lock(&self.runs);
        // A closed run changes no more but by `Dismissed`; nothing is worth keeping.
        let is_closed = state.is_terminal() && state.process_terminal.is_some();
        if is_closed && next.status_due.is_none() {
            runs.remove(&run);
            return;
        }
        if runs.len() >= MAX_REMEMBERED_RUNS {
            runs.retain(|_, remembered| remembered.status_due.is_some());
        }
        runs.insert(run, next);
    }

    /// Forgets what this process left of `run`: its next projection checks the files.
    pub fn forget(&self, run: RunId) {
        lock(&self.runs).remove(&run);
    }

    /// The runs whose put-off status.json write is due by `now`.
    pub fn due_runs(&self, now: Instant) -> Vec<RunId> {
        lock(&self.runs)
            .iter()
            .filter(|(_, remembered)| remembered.status_due.is_some_and(|due| due <= now))
            .map(|(run, _)| *run)
            .collect()
    }

    /// The runs with a status.json write put off, whenever it is due.
    pub fn deferred_runs(&self) -> Vec<RunId> {
        self.due_runs(far_future())
    }

    /// When the next put-off status.json write is due.
    pub fn next_due(&self) -> Option<Instant> {
        lock(&self.runs)
            .values()
            .filter_map(|remembered| remembered.status_due)
            .min()
    }
}

/// Brings the run's pi events file up to `state`'s head: the lines of the records since the
/// last one this process rendered are appended when the file is the one it left; any other
/// file (missing, written or appended to by someone else) is rendered whole, keeping the
/// hosts' verdicts it holds ([`pi_events_content`]).
fn write_pi_events(
    view: &View,
    state: &RunState,
    left: Option<PiEventsWritten>,
    path: &Path,
) -> Result<PiEventsWritten, ProjectionError> {
    let run = state.run_id;
    let head_seq = state.head_seq;
    let stamp = durable_fs::stamp(path).map_err(io_error(run, path))?;
    if let (Some(left), Some(stamp)) = (left, stamp)
        && left.stamp == stamp
        && left.last_seq <= head_seq
    {
        if left.last_seq == head_seq {
            return Ok(left);
        }
        let records = view
            .records_between(run, left.last_seq, head_seq)
            .map_err(read_error(run))?;
        let (bytes, _) = pi_events::render(Some(left.state), &records);
        match durable_fs::append_existing(path, &bytes) {
            Ok(stamp) => {
                return Ok(PiEventsWritten {
                    stamp,
                    last_seq: head_seq,
                    state: state.clone(),
                });
            }
            // Gone since it was looked at: rendered whole below.
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => return Err(io_error(run, path)(error)),
        }
    }
    let records = view.records(run).map_err(read_error(run))?;
    let file = PlannedFile::new(
        FileKind::PiEvents,
        path.to_path_buf(),
        pi_events_content(state, pi_events::pi_events_jsonl(&records)),
    );
    write_file(run, &file)?;
    let stamp = durable_fs::stamp(path)
        .map_err(io_error(run, path))?
        .ok_or_else(|| {
            io_error(run, path)(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "gone right after it was written",
            ))
        })?;
    Ok(PiEventsWritten {
        stamp,
        last_seq: records.last().map_or(head_seq, |record| record.seq),
        state: state.clone(),
    })
}

fn far_future() -> Instant {
    // A day: past any due time, without overflowing `Instant`.
    Instant::now() + Duration::from_secs(86_400)
}
