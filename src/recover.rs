//! Rebuilding a lost journal from the runs' `events.jsonl` (`journal-tools recover
//! --from-projections`, or a host).
//!
//! A home whose `journal.redb` is missing, empty, zero-filled, truncated or not a database is
//! refused by every command while it holds runs ([`crate::journal::check_home_journal`]); one
//! whose bytes are damaged (redb panics on them, a record fails its checksum, redb's integrity
//! check fails) is reported as damaged by every command that meets the damage. Both are lost
//! here: a journal that opens is read whole first ([`crate::verify`]), and only one found
//! damaged is rebuilt. Each
//! run's `events.jsonl` is a projection of its records: one line per record, with its seq,
//! time, writer and writer seq. [`recover_from_projections`] reads every run's file, checks
//! that its records fold ([`state::replay`]), writes them to a new journal — records as they
//! were; across runs, batches in the order of their times — then moves the damaged file aside
//! (never deletes it), puts the new one in its place and projects each rebuilt run again. Runs
//! that were not closed stay active: the reconciler decides them as it decides any run (a
//! runner still alive goes on; a dead one's run is failed). A run whose `events.jsonl` is
//! missing or damaged, and a result file without a run, cannot be rebuilt: they are reported,
//! their files left as they are.
//!
//! Run it when nothing else uses the home: a process that still holds the lost file open
//! writes to it, not to the rebuilt journal.
//!
//! What lived only in the journal cannot be read back from the projections: a queue's limit
//! is chosen from what the queue's rebuilt runs show (`queue_limits`), and every other such
//! fact, of the home or of a run, is reported as a [`LostFact`] (`home_facts_not_recovered`,
//! `run_facts_not_recovered`); both are printed and noted in the rebuilt journal
//! ([`RecoveryNote`]). Recovery never refuses a home for one.
//!
//! Invariants: nothing is written unless the file is lost or damaged (and at least one run can
//! be rebuilt); the damaged file is renamed, never removed or written; every rebuilt run's
//! records are exactly the lines of its `events.jsonl`; every fact not recovered is reported.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap};
use std::io::{self, BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use crate::durable_fs;
use crate::event::{Event, Record, RunId, TerminalState, UnixMs, WriterId, now_ms};
use crate::home::{Home, LayoutMismatch};
use crate::journal::rebuild::{RebuildError, rebuild};
use crate::journal::{
    self, Batch, Condition, FileFinding, Journal, JournalReader, OpenError, ResumeLinks,
};

pub use crate::journal::{LostFact, QueueLimitChoice, RecoveryNote};
use crate::projection::{self, ResultPolicy, documents};
use crate::state::{self, RunStatus};
use crate::verify;

/// Longest line of `events.jsonl` read: a record is at most 1 MiB encoded, and its JSON (with
/// escapes) stays well within this.
pub const MAX_EVENT_LINE_BYTES: u64 = 8 << 20;

/// Largest `events.jsonl` read: every rebuilt run's records are held in memory until they are
/// written. A larger file is not read at all and its run is reported as not rebuilt, naming
/// this limit: a run rebuilt from the first part of its file would silently lose its last
/// records.
pub const MAX_EVENTS_FILE_BYTES: u64 = 256 << 20;

/// Why nothing was recovered. Nothing was written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecoverError {
    #[error(transparent)]
    Layout(#[from] LayoutMismatch),
    /// A home someone else owns or may write is refused, as every command refuses it
    /// ([`crate::store::check_home`]).
    #[error(transparent)]
    Unsafe(Box<OpenError>),
    #[error(
        "journal {path} is a readable journal: there is nothing to recover (journal-tools inspect verify checks it)"
    )]
    NotLost { path: PathBuf },
    #[error(
        "journal {path} cannot be judged: {source}; nothing was changed (run recover again once it can be read)"
    )]
    Unjudged {
        path: PathBuf,
        /// Boxed: it is large.
        #[source]
        source: Box<OpenError>,
    },
    #[error(
        "journal {path} is open in {}: a process still writing would commit into the file recover \
         moves aside, and what it wrote would be in neither journal; stop it, or wait for it to \
         exit, and recover again",
        .holders.iter().map(|(pid, name)| format!("process {pid} ({name})")).collect::<Vec<_>>().join(", ")
    )]
    InUse {
        path: PathBuf,
        holders: Vec<(u32, String)>,
    },
    #[error("journal {path} is {found}, and the home holds no run to rebuild it from")]
    NoRuns { path: PathBuf, found: String },
    #[error(
        "journal {path} is {found}, and none of the home's {} run(s) can be rebuilt: {}",
        .unrecoverable.len(),
        .unrecoverable.iter().map(|run| format!("{} ({})", run.run, run.reason)).collect::<Vec<_>>().join("; ")
    )]
    NothingRecoverable {
        path: PathBuf,
        found: String,
        unrecoverable: Vec<Unrecoverable>,
    },
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("writing the rebuilt journal {path}")]
    Rebuild {
        path: PathBuf,
        /// Boxed: it is large.
        #[source]
        source: Box<RebuildError>,
    },
}

impl RecoverError {
    /// Whether the refusal is about what was asked (nothing to recover), not a failure.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            RecoverError::Layout(_)
                | RecoverError::NotLost { .. }
                | RecoverError::InUse { .. }
                | RecoverError::NoRuns { .. }
                | RecoverError::NothingRecoverable { .. }
        )
    }
}

/// A run rebuilt into the new journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RebuiltRun {
    pub run: RunId,
    pub records: u64,
    pub status: RunStatus,
    /// Terminal and its process terminal observed; otherwise the reconciler decides it.
    pub is_closed: bool,
    /// What the run kept only in the lost journal and the rebuild could not restore
    /// (`run_facts_not_recovered`).
    pub facts_not_recovered: Vec<LostFact>,
}

/// A run that could not be rebuilt; its files are left as they are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unrecoverable {
    pub run: RunId,
    pub reason: String,
}

/// What a recovery did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recovery {
    /// The journal file, now the rebuilt one.
    pub journal: PathBuf,
    /// What the lost file was found to be.
    pub found: String,
    /// Where the lost file now is; `None` when it was missing.
    pub moved_aside: Option<PathBuf>,
    /// The runs rebuilt, in id order.
    pub runs: Vec<RebuiltRun>,
    /// Records written, over every run.
    pub records: u64,
    /// Runs whose events.jsonl is missing or damaged, in id order.
    pub unrecoverable: Vec<Unrecoverable>,
    /// Result files of runs with no run directory: their records are gone.
    pub results_without_runs: Vec<RunId>,
    /// Rebuilt runs whose projection could not be written again (the reconciler retries).
    pub projection_failures: Vec<(RunId, String)>,
    /// Each queue the rebuilt runs name, with the limit the rebuild gave it (`queue_limits`).
    pub queues: Vec<QueueLimitChoice>,
    /// What the home kept only in the lost journal (`home_facts_not_recovered`); each run's
    /// own are in [`RebuiltRun::facts_not_recovered`].
    pub home_facts_not_recovered: Vec<LostFact>,
}

/// How long recover waits for the processes that have the lost journal open to exit before it
/// refuses the home ([`RecoverError::InUse`]): the home's timer finds its journal replaced or
/// unreadable at its next look, a pass ends in moments; a live runner does not.
pub const HOLDERS_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The processes that still have the file at `path` open after waiting up to `bound` for
/// them to let it go.
fn wait_for_holders(path: &Path, bound: std::time::Duration) -> Vec<(u32, String)> {
    let deadline = std::time::Instant::now() + bound;
    loop {
        let holders = crate::platform::processes_with_open(path);
        if holders.is_empty() || std::time::Instant::now() >= deadline {
            return holders;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Rebuilds the home's lost journal from its runs' `events.jsonl` ([module docs](self)).
pub fn recover_from_projections(home: &Home) -> Result<Recovery, RecoverError> {
    home.check_layout()?;
    crate::store::check_home(home).map_err(|error| RecoverError::Unsafe(Box::new(error)))?;
    let path = home.journal_path();
    let found = judge(&path)?;
    // A process with the lost file open (a runner, a pass, a host) may still commit to it, or
    // project what it committed after the runs' files were read: either would be lost. The
    // home's own helpers (its timer, a deliverer) let a lost journal go within moments.
    let holders = wait_for_holders(&path, HOLDERS_WAIT);
    if !holders.is_empty() {
        return Err(RecoverError::InUse { path, holders });
    }
    let run_ids = home
        .run_dirs_on_disk()
        .map_err(io_error("listing runs in", home.runs_dir()))?;
    let mut result_ids = home
        .result_files_on_disk()
        .map_err(io_error("listing results in", home.results_dir()))?;
    if run_ids.is_empty() {
        return Err(RecoverError::NoRuns { path, found });
    }
    let mut runs: Vec<(RunId, Vec<Record>)> = Vec::new();
    let mut unrecoverable = Vec::new();
    for run in sorted(run_ids) {
        match read_run(home, run) {
            Ok(records) => runs.push((run, records)),
            Err(reason) => unrecoverable.push(Unrecoverable { run, reason }),
        }
    }
    if runs.is_empty() {
        return Err(RecoverError::NothingRecoverable {
            path,
            found,
            unrecoverable,
        });
    }
    result_ids.retain(|run| !home.run_dir(*run).exists());
    let results_without_runs = sorted(result_ids);

    let batches = in_time_order(&runs);
    let rebuilt_ids: BTreeSet<RunId> = runs.iter().map(|(run, _)| *run).collect();
    let run_facts: Vec<Vec<LostFact>> = runs
        .iter()
        .map(|(run, records)| run_facts_not_recovered(home, *run, records, &rebuilt_ids))
        .collect();
    let home_facts = home_facts_not_recovered(home);
    let note = RecoveryNote {
        at_ms: now_ms(),
        found: found.clone(),
        queues: queue_limits(&batches),
        facts_not_recovered: home_facts
            .iter()
            .chain(run_facts.iter().flatten())
            .cloned()
            .collect(),
    };
    let (records, moved_aside) = replace_journal(home, &batches, &note)?;

    let journal = Journal::open(&path).map_err(|source| RecoverError::Rebuild {
        path: path.clone(),
        source: Box::new(RebuildError::Open(source)),
    })?;
    let mut rebuilt = Vec::with_capacity(runs.len());
    let mut projection_failures = Vec::new();
    for ((run, run_records), facts) in runs.iter().zip(run_facts) {
        let state = state::replay(run_records)
            .ok()
            .flatten()
            .expect("a rebuilt run's records were folded before they were written");
        rebuilt.push(RebuiltRun {
            run: *run,
            records: run_records.len() as u64,
            status: state.status,
            is_closed: state.is_closed(),
            facts_not_recovered: facts,
        });
        if let Err(error) = projection::project(home, &journal, *run, ResultPolicy::Publish) {
            projection_failures.push((*run, error.to_string()));
        }
    }
    Ok(Recovery {
        journal: path,
        found,
        moved_aside,
        runs: rebuilt,
        records,
        unrecoverable,
        results_without_runs,
        projection_failures,
        queues: note.queues,
        home_facts_not_recovered: home_facts,
    })
}

/// Writes `batches` and `note` to a new journal beside the lost one, then moves the lost file
/// aside (when there is one) and the new one into its place, synced. Returns the records
/// written and where the lost file went.
fn replace_journal(
    home: &Home,
    batches: &[Batch],
    note: &RecoveryNote,
) -> Result<(u64, Option<PathBuf>), RecoverError> {
    let path = home.journal_path();
    let rebuilding = home
        .state_dir()
        .join(format!("journal.redb.rebuilding-{}", std::process::id()));
    durable_fs::remove_if_present(&rebuilding)
        .map_err(io_error("removing an earlier attempt", rebuilding.clone()))?;
    let records = match rebuild(&rebuilding, batches, note, home_shipped(home)) {
        Ok(records) => records,
        Err(source) => {
            let _ = durable_fs::remove_if_present(&rebuilding);
            return Err(RecoverError::Rebuild {
                path: rebuilding,
                source: Box::new(source),
            });
        }
    };
    let moved_aside = match found_missing(&path) {
        true => None,
        false => {
            let aside = aside_path(&path, now_ms());
            durable_fs::rename(&path, &aside)
                .map_err(io_error("moving the lost journal aside to", aside.clone()))?;
            Some(aside)
        }
    };
    durable_fs::rename(&rebuilding, &path).map_err(io_error(
        "putting the rebuilt journal in place at",
        path.clone(),
    ))?;
    durable_fs::sync_dir(&home.state_dir()).map_err(io_error("syncing", home.state_dir()))?;
    // The reconciler's cursor counts the lost journal's log; the next pass looks back instead.
    durable_fs::remove_if_present(&home.reconcile_cursor_path())
        .map_err(io_error("removing", home.reconcile_cursor_path()))?;

    Ok((records, moved_aside))
}

/// The limit each queue named by the rebuilt runs gets: the most of its runs that the rebuilt
/// records, in the order they are rebuilt, show holding a slot at once — the smallest limit
/// the history obeys, so no more of its runs start at once than did before — or 0, which holds
/// its waiting runs, when none was ever admitted. A queue's own limit is kept only in the
/// journal (no projection holds it), so the lost one cannot be known; the choice is printed
/// and noted in the journal, and `runjournal queue NAME --max-active N` sets it anew.
pub(crate) fn queue_limits(batches: &[Batch]) -> Vec<QueueLimitChoice> {
    let mut queue_of: HashMap<RunId, String> = HashMap::new();
    let mut holding: HashMap<RunId, String> = HashMap::new();
    let mut active: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for batch in batches {
        for event in &batch.events {
            match event {
                Event::QueueJoined { queue, .. } => {
                    queue_of.insert(batch.run, queue.clone());
                    active.entry(queue.clone()).or_default();
                }
                Event::QueueAdmitted { .. } => {
                    if let Some(queue) = queue_of.get(&batch.run) {
                        let (now, most) = active.entry(queue.clone()).or_default();
                        *now += 1;
                        *most = (*most).max(*now);
                        holding.insert(batch.run, queue.clone());
                    }
                }
                Event::Terminal { .. } => {
                    if let Some(queue) = holding.remove(&batch.run)
                        && let Some((now, _)) = active.get_mut(&queue)
                    {
                        *now = now.saturating_sub(1);
                    }
                }
                _ => {}
            }
        }
    }
    active
        .into_iter()
        .map(|(name, (_, most))| QueueLimitChoice {
            basis: match most {
                0 => "none of its runs was ever admitted in the rebuilt records: 0 holds its \
                      waiting runs (its limit was kept only in the lost journal)"
                    .to_string(),
                _ => "the most of its runs the rebuilt records show holding a slot at once \
                      (its limit was kept only in the lost journal)"
                    .to_string(),
            },
            name,
            max_active: most,
        })
        .collect()
}

/// What the home kept only in its journal and no projection holds: lost with it, whatever
/// the runs were. Each names what holds instead.
pub(crate) fn home_facts_not_recovered(home: &Home) -> Vec<LostFact> {
    let mut facts = vec![
        LostFact {
            run: None,
            fact: "the retention policy, if one was set".to_string(),
            reason: "it was kept only in the journal: the defaults apply until `runjournal \
                     retention` sets it again"
                .to_string(),
        },
        LostFact {
            run: None,
            fact: "the tombstones of pruned runs".to_string(),
            reason: "they were kept only in the journal: a run pruned before is unknown now"
                .to_string(),
        },
    ];
    if home_shipped(home) {
        facts.push(LostFact {
            run: None,
            fact: "the journal's id and global seqs".to_string(),
            reason: "the rebuilt journal is a new one: what was shipped of the lost journal \
                     stays on the server under its old id; this one ships from its start, and \
                     retention keeps every run until its shipper has sent it"
                .to_string(),
        });
    }
    facts.push(LostFact {
        run: None,
        fact: "completion hooks no record shows attempted, and the home's hook if one was set"
            .to_string(),
        reason: "they were kept only in the journal: such a hook will not run; set the home's \
                 again with `runjournal hook set`"
            .to_string(),
    });
    facts
}

/// Whether the home shipped before its journal was lost: its shipper's state file is there.
/// (The journal's own shipping mark was lost with it.)
fn home_shipped(home: &Home) -> bool {
    home.shipping_state_path().exists()
}

/// What `run` kept only in the lost journal and the rebuild cannot restore from its records
/// and files; `rebuilt` holds every run being rebuilt. One check per journal-only fact of a
/// run: a fact a later version keeps only in the journal (an environment, completion hooks,
/// retry attempts, dependencies, due times) adds its check here, so recovery names it for the
/// run and goes on.
pub(crate) fn run_facts_not_recovered(
    home: &Home,
    run: RunId,
    records: &[Record],
    rebuilt: &BTreeSet<RunId>,
) -> Vec<LostFact> {
    let mut facts = Vec::new();
    let lost = |fact: String, reason: String| LostFact {
        run: Some(run.to_string()),
        fact,
        reason,
    };
    if let Some(from) = ResumeLinks::resumed_from_records(records)
        && !rebuilt.contains(&from)
    {
        facts.push(lost(
            format!("the resume link to run {from}, which it resumed"),
            format!(
                "run {from} is not rebuilt (pruned, or its events.jsonl is missing): the \
                 journal does not link them; the run's own record still names it"
            ),
        ));
    }
    let resumed_by = resumed_by_on_disk(home, run);
    let is_carried_on = resumed_by.is_some_and(|by| rebuilt.contains(&by));
    if !has_ended_for_good(records) && !is_carried_on {
        facts.push(lost(
            "its kept environment (variables, working directory, umask)".to_string(),
            "it was kept only in the journal: steps that start from now on (a queued run \
             admitted, a paused run resumed) start with the environment of the process that \
             starts their runner"
                .to_string(),
        ));
    }
    for hook in hooks_not_delivered(records) {
        facts.push(lost(
            format!("the delivery of its completion hook {hook}"),
            "its command was kept only in the journal: it will not be run; run it by hand if \
             it is still wanted"
                .to_string(),
        ));
    }
    for dependency in dependencies_not_rebuilt(records, rebuilt) {
        facts.push(lost(
            format!("its dependency on run {dependency}"),
            format!(
                "run {dependency} is not rebuilt (pruned, or its events.jsonl is missing): how it                  ended is lost, so the next reconcile pass ends this run failed if it had to                  complete, or starts it if any end would do"
            ),
        ));
    }
    if let Some(by) = resumed_by
        && !rebuilt.contains(&by)
    {
        facts.push(lost(
            format!("the resume link from run {by}, which resumed it"),
            format!(
                "run {by} is not rebuilt (its events.jsonl is missing): the journal shows this \
                 run as not resumed, so `runjournal resume` would carry it on again"
            ),
        ));
    }
    facts
}

/// The runs a run still waiting for its dependencies (its records hold `DependsOn`, neither
/// `DependenciesMet` nor an end) names that are not rebuilt, in the order named.
fn dependencies_not_rebuilt(records: &[Record], rebuilt: &BTreeSet<RunId>) -> Vec<RunId> {
    let mut named = Vec::new();
    for record in records {
        match &record.event {
            Event::DependsOn {
                after, after_any, ..
            } => named.extend(after.iter().chain(after_any).copied()),
            Event::DependenciesMet { .. } | Event::Terminal { .. } | Event::HostEnded { .. } => {
                return Vec::new();
            }
            _ => {}
        }
    }
    named.retain(|dependency| !rebuilt.contains(dependency));
    named
}

/// Whether the records end the run for good: a `Terminal` (or a host's end) other than a
/// pause. Such a run starts no step again, so it needs no kept environment (nor does a paused
/// run whose resume is rebuilt).
fn has_ended_for_good(records: &[Record]) -> bool {
    records.iter().any(|record| match &record.event {
        Event::Terminal { state, .. } | Event::HostEnded { state, .. } => {
            *state != TerminalState::Paused
        }
        _ => false,
    })
}

/// The hooks the records show attempted and never delivered nor given up: their commands were
/// kept only in the journal. (A hook never attempted leaves no record at all: the home's note
/// on hooks covers it.)
fn hooks_not_delivered(records: &[Record]) -> BTreeSet<u32> {
    let mut open = BTreeSet::new();
    for record in records {
        match &record.event {
            Event::HookAttempted { hook, .. } => {
                open.insert(*hook);
            }
            Event::HookEnded {
                hook,
                outcome,
                retry_at_ms,
                ..
            } if outcome.is_delivered() || retry_at_ms.is_none() => {
                open.remove(hook);
            }
            _ => {}
        }
    }
    open
}

/// The run that resumed `run`, as its status.json on disk says (`resumedBy`); `None` when it
/// says none, or cannot be read.
fn resumed_by_on_disk(home: &Home, run: RunId) -> Option<RunId> {
    const MAX_STATUS_BYTES: u64 = 4 << 20;
    let durable_fs::Bounded::Whole(bytes) =
        durable_fs::read_file_bounded(&home.status_path(run), MAX_STATUS_BYTES).ok()?
    else {
        return None;
    };
    let status: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    status.get("resumedBy")?.as_str()?.parse().ok()
}

fn io_error(what: &'static str, path: PathBuf) -> impl FnOnce(io::Error) -> RecoverError {
    move |source| RecoverError::Io { what, path, source }
}

fn sorted(mut ids: Vec<RunId>) -> Vec<RunId> {
    ids.sort_unstable();
    ids
}

fn found_missing(path: &Path) -> bool {
    matches!(durable_fs::look(path), Ok(None))
}

/// What the journal file is, if it is lost: what `journal::examine` finds, or, for a file
/// that looks like a database, why it cannot be read. A journal that opens is read whole
/// ([`verify::verify`], then redb's integrity check on a private copy): one whose bytes are
/// damaged — redb panics on them, a record fails its checksum, the integrity check fails — is
/// lost as much as a missing one. A readable journal is refused ([`RecoverError::NotLost`]),
/// and so is one that cannot be judged now.
fn judge(path: &Path) -> Result<String, RecoverError> {
    let found = journal::examine(path).map_err(io_error("examining", path.to_path_buf()))?;
    if found != FileFinding::Plausible {
        return Ok(found.to_string());
    }
    let scratch = tempfile::Builder::new()
        .prefix("runjournal-recover-")
        .tempdir()
        .map_err(io_error(
            "making a directory to check a copy of",
            path.to_path_buf(),
        ))?;
    match read_whole(path, scratch.path()) {
        Ok(None) => Err(RecoverError::NotLost {
            path: path.to_path_buf(),
        }),
        Ok(Some(damage)) => Ok(format!("damaged ({damage})")),
        Err(source) => Err(RecoverError::Unjudged {
            path: path.to_path_buf(),
            source: Box::new(source),
        }),
    }
}

/// Reads every record, snapshot and index of the journal at `path` and runs redb's integrity
/// check on a copy in `scratch`. `Ok(Some(why))`: it is damaged; `Ok(None)`: it reads whole;
/// `Err`: it could not be judged (an I/O error, a lock). A journal that needs redb's recovery
/// is judged through a recovered copy, so the file itself is never written.
fn read_whole(path: &Path, scratch: &Path) -> Result<Option<String>, OpenError> {
    let damaged = |error: &dyn std::fmt::Display| Ok(Some(error.to_string()));
    let report = match JournalReader::open(path) {
        Ok(reader) => match reader.view() {
            Ok(view) => verify::verify(&view, None),
            Err(error) => return damaged(&error),
        },
        Err(OpenError::NeedsRecovery { .. }) => {
            let copy = scratch.join("journal-recovered.redb");
            if let Err(error) = journal::copy_consistent(path, &copy) {
                return Err(OpenError::Io {
                    path: path.to_path_buf(),
                    source: io::Error::other(error.to_string()),
                });
            }
            match Journal::open(&copy) {
                Ok(recovered) => match recovered.view() {
                    Ok(view) => verify::verify(&view, None),
                    Err(error) => return damaged(&error),
                },
                Err(error) if error.is_damage() => return damaged(&error),
                Err(error) => return Err(error),
            }
        }
        Err(error) if error.is_damage() => return damaged(&error),
        Err(OpenError::Storage(failure)) => return damaged(&format!("unreadable: {failure}")),
        Err(error) => return Err(error),
    };
    if let Some(problem) = first_damage(&report) {
        return damaged(&problem);
    }
    match verify::check_integrity_of_copy(path, scratch) {
        Ok(integrity) => match first_damage(&verify::Report {
            problems: integrity.problems,
            ..verify::Report::default()
        }) {
            Some(problem) => damaged(&problem),
            None => Ok(None),
        },
        // No copy to check: what the reads found stands.
        Err(_) => Ok(None),
    }
}

/// The first damaged problem of a report, as a line.
fn first_damage(report: &verify::Report) -> Option<String> {
    report
        .problems
        .iter()
        .find(|problem| problem.severity == verify::Severity::Damaged)
        .map(|problem| problem.message.clone())
}

/// `journal.redb.lost-<ms>`, or with a counter after it if that exists.
fn aside_path(path: &Path, at_ms: UnixMs) -> PathBuf {
    let name = path
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_else(|| "journal.redb".to_string());
    let mut candidate = path.with_file_name(format!("{name}.lost-{at_ms}"));
    let mut counter = 1;
    while candidate.symlink_metadata().is_ok() {
        candidate = path.with_file_name(format!("{name}.lost-{at_ms}-{counter}"));
        counter += 1;
    }
    candidate
}

/// A run's records from its `events.jsonl`, checked: each line a record of this run, seqs
/// 1, 2, ... in order, and all of them folding from nothing. `Err` says what is wrong.
///
/// The file is read as every file of a home is ([`durable_fs::open_existing_read_only`]): a
/// link, a FIFO or a device in its place is refused without blocking. One larger than
/// [`MAX_EVENTS_FILE_BYTES`] is refused before it is read, and one that grows past it while
/// it is read is refused there.
fn read_run(home: &Home, run: RunId) -> Result<Vec<Record>, String> {
    let path = home.events_path(run);
    let at_path = |error: io::Error| format!("{}: {error}", path.display());
    let file = durable_fs::open_existing_read_only(&path).map_err(at_path)?;
    let len = file.metadata().map_err(at_path)?.len();
    let too_large =
        || format!("events.jsonl is larger than the {MAX_EVENTS_FILE_BYTES} bytes recovery reads");
    if len > MAX_EVENTS_FILE_BYTES {
        return Err(too_large());
    }
    let mut reader = BufReader::new(file.take(MAX_EVENTS_FILE_BYTES + 1));
    let mut consumed = 0u64;
    let mut records: Vec<Record> = Vec::new();
    let mut line = Vec::new();
    for number in 1u64.. {
        line.clear();
        let read = reader
            .by_ref()
            .take(MAX_EVENT_LINE_BYTES + 1)
            .read_until(b'\n', &mut line)
            .map_err(|error| format!("{}: {error}", path.display()))?;
        if read == 0 {
            break;
        }
        consumed += read as u64;
        if consumed > MAX_EVENTS_FILE_BYTES {
            return Err(too_large());
        }
        if line.last() != Some(&b'\n') {
            return Err(if read as u64 > MAX_EVENT_LINE_BYTES {
                format!("events.jsonl line {number} is longer than {MAX_EVENT_LINE_BYTES} bytes")
            } else {
                format!("events.jsonl line {number} is cut short (no newline)")
            });
        }
        let text = std::str::from_utf8(&line[..line.len() - 1])
            .map_err(|_| format!("events.jsonl line {number} is not UTF-8"))?;
        let record = documents::parse_event_line(text)
            .map_err(|reason| format!("events.jsonl line {number}: {reason}"))?;
        if record.run_id != run {
            return Err(format!(
                "events.jsonl line {number} is a record of run {}",
                record.run_id
            ));
        }
        if record.seq != number {
            return Err(format!(
                "events.jsonl line {number} holds seq {} (the seqs must be 1, 2, ... in order)",
                record.seq
            ));
        }
        records.push(record);
    }
    if records.is_empty() {
        return Err("events.jsonl holds no records".to_string());
    }
    state::replay(&records).map_err(|error| format!("its records do not fold: {error}"))?;
    Ok(records)
}

/// The batches of every run — consecutive records of one run with the same writer, writer seq
/// and time — merged into one order by (time, writer, writer seq, run): the global log follows
/// the records' times, and a run's own records stay in seq order whatever the clock did.
fn in_time_order(runs: &[(RunId, Vec<Record>)]) -> Vec<Batch> {
    let per_run: Vec<Vec<Batch>> = runs
        .iter()
        .map(|(run, records)| batches_of(*run, records))
        .collect();
    type Key = (UnixMs, WriterId, u64, RunId, usize);
    let key = |batch: &Batch, run_index: usize| -> Key {
        (
            batch.time_ms,
            batch.writer,
            batch.writer_seq,
            batch.run,
            run_index,
        )
    };
    let mut next: Vec<usize> = vec![0; per_run.len()];
    let mut heap: BinaryHeap<Reverse<Key>> = per_run
        .iter()
        .enumerate()
        .filter_map(|(index, batches)| batches.first().map(|batch| Reverse(key(batch, index))))
        .collect();
    let mut ordered = Vec::with_capacity(per_run.iter().map(Vec::len).sum());
    while let Some(Reverse((.., run_index))) = heap.pop() {
        let batch = per_run[run_index][next[run_index]].clone();
        next[run_index] += 1;
        if let Some(following) = per_run[run_index].get(next[run_index]) {
            heap.push(Reverse(key(following, run_index)));
        }
        ordered.push(batch);
    }
    ordered
}

/// A run's records grouped back into the batches they were appended in.
fn batches_of(run: RunId, records: &[Record]) -> Vec<Batch> {
    let mut batches: Vec<Batch> = Vec::new();
    for record in records {
        let continues = batches.last().is_some_and(|batch| {
            batch.writer == record.writer
                && batch.writer_seq == record.writer_seq
                && batch.time_ms == record.time_ms
        });
        if continues && let Some(batch) = batches.last_mut() {
            batch.events.push(record.event.clone());
            continue;
        }
        batches.push(Batch {
            private: None,
            run,
            events: vec![record.event.clone()],
            condition: Condition::none(),
            writer: record.writer,
            writer_seq: record.writer_seq,
            time_ms: record.time_ms,
        });
    }
    batches
}
