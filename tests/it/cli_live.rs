//! A live run with the real binaries: its runner's heartbeat, what its result says of each
//! step's output.

use std::time::Duration;

use crate::support;

use runjournal::projection::{self, FileKind};
use runjournal::{Home, RunId};
use support::{TestHome, launch, records, wait_output, wait_terminal};

/// How many times a file is looked at before a test gives up on it.
const FILE_POLLS: u32 = 1200;
const FILE_POLL_INTERVAL: Duration = Duration::from_millis(50);

fn status_json(home: &TestHome, run: RunId) -> Option<serde_json::Value> {
    let path = home
        .path()
        .join("runs")
        .join(run.to_string())
        .join("status.json");
    let bytes = std::fs::read(path).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Polls status.json until `done` holds; panics naming `what` after a generous bound.
fn wait_status(
    home: &TestHome,
    run: RunId,
    what: &str,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    for _ in 0..FILE_POLLS {
        if let Some(status) = status_json(home, run)
            && done(&status)
        {
            return status;
        }
        std::thread::sleep(FILE_POLL_INTERVAL);
    }
    panic!(
        "run {run}: gave up waiting for {what}; status.json: {:?}",
        status_json(home, run)
    );
}

/// Stops a run left running, whatever the test's outcome.
struct StopOnDrop<'a> {
    home: &'a TestHome,
    run: RunId,
}

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        let run = self.run.to_string();
        let _ = self.home.cmd().args(["stop", &run]).output();
        let _ = self.home.cmd().args(["wait", &run]).output();
    }
}

#[test]
fn a_quiet_steps_runner_refreshes_last_update_without_a_record() {
    let home = TestHome::new();
    let run = launch(&home, &["--heartbeat", "100ms", "--", "sleep", "60"]);
    let _stop = StopOnDrop { home: &home, run };
    let journal = home.journal();
    let first = wait_status(&home, run, "a first heartbeat", |status| {
        status["runnerHeardAt"].is_u64()
    });
    let first_heard = first["runnerHeardAt"].as_u64().expect("a time");
    let second = wait_status(&home, run, "a later heartbeat", |status| {
        status["runnerHeardAt"]
            .as_u64()
            .is_some_and(|heard| heard > first_heard)
    });
    let second_heard = second["runnerHeardAt"].as_u64().expect("a time");
    let last_update = second["lastUpdate"].as_u64().expect("lastUpdate");
    assert!(
        last_update >= second_heard,
        "lastUpdate is at least the heartbeat: {second}"
    );
    // No record was made for it: the journal's head is what status.json says, and its last
    // record is older than the heartbeat.
    let records = records(&journal, run);
    let last = records.last().expect("records");
    assert_eq!(second["journalSeq"], last.seq, "{second}");
    assert_eq!(second["state"], "running");
    assert!(
        last.time_ms < second_heard,
        "the heartbeat is later than the last record"
    );
    // A projection check takes the heartbeat's file as fresh (so the reconciler leaves it),
    // and only such a file: with another field changed, it differs.
    let status_path = home
        .path()
        .join("runs")
        .join(run.to_string())
        .join("status.json");
    let state = support::state(&journal, run);
    let check = || {
        let plan = projection::plan(
            &Home::at(home.path()),
            &state,
            &records,
            &Default::default(),
        );
        projection::check_plan(&plan)
            .into_iter()
            .filter(|difference| difference.kind == FileKind::Status)
            .count()
    };
    let beaten = std::fs::read(&status_path).expect("status.json");
    assert_eq!(check(), 0, "a heartbeat's status.json is fresh");
    let mut edited: serde_json::Value = serde_json::from_slice(&beaten).expect("JSON");
    edited["currentStep"] = 5.into();
    std::fs::write(
        &status_path,
        serde_json::to_vec_pretty(&edited).expect("JSON"),
    )
    .expect("write status.json");
    assert_eq!(check(), 1, "an edited status.json with a heartbeat differs");
    std::fs::write(&status_path, &beaten).expect("write status.json");
    home.cmd().arg("reconcile").assert().success();
    let after = status_json(&home, run).expect("status.json");
    assert!(
        after["runnerHeardAt"].as_u64() >= Some(second_heard),
        "{after}"
    );
    // And `status` says when the runner was last heard from.
    let shown = home
        .cmd()
        .args(["status", &run.to_string()])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let shown = String::from_utf8(shown).expect("utf-8");
    assert!(shown.contains("runner heartbeat at"), "{shown}");
    let json = home
        .cmd()
        .args(["status", "--json", &run.to_string()])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let json: serde_json::Value = serde_json::from_slice(&json).expect("JSON");
    assert!(json["runnerHeardAt"].is_u64(), "{json}");
    // Once the run is over, no heartbeat is left in its status.json.
    home.cmd()
        .args(["stop", &run.to_string()])
        .assert()
        .success();
    wait_terminal(&journal, run);
    let ended = wait_status(&home, run, "the stopped status", |status| {
        status["state"] == "stopped"
    });
    assert!(ended["runnerHeardAt"].is_null(), "{ended}");
}

/// The run's result, once written: the runner writes it after the run's `Terminal` is in the
/// journal, so a reader that saw the end may look a moment too soon.
fn result_json(home: &TestHome, run: RunId) -> serde_json::Value {
    let path = home.path().join("results").join(format!("{run}.json"));
    for _ in 0..1200 {
        if let Ok(bytes) = std::fs::read(&path) {
            return serde_json::from_slice(&bytes).expect("JSON");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("{} was never written", path.display());
}

#[test]
fn the_result_holds_each_steps_output_as_pi_subagents_fills_it() {
    let home = TestHome::new();
    let dir = tempfile::tempdir().expect("temp dir");
    let provider = dir.path().join("provider.sh");
    std::fs::write(
        &provider,
        "echo '{\"state\": \"running\", \"message\": \"working\"}'\necho '{\"state\": \"succeeded\", \"message\": \"the job says 42\"}'\n",
    )
    .expect("write the provider");
    // 200 000 bytes of output, then its last line: only the end is kept.
    let loud =
        "i=0; while [ $i -lt 2000 ]; do printf '%099d\\n' $i; i=$((i+1)); done; echo loud-end";
    let run = launch(
        &home,
        &[
            "--step",
            "echo the-answer-is-42",
            "--step",
            "true",
            "--step",
            loud,
            "--external-job",
            &format!("sh '{}'", provider.display()),
            "--step",
            "echo oops; exit 3",
            "--step",
            "echo never",
        ],
    );
    let journal = home.journal();
    wait_terminal(&journal, run);
    let result = result_json(&home, run);
    let results = result["results"].as_array().expect("results");
    let field = |index: usize, name: &str| results[index][name].clone();
    assert_eq!(field(0, "output"), "the-answer-is-42");
    assert_eq!(field(0, "outputState"), "present");
    assert_eq!(field(1, "output"), "");
    assert_eq!(field(1, "outputState"), "absent");
    let loud_output = field(2, "output").as_str().expect("text").to_string();
    assert!(loud_output.ends_with("loud-end"), "the end is kept");
    assert!(
        loud_output.len() as u64 <= runjournal::projection::documents::STEP_OUTPUT_TAIL_BYTES,
        "{} bytes",
        loud_output.len()
    );
    assert!(
        loud_output.len() > 60_000,
        "the bound is pi-subagents' 64 KiB"
    );
    assert_eq!(
        field(3, "output"),
        "the job says 42",
        "the provider's last message"
    );
    assert_eq!(field(3, "outputState"), "present");
    assert_eq!(field(4, "output"), "oops");
    assert_eq!(
        field(5, "outputState"),
        "absent",
        "a skipped step wrote nothing"
    );
    let summary = result["summary"].as_str().expect("summary");
    assert!(
        summary.starts_with("echo the-answer-is-42:\nthe-answer-is-42\n\ntrue:\n(no output)\n\n"),
        "{}",
        &summary[..200.min(summary.len())]
    );
    assert!(
        summary.ends_with("the job says 42\n\necho oops; exit 3:\noops"),
        "the failed step's output, and no skipped step: {}",
        &summary[summary.len().saturating_sub(200)..]
    );
    // A failed step without output is summarised by its error.
    let quiet = launch(&home, &["--", "sh", "-c", "exit 4"]);
    wait_terminal(&journal, quiet);
    let result = result_json(&home, quiet);
    let summary = result["summary"].as_str().expect("summary");
    assert!(
        summary.starts_with("sh -c exit 4:\n")
            && summary.contains('4')
            && !summary.contains("(no output)"),
        "{summary}"
    );
    assert_eq!(result["results"][0]["outputState"], "absent");
}

#[test]
fn a_step_quiet_for_its_idle_timeout_is_ended_timed_out_and_a_busy_one_is_not() {
    let home = TestHome::new();
    let journal = home.journal();
    // Quiet after its first line: ended once idle for 1 s, long before its sleep ends.
    home.cmd()
        .args([
            "run",
            "--wait",
            "--idle-timeout",
            "1s",
            "--step",
            "echo started; sleep 60",
        ])
        .assert()
        .code(124);
    let runs = journal.view().expect("view").all_runs().expect("runs");
    let state = support::state(&journal, runs[0]);
    assert_eq!(state.status, runjournal::RunStatus::Failed);
    assert_eq!(state.steps[0].exit_code, Some(124));
    let error = state.steps[0].error.clone().unwrap_or_default();
    assert!(error.contains("idle for 1s"), "{error}");
    let terminal = state.terminal.expect("terminal");
    assert_eq!(terminal.exit_code, 124);
    // Busy for 3 s, never quiet for 1 s: it completes.
    let dir = tempfile::tempdir().expect("temp dir");
    let spec = dir.path().join("spec.json");
    std::fs::write(
        &spec,
        r#"{"idleTimeout": "1s", "steps": [{"shell": "i=0; while [ $i -lt 30 ]; do echo tick; sleep 0.1; i=$((i+1)); done"}]}"#,
    )
    .expect("write the spec");
    home.cmd()
        .args(["run", "--wait", "--spec"])
        .arg(&spec)
        .assert()
        .code(0);
    // The spec's idleTimeout is the same setting: a quiet step under it is ended.
    std::fs::write(
        &spec,
        r#"{"idleTimeout": "1s", "steps": [{"command": ["sleep", "60"]}]}"#,
    )
    .expect("write the spec");
    home.cmd()
        .args(["run", "--wait", "--spec"])
        .arg(&spec)
        .assert()
        .code(124);
}

/// A step that says when it got SIGINT (and only then exits by itself).
const TRAPS_SIGINT: &str =
    "trap 'echo got-sigint; exit 0' INT; echo ready; while true; do sleep 0.1; done";

#[test]
fn interrupt_sends_the_running_step_sigint_and_the_run_ends_paused() {
    let home = TestHome::new();
    let run = launch(
        &home,
        &[
            "--step",
            "echo first",
            "--step",
            TRAPS_SIGINT,
            "--step",
            "echo never",
        ],
    );
    let _stop = StopOnDrop { home: &home, run };
    wait_output(&home, run, 1, "ready");
    home.cmd()
        .args([
            "interrupt",
            &run.to_string(),
            "--reason",
            "pause for review",
        ])
        .assert()
        .success();
    home.cmd()
        .args(["wait", &run.to_string()])
        .assert()
        .code(130);
    let journal = home.journal();
    let state = support::state(&journal, run);
    assert_eq!(state.status, runjournal::RunStatus::Paused);
    let steps: Vec<runjournal::state::StepStatus> =
        state.steps.iter().map(|step| step.status).collect();
    use runjournal::state::StepStatus;
    assert_eq!(
        steps,
        [
            StepStatus::Complete,
            StepStatus::Stopped,
            StepStatus::Skipped
        ]
    );
    // SIGINT came first: the step's trap ran.
    wait_output(&home, run, 1, "got-sigint");
    let result = result_json(&home, run);
    assert_eq!(result["state"], "paused");
    assert_eq!(
        result["summary"],
        "Paused after interrupt. Waiting for explicit next action."
    );
    let error = state.steps[1].error.clone().unwrap_or_default();
    assert!(error.contains("pause for review"), "{error}");
    // pi-subagents' words for the interrupted step: paused, interrupted, not stopped.
    assert_eq!(result["results"][1]["interrupted"], true, "{result}");
    assert_eq!(result["results"][1]["stopped"], false, "{result}");
    let status = wait_status(&home, run, "the paused status", |status| {
        status["state"] == "paused"
    });
    assert_eq!(status["steps"][1]["status"], "paused", "{status}");
    // A step the pause kept from running waits for the resume: pi-subagents' `pending`.
    assert_eq!(status["steps"][2]["status"], "pending", "{status}");
    assert_eq!(status["steps"][2]["skipped"], true, "{status}");
    assert_eq!(
        result["exitCode"], 0,
        "pi-subagents' exit code of a paused run: {result}"
    );
    // An ended run has nothing to interrupt.
    let said = home
        .cmd()
        .args(["interrupt", &run.to_string()])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    assert!(String::from_utf8_lossy(&said).contains("already ended"));
}

#[test]
fn status_shows_the_cpu_and_memory_of_a_running_steps_processes() {
    let home = TestHome::new();
    // A busy process in the step's group, and one that left the group (setsid) but is still
    // the step's descendant.
    let moved_pid_path = home.file("moved.pid");
    let script = format!(
        "yes > /dev/null & setsid sh -c 'echo $$ > \"{}\"; exec yes > /dev/null' & echo started; wait",
        moved_pid_path.display()
    );
    let run = launch(&home, &["--step", &script]);
    let _stop = StopOnDrop { home: &home, run };
    wait_output(&home, run, 0, "started");
    let mut moved_pid = None;
    for _ in 0..FILE_POLLS {
        moved_pid = std::fs::read_to_string(&moved_pid_path)
            .ok()
            .and_then(|text| text.trim().parse::<u64>().ok());
        if moved_pid.is_some() {
            break;
        }
        std::thread::sleep(FILE_POLL_INTERVAL);
    }
    let moved_pid = moved_pid.expect("the moved process wrote its pid");
    let json = home
        .cmd()
        .args(["status", "--json", &run.to_string()])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let json: serde_json::Value = serde_json::from_slice(&json).expect("JSON");
    let resources = json["resources"].as_array().expect("resources");
    assert_eq!(resources.len(), 1, "{json}");
    let step = &resources[0];
    assert_eq!(step["step"], 0);
    let pids: Vec<u64> = step["pids"]
        .as_array()
        .expect("pids")
        .iter()
        .filter_map(serde_json::Value::as_u64)
        .collect();
    assert!(pids.len() >= 3, "the shell and both yes: {step}");
    assert!(
        pids.contains(&moved_pid),
        "a descendant outside the group counts: {step}"
    );
    assert!(
        step["cpuPercent"].as_f64().is_some_and(|cpu| cpu > 1.0),
        "{step}"
    );
    assert!(
        step["residentBytes"]
            .as_u64()
            .is_some_and(|bytes| bytes > 0),
        "{step}"
    );
    let text = home
        .cmd()
        .args(["status", &run.to_string()])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let text = String::from_utf8(text).expect("utf-8");
    assert!(text.contains("resident"), "{text}");
    // A run with no running step has none.
    home.cmd()
        .args(["stop", &run.to_string()])
        .assert()
        .success();
    wait_terminal(&home.journal(), run);
    let json = home
        .cmd()
        .args(["status", "--json", &run.to_string()])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let json: serde_json::Value = serde_json::from_slice(&json).expect("JSON");
    assert_eq!(json["resources"], serde_json::json!([]), "{json}");
}
