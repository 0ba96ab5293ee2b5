//! What users feel: a chatty external job, a launch, and the CPU one projected
//! transition costs when many appenders share a process. Each is measured beside its
//! baselines in the same rounds, as the rest of the suite is.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::rc::Rc;
use std::sync::Barrier;
use std::time::{Duration, Instant, SystemTime};

use runjournal::event::{Event, RunId, TerminalState};
use runjournal::journal::Condition;
use runjournal::store::StoreOptions;
use runjournal::{Home, Journal, Store, launch};

use crate::report::Measured;
use crate::{Way, baselines, fixture, timed};

/// How big the workloads of this module are.
#[derive(Debug, Clone, Copy)]
pub struct Sizes {
    /// Updates a chatty run holds before its "last 1,000" are timed.
    pub chatty_prefill: usize,
    /// Rounds of the chatty run, and updates of each run per round.
    pub chatty_rounds: usize,
    pub chatty_per_round: usize,
    /// Appenders sharing one store for the CPU of a projected transition.
    pub projected_appenders: usize,
    /// Updates per run and round: of the one appender, and of each of the many.
    pub projected_one_updates: usize,
    pub projected_many_updates: usize,
}

impl Sizes {
    /// The sizes the targets are stated for: the last 1,000 of 10,000 updates against the first 1,000;
    /// 256 appenders.
    pub const REPORT: Sizes = Sizes {
        chatty_prefill: 9_000,
        chatty_rounds: 10,
        chatty_per_round: 100,
        projected_appenders: 256,
        projected_one_updates: 100,
        projected_many_updates: 20,
    };

    /// Each workload once, quickly (`--smoke`): the report's code runs, its figures mean little.
    pub const SMOKE: Sizes = Sizes {
        chatty_prefill: 90,
        chatty_rounds: 1,
        chatty_per_round: 10,
        projected_appenders: 256,
        projected_one_updates: 2,
        projected_many_updates: 1,
    };
}

/// Every workload of this module whose group `is_reported` (`chatty`, `launch`, `projected`),
/// in the report's rounds (`budget` turns a per-workload time of a normal report into the
/// round's budget).
pub fn measure(
    scratch: &Path,
    sizes: Sizes,
    measured: &mut Measured,
    budget: impl Fn(u64) -> Duration,
    is_reported: impl Fn(&str) -> bool,
) {
    if is_reported("chatty") {
        eprintln!("a chatty run...");
        chatty(scratch, sizes, measured);
    }
    if is_reported("launch") {
        eprintln!("launches...");
        let samples = Samples::default();
        // A smoke run has no calibrating round; a report's first call of each way is one.
        let calibrating = !measured.is_smoke;
        measured.run_rounds(
            "launch",
            launch_ways(scratch, &samples, calibrating),
            budget(500),
        );
        for (id, times) in samples.take() {
            measured.set_samples("launch", id, times);
        }
    }
    if is_reported("projected") {
        eprintln!("projected transitions...");
        projected(scratch, sizes, measured.rounds_kept(), measured);
    }
}

pub(crate) fn open_store(dir: &Path) -> Store {
    std::fs::create_dir_all(dir).expect("a home directory");
    Store::open_with(Home::at(dir), StoreOptions::default()).expect("the home opens")
}

/// A run whose external-job step is running, owned by this process, projected.
pub(crate) fn running_run(store: &Store) -> RunId {
    running_runs(store, 1)[0]
}

/// `count` such runs, committed together.
fn running_runs(store: &Store, count: usize) -> Vec<RunId> {
    let me = runjournal::liveness::current().expect("this process has an identity");
    let runs: Vec<RunId> = (0..count).map(|_| RunId::generate()).collect();
    let batches = runs.iter().map(|&run| {
        (
            run,
            vec![
                fixture::created(fixture::job_spec()),
                fixture::runner_started(me.clone()),
                fixture::step_running(None),
            ],
            Condition::expect_head(0),
        )
    });
    for result in store.append_all(batches) {
        result.expect("a running run is a legal batch");
    }
    runs
}

fn end_run(store: &Store, run: RunId) {
    store
        .append(
            run,
            vec![Event::Terminal {
                state: TerminalState::Stopped,
                error: None,
                summary: "the benchmark is over".to_string(),
                exit_code: 143,
                repaired_by: None,
            }],
            Condition::expect_not_terminal(),
        )
        .expect("the run ends");
}

/// The chatty run: one external job reporting progress as fast as it can, through
/// `Store::append` (a durable commit and the projection after it), while a follower reads the
/// run as `run --wait` does. Two runs advance in the same rounds, one update each in turn: a
/// fresh one (its first updates) and one already holding `chatty_prefill` updates (its last
/// ones), so both see the same moments of a shared machine. Recorded in group `chatty`, ids
/// `first` and `last`: the time of one update, per round.
pub fn chatty(scratch: &Path, sizes: Sizes, measured: &mut Measured) {
    let store = open_store(&scratch.join("chatty"));
    let first = running_run(&store);
    let last = running_run(&store);
    // The long run's history, committed in big batches and projected once: only the updates
    // timed below go one by one.
    const PREFILL_BATCH: usize = 100;
    let mut left = sizes.chatty_prefill;
    let mut progress = 0u32;
    while left > 0 {
        let count = left.min(PREFILL_BATCH);
        let batch: Vec<Event> = (0..count)
            .map(|_| {
                progress += 1;
                fixture::job_update(progress)
            })
            .collect();
        store
            .journal()
            .append(last, batch, Condition::none())
            .expect("the prefill lands");
        left -= count;
    }
    store.project(last).expect("the long run is projected");
    std::thread::scope(|scope| {
        let store = &store;
        let followers: Vec<_> = [first, last]
            .into_iter()
            .map(|run| {
                scope.spawn(move || {
                    let mut seen = 0usize;
                    launch::follow(store, run, 0, None, None, |_| {
                        seen += 1;
                        std::ops::ControlFlow::Continue(())
                    })
                    .expect("the follower follows");
                    seen
                })
            })
            .collect();
        for _ in 0..sizes.chatty_rounds {
            let (mut first_ns, mut last_ns) = (0f64, 0f64);
            for _ in 0..sizes.chatty_per_round {
                progress += 1;
                for (run, total) in [(first, &mut first_ns), (last, &mut last_ns)] {
                    let started = Instant::now();
                    store
                        .append(run, vec![fixture::job_update(progress)], Condition::none())
                        .expect("an update is acknowledged");
                    *total += started.elapsed().as_nanos() as f64;
                }
            }
            let per_update = sizes.chatty_per_round as f64;
            measured.push("chatty", "first", first_ns / per_update, None);
            measured.push("chatty", "last", last_ns / per_update, None);
        }
        end_run(store, first);
        end_run(store, last);
        for follower in followers {
            let seen = follower.join().expect("a follower does not panic");
            assert!(seen > sizes.chatty_rounds * sizes.chatty_per_round);
        }
    });
}

/// The `runjournal` binary of this build.
pub(crate) fn binary() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_runjournal"));
    command
        .env_remove("RUNJOURNAL_HOME")
        .env_remove("RUNJOURNAL_LAYOUT")
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    command
}

fn succeed(command: &mut Command) {
    let output = command
        .stderr(Stdio::piped())
        .output()
        .expect("runjournal runs");
    assert!(
        output.status.success(),
        "runjournal failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Waits (bounded) until the runner of the run `run --json` printed has exited.
pub(crate) fn wait_runner_gone(home: &Path, run_json: &[u8]) {
    let printed: serde_json::Value =
        serde_json::from_slice(run_json).expect("run --json prints JSON");
    let run: RunId = printed["runId"]
        .as_str()
        .and_then(|text| text.parse().ok())
        .expect("a run id");
    let reader = runjournal::JournalReader::open(Home::at(home).journal_path()).expect("a reader");
    for _ in 0..2_000 {
        let state = reader
            .view()
            .and_then(|view| view.snapshot(run))
            .expect("the run reads")
            .expect("the run exists");
        let is_gone = state.runner.as_ref().is_none_or(|runner| {
            matches!(
                runjournal::liveness::check(&runner.identity),
                Ok(runjournal::liveness::Liveness::Dead)
            )
        });
        if is_gone {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    panic!("the runner of run {run} did not exit");
}

/// The ids of the launch group, in the order [`launch_ways`] returns them.
pub const LAUNCH_IDS: [&str; 9] = [
    "process-start",
    "durable-commit",
    "store-open-close",
    "status-rename",
    "run",
    "run-wait",
    "run-clear-env",
    "run-large-env",
    "wait-tail",
];

/// The time of every iteration of the ways that keep them (`run`, `wait-tail` and what their
/// floors are made of, `process-start` and `durable-commit`), by id, the calibrating round
/// left out.
#[derive(Default, Clone)]
pub struct Samples(Rc<RefCell<BTreeMap<&'static str, Vec<Duration>>>>);

impl Samples {
    /// A sampler for `id`: it drops the first call's times when `calibrating` (that call only
    /// sets the round's iteration count).
    fn of(&self, id: &'static str, calibrating: bool) -> Sampler {
        Sampler {
            samples: self.clone(),
            id,
            skip_call: calibrating,
        }
    }

    fn take(&self) -> BTreeMap<&'static str, Vec<Duration>> {
        std::mem::take(&mut self.0.borrow_mut())
    }
}

struct Sampler {
    samples: Samples,
    id: &'static str,
    skip_call: bool,
}

impl Sampler {
    /// `iters` iterations of `once`, which returns the time its iteration counts; their sum.
    fn each(&mut self, iters: u64, mut once: impl FnMut() -> Duration) -> Duration {
        let mut times = Vec::with_capacity(iters as usize);
        for _ in 0..iters {
            times.push(once());
        }
        if !std::mem::take(&mut self.skip_call) {
            let mut samples = self.samples.0.borrow_mut();
            samples.entry(self.id).or_default().extend(&times);
        }
        times.iter().sum()
    }
}

/// The argument that makes this benchmark binary a step of `wait-tail`: it writes the time
/// (Unix ns) to the file after it, then exits at once.
const STAMP_EXIT_ARG: &str = "--stamp-exit";

/// If this process was started as the step of `wait-tail`, writes the time it exits and
/// returns `true`.
pub fn stamp_exit_if_asked() -> bool {
    let mut args = std::env::args_os().skip(1);
    if args.next().as_deref() != Some(std::ffi::OsStr::new(STAMP_EXIT_ARG)) {
        return false;
    }
    let path = PathBuf::from(args.next().expect("--stamp-exit takes a path"));
    let now = unix_ns(SystemTime::now());
    std::fs::write(path, now.to_string()).expect("the stamp is written");
    true
}

fn unix_ns(time: SystemTime) -> u128 {
    time.duration_since(SystemTime::UNIX_EPOCH)
        .expect("the clock is after 1970")
        .as_nanos()
}

/// The environment a launch of `run-large-env` adds to this process's: 64 variables of 2 KiB,
/// near the bound of what a run keeps (a CI job's, a virtualenv's with long paths).
pub fn large_env() -> Vec<(String, String)> {
    (0..64)
        .map(|index| (format!("BENCH_LARGE_{index}"), "v".repeat(2048)))
        .collect()
}

/// One iteration = one launch (`runjournal run -- true`, `run --wait -- true`) or one of what
/// a launch is made of: a process start (`runjournal --version`), a durable commit
/// (`Store::append` of one update, with its projection, in the same home), opening and closing
/// the home's store while another writer holds it open (what every process that writes pays:
/// redb's multi-writer open and close each write its header and sync it), an fsync-less
/// status.json rewrite (the pi-subagents and pueue way of recording state). And the launch's
/// kept environment: `run` keeps this process's; `run --clear-env` keeps none (what a launch
/// cost before runs kept one, but for an empty row); `run` with [`large_env`] added keeps one
/// near the bound. And the end of `run --wait`: from its step's exit (the step, this binary
/// with [`STAMP_EXIT_ARG`], writes the time just before it exits) to `run --wait`'s exit, by
/// the wall clock both processes read. The ways of [`LAUNCH_SAMPLED`] keep every iteration's
/// time in `samples`.
pub fn launch_ways(scratch: &Path, samples: &Samples, calibrating: bool) -> Vec<Way<'static>> {
    let dir = scratch.join("launch");
    let store = open_store(&dir);
    let run = running_run(&store);
    let home: PathBuf = dir.clone();
    let open_close_dir = dir.clone();
    let status = std::fs::read(store.home().status_path(run)).expect("a status.json");
    let mut rewrite = baselines::RewriteStatus::new(&dir, &status, false);
    let (mut run, mut progress) = (run, 0u32);
    let tail_home = home.clone();
    let mut tail_sampler = samples.of("wait-tail", calibrating);
    let mut start_sampler = samples.of("process-start", calibrating);
    let mut commit_sampler = samples.of("durable-commit", calibrating);
    let samples = samples.clone();
    let launch = move |wait: bool,
                       extra: &[&str],
                       env: Vec<(String, String)>|
          -> Box<dyn FnMut(u64) -> Duration> {
        let home = home.clone();
        let extra: Vec<String> = extra.iter().map(|arg| arg.to_string()).collect();
        // Only the plain launch is sampled.
        let mut sampler =
            (!wait && extra.is_empty() && env.is_empty()).then(|| samples.of("run", calibrating));
        Box::new(move |iters| {
            let mut elapsed = Duration::ZERO;
            let mut times = Vec::new();
            for _ in 0..iters {
                let mut command = binary();
                command
                    .arg("--home")
                    .arg(&home)
                    .args(["run", "--json"])
                    .args(&extra)
                    .envs(env.iter().map(|(name, value)| (name, value)));
                if wait {
                    command.arg("--wait");
                }
                let started = Instant::now();
                let output = command
                    .args(["--", "true"])
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .output()
                    .expect("runjournal runs");
                let took = started.elapsed();
                elapsed += took;
                times.push(took);
                assert!(
                    output.status.success(),
                    "runjournal run failed: {}",
                    String::from_utf8_lossy(&output.stderr)
                );
                // Outside the time: a runner left behind would share the disk with what is
                // measured next.
                wait_runner_gone(&home, &output.stdout);
            }
            if let Some(sampler) = &mut sampler {
                let mut times = times.into_iter();
                sampler.each(iters, || times.next().unwrap_or_default());
            }
            elapsed
        })
    };
    let stamp = dir.join("step-exit-stamp");
    let wait_tail = move |iters| {
        tail_sampler.each(iters, || {
            let _ = std::fs::remove_file(&stamp);
            let output = binary()
                .arg("--home")
                .arg(&tail_home)
                .args(["run", "--json", "--wait", "--"])
                .arg(std::env::current_exe().expect("this benchmark's path"))
                .arg(STAMP_EXIT_ARG)
                .arg(&stamp)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .output()
                .expect("runjournal runs");
            let exited = unix_ns(SystemTime::now());
            assert!(
                output.status.success(),
                "runjournal run --wait failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
            let step_exit: u128 = std::fs::read_to_string(&stamp)
                .expect("the step wrote its stamp")
                .trim()
                .parse()
                .expect("a stamp is a number");
            let tail = Duration::from_nanos(exited.saturating_sub(step_exit) as u64);
            wait_runner_gone(&tail_home, &output.stdout);
            tail
        })
    };
    vec![
        (
            LAUNCH_IDS[0].into(),
            Box::new(move |iters| {
                start_sampler.each(iters, || {
                    let started = Instant::now();
                    succeed(binary().arg("--version"));
                    started.elapsed()
                })
            }),
        ),
        (
            LAUNCH_IDS[1].into(),
            Box::new(move |iters| {
                commit_sampler.each(iters, || {
                    let started = Instant::now();
                    // Runs of at most 50 updates, as the launches beside it make; a new run's
                    // creation is a durable commit as well.
                    progress += 1;
                    if progress % 50 == 0 {
                        run = running_run(&store);
                    } else {
                        store
                            .append(run, vec![fixture::job_update(progress)], Condition::none())
                            .expect("an update is acknowledged");
                    }
                    started.elapsed()
                })
            }),
        ),
        (
            LAUNCH_IDS[2].into(),
            Box::new(move |iters| timed(iters, || drop(open_store(&open_close_dir)))),
        ),
        (
            LAUNCH_IDS[3].into(),
            Box::new(move |iters| timed(iters, || rewrite.transition())),
        ),
        (LAUNCH_IDS[4].into(), launch(false, &[], Vec::new())),
        (LAUNCH_IDS[5].into(), launch(true, &[], Vec::new())),
        (
            LAUNCH_IDS[6].into(),
            launch(false, &["--clear-env"], Vec::new()),
        ),
        (LAUNCH_IDS[7].into(), launch(false, &[], large_env())),
        (LAUNCH_IDS[8].into(), Box::new(wait_tail)),
    ]
}

/// Makes `per_run` transitions on each run, one thread per run, all started together, each
/// made by `transition(run, progress)`; returns the time they took.
fn concurrent(
    runs: &[RunId],
    per_run: usize,
    transition: &(dyn Fn(RunId, u32) + Sync),
) -> Duration {
    let barrier = Barrier::new(runs.len() + 1);
    std::thread::scope(|scope| {
        let handles: Vec<_> = runs
            .iter()
            .map(|&run| {
                let barrier = &barrier;
                scope.spawn(move || {
                    barrier.wait();
                    for progress in 0..per_run {
                        transition(run, progress as u32);
                    }
                })
            })
            .collect();
        barrier.wait();
        let started = Instant::now();
        for handle in handles {
            handle.join().expect("an appender does not panic");
        }
        started.elapsed()
    })
}

/// One way of the projected group: where its transitions go.
enum Target {
    Store(Store),
    Journal(Journal),
}

impl Target {
    fn append(&self, run: RunId, events: Vec<Event>) {
        let appended = match self {
            Target::Store(store) => store.append(run, events, Condition::none()),
            Target::Journal(journal) => journal.append(run, events, Condition::none()),
        };
        appended.expect("an update is acknowledged");
    }

    /// Fresh running runs, made outside the measured time.
    fn fresh_runs(&self, count: usize) -> Vec<RunId> {
        match self {
            Target::Store(store) => running_runs(store, count),
            Target::Journal(journal) => crate::running_runs(journal, count),
        }
    }

    /// Waits until every projection this process owes is written (coalesced status files
    /// included), so that their CPU is counted with the transitions that caused them.
    fn settle(&self) {
        if let Target::Store(store) = self {
            let left = store.flush_projections(Duration::from_secs(10));
            assert_eq!(left, 0, "every projection is written");
        }
    }
}

/// The ids of the projected group.
pub const PROJECTED_IDS: [&str; 3] = ["store-1", "store-many", "journal-many"];

/// CPU per projected transition: `Store::append` of one update (its commit and the projection
/// after it, coalesced status writes included) with one appender and with many sharing the
/// store, each on its own run; and the same many appenders on the journal alone. Each round
/// starts fresh runs (outside the measured time), so the figures are those of runs of a
/// few dozen records, whatever the number of rounds. Recorded in group `projected`: time and
/// CPU (every thread of the process) per transition.
pub fn projected(scratch: &Path, sizes: Sizes, rounds: usize, measured: &mut Measured) {
    let dir = scratch.join("projected");
    let journal_dir = dir.join("journal");
    std::fs::create_dir_all(&journal_dir).expect("a journal directory");
    let ways = [
        (
            PROJECTED_IDS[0],
            Target::Store(open_store(&dir.join("one"))),
            1,
            sizes.projected_one_updates,
        ),
        (
            PROJECTED_IDS[1],
            Target::Store(open_store(&dir.join("many"))),
            sizes.projected_appenders,
            sizes.projected_many_updates,
        ),
        (
            PROJECTED_IDS[2],
            Target::Journal(Journal::open(journal_dir.join("journal.redb")).expect("a journal")),
            sizes.projected_appenders,
            sizes.projected_many_updates,
        ),
    ];
    for _ in 0..rounds {
        for (id, target, appenders, per_run) in &ways {
            let runs = target.fresh_runs(*appenders);
            target.settle();
            let cpu_before = crate::report::process_cpu_ns();
            let elapsed = concurrent(&runs, *per_run, &|run, progress| {
                target.append(run, vec![fixture::job_update(progress)])
            });
            target.settle();
            let cpu = crate::report::process_cpu_ns() - cpu_before;
            let transitions = (runs.len() * per_run) as f64;
            measured.push(
                "projected",
                id,
                elapsed.as_nanos() as f64 / transitions,
                Some(cpu / transitions),
            );
        }
    }
}
