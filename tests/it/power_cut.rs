//! Power cuts of the real binaries: a workload of `runjournal` processes on a home on the lazy
//! disk (`lazy-disk`, a FUSE file system that forgets every write and directory change no fsync
//! made durable), all of them in a freezer cgroup. At a random moment, or right after the k-th
//! fsync of `journal.redb`, every process is frozen at once, the disk is cut (optionally
//! tearing the last unsynced write at a sector), the processes are SIGKILLed and thawed, and the
//! disk is remounted from what was durable. Then:
//!
//! * every acknowledged transition is there: a launch that printed its run id (the run, with
//!   its runner started), each record a `run --wait` printed (`#N ...`: at least N records,
//!   and the end it printed), a `job update` and a `stop` that exited 0 (their records); a run
//!   later pruned has its tombstone instead;
//! * `runjournal reconcile` exits 0 and leaves no run running;
//! * every run's records are gap-free with at most one `Terminal` and a snapshot equal to their
//!   replay, and `verify` (what `journal-tools inspect verify` runs) finds nothing, the runs'
//!   projections included;
//! * where PostgreSQL is installed, a shipper followed the journal until the cut; `ship --once`
//!   after it leaves the server with every record of the journal once, with the same content,
//!   shipped through the journal's head;
//! * every control file a host made durable before the cut (pi-subagents' stop, interrupt and
//!   steer requests, and files that are not JSON, written into live runs' inboxes as a careful
//!   host writes them: [`write_as_careful_host`]) is still in place, or journaled exactly once
//!   (a steer delivered at most once to each step), or refused into `control/refused/` with
//!   its `ControlRefused` record; each message `steer` acknowledged is journaled once;
//! * every run kept its launcher's environment, and every hook of every run that ended is
//!   delivered at least once (the claims of the processes the cut killed taken over by the
//!   deliverers reconcile passes start), in the run's kept environment;
//! * in a home of the pi-subagents layout (every other disk's), pi-subagents' own readers
//!   (`pi_subagents_compat`'s, installed once per test process, one `node` per cut) read every
//!   run of the journal as the journal has it, find its result, list it, and repair nothing.
//!
//! The workload mixes chains (whose steps take the messages steered to them), parallel runs,
//! external jobs fed by `job update`, runs with a kept variable and a completion hook, `stop`,
//! `steer`, a host's control files, several
//! launchers at once (so commits are shared through a commit leader), concurrent reconcilers,
//! `prune` and the shipper. Several cuts fall on one disk in turn, so each workload also starts
//! on what the last cut left (a stale leader socket, a half-made run directory). After a disk's
//! last cut, its home's journal is lost (removed, cut short or zero-filled) and `recover` (what
//! `journal-tools recover --from-projections` runs) rebuilds it from the runs' `events.jsonl`
//! while the disk is cut once more at a random moment: a `recover` that returned is durable,
//! one cut short runs again, and either way every run comes back with every record as it was.
//!
//! Root and `/dev/fuse` are needed (a FUSE mount, a cgroup); without them the test skips,
//! saying so, and where every test must run (CI, `runjournal::testkit::skip`) it fails instead. `RUNJOURNAL_POWER_CUTS`
//! sets the number of cuts (20 by default); `RUNJOURNAL_POWER_SEED` the first seed (each cut
//! prints its own; `RUNJOURNAL_POWER_SEED=<seed> RUNJOURNAL_POWER_CUTS=1` replays its choices,
//! not its timing).

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use lazy_disk::{LazyDisk, Tear};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use runjournal::event::{ControlAction, Event, Record};
use runjournal::home::Layout;
use runjournal::journal::JournalReader;
use runjournal::journal::name_alias;
use runjournal::reconcile;
use runjournal::store::StoreOptions;
use runjournal::{Home, Journal, RunId, Store};

use crate::pi_subagents_compat::{
    changed_files, files_under, pi_subagents, read_with_pi_subagents,
};
use crate::support;
use runjournal::testkit::pg_cluster::PgCluster;

const CUTS_ENV: &str = "RUNJOURNAL_POWER_CUTS";
const SEED_ENV: &str = "RUNJOURNAL_POWER_SEED";
const DEFAULT_CUTS: usize = 20;
/// Cuts that fall on one disk in turn before a fresh one is mounted.
const CUTS_PER_DISK: usize = 5;
const FREEZER: &str = "/sys/fs/cgroup/freezer";
/// The session id runs in the pi-subagents layout are launched with.
const PI_SESSION: &str = "power-cut-session";
/// Where the workload's completion hooks write (outside the lazy disk).
const HOOK_LOG: &str = "hooks.log";

/// The longest a workload runs before its cut: a count of rounds, not a time.
const MAX_ROUNDS: usize = 150;
/// Bounds of the harness's own waits (freezing, emptying the cgroup): past them it is stuck.
const SETTLE_BOUND: Duration = Duration::from_secs(30);

/// A cgroup (v1 freezer) holding every process of the workload.
struct Freezer {
    dir: PathBuf,
}

impl Freezer {
    fn new(name: &str) -> Freezer {
        let dir = Path::new(FREEZER).join(name);
        std::fs::create_dir_all(&dir).expect("a freezer cgroup");
        Freezer { dir }
    }

    fn procs(&self) -> Vec<i32> {
        std::fs::read_to_string(self.dir.join("cgroup.procs"))
            .expect("the cgroup's processes")
            .lines()
            .filter_map(|line| line.trim().parse().ok())
            .collect()
    }

    fn set_state(&self, state: &str) {
        std::fs::write(self.dir.join("freezer.state"), state).expect("the freezer's state");
    }

    fn state(&self) -> String {
        std::fs::read_to_string(self.dir.join("freezer.state"))
            .expect("the freezer's state")
            .trim()
            .to_string()
    }

    /// Freezes every process at once, and waits until they all are. Returns `None` once they
    /// are, or, when some still are not after the bound, what each process is doing. The
    /// legacy freezer can stay `FREEZING` for good: a shell that `vfork`ed waits in the kernel
    /// for its child to exec, the freezer froze the child right after the fork, and it never
    /// counts the waiting parent as frozen (twice in a soak of 500 cuts on Linux 6.18, every
    /// other process frozen each time; probably also the undiagnosed stall that ended an
    /// earlier soak). The cut may go ahead then: the disk's cut is one instant in the order of
    /// its requests whoever still runs, nothing a process does after it reaches what the disk
    /// keeps, what a process prints after it is checked like anything else it printed, and
    /// SIGKILL ends the parent's wait.
    fn freeze(&self) -> Option<Vec<String>> {
        self.set_state("FROZEN");
        let started = Instant::now();
        while self.state() != "FROZEN" {
            if started.elapsed() > SETTLE_BOUND {
                return Some(self.procs().into_iter().map(doing).collect());
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        None
    }

    /// SIGKILLs every process, thaws them so they die, and waits until none is left.
    fn kill_all(&self) {
        for pid in self.procs() {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        self.set_state("THAWED");
        let started = Instant::now();
        loop {
            let left = self.procs();
            if left.is_empty() {
                break;
            }
            assert!(
                started.elapsed() < SETTLE_BOUND,
                "processes outlive SIGKILL: {:#?}",
                left.iter().map(|pid| doing(*pid)).collect::<Vec<_>>()
            );
            // A process forked while the others were being killed.
            for pid in left {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// What process `pid` is doing: its state, where it sleeps in the kernel, its kernel stack's
/// functions and its command line. (A frozen task shows as asleep where it slept: nothing
/// per process tells it from one the freezer is still waiting for.)
fn doing(pid: i32) -> String {
    let proc_file = |name: &str| std::fs::read_to_string(format!("/proc/{pid}/{name}")).ok();
    let state = u32::try_from(pid)
        .ok()
        .and_then(process_state)
        .unwrap_or('?');
    let stack_text = proc_file("stack").unwrap_or_default();
    let stack: Vec<&str> = stack_text
        .lines()
        .filter_map(|line| line.split_whitespace().nth(1))
        .collect();
    format!(
        "pid {pid} {state} wchan {} [{}] stack {}",
        proc_file("wchan").unwrap_or_default(),
        proc_file("cmdline")
            .unwrap_or_default()
            .replace('\0', " ")
            .trim(),
        stack.join(" < ")
    )
}

impl Drop for Freezer {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // Leave nothing frozen or running behind a failed test.
            for pid in self.procs() {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
            self.set_state("THAWED");
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Shape {
    Chain,
    Parallel,
    ExternalJob,
}

/// A launch, and where its output goes (outside the lazy disk).
struct Launch {
    name: String,
    shape: Shape,
    is_wait: bool,
    child: Child,
    stdout: PathBuf,
    /// The run id, once a detached launch printed it.
    run: Option<RunId>,
    /// Started with `--delay 1h`: it waits through the cut, never started.
    is_delayed: bool,
    /// Launched once by this key (`--unique`): the key must hold through the cut.
    unique: Option<String>,
}

/// A command whose exit 0 acknowledges a record: `job update` or `stop`.
struct Request {
    what: Acknowledged,
    child: Child,
    /// What it printed (outside the lazy disk): a stop says what it found.
    stdout: PathBuf,
}

/// What a process acknowledged, to be found after the cut.
#[derive(Debug, Clone)]
enum Acknowledged {
    /// A detached launch printed the run id: the run with its runner started.
    Launched { run: RunId },
    /// A delayed launch printed the run id: the run waiting for its due time, its delay kept,
    /// and the key it was launched once by, if any, still held by it.
    Delayed { run: RunId, unique: Option<String> },
    /// `run --wait` printed records 1..=seq of the run named so; `end` the last line when it
    /// printed the run's end.
    Followed {
        name: String,
        seq: u64,
        end: Option<String>,
    },
    /// `job update` recorded this message, at the record it printed (`seq`, once it exited).
    JobUpdate {
        run: RunId,
        message: String,
        seq: Option<u64>,
    },
    /// `stop` recorded this request.
    Stop { run: RunId, reason: String },
    /// `stop` found a stop already recorded.
    Stopped { run: RunId },
    /// `stop` found the run ended, or a launch recorded that its runner never took the run.
    Ended { run: RunId },
    /// `steer` recorded this message.
    Steer { run: RunId, message: String },
    /// A host wrote this file into the run's control inbox and made it durable before the cut
    /// ([`write_as_careful_host`]).
    HostFile { run: RunId, file: HostFile },
}

/// A control file a host wrote, as pi-subagents' control code names and fills it.
#[derive(Debug, Clone)]
struct HostFile {
    kind: HostKind,
    /// Its path under the run's directory (`control/stop-requests/....json`).
    path: PathBuf,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum HostKind {
    Stop,
    Interrupt,
    Steer {
        id: String,
    },
    /// Not JSON: refused, with a `ControlRefused` record, and moved into `control/refused/`.
    Malformed,
    /// A stop of one step (`targetIndex`): journaled once per step, or refused (a step that
    /// ended, or one the run does not have).
    StopStep {
        step: u32,
    },
}

struct Cut<'a> {
    rng: StdRng,
    seed: u64,
    bin: &'a Path,
    home: Home,
    out: &'a Path,
    freezer: &'a Freezer,
    launches: Vec<Launch>,
    requests: Vec<Request>,
    /// Reconcilers and prunes: nothing is checked of them but the journal they leave.
    others: Vec<Child>,
    /// Control files a host made durable in runs' inboxes.
    host_files: Vec<Acknowledged>,
    /// Runs given an `interrupt.json` (one name per run: a second would replace the first).
    interrupted: Vec<RunId>,
    /// How the checks after the cut found the host's control files.
    host_files_found: BTreeMap<&'static str, usize>,
    counts: BTreeMap<&'static str, usize>,
    log: Vec<String>,
}

impl Cut<'_> {
    /// `runjournal --home HOME ARGS`, placed in the freezer cgroup before it runs anything
    /// (`sh` moves itself there and `exec`s it), its output into `stdout`.
    fn command(&self, args: &[String], stdout: Option<&Path>) -> Child {
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg(r#"echo $$ > "$0" && exec "$@""#)
            .arg(self.freezer.dir.join("cgroup.procs"))
            .arg(self.bin)
            .arg("--home")
            .arg(self.home.root())
            .args(layout_args(&self.home))
            .args(args)
            .env_remove("RUNJOURNAL_HOME")
            .env_remove("RUNJOURNAL_LAYOUT")
            .env_remove("RUNJOURNAL_SHIP_URL")
            // No password from the environment of whoever runs the tests.
            .env_remove("PGPASSWORD")
            .env("PGPASSFILE", self.out.join("no-password-file"))
            .current_dir(self.out)
            .stdin(Stdio::null())
            .stderr(Stdio::null());
        match stdout {
            Some(path) => command.stdout(std::fs::File::create(path).expect("an output file")),
            None => command.stdout(Stdio::null()),
        };
        command.spawn().expect("spawn runjournal")
    }

    fn count(&mut self, what: &'static str) {
        *self.counts.entry(what).or_default() += 1;
    }

    fn launch(&mut self) {
        let shape = match self.rng.random_range(0..3) {
            0 => Shape::Chain,
            1 => Shape::Parallel,
            _ => Shape::ExternalJob,
        };
        // An external job's run is fed and ended by `job update`: it needs its id, which a
        // detached launch prints.
        let is_wait = shape != Shape::ExternalJob && self.rng.random_bool(0.5);
        let name = format!("cut-{}-{}", self.seed, self.launches.len());
        let mut step =
            |text: &str| format!("sleep 0.0{}; echo {text}", self.rng.random_range(1..9));
        let mut args: Vec<String> = vec!["run".into(), "--name".into(), name.clone()];
        if self.home.layout() == Layout::PiSubagents {
            // The host's session, which pi-subagents' result lookup goes by.
            args.extend(["--session-id".into(), PI_SESSION.into()]);
        }
        match shape {
            Shape::Chain => {
                // A chain's steps take the messages steered to them.
                for index in 0..3 {
                    args.extend([
                        "--step".into(),
                        format!(
                            "{}; rm -f \"$RUNJOURNAL_INBOX\"/*.json",
                            step(&format!("chain-{index}"))
                        ),
                    ]);
                }
            }
            Shape::Parallel => {
                args.extend(["--mode".into(), "parallel".into()]);
                for index in 0..3 {
                    args.extend(["--step".into(), step(&format!("parallel-{index}"))]);
                }
            }
            Shape::ExternalJob => {
                args.extend(["--external-job".into(), "exec sleep 120".into()]);
            }
        }
        // A third of the runs keep a variable of their launcher's and have a completion hook,
        // which writes outside the disk: its deliveries are checked after the cut.
        if self.rng.random_bool(1.0 / 3.0) {
            args.extend([
                "--env".into(),
                format!("POWER_CUT_SEED={}", self.seed),
                "--on-exit".into(),
                format!(
                    "echo \"$RUNJOURNAL_RUN_ID $POWER_CUT_SEED\" >> {}",
                    self.out.join(HOOK_LOG).display()
                ),
            ]);
            self.count("with a hook");
        }
        // A sixth of the detached launches of runs that need no feeding are delayed past the
        // cut: the run, its due time and the home's timer must survive it.
        let is_delayed = !is_wait && shape != Shape::ExternalJob && self.rng.random_bool(1.0 / 6.0);
        if is_delayed {
            args.extend(["--delay".into(), "1h".into()]);
            self.count("delayed");
        }
        // A sixth of the other runs of commands are tried again, and their first attempt fails
        // (a last step that exits 7): its end is one record, and the next attempt waits an
        // hour, through the cut (a stop ends it after).
        if !is_delayed && shape != Shape::ExternalJob && self.rng.random_bool(1.0 / 6.0) {
            args.extend(
                [
                    "--retries",
                    "1",
                    "--retry-backoff",
                    "1h",
                    "--retry-on",
                    "exit",
                    "--step",
                    "exit 7",
                ]
                .map(String::from),
            );
            self.count("retried");
        }
        // Half the delayed runs are launched once by a key, which they hold through the cut.
        let unique = (is_delayed && self.rng.random_bool(0.5)).then(|| format!("key-{name}"));
        if let Some(key) = &unique {
            args.extend(["--unique".into(), key.clone()]);
            self.count("launched once");
        }
        args.push(if is_wait { "--wait" } else { "--json" }.into());
        let stdout = self.out.join(format!("{name}.out"));
        let child = self.command(&args, Some(&stdout));
        self.log.push(format!(
            "launch {name} {shape:?} {} (pid {})",
            if is_wait { "--wait" } else { "--json" },
            child.id()
        ));
        self.count(match shape {
            Shape::Chain => "chain",
            Shape::Parallel => "parallel",
            Shape::ExternalJob => "external job",
        });
        self.launches.push(Launch {
            name,
            shape,
            is_wait,
            child,
            stdout,
            run: None,
            is_delayed,
            unique,
        });
    }

    /// Reads the run ids detached launches have printed so far.
    fn learn_run_ids(&mut self) {
        for launch in &mut self.launches {
            if launch.is_wait || launch.run.is_some() {
                continue;
            }
            launch.run = printed_run_id(&launch.stdout);
        }
    }

    fn known_runs(&self, shape: Option<Shape>) -> Vec<RunId> {
        self.launches
            .iter()
            .filter(|launch| shape.is_none_or(|shape| launch.shape == shape))
            .filter_map(|launch| launch.run)
            .collect()
    }

    fn job_update(&mut self) {
        let runs = self.known_runs(Some(Shape::ExternalJob));
        if runs.is_empty() {
            return;
        }
        let run = runs[self.rng.random_range(0..runs.len())];
        let message = format!("update-{}-{}", self.seed, self.requests.len());
        // Mostly progress; now and then the job's end.
        let state = if self.rng.random_bool(0.2) {
            "succeeded"
        } else {
            "running"
        };
        let args: Vec<String> = [
            "job",
            "update",
            &run.to_string(),
            "0",
            "--state",
            state,
            "--message",
            &message,
        ]
        .map(String::from)
        .to_vec();
        let stdout = self
            .out
            .join(format!("request-{}-{}.out", self.seed, self.requests.len()));
        let child = self.command(&args, Some(&stdout));
        self.log.push(format!(
            "job update {run} {state} {message} (pid {})",
            child.id()
        ));
        self.count("job update");
        self.requests.push(Request {
            what: Acknowledged::JobUpdate {
                run,
                message,
                seq: None,
            },
            child,
            stdout,
        });
    }

    fn stop(&mut self) {
        let runs = self.known_runs(None);
        if runs.is_empty() {
            return;
        }
        let run = runs[self.rng.random_range(0..runs.len())];
        let reason = format!("stop-{}-{}", self.seed, self.requests.len());
        let args: Vec<String> = ["stop", &run.to_string(), "--reason", &reason]
            .map(String::from)
            .to_vec();
        let stdout = self
            .out
            .join(format!("request-{}-{}.out", self.seed, self.requests.len()));
        let child = self.command(&args, Some(&stdout));
        self.log
            .push(format!("stop {run} {reason} (pid {})", child.id()));
        self.count("stop");
        self.requests.push(Request {
            what: Acknowledged::Stop { run, reason },
            child,
            stdout,
        });
    }

    /// A host's control file in a live run's inbox, written as pi-subagents' control code
    /// writes it (`requestAsyncStop`, `requestAsyncInterrupt`, `requestAsyncSteer`), or a file
    /// that is not JSON; made durable as a careful host does ([`write_as_careful_host`]). Only
    /// a file whose every sync returned is acknowledged: one the cut (or a prune) interrupted
    /// may be lost.
    fn host_file(&mut self) {
        let runs = self.known_runs(None);
        if runs.is_empty() {
            return;
        }
        let run = runs[self.rng.random_range(0..runs.len())];
        let number = self.host_files.len();
        let source = format!("power-cut-{}-{number}", self.seed);
        let ts = runjournal::event::now_ms();
        let mut kind = match self.rng.random_range(0..11) {
            0..=3 => HostKind::Stop,
            4..=5 => HostKind::Interrupt,
            6..=8 => HostKind::Steer {
                id: format!("steer-{}-{number}", self.seed),
            },
            9 => HostKind::StopStep {
                step: self.rng.random_range(0..2),
            },
            _ => HostKind::Malformed,
        };
        if kind == HostKind::Interrupt && self.interrupted.contains(&run) {
            kind = HostKind::Stop;
        }
        let (path, content) = match &kind {
            HostKind::Stop => (
                format!("control/stop-requests/{ts:013}-{source}.json"),
                serde_json::json!({"type": "stop", "ts": ts, "source": source, "reason": source})
                    .to_string(),
            ),
            HostKind::Interrupt => {
                self.interrupted.push(run);
                (
                    "control/interrupt.json".to_string(),
                    serde_json::json!({"type": "interrupt", "ts": ts, "source": source})
                        .to_string(),
                )
            }
            HostKind::Steer { id } => (
                format!("control/steer-requests/{ts:013}-{id}.json"),
                serde_json::json!({
                    "type": "steer", "id": id, "ts": ts, "message": source, "source": source
                })
                .to_string(),
            ),
            HostKind::Malformed => (
                format!("control/stop-requests/{ts:013}-{source}-malformed.json"),
                "{\"type\": \"stop\", cut short".to_string(),
            ),
            HostKind::StopStep { step } => (
                format!("control/stop-requests/{ts:013}-{source}-step.json"),
                serde_json::json!({
                    "type": "stop", "ts": ts, "source": source, "reason": source, "targetIndex": step
                })
                .to_string(),
            ),
        };
        let file = HostFile {
            kind,
            path: PathBuf::from(path),
        };
        let written = write_as_careful_host(
            &self.home.runs_dir(),
            &self.home.run_dir(run),
            &file.path,
            content.as_bytes(),
        );
        self.log.push(format!(
            "host file {run} {}: {}",
            file.path.display(),
            match &written {
                Ok(()) => "durable".to_string(),
                Err(error) => format!("not written: {error}"),
            }
        ));
        self.count("host control file");
        if written.is_ok() {
            self.host_files.push(Acknowledged::HostFile { run, file });
        }
    }

    fn steer(&mut self) {
        let runs = self.known_runs(None);
        if runs.is_empty() {
            return;
        }
        let run = runs[self.rng.random_range(0..runs.len())];
        let message = format!("steer-{}-{}", self.seed, self.requests.len());
        let args: Vec<String> = ["steer", &run.to_string(), &message]
            .map(String::from)
            .to_vec();
        let stdout = self
            .out
            .join(format!("request-{}-{}.out", self.seed, self.requests.len()));
        let child = self.command(&args, Some(&stdout));
        self.log
            .push(format!("steer {run} {message} (pid {})", child.id()));
        self.count("steer");
        self.requests.push(Request {
            what: Acknowledged::Steer { run, message },
            child,
            stdout,
        });
    }

    fn other(&mut self, what: &'static str, args: &[&str]) {
        let args: Vec<String> = args.iter().map(|arg| arg.to_string()).collect();
        let child = self.command(&args, None);
        self.log.push(format!("{what} (pid {})", child.id()));
        self.count(what);
        self.others.push(child);
    }

    /// One round of the workload: a few launches at once (they share commits through a
    /// leader), or a request, or a reconciler or a prune beside them.
    fn round(&mut self) {
        self.learn_run_ids();
        match self.rng.random_range(0..20) {
            0..=5 => self.launch(),
            6..=7 => {
                for _ in 0..self.rng.random_range(2..5) {
                    self.launch();
                }
            }
            8..=11 => self.job_update(),
            12..=13 => self.stop(),
            14 => self.other("reconcile", &["reconcile"]),
            15 => self.other("prune", &["prune", "--keep-runs", "4"]),
            16..=17 => self.host_file(),
            18 => self.steer(),
            _ => {}
        }
        std::thread::sleep(Duration::from_millis(self.rng.random_range(5..60)));
    }

    /// Every process is dead: reaps them, and gathers what they acknowledged.
    fn acknowledged(&mut self) -> Vec<Acknowledged> {
        let mut acknowledged = Vec::new();
        for launch in &mut self.launches {
            let status = launch.child.wait().expect("reap a launcher");
            let printed = std::fs::read_to_string(&launch.stdout).unwrap_or_default();
            if launch.is_wait {
                let lines: Vec<&str> = printed
                    .lines()
                    .filter(|line| line.starts_with('#') && is_whole_line(&printed, line))
                    .collect();
                let Some(last) = lines.last() else {
                    continue;
                };
                let seq = record_seq(last);
                let end = last
                    .split_once(' ')
                    .is_some_and(|(_, event)| event.starts_with("run "))
                    .then(|| last.to_string());
                self.log.push(format!(
                    "{} --wait printed {} records ({status:?}): last {last:?}",
                    launch.name,
                    lines.len()
                ));
                acknowledged.push(Acknowledged::Followed {
                    name: launch.name.clone(),
                    seq,
                    end,
                });
            } else if let Some(run) = printed_run_id(&launch.stdout) {
                self.log.push(format!(
                    "{} printed its run id {run} ({status:?})",
                    launch.name
                ));
                acknowledged.push(if launch.is_delayed {
                    Acknowledged::Delayed {
                        run,
                        unique: launch.unique.clone(),
                    }
                } else if exited_zero(status) {
                    Acknowledged::Launched { run }
                } else {
                    // Its runner did not take the run (it could not be started, or it gave up
                    // before taking it): the launcher records the run's end before it prints
                    // the run and exits 1, so that end is what it acknowledged.
                    Acknowledged::Ended { run }
                });
            }
        }
        for request in &mut self.requests {
            let status = request.child.wait().expect("reap a request");
            if !exited_zero(status) {
                continue;
            }
            let printed = std::fs::read_to_string(&request.stdout).unwrap_or_default();
            let what = match &request.what {
                Acknowledged::Stop { run, .. } if printed.contains("(already requested)") => {
                    Acknowledged::Stopped { run: *run }
                }
                Acknowledged::Stop { run, .. } if printed.contains("has already ended") => {
                    Acknowledged::Ended { run: *run }
                }
                Acknowledged::JobUpdate { run, message, .. } => Acknowledged::JobUpdate {
                    run: *run,
                    message: message.clone(),
                    seq: Some(printed_record(&printed)),
                },
                what => what.clone(),
            };
            self.log
                .push(format!("acknowledged {what:?}: {}", printed.trim()));
            acknowledged.push(what);
        }
        for other in &mut self.others {
            let _ = other.wait();
        }
        acknowledged.append(&mut self.host_files);
        acknowledged
    }
}

/// `--layout pi-subagents` for a home of that layout (every command must name it).
fn layout_args(home: &Home) -> Vec<&'static str> {
    match home.layout() {
        Layout::PiSubagents => vec!["--layout", "pi-subagents"],
        Layout::Runjournal => Vec::new(),
    }
}

fn exited_zero(status: ExitStatus) -> bool {
    status.code() == Some(0) && status.signal().is_none()
}

/// Whether `line` of `text` ended with a newline (a line cut by the kill is not a whole one).
fn is_whole_line(text: &str, line: &str) -> bool {
    text.contains(&format!("{line}\n"))
}

/// `run 01J...: step 0 job running (record 7)` → 7.
fn printed_record(printed: &str) -> u64 {
    printed
        .trim()
        .strip_suffix(')')
        .and_then(|text| text.rsplit_once("(record "))
        .and_then(|(_, seq)| seq.parse().ok())
        .unwrap_or_else(|| panic!("a job update that exited 0 printed its record: {printed:?}"))
}

/// `#12 step 0 (...) complete (exit 0)` → 12.
fn record_seq(line: &str) -> u64 {
    line.trim_start_matches('#')
        .split_whitespace()
        .next()
        .and_then(|seq| seq.parse().ok())
        .unwrap_or_else(|| panic!("a --wait line starts with its record's seq: {line:?}"))
}

fn printed_run_id(stdout: &Path) -> Option<RunId> {
    let text = std::fs::read_to_string(stdout).ok()?;
    let line = text.lines().next()?;
    if !text.contains('\n') {
        return None;
    }
    let object: serde_json::Value = serde_json::from_str(line).ok()?;
    object["runId"].as_str()?.parse().ok()
}

/// After a cut and `ship --once`: the server holds every record of the journal, each global
/// seq once and with the same content, and the journal's head as shipped (records of runs
/// pruned since they were shipped stay on the server).
fn check_shipped(cluster: &PgCluster, home: &Home, seed: u64) {
    let id = crate::ship::journal_id(home);
    let local = crate::ship::local_hashes(home);
    let (server, rows) = crate::ship::server_hashes(cluster, &id);
    assert_eq!(
        rows,
        server.len() as i64,
        "seed {seed}: a global seq is on the server twice"
    );
    for (global, hash) in &local {
        assert_eq!(
            server.get(global),
            Some(hash),
            "seed {seed}: the record at global seq {global} on the server"
        );
    }
    assert_eq!(
        crate::ship::shipped_through(cluster, &id),
        Some(crate::ship::global_head(home)),
        "seed {seed}: shipped through the journal's head"
    );
}

/// After `runjournal reconcile`, the only runs left open may be those whose runner never
/// started (created within the reconciler's start grace, which a launcher may still be in),
/// and those waiting for their due time: every process is dead, so the waiting ones are stopped
/// and a pass without the grace closes them all (a stopped run that never started is closed by
/// the pass after its stop, which records that no runner ever ran it).
fn close_unstarted(home: &Home, seed: u64) {
    let store = Store::open_with(home.clone(), StoreOptions::default()).expect("the home opens");
    let view = store.journal().view().expect("a read view");
    let mut unstarted = 0;
    for run in view.all_runs().expect("the runs") {
        let state = view.snapshot(run).expect("a snapshot").expect("the run");
        if state.is_terminal() {
            continue;
        }
        if state.is_waiting_for_due() {
            // Due in an hour: ended by a stop, which starts nothing.
            runjournal::control::request_stop(&store, run, "power-cut test", "after the cut")
                .expect("a delayed run is stopped");
            unstarted += 1;
            continue;
        }
        assert!(
            state.runner.is_none(),
            "seed {seed}: run {run} is left {} after reconcile, its runner started",
            state.status
        );
        unstarted += 1;
    }
    drop(view);
    if unstarted > 0 {
        let options = reconcile::Options {
            start_grace_ms: 0,
            ..reconcile::Options::default()
        };
        reconcile::reconcile(&store, &options).expect("a reconcile pass");
    }
}

/// A run's attempts after the cut: each ended at most once, and no runner started before the
/// due time of the attempt before it (an hour away in this workload: none did).
fn check_attempts(records: &[Record], seed: u64) {
    let mut due_at_ms = None;
    for record in records {
        match &record.event {
            Event::AttemptEnded { retry_at_ms, .. } => due_at_ms = Some(*retry_at_ms),
            Event::RunnerStarted { .. } => {
                if let Some(due_at_ms) = due_at_ms {
                    assert!(
                        record.time_ms >= due_at_ms,
                        "seed {seed}: run {}: a runner started before its attempt was due",
                        record.run_id
                    );
                }
            }
            _ => {}
        }
    }
    let ended = records
        .iter()
        .filter(|record| matches!(record.event, Event::AttemptEnded { .. }))
        .count();
    assert!(
        ended <= 1,
        "seed {seed}: a run of one retry ended {ended} attempts"
    );
}

/// The checks after the remount and `runjournal reconcile`; panics naming what is missing.
/// Returns the runs, and how the host's control files were found (each counted at every
/// cut it is checked after).
fn check(
    home: &Home,
    acknowledged: &[Acknowledged],
    seed: u64,
) -> (usize, BTreeMap<&'static str, usize>) {
    let mut host_files = BTreeMap::new();
    let journal = Journal::open(home.journal_path()).expect("the journal opens after the cut");
    let view = journal.view().expect("a read view");
    let runs = support::check_journal(&view, Some(home));
    for (state, records) in &runs {
        assert!(
            state.is_terminal(),
            "seed {seed}: run {} is left {} after reconcile",
            state.run_id,
            state.status
        );
        check_attempts(records, seed);
    }
    let records_of = |run: RunId| view.records(run).expect("records read");
    let is_pruned = |run: RunId| view.tombstone(run).expect("tombstones read").is_some();
    for ack in acknowledged {
        let lost = |what: &str| -> ! { lost(seed, what, ack) };
        match ack {
            Acknowledged::Delayed { run, unique } => {
                if is_pruned(*run) {
                    continue;
                }
                let records = records_of(*run);
                let has = |name: &str| records.iter().any(|record| record.event.name() == name);
                if !has("StartDelayed") {
                    lost("a delayed run's due time");
                }
                if has("DelayEnded") || has("RunnerStarted") {
                    lost("a run delayed by an hour that started");
                }
                if let Some(key) = unique {
                    if !has("UniqueKey") {
                        lost("the key a run was launched once by");
                    }
                    let holder = view.unique_holder(key).expect("the unique index reads");
                    if holder != Some(*run) {
                        lost("the unique index entry of a run launched once");
                    }
                }
            }
            Acknowledged::Launched { run } => {
                if is_pruned(*run) {
                    continue;
                }
                let records = records_of(*run);
                if !records
                    .iter()
                    .any(|record| matches!(record.event, Event::RunnerStarted { .. }))
                {
                    eprintln!(
                        "run {run}: records {:?}; record count {}",
                        support::events(&records),
                        view.record_count().expect("records count")
                    );
                    lost("a launched run with its runner started");
                }
            }
            Acknowledged::Followed { name, seq, end } => {
                let Some(run) = view.lookup_alias(&name_alias(name)).expect("aliases read") else {
                    // Pruned runs keep no alias; a pruned run ended, so its end is what its
                    // tombstone holds.
                    if view
                        .tombstones()
                        .expect("tombstones read")
                        .iter()
                        .any(|tombstone| tombstone.name.as_deref() == Some(name.as_str()))
                    {
                        continue;
                    }
                    lost("a followed run");
                };
                if is_pruned(run) {
                    continue;
                }
                let records = records_of(run);
                if (records.len() as u64) < *seq {
                    lost("records a --wait printed");
                }
                if end.is_some()
                    && !records
                        .iter()
                        .any(|record| matches!(record.event, Event::Terminal { .. }))
                {
                    lost("the end a --wait printed");
                }
            }
            Acknowledged::JobUpdate { run, message, seq } => {
                if is_pruned(*run) {
                    continue;
                }
                // At the seq it printed: a journal that went back to older records and on from
                // there would hold another record at that seq, or this one at another.
                let is_there = records_of(*run).iter().any(|record| {
                    seq.is_none_or(|seq| record.seq == seq)
                        && matches!(&record.event, Event::ExternalJobUpdated { job, .. }
                            if job.message.as_deref() == Some(message.as_str()))
                });
                if !is_there {
                    eprintln!(
                        "run {run}: records {:?}",
                        support::events(&records_of(*run))
                    );
                    lost("a job update that exited 0, at the record it printed");
                }
            }
            Acknowledged::Stop { run, reason } => {
                if is_pruned(*run) {
                    continue;
                }
                if !records_of(*run).iter().any(|record| {
                    matches!(&record.event, Event::ControlRequested { action: ControlAction::Stop, reason: recorded, .. }
                        if recorded == reason)
                }) {
                    lost("a stop that exited 0");
                }
            }
            Acknowledged::Stopped { run } => {
                if is_pruned(*run) {
                    continue;
                }
                if !records_of(*run).iter().any(|record| {
                    matches!(
                        &record.event,
                        Event::ControlRequested {
                            action: ControlAction::Stop,
                            ..
                        }
                    )
                }) {
                    lost("the stop a later stop found recorded");
                }
            }
            Acknowledged::Ended { run } => {
                if is_pruned(*run) {
                    continue;
                }
                if !records_of(*run)
                    .iter()
                    .any(|record| matches!(record.event, Event::Terminal { .. }))
                {
                    lost("the end a stop found recorded");
                }
            }
            Acknowledged::Steer { run, message } => {
                if is_pruned(*run) {
                    continue;
                }
                let requested = records_of(*run)
                    .iter()
                    .filter(|record| matches!(&record.event, Event::SteerRequested { message: recorded, .. } if recorded == message))
                    .count();
                match requested {
                    0 => lost("a steer that exited 0"),
                    1 => {}
                    _ => panic!("seed {seed}: a steer recorded {requested} times: {ack:?}"),
                }
            }
            Acknowledged::HostFile { run, file } => {
                if is_pruned(*run) {
                    continue;
                }
                let found = check_host_file(home, *run, file, &records_of(*run), seed);
                *host_files.entry(found).or_default() += 1;
            }
        }
    }
    (runs.len(), host_files)
}

/// After the cut and the reconcile: a control file a host made durable before the cut is still
/// in place untaken, or taken — its request journaled once (a stop or an interrupt: the
/// run's one `ControlRequested` of that action, its own or one recorded before it; a steer: its
/// `SteerRequested`, delivered at most once to each step) — or refused: a `ControlRefused`
/// naming it and the file in `control/refused/`. Never lost, never twice. Returns which.
fn check_host_file(
    home: &Home,
    run: RunId,
    file: &HostFile,
    records: &[runjournal::event::Record],
    seed: u64,
) -> &'static str {
    let lost = |what: &str| -> ! {
        eprintln!(
            "run {run}: records {:?}; its control inbox: {:?}",
            support::events(records),
            files_in(&home.control_dir(run))
        );
        panic!("seed {seed}: {what}: {} of run {run}", file.path.display())
    };
    let is_in_place = home.run_dir(run).join(&file.path).is_file();
    let name = file
        .path
        .file_name()
        .expect("a file name")
        .to_string_lossy()
        .to_string();
    let refusals = records
        .iter()
        .filter(|record| matches!(&record.event, Event::ControlRefused { file: refused, .. } if Path::new(refused) == file.path))
        .count();
    let is_aside = files_in(&home.control_refused_dir(run))
        .iter()
        .any(|aside| aside.ends_with(&format!("-{name}")));
    // A refusal whose move the cut undid is refused again: more than one record, no effect.
    let is_refused = refusals > 0 && is_aside;
    if refusals > 0 && !is_aside && !is_in_place {
        lost("a refused file neither in control/refused/ nor in place");
    }
    let controls = |action: ControlAction| {
        records
            .iter()
            .filter(|record| matches!(&record.event, Event::ControlRequested { action: recorded, .. } if *recorded == action))
            .count()
    };
    match &file.kind {
        HostKind::Stop | HostKind::Interrupt => {
            let action = if file.kind == HostKind::Stop {
                ControlAction::Stop
            } else {
                ControlAction::Interrupt
            };
            let requested = controls(action);
            if requested > 1 {
                lost("a control action journaled twice");
            }
            if requested == 0 && !is_in_place && !is_refused {
                lost("a durable control file lost: not in place, not journaled, not refused");
            }
            if is_in_place {
                "control file in place"
            } else if is_refused {
                "control file refused"
            } else {
                "control file taken"
            }
        }
        HostKind::Steer { id } => {
            let requested = records
                .iter()
                .filter(|record| matches!(&record.event, Event::SteerRequested { id: recorded, .. } if recorded == id))
                .count();
            if requested > 1 {
                lost("a steer request journaled twice");
            }
            if requested == 0 && !is_in_place && !is_refused {
                lost("a durable steer file lost: not in place, not journaled, not refused");
            }
            let mut delivered: Vec<u32> = records
                .iter()
                .filter_map(|record| match &record.event {
                    Event::SteerDelivered { id: recorded, step } if recorded == id => Some(*step),
                    _ => None,
                })
                .collect();
            let count = delivered.len();
            delivered.sort_unstable();
            delivered.dedup();
            if delivered.len() != count {
                lost("a steer delivered twice to one step");
            }
            match (is_in_place, is_refused, count) {
                (true, _, _) => "steer file in place",
                (_, true, _) => "steer file refused",
                (_, _, 0) => "steer file taken",
                _ => "steer file taken and delivered",
            }
        }
        HostKind::Malformed => {
            if is_refused {
                "malformed file refused"
            } else if is_in_place {
                "malformed file in place"
            } else {
                lost("a malformed file neither refused nor in place")
            }
        }
        HostKind::StopStep { step } => {
            let requested = records
                .iter()
                .filter(|record| matches!(&record.event, Event::StepStopRequested { step: stopped, .. } if stopped == step))
                .count();
            if requested > 1 {
                lost("a step's stop journaled twice");
            }
            if requested == 0 && !is_in_place && !is_refused {
                lost("a durable stop of one step lost: not in place, not journaled, not refused");
            }
            if is_in_place {
                "step stop file in place"
            } else if is_refused {
                "step stop file refused"
            } else {
                "step stop file taken"
            }
        }
    }
}

/// The names of the entries in `dir` (none when it cannot be read).
fn files_in(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|entry| entry.file_name().to_string_lossy().to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// Writes a control file into a run's inbox as pi-subagents' control code does — its
/// directories made when missing (the run's must be there), a temporary file beside it renamed
/// over it — and makes it durable as a careful host must: the temporary file synced before the
/// rename, then every directory from the file's up to the home's runs directory, whose entries
/// runjournal never syncs (docs/pi-subagents.md, "Driving runs from a host"). pi-subagents 0.67
/// syncs none of them.
fn write_as_careful_host(
    runs_dir: &Path,
    run_dir: &Path,
    path: &Path,
    bytes: &[u8],
) -> std::io::Result<()> {
    use std::io::Write;
    if !run_dir.is_dir() {
        return Err(std::io::ErrorKind::NotFound.into());
    }
    let target = run_dir.join(path);
    let dir = target
        .parent()
        .expect("a file in a directory")
        .to_path_buf();
    let mut below: Vec<&Path> = dir
        .ancestors()
        .take_while(|ancestor| *ancestor != run_dir)
        .collect();
    below.reverse();
    for made in &below {
        match std::fs::create_dir(made) {
            Err(error) if error.kind() != std::io::ErrorKind::AlreadyExists => return Err(error),
            _ => {}
        }
    }
    let name = target.file_name().expect("a name").to_string_lossy();
    let temp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let written = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&temp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        drop(file);
        std::fs::rename(&temp, &target)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    written?;
    for synced in dir.ancestors() {
        std::fs::File::open(synced)?.sync_all()?;
        if synced == runs_dir {
            return Ok(());
        }
    }
    Err(std::io::Error::other(
        "the file is not under the runs directory",
    ))
}

/// Waits until the hooks due after the cut are delivered — by deliverers the reconcile passes
/// start, the claims of processes the cut killed taken over — and every process of the
/// workload's cgroup (those deliverers) has exited, so nothing writes while the home is
/// checked. A minute at most; what is left is reported by [`check_hooks`].
fn settle_hooks(cut: &Cut<'_>, seed: u64) {
    for _ in 0..240 {
        let is_due = {
            let journal = Journal::open(cut.home.journal_path()).expect("the journal opens");
            let view = journal.view().expect("a read view");
            !view.hooks_due().expect("the due hooks read").is_empty()
        };
        let is_busy = !cut.freezer.procs().is_empty();
        match (is_due, is_busy) {
            (false, false) => return,
            (true, false) => {
                let reconcile = cut.command(&["reconcile".to_string()], None);
                let output = reconcile.wait_with_output().expect("reconcile runs");
                assert!(exited_zero(output.status), "seed {seed}: reconcile");
            }
            (_, true) => {}
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// After the cut: every run of the journal kept its launcher's environment (written with its
/// creation, so durable with it), and every hook of every run that ended is delivered, its
/// delivery in the hooks' log at least once, made in the run's kept environment.
fn check_hooks(cut: &Cut<'_>, seed: u64) {
    let journal = Journal::open(cut.home.journal_path()).expect("the journal opens");
    let view = journal.view().expect("a read view");
    assert!(
        view.hooks_due().expect("the due hooks read").is_empty(),
        "seed {seed}: hooks still due a minute after the cut: {:?}",
        view.hooks_due()
    );
    let delivered = std::fs::read_to_string(cut.out.join(HOOK_LOG)).unwrap_or_default();
    for run in view.all_runs().expect("the runs") {
        assert!(
            view.run_env(run).expect("an environment reads").is_some(),
            "seed {seed}: run {run} lost the environment it was created with"
        );
        let state = view.snapshot(run).expect("a snapshot").expect("the run");
        let hooks = view.run_hooks(run).expect("hooks read");
        if hooks.is_empty() || !state.is_terminal() {
            continue;
        }
        for hook in 0..hooks.len() {
            let hook = u32::try_from(hook).expect("a few hooks");
            assert!(
                state.hook(hook).is_some_and(|hook| hook.is_delivered()),
                "seed {seed}: run {run}'s hook {hook} is not delivered: {:?}",
                state.hook(hook)
            );
        }
        // Its line, with the launcher's variable: the hook ran in the run's kept environment.
        let run_text = run.to_string();
        assert!(
            delivered.lines().any(|line| line
                .split_once(' ')
                .is_some_and(|(id, seed_text)| id == run_text && !seed_text.is_empty())),
            "seed {seed}: run {run}'s hook never wrote its line with its launcher's variable"
        );
    }
}

fn lost(seed: u64, what: &str, ack: &Acknowledged) -> ! {
    panic!("seed {seed}: lost at the cut: {what} ({ack:?})")
}

/// Whether this machine can run the test; skips it, saying why, otherwise (or fails, where
/// every test must run).
fn can_run() -> bool {
    let missing = if !nix::unistd::geteuid().is_root() {
        Some("root")
    } else if !Path::new("/dev/fuse").exists() {
        Some("/dev/fuse")
    } else if !Path::new(FREEZER).join("freezer.state").exists()
        && !Path::new(FREEZER).join("cgroup.procs").exists()
    {
        Some("the cgroup v1 freezer")
    } else {
        None
    };
    let Some(missing) = missing else {
        return true;
    };
    runjournal::testkit::skip::skip("power cuts", &format!("no {missing}"));
    false
}

#[test]
fn power_cuts_of_the_real_binaries_lose_nothing_acknowledged() {
    if !can_run() {
        return;
    }
    let cuts = std::env::var(CUTS_ENV)
        .ok()
        .map(|text| {
            text.parse::<usize>()
                .unwrap_or_else(|_| panic!("{CUTS_ENV}={text:?} is not a count"))
        })
        .unwrap_or(DEFAULT_CUTS);
    let base_seed = std::env::var(SEED_ENV)
        .ok()
        .map(|text| {
            text.parse::<u64>()
                .unwrap_or_else(|_| panic!("{SEED_ENV}={text:?} is not a number"))
        })
        .unwrap_or_else(rand::random);
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_runjournal"));
    let freezer = Freezer::new(&format!("runjournal-power-cut-{}", std::process::id()));
    // A shipper follows each home's journal to a throwaway PostgreSQL, where it is installed.
    // Shipping is the cargo feature `ship`: without it, no shipper.
    let cluster = if cfg!(feature = "ship") {
        PgCluster::start("power_cuts_of_the_real_binaries_lose_nothing_acknowledged")
    } else {
        None
    };
    let ship_url_text = cluster.as_ref().map(PgCluster::url);
    let ship_url = ship_url_text.as_deref();

    // pi-subagents' readers, installed once for the whole test (where node and npm are),
    // read the homes of that layout after each cut.
    let pi_install = pi_subagents();

    let mut totals: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut acknowledged_total = 0;
    let mut runs_total = 0;
    let mut at_sync = 0;
    let mut pi_reads = 0;
    let mut pi_runs_read = 0;
    let mut host_files_found: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut recovers: BTreeMap<&'static str, usize> = BTreeMap::new();
    let started = Instant::now();
    let mut index = 0;
    while index < cuts {
        let base = tempfile::tempdir().expect("a temporary directory");
        let mount_point = base.path().join("disk");
        let out = base.path().join("out");
        std::fs::create_dir_all(&mount_point).expect("a mount point");
        std::fs::create_dir_all(&out).expect("an output directory");
        let mut disk = LazyDisk::mount(&mount_point).expect("the lazy disk mounts");
        // Every other disk's home is a pi-subagents temp root, chosen by its first cut's seed.
        let layout = if base_seed.wrapping_add(index as u64).is_multiple_of(2) {
            Layout::PiSubagents
        } else {
            Layout::Runjournal
        };
        let home = Home::in_layout(mount_point.join("home"), layout);
        let cuts_on_disk = CUTS_PER_DISK.min(cuts - index);
        // What every cut on this disk acknowledged: still there after the later cuts.
        let mut acknowledged: Vec<Acknowledged> = Vec::new();
        for cut_on_disk in 0..cuts_on_disk {
            let seed = base_seed.wrapping_add(index as u64);
            index += 1;
            eprintln!(
                "power cut {index}/{cuts}: seed {seed} (replay: {SEED_ENV}={seed} {CUTS_ENV}=1), home in the {} layout",
                layout.as_str()
            );
            let mut cut = Cut {
                rng: StdRng::seed_from_u64(seed),
                seed,
                bin: &bin,
                home: home.clone(),
                out: &out,
                freezer: &freezer,
                launches: Vec::new(),
                requests: Vec::new(),
                others: Vec::new(),
                host_files: Vec::new(),
                interrupted: Vec::new(),
                host_files_found: BTreeMap::new(),
                counts: BTreeMap::new(),
                log: Vec::new(),
            };
            let tear = if cut.rng.random_bool(0.5) {
                Tear::Sectors(cut.rng.random_range(1..16))
            } else {
                Tear::None
            };
            // At a chosen sync point of the journal, or at a random round.
            let at_fsync = cut
                .rng
                .random_bool(0.5)
                .then(|| cut.rng.random_range(1..300));
            let at_round = cut.rng.random_range(5..MAX_ROUNDS);
            if let Some(k) = at_fsync {
                disk.cut_after_fsync("journal.redb", k, tear);
            }
            cut.log.push(format!(
                "cut at fsync {at_fsync:?} or round {at_round}, {tear:?}"
            ));
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                if let Some(url) = ship_url {
                    // Following the journal until the cut.
                    cut.other("shipper", &["ship", "--to", url]);
                }
                let mut rounds = 0;
                while !disk.is_cut() && rounds < at_round {
                    cut.round();
                    rounds += 1;
                }
                let was_cut_at_sync = disk.is_cut();
                if let Some(unfrozen) = cut.freezer.freeze() {
                    // Reported with the test's totals; the cut goes ahead (see `freeze`).
                    eprintln!(
                        "seed {seed}: the workload did not freeze within {SETTLE_BOUND:?}; its processes: {unfrozen:#?}"
                    );
                    cut.log.push(format!("not all frozen: {unfrozen:?}"));
                    cut.count("freeze that did not complete");
                }
                disk.cut(tear);
                cut.freezer.kill_all();
                cut.log.push(format!(
                    "cut after {rounds} rounds{}",
                    if was_cut_at_sync {
                        " (at the sync)"
                    } else {
                        ""
                    }
                ));
                acknowledged.extend(cut.acknowledged());
                disk.remount().expect("the disk mounts again");
                let reconcile = cut.command(&["reconcile".to_string()], None);
                let output = reconcile.wait_with_output().expect("reconcile runs");
                assert!(
                    exited_zero(output.status),
                    "seed {seed}: runjournal reconcile after the cut: {:?}",
                    output.status
                );
                close_unstarted(&home, seed);
                settle_hooks(&cut, seed);
                let (runs, found) = check(&home, &acknowledged, seed);
                for (what, count) in found {
                    *cut.host_files_found.entry(what).or_default() += count;
                }
                check_hooks(&cut, seed);
                if let (Some(cluster), Some(url)) = (&cluster, ship_url) {
                    let shipper = cut.command(
                        &["ship".into(), "--once".into(), "--to".into(), url.into()],
                        None,
                    );
                    let output = shipper.wait_with_output().expect("the shipper runs");
                    assert!(
                        exited_zero(output.status),
                        "seed {seed}: ship --once after the cut: {:?}",
                        output.status
                    );
                    check_shipped(cluster, &home, seed);
                }
                let pi_read = match (&pi_install, layout) {
                    (Some(install), Layout::PiSubagents) => {
                        Some(check_pi_readers(install, &home, seed))
                    }
                    _ => None,
                };
                // The disk's last cut: its home's journal lost, rebuilt by
                // `recover` under a cut of its own.
                let recovered = (cut_on_disk + 1 == cuts_on_disk).then(|| {
                    check_recover(&mut disk, &home, &mut cut.rng, pi_install.as_deref(), seed)
                });
                (was_cut_at_sync, runs, pi_read, recovered)
            }));
            match outcome {
                Ok((was_cut_at_sync, runs, pi_read, recovered)) => {
                    at_sync += usize::from(was_cut_at_sync);
                    runs_total = runs_total.max(runs);
                    if let Some(read) = pi_read {
                        pi_reads += 1;
                        pi_runs_read += read;
                    }
                    if let Some(what) = recovered {
                        *recovers.entry(what).or_default() += 1;
                    }
                }
                Err(panic) => {
                    eprintln!("seed {seed}: what happened:");
                    for line in &cut.log {
                        eprintln!("  {line}");
                    }
                    // What the cut left, kept for a look (the disk goes with the test).
                    if !disk.is_cut() {
                        let kept = std::env::temp_dir().join(format!("power-cut-{seed}"));
                        let _ = Command::new("cp")
                            .arg("-a")
                            .arg(home.root())
                            .arg(&kept)
                            .status();
                        eprintln!(
                            "seed {seed}: the home after the cut is copied to {}",
                            kept.display()
                        );
                    }
                    std::panic::resume_unwind(panic);
                }
            }
            for (what, count) in &cut.counts {
                *totals.entry(what).or_default() += count;
            }
            for (what, count) in &cut.host_files_found {
                *host_files_found.entry(what).or_default() += count;
            }
        }
        acknowledged_total += acknowledged.len();
        drop(disk);
    }
    eprintln!(
        "power cuts: {cuts} ({at_sync} at a sync of the journal), {acknowledged_total} acknowledgments checked, workload {totals:?}; hosts' control files found {host_files_found:?}; pi-subagents' readers after {pi_reads} cuts, {pi_runs_read} runs read; recover {recovers:?}; in {:?}",
        started.elapsed()
    );
    assert!(runs_total > 0, "the workload made runs");
}

/// A home made on a disk that forgets unsynced directory entries: the first commit is
/// acknowledged only once the home's directories and the journal's entry are durable, so a
/// cut right after it keeps the journal and the run (before, the whole home vanished with its
/// unsynced entries, and the next command made an empty one).
#[test]
fn a_new_home_and_its_journal_survive_a_cut_after_the_first_commit() {
    if !can_run() {
        return;
    }
    let base = tempfile::tempdir().expect("a temporary directory");
    let mount_point = base.path().join("disk");
    std::fs::create_dir_all(&mount_point).expect("a mount point");
    let mut disk = LazyDisk::mount(&mount_point).expect("the lazy disk mounts");
    // Nested, so that directories are made below the home as well as the home itself.
    let home = Home::at(mount_point.join("state").join("home"));
    let run = {
        let store =
            Store::open_with(home.clone(), StoreOptions::default()).expect("the home opens");
        store
            .create_run(
                runjournal::testkit::chain_spec(2),
                runjournal::HostIds::default(),
            )
            .expect("the run is created")
            .run
    };
    assert!(disk.cut(Tear::None));
    disk.remount().expect("the disk mounts again");
    let journal = Journal::open(home.journal_path()).expect("the journal is there");
    let view = journal.view().expect("a read view");
    assert_eq!(view.all_runs().expect("the runs"), vec![run]);
}

/// `runjournal --home HOME ARGS` on a home of the lazy disk, to its end.
fn runjournal_on(home: &Home, args: &[&str]) -> std::process::Output {
    Command::new(bin_path())
        .arg("--home")
        .arg(home.root())
        .args(args)
        .env_remove("RUNJOURNAL_HOME")
        .env_remove("RUNJOURNAL_LAYOUT")
        .stdin(Stdio::null())
        .output()
        .expect("runjournal runs")
}

/// A detached launch's run id.
fn launched(home: &Home, args: &[&str]) -> RunId {
    let output = runjournal_on(home, args);
    assert!(output.status.success(), "{args:?}: {output:?}");
    let printed: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    printed["runId"]
        .as_str()
        .and_then(|run| run.parse().ok())
        .expect("a run id")
}

/// Waits (30 s at most) until `done` holds.
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(
            started.elapsed() < SETTLE_BOUND,
            "waited in vain for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The run's records, read from the journal.
fn records_on(home: &Home, run: RunId) -> Vec<runjournal::event::Record> {
    let journal = JournalReader::open(home.journal_path()).expect("the journal opens");
    let view = journal.view().expect("a read view");
    view.records(run).expect("the records")
}

/// The pid of the run's runner, once it started.
fn runner_pid(home: &Home, run: RunId) -> i32 {
    let journal = JournalReader::open(home.journal_path()).expect("the journal opens");
    let view = journal.view().expect("a read view");
    let state = view.snapshot(run).expect("a snapshot").expect("the run");
    let pid = state.runner.expect("its runner started").identity.pid;
    i32::try_from(pid).expect("a pid")
}

fn stop_requests_of(records: &[runjournal::event::Record]) -> Vec<String> {
    records
        .iter()
        .filter_map(|record| match &record.event {
            Event::ControlRequested {
                action: ControlAction::Stop,
                by,
                ..
            } => Some(by.clone()),
            _ => None,
        })
        .collect()
}

const HOST_STOP: &[u8] = br#"{"type": "stop", "ts": 1, "source": "a host", "reason": "a test"}"#;

/// The cause of control files lost at power cuts: runjournal syncs no run directory, so a
/// request file survives a cut only if its host syncs it and every directory from its own up
/// to the home's runs directory. Written so — into a run that waits in a held queue (no
/// runner), a run whose runner was killed, and a run whose live runner takes it before the
/// cut — each request is there after the cut (or its record is), and is journaled exactly
/// once: taken by the reconcile pass after the cut, or found journaled already.
#[test]
fn a_control_file_its_host_made_durable_survives_a_cut_and_is_taken_once() {
    if !can_run() {
        return;
    }
    let base = tempfile::tempdir().expect("a temporary directory");
    let mount_point = base.path().join("disk");
    std::fs::create_dir_all(&mount_point).expect("a mount point");
    let mut disk = LazyDisk::mount(&mount_point).expect("the lazy disk mounts");
    let home = Home::at(mount_point.join("home"));
    let held = runjournal_on(&home, &["queue", "held", "--max-active", "0"]);
    assert!(held.status.success(), "{held:?}");
    let queued = launched(&home, &["run", "--json", "--queue", "held", "--", "true"]);
    let dead = launched(&home, &["run", "--json", "--", "sleep", "30"]);
    let taking = launched(&home, &["run", "--json", "--", "sleep", "30"]);
    // The runners watch their inboxes once these are made.
    wait_until("the runners' inboxes", || {
        home.stop_requests_dir(dead).is_dir() && home.stop_requests_dir(taking).is_dir()
    });
    let dead_pid = runner_pid(&home, dead);
    let taking_pid = runner_pid(&home, taking);
    // The home's watcher, which the launches started, makes reconcile passes: one before the
    // cut would take the queued and the dead run's requests, and the cut would then undo the
    // removal of their files (runjournal syncs no run directory), leaving them beside runs that
    // ended. Gone, those requests are taken by the reconcile pass after the cut, as this test
    // means them to be.
    crate::support::stop_watcher(&home);
    kill(Pid::from_raw(dead_pid), Signal::SIGKILL).expect("SIGKILL the runner");
    let request = Path::new("control/stop-requests/0000000000001-a-host.json");
    for run in [queued, dead, taking] {
        write_as_careful_host(&home.runs_dir(), &home.run_dir(run), request, HOST_STOP)
            .expect("the host's request written");
    }
    wait_until("the live runner's record of the request", || {
        !stop_requests_of(&records_on(&home, taking)).is_empty()
    });
    assert!(disk.cut(Tear::None));
    let _ = kill(Pid::from_raw(taking_pid), Signal::SIGKILL);
    disk.remount().expect("the disk mounts again");
    for run in [queued, dead] {
        assert!(
            home.run_dir(run).join(request).is_file(),
            "run {run}: the host's durable request is there after the cut"
        );
    }
    let reconcile = runjournal_on(&home, &["reconcile"]);
    assert!(reconcile.status.success(), "{reconcile:?}");
    for run in [queued, dead, taking] {
        let records = records_on(&home, run);
        assert_eq!(
            stop_requests_of(&records),
            vec![format!("a host through {}", request.display())],
            "run {run}: the host's stop, journaled once: {:?}",
            support::events(&records)
        );
        assert!(
            records
                .iter()
                .any(|record| matches!(record.event, Event::Terminal { .. })),
            "run {run} ended"
        );
    }
    // The queued run ended stopped by it; nobody took the file of a run that ended.
    assert!(!home.run_dir(queued).join(request).exists());
}

/// A refused file was lost at a power cut: moved into `control/refused/` by a rename that
/// nothing synced, while the host's next durable request synced the directory it was moved
/// out of. It is now linked into `control/refused/`, that directory synced, and only then
/// removed from where the host put it: after the cut it is in `control/refused/`, with its
/// one `ControlRefused` record.
#[test]
fn a_refused_control_file_survives_a_cut_after_its_host_syncs_its_directory() {
    if !can_run() {
        return;
    }
    let base = tempfile::tempdir().expect("a temporary directory");
    let mount_point = base.path().join("disk");
    std::fs::create_dir_all(&mount_point).expect("a mount point");
    let mut disk = LazyDisk::mount(&mount_point).expect("the lazy disk mounts");
    let home = Home::at(mount_point.join("home"));
    let run = launched(&home, &["run", "--json", "--", "sleep", "30"]);
    wait_until("the runner's inbox", || {
        home.stop_requests_dir(run).is_dir()
    });
    let malformed = Path::new("control/stop-requests/0000000000001-malformed.json");
    write_as_careful_host(
        &home.runs_dir(),
        &home.run_dir(run),
        malformed,
        b"{\"type\": \"stop\", cut short",
    )
    .expect("the host's file written");
    wait_until("the runner's refusal", || {
        !home.run_dir(run).join(malformed).exists()
    });
    // The host's next request syncs `stop-requests/`: the refused file's removal from there
    // is durable from now on.
    write_as_careful_host(
        &home.runs_dir(),
        &home.run_dir(run),
        Path::new("control/stop-requests/0000000000002-stop.json"),
        HOST_STOP,
    )
    .expect("the host's stop written");
    wait_until("the run's end", || {
        records_on(&home, run)
            .iter()
            .any(|record| matches!(record.event, Event::Terminal { .. }))
    });
    assert!(disk.cut(Tear::None));
    disk.remount().expect("the disk mounts again");
    let reconcile = runjournal_on(&home, &["reconcile"]);
    assert!(reconcile.status.success(), "{reconcile:?}");
    let refusals = records_on(&home, run)
        .iter()
        .filter(|record| matches!(&record.event, Event::ControlRefused { file, .. } if Path::new(file) == malformed))
        .count();
    assert_eq!(refusals, 1, "the malformed file's refusal, recorded once");
    let aside = files_in(&home.control_refused_dir(run));
    assert!(
        aside
            .iter()
            .any(|name| name.ends_with("-0000000000001-malformed.json")),
        "the refused file is in control/refused/ after the cut: {aside:?}"
    );
}

/// A run's result was lost for good at a power cut: its `.result-published` marker was made
/// durable (by whoever synced the run's directory: a host making its control file durable)
/// while the result file, never synced, was not; the reconciler then took the missing result
/// for one its host had consumed, and never wrote it again. The result and its directory are
/// now synced before the marker is made.
#[test]
fn a_result_is_not_taken_for_consumed_when_a_cut_keeps_its_marker() {
    if !can_run() {
        return;
    }
    let base = tempfile::tempdir().expect("a temporary directory");
    let mount_point = base.path().join("disk");
    std::fs::create_dir_all(&mount_point).expect("a mount point");
    let mut disk = LazyDisk::mount(&mount_point).expect("the lazy disk mounts");
    let home = Home::at(mount_point.join("home"));
    let run = launched(&home, &["run", "--json", "--", "true"]);
    wait_until("the published result", || {
        home.result_published_marker_path(run).exists()
    });
    // A host's durable request into the ended run syncs the run's directory.
    write_as_careful_host(
        &home.runs_dir(),
        &home.run_dir(run),
        Path::new("control/stop-requests/0000000000001-late.json"),
        HOST_STOP,
    )
    .expect("the host's request written");
    assert!(disk.cut(Tear::None));
    disk.remount().expect("the disk mounts again");
    let reconcile = runjournal_on(&home, &["reconcile"]);
    assert!(reconcile.status.success(), "{reconcile:?}");
    let result = std::fs::read(home.result_path(run)).expect("the run's result after the cut");
    let result: serde_json::Value = serde_json::from_slice(&result).expect("a whole result");
    assert_eq!(result["state"], "complete", "{result}");
}

/// `/proc/<pid>/stat`'s state letter (`T` for a stopped process).
fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name, in parentheses, may hold spaces: the state follows the last `)`.
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .next()?
        .chars()
        .next()
}

/// The race behind a journal that went back to older records while the workload ran: a process
/// that found no journal, and then failed its open after another process had created the
/// journal and committed to it, removed that journal as if it were its own (the next process
/// made an empty one, and the first went on committing to a file no path reached). A failed
/// open now removes a journal only when its own exclusive create made it.
///
/// The failing process is stopped (a test hook) after it made the home's directories
/// and before it creates the journal; meanwhile another handle creates the journal and commits
/// a run; the journal is then made group-writable, so that the stopped process's open refuses
/// it once resumed. Its failure must leave the journal, and the run, in place.
#[test]
fn a_failed_open_never_removes_a_journal_another_process_created() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    let base = tempfile::tempdir().expect("a temporary directory");
    let home = Home::at(base.path().join("home"));
    let hook = base.path().join("stop-in-open");
    std::fs::write(&hook, b"").expect("the hook's file");
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_runjournal"));
    let mut late = Command::new(&bin)
        .arg("--home")
        .arg(home.root())
        .arg("reconcile")
        .env(runjournal::store::STOP_IN_OPEN_ENV, &hook)
        .env_remove("RUNJOURNAL_HOME")
        .env_remove("RUNJOURNAL_LAYOUT")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn runjournal reconcile");
    let pid = late.id();
    let started = Instant::now();
    while hook.exists() || process_state(pid) != Some('T') {
        assert!(
            started.elapsed() < SETTLE_BOUND,
            "the late open never stopped in its open ({:?})",
            process_state(pid)
        );
        assert!(
            late.try_wait().expect("a wait").is_none(),
            "the late open exited before its hook"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(
        !home.journal_path().exists(),
        "the late open stopped before the journal was made"
    );

    // Another process's open, meanwhile: it creates the journal and commits a run.
    let store = Store::open_with(home.clone(), StoreOptions::default()).expect("the home opens");
    let run = store
        .create_run(
            runjournal::testkit::chain_spec(1),
            runjournal::HostIds::default(),
        )
        .expect("the run is created")
        .run;
    let inode = std::fs::metadata(home.journal_path())
        .expect("the journal")
        .ino();
    std::fs::set_permissions(home.journal_path(), std::fs::Permissions::from_mode(0o660))
        .expect("the journal made group-writable");

    kill(Pid::from_raw(pid as i32), Signal::SIGCONT).expect("SIGCONT");
    let output = late.wait_with_output().expect("the late open ends");
    assert!(
        !exited_zero(output.status),
        "the late open refuses a group-writable journal: {:?}",
        output.status
    );
    let kept = std::fs::metadata(home.journal_path()).unwrap_or_else(|error| {
        panic!(
            "the journal is gone after another process's failed open ({error}); it said: {}",
            String::from_utf8_lossy(&output.stderr)
        )
    });
    assert_eq!(
        kept.ino(),
        inode,
        "the journal at the path is the one the run was committed to"
    );
    std::fs::set_permissions(home.journal_path(), std::fs::Permissions::from_mode(0o600))
        .expect("the journal private again");
    // The first handle's later commits reach the same file a new open reads.
    store
        .append(
            run,
            vec![Event::ControlRequested {
                action: ControlAction::Stop,
                by: "a test".to_string(),
                reason: "after the failed open".to_string(),
            }],
            runjournal::journal::Condition::none(),
        )
        .expect("the first handle commits again");
    drop(store);
    let journal = Journal::open(home.journal_path()).expect("the journal opens");
    let records = journal
        .view()
        .expect("a view")
        .records(run)
        .expect("records");
    assert!(
        records.iter().any(|record| matches!(
            &record.event,
            Event::ControlRequested { reason, .. } if reason == "after the failed open"
        )),
        "the run and its later record are in the journal at the path: {:?}",
        support::events(&records)
    );
}

/// After a cut's reconcile, in a home of the pi-subagents layout: pi-subagents' own readers
/// (its status reader, its stale-run reconciler, its session's result lookup and its run
/// listings) read every run the journal holds, each as the journal has it, list each, and
/// repair none (no file under the runs' and results' directories changes). Returns the runs
/// read.
fn check_pi_readers(install: &Path, home: &Home, seed: u64) -> usize {
    let expected: BTreeMap<String, String> = {
        let journal = JournalReader::open(home.journal_path()).expect("the journal opens");
        let view = journal.view().expect("a read view");
        view.all_runs()
            .expect("the runs")
            .into_iter()
            .map(|run| {
                let state = view.snapshot(run).expect("a snapshot").expect("the run");
                (run.to_string(), state.status.as_str().to_string())
            })
            .collect()
    };
    let mut before = BTreeMap::new();
    files_under(&home.runs_dir(), &mut before);
    files_under(&home.results_dir(), &mut before);
    let report = read_with_pi_subagents(
        install,
        &[("PI_SUBAGENTS_TEMP_ROOT", home.root())],
        &["--read", PI_SESSION],
    );
    let mut after = BTreeMap::new();
    files_under(&home.runs_dir(), &mut after);
    files_under(&home.results_dir(), &mut after);
    let changed = changed_files(&before, &after);
    assert!(
        changed.is_empty(),
        "seed {seed}: pi-subagents' readers changed files, so they repaired something: {changed:?}"
    );
    let runs = report["runs"].as_object().expect("the readers' runs");
    assert_eq!(
        runs.keys().collect::<Vec<_>>(),
        expected.keys().collect::<Vec<_>>(),
        "seed {seed}: pi-subagents sees as runs exactly the journal's runs"
    );
    for (run, state) in &expected {
        let seen = &runs[run.as_str()];
        assert_eq!(
            seen["read"]["runId"],
            run.as_str(),
            "seed {seed}: pi-subagents reads run {run}: {seen}"
        );
        assert_eq!(
            seen["read"]["state"],
            state.as_str(),
            "seed {seed}: run {run}: {seen}"
        );
        assert_eq!(
            seen["read"]["sessionId"], PI_SESSION,
            "seed {seed}: run {run}: {seen}"
        );
        assert_eq!(
            seen["repaired"], false,
            "seed {seed}: run {run} was repaired: {seen}"
        );
        assert_eq!(
            seen["reconciledState"],
            state.as_str(),
            "seed {seed}: run {run}: {seen}"
        );
        let result = home.result_path(run.parse().expect("a run id"));
        assert_eq!(
            seen["resultPath"],
            result.display().to_string(),
            "seed {seed}: run {run}: the session's result index leads to its result: {seen}"
        );
        assert_eq!(
            seen["result"]["state"],
            state.as_str(),
            "seed {seed}: run {run}: the result says how it ended: {seen}"
        );
    }
    for listing in ["default", "session", "repairScan"] {
        let listed: BTreeMap<String, String> = report["listed"][listing]
            .as_array()
            .unwrap_or_else(|| {
                panic!(
                    "seed {seed}: listing {listing}: {}",
                    report["listed"][listing]
                )
            })
            .iter()
            .map(|run| {
                (
                    run["id"].as_str().expect("id").to_string(),
                    run["state"].as_str().expect("state").to_string(),
                )
            })
            .collect();
        assert_eq!(
            listed, expected,
            "seed {seed}: pi-subagents' {listing} listing"
        );
    }
    expected.len()
}

/// fsyncs every regular file and directory under `dir`, and `dir`'s parent: what is there
/// now is what a cut keeps.
fn sync_tree(dir: &Path) {
    fn walk(dir: &Path) {
        for entry in std::fs::read_dir(dir).expect("the directory reads") {
            let entry = entry.expect("an entry");
            let kind = entry.file_type().expect("its type");
            if kind.is_dir() {
                walk(&entry.path());
            } else if kind.is_file() {
                std::fs::File::open(entry.path())
                    .and_then(|file| file.sync_all())
                    .expect("the file syncs");
            }
        }
        std::fs::File::open(dir)
            .and_then(|file| file.sync_all())
            .expect("the directory syncs");
    }
    walk(dir);
    if let Some(parent) = dir.parent() {
        std::fs::File::open(parent)
            .and_then(|file| file.sync_all())
            .expect("the parent syncs");
    }
}

/// Every run's records in the journal at `home`, once each run's events.jsonl holds as many
/// record lines as the journal holds records, the same in two looks 200 ms apart: a process
/// that committed a record (a reconcile pass a command made, say) projects it after its commit,
/// and recover rebuilds from the projections. Past a bound of 30 s, the last look.
fn settled_truth(home: &Home) -> BTreeMap<RunId, Vec<runjournal::event::Record>> {
    let look = || -> BTreeMap<RunId, Vec<runjournal::event::Record>> {
        let journal = JournalReader::open(home.journal_path()).expect("the journal opens");
        let view = journal.view().expect("a read view");
        view.all_runs()
            .expect("the runs")
            .into_iter()
            .map(|run| (run, view.records(run).expect("records")))
            .collect()
    };
    let is_projected = |truth: &BTreeMap<RunId, Vec<runjournal::event::Record>>| {
        truth.iter().all(|(run, records)| {
            std::fs::read_to_string(home.events_path(*run)).is_ok_and(|text| {
                text.lines().filter(|line| !line.trim().is_empty()).count() == records.len()
            })
        })
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut truth = look();
    loop {
        std::thread::sleep(Duration::from_millis(200));
        let again = look();
        if (again == truth && is_projected(&again)) || Instant::now() >= deadline {
            return again;
        }
        truth = again;
    }
}

/// `journal-tools recover --from-projections` under a cut, on the home after its disk's last
/// cut and checks (nothing is checked of it afterwards): with every file of the home synced,
/// its journal is lost (removed, cut to half its length, or zero-filled, durably), and
/// `recover` rebuilds it while the disk is cut at a random moment (or not at all). What the
/// design promises is checked:
///
/// * a `recover` that returned is durable: the rebuilt journal is there after the cut, and a
///   lost file that was not missing is kept aside;
/// * cut short, it leaves either the rebuilt journal or the lost one, and runs again;
/// * every run is rebuilt with every record as it was (run id, seq, time, writer, writer seq,
///   event); after a reconcile, `verify` finds nothing and, in the pi-subagents layout,
///   pi-subagents' readers read every run.
///
/// Returns what happened.
fn check_recover(
    disk: &mut LazyDisk,
    home: &Home,
    rng: &mut StdRng,
    pi_install: Option<&Path>,
    seed: u64,
) -> &'static str {
    // The truth: every run's records before the journal is lost, once every one of them is in
    // its run's events.jsonl (what recover rebuilds from).
    let truth = settled_truth(home);
    let journal_path = home.journal_path();
    let damage = match rng.random_range(0..3) {
        0 => {
            std::fs::remove_file(&journal_path).expect("the journal removed");
            "removed"
        }
        1 => {
            let len = std::fs::metadata(&journal_path).expect("the journal").len();
            std::fs::OpenOptions::new()
                .write(true)
                .open(&journal_path)
                .and_then(|file| file.set_len(len / 2))
                .expect("the journal cut short");
            "cut short"
        }
        _ => {
            let len = std::fs::metadata(&journal_path).expect("the journal").len();
            let zeros = vec![0u8; usize::try_from(len).expect("a length")];
            std::fs::write(&journal_path, zeros).expect("the journal zero-filled");
            "zero-filled"
        }
    };
    // Only the journal is lost: the runs' files are whole and durable.
    sync_tree(home.root());
    let delay = rng
        .random_bool(0.8)
        .then(|| Duration::from_millis(rng.random_range(0..1500)));
    let tear = if rng.random_bool(0.5) {
        Tear::Sectors(rng.random_range(1..16))
    } else {
        Tear::None
    };
    let worker = std::thread::spawn({
        let home = home.clone();
        move || runjournal::recover::recover_from_projections(&home)
    });
    if let Some(delay) = delay {
        std::thread::sleep(delay);
        disk.cut(tear);
    }
    let first = worker.join().expect("recover does not panic");
    disk.remount().expect("the disk mounts again");
    // The lost file is missing, truncated or zero-filled to `examine`; the rebuilt one is a
    // whole database. (Like any journal open at a cut, it may need redb's repair, which the
    // first read-write open makes: a read-only open refuses it until then.)
    let found = runjournal::journal::examine(&journal_path).expect("the journal examined");
    let is_rebuilt = found == runjournal::journal::FileFinding::Plausible;
    if let Ok(recovery) = &first {
        assert!(
            is_rebuilt,
            "seed {seed}: recover returned ({damage}, cut after {delay:?}, {tear:?}), and its journal is not there after the cut: {found:?}"
        );
        assert!(
            recovery.unrecoverable.is_empty(),
            "seed {seed}: runs recover could not rebuild: {:?}",
            recovery.unrecoverable
        );
    }
    let what = if is_rebuilt {
        if first.is_ok() {
            "rebuilt"
        } else {
            "cut short, the rebuilt journal in place"
        }
    } else {
        let again = runjournal::recover::recover_from_projections(home).unwrap_or_else(|error| {
            panic!("seed {seed}: recover again after a cut mid-way ({first:?}): {error}")
        });
        assert!(
            again.unrecoverable.is_empty(),
            "seed {seed}: runs recover could not rebuild after a cut mid-way: {:?}",
            again.unrecoverable
        );
        "cut short, run again"
    };
    if damage != "removed" {
        let kept_aside = std::fs::read_dir(home.state_dir())
            .expect("the state directory")
            .filter_map(Result::ok)
            .any(|entry| {
                entry
                    .file_name()
                    .to_string_lossy()
                    .starts_with("journal.redb.lost-")
            });
        assert!(
            kept_aside,
            "seed {seed}: the lost journal ({damage}) is kept aside ({what}, first {first:?}); the state directory holds {:?}",
            std::fs::read_dir(home.state_dir()).map(|entries| entries
                .filter_map(Result::ok)
                .map(|entry| entry.file_name())
                .collect::<Vec<_>>())
        );
    }
    // The files recover wrote again, cut short perhaps: the reconciler remakes them.
    let output = Command::new(bin_path())
        .arg("--home")
        .arg(home.root())
        .args(layout_args(home))
        .arg("reconcile")
        .env_remove("RUNJOURNAL_HOME")
        .env_remove("RUNJOURNAL_LAYOUT")
        .stdin(Stdio::null())
        .output()
        .expect("reconcile runs");
    assert!(
        exited_zero(output.status),
        "seed {seed}: reconcile after recover: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    {
        let journal = Journal::open(&journal_path).expect("the rebuilt journal opens");
        let view = journal.view().expect("a read view");
        let rebuilt = support::check_journal(&view, Some(home));
        let rebuilt: BTreeMap<RunId, Vec<runjournal::event::Record>> = rebuilt
            .into_iter()
            .map(|(state, records)| (state.run_id, records))
            .collect();
        assert_eq!(
            rebuilt.keys().collect::<Vec<_>>(),
            truth.keys().collect::<Vec<_>>(),
            "seed {seed}: recover ({damage}, {what}) rebuilt every run"
        );
        for (run, records) in &truth {
            let rebuilt = rebuilt.get(run).expect("rebuilt");
            assert_eq!(
                rebuilt.get(..records.len()),
                Some(&records[..]),
                "seed {seed}: recover ({damage}, {what}) rebuilt run {run}'s records as they were"
            );
            // What recover promises is the records: the pass after it may close a run the
            // truth left unclosed (a run stopped before it ever started, or whose runner ended
            // unobserved), and nothing else.
            let closing = &rebuilt[records.len()..];
            let was_closed = {
                let mut state = None;
                for record in records {
                    state = Some(
                        runjournal::state::apply(state.as_ref(), record)
                            .expect("the truth's records apply"),
                    );
                }
                state.is_some_and(|state| state.is_closed())
            };
            assert!(
                closing.is_empty()
                    || (!was_closed
                        && closing.iter().all(|record| matches!(
                            record.event,
                            runjournal::event::Event::ProcessTerminalObserved { .. }
                                | runjournal::event::Event::Terminal { .. }
                        ))),
                "seed {seed}: recover ({damage}, {what}) rebuilt run {run} with records the \
                 truth did not hold, beyond the pass that closes it: {closing:?} after {records:?}"
            );
        }
    }
    if let (Some(install), Layout::PiSubagents) = (pi_install, home.layout()) {
        check_pi_readers(install, home, seed);
    }
    what
}

fn bin_path() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_runjournal"))
}
