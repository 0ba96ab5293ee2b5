//! Host-wide throughput of many processes: runner-like processes, each with a
//! journal handle of its own and one appender, making durable transitions at once. Their
//! commits are shared through the journal's commit leader (one of them); for comparison the
//! same processes commit alone (`RUNJOURNAL_COMMIT_SHARING=off`), and one process with one
//! appender is the baseline, all measured in the same rounds.
//!
//! The processes are this benchmark binary itself, started again with `CHILD_ENV` set (see
//! [`child_main_if_asked`]), each in a session of its own, as runners are. Each opens the journal, creates a run whose external-job step is
//! running, says `ready`, then for each line `<n>` on its stdin makes `n` transitions
//! (`ExternalJobUpdated`, as `transition/runjournal-*` do) and answers `done <cpu-ns>`: its
//! CPU time so far, so that the CPU of all processes per transition is reported too.

use std::cell::RefCell;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::rc::Rc;
use std::time::{Duration, Instant};

use runjournal::journal::{CommitSharing, Condition, Location, WriterOptions};
use runjournal::{Journal, RunId};

use crate::fixture;

const CHILD_ENV: &str = "RUNJOURNAL_BENCH_APPENDER";

/// The processes of each workload, and whether they share commits.
pub const WAYS: [(&str, usize, CommitSharing); 4] = [
    ("1-process", 1, CommitSharing::Shared),
    ("16-processes", 16, CommitSharing::Shared),
    ("64-processes", 64, CommitSharing::Shared),
    ("64-processes-alone", 64, CommitSharing::Alone),
];

/// If this process was started as an appender, runs it and returns `true`.
pub fn child_main_if_asked() -> bool {
    let Ok(journal) = std::env::var(CHILD_ENV) else {
        return false;
    };
    // Runner-like: a session of its own, without a terminal (so it may lead, as a runner does).
    let _ = nix::unistd::setsid();
    let sharing = CommitSharing::from_env().expect("RUNJOURNAL_COMMIT_SHARING is a sharing mode");
    let options = WriterOptions {
        commit_sharing: sharing,
        ..WriterOptions::default()
    };
    let journal = Journal::open_with(Location::Path(PathBuf::from(journal)), options)
        .expect("an appender opens the journal");
    let run = RunId::generate();
    let identity = runjournal::liveness::current().expect("an identity");
    journal
        .append(
            run,
            vec![
                fixture::created(fixture::job_spec()),
                fixture::runner_started(identity),
                fixture::step_running(None),
            ],
            Condition::expect_head(0),
        )
        .expect("a running run");
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "ready").expect("the parent reads");
    stdout.flush().expect("the parent reads");
    let mut progress = 0u32;
    for line in std::io::stdin().lock().lines() {
        let count: u64 = line.expect("the parent writes").parse().expect("a count");
        for _ in 0..count {
            progress = progress.wrapping_add(1);
            journal
                .append(run, vec![fixture::job_update(progress)], Condition::none())
                .expect("a job update is acknowledged");
        }
        writeln!(stdout, "done {}", cpu_ns()).expect("the parent reads");
        stdout.flush().expect("the parent reads");
    }
    true
}

/// CPU time of this process so far (user + system, all threads), in nanoseconds.
fn cpu_ns() -> u64 {
    use nix::sys::resource::{UsageWho, getrusage};
    let usage = getrusage(UsageWho::RUSAGE_SELF).expect("getrusage of this process");
    let ns = |time: nix::sys::time::TimeVal| {
        time.tv_sec() as u64 * 1_000_000_000 + time.tv_usec() as u64 * 1_000
    };
    ns(usage.user_time()) + ns(usage.system_time())
}

struct Appender {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    cpu_ns: u64,
}

/// Processes appending to one journal, started once and kept between rounds.
pub struct Fleet {
    appenders: Vec<Appender>,
    /// CPU of all the processes per transition, one figure per call.
    pub cpu_per_transition_ns: Rc<RefCell<Vec<f64>>>,
}

impl Fleet {
    /// Starts `count` appenders on a new journal in `dir`, and waits until each is ready.
    pub fn start(dir: &Path, count: usize, sharing: CommitSharing) -> Fleet {
        std::fs::create_dir_all(dir).expect("a journal directory");
        let journal = dir.join("journal.redb");
        drop(Journal::open(&journal).expect("the journal is made"));
        let me = std::env::current_exe().expect("the benchmark binary");
        let sharing = sharing.as_env_value();
        let mut appenders: Vec<Appender> = (0..count)
            .map(|_| {
                let mut child = Command::new(&me)
                    .env(CHILD_ENV, &journal)
                    .env(CommitSharing::ENV, sharing)
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .spawn()
                    .expect("an appender starts");
                let stdin = child.stdin.take().expect("piped");
                let stdout = BufReader::new(child.stdout.take().expect("piped"));
                Appender {
                    child,
                    stdin,
                    stdout,
                    cpu_ns: 0,
                }
            })
            .collect();
        for appender in &mut appenders {
            let mut line = String::new();
            appender.stdout.read_line(&mut line).expect("ready");
            assert_eq!(line.trim(), "ready", "an appender is ready");
        }
        Fleet {
            appenders,
            cpu_per_transition_ns: Rc::default(),
        }
    }

    /// Makes `iters` transitions spread over every process, all started together; returns
    /// the time they took, scaled to exactly `iters`.
    pub fn transitions(&mut self, iters: u64) -> Duration {
        let count = self.appenders.len() as u64;
        let each = iters.div_ceil(count).max(1);
        let started = Instant::now();
        for appender in &mut self.appenders {
            writeln!(appender.stdin, "{each}").expect("an appender reads");
            appender.stdin.flush().expect("an appender reads");
        }
        let mut cpu_ns = 0u64;
        for appender in &mut self.appenders {
            let mut line = String::new();
            appender.stdout.read_line(&mut line).expect("done");
            let total: u64 = line
                .trim()
                .strip_prefix("done ")
                .and_then(|cpu| cpu.parse().ok())
                .expect("done <cpu-ns>");
            cpu_ns += total - appender.cpu_ns;
            appender.cpu_ns = total;
        }
        let elapsed = started.elapsed();
        let made = each * count;
        self.cpu_per_transition_ns
            .borrow_mut()
            .push(cpu_ns as f64 / made as f64);
        elapsed.mul_f64(iters as f64 / made as f64)
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for appender in &mut self.appenders {
            // Closing stdin ends the appender's loop; it drops its journal and exits.
            let _ = appender.stdin.flush();
        }
        let appenders = std::mem::take(&mut self.appenders);
        for Appender {
            mut child, stdin, ..
        } in appenders
        {
            drop(stdin);
            let _ = child.wait();
        }
    }
}

/// Each workload's CPU per transition, one figure per call, by workload id.
pub type CpuFigures = Vec<(String, Rc<RefCell<Vec<f64>>>)>;

/// The workloads of the `processes` group, and the CPU each measured per transition.
pub fn ways(scratch: &Path) -> (Vec<crate::Way<'static>>, CpuFigures) {
    let mut ways: Vec<crate::Way<'static>> = Vec::new();
    let mut cpu = Vec::new();
    for (id, count, sharing) in WAYS {
        let mut fleet = Fleet::start(&scratch.join(format!("processes-{id}")), count, sharing);
        cpu.push((id.to_string(), Rc::clone(&fleet.cpu_per_transition_ns)));
        ways.push((
            id.to_string(),
            Box::new(move |iters| fleet.transitions(iters)),
        ));
    }
    (ways, cpu)
}
