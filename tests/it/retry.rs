//! Runs tried again (docs/design.md, "Retries") with the real binaries: a run that fails twice
//! then succeeds ends `complete` on its third attempt under the id its launcher got; a runner
//! SIGKILLed mid-attempt is tried again after its backoff; a runner killed between its
//! attempt's end and the next attempt's start loses nothing and starts nothing twice; a
//! failure the policy does not cover ends the run; hooks fire once, for the last attempt.

use runjournal::Condition;
use runjournal::event::{AttemptCause, ControlAction, Event};
use runjournal::{RunId, RunState, RunStatus};

use crate::support::{
    TestHome, assert_indexes_verify, event_names, launch, record_count, records, run_id_of, state,
    wait_for, wait_terminal,
};

/// A step that fails its first `failures` times and then succeeds: it counts its attempts in
/// `counter`.
fn fails_then_succeeds(counter: &std::path::Path, failures: u32) -> String {
    let counter = counter.display();
    format!(
        "n=$(cat '{counter}' 2>/dev/null || echo 0); n=$((n + 1)); echo $n > '{counter}'; \
         [ $n -gt {failures} ] || exit 3"
    )
}

/// How many records of `name` the run has.
fn count_of(home: &TestHome, run: RunId, name: &str) -> usize {
    event_names(&records(&home.journal(), run))
        .into_iter()
        .filter(|found| *found == name)
        .count()
}

/// The causes of the run's ended attempts, first first.
fn causes(state: &RunState) -> Vec<AttemptCause> {
    state
        .retry
        .as_ref()
        .map(|retry| retry.attempts.iter().map(|attempt| attempt.cause).collect())
        .unwrap_or_default()
}

#[test]
fn a_run_that_fails_twice_then_succeeds_ends_complete_on_its_third_attempt() {
    let home = TestHome::new();
    let counter = home.input("attempts");
    let hooks = home.input("hooks");
    let output = home
        .cmd()
        .args([
            "run",
            "--wait",
            "--json",
            "--retries",
            "2",
            "--retry-backoff",
            "100ms",
        ])
        .args([
            "--on-exit",
            &format!("echo \"$RUNJOURNAL_RUN_STATE\" >> '{}'", hooks.display()),
        ])
        .args(["--step", &fails_then_succeeds(&counter, 2)])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let run = run_id_of(&output);
    let journal = home.journal();
    let ended = state(&journal, run);
    assert_eq!(ended.status, RunStatus::Complete, "{ended:#?}");
    assert_eq!(
        std::fs::read_to_string(&counter)
            .expect("the step counted")
            .trim(),
        "3"
    );
    assert_eq!(causes(&ended), [AttemptCause::Exit, AttemptCause::Exit]);
    let retry = ended.retry.as_ref().expect("a retried run");
    assert_eq!(retry.current_attempt(), 3);
    for attempt in &retry.attempts {
        assert_eq!(attempt.exit_code, 3);
        assert!(attempt.runner_instance.is_some());
    }
    // Three runners, each started once its attempt's wait had passed.
    assert_eq!(count_of(&home, run, "RunnerStarted"), 3);
    assert_eq!(count_of(&home, run, "AttemptEnded"), 2);
    assert_eq!(count_of(&home, run, "Terminal"), 1);
    for pair in records(&journal, run).windows(2) {
        if let (Event::AttemptEnded { retry_at_ms, .. }, _) = (&pair[0].event, &pair[1].event) {
            let started = records(&journal, run)
                .into_iter()
                .find(|record| record.seq > pair[0].seq && record.event.name() == "RunnerStarted")
                .expect("a runner after each attempt's end");
            assert!(
                started.time_ms >= *retry_at_ms,
                "started before its due time"
            );
        }
    }
    // The hook fires once, for the run's end.
    let delivered = wait_for(&journal, run, "its hook delivered", |state| {
        state.hook(0).is_some_and(|hook| hook.is_delivered())
    });
    assert_eq!(delivered.hook(0).map(|hook| hook.attempts), Some(1));
    assert_eq!(
        std::fs::read_to_string(&hooks)
            .expect("the hook ran")
            .trim(),
        "complete"
    );
    // What a reader sees: the attempt it is on and how the others ended.
    let status = home
        .cmd()
        .args(["status", &run.to_string()])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let status = String::from_utf8_lossy(&status);
    assert!(status.contains("3 of 3"), "{status}");
    assert!(
        status.contains("attempt 1 failed (exit, exit 3)"),
        "{status}"
    );
    let file: serde_json::Value = serde_json::from_slice(
        &std::fs::read(
            home.path()
                .join("runs")
                .join(run.to_string())
                .join("status.json"),
        )
        .expect("status.json"),
    )
    .expect("JSON");
    assert_eq!(file["attempt"], 3, "{file}");
    assert_eq!(file["maxAttempts"], 3, "{file}");
    assert_eq!(file["attempts"][1]["cause"], "exit", "{file}");
    assert_indexes_verify(&home);
}

#[test]
fn a_runner_sigkilled_mid_attempt_is_tried_again_after_its_backoff() {
    let home = TestHome::new();
    let marker = home.input("first-attempt");
    let script = format!(
        "if [ -e '{marker}' ]; then exit 0; fi; touch '{marker}'; sleep 60",
        marker = marker.display()
    );
    let run = launch(
        &home,
        &[
            "--retries",
            "1",
            "--retry-backoff",
            "200ms",
            "--step",
            &script,
        ],
    );
    let journal = home.journal();
    let running = wait_for(&journal, run, "its first attempt running", |state| {
        state.status == RunStatus::Running && marker.exists()
    });
    let runner = running.runner.as_ref().expect("a runner").identity.pid;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(runner).expect("a pid")),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("the runner is killed");
    // A command after the kill finds the runner dead: the attempt ends as a crash and the run
    // waits for its next one, which the home's timer starts once due.
    wait_for(&journal, run, "its crash tried again", |state| {
        home.cmd().arg("reconcile").assert().success();
        state.is_between_attempts()
            || state.is_terminal()
            || state
                .runner
                .as_ref()
                .is_some_and(|next| next.identity.pid != runner)
    });
    home.cmd()
        .args(["wait", &run.to_string()])
        .assert()
        .success();
    let ended = wait_terminal(&journal, run);
    assert_eq!(ended.status, RunStatus::Complete, "{ended:#?}");
    assert_eq!(causes(&ended), [AttemptCause::Crash]);
    let attempt = &ended.retry.as_ref().expect("a retried run").attempts[0];
    assert!(
        attempt
            .error
            .as_deref()
            .is_some_and(|error| error.contains("exited without recording")),
        "{attempt:?}"
    );
    // The dead runner's end is kept with its attempt.
    assert!(attempt.process_terminal.is_some(), "{attempt:?}");
    // Its next runner started once the attempt's wait had passed.
    let second = records(&journal, run)
        .into_iter()
        .filter(|record| record.event.name() == "RunnerStarted")
        .nth(1)
        .expect("a second runner");
    assert!(
        second.time_ms >= attempt.retry_at_ms,
        "{second:?} before {attempt:?}"
    );
    assert_indexes_verify(&home);
}

#[test]
fn a_runner_killed_between_an_attempts_end_and_the_next_start_acts_once() {
    let home = TestHome::new();
    let counter = home.input("attempts");
    let kill = home.input("kill-after-attempt");
    std::fs::write(&kill, b"").expect("the kill file");
    let output = home
        .cmd()
        .env(runjournal::runner::KILL_AFTER_ATTEMPT_ENV, &kill)
        .args([
            "run",
            "--json",
            "--retries",
            "1",
            "--retry-backoff",
            "100ms",
        ])
        .args(["--step", &fails_then_succeeds(&counter, 1)])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let run = run_id_of(&output);
    let journal = home.journal();
    // The first runner dies right after its attempt's end is durable: nothing starts the next
    // attempt but the next command, whose pass starts what is due and the home's timer.
    let waiting = wait_for(&journal, run, "its first attempt ended", |state| {
        state.is_between_attempts() && !kill.exists()
    });
    assert_eq!(causes(&waiting), [AttemptCause::Exit]);
    let ended = wait_for(&journal, run, "its second attempt closed", |state| {
        home.cmd().arg("list").assert().success();
        state.is_closed()
    });
    assert_eq!(ended.status, RunStatus::Complete, "{ended:#?}");
    assert_eq!(count_of(&home, run, "AttemptEnded"), 1);
    assert_eq!(count_of(&home, run, "RunnerStarted"), 2);
    assert_eq!(count_of(&home, run, "DelayEnded"), 1);
    assert_eq!(
        std::fs::read_to_string(&counter)
            .expect("the step counted")
            .trim(),
        "2"
    );
    assert_indexes_verify(&home);
}

#[test]
fn a_failure_the_policy_does_not_cover_ends_the_run() {
    let home = TestHome::new();
    for (retry_on, code) in [("crash", "1"), ("exit:3:75", "4")] {
        let output = home
            .cmd()
            .args([
                "run",
                "--wait",
                "--json",
                "--retries",
                "2",
                "--retry-on",
                retry_on,
            ])
            .args(["--", "sh", "-c", &format!("exit {code}")])
            .assert()
            .code(code.parse::<i32>().expect("a code"))
            .get_output()
            .stdout
            .clone();
        let run = run_id_of(&output);
        let ended = state(&home.journal(), run);
        assert_eq!(ended.status, RunStatus::Failed, "{retry_on}");
        assert!(causes(&ended).is_empty(), "{retry_on}: {ended:#?}");
        assert_eq!(
            ended.retry.as_ref().map(|retry| retry.current_attempt()),
            Some(1)
        );
    }
    // A code it covers is tried again, up to its retries.
    let output = home
        .cmd()
        .args([
            "run",
            "--wait",
            "--json",
            "--retries",
            "1",
            "--retry-backoff",
            "10ms",
        ])
        .args(["--retry-on", "exit:3:75", "--", "sh", "-c", "exit 75"])
        .assert()
        .code(75)
        .get_output()
        .stdout
        .clone();
    let ended = state(&home.journal(), run_id_of(&output));
    assert_eq!(causes(&ended), [AttemptCause::Exit]);
}

#[test]
fn bad_retry_flags_are_refused_before_anything_is_written() {
    let home = TestHome::new();
    for (args, says) in [
        (&["--retries", "0"][..], "between 1 and"),
        (&["--retries", "101"][..], "between 1 and"),
        (
            &["--retries", "1", "--retry-on", "sometimes"][..],
            "unknown retry cause",
        ),
        (&["--retries", "1", "--retry-on", "exit:0"][..], "a success"),
        (
            &["--retries", "1", "--retry-backoff", "5s..1s"][..],
            "shorter than its first",
        ),
        (&["--retry-backoff", "1s"][..], "need a count"),
    ] {
        let output = home
            .cmd()
            .arg("run")
            .args(args)
            .args(["--", "true"])
            .assert()
            .code(2)
            .get_output()
            .clone();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
    assert_eq!(record_count(&home.journal()), 0, "nothing was written");
}

/// A run whose first attempt failed, waiting an hour for its next.
fn waiting_for_its_next_attempt() -> (TestHome, RunId) {
    let home = TestHome::new();
    let run = launch(
        &home,
        &[
            "--retries",
            "3",
            "--retry-backoff",
            "1h",
            "--",
            "sh",
            "-c",
            "exit 5",
        ],
    );
    wait_for(
        &home.journal(),
        run,
        "its first attempt ended",
        RunState::is_between_attempts,
    );
    (home, run)
}

/// A retried run's wait for its next attempt is a delay: `stop` ends it there, without
/// another runner.
#[test]
fn a_stop_ends_a_run_waiting_for_its_next_attempt() {
    let (home, run) = waiting_for_its_next_attempt();
    let journal = home.journal();
    home.cmd()
        .args(["stop", &run.to_string()])
        .assert()
        .success();
    let ended = wait_terminal(&journal, run);
    assert_eq!(ended.status, RunStatus::Stopped);
    assert_eq!(count_of(&home, run, "RunnerStarted"), 1);
    assert_indexes_verify(&home);
}

/// A stop that read the run still running can land after its attempt ended: the run waits for
/// its next attempt with a stop recorded and no runner to take it. A later `stop`, and a stop
/// written into its control inbox, end it there instead of being refused as a second request.
#[test]
fn a_stop_recorded_after_an_attempt_ended_is_ended_by_the_next_stop() {
    for through_inbox in [false, true] {
        let (home, run) = waiting_for_its_next_attempt();
        let journal = home.journal();
        // The request as a racing `stop` lands it: on a run that is not terminal.
        journal
            .append(
                run,
                vec![Event::ControlRequested {
                    action: ControlAction::Stop,
                    by: "a stop that read the run running".to_string(),
                    reason: "it landed after the attempt ended".to_string(),
                }],
                Condition::expect_not_terminal(),
            )
            .expect("the request is recorded on the waiting run");
        let waiting = state(&journal, run);
        assert!(waiting.is_waiting_for_due(), "the run still waits");
        assert!(waiting.has_control(ControlAction::Stop));
        drop(journal);
        if through_inbox {
            let control = home
                .path()
                .join("runs")
                .join(run.to_string())
                .join("control");
            std::fs::create_dir_all(&control).expect("the inbox");
            std::fs::write(control.join("stop.json"), r#"{"type":"stop"}"#)
                .expect("a stop request");
            home.cmd().args(["reconcile"]).assert().success();
        } else {
            home.cmd()
                .args(["stop", &run.to_string()])
                .assert()
                .success();
        }
        let journal = home.journal();
        let ended = wait_terminal(&journal, run);
        assert_eq!(ended.status, RunStatus::Stopped, "inbox: {through_inbox}");
        assert_eq!(count_of(&home, run, "ControlRequested"), 1);
        assert_eq!(count_of(&home, run, "RunnerStarted"), 1);
        assert_indexes_verify(&home);
    }
}
