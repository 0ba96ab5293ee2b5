//! Rebuilding projections from the journal (`journal-tools replay`, or a host): each run is
//! re-derived from its records, rendered with [`projection::plan`], and either written — in
//! place under the run's lock, or into a directory laid out as a home — or only compared with
//! the disk.
//!
//! Invariants:
//! * in place, a run is replayed under its lock (`runs/<id>/.lock`), from a view read under
//!   that lock, as every projector writes: a replay never puts back an older state than one
//!   a projector just wrote; an older state (`until_seq`) is rendered only out of place;
//! * in place, a result file (or result-index entry) that was published and is gone now is
//!   left absent unless [`ReplayOptions::restore_results`]: its host delivered and deleted it,
//!   and writing it again would deliver it twice;
//! * a check writes nothing: no directory made, and a run's lock taken only where its file
//!   exists;
//! * the records are the truth: a run whose records do not fold is reported and skipped, never
//!   projected from its snapshot.

use std::collections::BTreeSet;
use std::io;
use std::path::{Path, PathBuf};

use crate::durable_fs::{self, FileLock};
use crate::event::RunId;
use crate::home::{Home, Layout};
use crate::journal::{ReadError, ReadJournal};
use crate::projection::{self, Content, FileKind, Plan, ProjectionError, ResultPolicy};
use crate::state::RunStatus;
use crate::verify::{self, Problem, Severity};

/// Which runs to replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    Run(RunId),
    All,
}

/// What a replay does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayOptions {
    pub selection: Selection,
    /// Render the run as it stood at this seq of its own (one run, out of place only).
    pub until_seq: Option<u64>,
    /// Write into this directory, laid out as a home, instead of in place. The journal's
    /// own home given here counts as in place.
    pub out_dir: Option<PathBuf>,
    /// The layout of `out_dir`.
    pub out_layout: Layout,
    /// Change nothing; report the files that differ from a fresh projection.
    pub is_check: bool,
    /// In place, also re-create result files (and index entries) a host consumed.
    pub restore_results: bool,
}

/// Why a replay cannot run, or stopped. Input errors come before anything is written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReplayError {
    /// In place (or a check in place) needs the home the journal belongs to.
    #[error("replaying or checking in place needs the journal's home")]
    NeedsHome,
    #[error(
        "restoring consumed results is for in-place replays; out of place every file is written"
    )]
    RestoreResultsOutOfPlace,
    #[error("a state before the head is rendered for one run, into a directory of its own")]
    UntilSeqNeedsOneRunOutOfPlace,
    #[error("run {run} has records 1 to {head_seq}; seq {until_seq} is not among them")]
    UntilSeqOutOfRange {
        run: RunId,
        head_seq: u64,
        until_seq: u64,
    },
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error("creating {path}")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("locking {path}")]
    Lock {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Write(#[from] ProjectionError),
}

impl ReplayError {
    /// Whether the caller asked for something that cannot be (as opposed to a failure
    /// underneath).
    pub fn is_bad_input(&self) -> bool {
        matches!(
            self,
            ReplayError::NeedsHome
                | ReplayError::RestoreResultsOutOfPlace
                | ReplayError::UntilSeqNeedsOneRunOutOfPlace
                | ReplayError::UntilSeqOutOfRange { .. }
        )
    }
}

/// What the file was, before the replay, compared with a fresh projection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Was {
    Missing,
    /// A result (or index entry) published before and gone now: a host consumed it.
    Consumed,
    /// There, where the run's state says nothing should be.
    Unexpected,
    Differing,
    Unreadable,
}

impl Was {
    pub fn as_str(self) -> &'static str {
        match self {
            Was::Missing => "missing",
            Was::Consumed => "consumed",
            Was::Unexpected => "unexpected",
            Was::Differing => "differing",
            Was::Unreadable => "unreadable",
        }
    }

    fn of(problem: &projection::Problem) -> Was {
        match problem {
            projection::Problem::Missing => Was::Missing,
            projection::Problem::Consumed => Was::Consumed,
            projection::Problem::Unexpected => Was::Unexpected,
            projection::Problem::Differs { .. } => Was::Differing,
            projection::Problem::Unreadable { .. } => Was::Unreadable,
        }
    }
}

/// What a replay did with one file that differed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileAction {
    /// Out of place: written.
    Written,
    /// In place: written again.
    Repaired,
    /// In place: removed (it should not exist).
    Removed,
    /// In place: a consumed result left absent.
    LeftAbsent,
}

impl FileAction {
    pub fn as_str(self) -> &'static str {
        match self {
            FileAction::Written => "written",
            FileAction::Repaired => "repaired",
            FileAction::Removed => "removed",
            FileAction::LeftAbsent => "left-absent",
        }
    }
}

/// One file a replay found differing, and what it did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileOutcome {
    pub kind: FileKind,
    pub path: PathBuf,
    pub was: Was,
    pub action: FileAction,
}

/// One run's replay.
#[derive(Debug, Clone)]
pub struct RunReplay {
    pub run: RunId,
    /// What re-deriving the run from its records found: damaged records, a fold that fails, a
    /// snapshot that differs from the fold.
    pub fold_problems: Vec<Problem>,
    /// The state rendered (its status and seq); `None` when the records do not fold and the
    /// run was skipped.
    pub rendered: Option<(RunStatus, u64)>,
    /// A check: the projection problems found (in place, looked at again under the lock so a
    /// projector a moment behind its commit is not reported).
    pub check_problems: Vec<Problem>,
    /// A write: each file that differed, and what was done with it.
    pub files: Vec<FileOutcome>,
    /// Files of the run's projection.
    pub files_planned: u64,
    /// Files written with content (markers and data; absent ones not counted).
    pub files_with_content: u64,
}

impl RunReplay {
    /// The worst problem re-deriving the run found.
    pub fn worst_fold_problem(&self) -> Option<Severity> {
        self.fold_problems
            .iter()
            .map(|problem| problem.severity)
            .max()
    }
}

/// Counts over a replay.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    /// Runs rendered.
    pub runs: u64,
    /// Runs skipped: their records do not fold.
    pub runs_skipped: u64,
    /// Files of the rendered runs' projections.
    pub files: u64,
    /// Files that differed (a check), or were written, repaired or removed.
    pub files_changed: u64,
    /// Result files (and index entries) absent because a host consumed them.
    pub results_left_absent: u64,
}

/// A whole replay, run to its end by [`Replay::run_all`].
#[derive(Debug, Clone)]
pub struct ReplayReport {
    pub runs: Vec<RunReplay>,
    pub totals: Totals,
}

/// A replay prepared: its target and runs chosen and checked. Replay each run with
/// [`Replay::replay_run`] (to report as it goes), or all with [`Replay::run_all`].
pub struct Replay<'journal, J: ReadJournal> {
    journal: &'journal J,
    target: Home,
    is_in_place: bool,
    options: ReplayOptions,
    runs: Vec<RunId>,
    totals: Totals,
}

impl<'journal, J: ReadJournal> Replay<'journal, J> {
    /// Chooses the target and the runs, and checks the options; creates the output directory
    /// of a write out of place. `journal_home` is the home the journal belongs to, if known.
    pub fn prepare(
        journal: &'journal J,
        journal_home: Option<&Home>,
        options: ReplayOptions,
    ) -> Result<Replay<'journal, J>, ReplayError> {
        let (target, is_in_place) = match &options.out_dir {
            Some(dir) if !is_same_dir(dir, journal_home) => {
                (Home::in_layout(dir, options.out_layout), false)
            }
            _ => (journal_home.ok_or(ReplayError::NeedsHome)?.clone(), true),
        };
        if options.restore_results && !is_in_place {
            return Err(ReplayError::RestoreResultsOutOfPlace);
        }
        let view = journal.view()?;
        let runs = match &options.selection {
            Selection::Run(run) => {
                if let Some(until_seq) = options.until_seq {
                    if is_in_place {
                        return Err(ReplayError::UntilSeqNeedsOneRunOutOfPlace);
                    }
                    // Without a seq the snapshot is not needed: a damaged one is reported by
                    // the re-derivation, and the run still replayed from its records.
                    let head_seq = view.snapshot(*run)?.map_or(0, |state| state.head_seq);
                    if until_seq == 0 || until_seq > head_seq {
                        return Err(ReplayError::UntilSeqOutOfRange {
                            run: *run,
                            head_seq,
                            until_seq,
                        });
                    }
                }
                vec![*run]
            }
            Selection::All if options.until_seq.is_some() => {
                return Err(ReplayError::UntilSeqNeedsOneRunOutOfPlace);
            }
            Selection::All => view.all_runs()?,
        };
        drop(view);
        if !is_in_place && !options.is_check {
            durable_fs::ensure_private_dir(target.root()).map_err(|source| {
                ReplayError::CreateDir {
                    path: target.root().to_path_buf(),
                    source,
                }
            })?;
        }
        Ok(Replay {
            journal,
            target,
            is_in_place,
            options,
            runs,
            totals: Totals::default(),
        })
    }

    /// The runs chosen, in the order they are replayed.
    pub fn runs(&self) -> &[RunId] {
        &self.runs
    }

    /// Where the projections are checked or written.
    pub fn target(&self) -> &Home {
        &self.target
    }

    /// Whether the target is the journal's own home.
    pub fn is_in_place(&self) -> bool {
        self.is_in_place
    }

    pub fn options(&self) -> &ReplayOptions {
        &self.options
    }

    /// Counts over the runs replayed so far.
    pub fn totals(&self) -> Totals {
        self.totals
    }

    /// Replays every chosen run.
    pub fn run_all(mut self) -> Result<ReplayReport, ReplayError> {
        let runs = self.runs.clone();
        let mut replayed = Vec::with_capacity(runs.len());
        for run in runs {
            replayed.push(self.replay_run(run)?);
        }
        Ok(ReplayReport {
            runs: replayed,
            totals: self.totals,
        })
    }

    /// Replays one run (see the module's invariants).
    pub fn replay_run(&mut self, run: RunId) -> Result<RunReplay, ReplayError> {
        let lock = self.lock(run)?;
        let rederived = verify::rederive(&self.journal.view()?, run, self.options.until_seq);
        let mut replayed = RunReplay {
            run,
            fold_problems: rederived.problems,
            rendered: None,
            check_problems: Vec::new(),
            files: Vec::new(),
            files_planned: 0,
            files_with_content: 0,
        };
        let Some(state) = &rederived.state else {
            self.totals.runs_skipped += 1;
            return Ok(replayed);
        };
        replayed.rendered = Some((state.status, state.head_seq));
        self.totals.runs += 1;
        let plan = projection::plan(&self.target, state, &rederived.records, &rederived.links);
        replayed.files_planned = plan.files.len() as u64;
        self.totals.files += replayed.files_planned;
        let differences = projection::check_plan(&plan);
        if self.options.is_check {
            // A recheck takes the lock again itself.
            drop(lock);
            let mut problems: Vec<Problem> =
                differences.iter().map(verify::difference_problem).collect();
            if self.is_in_place && self.options.until_seq.is_none() && !problems.is_empty() {
                // A live projector may be a moment behind its commit: look again first.
                problems = verify::recheck_projections(&self.target, self.journal, problems);
            }
            for problem in &problems {
                if problem.severity == Severity::Note {
                    self.totals.results_left_absent += 1;
                } else {
                    self.totals.files_changed += 1;
                }
            }
            replayed.check_problems = problems;
            return Ok(replayed);
        }

        let left_absent: BTreeSet<PathBuf> = differences
            .iter()
            .filter(|difference| {
                self.is_in_place
                    && !self.options.restore_results
                    && difference.problem == projection::Problem::Consumed
            })
            .map(|difference| difference.path.clone())
            .collect();
        let to_write = Plan {
            run: plan.run,
            files: plan
                .files
                .iter()
                .filter(|file| !left_absent.contains(&file.path))
                .cloned()
                .collect(),
            result_published_marker: plan.result_published_marker.clone(),
        };
        projection::write_plan(&to_write, ResultPolicy::Rewrite)?;
        drop(lock);
        replayed.files_with_content = to_write
            .files
            .iter()
            .filter(|file| file.content != Content::Absent)
            .count() as u64;
        for difference in differences {
            let was = Was::of(&difference.problem);
            let action = if left_absent.contains(&difference.path) {
                FileAction::LeftAbsent
            } else if !self.is_in_place {
                FileAction::Written
            } else if was == Was::Unexpected {
                FileAction::Removed
            } else {
                FileAction::Repaired
            };
            if action == FileAction::LeftAbsent {
                self.totals.results_left_absent += 1;
            } else {
                self.totals.files_changed += 1;
            }
            replayed.files.push(FileOutcome {
                kind: difference.kind,
                path: difference.path,
                was,
                action,
            });
        }
        Ok(replayed)
    }

    /// The run's lock: always for a write (its directory made first), only where its file
    /// exists for a check, which creates nothing.
    fn lock(&self, run: RunId) -> Result<Option<FileLock>, ReplayError> {
        let lock_path = self.target.lock_path(run);
        if self.options.is_check && !lock_path.exists() {
            return Ok(None);
        }
        if !self.options.is_check {
            let run_dir = self.target.run_dir(run);
            durable_fs::ensure_private_dir(&run_dir).map_err(|source| ReplayError::CreateDir {
                path: run_dir,
                source,
            })?;
        }
        match crate::projection::lock_run_within(run, &lock_path, crate::projection::RUN_LOCK_WAIT)
        {
            Ok(lock) => Ok(Some(lock)),
            Err(ProjectionError::Io { source, .. }) => Err(ReplayError::Lock {
                path: lock_path,
                source,
            }),
            Err(error) => Err(ReplayError::Write(error)),
        }
    }
}

/// Whether `dir` is the journal's home itself (a replay there is in place).
fn is_same_dir(dir: &Path, home: Option<&Home>) -> bool {
    let Some(home) = home else { return false };
    match (dir.canonicalize(), home.root().canonicalize()) {
        (Ok(dir), Ok(root)) => dir == root,
        _ => false,
    }
}
