//! Control with real processes: stop (grandchildren included), timeout, a stop recorded before
//! the runner starts, pushed external-job updates, control files written in place, and steer
//! messages a step took after its runner died.

use crate::support;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use predicates::prelude::*;
use runjournal::HostIds;
use runjournal::event::{ControlAction, Event, JobState, Mode};
use runjournal::state::StepStatus;
use runjournal::testkit as kit;
use runjournal::{Condition, Home, RunId, RunStatus, Store};
use support::{TestHome, group_members, records, run_id_of, state, wait_for, wait_terminal};

#[test]
fn stop_ends_the_whole_process_group_of_a_step() {
    let home = TestHome::new();
    let output = home
        .cmd()
        .args([
            "run",
            "--json",
            "--",
            "sh",
            "-c",
            "sleep 100 & sleep 100 & wait",
        ])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let run = run_id_of(&output);
    let journal = home.journal();
    let running = wait_for(&journal, run, "the step to run", |state| {
        state.steps[0].status == StepStatus::Running
    });
    let pgid = running.steps[0]
        .process
        .as_ref()
        .expect("StepRunning names the step's process")
        .pid;
    // The shell and its two sleeps.
    let mut members = Vec::new();
    for _ in 0..400 {
        members = group_members(pgid);
        if members.len() >= 3 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
    assert!(members.len() >= 3, "the step's group has {members:?}");
    home.cmd()
        .args(["stop", &run.to_string()])
        .assert()
        .success()
        .stdout(predicate::str::contains("stop requested"));
    let ended = wait_terminal(&journal, run);
    assert_eq!(ended.status, RunStatus::Stopped);
    assert_eq!(ended.steps[0].status, StepStatus::Stopped);
    assert_eq!(ended.terminal.expect("terminal").exit_code, 143);
    assert_eq!(
        group_members(pgid),
        Vec::<u32>::new(),
        "no process of the step's group survives the stop"
    );
    // A second stop of an ended run is harmless.
    home.cmd()
        .args(["stop", &run.to_string()])
        .assert()
        .success()
        .stdout(predicate::str::contains("already ended"));
}

#[test]
fn a_timeout_fails_the_run_naming_the_timeout() {
    let home = TestHome::new();
    let output = home
        .cmd()
        .args([
            "run",
            "--wait",
            "--json",
            "--timeout",
            "1s",
            "--",
            "sleep",
            "30",
        ])
        .assert()
        .code(124)
        .get_output()
        .stdout
        .clone();
    let run = run_id_of(&output);
    let journal = home.journal();
    let state = state(&journal, run);
    assert_eq!(state.status, RunStatus::Failed);
    let error = state
        .terminal
        .clone()
        .expect("terminal")
        .error
        .expect("an error");
    assert!(error.contains("timeout of 1s"), "{error}");
    assert!(state.has_control(ControlAction::Timeout));
    assert_eq!(state.steps[0].status, StepStatus::Failed);
}

#[test]
fn a_stop_recorded_before_the_runner_starts_a_step_is_honoured() {
    let home = TestHome::new();
    let marker = home.file("ran");
    let store = Arc::new(Store::open(Home::at(home.path())).expect("open the home"));
    let touch = kit::argv(&["touch", &marker.display().to_string()]);
    let spec = kit::spec(Mode::Single, vec![kit::step("touch", touch)]);
    let run = store
        .create_run(spec, HostIds::default())
        .expect("create")
        .run;
    store
        .append(
            run,
            vec![kit::control(
                ControlAction::Stop,
                "test",
                "before the runner",
            )],
            Condition::expect_head(1),
        )
        .expect("record the stop");
    drop(store);
    home.cmd()
        .args(["__runner", &run.to_string()])
        .assert()
        .success();
    let journal = home.journal();
    let state = state(&journal, run);
    assert_eq!(state.status, RunStatus::Stopped);
    assert_eq!(state.steps[0].status, StepStatus::Skipped);
    assert!(
        !records(&journal, run)
            .iter()
            .any(|record| matches!(record.event, Event::StepRunning { .. })),
        "no step may start after a stop"
    );
    assert!(!marker.exists(), "the step's program never ran");
}

/// `runjournal stop RUN --step N` stops that step alone: its process group ends, the run
/// (which has retries) ends `failed` naming the stop, exit 1, and is not tried again. A step the
/// run does not have is bad input; a stop of a step that ended changes nothing.
#[test]
fn stop_of_one_step_ends_that_step_and_the_run_is_not_tried_again() {
    let home = TestHome::new();
    let output = home
        .cmd()
        .args([
            "run",
            "--json",
            "--retries",
            "2",
            "--mode",
            "chain",
            "--step",
            "true",
            "--step",
            "sleep 100 & sleep 100 & wait",
        ])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let run = run_id_of(&output);
    let journal = home.journal();
    let running = wait_for(&journal, run, "step 1 to run", |state| {
        state.steps[1].status == StepStatus::Running
    });
    let pgid = running.steps[1].process.as_ref().expect("its process").pid;
    home.cmd()
        .args(["stop", &run.to_string(), "--step", "7"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("no step 7"));
    home.cmd()
        .args(["stop", &run.to_string(), "--step", "0"])
        .assert()
        .success()
        .stdout(predicate::str::contains(
            "step 0 has already ended (complete)",
        ));
    home.cmd()
        .args([
            "stop",
            &run.to_string(),
            "--step",
            "1",
            "--reason",
            "enough of it",
        ])
        .assert()
        .success()
        .stdout(predicate::str::contains("stop of step 1 requested"));
    let ended = wait_terminal(&journal, run);
    assert_eq!(ended.status, RunStatus::Failed);
    assert_eq!(ended.steps[0].status, StepStatus::Complete);
    assert_eq!(ended.steps[1].status, StepStatus::Stopped);
    let error = ended.terminal.and_then(|end| end.error).unwrap_or_default();
    assert!(error.contains("enough of it"), "{error}");
    assert_eq!(
        ended.retry.map(|retry| retry.attempts.len()),
        Some(0),
        "a run a host stopped a step of is not tried again"
    );
    assert!(
        group_members(pgid).is_empty(),
        "the step's whole process group ended"
    );
    home.cmd().args(["wait", &run.to_string()]).assert().code(1);
}

#[test]
fn pushed_job_updates_land_in_the_journal_and_end_the_step() {
    let home = TestHome::new();
    // A provider that reports nothing itself: the job is followed by pushes only.
    let output = home
        .cmd()
        .args(["run", "--json", "--external-job", "sleep 60"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let run = run_id_of(&output);
    let journal = home.journal();
    wait_for(&journal, run, "the step to run", |state| {
        state.steps[0].status == StepStatus::Running
    });
    home.cmd()
        .args([
            "job",
            "update",
            &run.to_string(),
            "0",
            "--state",
            "running",
            "--progress",
            "0.25",
            "--message",
            "pushed",
            "--id",
            "remote-7",
        ])
        .assert()
        .success();
    let job = state(&journal, run).steps[0]
        .job
        .clone()
        .expect("a job status");
    assert_eq!(job.state, JobState::Running);
    assert_eq!(job.progress, Some(0.25));
    assert_eq!(job.message.as_deref(), Some("pushed"));
    assert_eq!(job.id.as_deref(), Some("remote-7"));
    home.cmd()
        .args([
            "job",
            "update",
            &run.to_string(),
            "0",
            "--state",
            "succeeded",
        ])
        .assert()
        .success();
    let ended = wait_terminal(&journal, run);
    assert_eq!(ended.status, RunStatus::Complete);
    assert_eq!(ended.steps[0].status, StepStatus::Complete);
    let pushed = records(&journal, run)
        .iter()
        .filter(|record| matches!(record.event, Event::ExternalJobUpdated { .. }))
        .count();
    assert_eq!(pushed, 2);
    let status_path = home
        .path()
        .join("runs")
        .join(run.to_string())
        .join("status.json");
    let status: serde_json::Value =
        serde_json::from_slice(&std::fs::read(status_path).expect("status.json")).expect("JSON");
    assert_eq!(status["steps"][0]["externalJob"]["state"], "completed");
}

/// Waits until the run's recorded runner is gone (by its full identity).
fn wait_runner_gone(journal: &runjournal::Journal, run: runjournal::RunId) {
    wait_for(journal, run, "the runner to be gone", |state| {
        state.runner.as_ref().is_some_and(|runner| {
            matches!(
                runjournal::liveness::check(&runner.identity),
                Ok(runjournal::liveness::Liveness::Dead)
            )
        })
    });
}

/// Reads say nothing about routine bookkeeping: runs whose runner exited after
/// recording their end are closed silently; a stale run is repaired and reported once, in
/// one line that names it and points at `runjournal reconcile`.
#[test]
fn reads_close_ended_runs_silently_and_report_a_repair_once_in_one_line() {
    let home = TestHome::new();
    let journal = home.journal();
    let mut ended = Vec::new();
    for _ in 0..3 {
        let output = home
            .cmd()
            .args(["run", "--json", "--", "true"])
            .assert()
            .success()
            .get_output()
            .stdout
            .clone();
        ended.push(run_id_of(&output));
    }
    for &run in &ended {
        wait_terminal(&journal, run);
        wait_runner_gone(&journal, run);
    }
    home.cmd()
        .arg("list")
        .assert()
        .success()
        .stderr(predicate::str::is_empty());
    for &run in &ended {
        assert!(
            state(&journal, run).process_terminal.is_some(),
            "the list closed run {run}"
        );
    }

    let output = home
        .cmd()
        .args(["run", "--json", "--", "sleep", "60"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let stale = run_id_of(&output);
    let running = wait_for(&journal, stale, "the step to run", |state| {
        state.steps[0].status == StepStatus::Running
    });
    // What a command's read repairs, with no watcher to repair it first.
    home.stop_watcher();
    let runner = running.runner.expect("a runner took the run").identity.pid;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(runner as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the runner");
    wait_runner_gone(&journal, stale);
    let stderr = home
        .cmd()
        .args(["status", &stale.to_string()])
        .assert()
        .success()
        .get_output()
        .stderr
        .clone();
    let stderr = String::from_utf8(stderr).expect("utf-8");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains(&stale.to_string()) && stderr.contains("`runjournal reconcile`"),
        "{stderr}"
    );
    assert_eq!(state(&journal, stale).status, RunStatus::Failed);
    home.cmd()
        .arg("list")
        .assert()
        .success()
        .stderr(predicate::str::is_empty());
}

/// Reads a JSON file the run's projections hold.
fn status_json_of(home: &TestHome, run: RunId) -> serde_json::Value {
    let path = home
        .path()
        .join("runs")
        .join(run.to_string())
        .join("status.json");
    serde_json::from_slice(&std::fs::read(path).expect("status.json")).expect("JSON")
}

/// The `.json` files in a directory (none when it is missing).
fn json_files_in(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .map(|entry| entry.expect("an entry").path())
        .filter(|path| {
            path.extension()
                .is_some_and(|extension| extension == "json")
        })
        .collect()
}

/// Polls `done` until it holds; panics naming `what` after a generous bound.
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..1200 {
        if done() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("gave up waiting for {what}");
}

/// A control file written in place as a shell's `>` writes it: made (empty) at once, then
/// written in two pieces, the second after [`IN_PLACE_PAUSE`], then closed.
struct InPlaceWrite {
    file: std::fs::File,
    rest: Vec<u8>,
}

/// Longer than the runner's poll (250 ms): a runner that reads a file the moment it changes
/// finds it half written, every time.
const IN_PLACE_PAUSE: Duration = Duration::from_millis(400);

impl InPlaceWrite {
    fn begin(path: &Path, body: &str) -> InPlaceWrite {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .expect("the control file made");
        let (first, rest) = body.as_bytes().split_at(body.len() / 2);
        file.write_all(first).expect("the first piece");
        InPlaceWrite {
            file,
            rest: rest.to_vec(),
        }
    }

    fn finish(mut self) {
        self.file.write_all(&self.rest).expect("the second piece");
    }
}

/// A request written in place (a shell's `echo … > control/stop.json`) was read the moment it
/// was made, before it was written, and refused as not JSON: the request was lost. 200 steer
/// requests written in place into two running runs, each in two pieces with a pause longer
/// than the runner's poll between them, are all taken and none refused; then a `stop.json`
/// written the same way ends each run stopped.
#[test]
fn requests_written_in_place_are_all_taken_none_refused() {
    const ROUNDS: usize = 20;
    const PER_RUN_PER_ROUND: usize = 5;
    let home = TestHome::new();
    let layout = Home::at(home.path());
    // The step takes each message as it comes, so the run's queue of messages never fills.
    let drains = "echo ready; while :; do for f in \"$RUNJOURNAL_INBOX\"/*.json; do \
                  [ -f \"$f\" ] && rm -f \"$f\"; done; sleep 0.05; done";
    let runs: Vec<RunId> = (0..2)
        .map(|_| support::launch(&home, &["--", "sh", "-c", drains]))
        .collect();
    let journal = home.journal();
    for &run in &runs {
        wait_for(&journal, run, "the step to run", |state| {
            state.steps[0].status == StepStatus::Running
        });
    }
    let mut sent: Vec<(RunId, String)> = Vec::new();
    for round in 0..ROUNDS {
        let mut writes = Vec::new();
        for &run in &runs {
            for index in 0..PER_RUN_PER_ROUND {
                let id = format!("in-place-{round}-{index}");
                let path = layout.steer_requests_dir(run).join(format!("{id}.json"));
                let body = format!(
                    r#"{{"type":"steer","id":"{id}","ts":1700000000000,"message":"written in place","source":"a shell"}}"#
                );
                writes.push(InPlaceWrite::begin(&path, &body));
                sent.push((run, id));
            }
        }
        std::thread::sleep(IN_PLACE_PAUSE);
        for write in writes {
            write.finish();
        }
        for &run in &runs {
            wait_until("the round's files to be taken", || {
                json_files_in(&layout.steer_requests_dir(run)).is_empty()
            });
            wait_for(&journal, run, "the step to take its messages", |state| {
                state.queued_steers().next().is_none()
            });
        }
    }
    assert_eq!(sent.len(), 200);
    for &run in &runs {
        let records = records(&journal, run);
        let refused: Vec<&Event> = records
            .iter()
            .map(|record| &record.event)
            .filter(|event| matches!(event, Event::ControlRefused { .. }))
            .collect();
        assert!(
            refused.is_empty(),
            "run {run}: {} of its files refused, the first {:?}",
            refused.len(),
            refused.first()
        );
        assert_eq!(
            json_files_in(&layout.control_refused_dir(run)),
            Vec::<PathBuf>::new()
        );
        let state = state(&journal, run);
        for (_, id) in sent.iter().filter(|(sent_to, _)| *sent_to == run) {
            assert!(
                state.steer(id).is_some(),
                "run {run}: the request {id} written in place is journaled"
            );
        }
        assert_eq!(state.steers.len(), ROUNDS * PER_RUN_PER_ROUND, "each once");
    }

    // The stop of the report, written in place as `echo … > control/stop.json` writes it.
    let stops: Vec<InPlaceWrite> = runs
        .iter()
        .map(|&run| {
            InPlaceWrite::begin(
                &layout.control_dir(run).join("stop.json"),
                r#"{"type":"stop","reason":"written in place"}"#,
            )
        })
        .collect();
    std::thread::sleep(IN_PLACE_PAUSE);
    for stop in stops {
        stop.finish();
    }
    for &run in &runs {
        let ended = wait_terminal(&journal, run);
        assert_eq!(ended.status, RunStatus::Stopped, "run {run}");
        let control = ended.controls.first().expect("the stop is recorded");
        assert_eq!(control.action, ControlAction::Stop);
        assert!(
            !records(&journal, run)
                .iter()
                .any(|record| matches!(record.event, Event::ControlRefused { .. })),
            "run {run}: the stop written in place is not refused"
        );
    }
}

/// A step took waiting messages from its inbox after its runner was SIGKILLed; the reconciler
/// recorded every one of them failed (`delivered 0, failed 4`), so a host resending failed
/// messages delivered them twice, and a `steer` sent after the kill said it was handed to the
/// step. Now: the step takes 3 of 4 messages after the kill; `steer` says no runner is left
/// (exit 1, nothing recorded); `reconcile` records the 3 delivered and only the fourth failed.
#[test]
fn steers_a_step_took_after_its_runner_died_are_recorded_delivered() {
    let home = TestHome::new();
    let layout = Home::at(home.path());
    let go = home.input("go");
    // Waits for `go`, then takes three messages, one at a time; writes nothing after `ready`
    // (its output's reader, the runner, is gone by then).
    let step = format!(
        "echo ready; while [ ! -e '{go}' ]; do sleep 0.05; done; n=0; \
         while [ $n -lt 3 ]; do for f in \"$RUNJOURNAL_INBOX\"/*.json; do \
         [ -f \"$f\" ] || continue; rm -f \"$f\"; n=$((n+1)); break; done; sleep 0.2; done; \
         sleep 300",
        go = go.display()
    );
    let run = support::launch(&home, &["--", "sh", "-c", &step]);
    let journal = home.journal();
    let running = wait_for(&journal, run, "the step to run", |state| {
        state.steps[0].status == StepStatus::Running
    });
    support::wait_output(&home, run, 0, "ready");
    for index in 1..=4 {
        home.cmd()
            .args(["steer", &run.to_string(), &format!("message {index}")])
            .assert()
            .success()
            .stdout(predicate::str::contains("handed to the step"));
    }
    let inbox = layout.step_inbox_dir(run, 0);
    wait_until("the runner to write the 4 messages into the inbox", || {
        json_files_in(&inbox).len() == 4
    });
    let runner = running.runner.expect("a runner took the run").identity.pid;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(runner).expect("a pid")),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the runner");
    wait_runner_gone(&journal, run);

    // Nobody is left to hand a message over: said, and nothing recorded.
    home.cmd()
        .args(["steer", &run.to_string(), "after the kill"])
        .assert()
        .code(1)
        .stdout(predicate::str::is_empty())
        .stderr(predicate::str::contains("no runner is left"));
    assert_eq!(state(&journal, run).steers.len(), 4);

    std::fs::write(&go, b"").expect("the step may take its messages");
    wait_until("the step to take 3 messages", || {
        json_files_in(&inbox).len() == 1
    });
    home.cmd().arg("reconcile").assert().success();
    let ended = state(&journal, run);
    assert_eq!(ended.status, RunStatus::Failed);
    let delivered = records(&journal, run)
        .iter()
        .filter(|record| matches!(record.event, Event::SteerDelivered { .. }))
        .count();
    assert_eq!(delivered, 3, "the three messages the step took");
    let status = home
        .cmd()
        .args(["status", "--json", &run.to_string()])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let status: serde_json::Value = serde_json::from_slice(&status).expect("JSON");
    for (what, document) in [
        ("status --json", &status),
        ("status.json", &status_json_of(&home, run)),
    ] {
        let steering = &document["steering"];
        assert_eq!(steering["requested"], 4, "{what}: {steering}");
        assert_eq!(steering["delivered"], 3, "{what}: {steering}");
        assert_eq!(steering["failed"], 1, "{what}: {steering}");
    }
}
