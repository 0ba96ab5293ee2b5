//! A home whose cost stays flat under every retention bound: `list`, `status` and a reconcile
//! pass with `--max-size` (and every other bound) set, in a home of few kept runs and in one of
//! many, in the same rounds. Beside them, the walk of the home every pass made before the
//! journal kept its size (`retention::home_bytes`), in both homes: what a pass cost more then.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use runjournal::journal::{KeepFree, Retention};
use runjournal::retention::{self, PassOptions};
use runjournal::{Home, RunId, Store, reconcile};

use crate::report::{Measured, Table, ratio_cell, time, verdict};
use crate::{Way, timed};

/// The kept runs of the small home and of the large one.
#[derive(Debug, Clone, Copy)]
pub struct Sizes {
    pub small: usize,
    pub large: usize,
}

impl Sizes {
    /// The sizes the target is stated for: 200 and 20,000 kept runs.
    pub const REPORT: Sizes = Sizes {
        small: 200,
        large: 20_000,
    };

    /// Each workload once, quickly (`--smoke`).
    pub const SMOKE: Sizes = Sizes {
        small: 20,
        large: 200,
    };
}

const GROUP: &str = "home-size";

/// Every bound set, none of which prunes anything in these homes.
const POLICY: Retention = Retention {
    keep_for_ms: Some(30 * 24 * 60 * 60 * 1000),
    keep_runs: Some(1_000_000),
    max_size_bytes: Some(1 << 40),
    keep_free: Some(KeepFree::Percent(1)),
};

/// The workloads, each in the small home then the large one: `list` and `status RUN` (processes,
/// with their reconcile and retention passes), a reconcile pass with its retention pass
/// (library), and the walk of the home.
const WAYS: [&str; 4] = ["list", "status", "pass", "walk"];

/// The id of a workload in a home of `runs` kept runs.
fn id(way: &str, runs: usize) -> String {
    format!("{way}-{runs}")
}

/// Builds both homes (their runs ended, projected, results consumed), sets the policy, makes
/// the first pass (which walks each home once and keeps its size), then measures.
pub fn measure(scratch: &Path, sizes: Sizes, measured: &mut Measured, budget: Duration) {
    let homes: Vec<(usize, PathBuf, Store, RunId)> = [sizes.small, sizes.large]
        .into_iter()
        .map(|runs| {
            let dir = scratch.join(format!("home-size-{runs}"));
            let store = crate::retention::open(&dir);
            store
                .journal()
                .set_retention(&POLICY)
                .expect("the policy is set");
            let mut newest = None;
            let mut left = runs;
            while left > 0 {
                let count = left.min(500);
                newest = crate::retention::feed(&store, count).last().copied();
                left -= count;
            }
            let report = retention::pass(&store, &PassOptions::reconcile()).expect("a pass");
            assert!(report.chosen.is_empty(), "the policy prunes nothing here");
            let newest = newest.expect("a home of at least one run");
            (runs, dir, store, newest)
        })
        .collect();
    let mut ways: Vec<Way> = Vec::new();
    for way in WAYS {
        for (runs, dir, store, newest) in &homes {
            let run: Box<dyn FnMut(u64) -> Duration + '_> = match way {
                "list" => Box::new(move |iters| timed(iters, || command(dir, &["list"]))),
                "status" => {
                    let newest = newest.to_string();
                    Box::new(move |iters| timed(iters, || command(dir, &["status", &newest])))
                }
                "pass" => Box::new(move |iters| {
                    timed(iters, || {
                        reconcile::reconcile(store, &reconcile::Options::default())
                            .expect("a reconcile pass");
                        let report = retention::pass(store, &PassOptions::reconcile())
                            .expect("a retention pass");
                        let size = report.size.expect("max-size asks for the size");
                        assert!(!size.walked, "a kept size is not walked again so soon");
                    })
                }),
                _ => {
                    let home = Home::at(dir);
                    Box::new(move |iters| {
                        timed(iters, || {
                            std::hint::black_box(retention::home_bytes(&home).total());
                        })
                    })
                }
            };
            ways.push((id(way, *runs), run));
        }
    }
    measured.run_rounds(GROUP, ways, budget);
}

/// `runjournal ARGS` in the home, which must succeed.
fn command(home: &Path, args: &[&str]) {
    let output = Command::new(env!("CARGO_BIN_EXE_runjournal"))
        .arg("--home")
        .arg(home)
        .args(args)
        .env_remove("RUNJOURNAL_HOME")
        .env_remove("RUNJOURNAL_LAYOUT")
        .output()
        .expect("runjournal runs");
    assert!(
        output.status.success(),
        "runjournal {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    std::hint::black_box(output.stdout);
}

/// The rows: each way in the large home over the small one, round by round, with the target
/// ≤ 1.2× for `list`, `status` and the pass; and the walk, which every pass made before.
pub fn render(measured: &Measured, sizes: Sizes, verdicts: &mut Vec<String>) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n**A home whose cost stays flat** (`--report home-size`). Two homes of ended runs \
         (projected, results consumed), {} and {} kept, every retention bound set (30 days, \
         a million runs, 1 TiB, 1 % free: nothing to prune); the journal keeps each home's size \
         and walks it only every ten minutes. The last row is that walk (`retention::home_bytes`), \
         which every pass with `--max-size` made before: a pass then cost the pass plus the walk.\n",
        sizes.small, sizes.large
    );
    let mut table = Table::new(&[
        "what",
        &format!("{} runs kept", sizes.small),
        &format!("{} runs kept", sizes.large),
        "large ÷ small",
        "target",
    ]);
    for (way, label, is_target) in [
        (
            "list",
            "`runjournal list` (a process, with its passes)",
            true,
        ),
        (
            "status",
            "`runjournal status RUN` (a process, with its passes)",
            true,
        ),
        (
            "pass",
            "a reconcile pass and its retention pass (library)",
            true,
        ),
        (
            "walk",
            "the walk of the home every pass made before (`retention::home_bytes`)",
            false,
        ),
    ] {
        let (small, large) = (id(way, sizes.small), id(way, sizes.large));
        let (Some(small_ns), Some(large_ns)) = (
            measured.median(GROUP, &small),
            measured.median(GROUP, &large),
        ) else {
            table.row(&[label.to_string(), "not measured".into()]);
            continue;
        };
        let ratio = measured.ratio(GROUP, &large, &small);
        let target = if is_target {
            let is_met = ratio.is_some_and(|ratio| ratio.0 <= 1.2);
            verdicts.push(format!(
                "{label} with every bound set, {} runs kept ≤ 1.2× {}: {} ({})",
                sizes.large,
                sizes.small,
                verdict(is_met),
                ratio_cell(ratio, false)
            ));
            format!("≤ 1.2×: {}", verdict(is_met))
        } else {
            String::new()
        };
        table.row(&[
            label.to_string(),
            time(small_ns),
            time(large_ns),
            ratio_cell(ratio, false),
            target,
        ]);
    }
    out.push_str(&table.text);
    out
}
