//! Crashes that really crash: multi-step runs started through the real `runjournal` binary, and
//! SIGKILL at random moments to a runner, a launcher (`run`, `run --wait`), a concurrently
//! running `runjournal reconcile`, or a step's process. Then `runjournal reconcile` and the
//! checks of issue 4: every run closed, one `Terminal` per run, seqs gap-free, snapshots equal to
//! their replay, status.json and result files equal to a fresh projection, no process of a run
//! left behind, and a truthful reason for every run whose runner was killed mid-way.
//!
//! Seeded: every iteration prints its seed; `RUNJOURNAL_CRASH_SEED=<seed>
//! RUNJOURNAL_CRASH_ITERATIONS=1` replays it (timing still varies, the choices do not).
//! `RUNJOURNAL_CRASH_ITERATIONS` runs longer on demand.

use crate::support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use runjournal::event::{Event, JobState, ProcessIdentity, Repairer};
use runjournal::journal::name_alias;
use runjournal::liveness::{self, Liveness};
use runjournal::process_group;
use runjournal::projection::{self, Problem};
use runjournal::reconcile;
use runjournal::state::StepStatus;
use runjournal::store::StoreOptions;
use runjournal::{Home, Journal, RunId, RunState, Store};

const SEED_ENV: &str = "RUNJOURNAL_CRASH_SEED";
const ITERATIONS_ENV: &str = "RUNJOURNAL_CRASH_ITERATIONS";

/// Kill points each iteration delivers; with the default iterations, at least
/// [`MIN_KILL_POINTS`] per run of the test.
const KILLS_PER_ITERATION: usize = 6;
const DEFAULT_ITERATIONS: usize = 50;
const MIN_KILL_POINTS: usize = 200;

/// Runs in flight at once within an iteration, and at most this many per iteration.
const RUNS_IN_FLIGHT: usize = 3;
const MAX_RUNS_PER_ITERATION: usize = 12;

/// Bounds of the waits: an iteration that needs longer is stuck, and says so.
const KILL_WINDOW: Duration = Duration::from_secs(20);
const SETTLE_DEADLINE: Duration = Duration::from_secs(60);
const RECONCILE_PASSES: usize = 40;

/// The external-job provider: three statuses, with pauses between them.
const PROVIDER: &str = r#"echo '{"state":"queued","id":"job-1"}'
sleep 0.1
echo '{"state":"running","id":"job-1","progress":0.5}'
sleep 0.15
echo '{"state":"succeeded","id":"job-1","message":"done"}'
"#;

/// What a run is made of.
#[derive(Debug, Clone, Copy)]
enum Shape {
    Chain,
    Parallel,
    ExternalJob,
    Grandchildren,
}

impl Shape {
    fn args(self, provider: &Path) -> Vec<String> {
        let steps = |scripts: &[&str]| -> Vec<String> {
            scripts
                .iter()
                .flat_map(|script| ["--step".to_string(), (*script).to_string()])
                .collect()
        };
        match self {
            Shape::Chain => steps(&[
                "sleep 0.1",
                "sleep 0.15",
                "echo chain; sleep 0.1",
                "sleep 0.1",
            ]),
            Shape::Parallel => {
                let mut args = vec![
                    "--mode".to_string(),
                    "parallel".to_string(),
                    "--concurrency".to_string(),
                    "2".to_string(),
                ];
                args.extend(steps(&["sleep 0.2", "sleep 0.25", "sleep 0.2"]));
                args
            }
            Shape::ExternalJob => {
                let mut args = vec![
                    "--external-job".to_string(),
                    format!("sh {}", provider.display()),
                ];
                args.extend(steps(&["sleep 0.1"]));
                args
            }
            // A step whose group outlives its main process for a while.
            Shape::Grandchildren => steps(&["sleep 0.3 & sleep 0.2 & wait", "sleep 0.1"]),
        }
    }
}

/// What the harness kills.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Target {
    Runner,
    Launcher,
    Reconciler,
    StepChild,
}

/// One launched run.
struct Launched {
    name: String,
    launcher: Child,
    is_wait: bool,
    has_exited: bool,
}

/// A runner killed before it recorded an outcome: its run must end failed, naming it.
struct KilledRunner {
    run: RunId,
    pid: u32,
}

/// A step's process killed before its end was recorded.
struct KilledStep {
    run: RunId,
    step: usize,
}

struct Iteration {
    rng: StdRng,
    seed: u64,
    bin: PathBuf,
    home: Home,
    provider: PathBuf,
    journal: Journal,
    launched: Vec<Launched>,
    reconcilers: Vec<Child>,
    kills: BTreeMap<Target, usize>,
    killed_runners: Vec<KilledRunner>,
    killed_steps: Vec<KilledStep>,
    /// What happened, in order: printed when a check fails.
    log: Vec<String>,
}

fn runjournal(bin: &Path, home: &Home) -> Command {
    let mut command = Command::new(bin);
    command
        .env_remove("RUNJOURNAL_HOME")
        .env_remove("RUNJOURNAL_LAYOUT")
        .env("RUNJOURNAL_RESERVE_BYTES", "0")
        .arg("--home")
        .arg(home.root())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    command
}

fn sigkill(pid: u32) -> bool {
    let Ok(raw) = i32::try_from(pid) else {
        return false;
    };
    raw > 1 && kill(Pid::from_raw(raw), Signal::SIGKILL).is_ok()
}

fn is_alive(identity: &ProcessIdentity) -> bool {
    matches!(liveness::check(identity), Ok(Liveness::Alive))
}

/// Waits until a killed process is dead (gone or a zombie); bounded.
fn wait_dead(identity: &ProcessIdentity, what: &str, seed: u64) {
    let started = Instant::now();
    while is_alive(identity) {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "seed {seed}: {what} {} still alive 10 s after SIGKILL",
            identity.pid
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

impl Iteration {
    fn new(seed: u64, bin: &Path, base: &Path) -> (tempfile::TempDir, Iteration) {
        let dir = support::fast_temp_dir();
        let home = Home::at(dir.path().join("home"));
        let provider = base.join("provider.sh");
        // The test's own handle, for looking: it never appends.
        std::fs::create_dir_all(home.root()).expect("home dir");
        let journal = Journal::open(home.journal_path()).expect("the journal opens");
        let iteration = Iteration {
            rng: StdRng::seed_from_u64(seed),
            seed,
            bin: bin.to_path_buf(),
            home,
            provider,
            journal,
            launched: Vec::new(),
            reconcilers: Vec::new(),
            kills: BTreeMap::new(),
            killed_runners: Vec::new(),
            killed_steps: Vec::new(),
            log: Vec::new(),
        };
        (dir, iteration)
    }

    fn total_kills(&self) -> usize {
        self.kills.values().sum()
    }

    fn launch(&mut self) {
        let shape = match self.rng.random_range(0..4) {
            0 => Shape::Chain,
            1 => Shape::Parallel,
            2 => Shape::ExternalJob,
            _ => Shape::Grandchildren,
        };
        let is_wait = self.rng.random_bool(0.5);
        let name = format!("crash-{}-{}", self.seed, self.launched.len());
        let mut command = runjournal(&self.bin, &self.home);
        command.args(["run", "--name", &name]);
        command.args(shape.args(&self.provider));
        command.arg(if is_wait { "--wait" } else { "--json" });
        let launcher = command.spawn().expect("spawn a launcher");
        self.log.push(format!(
            "launched {name} ({shape:?}, {}), launcher pid {}",
            if is_wait { "--wait" } else { "detached" },
            launcher.id()
        ));
        self.launched.push(Launched {
            name,
            launcher,
            is_wait,
            has_exited: false,
        });
    }

    fn run_of(&self, name: &str) -> Option<RunId> {
        self.journal
            .view()
            .expect("a read view")
            .lookup_alias(&name_alias(name))
            .expect("aliases read")
    }

    fn state(&self, run: RunId) -> RunState {
        self.journal
            .view()
            .expect("a read view")
            .snapshot(run)
            .expect("the snapshot reads")
            .expect("the run exists")
    }

    fn runs(&self) -> Vec<RunState> {
        let view = self.journal.view().expect("a read view");
        view.all_runs()
            .expect("runs")
            .into_iter()
            .map(|run| view.snapshot(run).expect("snapshot").expect("exists"))
            .collect()
    }

    /// Runs that are still going: launched but not yet in the journal, or not terminal.
    fn in_flight(&mut self) -> usize {
        let mut count = 0;
        for index in 0..self.launched.len() {
            let name = self.launched[index].name.clone();
            let is_going = match self.run_of(&name) {
                Some(run) => !self.state(run).is_terminal(),
                None => self.launched[index]
                    .launcher
                    .try_wait()
                    .expect("try_wait")
                    .is_none(),
            };
            count += usize::from(is_going);
        }
        count
    }

    /// Tries one kill of `target`; whether a live process was killed.
    fn try_kill(&mut self, target: Target) -> bool {
        match target {
            Target::Runner => {
                let candidates: Vec<(RunId, ProcessIdentity)> = self
                    .runs()
                    .into_iter()
                    .filter_map(|state| {
                        let runner = state.runner.as_ref()?;
                        is_alive(&runner.identity).then(|| (state.run_id, runner.identity.clone()))
                    })
                    .collect();
                if candidates.is_empty() {
                    return false;
                }
                let (run, identity) =
                    candidates[self.rng.random_range(0..candidates.len())].clone();
                if !sigkill(identity.pid) {
                    return false;
                }
                wait_dead(&identity, "runner", self.seed);
                let state = self.state(run);
                self.log.push(format!(
                    "killed runner {} of {run} at head {} ({})",
                    identity.pid, state.head_seq, state.status
                ));
                if !state.is_terminal() {
                    self.killed_runners.push(KilledRunner {
                        run,
                        pid: identity.pid,
                    });
                }
                true
            }
            Target::StepChild => {
                let candidates: Vec<(RunId, usize, ProcessIdentity)> = self
                    .runs()
                    .into_iter()
                    .flat_map(|state| {
                        let run = state.run_id;
                        state
                            .steps
                            .iter()
                            .enumerate()
                            .filter_map(|(index, step)| {
                                let process = step.process.as_ref()?;
                                (step.status == StepStatus::Running && is_alive(process))
                                    .then(|| (run, index, process.clone()))
                            })
                            .collect::<Vec<_>>()
                    })
                    .collect();
                if candidates.is_empty() {
                    return false;
                }
                let (run, step, identity) =
                    candidates[self.rng.random_range(0..candidates.len())].clone();
                if !sigkill(identity.pid) {
                    return false;
                }
                wait_dead(&identity, "step process", self.seed);
                self.log.push(format!(
                    "killed step {step}'s process {} of {run}",
                    identity.pid
                ));
                if self.state(run).steps[step].status == StepStatus::Running {
                    self.killed_steps.push(KilledStep { run, step });
                }
                true
            }
            Target::Launcher => {
                let live: Vec<usize> = (0..self.launched.len())
                    .filter(|&index| {
                        let launched = &mut self.launched[index];
                        !launched.has_exited
                            && launched.launcher.try_wait().expect("try_wait").is_none()
                    })
                    .collect();
                if live.is_empty() {
                    return false;
                }
                let index = live[self.rng.random_range(0..live.len())];
                self.log.push(format!(
                    "killed the launcher of {}",
                    self.launched[index].name
                ));
                let launcher = &mut self.launched[index].launcher;
                let killed = launcher.kill().is_ok();
                let status = launcher.wait().expect("reap the launcher");
                self.launched[index].has_exited = true;
                killed && status.code().is_none()
            }
            Target::Reconciler => {
                let mut reconciler = runjournal(&self.bin, &self.home)
                    .arg("reconcile")
                    .spawn()
                    .expect("spawn a reconciler");
                std::thread::sleep(Duration::from_millis(self.rng.random_range(0..40)));
                let was_running = reconciler.try_wait().expect("try_wait").is_none();
                self.log.push(format!(
                    "killed reconciler {} (running: {was_running})",
                    reconciler.id()
                ));
                let _ = reconciler.kill();
                let status = reconciler.wait().expect("reap the reconciler");
                was_running && status.code().is_none()
            }
        }
    }

    /// Launches runs and kills things at random moments until the iteration's kill points are
    /// delivered.
    fn crash(&mut self) {
        let started = Instant::now();
        while self.total_kills() < KILLS_PER_ITERATION {
            assert!(
                started.elapsed() < KILL_WINDOW,
                "seed {}: only {} kill points within {KILL_WINDOW:?}",
                self.seed,
                self.total_kills()
            );
            if self.in_flight() < RUNS_IN_FLIGHT && self.launched.len() < MAX_RUNS_PER_ITERATION {
                self.launch();
            }
            // Now and then a reconciler that is left to finish, racing the runners.
            if self.rng.random_bool(0.1) {
                let reconciler = runjournal(&self.bin, &self.home)
                    .arg("reconcile")
                    .spawn()
                    .expect("spawn a reconciler");
                self.reconcilers.push(reconciler);
            }
            std::thread::sleep(Duration::from_millis(self.rng.random_range(10..150)));
            let target = match self.rng.random_range(0..10) {
                0..=2 => Target::Runner,
                3..=4 => Target::Launcher,
                5..=6 => Target::Reconciler,
                _ => Target::StepChild,
            };
            if self.try_kill(target) {
                *self.kills.entry(target).or_default() += 1;
            }
        }
    }

    /// Lets whatever was not killed finish: launchers exit, live runners end their runs.
    fn settle(&mut self) {
        let deadline = Instant::now() + SETTLE_DEADLINE;
        for launched in &mut self.launched {
            while !launched.has_exited {
                if launched.launcher.try_wait().expect("try_wait").is_some() {
                    launched.has_exited = true;
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "seed {}: launcher of {} (wait: {}) did not exit",
                    self.seed,
                    launched.name,
                    launched.is_wait
                );
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        for reconciler in &mut self.reconcilers {
            let status = reconciler.wait().expect("reap a reconciler");
            let _ = status;
        }
        loop {
            let running: Vec<RunId> = self
                .runs()
                .into_iter()
                .filter(|state| {
                    state
                        .runner
                        .as_ref()
                        .is_some_and(|runner| is_alive(&runner.identity))
                })
                .map(|state| state.run_id)
                .collect();
            if running.is_empty() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "seed {}: runners of {running:?} still alive after {SETTLE_DEADLINE:?}",
                self.seed
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `runjournal reconcile` until every run is closed (bounded). A run whose launcher was
    /// killed before it started a runner is failed only after the CLI's 10 s start grace; the
    /// test ends that grace early through the library's same pass.
    fn reconcile(&self) {
        for pass in 0..RECONCILE_PASSES {
            let status = runjournal(&self.bin, &self.home)
                .arg("reconcile")
                .status()
                .expect("run runjournal reconcile");
            let open: Vec<RunState> = self
                .runs()
                .into_iter()
                .filter(|state| !state.is_closed())
                .collect();
            if open.is_empty() {
                assert!(
                    status.success(),
                    "seed {}: the last reconcile pass reported errors",
                    self.seed
                );
                return;
            }
            let is_only_unstarted = open
                .iter()
                .all(|state| state.runner.is_none() && !state.is_terminal());
            if is_only_unstarted && pass > 0 {
                let store = Store::open_with(self.home.clone(), StoreOptions::default())
                    .expect("the home opens");
                let options = reconcile::Options {
                    start_grace_ms: 0,
                    ..reconcile::Options::default()
                };
                reconcile::reconcile(&store, &options).expect("a reconcile pass");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let open: Vec<(RunId, String)> = self
            .runs()
            .into_iter()
            .filter(|state| !state.is_closed())
            .map(|state| (state.run_id, state.status.to_string()))
            .collect();
        panic!(
            "seed {}: runs still not closed after {RECONCILE_PASSES} reconcile passes: {open:?}",
            self.seed
        );
    }

    /// The checks of issue 4 on the reconciled home.
    fn check(&self) {
        let view = self.journal.view().expect("a read view");
        let runs = support::check_journal(&view, Some(&self.home));
        assert_eq!(
            view.active_runs().expect("active runs"),
            Vec::<RunId>::new(),
            "seed {}: no run is left active",
            self.seed
        );
        for (state, records) in &runs {
            let run = state.run_id;
            assert!(
                state.is_closed(),
                "seed {}: run {run} is closed ({})",
                self.seed,
                state.status
            );
            let terminals: Vec<&Event> = records
                .iter()
                .map(|record| &record.event)
                .filter(|event| matches!(event, Event::Terminal { .. }))
                .collect();
            assert_eq!(
                terminals.len(),
                1,
                "seed {}: run {run} has exactly one Terminal (never both complete and failed)",
                self.seed
            );
            let differences: Vec<_> =
                projection::check_plan(&projection::plan(&self.home, state, records))
                    .into_iter()
                    .filter(|difference| difference.problem != Problem::Consumed)
                    .collect();
            assert!(
                differences.is_empty(),
                "seed {}: run {run}: projections equal a fresh projection: {differences:#?}",
                self.seed
            );
            // No process of the run is left: each step's process and its group are gone.
            for record in records {
                let Event::StepRunning {
                    step,
                    process: Some(process),
                } = &record.event
                else {
                    continue;
                };
                assert!(
                    !is_alive(process),
                    "seed {}: run {run} ({}): step {step}'s process {} is still alive",
                    self.seed,
                    state.status,
                    process.pid
                );
                assert!(
                    process_group::is_empty(process).expect("look at the process group"),
                    "seed {}: run {run} ({}): step {step}'s process group {} still has members",
                    self.seed,
                    state.status,
                    process.pid
                );
            }
        }
        // Truthful reasons.
        for killed in &self.killed_runners {
            let state = self.state(killed.run);
            let terminal = state.terminal.as_ref().expect("closed runs are terminal");
            let error = terminal.error.as_deref().unwrap_or_default();
            assert!(
                terminal.repaired_by == Some(Repairer::Reconciler)
                    && error.contains(&format!("runner {}", killed.pid)),
                "seed {}: run {} whose runner {} was SIGKILLed mid-way ends with a reason naming it: {terminal:?}",
                self.seed,
                killed.run,
                killed.pid
            );
        }
        for killed in &self.killed_steps {
            let state = self.state(killed.run);
            let step = &state.steps[killed.step];
            // It may have finished on its own just then (exit 0), or, for an external job, its
            // provider may have reported success before it was killed: the job's outcome is
            // what the provider reported.
            let has_succeeded = step.exit_code == Some(0)
                || step
                    .job
                    .as_ref()
                    .is_some_and(|job| job.state == JobState::Succeeded);
            assert!(
                step.status == StepStatus::Failed
                    || (step.status == StepStatus::Complete && has_succeeded),
                "seed {}: run {} step {} was SIGKILLed while running and ends failed: {step:?}",
                self.seed,
                killed.run,
                killed.step
            );
        }
    }
}

#[test]
fn sigkill_at_random_moments_leaves_every_run_closed_and_truthful() {
    let iterations = std::env::var(ITERATIONS_ENV)
        .ok()
        .map(|text| {
            text.parse::<usize>()
                .unwrap_or_else(|_| panic!("{ITERATIONS_ENV}={text:?} is not a count"))
        })
        .unwrap_or(DEFAULT_ITERATIONS);
    let base_seed = std::env::var(SEED_ENV)
        .ok()
        .map(|text| {
            text.parse::<u64>()
                .unwrap_or_else(|_| panic!("{SEED_ENV}={text:?} is not a number"))
        })
        .unwrap_or_else(rand::random);
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_runjournal"));
    let base = tempfile::tempdir().expect("temp dir");
    std::fs::write(base.path().join("provider.sh"), PROVIDER).expect("write the provider");

    let started = Instant::now();
    let mut totals: BTreeMap<Target, usize> = BTreeMap::new();
    let mut runs = 0;
    for index in 0..iterations {
        let seed = base_seed.wrapping_add(index as u64);
        eprintln!(
            "crash_kill iteration {}/{iterations}: seed {seed} (replay: {SEED_ENV}={seed} {ITERATIONS_ENV}=1)",
            index + 1
        );
        let (_dir, mut iteration) = Iteration::new(seed, &bin, base.path());
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            iteration.crash();
            iteration.settle();
            iteration.reconcile();
            iteration.check();
        }));
        if let Err(panic) = outcome {
            eprintln!("seed {seed}: what happened:");
            for line in &iteration.log {
                eprintln!("  {line}");
            }
            for state in iteration.runs() {
                let records = iteration
                    .journal
                    .view()
                    .expect("view")
                    .records(state.run_id)
                    .expect("records");
                let events: Vec<&str> = records.iter().map(|record| record.event.name()).collect();
                eprintln!("  run {} ({}): {events:?}", state.run_id, state.status);
            }
            std::panic::resume_unwind(panic);
        }
        runs += iteration.launched.len();
        for (target, count) in &iteration.kills {
            *totals.entry(*target).or_default() += count;
        }
    }
    let total: usize = totals.values().sum();
    eprintln!(
        "crash_kill: {total} kill points over {iterations} iterations and {runs} runs ({totals:?}) in {:?}",
        started.elapsed()
    );
    assert!(
        total >= iterations * KILLS_PER_ITERATION,
        "every iteration delivered its kill points"
    );
    if iterations >= DEFAULT_ITERATIONS {
        assert!(
            total >= MIN_KILL_POINTS,
            "at least {MIN_KILL_POINTS} kill points ({total})"
        );
    }
}
