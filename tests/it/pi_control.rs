//! A pi-subagents host drives runjournal runs through its own control files: pi-subagents
//! 0.67's own control code (`requestAsyncStop`, `requestAsyncInterrupt`, `requestAsyncSteer`)
//! and stale-run reconciler (`reconcileAsyncRun`), installed from npm as the compatibility
//! test installs it and called by `tests/it/pi_subagents_compat.mjs`, act on runs the real
//! `runjournal` binary made in the pi-subagents layout.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::pi_subagents_compat::{
    SESSION_ID, StopOnDrop, launch, pi_subagents, read_with_pi_subagents, runjournal, wait_printed,
    wait_published,
};

/// pi-subagents' own control code on `run`'s directory: `action` with `extra`.
fn pi_control(
    install: &Path,
    root: &Path,
    run: &str,
    action: &str,
    extra: &str,
) -> serde_json::Value {
    let async_dir = run_dir(root, run);
    let async_dir = async_dir.to_str().expect("a UTF-8 path");
    // A runner SIGKILLed here may stay a zombie (where nothing reaps orphans), whose pid
    // pi-subagents' reconciler finds alive: it is told to judge a pid stale after a second
    // without an update instead of 24 h, as it would judge a dead one.
    let stale = Path::new(STALE_ALIVE_MS);
    read_with_pi_subagents(
        install,
        &[("PI_COMPAT_STALE_ALIVE_MS", stale)],
        &["--control", action, async_dir, extra],
    )["done"]
        .clone()
}

/// How long pi-subagents' reconciler lets a live pid go without a status update.
const STALE_ALIVE_MS: &str = "1000";

/// A run whose one step has printed `ready` and sleeps, its runner's pid, and the guard that
/// stops it when the test ends.
fn ready_run(root: &Path) -> (String, u32, StopOnDrop<'_>) {
    let (run, runner_pid) = launch(root, &["--", "sh", "-c", "echo ready; sleep 300"]);
    let stop = StopOnDrop {
        root,
        run: run.clone(),
    };
    wait_printed(root, &run, 0, "ready");
    (run, runner_pid, stop)
}

fn run_dir(root: &Path, run: &str) -> PathBuf {
    root.join("async-subagent-runs").join(run)
}

fn results_dir(root: &Path) -> PathBuf {
    root.join("async-subagent-results")
}

/// `runjournal status --json RUN`.
fn status(root: &Path, run: &str) -> serde_json::Value {
    let output = runjournal(root)
        .args(["status", "--json", run])
        .output()
        .expect("status");
    assert!(output.status.success(), "{output:?}");
    serde_json::from_slice(&output.stdout).expect("JSON")
}

/// Waits for `run` to end and its files to be published; returns its state as `status
/// --json` says it.
fn wait_end(root: &Path, run: &str) -> String {
    let output = runjournal(root).args(["wait", run]).output().expect("wait");
    assert!(
        output.status.code().is_some_and(|code| code != 2),
        "{output:?}"
    );
    wait_published(root, run);
    status(root, run)["state"]
        .as_str()
        .expect("state")
        .to_string()
}

/// The request files left in the run's control inbox (its request directories and itself).
fn request_files(root: &Path, run: &str) -> Vec<PathBuf> {
    let control = run_dir(root, run).join("control");
    let mut files = Vec::new();
    for dir in [
        control.clone(),
        control.join("stop-requests"),
        control.join("steer-requests"),
    ] {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let path = entry.expect("entry").path();
            let name = path.file_name().expect("a name").to_string_lossy();
            if path.is_file() && name.ends_with(".json") && name != "steer-inbox-closed.json" {
                files.push(path);
            }
        }
    }
    files
}

#[test]
fn pi_subagents_request_async_stop_ends_a_run_stopped() {
    let Some(install) = pi_subagents() else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path().join("pi-root");
    let (run, _, _stop) = ready_run(&root);
    pi_control(&install, &root, &run, "stop", "");
    assert_eq!(wait_end(&root, &run), "stopped");
    assert_eq!(
        request_files(&root, &run),
        Vec::<PathBuf>::new(),
        "the request was taken"
    );
    let seen = pi_control(&install, &root, &run, "status", "");
    assert_eq!(seen["state"], "stopped", "{seen}");
}

/// `requestAsyncTimeout` ends the run as its own deadline would: failed, exit 124, the
/// result saying it timed out.
#[test]
fn pi_subagents_request_async_timeout_ends_a_run_as_its_timeout() {
    let Some(install) = pi_subagents() else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path().join("pi-root");
    let (run, _, _stop) = ready_run(&root);
    pi_control(&install, &root, &run, "timeout", "");
    assert_eq!(wait_end(&root, &run), "failed");
    assert_eq!(request_files(&root, &run), Vec::<PathBuf>::new());
    let result: serde_json::Value = serde_json::from_slice(
        &std::fs::read(results_dir(&root).join(format!("{run}.json"))).expect("the result"),
    )
    .expect("JSON");
    // As pi-subagents' runner writes it: 1, and its words, with the timeout the run got (it
    // named none: the layout's 30 minutes, as pi-subagents gives it).
    assert_eq!(result["exitCode"], 1, "{result}");
    assert_eq!(
        result["summary"], "Subagent timed out after 1800000ms.",
        "{result}"
    );
    assert_eq!(result["timedOut"], true, "{result}");
}

/// A run dismissed while it runs leaves pi-subagents' active index, as pi-subagents' own
/// dismissal takes it out: its listing of the session's active runs no longer shows it, and
/// the run goes on.
#[test]
fn a_run_dismissed_while_it_runs_leaves_pi_subagents_active_listing() {
    let Some(install) = pi_subagents() else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path().join("pi-root");
    let (run, _, _stop) = ready_run(&root);
    let active = || -> Vec<String> {
        let report = read_with_pi_subagents(
            &install,
            &[("PI_SUBAGENTS_TEMP_ROOT", &root)],
            &["--read", SESSION_ID],
        );
        report["listed"]["activeForSession"]
            .as_array()
            .unwrap_or_else(|| panic!("a listing: {report}"))
            .iter()
            .map(|listed| listed["id"].as_str().expect("an id").to_string())
            .collect()
    };
    assert_eq!(active(), vec![run.clone()], "listed while it runs");
    runjournal(&root).args(["dismiss", &run]).assert().success();
    assert_eq!(
        active(),
        Vec::<String>::new(),
        "dismissed: no longer listed"
    );
    assert!(
        !root
            .join("async-subagent-runs/.active-runs")
            .join(&run)
            .exists(),
        "its marker is gone"
    );
    assert_eq!(status(&root, &run)["state"], "running", "and it still runs");
}

/// SIGUSR2 is pi-subagents' interrupt signal, which its hosts sent to a runner's pid before
/// its control files: runjournal's runner takes it as an interrupt (the run pauses, to be
/// resumed), journaled as a host's request is, and neither dies of it nor leaves the run
/// running.
#[test]
fn sigusr2_to_the_runner_pauses_the_run_as_an_interrupt() {
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path().join("pi-root");
    let (run, runner_pid, _stop) = ready_run(&root);
    let pid = nix::unistd::Pid::from_raw(i32::try_from(runner_pid).expect("a pid"));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGUSR2).expect("signal the runner");
    assert_eq!(wait_end(&root, &run), "paused");
    let result: serde_json::Value = serde_json::from_slice(
        &std::fs::read(results_dir(&root).join(format!("{run}.json"))).expect("the result"),
    )
    .expect("JSON");
    assert_eq!(
        result["summary"], "Paused after interrupt. Waiting for explicit next action.",
        "{result}"
    );
    assert_eq!(result["exitCode"], 0, "{result}");
}

#[test]
fn pi_subagents_request_async_interrupt_pauses_a_run_that_resume_carries_on() {
    let Some(install) = pi_subagents() else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path().join("pi-root");
    let marker = dir.path().join("was-interrupted");
    let step = format!(
        "if [ -e '{0}' ]; then echo carried-on; exit 0; fi; touch '{0}'; echo ready; sleep 300",
        marker.display()
    );
    let (run, _) = launch(&root, &["--", "sh", "-c", &step]);
    let _stop = StopOnDrop {
        root: &root,
        run: run.clone(),
    };
    wait_printed(&root, &run, 0, "ready");
    pi_control(&install, &root, &run, "interrupt", "");
    assert_eq!(wait_end(&root, &run), "paused");
    assert_eq!(request_files(&root, &run), Vec::<PathBuf>::new());
    let resumed = runjournal(&root)
        .args(["resume", &run, "--wait", "--json"])
        .assert()
        .success();
    let resumed: serde_json::Value =
        serde_json::from_slice(&resumed.get_output().stdout).expect("resume --json prints JSON");
    let resumed = resumed["runId"].as_str().expect("runId").to_string();
    assert_eq!(status(&root, &resumed)["state"], "complete");
    let output = std::fs::read_to_string(run_dir(&root, &resumed).join("output-0.log"))
        .expect("the resumed step's output");
    assert!(output.contains("carried-on"), "{output}");
}

#[test]
fn pi_subagents_request_async_steer_reaches_the_step_through_its_inbox_once() {
    let Some(install) = pi_subagents() else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path().join("pi-root");
    let (run, _) = launch(&root, &["--", "sh", "-c", TAKES_ONE_MESSAGE]);
    let _stop = StopOnDrop {
        root: &root,
        run: run.clone(),
    };
    wait_printed(&root, &run, 0, "ready");
    pi_control(&install, &root, &run, "steer", "look at the tests first");
    assert_eq!(wait_end(&root, &run), "complete");
    let output =
        std::fs::read_to_string(run_dir(&root, &run).join("output-0.log")).expect("output");
    assert_eq!(output.matches("took: ").count(), 1, "{output}");
    let taken = output
        .lines()
        .find_map(|line| line.strip_prefix("took: "))
        .expect("a message taken");
    let message: serde_json::Value = serde_json::from_str(taken).expect("one JSON message");
    assert_eq!(message["message"], "look at the tests first", "{message}");
    assert_eq!(message["mode"], "steer", "{message}");
    assert_eq!(request_files(&root, &run), Vec::<PathBuf>::new());
    let seen = pi_control(&install, &root, &run, "status", "");
    assert_eq!(seen["steering"]["delivered"], 1, "{seen}");
    assert_eq!(seen["steering"]["pending"], 0, "{seen}");
    assert!(
        run_dir(&root, &run)
            .join("control/steer-inbox-closed.json")
            .is_file(),
        "the ended run's inbox is closed as pi-subagents closes one"
    );
}

/// pi-subagents' `requestAsyncStop` with a `targetIndex` stops that step alone: in a parallel
/// run the other step goes on and completes, the stopped one ends `stopped`, and the run ends
/// `failed`, as pi-subagents' runner ends a run one of whose children a host stopped. Its
/// readers see the step stopped and its stop requested; the events say so in pi's words.
#[test]
fn pi_subagents_request_async_stop_of_one_step_stops_that_step_alone() {
    let Some(install) = pi_subagents() else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path().join("pi-root");
    let marker = dir.path().join("go-on");
    let finisher = format!(
        "echo ready; while [ ! -e '{}' ]; do sleep 0.1; done; echo finished",
        marker.display()
    );
    let (run, _) = launch(
        &root,
        &[
            "--mode",
            "parallel",
            "--step",
            "echo ready; sleep 300",
            "--step",
            &finisher,
        ],
    );
    let _stop = StopOnDrop {
        root: &root,
        run: run.clone(),
    };
    wait_printed(&root, &run, 0, "ready");
    wait_printed(&root, &run, 1, "ready");
    pi_control(&install, &root, &run, "stop-step", "0");
    // Step 0 ends while step 1 still runs: the stop was of that step alone.
    let mut step_zero = String::new();
    for _ in 0..200 {
        step_zero = status(&root, &run)["steps"][0]["status"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if step_zero == "stopped" {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(step_zero, "stopped");
    assert_eq!(status(&root, &run)["steps"][1]["status"], "running");
    std::fs::write(&marker, b"").expect("the marker");
    assert_eq!(wait_end(&root, &run), "failed");
    assert_eq!(request_files(&root, &run), Vec::<PathBuf>::new());
    let seen = pi_control(&install, &root, &run, "status", "");
    assert_eq!(seen["state"], "failed", "{seen}");
    assert_eq!(seen["steps"][0]["status"], "stopped", "{seen}");
    assert_eq!(seen["steps"][0]["stopRequested"], true, "{seen}");
    assert_eq!(seen["steps"][1]["status"], "complete", "{seen}");
    let events =
        std::fs::read_to_string(run_dir(&root, &run).join("events.jsonl")).expect("events");
    let kinds: Vec<String> = events
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|line| line["stepIndex"] == 0)
        .filter_map(|line| line["type"].as_str().map(str::to_string))
        .collect();
    assert!(
        kinds
            .windows(2)
            .any(|pair| pair == ["subagent.step.stop_requested", "subagent.step.stopped"]),
        "{kinds:?}"
    );
    let output =
        std::fs::read_to_string(run_dir(&root, &run).join("output-1.log")).expect("output");
    assert!(output.contains("finished"), "{output}");
}

/// A stop of a step a chain has not reached is taken at once and acted on when its turn
/// comes: the step never runs, and the chain ends there, `failed`. A stop of a step that
/// ended is refused, saying why, and changes nothing.
#[test]
fn a_stop_of_a_step_not_reached_skips_it_and_one_of_an_ended_step_is_refused() {
    let Some(install) = pi_subagents() else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path().join("pi-root");
    let marker = dir.path().join("go-on");
    let first = format!(
        "echo ready; while [ ! -e '{}' ]; do sleep 0.1; done",
        marker.display()
    );
    let never = dir.path().join("never-ran");
    let second = format!("touch '{}'", never.display());
    let (run, _) = launch(
        &root,
        &["--mode", "chain", "--step", &first, "--step", &second],
    );
    let _stop = StopOnDrop {
        root: &root,
        run: run.clone(),
    };
    wait_printed(&root, &run, 0, "ready");
    pi_control(&install, &root, &run, "stop-step", "1");
    let mut stop_requested = serde_json::Value::Null;
    for _ in 0..200 {
        stop_requested = status(&root, &run)["steps"][1]["stopRequested"].clone();
        if stop_requested == true {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(stop_requested, true, "taken while step 0 runs");
    std::fs::write(&marker, b"").expect("the marker");
    assert_eq!(wait_end(&root, &run), "failed");
    assert!(!never.exists(), "the stopped step never ran");
    let run_status = status(&root, &run);
    assert_eq!(run_status["steps"][0]["status"], "complete", "{run_status}");
    assert_eq!(run_status["steps"][1]["status"], "stopped", "{run_status}");
    assert_eq!(request_files(&root, &run), Vec::<PathBuf>::new());

    // A stop of a step that ended: refused, moved aside, and the run goes on.
    let (other, _) = launch(
        &root,
        &[
            "--mode",
            "chain",
            "--step",
            "true",
            "--step",
            "echo ready; sleep 300",
        ],
    );
    let _stop_other = StopOnDrop {
        root: &root,
        run: other.clone(),
    };
    wait_printed(&root, &other, 1, "ready");
    pi_control(&install, &root, &other, "stop-step", "0");
    let refused = run_dir(&root, &other).join("control/refused");
    let mut reason = String::new();
    for _ in 0..200 {
        let events = std::fs::read_to_string(run_dir(&root, &other).join("events.jsonl"))
            .unwrap_or_default();
        if let Some(line) = events.lines().find(|line| line.contains("was refused")) {
            reason = line.to_string();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(reason.contains("step 0 is complete"), "{reason}");
    assert!(refused.is_dir(), "the file was moved aside");
    assert_eq!(status(&root, &other)["steps"][1]["status"], "running");
}

/// The lines of `run`'s events.jsonl that end it, as a host reads them.
fn ends_in_events(root: &Path, run: &str) -> Vec<String> {
    let events = std::fs::read_to_string(run_dir(root, run).join("events.jsonl")).expect("events");
    events
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter_map(|line| line["type"].as_str().map(str::to_string))
        .filter(|kind| kind == "subagent.run.completed" || kind == "subagent.run.repaired_stale")
        .collect()
}

/// The result files of `run`.
fn results_of(root: &Path, run: &str) -> Vec<PathBuf> {
    std::fs::read_dir(results_dir(root))
        .map(|entries| {
            entries
                .map(|entry| entry.expect("entry").path())
                .filter(|path| path.to_string_lossy().contains(run))
                .collect()
        })
        .unwrap_or_default()
}

/// Launches a run, SIGKILLs its runner mid-step and waits until it is gone.
fn killed_run(root: &Path) -> String {
    let (run, runner_pid) = launch(root, &["--", "sh", "-c", "echo ready; sleep 300"]);
    wait_printed(root, &run, 0, "ready");
    // Which reconciler repairs first is the test's: no watcher repairs before either.
    crate::support::stop_watcher(&runjournal::Home::in_layout(
        root,
        runjournal::home::Layout::PiSubagents,
    ));
    let pid = nix::unistd::Pid::from_raw(i32::try_from(runner_pid).expect("a pid"));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).expect("kill the runner");
    for _ in 0..1200 {
        let is_gone = runjournal::platform::process(runner_pid)
            .expect("read the process table")
            .is_none_or(|process| !process.is_alive());
        if is_gone {
            // Past the stale bound given to pi-subagents' reconciler (a zombie's pid is alive).
            std::thread::sleep(Duration::from_millis(2500));
            return run;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("the killed runner {runner_pid} is still there");
}

#[test]
fn pi_subagents_reconciler_and_ours_in_either_order_leave_one_end() {
    let Some(install) = pi_subagents() else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path().join("pi-root");
    let results = results_dir(&root);
    let results = results.to_str().expect("a UTF-8 path");
    let ours = || runjournal(&root).arg("reconcile").assert().success();

    // The host's reconciler first: its verdict becomes the run's one end.
    let host_first = killed_run(&root);
    let repaired = pi_control(&install, &root, &host_first, "reconcile", results);
    assert_eq!(repaired["repaired"], true, "{repaired}");
    ours();
    pi_control(&install, &root, &host_first, "reconcile", results);
    ours();
    let host_closed = status(&root, &host_first);
    assert_eq!(host_closed["state"], "failed");
    assert!(
        host_closed
            .to_string()
            .contains("Marked run failed by stale-run reconciliation"),
        "the host's verdict is the run's end: {host_closed}"
    );
    assert_eq!(
        ends_in_events(&root, &host_first),
        ["subagent.run.repaired_stale"]
    );
    assert_eq!(results_of(&root, &host_first).len(), 1);

    // Ours first: the host's reconciler finds an ended run and leaves it.
    let ours_first = killed_run(&root);
    ours();
    let repaired = pi_control(&install, &root, &ours_first, "reconcile", results);
    assert_eq!(repaired["repaired"], false, "{repaired}");
    ours();
    assert_eq!(status(&root, &ours_first)["state"], "failed");
    // Our reconciler ends it as pi-subagents' would: one repair line.
    assert_eq!(
        ends_in_events(&root, &ours_first),
        ["subagent.run.repaired_stale"]
    );
    assert_eq!(results_of(&root, &ours_first).len(), 1);
}

/// The step side of steering in shell: take each message by removing its file; end after the
/// first.
const TAKES_ONE_MESSAGE: &str = "echo ready; n=0; while [ $n -lt 1200 ]; do \
    for f in \"$RUNJOURNAL_INBOX\"/*.json; do [ -f \"$f\" ] || continue; \
    printf 'took: %s\\n' \"$(cat \"$f\")\"; rm -f \"$f\"; exit 0; done; \
    n=$((n+1)); sleep 0.1; done; exit 3";

/// `runjournal steer` reaches the step as pi-subagents' request does; a file in the inbox
/// that is a symbolic link is refused and moved aside, never followed, and the run goes on.
#[test]
fn runjournal_steer_reaches_the_step_and_a_linked_request_is_refused() {
    let Some(_install) = pi_subagents() else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path().join("pi-root");
    let (run, _) = launch(&root, &["--", "sh", "-c", TAKES_ONE_MESSAGE]);
    let _stop = StopOnDrop {
        root: &root,
        run: run.clone(),
    };
    wait_printed(&root, &run, 0, "ready");
    let secret = dir.path().join("secret.json");
    std::fs::write(
        &secret,
        r#"{"type":"steer","id":"x","ts":1,"message":"followed a link"}"#,
    )
    .expect("write");
    let linked = run_dir(&root, &run).join("control/steer-requests/0-link.json");
    std::os::unix::fs::symlink(&secret, &linked).expect("link");
    // Refused first: the link is moved aside before the real message is sent.
    for _ in 0..600 {
        if linked.symlink_metadata().is_err() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(linked.symlink_metadata().is_err(), "the link was taken");
    let refused: Vec<_> = std::fs::read_dir(run_dir(&root, &run).join("control/refused"))
        .expect("refused files are kept aside")
        .collect();
    assert_eq!(refused.len(), 1);
    runjournal(&root)
        .args([
            "steer",
            &run,
            "--mode",
            "follow-up",
            "from the command line",
        ])
        .assert()
        .success();
    assert_eq!(wait_end(&root, &run), "complete");
    let output =
        std::fs::read_to_string(run_dir(&root, &run).join("output-0.log")).expect("output");
    assert_eq!(output.matches("took: ").count(), 1, "{output}");
    assert!(output.contains("from the command line"), "{output}");
    assert!(output.contains("follow-up"), "{output}");
    assert!(!output.contains("followed a link"), "{output}");
    assert!(secret.is_file(), "the link's target is left alone");
    // A run that ended takes no message: exit 2, naming why.
    runjournal(&root)
        .args(["steer", &run, "too late"])
        .assert()
        .code(2);
}

/// A stop written while no runner lives (a run waiting in a queue that admits none) is taken
/// by the next reconcile pass: the run ends stopped and the file is gone.
#[test]
fn a_stop_written_while_no_runner_lives_is_taken_by_the_reconciler() {
    let Some(install) = pi_subagents() else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path().join("pi-root");
    runjournal(&root)
        .args(["queue", "held", "--max-active", "0"])
        .assert()
        .success();
    let output = runjournal(&root)
        .args(["run", "--json", "--queue", "held", "--", "true"])
        .output()
        .expect("run");
    assert!(output.status.success(), "{output:?}");
    let launched: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(launched["state"], "queued", "{launched}");
    let run = launched["runId"].as_str().expect("runId").to_string();
    pi_control(&install, &root, &run, "stop", "");
    runjournal(&root).arg("reconcile").assert().success();
    assert_eq!(status(&root, &run)["state"], "stopped");
    assert_eq!(request_files(&root, &run), Vec::<PathBuf>::new());
}

/// A message sent to a paused run — by `runjournal steer` and by pi-subagents'
/// `requestAsyncSteer` — is kept for its resume and reaches the step the resume runs, each once.
#[test]
fn a_steer_sent_to_a_paused_run_reaches_the_step_its_resume_runs() {
    let Some(install) = pi_subagents() else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path().join("pi-root");
    let marker = dir.path().join("was-interrupted");
    // Interrupted the first time; the resumed step takes two messages and ends.
    let step = format!(
        "if [ ! -e '{0}' ]; then touch '{0}'; echo ready; sleep 300; fi; got=0; n=0; \
         while [ $got -lt 2 ] && [ $n -lt 1200 ]; do \
         for f in \"$RUNJOURNAL_INBOX\"/*.json; do [ -f \"$f\" ] || continue; \
         printf 'took: %s\\n' \"$(cat \"$f\")\"; rm -f \"$f\"; got=$((got+1)); done; \
         n=$((n+1)); sleep 0.1; done; [ $got -eq 2 ]",
        marker.display()
    );
    let (run, _) = launch(&root, &["--", "sh", "-c", &step]);
    let _stop = StopOnDrop {
        root: &root,
        run: run.clone(),
    };
    wait_printed(&root, &run, 0, "ready");
    runjournal(&root)
        .args(["interrupt", &run])
        .assert()
        .success();
    assert_eq!(wait_end(&root, &run), "paused");
    let kept = runjournal(&root)
        .args(["steer", &run, "from the command line"])
        .assert()
        .success();
    let kept = String::from_utf8_lossy(&kept.get_output().stdout).into_owned();
    assert!(kept.contains("kept for the run that resumes it"), "{kept}");
    pi_control(&install, &root, &run, "steer", "from the host");
    let resumed = runjournal(&root)
        .args(["resume", &run, "--wait", "--json"])
        .assert()
        .success();
    let resumed: serde_json::Value =
        serde_json::from_slice(&resumed.get_output().stdout).expect("resume --json prints JSON");
    let resumed = resumed["runId"].as_str().expect("runId").to_string();
    assert_eq!(status(&root, &resumed)["state"], "complete");
    let output = std::fs::read_to_string(run_dir(&root, &resumed).join("output-0.log"))
        .expect("the resumed step's output");
    assert_eq!(output.matches("took: ").count(), 2, "{output}");
    assert_eq!(
        output.matches("from the command line").count(),
        1,
        "{output}"
    );
    assert_eq!(output.matches("from the host").count(), 1, "{output}");
    assert_eq!(request_files(&root, &run), Vec::<PathBuf>::new());
    let seen = pi_control(&install, &root, &resumed, "status", "");
    assert_eq!(seen["steering"]["delivered"], 2, "{seen}");
}

/// The kill point between a request's record and its effect: the runner journals a host's stop
/// request and is SIGKILLed before it removes the request's file. The next taker (here a
/// reconcile pass, the runner being dead) finds the request journaled and only removes the
/// file: the stop is recorded once, and the run ends.
#[test]
fn a_stop_request_journaled_by_a_runner_killed_before_removing_its_file_is_taken_once() {
    let Some(install) = pi_subagents() else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path().join("pi-root");
    let kill_file = dir.path().join("kill-after-control-record");
    std::fs::write(&kill_file, b"").expect("the kill file");
    let output = runjournal(&root)
        .env(runjournal::control_inbox::KILL_AFTER_RECORD_ENV, &kill_file)
        .args(["run", "--json", "--", "sh", "-c", "echo ready; sleep 300"])
        .output()
        .expect("run");
    assert!(output.status.success(), "{output:?}");
    let launched: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    let run = launched["runId"].as_str().expect("runId").to_string();
    let _stop = StopOnDrop {
        root: &root,
        run: run.clone(),
    };
    wait_printed(&root, &run, 0, "ready");
    pi_control(&install, &root, &run, "stop", "");
    // The runner took the request, journaled it and killed itself at the kill point.
    for _ in 0..600 {
        if !kill_file.exists() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!kill_file.exists(), "the runner reached the kill point");
    // It removes the file, then raises SIGKILL: dead a moment later. A pass that came in that
    // moment would find it alive and leave its inbox to it.
    let runner_pid =
        u32::try_from(launched["runnerPid"].as_u64().expect("runnerPid")).expect("a pid");
    for _ in 0..600 {
        let is_alive = runjournal::platform::process(runner_pid)
            .ok()
            .flatten()
            .is_some_and(|info| info.is_alive());
        if !is_alive {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        request_files(&root, &run).len(),
        1,
        "the request's file outlived its record"
    );
    runjournal(&root).arg("reconcile").assert().success();
    // The next taker is this reconcile pass, or the home's watcher, which sees the runner die
    // too and may be taking the inbox while the pass runs: the file goes once either is done.
    for _ in 0..200 {
        if request_files(&root, &run).is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        request_files(&root, &run),
        Vec::<PathBuf>::new(),
        "the next taker removed the file"
    );
    let journal = runjournal::Journal::open(root.join("runjournal").join("journal.redb"))
        .expect("the journal opens");
    let run_id: runjournal::RunId = run.parse().expect("a run id");
    let stops = journal
        .view()
        .expect("a view")
        .records(run_id)
        .expect("records")
        .iter()
        .filter(|record| {
            matches!(
                record.event,
                runjournal::event::Event::ControlRequested {
                    action: runjournal::event::ControlAction::Stop,
                    ..
                }
            )
        })
        .count();
    assert_eq!(stops, 1, "the stop is recorded once");
    drop(journal);
    assert!(
        status(&root, &run)["state"] != "running",
        "the run whose runner died is closed"
    );
}

/// pi-subagents gives a background run that names no timeout 30 minutes. In its layout so
/// does runjournal, as the home's default run timeout: a host may set another
/// (`default-timeout`), go back to the layout's, or launch one run with none
/// (`--timeout off`); pi-subagents' own reader sees each run's timeout in its status.json.
#[test]
fn a_run_that_names_no_timeout_gets_the_homes_default_of_thirty_minutes() {
    let Some(install) = pi_subagents() else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path().join("pi-root");
    let timeout_of =
        |run: &str| pi_control(&install, &root, run, "status", "")["timeoutMs"].clone();
    let default_timeout = |args: &[&str]| -> serde_json::Value {
        let output = runjournal(&root)
            .arg("default-timeout")
            .args(args)
            .arg("--json")
            .output()
            .expect("default-timeout");
        assert!(output.status.success(), "{output:?}");
        serde_json::from_slice(&output.stdout).expect("JSON")
    };
    assert_eq!(
        default_timeout(&[]),
        serde_json::json!({"timeoutMs": 1_800_000, "source": "layout"})
    );
    let (plain, _) = launch(&root, &["--", "true"]);
    wait_end(&root, &plain);
    assert_eq!(timeout_of(&plain), 1_800_000);
    let (none, _) = launch(&root, &["--timeout", "off", "--", "true"]);
    wait_end(&root, &none);
    assert_eq!(timeout_of(&none), serde_json::Value::Null);
    let (own, _) = launch(&root, &["--timeout", "5m", "--", "true"]);
    wait_end(&root, &own);
    assert_eq!(timeout_of(&own), 300_000);

    // The home's own default: a run that names none ends by it, in pi-subagents' words.
    assert_eq!(
        default_timeout(&["1s"]),
        serde_json::json!({"timeoutMs": 1000, "source": "home"})
    );
    let (short, _) = launch(&root, &["--", "sleep", "300"]);
    assert_eq!(wait_end(&root, &short), "failed");
    let result: serde_json::Value = serde_json::from_slice(
        &std::fs::read(results_dir(&root).join(format!("{short}.json"))).expect("the result"),
    )
    .expect("JSON");
    assert_eq!(
        result["summary"], "Subagent timed out after 1000ms.",
        "{result}"
    );
    assert_eq!(
        default_timeout(&["off"]),
        serde_json::json!({"timeoutMs": null, "source": "home"})
    );
    let (unbounded, _) = launch(&root, &["--", "true"]);
    wait_end(&root, &unbounded);
    assert_eq!(timeout_of(&unbounded), serde_json::Value::Null);
    assert_eq!(
        default_timeout(&["layout"]),
        serde_json::json!({"timeoutMs": 1_800_000, "source": "layout"})
    );

    // runjournal's own layout has none, and says so.
    let native = dir.path().join("native");
    let output = assert_cmd::cargo::cargo_bin_cmd!("runjournal")
        .env_remove("RUNJOURNAL_LAYOUT")
        .arg("--home")
        .arg(&native)
        .args(["default-timeout", "--json"])
        .output()
        .expect("default-timeout");
    assert!(output.status.success(), "{output:?}");
    let shown: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(
        shown,
        serde_json::json!({"timeoutMs": null, "source": "layout"})
    );
    // A bad setting is refused before anything is written.
    let output = runjournal(&root)
        .args(["default-timeout", "soon"])
        .output()
        .expect("default-timeout");
    assert_eq!(output.status.code(), Some(2), "{output:?}");
}
