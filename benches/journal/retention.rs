//! Retention: a home fed runs under a run-count bound keeps a steady size, pruning costs per
//! pruned run, and a policy that has nothing to prune costs `list` and a reconcile pass next
//! to nothing. Each figure is a ratio within this run.

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use runjournal::journal::Condition;
use runjournal::journal::{KeepFree, Retention};
use runjournal::retention::{self, PassOptions};
use runjournal::store::StoreOptions;
use runjournal::{Home, RunId, Store, reconcile};

use crate::report::{Measured, Table, ratio_cell, time, verdict};
use crate::{Way, fixture, timed};

/// How big the steady-size workload is.
#[derive(Debug, Clone, Copy)]
pub struct Sizes {
    /// The home's `--keep-runs`.
    pub keep_runs: u64,
    /// Runs fed when the first size is taken, and in all.
    pub first_checkpoint: usize,
    pub total: usize,
    /// Runs that end between two retention passes (under a pass's limit, so passes keep up as
    /// the reconciler's do).
    pub per_pass: usize,
}

impl Sizes {
    /// The sizes the target is stated for: 20,000 runs under `--keep-runs 1000`, measured at
    /// 2,000 and 20,000.
    pub const REPORT: Sizes = Sizes {
        keep_runs: 1_000,
        first_checkpoint: 2_000,
        total: 20_000,
        per_pass: 50,
    };

    /// Each step once, quickly (`--smoke`).
    pub const SMOKE: Sizes = Sizes {
        keep_runs: 10,
        first_checkpoint: 20,
        total: 60,
        per_pass: 10,
    };
}

/// What the steady-size workload found.
#[derive(Debug, Clone, Copy, Default)]
pub struct Steady {
    pub keep_runs: u64,
    pub first_checkpoint: usize,
    pub total: usize,
    pub per_pass: usize,
    /// `journal.redb`'s size and the run directories, at the first checkpoint and at the end.
    pub journal_bytes: [u64; 2],
    pub run_dirs: [usize; 2],
    /// Runs pruned in all, and the time of the passes that pruned them.
    pub pruned: usize,
    pub pruning: Duration,
}

const GROUP: &str = "retention";
const LIST_WITH: &str = "list-policy-set";
const LIST_WITHOUT: &str = "list-no-policy";
const PASS_WITH: &str = "reconcile-policy-set";
const PASS_WITHOUT: &str = "reconcile-no-policy";

/// Every bound off: what a home that never prunes applies.
const OFF: Retention = Retention {
    keep_for_ms: None,
    keep_runs: None,
    max_size_bytes: None,
    keep_free: None,
};

/// Feeds `sizes.total` closed runs to a home under `--keep-runs`, a retention pass after every
/// `per_pass` of them, then measures `list` and a reconcile pass of that home against a copy of
/// it with every bound off.
pub fn measure(scratch: &Path, sizes: Sizes, measured: &mut Measured, budget: Duration) -> Steady {
    let with_dir = scratch.join("retention-with");
    let store = open(&with_dir);
    let policy = Retention {
        keep_for_ms: Some(30 * 24 * 60 * 60 * 1000),
        keep_runs: Some(sizes.keep_runs),
        max_size_bytes: None,
        keep_free: Some(KeepFree::Percent(10)),
    };
    store
        .journal()
        .set_retention(&policy)
        .expect("the policy is set");
    let mut steady = Steady {
        keep_runs: sizes.keep_runs,
        first_checkpoint: sizes.first_checkpoint,
        total: sizes.total,
        per_pass: sizes.per_pass,
        ..Steady::default()
    };
    let mut fed = 0;
    while fed < sizes.total {
        let count = sizes.per_pass.min(sizes.total - fed);
        feed(&store, count);
        fed += count;
        let started = Instant::now();
        let report = retention::pass(&store, &PassOptions::reconcile()).expect("a retention pass");
        steady.pruning += started.elapsed();
        steady.pruned += report.chosen.len();
        assert!(report.errors.is_empty(), "{:?}", report.errors);
        if fed == sizes.first_checkpoint {
            steady.journal_bytes[0] = file_len(&store.home().journal_path());
            steady.run_dirs[0] = entries(&store.home().runs_dir());
        }
    }
    // The files of the runs the last pass pruned go at the next pass.
    retention::pass(&store, &PassOptions::reconcile()).expect("a retention pass");
    steady.journal_bytes[1] = file_len(&store.home().journal_path());
    steady.run_dirs[1] = entries(&store.home().runs_dir());
    drop(store);

    // The same home with every bound off: a copy, so both hold the same runs.
    let without_dir = scratch.join("retention-without");
    copy_dir(&with_dir, &without_dir);
    let with = open(&with_dir);
    let without = open(&without_dir);
    without
        .journal()
        .set_retention(&OFF)
        .expect("the policy is set");
    let ways: Vec<Way> = vec![
        (LIST_WITH.into(), list(&with_dir)),
        (LIST_WITHOUT.into(), list(&without_dir)),
        (PASS_WITH.into(), reconcile_pass(&with)),
        (PASS_WITHOUT.into(), reconcile_pass(&without)),
    ];
    measured.run_rounds(GROUP, ways, budget);
    steady
}

pub(crate) fn open(dir: &Path) -> Store {
    std::fs::create_dir_all(dir).expect("the home directory can be made");
    Store::open_with(Home::at(dir), StoreOptions::default()).expect("the home opens")
}

/// `count` runs that ran and ended, projected, their results consumed by their host; their
/// ids, in the order they ended.
pub(crate) fn feed(store: &Store, count: usize) -> Vec<RunId> {
    let runs: Vec<RunId> = (0..count).map(|_| RunId::generate()).collect();
    let batches = runs
        .iter()
        .map(|&run| (run, fixture::closed_lifecycle(), Condition::expect_head(0)));
    for result in store.journal().append_all(batches) {
        result.expect("a closed lifecycle is a legal batch");
    }
    for &run in &runs {
        store.project(run).expect("an ended run is projected");
        std::fs::remove_file(store.home().result_path(run)).expect("the host consumes the result");
    }
    runs
}

fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |metadata| metadata.len())
}

fn entries(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |entries| entries.count())
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("a directory can be made");
    for entry in std::fs::read_dir(from).expect("the home reads") {
        let entry = entry.expect("an entry reads");
        let target = to.join(entry.file_name());
        let kind = entry.file_type().expect("an entry's type reads");
        if kind.is_dir() {
            copy_dir(&entry.path(), &target);
        } else if kind.is_file() {
            std::fs::copy(entry.path(), &target).expect("a file copies");
        }
    }
}

/// One iteration = `runjournal list` (a process: its reconcile pass, its retention pass).
fn list<'a>(home: &'a Path) -> Box<dyn FnMut(u64) -> Duration + 'a> {
    Box::new(move |iters| timed(iters, || crate::list_through_binary(home)))
}

/// One iteration = a reconcile pass and the retention pass that follows it.
fn reconcile_pass(store: &Store) -> Box<dyn FnMut(u64) -> Duration + '_> {
    Box::new(move |iters| {
        timed(iters, || {
            reconcile::reconcile(store, &reconcile::Options::default()).expect("a reconcile pass");
            let report =
                retention::pass(store, &PassOptions::reconcile()).expect("a retention pass");
            assert!(report.chosen.is_empty(), "a steady home prunes nothing");
        })
    })
}

/// The report's retention rows.
pub fn render(measured: &Measured, steady: &Steady, verdicts: &mut Vec<String>) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n**Retention.** A home fed {} ended runs (one command step each, projected, results \
         consumed) under `--keep-runs {}`, a retention pass after every {} (as the reconciler \
         makes them): its size when {} runs were fed and at the end.\n",
        steady.total, steady.keep_runs, steady.per_pass, steady.first_checkpoint
    );
    let mut table = Table::new(&[
        "what",
        &format!("after {} runs", steady.first_checkpoint),
        &format!("after {} runs", steady.total),
        "end ÷ first",
        "target",
    ]);
    let journal_ratio = ratio(steady.journal_bytes[1], steady.journal_bytes[0]);
    let dirs_ratio = ratio(steady.run_dirs[1] as u64, steady.run_dirs[0] as u64);
    for (label, first, end, ratio) in [
        (
            "`journal.redb` size",
            runjournal::text::format_bytes(steady.journal_bytes[0]),
            runjournal::text::format_bytes(steady.journal_bytes[1]),
            journal_ratio,
        ),
        (
            "run directories",
            steady.run_dirs[0].to_string(),
            steady.run_dirs[1].to_string(),
            dirs_ratio,
        ),
    ] {
        let is_met = ratio <= 1.2;
        verdicts.push(format!(
            "{label} steady under --keep-runs: {} ({ratio:.2}×)",
            verdict(is_met)
        ));
        table.row(&[
            label.to_string(),
            first,
            end,
            format!("{ratio:.2}×"),
            format!("≤ 1.2×: {}", verdict(is_met)),
        ]);
    }
    out.push_str(&table.text);
    let per_run = if steady.pruned == 0 {
        "none pruned".to_string()
    } else {
        time(steady.pruning.as_nanos() as f64 / steady.pruned as f64)
    };
    let _ = writeln!(
        out,
        "\n{} runs pruned in all; the passes that pruned them took {per_run} per pruned run \
         (the journal transaction, the run's files, the index entries).\n",
        steady.pruned
    );
    let mut table = Table::new(&[
        "what",
        "policy set",
        "every bound off",
        "set ÷ off",
        "target",
    ]);
    for (label, with, without) in [
        (
            "`runjournal list` (a process, with its passes)",
            LIST_WITH,
            LIST_WITHOUT,
        ),
        (
            "a reconcile pass and its retention pass (library)",
            PASS_WITH,
            PASS_WITHOUT,
        ),
    ] {
        let (Some(with_ns), Some(without_ns)) = (
            measured.median(GROUP, with),
            measured.median(GROUP, without),
        ) else {
            table.row(&[label.to_string(), "not measured".into()]);
            continue;
        };
        let ratio = measured.ratio(GROUP, with, without);
        let is_met = ratio.is_some_and(|ratio| ratio.0 <= 1.2);
        verdicts.push(format!(
            "{label} with a policy that prunes nothing: {} ({})",
            verdict(is_met),
            ratio_cell(ratio, false)
        ));
        table.row(&[
            label.to_string(),
            time(with_ns),
            time(without_ns),
            ratio_cell(ratio, false),
            format!("≤ 1.2×: {}", verdict(is_met)),
        ]);
    }
    out.push_str(&table.text);
    out
}

fn ratio(end: u64, first: u64) -> f64 {
    if first == 0 {
        return f64::INFINITY;
    }
    end as f64 / first as f64
}
