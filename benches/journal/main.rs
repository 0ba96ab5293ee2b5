//! The performance suite of runjournal, measured against baselines in the same run.
//!
//! `cargo bench --bench journal` runs the criterion benchmarks (filters work as usual).
//! `cargo bench --bench journal -- --report` runs all of them with fixed settings, then the
//! measurements criterion cannot make (latency percentiles, disk operations per commit), and
//! writes `target/bench-report.md`: every figure as a ratio against a baseline measured in the
//! same run, so a machine busy with other work cannot fake or hide a change.
//!
//! `cargo bench --bench journal -- --report --smoke` runs each workload of the report once, at
//! a tiny size (a 1,000-run journal built on the spot, a short chatty run), and writes
//! `target/bench-report-smoke.md`: CI runs it so that the report cannot rot unnoticed; its
//! figures mean nothing.
//!
//! Everything is written under `target/`: scratch homes in `target/tmp`, the 100,000-run
//! journal cached in `target/bench-fixtures` (built once, in big group commits, then copied).

// A benchmark's workload and its report read top to bottom: the bound on a function's length
// is for the library.
#![allow(clippy::too_many_lines)]

mod baselines;
mod commands;
mod felt;
mod fixture;
mod home_size;
mod processes;
mod queue;
mod report;
mod retention;
mod watcher;

use std::cell::{OnceCell, RefCell};
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use criterion::{Criterion, SamplingMode, Throughput};

use runjournal::event::{Record, RunId};
use runjournal::journal::instrumented::{DiskCounters, InstrumentedFile};
use runjournal::journal::{Condition, View, WriterOptions};
use runjournal::projection::documents;
use runjournal::{Journal, reconcile, state};

use fixture::BenchHome;

/// Closed runs of the large home, and of the small one it is compared with.
const LARGE_CLOSED: usize = 100_000;
const SMALL_CLOSED: usize = 100;
/// Active runs of both homes.
const ACTIVE: usize = 100;
/// Concurrent appenders, each with its own run, through one journal handle.
const APPENDERS: [usize; 3] = [1, 16, 256];
/// Handles (one appender each) standing for as many processes.
const HANDLES: usize = 16;
/// Runs folded per replay iteration, and their records (six each).
const REPLAY_RUNS: usize = 1_000;
const REPLAY_RECORDS: usize = 6 * REPLAY_RUNS;
/// How many terminal runs `runjournal list` shows besides the active ones.
const LIST_RECENT_TERMINAL: usize = runjournal::resolve::RECENT_TERMINAL_LIMIT;

/// Where cargo puts this package's build output, from the scratch directory it gives benches.
fn target_dir() -> PathBuf {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    tmp.parent().unwrap_or(tmp).to_path_buf()
}

/// A workload: `run(iters)` does `iters` iterations and returns the time they took.
pub type Way<'a> = (String, Box<dyn FnMut(u64) -> Duration + 'a>);

fn timed(iters: u64, mut once: impl FnMut()) -> Duration {
    let started = Instant::now();
    for _ in 0..iters {
        once();
    }
    started.elapsed()
}

fn main() {
    // An appender process of the `processes` group: this binary started again.
    if processes::child_main_if_asked() {
        return;
    }
    // The step of the launch group's `wait-tail`: this binary started by a runner.
    if felt::stamp_exit_if_asked() {
        return;
    }
    // A sample of the commands group's peak memory: this binary started to run one command.
    if commands::peak_rss_child_if_asked() {
        return;
    }
    if let Some(done) = profile_if_asked() {
        eprintln!("{done}");
        return;
    }
    let is_report = std::env::args().any(|arg| arg == "--report");
    let is_smoke = is_report && std::env::args().any(|arg| arg == "--smoke");
    // `--report <group>...`: only these groups' rounds (all when none is named); the rows of
    // what users feel (`felt.rs`) are the groups `chatty`, `launch` and `projected`; a home under a
    // retention policy (`retention.rs`) is the group `retention`; homes of few and many kept runs
    // under every bound (`home_size.rs`), `home-size`; `list`, `status`, `run` and `run --wait`
    // of the binary, their time and peak memory, in homes of few and many closed runs
    // (`commands.rs`), `commands`.
    let report_groups: Vec<String> = std::env::args()
        .skip_while(|arg| arg != "--report")
        .skip(1)
        .take_while(|arg| !arg.starts_with("--"))
        .collect();
    let is_reported =
        |group: &str| report_groups.is_empty() || report_groups.iter().any(|g| g == group);
    let sizes = if is_smoke {
        felt::Sizes::SMOKE
    } else {
        felt::Sizes::REPORT
    };
    // A smoke run builds its large home on the spot, small, and leaves the cache alone.
    let large_closed = if is_smoke { 1_000 } else { LARGE_CLOSED };
    let target = target_dir();
    let scratch = tempfile::Builder::new()
        .prefix("bench-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("a scratch directory under target/tmp");
    let cache = target.join("bench-fixtures");
    let mut facts = report::Facts::observe(scratch.path());
    facts.projected_appenders = sizes.projected_appenders;

    let sample = fixture::closed_records(1);
    let update_record = Record {
        event: fixture::job_update(42),
        ..sample[0][0].clone()
    };
    let record = update_record.encode().expect("the record encodes");
    facts.record_bytes = record.len();
    let status = status_json(&sample[0]);
    facts.status_bytes = status.len();
    let build_large = || {
        BenchHome::build(
            &scratch.path().join("large"),
            (!is_smoke).then_some(cache.as_path()),
            large_closed,
            ACTIVE,
        )
    };
    let build_small =
        || BenchHome::build(&scratch.path().join("small"), None, SMALL_CLOSED, ACTIVE);

    if !is_report {
        let mut criterion = Criterion::default()
            .output_directory(&target.join("criterion"))
            .sample_size(10)
            .warm_up_time(Duration::from_secs(1))
            .measurement_time(Duration::from_secs(4))
            .without_plots()
            .configure_from_args();
        let large: OnceCell<BenchHome> = OnceCell::new();
        let small: OnceCell<BenchHome> = OnceCell::new();
        let large_home = || large.get_or_init(build_large);
        let small_home = || small.get_or_init(build_small);
        bench_group(
            &mut criterion,
            "transition",
            Throughput::Elements(1),
            || transition_ways(scratch.path(), &record, &status),
        );
        bench_group(&mut criterion, "processes", Throughput::Elements(1), || {
            processes::ways(scratch.path()).0
        });
        bench_group(
            &mut criterion,
            "replay",
            Throughput::Elements(REPLAY_RECORDS as u64),
            || replay_ways(large_home()),
        );
        bench_group(&mut criterion, "reconcile", Throughput::Elements(1), || {
            reconcile_ways(small_home(), large_home())
        });
        bench_group(&mut criterion, "list", Throughput::Elements(1), || {
            list_ways(small_home(), large_home())
        });
        criterion.final_summary();
        return;
    }

    // The report: the same workloads, in rounds. Each round runs every workload of a group
    // for about `budget`, one after the other, so a baseline and what is compared with it see
    // the same moments of a shared machine; a figure is the median over the rounds.
    let mut measured = report::Measured::new(is_smoke);
    let budget = |ms: u64| Duration::from_millis(if is_smoke { 1 } else { ms });
    if is_reported("transition") {
        eprintln!("transitions...");
        measured.run_rounds(
            "transition",
            transition_ways(scratch.path(), &record, &status),
            budget(600),
        );
    }
    if is_reported("processes") {
        eprintln!(
            "processes appending at once (starting {} processes)...",
            processes::WAYS
                .iter()
                .map(|(_, count, _)| count)
                .sum::<usize>()
        );
        let (ways, cpu) = processes::ways(scratch.path());
        measured.run_rounds("processes", ways, budget(800));
        // The first figure of each is the round that only sets the iteration count (a smoke
        // run has none).
        let calibrating = usize::from(!is_smoke);
        facts.process_cpu = cpu
            .into_iter()
            .map(|(id, figures)| {
                let figures = figures.borrow();
                let kept = figures.get(calibrating..).unwrap_or_default().to_vec();
                (id, report::median_of(kept))
            })
            .collect();
    }
    felt::measure(scratch.path(), sizes, &mut measured, budget, is_reported);
    queue::measure(scratch.path(), &mut measured, budget, is_reported);
    // The large and small homes, built once for the groups that use them.
    let built_homes: OnceCell<(BenchHome, BenchHome)> = OnceCell::new();
    let homes = || {
        built_homes.get_or_init(|| {
            eprintln!(
                "building the homes (100,000 closed runs cached under target/bench-fixtures)..."
            );
            (build_large(), build_small())
        })
    };
    if is_reported("replay") || is_reported("reconcile") || is_reported("list") {
        let (large, small) = homes();
        eprintln!("replay...");
        measured.run_rounds("replay", replay_ways(large), budget(400));
        eprintln!("reconcile and list...");
        measured.run_rounds("reconcile", reconcile_ways(small, large), budget(500));
        measured.run_rounds("list", list_ways(small, large), budget(500));
    }
    // After the groups above: the runs it launches stay in the homes.
    if is_reported("commands") {
        let (large, small) = homes();
        eprintln!("list, status, run and run --wait in both homes, with their peak memory...");
        let samples = if is_smoke { 1 } else { 5 };
        facts.commands = Some(commands::measure(
            small,
            large,
            &mut measured,
            budget(300),
            samples,
        ));
    }
    // Closed before the groups that follow, as they were before the homes were shared.
    drop(built_homes);
    if is_reported("retention") {
        eprintln!("a home under a retention policy...");
        let sizes = if is_smoke {
            retention::Sizes::SMOKE
        } else {
            retention::Sizes::REPORT
        };
        facts.retention = Some(retention::measure(
            scratch.path(),
            sizes,
            &mut measured,
            budget(500),
        ));
    }
    if is_reported("home-size") {
        eprintln!("homes of few and many kept runs, every retention bound set...");
        let sizes = if is_smoke {
            home_size::Sizes::SMOKE
        } else {
            home_size::Sizes::REPORT
        };
        home_size::measure(scratch.path(), sizes, &mut measured, budget(500));
        facts.home_size = Some(sizes);
    }
    // Last: its runs sleep, and the machine is otherwise quiet for the spell it is watched.
    if is_reported("watcher") {
        eprintln!("the home's watcher at rest...");
        let (runs, spell) = if is_smoke {
            (3, Duration::from_secs(1))
        } else {
            (100, Duration::from_secs(60))
        };
        facts.watcher = Some(watcher::measure(scratch.path(), runs, spell));
    }
    if is_reported("transition") {
        eprintln!("latency percentiles and disk operations per commit...");
        facts.latency = Some(latencies(scratch.path(), &record, is_smoke));
        facts.disk = Some(disk_operations(scratch.path(), &record, is_smoke));
    }
    facts.observe_end();
    let text = report::render(&measured, &facts);
    let name = if is_smoke {
        "bench-report-smoke.md"
    } else {
        "bench-report.md"
    };
    std::fs::write(target.join(name), &text).expect("the report is written");
    println!("{text}");
    eprintln!("report written to target/{name}");
}

/// `--profile <way> <transitions>`: only that workload of the `transition` group, for that many
/// transitions, and nothing else, for a profiler. Callgrind counts instructions, which a busy
/// machine cannot blur: the difference between the counts of two runs over the difference of
/// their transitions is what one transition costs, the setup taken out.
fn profile_if_asked() -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    let at = args.iter().position(|arg| arg == "--profile")?;
    let (Some(way), Some(count)) = (args.get(at + 1), args.get(at + 2)) else {
        return Some("--profile needs a workload of the transition group and a count".into());
    };
    let Ok(count) = count.parse::<u64>() else {
        return Some(format!("--profile: {count} is not a count of transitions"));
    };
    let scratch = tempfile::Builder::new()
        .prefix("profile-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("a scratch directory under target/tmp");
    let record = Record {
        event: fixture::job_update(42),
        ..fixture::closed_records(1)[0][0].clone()
    }
    .encode()
    .expect("the record encodes");
    let mut ways = transition_ways(scratch.path(), &record, b"{}");
    let Some((_, run)) = ways.iter_mut().find(|(id, _)| id == way) else {
        return Some(format!(
            "--profile: no workload {way} (try one of {TRANSITION_IDS:?})"
        ));
    };
    let elapsed = run(count);
    Some(format!("{way}: {count} transitions in {elapsed:?}"))
}

/// Registers a criterion group whose workloads are made (once, lazily: a filtered-out group
/// builds nothing) by `make`.
fn bench_group<'a>(
    criterion: &mut Criterion,
    name: &str,
    throughput: Throughput,
    make: impl FnOnce() -> Vec<Way<'a>>,
) {
    let ids: Vec<String> = match name {
        "transition" => TRANSITION_IDS.iter().map(|id| id.to_string()).collect(),
        "replay" => REPLAY_IDS.iter().map(|id| id.to_string()).collect(),
        "reconcile" => RECONCILE_IDS.iter().map(|id| id.to_string()).collect(),
        "processes" => processes::WAYS
            .iter()
            .map(|(id, _, _)| id.to_string())
            .collect(),
        _ => LIST_IDS.iter().map(|id| id.to_string()).collect(),
    };
    let ways: OnceCell<RefCell<Vec<Way<'a>>>> = OnceCell::new();
    let mut make = Some(make);
    let mut group = criterion.benchmark_group(name);
    group
        .sampling_mode(SamplingMode::Flat)
        .throughput(throughput);
    for (index, id) in ids.iter().enumerate() {
        group.bench_function(id, |b| {
            let ways = ways.get_or_init(|| {
                let make = make.take().expect("made once");
                let ways = make();
                assert_eq!(
                    ways.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>(),
                    ids.iter().map(String::as_str).collect::<Vec<_>>(),
                    "the ids of group {name}"
                );
                RefCell::new(ways)
            });
            b.iter_custom(|iters| (ways.borrow_mut()[index].1)(iters))
        });
    }
    group.finish();
}

/// The status.json a pi-subagents-style tool would rewrite on each transition of the run.
fn status_json(records: &[Record]) -> Vec<u8> {
    let state = state::replay(&records[..3])
        .expect("the records fold")
        .expect("a run");
    let home = runjournal::Home::at("/home/user/.local/state/runjournal");
    serde_json::to_vec_pretty(&documents::status_doc(&home, &state, &Default::default()))
        .expect("status renders")
}

/// `count` runs whose external-job step is running, ready for updates.
pub fn running_runs(journal: &Journal, count: usize) -> Vec<RunId> {
    let runs: Vec<RunId> = (0..count).map(|_| RunId::generate()).collect();
    let batches = runs.iter().map(|&run| {
        (
            run,
            vec![
                fixture::created(fixture::job_spec()),
                fixture::runner_started(runjournal::liveness::current().expect("an identity")),
                fixture::step_running(None),
            ],
            Condition::expect_head(0),
        )
    });
    for result in journal.append_all(batches) {
        result.expect("a running run is a legal batch");
    }
    runs
}

/// Makes `iters` transitions, spread over one thread per run (thread `i` appends through
/// `journals[i % len]`), all started together; returns the time they took, scaled to exactly
/// `iters`. With `latencies`, each acknowledged append's own time is collected too.
fn concurrent_transitions(
    journals: &[Journal],
    runs: &[RunId],
    iters: u64,
    latencies: Option<&Mutex<Vec<Duration>>>,
) -> Duration {
    let per_thread = iters.div_ceil(runs.len() as u64).max(1);
    let barrier = Barrier::new(runs.len() + 1);
    let elapsed = std::thread::scope(|scope| {
        let handles: Vec<_> = runs
            .iter()
            .enumerate()
            .map(|(index, &run)| {
                let journal = &journals[index % journals.len()];
                let barrier = &barrier;
                let is_timing_each = latencies.is_some();
                scope.spawn(move || {
                    let mut mine = Vec::new();
                    barrier.wait();
                    for progress in 0..per_thread {
                        let started = Instant::now();
                        journal
                            .append(
                                run,
                                vec![fixture::job_update(progress as u32)],
                                Condition::none(),
                            )
                            .expect("a job update is acknowledged");
                        if is_timing_each {
                            mine.push(started.elapsed());
                        }
                    }
                    mine
                })
            })
            .collect();
        barrier.wait();
        let started = Instant::now();
        let timed: Vec<Vec<Duration>> = handles
            .into_iter()
            .map(|handle| handle.join().expect("an appender does not panic"))
            .collect();
        let elapsed = started.elapsed();
        if let Some(latencies) = latencies {
            let mut latencies = latencies.lock().expect("not poisoned");
            latencies.extend(timed.into_iter().flatten());
        }
        elapsed
    });
    elapsed.mul_f64(iters as f64 / (per_thread * runs.len() as u64) as f64)
}

/// The ids of each group's workloads, in the order their builders return them.
const TRANSITION_IDS: [&str; 10] = [
    "append-fdatasync",
    "two-phase-floor",
    "redb-insert",
    "status-rename",
    "status-rename-fsync",
    "sqlite-wal-full",
    "runjournal-1",
    "runjournal-16",
    "runjournal-256",
    "runjournal-16-handles",
];
const REPLAY_IDS: [&str; 3] = ["events-jsonl-parse", "fold", "read-decode-fold"];
const RECONCILE_IDS: [&str; 2] = ["100-active-100-closed", "100-active-100000-closed"];
const LIST_IDS: [&str; 4] = [
    "library-200-runs",
    "library-100100-runs",
    "binary-200-runs",
    "binary-100100-runs",
];

/// One iteration = one durable transition (per-transition time; throughput is its inverse).
fn transition_ways(scratch: &Path, record: &[u8], status: &[u8]) -> Vec<Way<'static>> {
    let dir = scratch.join("transitions");
    std::fs::create_dir_all(&dir).expect("a directory for the transition benchmarks");
    let mut ways: Vec<Way<'static>> = Vec::new();
    let mut append = baselines::AppendFile::new(&dir, record);
    ways.push((
        "append-fdatasync".into(),
        Box::new(move |iters| timed(iters, || append.transition())),
    ));
    let mut floor = baselines::TwoPhaseFloor::new(&dir, record);
    ways.push((
        "two-phase-floor".into(),
        Box::new(move |iters| timed(iters, || floor.transition())),
    ));
    let mut redb = baselines::RedbInsert::new(&dir, record);
    ways.push((
        "redb-insert".into(),
        Box::new(move |iters| timed(iters, || redb.transition())),
    ));
    let mut rewrite = baselines::RewriteStatus::new(&dir, status, false);
    ways.push((
        "status-rename".into(),
        Box::new(move |iters| timed(iters, || rewrite.transition())),
    ));
    let mut rewrite_durable = baselines::RewriteStatus::new(&dir, status, true);
    ways.push((
        "status-rename-fsync".into(),
        Box::new(move |iters| timed(iters, || rewrite_durable.transition())),
    ));
    let mut sqlite = baselines::Sqlite::new(&dir, record);
    ways.push((
        "sqlite-wal-full".into(),
        Box::new(move |iters| timed(iters, || sqlite.transition())),
    ));
    for appenders in APPENDERS {
        let journal_dir = dir.join(format!("journal-{appenders}"));
        std::fs::create_dir_all(&journal_dir).expect("a journal directory");
        let journals = [Journal::open(journal_dir.join("journal.redb")).expect("a journal")];
        let runs = running_runs(&journals[0], appenders);
        ways.push((
            format!("runjournal-{appenders}"),
            Box::new(move |iters| concurrent_transitions(&journals, &runs, iters, None)),
        ));
    }
    let journal_dir = dir.join("journal-handles");
    std::fs::create_dir_all(&journal_dir).expect("a journal directory");
    let journals: Vec<Journal> = (0..HANDLES)
        .map(|_| Journal::open(journal_dir.join("journal.redb")).expect("a handle"))
        .collect();
    let runs: Vec<RunId> = journals
        .iter()
        .flat_map(|journal| running_runs(journal, 1))
        .collect();
    ways.push((
        format!("runjournal-{HANDLES}-handles"),
        Box::new(move |iters| concurrent_transitions(&journals, &runs, iters, None)),
    ));
    ways
}

/// One iteration = folding (or parsing, or reading) the records of `REPLAY_RUNS` closed runs.
fn replay_ways(large: &BenchHome) -> Vec<Way<'_>> {
    let runs = fixture::closed_records(REPLAY_RUNS);
    assert_eq!(runs.iter().map(Vec::len).sum::<usize>(), REPLAY_RECORDS);
    let lines: Vec<String> = runs
        .iter()
        .flatten()
        .map(|record| documents::event_line(record).to_string())
        .collect();
    let view = large.store.journal().view().expect("a view");
    let all = view.all_runs().expect("the runs");
    drop(view);
    // Spread over the whole journal, not its first pages.
    let step = (all.len() / REPLAY_RUNS).max(1);
    let sample: Vec<RunId> = all.into_iter().step_by(step).take(REPLAY_RUNS).collect();
    vec![
        (
            "events-jsonl-parse".into(),
            Box::new(move |iters| {
                timed(iters, || {
                    for line in &lines {
                        let value: serde_json::Value =
                            serde_json::from_str(line).expect("an events.jsonl line parses");
                        black_box(value);
                    }
                })
            }),
        ),
        (
            "fold".into(),
            Box::new(move |iters| {
                timed(iters, || {
                    for records in &runs {
                        black_box(state::replay(records).expect("the records fold"));
                    }
                })
            }),
        ),
        (
            "read-decode-fold".into(),
            Box::new(move |iters| {
                timed(iters, || {
                    let view = large.store.journal().view().expect("a view");
                    let mut count = 0;
                    for &run in &sample {
                        let records = view.records(run).expect("the records read");
                        count += records.len();
                        black_box(state::replay(&records).expect("the records fold"));
                    }
                    assert_eq!(count, REPLAY_RECORDS);
                })
            }),
        ),
    ]
}

/// One iteration = one reconcile pass over the home's active runs.
fn reconcile_ways<'a>(small: &'a BenchHome, large: &'a BenchHome) -> Vec<Way<'a>> {
    // The report holds one outcome per active run, then one per closed run whose projection
    // the pass rebuilt (the runs the log shows changed since its last pass).
    let pass = |home: &BenchHome| {
        let report = reconcile::reconcile(&home.store, &reconcile::Options::default())
            .expect("a reconcile pass");
        assert_eq!(report.active, home.active.len());
        report
    };
    for home in [small, large] {
        // The first pass projects the closed runs of the fixture's last log records (a
        // journal built without projections); after it, the fixture is as meant: every
        // active run is running, nothing to repair.
        let first = pass(home);
        assert!(
            first.outcomes.iter().all(|outcome| outcome.error.is_none()),
            "{first:?}"
        );
        let report = pass(home);
        assert!(
            report.changed().next().is_none()
                && report
                    .outcomes
                    .iter()
                    .all(|outcome| outcome.error.is_none()),
            "{report:?}"
        );
    }
    vec![
        (
            RECONCILE_IDS[0].into(),
            Box::new(move |iters| timed(iters, || drop(black_box(pass(small))))),
        ),
        (
            RECONCILE_IDS[1].into(),
            Box::new(move |iters| timed(iters, || drop(black_box(pass(large))))),
        ),
    ]
}

/// One iteration = one listing: the library calls behind `runjournal list`, or the binary.
fn list_ways<'a>(small: &'a BenchHome, large: &'a BenchHome) -> Vec<Way<'a>> {
    let library = |home: &'a BenchHome| -> Box<dyn FnMut(u64) -> Duration + 'a> {
        Box::new(move |iters| {
            timed(iters, || {
                let view = home.store.journal().view().expect("a view");
                let listed = list_through_library(&view);
                assert_eq!(listed, ACTIVE + LIST_RECENT_TERMINAL.min(home.closed));
            })
        })
    };
    let binary = |home: &'a BenchHome| -> Box<dyn FnMut(u64) -> Duration + 'a> {
        Box::new(move |iters| timed(iters, || list_through_binary(home.root())))
    };
    vec![
        (LIST_IDS[0].into(), library(small)),
        (LIST_IDS[1].into(), library(large)),
        (LIST_IDS[2].into(), binary(small)),
        (LIST_IDS[3].into(), binary(large)),
    ]
}

/// What `runjournal list` reads without `--all`: the active runs and the most recently ended,
/// each run's snapshot, chosen as the command chooses them.
fn list_through_library(view: &View) -> usize {
    runjournal::resolve::listed(view, runjournal::resolve::ListOptions::default())
        .expect("the listing reads")
        .runs
        .len()
}

fn list_through_binary(home: &Path) {
    let output = Command::new(env!("CARGO_BIN_EXE_runjournal"))
        .arg("--home")
        .arg(home)
        .arg("list")
        .env_remove("RUNJOURNAL_HOME")
        .output()
        .expect("runjournal runs");
    assert!(
        output.status.success(),
        "runjournal list failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    black_box(output.stdout);
}

/// Percentiles of single acknowledged transitions: the append + fdatasync baseline, one
/// appender, and each of 256 concurrent appenders. Rounds alternate so that all three see the
/// same moments of a busy machine.
fn latencies(scratch: &Path, record: &[u8], is_smoke: bool) -> report::Latencies {
    let (rounds, per_round, many_per_run) = if is_smoke { (1, 2, 1) } else { (6, 50, 4) };
    let dir = scratch.join("latency");
    std::fs::create_dir_all(&dir).expect("a latency directory");
    let mut baseline = baselines::AppendFile::new(&dir, record);
    let one = [Journal::open(dir.join("one.redb")).expect("a journal")];
    let one_run = running_runs(&one[0], 1);
    let many = [Journal::open(dir.join("many.redb")).expect("a journal")];
    let many_runs = running_runs(&many[0], 256);
    let (mut base, one_times, many_times) =
        (Vec::new(), Mutex::new(Vec::new()), Mutex::new(Vec::new()));
    for _ in 0..rounds {
        for _ in 0..per_round {
            let started = Instant::now();
            baseline.transition();
            base.push(started.elapsed());
        }
        concurrent_transitions(&one, &one_run, per_round as u64, Some(&one_times));
        concurrent_transitions(&many, &many_runs, 256 * many_per_run, Some(&many_times));
    }
    report::Latencies {
        baseline: report::Percentiles::of(base),
        one: report::Percentiles::of(one_times.into_inner().expect("not poisoned")),
        many: report::Percentiles::of(many_times.into_inner().expect("not poisoned")),
    }
}

/// What one commit asks of the disk, counted through redb's own file backend: with one
/// appender (one batch per commit) and with 256 (many batches per commit), and redb alone
/// committing one insert the same way.
fn disk_operations(scratch: &Path, record: &[u8], is_smoke: bool) -> report::Disk {
    let measure = |name: &str, appenders: usize, rounds: u64| {
        let counters = Arc::new(DiskCounters::default());
        let source = InstrumentedFile::source(
            scratch.join(format!("{name}.redb")),
            Arc::clone(&counters),
            None,
        );
        let journals = [Journal::open_with(source, WriterOptions::default()).expect("a journal")];
        let runs = running_runs(&journals[0], appenders);
        let stats = journals[0].writer_stats();
        let commits_before = stats.commits.load(Ordering::Relaxed);
        let batches_before = stats.batches.load(Ordering::Relaxed);
        let before = counters.read();
        let cpu_before = report::process_cpu_ns();
        let elapsed = concurrent_transitions(&journals, &runs, rounds * appenders as u64, None);
        let cpu = report::process_cpu_ns() - cpu_before;
        let after = counters.read();
        let commits = (stats.commits.load(Ordering::Relaxed) - commits_before) as f64;
        let per_commit = |index: usize| (after[index] - before[index]) as f64 / commits;
        report::DiskPerCommit {
            label: format!(
                "runjournal, {appenders} appender{}",
                if appenders == 1 { "" } else { "s" }
            ),
            commits,
            batches_per_commit: (stats.batches.load(Ordering::Relaxed) - batches_before) as f64
                / commits,
            syncs: per_commit(0),
            writes: per_commit(1),
            bytes: per_commit(2),
            set_lens: per_commit(3),
            sync_ns: per_commit(4),
            write_ns: per_commit(5),
            wall_ns: elapsed.as_nanos() as f64 / commits,
            cpu_ns: cpu / commits,
        }
    };
    let measure_redb = |commits: u64| {
        let counters = Arc::new(DiskCounters::default());
        let backend =
            InstrumentedFile::open(&scratch.join("disk-redb.redb"), Arc::clone(&counters), None)
                .expect("the file opens");
        let mut redb = baselines::RedbInsert::with_backend(backend, record);
        let before = counters.read();
        let cpu_before = report::process_cpu_ns();
        let elapsed = timed(commits, || redb.transition());
        let cpu = report::process_cpu_ns() - cpu_before;
        let after = counters.read();
        let count = commits as f64;
        let per_commit = |index: usize| (after[index] - before[index]) as f64 / count;
        report::DiskPerCommit {
            label: "redb alone, 1 insert".to_string(),
            commits: count,
            batches_per_commit: 1.0,
            syncs: per_commit(0),
            writes: per_commit(1),
            bytes: per_commit(2),
            set_lens: per_commit(3),
            sync_ns: per_commit(4),
            write_ns: per_commit(5),
            wall_ns: elapsed.as_nanos() as f64 / count,
            cpu_ns: cpu / count,
        }
    };
    let (one_rounds, many_rounds) = if is_smoke { (2, 1) } else { (100, 4) };
    report::Disk {
        redb: measure_redb(one_rounds),
        one: measure("disk-one", 1, one_rounds),
        many: measure("disk-many", 256, many_rounds),
    }
}
