//! A stopped process costs the others a bound, and nobody is told a lie, with the real
//! binaries: a runner stopped (SIGSTOP) while it holds the journal's write lock, under a load
//! of launches and reading commands; a leader stopped while idle; a peer of the commit socket
//! that sends one byte and stalls. Every child process here has a generous timeout, so that a
//! hang fails the test instead of hanging it; no wall-clock time is asserted but as a generous
//! bound on a wait.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::support::{TestHome, run_id_of, state, wait_for, wait_terminal};
use runjournal::RunId;
use runjournal::state::RunStatus;

/// How long any child process of these tests may take before it is killed and the test fails.
const CHILD_BOUND: Duration = Duration::from_secs(90);

/// The exit code of a command that gave up without knowing whether its write landed.
const EXIT_UNKNOWN: i32 = 3;

/// Polls `done` until it holds; panics after a generous bound.
fn poll(what: &str, done: impl Fn() -> bool) {
    for _ in 0..1200 {
        if done() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("gave up waiting for {what}");
}

/// `/proc/<pid>/stat`'s state letter.
fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// The pid the commit lock names: the journal's leader (for people and tests).
fn leader_pid(home: &TestHome) -> Option<u32> {
    std::fs::read_to_string(home.file("journal.redb.commit.lock"))
        .ok()
        .and_then(|text| text.trim().parse().ok())
}

/// Continues `pid` when dropped, so that a failing test leaves no stopped process behind.
struct Continue(u32);

impl Continue {
    fn now(&self) {
        let _ = kill(Pid::from_raw(self.0 as i32), Signal::SIGCONT);
    }
}

impl Drop for Continue {
    fn drop(&mut self) {
        self.now();
    }
}

fn run(home: &TestHome, envs: &[(&str, &str)], args: &[&str]) -> Output {
    let mut command = home.cmd();
    for (key, value) in envs {
        command.env(key, value);
    }
    command
        .args(args)
        .timeout(CHILD_BOUND)
        .output()
        .expect("runs")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The run an `unknown` message names: `run <ID>: unknown: check with ...`.
fn unknown_run(output: &Output) -> RunId {
    let text = stderr(output);
    let (_, rest) = text
        .split_once("run ")
        .unwrap_or_else(|| panic!("names a run: {text}"));
    let id = rest.split(':').next().expect("an id");
    assert!(
        rest.contains(": unknown: check with `runjournal status "),
        "says it is unknown and how to check: {text}"
    );
    id.parse().unwrap_or_else(|_| panic!("a run id in {text}"))
}

/// Lines in `path`, a file each run of a step appends a line to; 0 if it was never made.
fn runs_of(path: &Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |text| text.lines().count())
}

/// The reading commands answer while `holder` keeps the write lock: each within its bound,
/// saying once who holds the lock.
fn reading_commands_answer(home: &TestHome, run: RunId, holder: u32) {
    let id = run.to_string();
    for (args, code) in [
        (vec!["wait", "--timeout", "1s", &id], 75),
        (vec!["status", &id], 0),
        (vec!["logs", &id], 0),
        (vec!["list"], 0),
        (vec!["status", "--json", &id], 0),
        (vec!["list", "--json", "--all"], 0),
    ] {
        let output = run_cmd(home, &args);
        assert_eq!(output.status.code(), Some(code), "{args:?}: {output:?}");
        let text = stderr(&output);
        // `logs` makes no pass before it reads, and reads at once.
        let notices = usize::from(args[0] != "logs");
        assert_eq!(
            text.matches(&format!("held by process {holder}")).count(),
            notices,
            "{args:?} says once who holds the lock, that its passes were skipped: {text}"
        );
        assert_eq!(text.matches("skipped").count(), notices, "{args:?}: {text}");
    }
    let listed = run_cmd(home, &["list", "--json", "--all"]);
    assert!(
        String::from_utf8_lossy(&listed.stdout).contains(&id),
        "list shows the run: {listed:?}"
    );
}

fn run_cmd(home: &TestHome, args: &[&str]) -> Output {
    run(home, &[], args)
}

/// The measured lie: a runner stopped inside the commit of its `RunnerStarted` holds the
/// journal's write lock; its launcher, which waits for that record, gives up, and cannot
/// record that it gave up. It used to exit 1 saying nothing was written, and the run then ran
/// once the runner went on: a script retrying on that exit ran its command twice. Now it says
/// the run's fate is unknown, names the run and exits 3; the reading commands answer
/// meanwhile, and launches that found the lock held say so, with nothing written; once the
/// runner goes on, the run runs exactly once.
#[test]
fn a_runner_stopped_with_the_write_lock_before_taking_its_run_leaves_its_launcher_unknown_not_lying()
 {
    let home = TestHome::new();
    // A handle of the test's own, opened now: opening takes the write lock for a moment.
    let journal = home.journal();
    let hook = home.input("stop-in-commit");
    // The launcher's commit of the run passes; the next, its runner's RunnerStarted, stops.
    std::fs::write(&hook, "1").expect("arm the hook");
    let ran = home.input("ran");
    let step = format!("echo ran >> {}", ran.display());
    let launcher = {
        let mut command = home.cmd();
        command
            .env("RUNJOURNAL_TEST_STOP_IN_COMMIT", &hook)
            .env("RUNJOURNAL_LOCK_TIMEOUT", "3s")
            .args(["run", "--json", "--step", &step])
            .timeout(CHILD_BOUND);
        std::thread::spawn(move || command.output().expect("runs"))
    };
    poll("a runner to stop inside its commit", || !hook.exists());
    let created: Vec<RunId> = journal
        .view()
        .expect("view")
        .active_runs()
        .expect("active runs");
    assert_eq!(created.len(), 1, "the launcher created its run");
    let run = created[0];
    poll("the runner to be stopped", || {
        leader_pid(&home).is_some_and(|pid| process_state(pid) == Some('T'))
    });
    let runner = leader_pid(&home).expect("the runner leads");
    let runner = Continue(runner);

    // A launch load meanwhile: each finds the lock held, says by whom, and writes nothing.
    let load: Vec<_> = (0..3)
        .map(|index| {
            let mut command = home.cmd();
            command
                .env("RUNJOURNAL_LOCK_TIMEOUT", "3s")
                .args(["run", "--json", "--step"])
                .arg(format!("echo {index} >> {}", ran.display()))
                .timeout(CHILD_BOUND);
            std::thread::spawn(move || command.output().expect("runs"))
        })
        .collect();
    reading_commands_answer(&home, run, runner.0);
    for launch in load {
        let output = launch.join().expect("a launch");
        assert_eq!(output.status.code(), Some(1), "{output:?}");
        assert!(
            stderr(&output).contains(&format!("held by process {}", runner.0)),
            "names the holder: {output:?}"
        );
    }
    let output = launcher.join().expect("the launcher");
    assert_eq!(output.status.code(), Some(EXIT_UNKNOWN), "{output:?}");
    assert_eq!(unknown_run(&output), run, "names its run");
    assert!(
        !stderr(&output).contains("nothing was written"),
        "never says nothing was written of a run it created: {output:?}"
    );
    assert_eq!(
        journal.view().expect("view").run_count().expect("runs"),
        1,
        "the launches that found the lock held wrote nothing"
    );
    assert_eq!(process_state(runner.0), Some('T'), "still stopped");

    // Going on, the runner takes the run and runs its step once.
    runner.now();
    let ended = wait_terminal(&journal, run);
    assert_eq!(ended.status, RunStatus::Complete, "{ended:?}");
    assert_eq!(runs_of(&ran), 1, "the step ran exactly once");
    let names = crate::support::event_names(&crate::support::records(&journal, run));
    assert_eq!(
        names.iter().filter(|name| **name == "Terminal").count(),
        1,
        "one end, the runner's: {names:?}"
    );
}

/// Launches the runner of a leading run whose step sleeps, with the stop hook in its
/// environment, and waits until it leads and its step runs: idle, it has no commit to make.
/// Returns the run and the runner's pid.
fn leading_runner(home: &TestHome, hook: &Path, seconds: u32) -> (RunId, u32) {
    let mut command = home.cmd();
    command
        .env("RUNJOURNAL_TEST_STOP_IN_COMMIT", hook)
        .args(["run", "--json", "--step"])
        .arg(format!("sleep {seconds}"))
        .timeout(CHILD_BOUND);
    let output = command.output().expect("runs");
    assert!(output.status.success(), "{output:?}");
    let run = run_id_of(&output.stdout);
    let journal = home.journal();
    let state = wait_for(&journal, run, "the step to run", |state| {
        state.status == RunStatus::Running
            && state
                .steps
                .iter()
                .any(|step| step.status == runjournal::state::StepStatus::Running)
    });
    let pid = state.runner.expect("a runner").identity.pid;
    poll("the runner to lead", || leader_pid(home) == Some(pid));
    (run, pid)
}

/// A launch whose creation was handed to the commit leader, which then stopped inside the
/// commit holding it: the launcher cannot know whether its run will be created. It says so,
/// names the run and exits 3; once the leader goes on, the run is created and never run (no
/// launcher started its runner), and the reconciler ends it: its command ran at most once
/// (here not at all), so a script that checks before retrying runs it once.
#[test]
fn a_launch_handed_to_a_leader_stopped_inside_its_commit_is_unknown_and_lands_once() {
    let home = TestHome::new();
    let hook = home.input("stop-in-commit");
    let (first, leader) = leading_runner(&home, &hook, 60);
    let journal = home.journal();
    // The leader's next commit, the launch's creation, stops it holding the lock.
    std::fs::write(&hook, "").expect("arm the hook");
    let ran = home.input("ran");
    let output = run(
        &home,
        &[("RUNJOURNAL_LOCK_TIMEOUT", "3s")],
        &[
            "run",
            "--json",
            "--step",
            &format!("echo ran >> {}", ran.display()),
        ],
    );
    let leader = Continue(leader);
    assert!(!hook.exists(), "the leader took the launch's creation");
    assert_eq!(output.status.code(), Some(EXIT_UNKNOWN), "{output:?}");
    let launched = unknown_run(&output);
    assert!(
        stderr(&output).contains(&format!("held by process {}", leader.0)),
        "names the holder: {output:?}"
    );
    assert_eq!(process_state(leader.0), Some('T'));
    assert!(
        journal
            .view()
            .expect("view")
            .snapshot(launched)
            .expect("reads")
            .is_none(),
        "not created while the leader is stopped"
    );
    reading_commands_answer(&home, first, leader.0);

    leader.now();
    // The stopped commit lands once the leader goes on: the creation with it.
    poll("the run to be created", || {
        journal
            .view()
            .expect("view")
            .snapshot(launched)
            .expect("reads")
            .is_some()
    });
    assert!(
        state(&journal, launched).runner.is_none(),
        "no runner took it"
    );
    let output = run_cmd(&home, &["stop", &first.to_string()]);
    assert!(output.status.success(), "{output:?}");
    assert_eq!(wait_terminal(&journal, first).status, RunStatus::Stopped);
    // Past the start grace, a reconcile pass ends it, never started.
    let ended = {
        let deadline = Instant::now() + CHILD_BOUND;
        loop {
            let output = run_cmd(&home, &["reconcile"]);
            assert!(output.status.success(), "{output:?}");
            let state = state(&journal, launched);
            if state.is_terminal() {
                break state;
            }
            assert!(Instant::now() < deadline, "never reconciled: {state:?}");
            std::thread::sleep(Duration::from_millis(500));
        }
    };
    assert_eq!(ended.status, RunStatus::Failed, "{ended:?}");
    assert_eq!(runs_of(&ran), 0, "its command never ran");
    for run in [first, launched] {
        let records = crate::support::records(&journal, run);
        let seqs: Vec<u64> = records.iter().map(|record| record.seq).collect();
        assert_eq!(
            seqs,
            (1..=records.len() as u64).collect::<Vec<_>>(),
            "gap-free and once"
        );
    }
}

/// A leader stopped while idle used to cost every new process its timeout twice (two handles
/// each waited for it): nobody took the lead over while it held the commit lock. Now the first
/// waiter takes the lead over, and the processes after it do not wait for the stopped one:
/// ten launches in a row take less than ten leader timeouts together (they took twenty).
#[test]
fn a_stopped_idle_leader_costs_only_the_first_waiter_its_timeout() {
    let home = TestHome::new();
    let hook = home.input("unused-hook");
    let (first, leader) = leading_runner(&home, &hook, 60);
    let journal = home.journal();
    kill(Pid::from_raw(leader as i32), Signal::SIGSTOP).expect("SIGSTOP");
    let leader = Continue(leader);
    poll("the leader to stop", || {
        process_state(leader.0) == Some('T')
    });
    let timeout = Duration::from_secs(5);
    let started = Instant::now();
    let mut launched = Vec::new();
    for _ in 0..10 {
        let output = run(
            &home,
            &[("RUNJOURNAL_LEADER_TIMEOUT", "5s")],
            &["run", "--json", "--", "true"],
        );
        assert!(output.status.success(), "{output:?}");
        launched.push(run_id_of(&output.stdout));
    }
    let took = started.elapsed();
    assert!(
        took < timeout * 10,
        "ten launches took {took:?}, not less than ten leader timeouts of {timeout:?}"
    );
    assert_ne!(
        leader_pid(&home),
        Some(leader.0),
        "the lead was taken from the stopped leader"
    );
    assert_eq!(process_state(leader.0), Some('T'), "which is still stopped");
    for run in launched {
        assert_eq!(wait_terminal(&journal, run).status, RunStatus::Complete);
    }
    // Going on, the deposed leader serves nobody, and its own run goes on to its end.
    leader.now();
    let output = run(&home, &[], &["stop", &first.to_string()]);
    assert!(output.status.success(), "{output:?}");
    assert_eq!(wait_terminal(&journal, first).status, RunStatus::Stopped);
}

/// A peer of the commit socket that sends one byte of a frame and stalls hung `run` and `stop`
/// for good: the rest of a frame was read with no timeout. Both sides read each frame within a
/// deadline now: a peer that connects to the leader and stalls costs only its own connection,
/// and one that poses as the leader and stalls mid-answer is left after the leader timeout.
#[test]
fn a_socket_peer_that_sends_one_byte_and_stalls_holds_up_no_run_or_stop() {
    use std::io::{Read, Write};
    use std::os::unix::net::{UnixListener, UnixStream};
    let home = TestHome::new();
    let hook = home.input("unused-hook");
    let (first, _leader) = leading_runner(&home, &hook, 60);
    let journal = home.journal();
    let socket = home.file("journal.redb.commit.sock");
    // A client of the leader's that sends one byte and sleeps.
    let mut stalled = UnixStream::connect(&socket).expect("connects to the leader");
    stalled.write_all(&[1]).expect("one byte");
    let output = run(&home, &[], &["run", "--wait", "--", "true"]);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let output = run(&home, &[], &["stop", &first.to_string()]);
    assert!(output.status.success(), "{output:?}");
    assert_eq!(wait_terminal(&journal, first).status, RunStatus::Stopped);
    drop(stalled);
    poll("the leader to let the lock go", || {
        runjournal::durable_fs::FileLock::try_acquire(&home.file("journal.redb.commit.lock"))
            .is_ok_and(|lock| lock.is_some())
    });

    // A process of this user that listens where the leader would (nobody leads now),
    // answers a hello with one byte and stalls.
    let _ = std::fs::remove_file(&socket);
    let squatter = UnixListener::bind(&socket).expect("binds");
    let (done, is_done) = std::sync::mpsc::channel::<()>();
    let posing = std::thread::spawn(move || {
        squatter.set_nonblocking(true).expect("nonblocking");
        let mut held = Vec::new();
        while is_done.try_recv() == Err(std::sync::mpsc::TryRecvError::Empty) {
            match squatter.accept() {
                Ok((mut stream, _)) => {
                    let mut hello = [0u8; 64];
                    let _ = stream.read(&mut hello);
                    let _ = stream.write_all(&[1]);
                    held.push(stream);
                }
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
        held.len()
    });
    let output = run(
        &home,
        &[("RUNJOURNAL_LEADER_TIMEOUT", "1s")],
        &["run", "--json", "--", "sleep", "30"],
    );
    assert!(output.status.success(), "{output:?}");
    let second = run_id_of(&output.stdout);
    let output = run(
        &home,
        &[("RUNJOURNAL_LEADER_TIMEOUT", "1s")],
        &["stop", &second.to_string()],
    );
    assert!(output.status.success(), "{output:?}");
    assert_eq!(wait_terminal(&journal, second).status, RunStatus::Stopped);
    drop(done);
    let met = posing.join().expect("the squatter");
    assert!(met >= 1, "a client met the squatter and left it");
}

/// A runner whose transition cannot be recorded for its bound (its I/O retry window) while a
/// stopped process keeps the write lock does not wait for good: it says in runner.log what it
/// waits for, and for how long at most, then ends its step's group, says why, and exits; once
/// the lock is let go, the reconciler fails the run.
#[test]
fn a_runner_blocked_on_the_write_lock_past_its_bound_ends_its_steps_and_exits() {
    let home = TestHome::new();
    let hook = home.input("stop-in-commit");
    let (first, leader) = leading_runner(&home, &hook, 30);
    let journal = home.journal();
    // Another runner, whose step ends soon; its bound is short.
    let output = run(
        &home,
        &[("RUNJOURNAL_IO_RETRY_WINDOW", "4s")],
        &["run", "--json", "--step", "sleep 6"],
    );
    assert!(output.status.success(), "{output:?}");
    let blocked = run_id_of(&output.stdout);
    // Every commit of its start has landed, so the leader's next commit is the interrupt's.
    let runner = wait_for(&journal, blocked, "its step to run", |state| {
        state.status == RunStatus::Running
            && state.runner.is_some()
            && state
                .steps
                .iter()
                .any(|step| step.status == runjournal::state::StepStatus::Running)
    })
    .runner
    .expect("a runner")
    .identity
    .pid;
    // The leader's next commit stops it holding the lock: interrupt its run, which it records.
    std::fs::write(&hook, "").expect("arm the hook");
    let leader = Continue(leader);
    let output = run(
        &home,
        &[("RUNJOURNAL_LOCK_TIMEOUT", "1s")],
        &["interrupt", &first.to_string()],
    );
    // Handed to the leader, which stopped inside the commit holding it: it may still land.
    assert_eq!(output.status.code(), Some(EXIT_UNKNOWN), "{output:?}");
    assert_eq!(unknown_run(&output), first, "names the run");
    poll("the leader to stop in its commit", || {
        !hook.exists() && process_state(leader.0) == Some('T')
    });
    let log: PathBuf = home
        .path()
        .join("runs")
        .join(blocked.to_string())
        .join("runner.log");
    poll("the blocked runner to exit", || {
        process_state(runner).is_none()
    });
    let text = std::fs::read_to_string(&log).expect("runner.log");
    assert!(
        text.contains("write lock") && text.contains("for at most 4s"),
        "says what it waits for and how long: {text}"
    );
    assert!(
        text.contains(&format!("held by process {}", leader.0)),
        "names the holder: {text}"
    );
    assert_eq!(
        process_state(leader.0),
        Some('T'),
        "it exited before the lock came back"
    );
    leader.now();
    let ended = {
        let deadline = Instant::now() + CHILD_BOUND;
        loop {
            let output = run_cmd(&home, &["reconcile"]);
            assert!(output.status.success(), "{output:?}");
            let state = state(&journal, blocked);
            if state.is_terminal() {
                break state;
            }
            assert!(Instant::now() < deadline, "never reconciled: {state:?}");
            std::thread::sleep(Duration::from_millis(500));
        }
    };
    assert_eq!(ended.status, RunStatus::Failed, "{ended:?}");
}

/// A runner stopped while it holds its run's projection lock (`runs/<id>/.lock`), its
/// `status.json` gone as though the stop caught it writing: every reading and control command,
/// of its run and of another, answers within the projection's bound (each used to wait in
/// `flock` for as long as the runner stayed stopped); those that would have repaired the run's
/// files say who holds them. Once the runner goes on, the stop it was sent ends the run and
/// its files are whole again.
#[test]
fn a_runner_stopped_holding_its_runs_projection_lock_holds_up_no_command() {
    let home = TestHome::new();
    let journal = home.journal();
    // Armed below, once the runner holds nothing but its run's projection lock.
    let hook = home.input("stop-in-heartbeat");
    let stopped = {
        let output = home
            .cmd()
            .env(runjournal::projection::STOP_IN_HEARTBEAT_ENV, &hook)
            .args([
                "run",
                "--json",
                "--heartbeat",
                "100ms",
                "--",
                "sleep",
                "300",
            ])
            .timeout(CHILD_BOUND)
            .output()
            .expect("runs");
        assert!(output.status.success(), "{output:?}");
        run_id_of(&output.stdout)
    };
    let other = crate::support::launch(&home, &["--", "sleep", "300"]);
    poll("both steps to run", || {
        [stopped, other].iter().all(|run| {
            state(&journal, *run).steps[0].status == runjournal::state::StepStatus::Running
        })
    });
    let runner = state(&journal, stopped)
        .runner
        .expect("the runner took its run")
        .identity
        .pid;
    // The runner may lead the home's shared commits, the other launch's among them: stopped
    // inside one, it holds the journal's write lock, and every writer is refused by name after
    // its bound (`a_leader_stopped_inside_a_commit_fails_a_launch_naming_it_and_then_everything
    // _lands_once`), which is not what this test is about. It is stopped only once it holds
    // that lock no more; its step runs, so it commits nothing of its own until the step ends.
    let journal_path = home.file("journal.redb");
    poll("the runner to let the journal's write lock go", || {
        runjournal::platform::journal_write_lock_holder(&journal_path)
            .is_none_or(|(holder, _)| holder != runner)
    });
    std::fs::write(&hook, "").expect("arm the hook");
    poll("the runner to stop in its heartbeat", || !hook.exists());
    poll("the runner to be stopped", || {
        process_state(runner) == Some('T')
    });
    let runner = Continue(runner);
    std::fs::remove_file(home.path().join(format!("runs/{stopped}/status.json")))
        .expect("its status.json, as the stop caught it writing");

    let (stopped_id, other_id) = (stopped.to_string(), other.to_string());
    let named = format!("held by process {}", runner.0);
    for (args, code, names_holder) in [
        (vec!["status", &stopped_id], 0, true),
        (vec!["status", &other_id], 0, true),
        (vec!["list"], 0, true),
        (vec!["list", "--json"], 0, true),
        (vec!["reconcile"], 1, true),
        (vec!["wait", "--timeout", "1s", &stopped_id], 75, false),
        (vec!["logs", &stopped_id], 0, false),
        (vec!["status", "--json", &stopped_id], 0, false),
        (vec!["steer", &other_id, "hello"], 0, false),
        (vec!["steer", &stopped_id, "hello"], 0, false),
        (vec!["stop", &other_id], 0, false),
        (vec!["stop", &stopped_id], 0, false),
    ] {
        let output = run_cmd(&home, &args);
        assert_eq!(output.status.code(), Some(code), "{args:?}: {output:?}");
        // `reconcile` reports run by run on stdout; the others note on stderr.
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            stderr(&output)
        );
        if names_holder {
            assert!(
                said.contains(&named),
                "{args:?} says who holds the run's files: {output:?}"
            );
        }
    }
    assert_eq!(process_state(runner.0), Some('T'), "still stopped");
    assert!(
        !home
            .path()
            .join(format!("runs/{stopped}/status.json"))
            .exists(),
        "nobody wrote the run's files under another's lock"
    );

    // Going on, the runner takes the stop it was sent; the next pass makes its files whole.
    runner.now();
    let ended = wait_terminal(&journal, stopped);
    assert_eq!(ended.status, RunStatus::Stopped, "{ended:?}");
    wait_terminal(&journal, other);
    let output = run_cmd(&home, &["reconcile"]);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let status: serde_json::Value = serde_json::from_slice(
        &std::fs::read(home.path().join(format!("runs/{stopped}/status.json")))
            .expect("status.json is written again"),
    )
    .expect("status.json is JSON");
    assert_eq!(status["state"], "stopped", "{status}");
}
