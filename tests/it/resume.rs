//! `runjournal resume` with the real binaries: a paused chain or parallel run carried on by a
//! new run that runs only what did not complete, the two linked both ways in the journal and in
//! status.json; what cannot be resumed is refused with exit 2.

use std::path::Path;

use crate::support;

use runjournal::event::Event;
use runjournal::state::StepStatus;
use runjournal::testkit as kit;
use runjournal::{RunId, RunStatus};
use support::{TestHome, launch, wait_output};

/// A step that, the first time, says `ready` and waits to be interrupted (its SIGINT trap
/// exits); run again (its marker file there), it prints `carried-on` and ends with `code`.
fn pausing_step(marker: &Path, code: u8) -> String {
    let marker = marker.display();
    format!(
        "if [ -e '{marker}' ]; then echo carried-on; exit {code}; fi; touch '{marker}'; \
         trap 'exit 0' INT; echo ready; while true; do sleep 0.1; done"
    )
}

/// A step that counts its runs in `counter`.
fn counting_step(counter: &Path) -> String {
    format!("echo ran >> '{}'", counter.display())
}

fn runs_of(counter: &Path) -> usize {
    std::fs::read_to_string(counter).map_or(0, |text| text.lines().count())
}

fn output_of(home: &TestHome, run: RunId, index: usize) -> String {
    std::fs::read_to_string(
        home.path()
            .join("runs")
            .join(run.to_string())
            .join(format!("output-{index}.log")),
    )
    .unwrap_or_default()
}

/// Interrupts `run` and waits until it ended paused (exit 130).
fn pause(home: &TestHome, run: RunId) {
    home.cmd()
        .args(["interrupt", &run.to_string()])
        .assert()
        .success();
    home.cmd()
        .args(["wait", &run.to_string()])
        .assert()
        .code(130);
}

fn status_json(home: &TestHome, run: RunId) -> serde_json::Value {
    let path = home
        .path()
        .join("runs")
        .join(run.to_string())
        .join("status.json");
    serde_json::from_slice(&std::fs::read(path).expect("status.json")).expect("JSON")
}

/// Stops the runs still going when a test ends, so none outlives it.
struct StopOnDrop<'a> {
    home: &'a TestHome,
    runs: Vec<RunId>,
}

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        for run in &self.runs {
            let run = run.to_string();
            let _ = self.home.cmd().args(["stop", &run]).output();
            let _ = self.home.cmd().args(["wait", &run]).output();
        }
    }
}

/// `resume RUN --wait --json`: the new run's end, and the command's exit code.
fn resume_and_wait(home: &TestHome, run: RunId) -> (serde_json::Value, i32) {
    let output = home
        .cmd()
        .args(["resume", &run.to_string(), "--wait", "--json"])
        .output()
        .expect("resume runs");
    let end: serde_json::Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|error| panic!("{error}: {}", String::from_utf8_lossy(&output.stdout)));
    (end, output.status.code().expect("an exit code"))
}

/// The two runs are linked both ways: the new run's creation batch holds `Resumed`, the
/// journal's index and both status.json files say so, and `verify` finds nothing wrong.
fn assert_linked(home: &TestHome, old: RunId, new: RunId) {
    let journal = home.journal();
    let records = support::records(&journal, new);
    assert_eq!(
        support::event_names(&records[..2]),
        ["RunCreated", "Resumed"],
        "the link is in the new run's creation batch"
    );
    assert_eq!(
        (records[0].writer, records[0].writer_seq),
        (records[1].writer, records[1].writer_seq),
        "one batch"
    );
    assert_eq!(records[1].event, Event::Resumed { from: old });
    let view = journal.view().expect("a view");
    let links = view.resume_links(old).expect("links");
    assert_eq!(links.resumed_by, Some(new));
    assert_eq!(
        view.resume_links(new).expect("links").resumed_from,
        Some(old)
    );
    drop(view);
    // The paused run's history is closed: it holds no link, and it is still paused.
    let old_records = support::records(&journal, old);
    assert!(
        !support::event_names(&old_records).contains(&"Resumed"),
        "{:?}",
        support::event_names(&old_records)
    );
    assert_eq!(support::state(&journal, old).status, RunStatus::Paused);
    assert_eq!(
        status_json(home, old)["resumedBy"],
        new.to_string(),
        "the paused run's status.json names the run that carries it on"
    );
    assert_eq!(status_json(home, new)["resumedFrom"], old.to_string());
    let events = std::fs::read_to_string(
        home.path()
            .join("runs")
            .join(new.to_string())
            .join("events.jsonl"),
    )
    .expect("events.jsonl");
    let second: serde_json::Value =
        serde_json::from_str(events.lines().nth(1).expect("a second line")).expect("JSON");
    assert_eq!(second["type"], "Resumed");
    assert_eq!(second["from"], old.to_string());
    // Both runners seen to end (by their launchers, the home's watcher or a pass, which record
    // it and then project it), and a pass after that, which brings every file to the journal:
    // only then is the home at rest for verify.
    support::reconcile_until_closed(&home.path().join("journal.redb"), &[old, new], || {
        home.cmd().arg("reconcile").assert().success();
    });
    home.cmd().arg("reconcile").assert().success();
    let report = runjournal::verify::verify(
        &journal.view().expect("a view"),
        Some(&runjournal::Home::at(home.path())),
    );
    assert!(report.problems.is_empty(), "verify: {:?}", report.problems);
    // `status` shows the links.
    let shown = home
        .cmd()
        .args(["status", &old.to_string()])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let shown = String::from_utf8_lossy(&shown);
    assert!(
        shown
            .lines()
            .any(|line| line.starts_with("resumed by") && line.contains(&new.to_string())),
        "{shown}"
    );
}

#[test]
fn a_paused_chain_resumes_at_its_interrupted_step_and_completes() {
    let home = TestHome::new();
    let first = home.file("first.count");
    let third = home.file("third.count");
    let marker = home.file("second.marker");
    let old = launch(
        &home,
        &[
            "--mode",
            "chain",
            "--name",
            "nightly",
            "--session-id",
            "session-7",
            "--owner-id",
            "owner-7",
            "--tool-call-id",
            "call-7",
            "--timeout",
            "10m",
            "--step",
            &counting_step(&first),
            "--step",
            &pausing_step(&marker, 0),
            "--step",
            &counting_step(&third),
        ],
    );
    let mut stop = StopOnDrop {
        home: &home,
        runs: vec![old],
    };
    wait_output(&home, old, 1, "ready");
    pause(&home, old);
    assert_eq!(
        runs_of(&third),
        0,
        "the step after the interrupted one never ran"
    );

    let (end, code) = resume_and_wait(&home, old);
    let new: RunId = end["runId"]
        .as_str()
        .expect("runId")
        .parse()
        .expect("a run id");
    stop.runs.push(new);
    assert_eq!(code, 0, "{end}");
    assert_eq!(end["state"], "complete", "{end}");
    assert_ne!(new, old);

    let journal = home.journal();
    let state = support::state(&journal, new);
    let old_state = support::state(&journal, old);
    assert_eq!(state.status, RunStatus::Complete);
    // The interrupted step and the rest, and nothing before them.
    let names: Vec<&str> = state
        .spec
        .steps
        .iter()
        .map(|step| step.name.as_str())
        .collect();
    let expected: Vec<&str> = old_state.spec.steps[1..]
        .iter()
        .map(|step| step.name.as_str())
        .collect();
    assert_eq!(names, expected);
    assert_eq!(runs_of(&first), 1, "the completed step did not run again");
    assert_eq!(runs_of(&third), 1);
    assert!(output_of(&home, new, 0).contains("carried-on"));
    // Inherited: name, host ids, cwd, and the timeout it had left.
    assert_eq!(state.spec.name.as_deref(), Some("nightly"));
    assert_eq!(state.session_id.as_deref(), Some("session-7"));
    assert_eq!(state.completion_owner_id.as_deref(), Some("owner-7"));
    assert_eq!(state.tool_call_id.as_deref(), Some("call-7"));
    assert_eq!(state.spec.cwd, old_state.spec.cwd);
    let left = state.spec.timeout_ms.expect("a timeout");
    let spent = old_state.ended_at_ms().expect("ended")
        - old_state.runner.as_ref().expect("a runner").started_at_ms;
    assert_eq!(left, 600_000 - spent);
    assert_linked(&home, old, new);
    // The name and the tool-call id now name the new run.
    let shown = home
        .cmd()
        .args(["status", "--json", "call-7"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let shown: serde_json::Value = serde_json::from_slice(&shown).expect("JSON");
    assert_eq!(shown["runId"], new.to_string());
    assert_eq!(shown["resumedFrom"], old.to_string());

    // Resumed once: a second resume of the paused run is refused, naming the first.
    let refused = home
        .cmd()
        .args(["resume", &old.to_string()])
        .assert()
        .code(2)
        .get_output()
        .stderr
        .clone();
    let refused = String::from_utf8_lossy(&refused);
    assert!(
        refused.contains("already resumed") && refused.contains(&new.to_string()),
        "{refused}"
    );
    assert_eq!(
        support::state(&journal, old).status,
        RunStatus::Paused,
        "a refusal writes nothing"
    );
}

#[test]
fn a_paused_parallel_run_resumes_only_the_steps_that_did_not_complete() {
    let home = TestHome::new();
    let quick = home.file("quick.count");
    let slow_a = home.file("a.marker");
    let slow_b = home.file("b.marker");
    let old = launch(
        &home,
        &[
            "--mode",
            "parallel",
            "--step",
            &pausing_step(&slow_a, 0),
            "--step",
            &counting_step(&quick),
            "--step",
            &pausing_step(&slow_b, 0),
        ],
    );
    let mut stop = StopOnDrop {
        home: &home,
        runs: vec![old],
    };
    wait_output(&home, old, 0, "ready");
    wait_output(&home, old, 2, "ready");
    let journal = home.journal();
    support::wait_for(&journal, old, "the quick step to complete", |state| {
        state.steps[1].status == StepStatus::Complete
    });
    pause(&home, old);
    // Closed (its runner's end recorded by a reconcile pass), and a pass after that: from
    // here only a change of another run can make a pass look at the paused run's files.
    support::wait_for(&journal, old, "the paused run to be closed", |state| {
        let _ = home.cmd().arg("reconcile").output();
        state.is_closed()
    });
    home.cmd().arg("reconcile").assert().success();

    let output = home
        .cmd()
        .args(["resume", &old.to_string(), "--json"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let report: serde_json::Value = serde_json::from_slice(&output).expect("JSON");
    let new: RunId = report["runId"]
        .as_str()
        .expect("runId")
        .parse()
        .expect("id");
    stop.runs.push(new);
    assert_eq!(report["resumedFrom"], old.to_string());
    assert_eq!(report["steps"], serde_json::json!([0, 2]), "{report}");
    assert_eq!(report["state"], "running", "{report}");
    // Files left behind by a resume killed between its commit and the paused run's projection
    // (here: status.json without its link) are repaired by the next reconcile pass.
    let old_status = home
        .path()
        .join("runs")
        .join(old.to_string())
        .join("status.json");
    let mut stale = status_json(&home, old);
    assert_eq!(stale["resumedBy"], new.to_string());
    stale
        .as_object_mut()
        .expect("an object")
        .remove("resumedBy");
    std::fs::write(
        &old_status,
        serde_json::to_vec_pretty(&stale).expect("JSON"),
    )
    .expect("write status.json");
    home.cmd().arg("reconcile").assert().success();
    assert_eq!(status_json(&home, old)["resumedBy"], new.to_string());
    home.cmd().args(["wait", &new.to_string()]).assert().code(0);
    let state = support::state(&journal, new);
    assert_eq!(state.status, RunStatus::Complete);
    assert_eq!(state.spec.steps.len(), 2);
    assert_eq!(runs_of(&quick), 1, "the completed step did not run again");
    assert!(output_of(&home, new, 0).contains("carried-on"));
    assert!(output_of(&home, new, 1).contains("carried-on"));
    assert_linked(&home, old, new);
}

#[test]
fn only_a_paused_run_is_resumed_and_a_refusal_writes_nothing() {
    let home = TestHome::new();
    let marker = home.file("marker");
    // A running run.
    let running = launch(&home, &["--step", &pausing_step(&marker, 0)]);
    let _stop = StopOnDrop {
        home: &home,
        runs: vec![running],
    };
    wait_output(&home, running, 0, "ready");
    // A complete run, and a failed one.
    let complete = launch(&home, &["--step", "true"]);
    let failed = launch(&home, &["--step", "exit 3"]);
    for (run, code) in [(complete, 0), (failed, 3)] {
        home.cmd()
            .args(["wait", &run.to_string()])
            .assert()
            .code(code);
    }
    let journal = home.journal();
    // The ended runs' runners' exits are recorded by whoever sees them first (the home's
    // watcher, a command's reconcile pass): all recorded before counting.
    for run in [complete, failed] {
        support::wait_for(&journal, run, "its runner's exit recorded", |state| {
            state.process_terminal.is_some()
        });
    }
    let before = support::record_count(&journal);
    for (run, state) in [
        (running, "running"),
        (complete, "complete"),
        (failed, "failed"),
    ] {
        let said = home
            .cmd()
            .args(["resume", &run.to_string()])
            .assert()
            .code(2)
            .get_output()
            .stderr
            .clone();
        let said = String::from_utf8_lossy(&said);
        assert!(
            said.contains(&format!("it is {state}; only a paused run can be resumed")),
            "{said}"
        );
    }
    home.cmd()
        .args(["resume", "01ARZ3NDEKTSV4RRFFQ69G5FAV"])
        .assert()
        .code(2);
    assert_eq!(
        support::record_count(&journal),
        before,
        "nothing was written"
    );
    assert_eq!(
        journal
            .view()
            .expect("a view")
            .all_runs()
            .expect("runs")
            .len(),
        3,
        "no run was created"
    );
}

#[test]
fn resume_wait_exits_as_the_resumed_run_does() {
    let home = TestHome::new();
    let marker = home.file("marker");
    // A single run whose step, run again, fails with 7.
    let old = launch(&home, &["--step", &pausing_step(&marker, 7)]);
    let mut stop = StopOnDrop {
        home: &home,
        runs: vec![old],
    };
    wait_output(&home, old, 0, "ready");
    pause(&home, old);
    let (end, code) = resume_and_wait(&home, old);
    let new: RunId = end["runId"].as_str().expect("runId").parse().expect("id");
    stop.runs.push(new);
    assert_eq!(end["state"], "failed", "{end}");
    assert_ne!(code, 0);
    assert_eq!(Some(i64::from(code)), end["exitCode"].as_i64(), "{end}");
    let waited = home
        .cmd()
        .args(["wait", &new.to_string()])
        .output()
        .expect("wait runs");
    assert_eq!(
        waited.status.code(),
        Some(code),
        "wait and resume --wait agree"
    );
    assert!(output_of(&home, new, 0).contains("carried-on"));
    assert_linked(&home, old, new);
}

/// The journal's side, without binaries: a resume whose runner never started gives way to
/// another, and `verify` checks the resume index against the records.
#[test]
fn verify_checks_the_resume_index_against_the_records() {
    use runjournal::event::{HostIds, Mode, Observer, Proof, Repairer, TerminalState};
    use runjournal::journal::Condition;
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("journal.redb");
    let journal = runjournal::Journal::open(&path).expect("a journal");
    let spec = kit::spec(Mode::Single, vec![kit::shell("work", "true")]);
    let old = journal
        .create_run(spec.clone(), HostIds::default())
        .expect("created")
        .run;
    journal
        .append(
            old,
            vec![
                kit::runner_started(kit::identity(4242), "i1"),
                kit::terminal(TerminalState::Paused, 130, "paused", None),
            ],
            Condition::expect_head(1),
        )
        .expect("paused");
    let resume = || {
        journal
            .create_run_with(
                spec.clone(),
                HostIds::default(),
                vec![Event::Resumed { from: old }],
            )
            .expect("resumed")
            .run
    };
    let unstarted = resume();
    journal
        .append(
            unstarted,
            vec![
                Event::Terminal {
                    state: TerminalState::Failed,
                    error: Some("runner did not start".to_string()),
                    summary: "the runner never started".to_string(),
                    exit_code: 1,
                    repaired_by: Some(Repairer::Launcher),
                },
                kit::process_terminal("", None, Proof::NotStarted, Observer::Launcher),
            ],
            Condition::expect_head(2),
        )
        .expect("given up");
    let resumed = resume();
    let report = runjournal::verify::verify(&journal.view().expect("a view"), None);
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert_eq!(
        journal
            .view()
            .expect("a view")
            .resume_links(old)
            .expect("links")
            .resumed_by,
        Some(resumed)
    );
    drop(journal);

    // An index that lost its entry is reported, naming the paused run.
    let resumes: redb::TableDefinition<&[u8; 16], &[u8; 16]> =
        redb::TableDefinition::new("resumes");
    {
        let db = redb::Database::builder()
            .create(&path)
            .expect("the journal opens in redb");
        let txn = db.begin_write().expect("a write");
        txn.open_table(resumes)
            .expect("the table")
            .remove(&old.to_bytes())
            .expect("removed");
        txn.commit().expect("committed");
    }
    let journal = runjournal::Journal::open(&path).expect("a journal");
    let report = runjournal::verify::verify(&journal.view().expect("a view"), None);
    let found: Vec<(Option<RunId>, &str)> = report
        .problems
        .iter()
        .map(|problem| (problem.run, problem.kind.as_str()))
        .collect();
    assert_eq!(
        found,
        [(Some(old), "resume-index")],
        "{:?}",
        report.problems
    );
    assert!(
        report.problems[0].message.contains(&resumed.to_string()),
        "{:?}",
        report.problems
    );
}

/// A resume that could not take its paused run's control inbox went on without it: the host's
/// message in that inbox was never read again (nothing reads a paused run's inbox after its
/// resume). Now such a resume fails, saying so, and resumes nothing; the next resume takes the
/// message and carries it on.
#[test]
fn a_resume_that_cannot_take_the_paused_runs_inbox_fails_and_the_next_takes_it() {
    let home = TestHome::new();
    let marker = home.file("marker");
    let run = launch(&home, &["--step", &pausing_step(&marker, 0)]);
    wait_output(&home, run, 0, "ready");
    pause(&home, run);
    let steer_dir = home
        .path()
        .join("runs")
        .join(run.to_string())
        .join("control")
        .join("steer-requests");
    std::fs::create_dir_all(&steer_dir).expect("the steer requests' directory");
    let request = steer_dir.join("0000000000001-kept.json");
    std::fs::write(
        &request,
        br#"{"type": "steer", "id": "kept", "ts": 1, "message": "for the resume"}"#,
    )
    .expect("the host's request");
    let fail_file = home.file("fail-control-append");
    std::fs::write(&fail_file, b"").expect("the hook's file");
    let failed = home
        .cmd()
        .env(runjournal::control_inbox::FAIL_APPEND_ENV, &fail_file)
        .args(["resume", &run.to_string()])
        .output()
        .expect("resume runs");
    assert_eq!(failed.status.code(), Some(1), "{failed:?}");
    let said = String::from_utf8_lossy(&failed.stderr);
    assert!(
        said.contains("its control inbox could not be taken")
            && said.contains("nothing was resumed"),
        "{said}"
    );
    assert!(request.exists(), "the host's request is still in the inbox");
    let journal = home.journal();
    assert_eq!(
        journal.view().expect("a view").all_runs().expect("runs"),
        vec![run],
        "nothing was resumed"
    );
    drop(journal);

    let (end, code) = resume_and_wait(&home, run);
    assert_eq!(code, 0, "{end}");
    assert!(!request.exists(), "the next resume took the request");
    let journal = home.journal();
    let resumed = journal
        .view()
        .expect("a view")
        .resume_links(run)
        .expect("links")
        .resumed_by
        .expect("the run was resumed");
    let carried: Vec<String> = support::records(&journal, resumed)
        .into_iter()
        .filter_map(|record| match record.event {
            Event::SteerRequested { id, message, .. } => Some(format!("{id}: {message}")),
            _ => None,
        })
        .collect();
    assert_eq!(
        carried,
        ["kept: for the resume"],
        "the message went on with the resume, once"
    );
}

/// Regression (a power-cut soak found it): a paused run that took a message for its resume
/// had its result rewritten with its head's seq as its `Terminal`'s (`journalSeq`): the walk
/// back from the head stopped at the `SteerRequested`, which only a paused run takes after its
/// end. Every pass then found the result differing from a fresh projection.
#[test]
fn a_paused_run_that_takes_a_message_keeps_its_results_terminal_seq() {
    let home = TestHome::new();
    let dir = tempfile::tempdir().expect("temp dir");
    let marker = dir.path().join("marker");
    let run = launch(&home, &["--step", &pausing_step(&marker, 0)]);
    let _stop = StopOnDrop {
        home: &home,
        runs: vec![run],
    };
    wait_output(&home, run, 0, "ready");
    pause(&home, run);
    home.cmd()
        .args(["steer", &run.to_string(), "for the resume"])
        .assert()
        .success();
    let journal = home.journal();
    let records = support::records(&journal, run);
    let terminal_seq = records
        .iter()
        .find(|record| matches!(record.event, runjournal::event::Event::Terminal { .. }))
        .expect("a Terminal")
        .seq;
    assert!(
        records.iter().any(|record| record.seq > terminal_seq
            && matches!(
                record.event,
                runjournal::event::Event::SteerRequested { .. }
            )),
        "the message is kept after the end: {records:?}"
    );
    let result: serde_json::Value = serde_json::from_slice(
        &std::fs::read(home.path().join("results").join(format!("{run}.json")))
            .expect("the result"),
    )
    .expect("JSON");
    assert_eq!(result["journalSeq"], terminal_seq, "{result}");
    support::check_journal(
        &journal.view().expect("a view"),
        Some(&runjournal::Home::at(home.path())),
    );
}
