//! Retention: which ended runs leave the home, and when. A pass reads the policy kept in the
//! journal ([`Retention`]), chooses among the oldest ended runs, prunes them from the journal in
//! one transaction ([`crate::journal::Journal::prune`]), then removes their files. Every
//! reconcile pass makes one, with bounded work; `runjournal prune` makes them until nothing is
//! left to prune.
//!
//! Invariants:
//! * never pruned: a run not closed (its runner not seen to end); a run with a record above the
//!   journal's shipping mark, when the home ships (the mark, not the shipper's report file or
//!   the server, says what is proven shipped: see [`crate::ship::state::shipped_through`]);
//!   damaged records;
//! * a result the host has not consumed keeps its run until the age bound passes: neither the
//!   count bound nor space pressure takes it earlier;
//! * the oldest ended runs go first, and a pass with nothing to prune reads one page (16
//!   entries) of the terminal index (and, with `keep_free`, makes one `statvfs`): its cost does not grow with
//!   the ended runs. With `max_size`, the home's size is the count the journal keeps
//!   ([`size`]): a pass measures the runs not yet counted, and walks the home ([`home_bytes`])
//!   only rarely;
//! * the files of a pruned run go after its journal transaction; a pass cut short leaves the
//!   run listed as pruning, and the next pass removes what is left before anything else.

use std::path::{Path, PathBuf};

use crate::event::{RunId, UnixMs};
use crate::home::{Home, Layout};
use crate::journal::prune::Pruned;
use crate::journal::{AppendError, ReadError, View};
use crate::journal::{KeepFree, Retention, Tombstone};
use crate::platform::space::{Space, room_of, space_of};
use crate::state::RunState;
use crate::store::{ReadHome, Store};

pub mod clock;
pub mod size;

/// Most runs one reconcile pass prunes.
pub const PASS_LIMIT: usize = 64;
/// Most runs `runjournal prune` prunes per transaction.
pub const PRUNE_COMMAND_LIMIT: usize = 256;
/// Most entries of the terminal index one pass looks at: the oldest ended runs that are kept
/// (an unconsumed result, not yet shipped) are looked at again by every pass, so they are
/// bounded too.
pub const SCAN_LIMIT: usize = 512;

/// Why a run is pruned: the first bound it is past.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// Ended longer ago than `keep_for`.
    Age,
    /// Beyond the newest `keep_runs` ended runs.
    Count,
    /// The home is over `max_size`, or its file system under `keep_free`.
    Space,
}

impl Why {
    pub fn as_str(self) -> &'static str {
        match self {
            Why::Age => "older than the age bound",
            Why::Count => "beyond the run count bound",
            Why::Space => "space pressure",
        }
    }
}

/// A run a pass chose (and, unless it was a dry run, pruned).
#[derive(Debug, Clone, PartialEq)]
pub struct Chosen {
    pub run: RunId,
    pub ended_at_ms: UnixMs,
    pub why: Why,
    /// The bytes of its run directory and result files, measured when it was chosen.
    pub bytes: u64,
    /// Its result was still there: taken past its age (the report says so).
    pub unconsumed_result: bool,
    /// The run's state when it was chosen.
    pub state: RunState,
}

/// A run past a bound that the pass kept, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kept {
    pub run: RunId,
    pub why: &'static str,
}

/// What one pass did.
#[derive(Debug, Default)]
pub struct PassReport {
    /// Pruned (or, in a dry run, what would be).
    pub chosen: Vec<Chosen>,
    /// Chosen, but found moved on inside the prune's transaction.
    pub skipped: Vec<(RunId, &'static str)>,
    pub kept: Vec<Kept>,
    /// Runs pruned by an earlier pass whose files this pass removed.
    pub finished: usize,
    /// Files that could not be removed (a later pass tries again).
    pub errors: Vec<String>,
    /// The home's file system as one `statvfs` saw it, when a space bound asked.
    pub space: Option<Space>,
    /// Bytes still to free for the space bounds after this pass (0: none).
    pub bytes_short: u64,
    /// The home's size, when `max_size` asked for it; the count kept in the journal follows
    /// it once the pass has pruned.
    pub size: Option<size::Measured>,
    /// The time ages were judged by ([`clock`]): the wall clock, held back when it ran ahead
    /// of what the home has seen.
    pub clock: Option<clock::Judged>,
}

impl PassReport {
    /// What a person is told when the wall clock was held back: `None` when it was not.
    pub fn clock_line(&self) -> Option<String> {
        let judged = self.clock.as_ref()?;
        let held_back = judged.held_back_ms();
        (held_back > 0).then(|| {
            format!(
                "the clock reads {}, {} ahead of the newest record of the home and of the \
                 clock it keeps; ages of ended runs were judged as of {} (nothing is pruned \
                 for a jump of the clock)",
                crate::duration::format_time_s(judged.wall_ms),
                crate::duration::format_duration_ms(held_back),
                crate::duration::format_time_s(judged.now_ms),
            )
        })
    }
}

/// Why a pass did not run.
#[derive(Debug, thiserror::Error)]
pub enum PassError {
    #[error("reading the journal: {0}")]
    Read(#[from] ReadError),
    #[error("pruning: {0}")]
    Append(#[from] AppendError),
}

/// What a pass may do.
#[derive(Debug, Clone)]
pub struct PassOptions {
    /// Most runs to prune.
    pub limit: usize,
    /// Choose, and prune nothing.
    pub dry_run: bool,
    /// The policy to apply instead of the home's (`prune --older-than`, `--keep-runs`).
    pub policy: Option<Retention>,
}

impl PassOptions {
    /// A reconcile pass's: the home's policy, [`PASS_LIMIT`] runs.
    pub fn reconcile() -> PassOptions {
        PassOptions {
            limit: PASS_LIMIT,
            dry_run: false,
            policy: None,
        }
    }
}

/// The bytes a home holds, by part.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HomeBytes {
    pub journal: u64,
    pub runs: u64,
    pub results: u64,
    pub reserve: u64,
}

impl HomeBytes {
    pub fn total(&self) -> u64 {
        self.journal + self.runs + self.results + self.reserve
    }
}

/// Measures the home by walking it (bounded by what it holds; symbolic links not followed).
pub fn home_bytes(home: &Home) -> HomeBytes {
    HomeBytes {
        journal: file_bytes(&home.journal_path()),
        runs: tree_bytes(&home.runs_dir()),
        results: tree_bytes(&home.results_dir()),
        reserve: file_bytes(&home.reserve_path()),
    }
}

fn file_bytes(path: &Path) -> u64 {
    std::fs::symlink_metadata(path).map_or(0, |metadata| metadata.len())
}

/// The bytes of the regular files under `dir`, not following symbolic links.
pub fn tree_bytes(dir: &Path) -> u64 {
    let mut total = 0u64;
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() {
                pending.push(entry.path());
            } else if kind.is_file() {
                total += entry.metadata().map_or(0, |metadata| metadata.len());
            }
        }
    }
    total
}

/// Every file of a run's projection outside its run directory, and the directory itself.
pub fn files_of(home: &Home, tombstone: &Tombstone) -> Vec<PathBuf> {
    let run = tombstone.run_id;
    let mut paths = vec![home.result_path(run)];
    if let Some(session) = &tombstone.session_id {
        paths.push(home.result_session_index_path(session, run));
        paths.push(home.result_run_index_path(run));
        paths.push(home.result_pending_path(session, run));
        if let Some(tool_call) = &tombstone.tool_call_id {
            paths.push(home.result_tool_call_index_path(tool_call, run));
        }
    }
    if home.layout() == Layout::PiSubagents {
        paths.push(home.active_marker_path(run));
        if let Some(tool_call) = &tombstone.tool_call_id {
            paths.push(home.tool_call_marker_path(tool_call, run));
        }
        if let Some(session) = &tombstone.session_id {
            paths.push(home.terminal_marker_path(session, tombstone.ended_at_ms, run));
        }
    }
    paths.push(home.run_dir(run));
    paths
}

/// Removes a pruned run's files; what is already gone is no error.
fn remove_files(home: &Home, tombstone: &Tombstone, errors: &mut Vec<String>) {
    for path in files_of(home, tombstone) {
        // Relative to the home's directory while the store holds it, never through a link.
        if let Err(error) = crate::durable_fs::remove_tree(&path) {
            errors.push(format!("removing {}: {error}", path.display()));
        }
    }
}

/// Whether the run's result is still waiting for its host: its file is there, or it was never
/// published.
fn has_unconsumed_result(home: &Home, run: RunId) -> bool {
    home.result_path(run).exists() || !home.result_published_marker_path(run).exists()
}

/// The bytes a run's files hold.
fn run_bytes(home: &Home, state: &RunState) -> u64 {
    let run = state.run_id;
    let mut bytes = tree_bytes(&home.run_dir(run)) + file_bytes(&home.result_path(run));
    if let Some(session) = &state.session_id {
        bytes += file_bytes(&home.result_session_index_path(session, run))
            + file_bytes(&home.result_run_index_path(run));
        if let Some(tool_call) = &state.tool_call_id {
            bytes += file_bytes(&home.result_tool_call_index_path(tool_call, run));
        }
    }
    bytes
}

/// The bytes the space bounds want freed now, the file system asked (if one was), and the
/// home's size (if `max_size` asked for it: [`size::measure`]).
pub fn pressure(
    home: &Home,
    view: &View,
    policy: &Retention,
) -> Result<(u64, Option<Space>, Option<size::Measured>), ReadError> {
    let mut short = 0u64;
    let mut space = None;
    if let (Some(keep_free), Ok(found)) = (policy.keep_free, room_of(home.root())) {
        let floor = keep_free.bytes_of(found.total_bytes);
        short = short.max(floor.saturating_sub(found.available_bytes));
        space = Some(found);
    }
    let mut measured = None;
    if let Some(max) = policy.max_size_bytes {
        let found = size::measure(home, view, max)?;
        short = short.max(found.total.saturating_sub(max));
        measured = Some(found);
    }
    Ok((short, space, measured))
}

/// Chooses what a pass prunes, reading `view` and the home's files; prunes nothing.
fn choose(
    home: &Home,
    view: &View,
    policy: &Retention,
    limit: usize,
    now: UnixMs,
    report: &mut PassReport,
) -> Result<(), ReadError> {
    let mut excess = match policy.keep_runs {
        Some(keep) => view.terminal_count()?.saturating_sub(keep),
        None => 0,
    };
    let (mut short, space, measured) = pressure(home, view, policy)?;
    report.space = space;
    report.size = measured;
    let shipped = crate::ship::state::shipped_through(home, view)?;
    let head = view.global_head()?;
    for entry in oldest_terminal_paged(view, SCAN_LIMIT) {
        let (ended_at, run) = entry?;
        if report.chosen.len() >= limit {
            break;
        }
        let by_age = policy
            .keep_for_ms
            .is_some_and(|keep| now.saturating_sub(ended_at) >= keep);
        // The index is in end order: no later run is older.
        let why = match (by_age, excess > 0, short > 0) {
            (true, _, _) => Why::Age,
            (false, true, _) => Why::Count,
            (false, false, true) => Why::Space,
            (false, false, false) => break,
        };
        let Some(state) = view.snapshot(run)? else {
            continue;
        };
        let mut keep = |why: &'static str| report.kept.push(Kept { run, why });
        if !state.is_closed() {
            keep("its runner has not been seen to end");
            continue;
        }
        if view.has_hooks_due(run)? {
            keep("a completion hook of it is still due");
            continue;
        }
        if !view.dependents_of(run)?.is_empty() {
            keep("a waiting run depends on it");
            continue;
        }
        if let Some(through) = shipped {
            let last = view.global_of(run, state.head_seq)?.unwrap_or(head);
            if last > through {
                keep("its records are not shipped yet");
                continue;
            }
        }
        let unconsumed_result = has_unconsumed_result(home, run);
        if unconsumed_result && !by_age {
            keep("its result was not consumed, and it is younger than the age bound");
            continue;
        }
        let bytes = run_bytes(home, &state);
        excess = excess.saturating_sub(1);
        short = short.saturating_sub(bytes);
        report.chosen.push(Chosen {
            run,
            ended_at_ms: ended_at,
            why,
            bytes,
            unconsumed_result,
            state,
        });
    }
    report.bytes_short = short;
    Ok(())
}

/// Up to `limit` entries of the terminal index, oldest first, read a page at a time as the
/// caller takes them: a pass that stops at the first entry no bound reaches reads one page,
/// whatever the number of ended runs.
fn oldest_terminal_paged(
    view: &View,
    limit: usize,
) -> impl Iterator<Item = Result<(UnixMs, RunId), ReadError>> + '_ {
    const PAGE: usize = 16;
    let mut page = std::collections::VecDeque::new();
    let (mut after, mut left, mut is_done) = (None, limit, false);
    std::iter::from_fn(move || {
        if page.is_empty() && !is_done && left > 0 {
            match view.terminal_after(after, PAGE.min(left)) {
                Ok(read) => {
                    is_done = read.len() < PAGE.min(left);
                    page.extend(read);
                }
                Err(error) => {
                    is_done = true;
                    return Some(Err(error));
                }
            }
        }
        let entry = page.pop_front()?;
        after = Some(entry);
        left -= 1;
        Some(Ok(entry))
    })
}

/// What a pass chose, read from one view ([`plan`]); [`carry_out`] prunes it.
#[derive(Debug)]
pub struct Plan {
    /// Runs pruned from the journal by an earlier pass whose files may remain.
    pending: Vec<Tombstone>,
    report: PassReport,
}

/// Chooses, from `view` and the home's files, what a pass prunes: the policy of `options` (or
/// the home's), and the runs an earlier pass left listed as pruning. Only reads.
pub fn plan(home: &Home, view: &View, options: &PassOptions) -> Result<Plan, ReadError> {
    let mut report = PassReport::default();
    let policy = match options.policy {
        Some(policy) => policy,
        None => view.retention()?,
    };
    let pending = view.pruning()?;
    let judged = clock::judge(view, policy.keep_for_ms)?;
    choose(
        home,
        view,
        &policy,
        options.limit,
        judged.now_ms,
        &mut report,
    )?;
    report.clock = Some(judged);
    Ok(Plan { pending, report })
}

/// One pass: finishes what an earlier pass left (files of pruned runs), chooses, prunes, and
/// removes the files of what it pruned. [`plan`] over a view of its own, then [`carry_out`].
pub fn pass(store: &Store, options: &PassOptions) -> Result<PassReport, PassError> {
    let plan = plan(store.home(), &store.journal().view()?, options)?;
    carry_out(store, plan, options)
}

/// Prunes what [`plan`] chose, in one journal transaction (which skips a run found moved on),
/// then removes the files of the runs it pruned and of those an earlier pass left.
pub fn carry_out(
    store: &Store,
    plan: Plan,
    options: &PassOptions,
) -> Result<PassReport, PassError> {
    let home = store.home();
    let Plan {
        pending,
        mut report,
    } = plan;
    if options.dry_run {
        return Ok(report);
    }
    let judged = report.clock.clone();
    if let Some(anchor) = judged
        .as_ref()
        .and_then(|judged| judged.new_anchor.as_ref())
    {
        // Best effort: without it, the next pass judges by the newest record alone.
        let _ = store.journal().set_clock_anchor(anchor);
    }
    for tombstone in &pending {
        remove_files(home, tombstone, &mut report.errors);
    }
    // A run whose files could not all go stays listed, for the next pass.
    let finished: Vec<RunId> = if report.errors.is_empty() {
        pending.iter().map(|tombstone| tombstone.run_id).collect()
    } else {
        Vec::new()
    };
    report.finished = finished.len();
    let runs: Vec<RunId> = report.chosen.iter().map(|chosen| chosen.run).collect();
    if runs.is_empty() && finished.is_empty() {
        keep_size(store, &report);
        return Ok(report);
    }
    let pruned_at = judged.map_or_else(crate::event::now_ms, |judged| judged.now_ms);
    let outcomes = store.journal().prune(&runs, &finished, pruned_at)?;
    stop_here_if_asked();
    let mut pruned = Vec::new();
    for (run, outcome) in outcomes {
        match outcome {
            Pruned::Done(tombstone) => {
                remove_files(home, &tombstone, &mut report.errors);
                pruned.push(run);
            }
            Pruned::Skipped(why) => report.skipped.push((run, why)),
        }
    }
    report.chosen.retain(|chosen| pruned.contains(&chosen.run));
    keep_size(store, &report);
    Ok(report)
}

/// Writes the home's size as the pass measured it, less what it pruned. Best effort: a count
/// not written is counted again by the next pass, and a walk corrects any drift.
fn keep_size(store: &Store, report: &PassReport) {
    let Some(measured) = &report.size else {
        return;
    };
    let pruned: Vec<(&RunState, u64)> = report
        .chosen
        .iter()
        .map(|chosen| (&chosen.state, chosen.bytes))
        .collect();
    let _ = size::store(store.journal(), measured, &pruned);
}

/// The environment variable of a test hook, built only with the `testkit` feature (which the
/// tests turn on, in every profile): while a file exists at the path it names, a pass that has
/// just committed its prune removes it and stops this whole process (SIGSTOP) before it removes
/// any file of the runs it pruned, so that a test can kill it exactly there.
pub const STOP_AFTER_PRUNE_ENV: &str = "RUNJOURNAL_TEST_STOP_AFTER_PRUNE";

#[cfg(feature = "testkit")]
fn stop_here_if_asked() {
    let Some(path) = std::env::var_os(STOP_AFTER_PRUNE_ENV) else {
        return;
    };
    if std::fs::remove_file(path).is_ok() {
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGSTOP);
    }
}

#[cfg(not(feature = "testkit"))]
fn stop_here_if_asked() {}

/// Passes until one prunes fewer runs than it may, calling `progress` with the runs pruned so
/// far after each pass that is followed by another.
pub fn prune_all(
    store: &Store,
    options: &PassOptions,
    mut progress: impl FnMut(usize),
) -> Result<PassReport, PassError> {
    let mut total = PassReport::default();
    loop {
        let report = pass(store, options)?;
        // A pass that pruned less than it may prunes again only to find nothing left.
        let is_done = report.chosen.len() < options.limit || options.dry_run;
        total.finished += report.finished;
        total.chosen.extend(report.chosen);
        total.skipped.extend(report.skipped);
        total.errors.extend(report.errors);
        total.space = report.space;
        total.bytes_short = report.bytes_short;
        total.clock = report.clock;
        if is_done {
            // The last pass's view of what is kept is the one that holds.
            total.kept = report.kept;
            if !options.dry_run && !total.chosen.is_empty() {
                // The runs pruned last are listed until a pass saw their files gone: one more,
                // pruning nothing, leaves nothing listed.
                let finishing = PassOptions {
                    limit: 0,
                    ..options.clone()
                };
                let last = pass(store, &finishing)?;
                total.finished += last.finished;
                total.errors.extend(last.errors);
            }
            return Ok(total);
        }
        progress(total.chosen.len());
    }
}

/// What `status` and `list` say of the home's room, beside their other notices: a line when
/// its file system has less free than the policy keeps free, and, while journal writers wait
/// on a full disk, what pruning could free. Nothing when all is well or nothing can be read
/// (a report: a command does not fail for it).
pub fn space_notices(reading: &dyn ReadHome) -> Vec<String> {
    let home = reading.home();
    let Ok(view) = reading.view() else {
        return Vec::new();
    };
    let Ok(policy) = view.retention() else {
        return Vec::new();
    };
    drop(view);
    let mut lines = Vec::new();
    if let (Some(keep_free), Ok(room)) = (policy.keep_free, room_of(home.root()))
        && room.available_bytes < keep_free.bytes_of(room.total_bytes)
        && let Ok(space) = space_of(home.root())
    {
        let floor = keep_free.bytes_of(space.total_bytes);
        lines.push(crate::text::escape_control(&format!(
            "disk: {} free of {} at {}, under the {} the retention policy keeps free; each reconcile pass prunes the oldest ended runs (runjournal prune --dry-run lists them)",
            crate::text::format_bytes(space.available_bytes),
            crate::text::format_bytes(space.total_bytes),
            space.mount_point.display(),
            crate::text::format_bytes(floor),
        )).into_owned());
    }
    let is_full = crate::capacity::read_status(home).is_ok_and(|status| {
        !status
            .blocked_by(crate::capacity::BlockCause::Capacity)
            .is_empty()
    });
    // What pruning could free is judged by a pass, which needs the home open for writing.
    if is_full
        && let Some(store) = reading.store()
        && let Ok(report) = could_free(store, &policy)
    {
        lines.push(could_free_line(&report));
    }
    lines
}

/// What a pass that took every ended run it may take would prune (a dry run): the home's
/// policy with the count bound at zero. Results the host has not consumed stay, as they do
/// under space pressure, until their age.
pub fn could_free(store: &Store, policy: &Retention) -> Result<PassReport, PassError> {
    let options = PassOptions {
        limit: SCAN_LIMIT,
        dry_run: true,
        policy: Some(Retention {
            keep_runs: Some(0),
            ..*policy
        }),
    };
    pass(store, &options)
}

/// The full-disk notice's word on pruning, from [`could_free`]'s report.
pub fn could_free_line(report: &PassReport) -> String {
    let bytes: u64 = report.chosen.iter().map(|chosen| chosen.bytes).sum();
    if report.chosen.is_empty() {
        return "disk: pruning could free nothing now: no ended run may go (runs still active, results not consumed, records not shipped)".to_string();
    }
    format!(
        "disk: pruning could free {} ({} ended run(s)): runjournal prune --keep-runs 0",
        crate::text::format_bytes(bytes),
        report.chosen.len()
    )
}

/// Why a bound's text does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BoundError {
    #[error(
        "{text:?} is not a size: write a whole number of bytes with a unit, such as 500M, 2G or 4096 (K, M, G, T: powers of 1024)"
    )]
    Size { text: String },
    #[error("{text:?} is not a percentage from 0 to 100, such as 10%")]
    Percent { text: String },
}

/// Parses a size: a whole number, then optionally `K`, `M`, `G` or `T` (powers of 1024; a
/// trailing `B` or `iB` is allowed).
pub fn parse_size(text: &str) -> Result<u64, BoundError> {
    let refused = || BoundError::Size {
        text: text.chars().take(64).collect(),
    };
    let trimmed = text.trim();
    let digits = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(digits);
    let number: u64 = number.parse().map_err(|_| refused())?;
    let unit = unit.trim().to_ascii_uppercase();
    let unit = unit
        .strip_suffix("IB")
        .or_else(|| unit.strip_suffix('B'))
        .unwrap_or(&unit);
    let shift = match unit {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => return Err(refused()),
    };
    number.checked_mul(1u64 << shift).ok_or_else(refused)
}

/// Parses `--keep-free`: a percentage (`10%`) or a size ([`parse_size`]).
pub fn parse_keep_free(text: &str) -> Result<KeepFree, BoundError> {
    match text.trim().strip_suffix('%') {
        Some(number) => match number.trim().parse::<u8>() {
            Ok(percent) if percent <= 100 => Ok(KeepFree::Percent(percent)),
            _ => Err(BoundError::Percent {
                text: text.chars().take(64).collect(),
            }),
        },
        None => parse_size(text).map(KeepFree::Bytes),
    }
}

/// A bound as shown: `off`, or its value.
pub fn keep_free_text(keep_free: Option<KeepFree>) -> String {
    match keep_free {
        None => "off".to_string(),
        Some(KeepFree::Percent(percent)) => format!("{percent}%"),
        Some(KeepFree::Bytes(bytes)) => crate::text::format_bytes(bytes),
    }
}

/// The policy, one `bound: value` line each.
pub fn policy_lines(policy: &Retention) -> Vec<(&'static str, String)> {
    vec![
        (
            "keep-for",
            policy
                .keep_for_ms
                .map_or_else(|| "off".to_string(), crate::duration::format_duration_ms),
        ),
        (
            "keep-runs",
            policy
                .keep_runs
                .map_or_else(|| "off".to_string(), |runs| runs.to_string()),
        ),
        (
            "max-size",
            policy
                .max_size_bytes
                .map_or_else(|| "off".to_string(), crate::text::format_bytes),
        ),
        ("keep-free", keep_free_text(policy.keep_free)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_in_powers_of_1024_and_nothing_else_does() {
        let cases: &[(&str, Option<u64>)] = &[
            ("4096", Some(4096)),
            ("1K", Some(1024)),
            ("500M", Some(500 << 20)),
            ("2G", Some(2 << 30)),
            ("2GiB", Some(2 << 30)),
            ("3gb", Some(3 << 30)),
            ("1T", Some(1 << 40)),
            ("", None),
            ("M", None),
            ("1.5G", None),
            ("-1", None),
            ("10X", None),
            ("99999999999T", None),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_size(text).ok(), *expected, "{text:?}");
        }
    }

    #[test]
    fn keep_free_is_a_percentage_to_100_or_a_size() {
        assert_eq!(parse_keep_free("10%"), Ok(KeepFree::Percent(10)));
        assert_eq!(parse_keep_free("0%"), Ok(KeepFree::Percent(0)));
        assert_eq!(parse_keep_free("100%"), Ok(KeepFree::Percent(100)));
        assert!(parse_keep_free("101%").is_err());
        assert!(parse_keep_free("x%").is_err());
        assert_eq!(parse_keep_free("1G"), Ok(KeepFree::Bytes(1 << 30)));
        assert_eq!(KeepFree::Percent(10).bytes_of(1000), 100);
        assert_eq!(KeepFree::Percent(100).bytes_of(u64::MAX), u64::MAX);
    }
}
