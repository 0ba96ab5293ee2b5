//! `runjournal run` with real processes: modes, exit codes, external jobs, the spec form, and a
//! runner that outlives its launcher.

use crate::support;

use predicates::prelude::*;
use runjournal::event::{Event, JobState, Observer, Proof, StepEnd};
use runjournal::state::StepStatus;
use runjournal::{RunId, RunStatus};
use support::{TestHome, event_names, records, run_id_of, state, wait_for, wait_terminal};

#[test]
fn the_readme_command_runs_and_prints_where_status_and_result_are() {
    let home = TestHome::new();
    let output = home
        .cmd()
        .args(["run", "--wait", "--", "sh", "-c", "echo hello"])
        .assert()
        .success()
        .stdout(predicate::str::contains("run complete (exit 0)"))
        .get_output()
        .stdout
        .clone();
    let stdout = String::from_utf8(output).expect("utf-8");
    let path_of = |label: &str| {
        stdout
            .lines()
            .find_map(|line| line.strip_prefix(label))
            .unwrap_or_else(|| panic!("no {label:?} line in {stdout}"))
            .to_string()
    };
    let status: serde_json::Value =
        serde_json::from_slice(&std::fs::read(path_of("status: ")).expect("status.json exists"))
            .expect("status.json is JSON");
    assert_eq!(status["state"], "complete");
    let result: serde_json::Value =
        serde_json::from_slice(&std::fs::read(path_of("result: ")).expect("result exists"))
            .expect("the result is JSON");
    assert_eq!(result["success"], true);
    // pi-subagents' summary: each step's name and output.
    assert_eq!(result["summary"], "sh -c echo hello:\nhello");
    assert_eq!(result["results"][0]["output"], "hello");
    assert_eq!(result["results"][0]["outputState"], "present");
}

#[test]
fn a_chain_stops_at_the_failing_step_and_carries_its_exit_code() {
    let home = TestHome::new();
    home.cmd()
        .args([
            "run",
            "--wait",
            "--step",
            "echo first",
            "--step",
            "exit 7",
            "--step",
            "echo never",
        ])
        .assert()
        .code(7)
        .stdout(predicate::str::contains("step 2 (echo never)").not());
    let journal = home.journal();
    let runs = journal.view().expect("view").all_runs().expect("runs");
    assert_eq!(runs.len(), 1);
    let state = state(&journal, runs[0]);
    assert_eq!(state.status, RunStatus::Failed);
    let steps: Vec<StepStatus> = state.steps.iter().map(|step| step.status).collect();
    assert_eq!(
        steps,
        [
            StepStatus::Complete,
            StepStatus::Failed,
            StepStatus::Skipped
        ]
    );
    assert_eq!(state.steps[1].exit_code, Some(7));
    let terminal = state.terminal.expect("terminal");
    assert_eq!(terminal.exit_code, 7);
    assert!(
        terminal
            .error
            .as_deref()
            .is_some_and(|error| error.contains("step 1")),
        "{terminal:?}"
    );
    // The third step never ran: no StepRunning names it.
    let records = records(&journal, runs[0]);
    assert!(
        !records
            .iter()
            .any(|record| matches!(record.event, Event::StepRunning { step: 2, .. }))
    );
    // The launcher waited as the runner's parent and recorded its exit.
    assert!(records.iter().any(|record| matches!(
        record.event,
        Event::ProcessTerminalObserved {
            proof: Proof::Observed,
            observer: Observer::RunnerParent,
            ..
        }
    )));
}

#[test]
fn a_parallel_run_never_has_more_steps_running_than_its_concurrency() {
    let home = TestHome::new();
    let gates = tempfile::tempdir().expect("a directory for the gates");
    let mut command = home.cmd();
    command.args(["run", "--wait", "--mode", "parallel", "--concurrency", "2"]);
    // Steps 0 and 1, then 2 and 3, wait for each other: each marks that it is running, then
    // waits (bounded, exit 3 past about a minute) for its partner's mark. So a step cannot end
    // before its partner started, and the run can only complete by running two at once.
    for step in 0..4 {
        let gate = |index: usize| gates.path().join(index.to_string());
        command.args([
            "--step",
            &format!(
                "touch '{}'; n=0; while [ ! -e '{}' ]; do n=$((n+1)); [ $n -gt 1200 ] && exit 3; sleep 0.05; done",
                gate(step).display(),
                gate(step ^ 1).display()
            ),
        ]);
    }
    command.assert().success();
    let journal = home.journal();
    let runs = journal.view().expect("view").all_runs().expect("runs");
    let records = records(&journal, runs[0]);
    let mut running = 0usize;
    let mut most_running = 0usize;
    let mut started = 0;
    for record in &records {
        match record.event {
            Event::StepRunning { .. } => {
                running += 1;
                started += 1;
                most_running = most_running.max(running);
            }
            Event::StepFinished { .. } => running -= 1,
            _ => {}
        }
    }
    assert_eq!(started, 4, "{:?}", event_names(&records));
    assert!(most_running <= 2, "{:?}", event_names(&records));
    assert_eq!(
        most_running,
        2,
        "the run should have used its concurrency: {:?}",
        event_names(&records)
    );
    assert_eq!(state(&journal, runs[0]).status, RunStatus::Complete);
}

/// The run's status.json.
fn status_json(home: &TestHome, run: RunId) -> serde_json::Value {
    let path = home
        .path()
        .join("runs")
        .join(run.to_string())
        .join("status.json");
    serde_json::from_slice(&std::fs::read(path).expect("status.json")).expect("JSON")
}

#[test]
fn an_external_job_provider_reports_three_statuses() {
    let home = TestHome::new();
    let provider = home.input("provider.sh");
    std::fs::write(
        &provider,
        r#"echo '{"state": "queued", "id": "job-1"}'
echo '{"state": "running", "id": "job-1", "progress": 0.5, "message": "halfway"}'
echo '{"state": "succeeded", "id": "job-1", "message": "done", "url": "https://jobs.example/1"}'
"#,
    )
    .expect("write the provider");
    let output = home
        .cmd()
        .args(["run", "--wait", "--json", "--external-job"])
        .arg(format!("sh '{}'", provider.display()))
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let run = run_id_of(&output);
    let journal = home.journal();
    let states: Vec<JobState> = records(&journal, run)
        .iter()
        .filter_map(|record| match &record.event {
            Event::ExternalJobUpdated { job, .. } => Some(job.state),
            _ => None,
        })
        .collect();
    assert_eq!(
        states,
        [JobState::Queued, JobState::Running, JobState::Succeeded]
    );
    let state = state(&journal, run);
    assert_eq!(state.status, RunStatus::Complete);
    let status = status_json(&home, run);
    let job = &status["steps"][0]["externalJob"];
    assert_eq!(job["state"], "completed", "{status}");
    assert_eq!(job["message"], "done", "{status}");
    assert_eq!(job["handleUrl"], "https://jobs.example/1", "{status}");
}

/// A provider speaking pi-subagents' words: its `providerJobId` and `handleUrl` sent once stay
/// the job's through lines that leave them out, `blocked` waits, and `completed` ends the step
/// complete.
#[test]
fn a_providers_partial_lines_in_pi_subagents_words_are_merged_into_its_job() {
    let home = TestHome::new();
    let provider = home.input("provider.sh");
    std::fs::write(
        &provider,
        r#"echo '{"state": "running", "providerJobId": "job-9", "handleUrl": "https://jobs.example/9"}'
echo '{"state": "blocked", "blockingJobId": "job-8"}'
echo '{"state": "completed", "message": "done"}'
"#,
    )
    .expect("write the provider");
    let output = home
        .cmd()
        .args(["run", "--wait", "--json", "--external-job"])
        .arg(format!("sh '{}'", provider.display()))
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let run = run_id_of(&output);
    let journal = home.journal();
    let jobs: Vec<(JobState, Option<String>)> = records(&journal, run)
        .iter()
        .filter_map(|record| match &record.event {
            Event::ExternalJobUpdated { job, .. } => Some((job.state, job.id.clone())),
            _ => None,
        })
        .collect();
    let id = Some("job-9".to_string());
    assert_eq!(
        jobs,
        [
            (JobState::Running, id.clone()),
            (JobState::Blocked, id.clone()),
            (JobState::Succeeded, id)
        ]
    );
    assert_eq!(state(&journal, run).status, RunStatus::Complete);
    let status = status_json(&home, run);
    let job = &status["steps"][0]["externalJob"];
    assert_eq!(job["state"], "completed", "{status}");
    assert_eq!(job["providerJobId"], "job-9", "{status}");
    assert_eq!(job["handleUrl"], "https://jobs.example/9", "{status}");
    assert_eq!(job["message"], "done", "{status}");
}

/// A provider printing progress as fast as it can: its samples are coalesced
/// before the journal, and the latest one before each state change lands, with it.
#[test]
fn a_chatty_providers_samples_are_coalesced_and_the_latest_lands() {
    const LINES: usize = 2000;
    let home = TestHome::new();
    let provider = format!(
        r#"i=0; while [ $i -lt {LINES} ]; do echo "{{\"state\": \"running\", \"progress\": $i}}"; i=$((i+1)); done; echo '{{"state": "succeeded", "progress": {LINES}}}'"#
    );
    let output = home
        .cmd()
        .args(["run", "--wait", "--json", "--external-job", &provider])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let run = run_id_of(&output);
    let journal = home.journal();
    let jobs: Vec<(JobState, Option<f64>)> = records(&journal, run)
        .iter()
        .filter_map(|record| match &record.event {
            Event::ExternalJobUpdated { job, .. } => Some((job.state, job.progress)),
            _ => None,
        })
        .collect();
    // The first status is a transition (the job had none), journaled at once.
    assert_eq!(jobs.first(), Some(&(JobState::Running, Some(0.0))));
    // The last sample before the state change lands, in the same batch as the change.
    let last = (LINES - 1) as f64;
    assert_eq!(
        jobs[jobs.len() - 2..],
        [
            (JobState::Running, Some(last)),
            (JobState::Succeeded, Some(LINES as f64))
        ],
        "{jobs:?}"
    );
    // Samples only ever move forward, and most of the 2,000 were coalesced away: all of
    // them landing would take each line more than 100 ms after the last journaled one.
    assert!(
        jobs.windows(2).all(|pair| pair[0].1 < pair[1].1),
        "{jobs:?}"
    );
    assert!(jobs.len() < LINES / 2, "{} statuses journaled", jobs.len());
    assert_eq!(state(&journal, run).status, RunStatus::Complete);
}

#[test]
fn a_provider_line_that_is_not_a_status_fails_the_step_quoting_it() {
    let home = TestHome::new();
    let output = home
        .cmd()
        .args([
            "run",
            "--wait",
            "--json",
            "--external-job",
            "echo '{\"state\": \"queued\"}'; echo 'this is not json'; sleep 30",
        ])
        .assert()
        .code(1)
        .get_output()
        .stdout
        .clone();
    let journal = home.journal();
    let state = state(&journal, run_id_of(&output));
    assert_eq!(state.steps[0].status, StepStatus::Failed);
    let error = state.steps[0].error.clone().expect("an error");
    assert!(error.contains("this is not json"), "{error}");
}

#[test]
fn the_spec_form_runs_the_steps_it_describes() {
    let home = TestHome::new();
    let spec = home.input("spec.json");
    std::fs::write(
        &spec,
        r#"{
  "name": "nightly",
  "mode": "chain",
  "timeout": "5m",
  "sessionId": "session-1",
  "steps": [
    {"name": "greet", "command": ["echo", "hello from a command"]},
    {"name": "check", "shell": "test -n \"$RUNJOURNAL_RUN_ID\" && echo shell ok"}
  ]
}"#,
    )
    .expect("write the spec");
    let output = home
        .cmd()
        .args(["run", "--wait", "--json", "--spec"])
        .arg(&spec)
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let run = run_id_of(&output);
    let journal = home.journal();
    let state = state(&journal, run);
    assert_eq!(state.status, RunStatus::Complete);
    assert_eq!(state.spec.name.as_deref(), Some("nightly"));
    assert_eq!(state.spec.timeout_ms, Some(300_000));
    assert_eq!(state.session_id.as_deref(), Some("session-1"));
    let names: Vec<&str> = state
        .spec
        .steps
        .iter()
        .map(|step| step.name.as_str())
        .collect();
    assert_eq!(names, ["greet", "check"]);
    let run_dir = home.path().join("runs").join(run.to_string());
    let first = std::fs::read_to_string(run_dir.join("output-0.log")).expect("output 0");
    let second = std::fs::read_to_string(run_dir.join("output-1.log")).expect("output 1");
    assert_eq!(first, "hello from a command\n");
    assert_eq!(second, "shell ok\n");
}

#[test]
fn steps_keep_the_order_of_their_flags() {
    let home = TestHome::new();
    let output = home
        .cmd()
        .args([
            "run",
            "--json",
            "--mode",
            "chain",
            "--external-job",
            "echo '{\"state\": \"succeeded\"}'",
            "--step",
            "echo two",
            "--external-job",
            "echo '{\"state\": \"succeeded\"}'",
        ])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let run = run_id_of(&output);
    let journal = home.journal();
    let state = wait_terminal(&journal, run);
    let kinds: Vec<bool> = state
        .spec
        .steps
        .iter()
        .map(|step| step.is_external_job())
        .collect();
    assert_eq!(kinds, [true, false, true]);
    assert_eq!(state.status, RunStatus::Complete);
}

#[test]
fn the_runner_finishes_after_its_launcher_has_exited() {
    let home = TestHome::new();
    let go = home.file("go");
    // The step waits (boundedly) for a file the test creates only after the launcher exited.
    let script = format!(
        "i=0; while [ ! -e '{}' ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done; echo finished",
        go.display()
    );
    let output = home
        .cmd()
        .args(["run", "--json", "--step", &script])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let run = run_id_of(&output);
    let journal = home.journal();
    let running = state(&journal, run);
    assert_eq!(
        running.status,
        RunStatus::Running,
        "the launcher is gone, the run goes on"
    );
    std::fs::write(&go, b"").expect("create the go file");
    let ended = wait_terminal(&journal, run);
    assert_eq!(ended.status, RunStatus::Complete);
    assert_eq!(ended.steps[0].status, StepStatus::Complete);
    let output = home
        .path()
        .join("runs")
        .join(run.to_string())
        .join("output-0.log");
    assert_eq!(
        std::fs::read_to_string(output).expect("output"),
        "finished\n"
    );
    // The runner records nothing after Terminal.
    let records = records(&journal, run);
    assert_eq!(
        records.last().map(|record| record.event.name()),
        Some("Terminal")
    );
    let steps_finished = records
        .iter()
        .filter(|record| {
            matches!(
                record.event,
                Event::StepFinished { ref outcome, .. } if outcome.end == StepEnd::Complete
            )
        })
        .count();
    assert_eq!(steps_finished, 1);
}

#[test]
fn status_list_logs_and_dismiss_show_a_finished_run() {
    let home = TestHome::new();
    let output = home
        .cmd()
        .args([
            "run", "--wait", "--json", "--name", "shown", "--", "echo", "visible",
        ])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let run = run_id_of(&output);
    let prefix = &run.to_string()[..12];
    home.cmd()
        .args(["status", prefix])
        .assert()
        .success()
        .stdout(predicate::str::contains("complete (exit 0)"));
    let json = home
        .cmd()
        .args(["status", "--json", prefix])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let status: serde_json::Value = serde_json::from_slice(&json).expect("JSON");
    assert_eq!(status["runId"], run.to_string());
    home.cmd()
        .args(["logs", prefix])
        .assert()
        .success()
        .stdout("visible\n");
    home.cmd()
        .args(["list", "--state", "complete"])
        .assert()
        .success()
        .stdout(predicate::str::contains("shown"));
    home.cmd().args(["dismiss", prefix]).assert().success();
    home.cmd()
        .arg("list")
        .assert()
        .success()
        .stdout(predicate::str::contains("shown").not());
    home.cmd()
        .args(["list", "--all"])
        .assert()
        .success()
        .stdout(predicate::str::contains("shown"));
    home.cmd()
        .args(["wait", prefix])
        .assert()
        .code(0)
        .stdout(predicate::str::contains("complete"));
    let journal = home.journal();
    wait_for(&journal, run, "the dismissal", |state| {
        state.dismissed_at_ms.is_some()
    });
}

#[test]
fn every_command_names_a_run_by_its_name_or_tool_call_id() {
    let home = TestHome::new();
    let output = home
        .cmd()
        .args([
            "run",
            "--wait",
            "--json",
            "--name",
            "nightly",
            "--tool-call-id",
            "call-7",
            "--",
            "echo",
            "named",
        ])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let run = run_id_of(&output).to_string();
    for text in ["nightly", "call-7"] {
        home.cmd()
            .args(["status", text])
            .assert()
            .success()
            .stdout(predicate::str::contains(format!(
                "{run}\nname       nightly"
            )));
        home.cmd()
            .args(["logs", text])
            .assert()
            .success()
            .stdout("named\n");
        home.cmd()
            .args(["wait", text])
            .assert()
            .code(0)
            .stdout(predicate::str::contains(&run));
    }
    // The name of no run: exit 2, saying what was tried.
    home.cmd()
        .args(["status", "weekly"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("no run matches \"weekly\""))
        .stderr(predicate::str::contains("name or tool-call id"));
}

/// The launch handshake's pipe is the runner's alone: the runner takes it (its log
/// has no complaint about it), and a step does not see the variable that named it. (The
/// descriptor itself is closed once the runner signalled, before any step starts.)
#[test]
fn a_step_does_not_inherit_the_handshake_variable() {
    let home = TestHome::new();
    let output = home
        .cmd()
        .args([
            "run",
            "--wait",
            "--json",
            "--",
            "sh",
            "-c",
            r#"echo "ready=${RUNJOURNAL_READY_FD:-none}""#,
        ])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let run = run_id_of(&output);
    let run_dir = home.path().join("runs").join(run.to_string());
    let log = std::fs::read_to_string(run_dir.join("output-0.log")).expect("the step's output");
    assert_eq!(log, "ready=none\n");
    let runner_log = std::fs::read_to_string(run_dir.join("runner.log")).expect("runner.log");
    assert!(
        !runner_log.contains("launch handshake"),
        "the runner did not take the pipe: {runner_log}"
    );
}

/// The first command a newcomer types shows what their command printed: `run --wait` follows
/// the steps' output as it comes, between the transitions — the output of a step that has not
/// ended yet is on stdout while it runs — and `--quiet` keeps only the transitions.
#[test]
fn run_wait_follows_the_steps_output_between_transitions_and_quiet_keeps_only_transitions() {
    use std::io::BufRead;
    let home = TestHome::new();
    let gate = home.input("gate");
    let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin!("runjournal"))
        .env_remove("RUNJOURNAL_HOME")
        .env_remove("RUNJOURNAL_LAYOUT")
        .arg("--home")
        .arg(home.path())
        .args(["run", "--wait", "--step"])
        // Prints, then waits (bounded, exit 3 past about a minute) for the test to have read
        // that line from `run --wait` before it ends.
        .arg(format!(
            "echo before-the-gate; i=0; while [ ! -e {gate} ]; do i=$((i+1)); [ $i -gt 600 ] && exit 3; sleep 0.1; done; printf no-newline",
            gate = gate.display()
        ))
        .args(["--step", "echo second-step"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("runjournal starts");
    let stdout = child.stdout.take().expect("piped stdout");
    let mut lines = std::io::BufReader::new(stdout).lines();
    let mut seen = Vec::new();
    for line in lines.by_ref() {
        let line = line.expect("a line");
        let is_marker = line == "before-the-gate";
        seen.push(line);
        if is_marker {
            break;
        }
    }
    assert_eq!(
        seen.last().map(String::as_str),
        Some("before-the-gate"),
        "the running step's output is shown before it ends: {seen:?}"
    );
    std::fs::write(&gate, b"").expect("open the gate");
    seen.extend(lines.map(|line| line.expect("a line")));
    assert!(child.wait().expect("runjournal ends").success(), "{seen:?}");
    let position = |wanted: &dyn Fn(&str) -> bool| {
        seen.iter()
            .position(|line| wanted(line))
            .unwrap_or_else(|| panic!("no such line in {seen:?}"))
    };
    let step0_running = position(&|line| {
        line.contains("step 0 (") && line.ends_with(")") && line.contains(" running (pid ")
    });
    let header0 = position(&|line| line.starts_with("==> step 0 ("));
    let marker = position(&|line| line == "before-the-gate");
    // The unterminated last line is ended before the next transition.
    let tail = position(&|line| line == "no-newline");
    let step0_complete =
        position(&|line| line.contains("step 0 (") && line.contains(" complete (exit 0)"));
    let second = position(&|line| line == "second-step");
    let step1_complete =
        position(&|line| line.contains("step 1 (") && line.contains(" complete (exit 0)"));
    assert!(
        step0_running < header0
            && header0 < marker
            && marker < tail
            && tail < step0_complete
            && step0_complete < second
            && second < step1_complete,
        "output between its step's transitions: {seen:?}"
    );

    // The step's name is its command: what it prints is not in it.
    let quiet = home
        .cmd()
        .args([
            "run",
            "--wait",
            "--quiet",
            "--",
            "sh",
            "-c",
            "echo hidden-$((40+2))",
        ])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let quiet = String::from_utf8(quiet).expect("utf-8");
    assert!(quiet.contains("run complete (exit 0)"), "{quiet}");
    assert!(
        !quiet.contains("hidden-42"),
        "--quiet shows no output: {quiet}"
    );
}
