//! Checking a journal end to end: every record decodes and passes its checksum, every run's
//! records fold through [`crate::state::apply`] and equal its stored snapshot, the indexes
//! (active, terminal, aliases, log, writer marks) agree with the runs, and the projections on
//! disk equal a fresh [`projection::plan`].
//!
//! Invariants:
//! * verifying reads only: it opens no journal for writing and creates, changes or removes no
//!   file (the per-run lock is taken only where its file already exists);
//! * the records are the truth: a run is re-derived from its records alone, and the snapshot,
//!   the indexes and the projections are judged against that fold;
//! * every problem is reported, not just the first: a damaged record or run does not stop the
//!   check of the others.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::event::{Record, RunId, UnixMs, WriterId};
use crate::home::Home;
use crate::journal::{
    CorruptError, Journal, ReadError, ReadJournal, ResumeLinks, SnapshotError, StorageFailure,
    View, name_alias, tool_call_alias,
};
use crate::projection::incremental::STATUS_COALESCE;
use crate::projection::{self, Difference, FileKind};
use crate::state::{self, RunState};

/// How serious a problem is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Severity {
    /// Something that is most likely fine but worth knowing, such as a result file a host
    /// has consumed.
    Note,
    /// The records are sound, but something derived from them (a snapshot, an index, a
    /// projection) disagrees with them or does not decode. Rebuilding from the records can fix
    /// it.
    Inconsistent,
    /// A check could not run (an I/O error); nothing is known about what it would have found.
    Unchecked,
    /// The journal's bytes are damaged (a record fails its checksum or does not decode, redb's
    /// integrity check fails) or its records break a lifecycle rule. The
    /// records themselves are in question; only a copy from before the damage can fix it.
    Damaged,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Note => "note",
            Severity::Inconsistent => "inconsistent",
            Severity::Unchecked => "unchecked",
            Severity::Damaged => "damaged",
        }
    }
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What was checked when a problem was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ProblemKind {
    /// The journal's meta entries.
    Meta,
    /// A stored record.
    Record,
    /// A stored snapshot that does not decode (damaged, another layout, another run's): a
    /// cache that reads re-derive and the run's next append rewrites; or a run with records
    /// but no snapshot or the reverse.
    Snapshot,
    /// A run's records that do not fold.
    Fold,
    /// A snapshot that decodes but differs from the fold of its run's records.
    SnapshotDiffers,
    /// The global log.
    Log,
    /// The active index.
    ActiveIndex,
    /// A queue's index of waiting or active runs.
    QueueIndex,
    /// The index of delayed runs waiting for their due time.
    DelayedIndex,
    /// The index of runs waiting for other runs to end.
    DependentsIndex,
    /// The index of the keys of runs launched once.
    UniqueIndex,
    /// The terminal index.
    TerminalIndex,
    /// The alias index.
    Alias,
    /// The resume index.
    ResumeIndex,
    /// A writer's idempotency mark.
    WriterMark,
    /// A projected file.
    Projection,
    /// redb's own integrity check.
    Integrity,
    /// Reading the journal failed.
    Storage,
    /// A record as shipped to PostgreSQL (`journal-tools inspect verify --against`).
    Shipped,
}

impl ProblemKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ProblemKind::Meta => "meta",
            ProblemKind::Record => "record",
            ProblemKind::Snapshot => "snapshot",
            ProblemKind::Fold => "fold",
            ProblemKind::SnapshotDiffers => "snapshot-differs",
            ProblemKind::Log => "log",
            ProblemKind::ActiveIndex => "active-index",
            ProblemKind::QueueIndex => "queue-index",
            ProblemKind::DelayedIndex => "delayed-index",
            ProblemKind::DependentsIndex => "dependents-index",
            ProblemKind::UniqueIndex => "unique-index",
            ProblemKind::TerminalIndex => "terminal-index",
            ProblemKind::Alias => "alias",
            ProblemKind::ResumeIndex => "resume-index",
            ProblemKind::WriterMark => "writer-mark",
            ProblemKind::Projection => "projection",
            ProblemKind::Integrity => "integrity",
            ProblemKind::Storage => "storage",
            ProblemKind::Shipped => "shipped",
        }
    }
}

/// One thing found wrong (or worth a note).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub severity: Severity,
    pub kind: ProblemKind,
    pub run: Option<RunId>,
    /// The record's seq, for a problem with one record.
    pub seq: Option<u64>,
    /// The projected file, for a projection problem.
    pub file: Option<(FileKind, PathBuf)>,
    /// One line saying what is wrong.
    pub message: String,
    /// For something that differs: the fields that differ, one line each, at most
    /// [`MAX_CHANGES`] (the last line then says how many more there are).
    pub changes: Vec<String>,
}

impl Problem {
    fn new(severity: Severity, kind: ProblemKind, message: impl Into<String>) -> Problem {
        Problem {
            severity,
            kind,
            run: None,
            seq: None,
            file: None,
            message: message.into(),
            changes: Vec::new(),
        }
    }

    fn of_run(mut self, run: RunId) -> Problem {
        self.run = Some(run);
        self
    }

    fn at_seq(mut self, seq: u64) -> Problem {
        self.seq = Some(seq);
        self
    }

    fn storage(failure: &StorageFailure) -> Problem {
        let severity = match failure.source {
            redb::Error::Corrupted(_) => Severity::Damaged,
            _ => Severity::Unchecked,
        };
        Problem::new(severity, ProblemKind::Storage, failure.to_string())
    }

    fn corrupt(error: &CorruptError) -> Problem {
        match error {
            CorruptError::Record { run, seq, .. } => {
                Problem::new(Severity::Damaged, ProblemKind::Record, error.to_string())
                    .of_run(*run)
                    .at_seq(*seq)
            }
            CorruptError::RecordKeyMismatch {
                key_run, key_seq, ..
            } => Problem::new(Severity::Damaged, ProblemKind::Record, error.to_string())
                .of_run(*key_run)
                .at_seq(*key_seq),
            CorruptError::Unfoldable { run, seq, .. } => {
                Problem::new(Severity::Damaged, ProblemKind::Fold, error.to_string())
                    .of_run(*run)
                    .at_seq(*seq)
            }
            CorruptError::NoRecords { run, .. } => Problem::new(
                Severity::Inconsistent,
                ProblemKind::Snapshot,
                error.to_string(),
            )
            .of_run(*run),
            other => Problem::new(Severity::Damaged, ProblemKind::Meta, other.to_string()),
        }
    }

    /// A stored snapshot that does not decode. It is a cache, not lost data: every read
    /// re-derives the run from its records, and the run's next append rewrites it.
    fn snapshot(run: RunId, error: &SnapshotError) -> Problem {
        Problem::new(
            Severity::Inconsistent,
            ProblemKind::Snapshot,
            format!(
                "snapshot of run {run}: {error} (a cache: reads re-derive it from the records, the run's next append rewrites it)"
            ),
        )
        .of_run(run)
    }

    fn read(error: &ReadError) -> Problem {
        match error {
            ReadError::Corrupt(corrupt) => Problem::corrupt(corrupt),
            ReadError::Storage(failure) => Problem::storage(failure),
            ReadError::Damaged(damaged) => Problem::new(
                Severity::Damaged,
                ProblemKind::Storage,
                format!("{damaged}: {}", damaged.panic),
            ),
        }
    }
}

/// What a verification looked at and what it found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Runs seen (with a snapshot, records, or both).
    pub runs: u64,
    /// Records read.
    pub records: u64,
    /// Projected files compared with the disk.
    pub files: u64,
    pub problems: Vec<Problem>,
}

impl Report {
    /// The most serious problem's severity; `None` when nothing was found.
    pub fn worst(&self) -> Option<Severity> {
        self.problems.iter().map(|problem| problem.severity).max()
    }

    /// How many problems are of this severity.
    pub fn count(&self, severity: Severity) -> usize {
        self.problems
            .iter()
            .filter(|problem| problem.severity == severity)
            .count()
    }
}

/// Most lines of field changes kept per problem.
pub const MAX_CHANGES: usize = 8;

/// Longest JSON value shown in a change line, in characters.
const MAX_VALUE_CHARS: usize = 60;

/// What verify needs to know of a run to check the indexes.
#[derive(Debug, Default)]
struct RunFacts {
    has_snapshot: bool,
    /// From the snapshot, else from the fold: closed, end time, tool call id, name.
    facts: Option<IndexFacts>,
    record_count: u64,
    /// Global seq of the run's `RunCreated` (from the log).
    created_global: Option<u64>,
    /// The next seq the log should name for this run.
    log_next_seq: u64,
    /// The run its records say it resumed.
    resumed_from: Option<RunId>,
    /// Its fold ended before a runner took it.
    ended_unstarted: bool,
}

#[derive(Debug, Clone)]
struct IndexFacts {
    is_closed: bool,
    ended_at_ms: Option<UnixMs>,
    tool_call_id: Option<String>,
    name: Option<String>,
    /// Its queue, and whether it waits there or holds a slot.
    queue: Option<String>,
    is_waiting: bool,
    holds_slot: bool,
    /// Its due time, while it waits for it.
    due_waiting: Option<UnixMs>,
    /// The runs it waits for to end, while it waits for them.
    waits_for: Vec<RunId>,
    /// The key it was launched once by.
    unique: Option<String>,
}

impl IndexFacts {
    fn of(state: &RunState) -> IndexFacts {
        IndexFacts {
            is_closed: state.is_closed(),
            ended_at_ms: state.ended_at_ms(),
            tool_call_id: state.tool_call_id.clone(),
            name: state.spec.name.clone(),
            queue: state.queue.as_ref().map(|queue| queue.name.clone()),
            is_waiting: state.is_waiting_for_slot(),
            holds_slot: state.holds_slot(),
            due_waiting: state
                .delay
                .as_ref()
                .filter(|_| state.is_waiting_for_due())
                .map(|delay| delay.due_at_ms),
            waits_for: match &state.dependencies {
                Some(dependencies) if state.is_waiting_for_dependencies() => {
                    dependencies.runs().collect()
                }
                _ => Vec::new(),
            },
            unique: state.unique.as_ref().map(|unique| unique.key.clone()),
        }
    }
}

/// Each run with a stored snapshot, and the index facts of those that decode; a snapshot that
/// does not is a problem.
fn snapshot_facts(view: &View, report: &mut Report) -> BTreeMap<RunId, RunFacts> {
    let mut runs: BTreeMap<RunId, RunFacts> = BTreeMap::new();
    let scanned = view.scan_stored_snapshots(|run, snapshot| {
        let facts = runs.entry(run).or_default();
        facts.has_snapshot = true;
        match snapshot {
            Ok(state) => facts.facts = Some(IndexFacts::of(&state)),
            Err(error) => report.problems.push(Problem::snapshot(run, &error)),
        }
        true
    });
    if let Err(error) = scanned {
        report.problems.push(Problem::read(&error));
    }
    runs
}

/// Every run has both records and a snapshot.
fn check_snapshot_presence(runs: &BTreeMap<RunId, RunFacts>, report: &mut Report) {
    for (run, facts) in runs {
        if facts.has_snapshot && facts.record_count == 0 {
            report.problems.push(
                Problem::new(
                    Severity::Inconsistent,
                    ProblemKind::Snapshot,
                    format!("run {run} has a snapshot but no records"),
                )
                .of_run(*run),
            );
        } else if !facts.has_snapshot {
            report.problems.push(
                Problem::new(
                    Severity::Inconsistent,
                    ProblemKind::Snapshot,
                    format!(
                        "run {run} has {} records but no snapshot",
                        facts.record_count
                    ),
                )
                .of_run(*run),
            );
        }
    }
}

/// Checks everything the journal holds, as of `view`, and, with a home, every run's
/// projection there. redb's own integrity check is separate ([`check_integrity_of_copy`]):
/// it needs a file, not a view.
pub fn verify(view: &View, home: Option<&Home>) -> Report {
    let mut report = Report::default();
    if let Err(error) = view.meta() {
        report.problems.push(Problem::read(&error));
    }

    let mut runs = snapshot_facts(view, &mut report);

    let resumes: BTreeMap<RunId, RunId> = match view.resumes() {
        Ok(listed) => listed.into_iter().collect(),
        Err(error) => {
            report.problems.push(Problem::read(&error));
            BTreeMap::new()
        }
    };
    // Records come in key order, run by run; each run is checked once its last record is in.
    let mut writer_max: HashMap<WriterId, u64> = HashMap::new();
    let mut current: Option<(RunId, Vec<Record>, bool)> = None;
    let finish = |report: &mut Report,
                  runs: &mut BTreeMap<RunId, RunFacts>,
                  (run, records, is_damaged): (RunId, Vec<Record>, bool)| {
        let facts = runs.entry(run).or_default();
        if is_damaged {
            report.problems.push(
                Problem::new(
                    Severity::Damaged,
                    ProblemKind::Fold,
                    format!(
                        "run {run} was not folded or projected: some of its records are damaged"
                    ),
                )
                .of_run(run),
            );
            return;
        }
        let stored = view.stored_snapshot(run);
        let (folded, problems) = fold_and_compare(run, &records, stored);
        report.problems.extend(problems);
        let Some(folded) = folded else { return };
        if facts.facts.is_none() {
            facts.facts = Some(IndexFacts::of(&folded));
        }
        facts.resumed_from = ResumeLinks::resumed_from_records(&records);
        facts.ended_unstarted = folded.ended_unstarted();
        if let Some(home) = home {
            let links = ResumeLinks {
                resumed_from: facts.resumed_from,
                resumed_by: resumes.get(&run).copied(),
            };
            let plan = projection::plan(home, &folded, &records, &links);
            report.files += plan.files.len() as u64;
            report.problems.extend(projection_problems(&plan));
        }
    };
    let scanned = view.scan_records(|run, seq, record| {
        report.records += 1;
        runs.entry(run).or_default().record_count += 1;
        if current.as_ref().is_some_and(|(open, _, _)| *open != run)
            && let Some(done) = current.take()
        {
            finish(&mut report, &mut runs, done);
        }
        let (_, records, is_damaged) = current.get_or_insert_with(|| (run, Vec::new(), false));
        match record {
            Ok(record) => {
                let mark = writer_max.entry(record.writer).or_insert(0);
                *mark = (*mark).max(record.writer_seq);
                records.push(record);
            }
            Err(error) => {
                *is_damaged = true;
                let mut problem = Problem::corrupt(&error);
                problem.seq = problem.seq.or(Some(seq));
                report.problems.push(problem);
            }
        }
        true
    });
    if let Some(done) = current.take() {
        finish(&mut report, &mut runs, done);
    }
    if let Err(error) = scanned {
        report.problems.push(Problem::read(&error));
    }
    report.runs = runs.len() as u64;

    check_snapshot_presence(&runs, &mut report);

    check_log(view, &mut runs, &mut report);
    check_active(view, &runs, &mut report);
    check_queues(view, &runs, &mut report);
    check_delayed(view, &runs, &mut report);
    check_dependents(view, &runs, &mut report);
    check_unique(view, &runs, &mut report);
    check_terminal(view, &runs, &mut report);
    check_aliases(view, &runs, &mut report);
    check_resumes(&resumes, &runs, &mut report);
    check_writer_marks(view, &writer_max, &mut report);
    report
}

/// The stored snapshot of a run as [`View::stored_snapshot`] reads it.
type Stored = Result<Option<Result<RunState, SnapshotError>>, ReadError>;

/// Folds `records` and compares the fold with the stored snapshot. Returns the fold (when the
/// records fold) and the problems found; a snapshot that does not decode is not among them
/// (its caller reports it).
fn fold_and_compare(
    run: RunId,
    records: &[Record],
    stored: Stored,
) -> (Option<RunState>, Vec<Problem>) {
    let mut problems = Vec::new();
    let mut folded: Option<RunState> = None;
    for record in records {
        let applied = match &mut folded {
            None => state::apply(None, record).map(|state| folded = Some(state)),
            Some(state) => state.apply_mut(record),
        };
        if let Err(error) = applied {
            problems.push(
                Problem::new(
                    Severity::Damaged,
                    ProblemKind::Fold,
                    format!("the records of run {run} do not fold: {error}"),
                )
                .of_run(run)
                .at_seq(record.seq),
            );
            return (None, problems);
        }
    }
    let Some(folded) = folded else {
        return (None, problems);
    };
    match stored {
        Ok(Some(Ok(stored))) if stored == folded => {}
        Ok(Some(Ok(stored))) => {
            let mut problem = Problem::new(
                Severity::Inconsistent,
                ProblemKind::SnapshotDiffers,
                format!(
                    "the stored snapshot of run {run} differs from the fold of its {} records",
                    records.len()
                ),
            )
            .of_run(run);
            let stored = serde_json::to_value(&stored).unwrap_or(Value::Null);
            let folded_value = serde_json::to_value(&folded).unwrap_or(Value::Null);
            problem.changes = value_changes(&stored, &folded_value, ("stored", "folded"));
            problems.push(problem);
        }
        // A run without a snapshot is reported once, by the caller that saw the whole table.
        Ok(None) => {}
        // A snapshot that does not decode is reported by the caller.
        Ok(Some(Err(_))) => {}
        Err(error) => problems.push(Problem::read(&error).of_run(run)),
    }
    (Some(folded), problems)
}

/// A run re-derived from its records, as `journal-tools replay` renders it.
#[derive(Debug, Clone)]
pub struct Rederived {
    pub run: RunId,
    /// The records folded (up to the seq asked for).
    pub records: Vec<Record>,
    /// The fold; `None` when the records are damaged or do not fold.
    pub state: Option<RunState>,
    /// What was found wrong: damaged records, a fold that fails, a snapshot that differs.
    pub problems: Vec<Problem>,
    /// Its resume links: the run it resumed from its records, the run that resumed it from
    /// the journal's resume index.
    pub links: ResumeLinks,
}

/// Reads a run's records (up to `until_seq`, if given), folds them, and — for the whole run —
/// compares the fold with the stored snapshot.
pub fn rederive(view: &View, run: RunId, until_seq: Option<u64>) -> Rederived {
    let records = match view.records_until(run, until_seq.unwrap_or(u64::MAX)) {
        Ok(records) => records,
        Err(error) => {
            return Rederived {
                run,
                records: Vec::new(),
                state: None,
                problems: vec![Problem::read(&error).of_run(run)],
                links: ResumeLinks::default(),
            };
        }
    };
    let stored = match until_seq {
        // The snapshot is the state at the head; an earlier state has nothing to compare with.
        Some(_) => Ok(None),
        None => view.stored_snapshot(run),
    };
    let (state, problems) = match stored {
        Ok(Some(Err(error))) => {
            let (state, mut problems) = fold_and_compare(run, &records, Ok(None));
            problems.push(Problem::snapshot(run, &error));
            (state, problems)
        }
        stored => fold_and_compare(run, &records, stored),
    };
    let mut problems = problems;
    let links = ResumeLinks {
        resumed_from: ResumeLinks::resumed_from_records(&records),
        resumed_by: match view.resume_links(run) {
            Ok(links) => links.resumed_by,
            Err(error) => {
                problems.push(Problem::read(&error).of_run(run));
                None
            }
        },
    };
    Rederived {
        run,
        records,
        state,
        problems,
        links,
    }
}

/// Compares a plan with the files on disk ([`projection::check_plan`]) and says what each
/// difference means. A result file or result-index entry that was published and is gone is a
/// [`Severity::Note`] (the host deletes them once delivered); one never published, or one that
/// exists but differs, is a problem like any other file.
pub fn projection_problems(plan: &projection::Plan) -> Vec<Problem> {
    projection::check_plan(plan)
        .into_iter()
        .map(|difference| difference_problem(&difference))
        .collect()
}

/// Says what one projection difference means.
pub fn difference_problem(difference: &Difference) -> Problem {
    let Difference {
        run,
        kind,
        path,
        problem,
    } = difference;
    let (severity, message, changes) = match problem {
        projection::Problem::Consumed => (
            Severity::Note,
            format!(
                "{} of run {run} was published and is gone (consumed by the host)",
                kind.as_str()
            ),
            Vec::new(),
        ),
        projection::Problem::Missing => (
            Severity::Inconsistent,
            format!("{} of run {run} is missing", kind.as_str()),
            Vec::new(),
        ),
        projection::Problem::Unexpected => (
            Severity::Inconsistent,
            format!(
                "{} of run {run} exists but should not (the run's state says otherwise)",
                kind.as_str()
            ),
            Vec::new(),
        ),
        projection::Problem::Unreadable { reason } => (
            Severity::Inconsistent,
            format!("{} of run {run} cannot be read: {reason}", kind.as_str()),
            Vec::new(),
        ),
        projection::Problem::Differs { on_disk, expected } => (
            Severity::Inconsistent,
            format!(
                "{} of run {run} differs from a fresh projection",
                kind.as_str()
            ),
            field_changes(on_disk, expected),
        ),
    };
    Problem {
        severity,
        kind: ProblemKind::Projection,
        run: Some(*run),
        seq: None,
        file: Some((*kind, path.clone())),
        message,
        changes,
    }
}

/// How many times [`recheck_projections`] looks again at a run whose head keeps moving.
const RECHECK_ATTEMPTS: u32 = 5;

/// The most looks at a run whose only problem is its status.json, which may trail its head
/// while a writer coalesces samples: enough to wait out [`STATUS_TRAIL`].
const STATUS_RECHECK_ATTEMPTS: u32 = 10;

/// How long a status.json may trail its run's head on a live home: the coalescing window of
/// samples, and as long again for its writer to get to it.
const STATUS_TRAIL: std::time::Duration =
    std::time::Duration::from_millis(2 * STATUS_COALESCE.as_millis() as u64);

/// Checks the projection problems of `problems` again, run by run, each under its run's lock
/// (where the lock file exists) and from a fresh view, and keeps only those that are still
/// there. On a live home a projection trails its commit for a moment (the projector writes
/// just after the commit, under the lock), and a status.json whose run only moved by samples
/// trails it up to the coalescing window: a run whose head moved between two looks is looked
/// at again, a few times, and one whose only problem is its status.json until `STATUS_TRAIL`
/// passed, so such a moment is not reported as damage.
pub fn recheck_projections(
    home: &Home,
    journal: &impl ReadJournal,
    problems: Vec<Problem>,
) -> Vec<Problem> {
    let runs: BTreeSet<RunId> = problems
        .iter()
        .filter(|problem| problem.kind == ProblemKind::Projection)
        .filter_map(|problem| problem.run)
        .collect();
    let mut out: Vec<Problem> = problems
        .into_iter()
        .filter(|problem| problem.kind != ProblemKind::Projection)
        .collect();
    for run in runs {
        let started = std::time::Instant::now();
        let mut last_head = None;
        for attempt in 1..=STATUS_RECHECK_ATTEMPTS {
            let (head, found) = recheck_run(home, journal, run);
            let may_trail = !found.is_empty()
                && found
                    .iter()
                    .all(|problem| matches!(problem.file, Some((FileKind::Status, _))))
                && started.elapsed() < STATUS_TRAIL;
            let has_settled = !may_trail && (head == last_head || attempt >= RECHECK_ATTEMPTS);
            if found.is_empty() || has_settled || attempt == STATUS_RECHECK_ATTEMPTS {
                out.extend(found);
                break;
            }
            last_head = head;
            std::thread::sleep(std::time::Duration::from_millis(10 * u64::from(attempt)));
        }
    }
    out
}

/// One look at a run's projection under its lock: the head seen, and the problems found.
fn recheck_run(home: &Home, journal: &impl ReadJournal, run: RunId) -> (Option<u64>, Vec<Problem>) {
    let lock_path = home.lock_path(run);
    let _lock = if matches!(crate::durable_fs::look(&lock_path), Ok(Some(_))) {
        match crate::projection::lock_run_within(run, &lock_path, crate::projection::RUN_LOCK_WAIT)
        {
            Ok(lock) => Some(lock),
            Err(error) => {
                let problem = Problem::new(
                    Severity::Unchecked,
                    ProblemKind::Projection,
                    format!("cannot lock {}: {error}", lock_path.display()),
                )
                .of_run(run);
                return (None, vec![problem]);
            }
        }
    } else {
        None
    };
    let view = match journal.view() {
        Ok(view) => view,
        Err(error) => return (None, vec![Problem::read(&error).of_run(run)]),
    };
    let rederived = rederive(&view, run, None);
    drop(view);
    let Some(state) = &rederived.state else {
        return (None, Vec::new());
    };
    let found = projection_problems(&projection::plan(
        home,
        state,
        &rederived.records,
        &rederived.links,
    ));
    (Some(state.head_seq), found)
}

fn check_log(view: &View, runs: &mut BTreeMap<RunId, RunFacts>, report: &mut Report) {
    let mut expected_global = 1u64;
    let mut problems = Vec::new();
    // Pruning leaves gaps in the log: then only the count is checked, the entries left and the
    // pruned ones adding up to the head.
    let pruned = match view.pruned_records() {
        Ok(pruned) => pruned,
        Err(error) => {
            problems.push(Problem::read(&error));
            0
        }
    };
    let mut entries = 0u64;
    let scanned = view.scan_log(|global, run, seq| {
        entries += 1;
        if global != expected_global && pruned == 0 {
            problems.push(Problem::new(
                Severity::Inconsistent,
                ProblemKind::Log,
                format!("the log jumps from global seq {} to {global}", expected_global - 1),
            ));
        }
        expected_global = global.saturating_add(1);
        let Some(facts) = runs.get_mut(&run) else {
            problems.push(
                Problem::new(
                    Severity::Inconsistent,
                    ProblemKind::Log,
                    format!(
                        "the log names record {seq} of run {run} at global seq {global}, but the journal has no such run"
                    ),
                )
                .of_run(run)
                .at_seq(seq),
            );
            return true;
        };
        let next = facts.log_next_seq.max(1);
        if seq != next {
            problems.push(
                Problem::new(
                    Severity::Inconsistent,
                    ProblemKind::Log,
                    format!(
                        "the log names record {seq} of run {run} at global seq {global}, where record {next} was due"
                    ),
                )
                .of_run(run)
                .at_seq(seq),
            );
        }
        if seq == 1 {
            facts.created_global = Some(global);
        }
        facts.log_next_seq = seq.saturating_add(1).max(next);
        true
    });
    if let Err(error) = scanned {
        problems.push(Problem::read(&error));
    }
    if pruned > 0 {
        match view.global_head() {
            Ok(head) if head != entries + pruned => problems.push(Problem::new(
                Severity::Inconsistent,
                ProblemKind::Log,
                format!(
                    "the log holds {entries} entries and prunes removed {pruned}, but its head is global seq {head}"
                ),
            )),
            Ok(_) => {}
            Err(error) => problems.push(Problem::read(&error)),
        }
    }
    for (run, facts) in runs.iter() {
        let logged = facts.log_next_seq.saturating_sub(1);
        if logged != facts.record_count {
            problems.push(
                Problem::new(
                    Severity::Inconsistent,
                    ProblemKind::Log,
                    format!(
                        "the log names records up to seq {logged} of run {run}, which has {} records",
                        facts.record_count
                    ),
                )
                .of_run(*run),
            );
        }
    }
    report.problems.extend(problems);
}

fn check_active(view: &View, runs: &BTreeMap<RunId, RunFacts>, report: &mut Report) {
    let listed: BTreeSet<RunId> = match view.active_runs() {
        Ok(listed) => listed.into_iter().collect(),
        Err(error) => {
            report.problems.push(Problem::read(&error));
            return;
        }
    };
    for (run, facts) in runs {
        let Some(facts) = &facts.facts else { continue };
        let message = match (facts.is_closed, listed.contains(run)) {
            (true, true) => format!("run {run} is closed but the active index lists it"),
            (false, false) => format!("run {run} is not closed but the active index lacks it"),
            _ => continue,
        };
        report.problems.push(
            Problem::new(Severity::Inconsistent, ProblemKind::ActiveIndex, message).of_run(*run),
        );
    }
    for run in listed.iter().filter(|run| !runs.contains_key(run)) {
        report.problems.push(
            Problem::new(
                Severity::Inconsistent,
                ProblemKind::ActiveIndex,
                format!("the active index lists run {run}, which the journal does not hold"),
            )
            .of_run(*run),
        );
    }
}

/// The `delayed` index against the runs: each run waiting for its due time listed once, at
/// that time; nothing else.
fn check_delayed(view: &View, runs: &BTreeMap<RunId, RunFacts>, report: &mut Report) {
    let listed = match view.soonest_delayed(usize::MAX) {
        Ok(listed) => listed,
        Err(error) => {
            report.problems.push(Problem::read(&error));
            return;
        }
    };
    let problem = |run: RunId, message: String| {
        Problem::new(Severity::Inconsistent, ProblemKind::DelayedIndex, message).of_run(run)
    };
    let listed: BTreeSet<(UnixMs, RunId)> = listed.into_iter().collect();
    let expected: BTreeSet<(UnixMs, RunId)> = runs
        .iter()
        .filter_map(|(run, facts)| {
            let due = facts.facts.as_ref()?.due_waiting?;
            Some((due, *run))
        })
        .collect();
    for (due, run) in expected.difference(&listed) {
        report.problems.push(problem(
            *run,
            format!("run {run} waits for its due time {due} ms but the delayed index lacks it"),
        ));
    }
    for (due, run) in listed.difference(&expected) {
        report.problems.push(problem(
            *run,
            format!(
                "the delayed index lists run {run} due at {due} ms, which does not wait for that"
            ),
        ));
    }
}

/// The `dependents` index against the runs: for each run waiting for others to end, one
/// entry per run it waits for; nothing else.
fn check_dependents(view: &View, runs: &BTreeMap<RunId, RunFacts>, report: &mut Report) {
    let listed = match view.dependency_edges() {
        Ok(listed) => listed,
        Err(error) => {
            report.problems.push(Problem::read(&error));
            return;
        }
    };
    let problem = |run: RunId, message: String| {
        Problem::new(
            Severity::Inconsistent,
            ProblemKind::DependentsIndex,
            message,
        )
        .of_run(run)
    };
    let listed: BTreeSet<(RunId, RunId)> = listed.into_iter().collect();
    let expected: BTreeSet<(RunId, RunId)> = runs
        .iter()
        .filter_map(|(run, facts)| Some((*run, &facts.facts.as_ref()?.waits_for)))
        .flat_map(|(run, waits_for)| waits_for.iter().map(move |dependency| (*dependency, run)))
        .collect();
    for (dependency, run) in expected.difference(&listed) {
        report.problems.push(problem(
            *run,
            format!(
                "run {run} waits for run {dependency} to end but the dependents index lacks it"
            ),
        ));
    }
    for (dependency, run) in listed.difference(&expected) {
        report.problems.push(problem(
            *run,
            format!(
                "the dependents index lists run {run} as waiting for run {dependency}, which it does not wait for"
            ),
        ));
    }
}

/// The `unique` index against the runs: each entry names a run in the journal that took that
/// key (a pruned run's entry goes with it); each run that took a key and has not ended is the
/// one listed under it.
fn check_unique(view: &View, runs: &BTreeMap<RunId, RunFacts>, report: &mut Report) {
    let listed = match view.unique_entries() {
        Ok(listed) => listed,
        Err(error) => {
            report.problems.push(Problem::read(&error));
            return;
        }
    };
    let problem = |run: RunId, message: String| {
        Problem::new(Severity::Inconsistent, ProblemKind::UniqueIndex, message).of_run(run)
    };
    let listed: BTreeMap<String, RunId> = listed.into_iter().collect();
    for (key, run) in &listed {
        let took = runs
            .get(run)
            .and_then(|facts| facts.facts.as_ref())
            .and_then(|facts| facts.unique.as_ref());
        if took != Some(key) {
            report.problems.push(problem(
                *run,
                format!(
                    "the unique index lists run {run} under key {key:?}, which it did not take"
                ),
            ));
        }
    }
    for (run, facts) in runs {
        let Some(facts) = &facts.facts else { continue };
        let (Some(key), None) = (&facts.unique, facts.ended_at_ms) else {
            continue;
        };
        if listed.get(key) != Some(run) {
            report.problems.push(problem(
                *run,
                format!(
                    "run {run} holds key {key:?} but the unique index does not list it under it"
                ),
            ));
        }
    }
}

/// The queue indexes against the runs: each waiting run listed once under its queue, at the
/// global seq of its `QueueJoined`; each run holding a slot listed under its queue; nothing
/// else.
fn check_queues(view: &View, runs: &BTreeMap<RunId, RunFacts>, report: &mut Report) {
    let (waiting, active) = match view.queue_index() {
        Ok(index) => index,
        Err(error) => {
            report.problems.push(Problem::read(&error));
            return;
        }
    };
    let problem = |run: RunId, message: String| {
        Problem::new(Severity::Inconsistent, ProblemKind::QueueIndex, message).of_run(run)
    };
    let listed_waiting: BTreeMap<RunId, (String, Option<u64>)> = waiting
        .iter()
        .map(|entry| (entry.run, (entry.queue.clone(), entry.joined_global_seq)))
        .collect();
    let listed_active: BTreeSet<(String, RunId)> = active
        .iter()
        .map(|entry| (entry.queue.clone(), entry.run))
        .collect();
    if listed_waiting.len() != waiting.len() {
        report.problems.push(Problem::new(
            Severity::Inconsistent,
            ProblemKind::QueueIndex,
            "a run is listed more than once among the waiting runs".to_string(),
        ));
    }
    for (run, facts) in runs {
        let Some(facts) = &facts.facts else { continue };
        let queue = facts.queue.clone().unwrap_or_default();
        match (facts.is_waiting, listed_waiting.get(run)) {
            (true, None) => report.problems.push(problem(
                *run,
                format!("run {run} waits in queue {queue} but its index lacks it"),
            )),
            (false, Some((listed, _))) => report.problems.push(problem(
                *run,
                format!("run {run} does not wait, but queue {listed}'s index lists it"),
            )),
            (true, Some((listed, joined))) => {
                let expected = view.global_of(*run, 2).ok().flatten();
                if *listed != queue || *joined != expected {
                    report.problems.push(problem(
                        *run,
                        format!(
                            "run {run} waits in queue {queue}, but the index lists it in queue {listed} at {joined:?}, not at {expected:?}"
                        ),
                    ));
                }
            }
            (false, None) => {}
        }
        let is_listed_active = listed_active.contains(&(queue.clone(), *run));
        if facts.holds_slot != is_listed_active {
            report.problems.push(problem(
                *run,
                if facts.holds_slot {
                    format!("run {run} holds a slot of queue {queue} but its index lacks it")
                } else {
                    format!("run {run} holds no slot, but queue {queue}'s index lists it")
                },
            ));
        }
    }
    for (queue, run) in listed_active.iter().filter(|(queue, run)| {
        runs.get(run)
            .and_then(|facts| facts.facts.as_ref())
            .is_none_or(|facts| facts.queue.as_deref() != Some(queue.as_str()))
    }) {
        report.problems.push(problem(
            *run,
            format!("queue {queue}'s index lists run {run} as active, which is not in it"),
        ));
    }
    for run in listed_waiting.keys().filter(|run| !runs.contains_key(run)) {
        report.problems.push(problem(
            *run,
            format!("a queue's index lists run {run}, which the journal does not hold"),
        ));
    }
}

fn check_terminal(view: &View, runs: &BTreeMap<RunId, RunFacts>, report: &mut Report) {
    let listed: BTreeSet<(UnixMs, RunId)> = match view.terminal_index() {
        Ok(listed) => listed.into_iter().collect(),
        Err(error) => {
            report.problems.push(Problem::read(&error));
            return;
        }
    };
    let expected: BTreeSet<(UnixMs, RunId)> = runs
        .iter()
        .filter_map(|(run, facts)| {
            let ended = facts.facts.as_ref()?.ended_at_ms?;
            Some((ended, *run))
        })
        .collect();
    for (ended, run) in expected.difference(&listed) {
        report.problems.push(
            Problem::new(
                Severity::Inconsistent,
                ProblemKind::TerminalIndex,
                format!("run {run} ended at {ended} ms but the terminal index lacks it"),
            )
            .of_run(*run),
        );
    }
    for (ended, run) in listed.difference(&expected) {
        let why = match runs.get(run).map(|facts| facts.facts.as_ref()) {
            None => "the journal does not hold it".to_string(),
            // The run's snapshot and records are damaged (reported already): nothing to judge by.
            Some(None) => continue,
            Some(Some(facts)) => match facts.ended_at_ms {
                None => "the run is not terminal".to_string(),
                Some(actual) => format!("the run ended at {actual} ms"),
            },
        };
        report.problems.push(
            Problem::new(
                Severity::Inconsistent,
                ProblemKind::TerminalIndex,
                format!("the terminal index lists run {run} as ended at {ended} ms, but {why}"),
            )
            .of_run(*run),
        );
    }
}

/// The resume index against the records: each run in the journal that a `Resumed` names is
/// linked to the run that recorded it (or that run ended before a runner took it, and a later
/// resume took its place), and each entry names a run in the journal (pruning a run takes its
/// entry) and a run that recorded resuming it, or one no longer in the journal (pruned: its
/// tombstone may be gone too).
fn check_resumes(
    resumes: &BTreeMap<RunId, RunId>,
    runs: &BTreeMap<RunId, RunFacts>,
    report: &mut Report,
) {
    let mut problem = |run: RunId, text: String| {
        report
            .problems
            .push(Problem::new(Severity::Inconsistent, ProblemKind::ResumeIndex, text).of_run(run));
    };
    for (run, facts) in runs {
        let Some(from) = facts.resumed_from else {
            continue;
        };
        let is_there = runs.get(&from).is_some_and(|old| old.record_count > 0);
        match resumes.get(&from) {
            Some(by) if by == run => {}
            _ if !is_there => {}
            _ if facts.ended_unstarted => {}
            Some(by) => problem(
                from,
                format!("run {run} resumed run {from}, but the resume index names run {by}"),
            ),
            None => problem(
                from,
                format!("run {run} resumed run {from}, which the resume index does not link"),
            ),
        }
    }
    for (from, by) in resumes {
        if runs.get(from).is_none_or(|old| old.record_count == 0) {
            problem(
                *from,
                format!(
                    "the resume index links run {from}, which is not in the journal, to run {by}"
                ),
            );
            continue;
        }
        match runs.get(by) {
            Some(new) if new.record_count > 0 && new.resumed_from != Some(*from) => problem(
                *from,
                format!(
                    "the resume index says run {by} resumed run {from}, but its records do not"
                ),
            ),
            _ => {}
        }
    }
}

fn check_aliases(view: &View, runs: &BTreeMap<RunId, RunFacts>, report: &mut Report) {
    let listed: BTreeMap<String, RunId> = match view.aliases() {
        Ok(listed) => listed.into_iter().collect(),
        Err(error) => {
            report.problems.push(Problem::read(&error));
            return;
        }
    };
    // The latest run wins an alias: the one whose RunCreated was committed last.
    let mut expected: BTreeMap<String, (u64, RunId)> = BTreeMap::new();
    for (run, facts) in runs {
        let Some(index_facts) = &facts.facts else {
            continue;
        };
        let created = facts.created_global.unwrap_or(0);
        let aliases = [
            index_facts.tool_call_id.as_deref().map(tool_call_alias),
            index_facts.name.as_deref().map(name_alias),
        ];
        for alias in aliases.into_iter().flatten() {
            let entry = expected.entry(alias).or_insert((created, *run));
            if created >= entry.0 {
                *entry = (created, *run);
            }
        }
    }
    // A pruned run keeps its aliases while it keeps its tombstone, unless a later run took them.
    let tombstones = match view.tombstones() {
        Ok(tombstones) => tombstones,
        Err(error) => {
            report.problems.push(Problem::read(&error));
            Vec::new()
        }
    };
    for tombstone in &tombstones {
        if runs.contains_key(&tombstone.run_id) {
            report.problems.push(
                Problem::new(
                    Severity::Inconsistent,
                    ProblemKind::Alias,
                    format!(
                        "run {} has a tombstone but is still in the journal",
                        tombstone.run_id
                    ),
                )
                .of_run(tombstone.run_id),
            );
        }
        let aliases = [
            tombstone.tool_call_id.as_deref().map(tool_call_alias),
            tombstone.name.as_deref().map(name_alias),
        ];
        for alias in aliases.into_iter().flatten() {
            let entry = expected
                .entry(alias)
                .or_insert((tombstone.created_global, tombstone.run_id));
            if tombstone.created_global >= entry.0 {
                *entry = (tombstone.created_global, tombstone.run_id);
            }
        }
    }
    // A run whose snapshot and records are both damaged (reported already) may hold any
    // alias: an alias pointing to one cannot be judged.
    let is_unknown = |run: &RunId| runs.get(run).is_some_and(|facts| facts.facts.is_none());
    for (alias, (_, run)) in &expected {
        let message = match listed.get(alias) {
            Some(found) if found == run => continue,
            Some(found) if is_unknown(found) => continue,
            Some(found) => format!(
                "alias {alias:?} points to run {found}, but the latest run it names is {run}"
            ),
            None => format!("alias {alias:?} of run {run} is missing"),
        };
        report
            .problems
            .push(Problem::new(Severity::Inconsistent, ProblemKind::Alias, message).of_run(*run));
    }
    for (alias, run) in listed
        .iter()
        .filter(|(alias, run)| !expected.contains_key(*alias) && !is_unknown(run))
    {
        report.problems.push(
            Problem::new(
                Severity::Inconsistent,
                ProblemKind::Alias,
                format!("alias {alias:?} points to run {run}, which does not carry it"),
            )
            .of_run(*run),
        );
    }
}

fn check_writer_marks(view: &View, writer_max: &HashMap<WriterId, u64>, report: &mut Report) {
    let mut writers: Vec<(&WriterId, &u64)> = writer_max.iter().collect();
    writers.sort();
    for (writer, max) in writers {
        match view.writer_mark(*writer) {
            // Above its last batch: the writer's later batches were refused, which spends
            // their seqs too. Below it, a batch could be applied twice.
            Ok(Some(mark)) if mark >= *max => {}
            Ok(mark) => report.problems.push(Problem::new(
                Severity::Inconsistent,
                ProblemKind::WriterMark,
                format!(
                    "writer {writer} has mark {}, but its last batch in the records is writer seq {max}",
                    mark.map_or_else(|| "none".to_string(), |mark| mark.to_string())
                ),
            )),
            Err(error) => report.problems.push(Problem::read(&error)),
        }
    }
}

/// The outcome of redb's integrity check of a copy of a journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Integrity {
    /// The copy was flagged as needing recovery (taken beside live writers, or of a journal
    /// whose writer crashed) and was recovered before the check.
    pub was_recovered: bool,
    /// What the check found; empty when it passed.
    pub problems: Vec<Problem>,
}

/// Runs redb's integrity check on a private copy of the journal at `journal_path`, made in
/// `scratch_dir` ([`crate::journal::copy_consistent`]), so the journal itself is never written.
/// An `Err` means the check could not run at all.
pub fn check_integrity_of_copy(
    journal_path: &Path,
    scratch_dir: &Path,
) -> Result<Integrity, crate::journal::CopyError> {
    let copy = scratch_dir.join("journal-copy.redb");
    crate::journal::copy_consistent(journal_path, &copy)?;
    let was_recovered = matches!(
        crate::journal::JournalReader::open(&copy),
        Err(crate::journal::OpenError::NeedsRecovery { .. })
    );
    let outcome = match Journal::open(&copy) {
        Err(error) => Err(format!("a copy of the journal does not open: {error}")),
        Ok(journal) => match journal.check_integrity() {
            Ok(true) => Ok(()),
            Ok(false) => Err(concat!(
                "redb's integrity check failed ",
                "(redb could repair the copy; the journal itself is untouched)"
            )
            .to_string()),
            Err(error) => Err(format!("redb's integrity check failed: {error}")),
        },
    };
    let problems = match outcome {
        Ok(()) => Vec::new(),
        Err(message) => vec![Problem::new(
            Severity::Damaged,
            ProblemKind::Integrity,
            message,
        )],
    };
    std::fs::remove_file(&copy).ok();
    Ok(Integrity {
        was_recovered,
        problems,
    })
}

/// A short diff of two projected files: the JSON fields that differ, one line each, as
/// `path: <on disk> on disk, <expected> expected`. JSON Lines files are compared line by line.
pub fn field_changes(on_disk: &[u8], expected: &[u8]) -> Vec<String> {
    let parse = |bytes: &[u8]| serde_json::from_slice::<Value>(bytes);
    let mut changes = match (parse(on_disk), parse(expected)) {
        (Ok(disk), Ok(expected)) => value_changes(&disk, &expected, ("on disk", "expected")),
        (Err(error), Ok(_)) => vec![format!("on disk: not valid JSON ({error})")],
        _ => lines_changes(on_disk, expected),
    };
    if changes.is_empty() {
        changes.push("the bytes differ, the JSON values are equal (formatting)".to_string());
    }
    changes
}

fn lines_changes(on_disk: &[u8], expected: &[u8]) -> Vec<String> {
    let lines = |bytes: &'_ [u8]| -> Vec<Vec<u8>> {
        bytes
            .split(|byte| *byte == b'\n')
            .filter(|line| !line.is_empty())
            .map(<[u8]>::to_vec)
            .collect()
    };
    let (disk, expected) = (lines(on_disk), lines(expected));
    let mut changes = Vec::new();
    if disk.len() != expected.len() {
        changes.push(format!(
            "{} lines on disk, {} expected",
            disk.len(),
            expected.len()
        ));
    }
    for (index, (disk, expected)) in disk.iter().zip(&expected).enumerate() {
        if disk == expected {
            continue;
        }
        let label = format!("line {}", index + 1);
        match (
            serde_json::from_slice::<Value>(disk),
            serde_json::from_slice::<Value>(expected),
        ) {
            (Ok(disk), Ok(expected)) => {
                let mut found = Vec::new();
                diff_values(
                    &label,
                    &disk,
                    &expected,
                    ("on disk", "expected"),
                    &mut found,
                );
                changes.extend(found);
            }
            _ => changes.push(format!("{label}: not valid JSON on disk")),
        }
        if changes.len() > MAX_CHANGES {
            break;
        }
    }
    cap(changes)
}

fn value_changes(a: &Value, b: &Value, labels: (&str, &str)) -> Vec<String> {
    let mut changes = Vec::new();
    diff_values("", a, b, labels, &mut changes);
    cap(changes)
}

fn cap(mut changes: Vec<String>) -> Vec<String> {
    if changes.len() > MAX_CHANGES {
        let more = changes.len() - (MAX_CHANGES - 1);
        changes.truncate(MAX_CHANGES - 1);
        changes.push(format!("... and {more} more"));
    }
    changes
}

fn short(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() <= MAX_VALUE_CHARS {
        text
    } else {
        let cut: String = text.chars().take(MAX_VALUE_CHARS - 1).collect();
        format!("{cut}…")
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn diff_values(path: &str, a: &Value, b: &Value, labels: (&str, &str), out: &mut Vec<String>) {
    // Far more changes than can be shown are not worth finding.
    if out.len() > MAX_CHANGES * 4 {
        return;
    }
    let (a_label, b_label) = labels;
    let shown = if path.is_empty() { "value" } else { path };
    match (a, b) {
        (Value::Object(a_fields), Value::Object(b_fields)) => {
            for (key, b_value) in b_fields {
                match a_fields.get(key) {
                    Some(a_value) => diff_values(&join(path, key), a_value, b_value, labels, out),
                    None => out.push(format!(
                        "{}: absent {a_label}, {} {b_label}",
                        join(path, key),
                        short(b_value)
                    )),
                }
            }
            for (key, a_value) in a_fields {
                if !b_fields.contains_key(key) {
                    out.push(format!(
                        "{}: {} {a_label}, absent {b_label}",
                        join(path, key),
                        short(a_value)
                    ));
                }
            }
        }
        (Value::Array(a_items), Value::Array(b_items)) => {
            if a_items.len() != b_items.len() {
                out.push(format!(
                    "{shown}: {} items {a_label}, {} {b_label}",
                    a_items.len(),
                    b_items.len()
                ));
            }
            for (index, (a_item, b_item)) in a_items.iter().zip(b_items).enumerate() {
                diff_values(&format!("{path}[{index}]"), a_item, b_item, labels, out);
            }
        }
        _ if a != b => out.push(format!(
            "{shown}: {} {a_label}, {} {b_label}",
            short(a),
            short(b)
        )),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_changes_name_the_fields_that_differ() {
        let on_disk = br#"{"state": "running", "steps": [{"status": "running"}], "old": 1}"#;
        let expected = br#"{"state": "complete", "steps": [{"status": "complete"}], "new": 2}"#;
        assert_eq!(
            field_changes(on_disk, expected),
            vec![
                r#"state: "running" on disk, "complete" expected"#,
                r#"steps[0].status: "running" on disk, "complete" expected"#,
                "new: absent on disk, 2 expected",
                "old: 1 on disk, absent expected",
            ]
        );
    }

    #[test]
    fn field_changes_of_json_lines_compare_line_by_line() {
        let on_disk = b"{\"seq\":1}\n{\"seq\":3}\n";
        let expected = b"{\"seq\":1}\n{\"seq\":2}\n{\"seq\":3}\n";
        assert_eq!(
            field_changes(on_disk, expected),
            vec![
                "2 lines on disk, 3 expected",
                "line 2.seq: 3 on disk, 2 expected"
            ]
        );
    }

    #[test]
    fn field_changes_of_a_torn_file_say_it_is_not_json() {
        let changes = field_changes(b"{\"sta", b"{\"state\": 1}");
        assert_eq!(changes.len(), 1);
        assert!(
            changes[0].starts_with("on disk: not valid JSON"),
            "{changes:?}"
        );
    }

    #[test]
    fn field_changes_are_capped() {
        let on_disk: serde_json::Map<String, Value> = (0..20)
            .map(|index| (format!("k{index}"), Value::from(index)))
            .collect();
        let expected: serde_json::Map<String, Value> = (0..20)
            .map(|index| (format!("k{index}"), Value::from(index + 1)))
            .collect();
        let changes = field_changes(
            &serde_json::to_vec(&on_disk).expect("serializes"),
            &serde_json::to_vec(&expected).expect("serializes"),
        );
        assert_eq!(changes.len(), MAX_CHANGES);
        assert_eq!(changes[MAX_CHANGES - 1], "... and 13 more");
    }
}
