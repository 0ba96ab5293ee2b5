//! The home's watcher (docs/design.md, "The home's watcher") with the real binaries: with no
//! runjournal command run after the event, a runner SIGKILLed has its run ended (or tried
//! again) by the watcher, its end recorded as seen; and a pi-subagents host's stop for a run
//! waiting for its due time ends that run. The tests read the journal through the library and
//! the layout's files only: nothing they do starts a pass.

use std::path::Path;
use std::time::{Duration, Instant};

use runjournal::event::{Observer, Proof, UnixMs, now_ms};
use runjournal::{RunId, RunState, RunStatus};

use crate::pi_subagents_compat::{pi_subagents, read_with_pi_subagents, runjournal};
use crate::support::{TestHome, launch, records, state};

/// Polls the run, through the library only, until `done` holds; panics after a minute.
fn until(home: &TestHome, run: RunId, what: &str, done: impl Fn(&RunState) -> bool) -> RunState {
    let journal = home.journal();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let found = state(&journal, run);
        if done(&found) {
            return found;
        }
        assert!(
            Instant::now() < deadline,
            "run {run}: no {what} after a minute: {found:#?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until the run's step runs, then until the watcher has looked at the home since: it
/// rewrites its lock file before each look, so two rewrites after the step ran mean a whole
/// look saw the live runner and follows it (a runner killed before the watcher's first look
/// is found dead, not seen to exit, and recorded so by its pass).
fn wait_followed(home: &TestHome, run: RunId) {
    until(home, run, "its step running", |state| {
        state.status == RunStatus::Running && state.steps[0].process.is_some()
    });
    let lock = home.file("timer.lock");
    let stamp = || {
        std::fs::metadata(&lock)
            .and_then(|metadata| metadata.modified())
            .ok()
    };
    let mut seen = stamp();
    for _ in 0..2 {
        let deadline = Instant::now() + Duration::from_secs(60);
        while stamp() == seen {
            assert!(Instant::now() < deadline, "the watcher looks no more");
            std::thread::sleep(Duration::from_millis(10));
        }
        seen = stamp();
    }
}

/// SIGKILLs the run's runner once it runs; the time it did, in ms.
fn kill_runner(home: &TestHome, run: RunId) -> (u32, UnixMs) {
    let running = until(home, run, "runner", |state| {
        state.status == RunStatus::Running && state.steps[0].process.is_some()
    });
    let pid = running.runner.expect("a runner").identity.pid;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(pid).expect("a pid")),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("the runner is killed");
    (pid, now_ms())
}

#[test]
fn a_runner_sigkilled_with_no_command_after_has_its_run_ended_by_the_watcher() {
    let home = TestHome::new();
    let run = launch(&home, &["--", "sleep", "300"]);
    wait_followed(&home, run);
    let (pid, killed_at_ms) = kill_runner(&home, run);
    let ended = until(&home, run, "end", RunState::is_closed);
    assert_eq!(ended.status, RunStatus::Failed, "{ended:#?}");
    let error = ended
        .terminal
        .as_ref()
        .and_then(|terminal| terminal.error.clone())
        .unwrap_or_default();
    assert!(
        error.contains(&pid.to_string()),
        "the end names its runner: {error}"
    );
    // The watcher saw that very process exit, through its handle on it.
    let observed = ended.process_terminal.expect("the runner's end");
    assert_eq!(
        (observed.proof, observed.observer),
        (Proof::Observed, Observer::Watcher)
    );
    let ended_at_ms = ended.terminal.map_or(0, |terminal| terminal.at_ms);
    eprintln!(
        "run ended by the watcher {} ms after its runner was killed",
        ended_at_ms.saturating_sub(killed_at_ms)
    );
    // Its step's group went with it: the pass ends what the dead runner left running (a
    // zombie left to a parent that does not reap is gone all the same).
    let step = ended.steps[0].process.clone().expect("the step's process");
    let alive: Vec<u32> = runjournal::platform::group_members(step.pid)
        .expect("the system's processes read")
        .into_iter()
        .filter(runjournal::platform::ProcessInfo::is_alive)
        .map(|member| member.pid)
        .collect();
    assert!(alive.is_empty(), "the step's group is left: {alive:?}");
}

#[test]
fn a_runner_sigkilled_mid_attempt_is_tried_again_with_no_command_after() {
    let home = TestHome::new();
    let marker = home.input("first-attempt");
    let script = format!(
        "if [ -e '{marker}' ]; then exit 0; fi; touch '{marker}'; sleep 300",
        marker = marker.display()
    );
    let run = launch(
        &home,
        &[
            "--retries",
            "1",
            "--retry-backoff",
            "100ms",
            "--step",
            &script,
        ],
    );
    until(&home, run, "its first attempt", |_| marker.exists());
    wait_followed(&home, run);
    kill_runner(&home, run);
    let ended = until(&home, run, "its second attempt's end", RunState::is_closed);
    assert_eq!(ended.status, RunStatus::Complete, "{ended:#?}");
    let attempts = &ended.retry.as_ref().expect("a retried run").attempts;
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].cause, runjournal::event::AttemptCause::Crash);
    assert_eq!(
        attempts[0]
            .process_terminal
            .as_ref()
            .map(|observed| observed.observer),
        Some(Observer::Watcher)
    );
    let runners = records(&home.journal(), run)
        .iter()
        .filter(|record| record.event.name() == "RunnerStarted")
        .count();
    assert_eq!(runners, 2);
}

/// The pid the home's watcher wrote into its lock file, once it leads.
fn watcher_pid(home: &TestHome) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let note = std::fs::read_to_string(home.file("timer.lock")).unwrap_or_default();
        if let Ok(pid) = note.trim().parse::<u32>() {
            return pid;
        }
        assert!(Instant::now() < deadline, "no watcher leads: {note:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A watcher SIGKILLed changes nothing a command would not do: the next command's upkeep
/// ends the run whose runner died meanwhile, and starts a watcher again for the run still
/// active.
#[test]
fn a_watcher_sigkilled_leaves_the_runs_to_the_next_command_which_starts_another() {
    let home = TestHome::new();
    let run = launch(&home, &["--", "sleep", "300"]);
    let other = launch(&home, &["--", "sleep", "300"]);
    let killed = watcher_pid(&home);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(killed).expect("a pid")),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("the watcher is killed");
    kill_runner(&home, run);
    // The runner's death takes a moment to show: a command's pass before it finds it alive.
    let ended = until(&home, run, "an end by a command", |state| {
        home.cmd().arg("list").assert().success();
        state.is_terminal()
    });
    assert_eq!(ended.status, RunStatus::Failed, "{ended:#?}");
    // Another watcher leads (the killed one's pid is in its lock file until it does).
    let deadline = Instant::now() + Duration::from_secs(60);
    while watcher_pid(&home) == killed {
        assert!(Instant::now() < deadline, "no watcher started again");
        std::thread::sleep(Duration::from_millis(20));
    }
    home.cmd()
        .args(["stop", &other.to_string()])
        .assert()
        .success();
}

/// The state a pi-subagents status.json says, once there is one.
fn status_state(status_path: &Path) -> Option<String> {
    let bytes = std::fs::read(status_path).ok()?;
    let status: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    status["state"].as_str().map(str::to_string)
}

#[test]
fn a_pi_subagents_stop_for_a_delayed_run_ends_it_with_no_command_after() {
    let Some(install) = pi_subagents() else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path().join("pi-root");
    let output = runjournal(&root)
        .args(["run", "--json", "--delay", "1h", "--", "true"])
        .output()
        .expect("run");
    assert!(output.status.success(), "{output:?}");
    let launched: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    let run = launched["runId"].as_str().expect("runId").to_string();
    let run_dir = root.join("async-subagent-runs").join(&run);
    let status_path = run_dir.join("status.json");
    assert_eq!(status_state(&status_path).as_deref(), Some("queued"));
    // pi-subagents' own control code writes its stop request; no runjournal command follows.
    let async_dir = run_dir.to_str().expect("a UTF-8 path");
    let stale = Path::new("1000");
    read_with_pi_subagents(
        &install,
        &[("PI_COMPAT_STALE_ALIVE_MS", stale)],
        &["--control", "stop", async_dir, ""],
    );
    let asked_at = Instant::now();
    let deadline = asked_at + Duration::from_secs(60);
    while status_state(&status_path).as_deref() != Some("stopped") {
        assert!(
            Instant::now() < deadline,
            "run {run} not stopped a minute after pi-subagents asked: {:?}",
            status_state(&status_path)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!(
        "a delayed run stopped {} ms after pi-subagents asked",
        asked_at.elapsed().as_millis()
    );
}
