//! Delayed starts with the real binaries: a run started with `--delay` or `--at` starts no
//! sooner than its due time — judged through the times the journal recorded against the due
//! time the launch printed, never through a sleep race — started by the home's timer, or by a
//! reconcile pass when the timer was killed; a stop ends a waiting run without starting it.

use std::time::Duration;

use runjournal::event::{Event, Record, UnixMs};
use runjournal::{RunId, RunState, RunStatus};

use crate::support::{TestHome, records, run_id_of, state, wait_for, wait_terminal};

/// Polls for the kill file's removal, and the pause between two.
const POLLS: u32 = 600;
const POLL: Duration = Duration::from_millis(50);

/// `run --json ARGS` in `home`, with `env` set for the launcher (and so for the timer it
/// starts): the run id and the due time it printed.
fn launch_delayed(home: &TestHome, env: &[(&str, &str)], args: &[&str]) -> (RunId, UnixMs) {
    let mut command = home.cmd();
    for (name, value) in env {
        command.env(name, value);
    }
    let output = command
        .args(["run", "--json"])
        .args(args)
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let object: serde_json::Value = serde_json::from_slice(&output).expect("JSON");
    assert_eq!(object["state"], "queued", "{object}");
    let due_at_ms = object["dueAtMs"].as_u64().expect("dueAtMs is a number");
    (run_id_of(&output), due_at_ms)
}

/// The time of the run's only record of `name`.
fn time_of(records: &[Record], name: &str) -> UnixMs {
    let times: Vec<UnixMs> = records
        .iter()
        .filter(|record| record.event.name() == name)
        .map(|record| record.time_ms)
        .collect();
    assert_eq!(times.len(), 1, "one {name} record: {records:?}");
    times[0]
}

/// What every delayed run that ran shows in its records: its delay ended, and its runner
/// started and its first step ran, at or past its due time.
fn assert_started_not_before(records: &[Record], due_at_ms: UnixMs) {
    for name in ["DelayEnded", "RunnerStarted", "StepRunning"] {
        let at_ms = time_of(records, name);
        assert!(
            at_ms >= due_at_ms,
            "{name} at {at_ms} ms, before the due time {due_at_ms} ms"
        );
    }
}

fn delay_ended_by(records: &[Record]) -> String {
    records
        .iter()
        .find_map(|record| match &record.event {
            Event::DelayEnded { by } => Some(by.clone()),
            _ => None,
        })
        .expect("a DelayEnded record")
}

#[test]
fn a_delay_2s_run_starts_after_two_seconds_and_not_before_started_by_the_timer() {
    let home = TestHome::new();
    let before_ms = runjournal::event::now_ms();
    let (run, due_at_ms) = launch_delayed(&home, &[], &["--delay", "2s", "--step", "echo hi"]);
    assert!(
        due_at_ms >= before_ms + 2_000,
        "due two seconds after the launch"
    );
    let journal = home.journal();
    let waiting = state(&journal, run);
    assert_eq!(waiting.status, RunStatus::Queued);
    assert!(waiting.runner.is_none());
    // Waiting or started, the delayed index agrees with the runs (`verify`).
    crate::support::check_journal(&journal.view().expect("view"), None);
    // `list` and `status` say when it is due while it waits (unless it was due meanwhile).
    let listed = home.cmd().arg("list").assert().success();
    let listed = String::from_utf8_lossy(&listed.get_output().stdout).into_owned();
    let status = home
        .cmd()
        .args(["status", "--json", &run.to_string()])
        .assert()
        .success();
    let status: serde_json::Value =
        serde_json::from_slice(&status.get_output().stdout).expect("JSON");
    assert_eq!(status["delay"]["dueAtMs"].as_u64(), Some(due_at_ms));
    // Every reconcile pass so far (of `list`, `status`) came before the due time, so none
    // could start the run: only the timer can.
    let passes_before_due = runjournal::event::now_ms() < due_at_ms;
    if passes_before_due {
        assert!(listed.contains("queued (due "), "{listed}");
    }
    let ended = wait_terminal(&journal, run);
    assert_eq!(ended.status, RunStatus::Complete, "{ended:?}");
    let records = records(&journal, run);
    assert_started_not_before(&records, due_at_ms);
    if passes_before_due {
        assert!(
            delay_ended_by(&records).starts_with("timer"),
            "nothing but the timer started it: {records:?}"
        );
    }
}

#[test]
fn a_delay_2s_run_whose_timer_was_sigkilled_starts_at_a_reconcile_pass_and_not_before() {
    let home = TestHome::new();
    let kill_file = home.input("kill-timer");
    std::fs::write(&kill_file, b"").expect("the kill file");
    let kill = kill_file.to_string_lossy().into_owned();
    let (run, due_at_ms) = launch_delayed(
        &home,
        &[(runjournal::launch::delay::KILL_TIMER_ENV, &kill)],
        &["--delay", "2s", "--step", "echo hi"],
    );
    // The timer removed the kill file as it killed itself, before starting anything.
    for _ in 0..POLLS {
        if !kill_file.exists() {
            break;
        }
        std::thread::sleep(POLL);
    }
    assert!(!kill_file.exists(), "the timer reached its kill point");
    let journal = home.journal();
    assert_eq!(state(&journal, run).status, RunStatus::Queued);
    // Reconcile passes (`reconcile`, as `list` and `status` make) start it once due, or
    // start a timer again that does.
    let ended = wait_for(&journal, run, "the run to end", |state: &RunState| {
        if !state.is_terminal() {
            let pass = home
                .cmd()
                .arg("reconcile")
                .output()
                .expect("reconcile runs");
            assert!(pass.status.success(), "{pass:?}");
        }
        state.is_terminal()
    });
    assert_eq!(ended.status, RunStatus::Complete, "{ended:?}");
    assert_started_not_before(&records(&journal, run), due_at_ms);
}

/// `/proc/<pid>/stat`'s state letter; `None` once no such process is left.
fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Continues a stopped process when dropped, so that a failing test leaves none behind.
struct Continue(u32);

impl Drop for Continue {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.0 as i32),
            nix::sys::signal::Signal::SIGCONT,
        );
    }
}

/// Regression: a timer stopped (SIGSTOP, a frozen container) held `timer.lock` and with it every
/// delayed run of the home: a run due in 2 s was still queued 10 s later, and a new `run
/// --delay` started no timer that would do anything. Now the timer that launch starts stands
/// by, takes the role over once the stopped one has been silent for a second, and starts both
/// runs with no other command run; the stopped timer, let go on, finds its role taken and
/// exits.
#[test]
fn a_stopped_timer_is_taken_over_and_every_delayed_run_starts_on_time() {
    let home = TestHome::new();
    let journal = home.journal();
    let launch = |delay: &str| {
        let output = home
            .cmd()
            .args(["run", "--json", "--delay", delay, "--step", "echo hi"])
            .assert()
            .success()
            .get_output()
            .stdout
            .clone();
        let object: serde_json::Value = serde_json::from_slice(&output).expect("JSON");
        let due_at_ms = object["dueAtMs"].as_u64().expect("dueAtMs");
        let timer = object["timerPid"].as_u64().map(|pid| pid as u32);
        (run_id_of(&output), due_at_ms, timer)
    };
    let (first, first_due, stopped) = launch("3s");
    let stopped = stopped.expect("the launch started a timer");
    // It leads once it has written its pid into the lock file.
    for _ in 0..POLLS {
        let note = std::fs::read_to_string(home.file("timer.lock")).unwrap_or_default();
        if note.trim() == stopped.to_string() {
            break;
        }
        std::thread::sleep(POLL);
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(stopped as i32),
        nix::sys::signal::Signal::SIGSTOP,
    )
    .expect("stop the timer");
    let stopped = Continue(stopped);
    let (second, second_due, _) = launch("2s");

    // No command runs meanwhile: the journal is only read.
    for (run, due_at_ms) in [(first, first_due), (second, second_due)] {
        let ended = wait_terminal(&journal, run);
        assert_eq!(ended.status, RunStatus::Complete, "{ended:?}");
        let records = records(&journal, run);
        assert_started_not_before(&records, due_at_ms);
        let by = delay_ended_by(&records);
        assert!(
            by.starts_with("timer") && !by.contains(&stopped.0.to_string()),
            "another timer started it: {by}"
        );
        // Within the silence that marks a timer stopped, with room for a loaded machine.
        let late_ms = time_of(&records, "DelayEnded") - due_at_ms;
        assert!(late_ms < 10_000, "started {late_ms} ms after its due time");
    }
    assert_eq!(process_state(stopped.0), Some('T'), "still stopped");

    // Let go on, the stopped timer finds its role taken and exits.
    let pid = stopped.0;
    drop(stopped);
    for _ in 0..POLLS {
        if matches!(process_state(pid), None | Some('Z')) {
            break;
        }
        std::thread::sleep(POLL);
    }
    assert!(
        matches!(process_state(pid), None | Some('Z')),
        "the timer taken over exits once it goes on"
    );
}

#[test]
fn stop_of_a_delayed_run_ends_it_without_starting_it() {
    let home = TestHome::new();
    let (run, _) = launch_delayed(&home, &[], &["--delay", "1h", "--step", "echo hi"]);
    let stopped = home
        .cmd()
        .args(["stop", &run.to_string()])
        .assert()
        .success();
    let said = String::from_utf8_lossy(&stopped.get_output().stdout).into_owned();
    assert!(said.contains("waited for its due time"), "{said}");
    let journal = home.journal();
    // Stopped, the journal and its delayed index agree (`verify`): it left the index.
    crate::support::check_journal(
        &journal.view().expect("view"),
        Some(&runjournal::Home::at(home.path())),
    );
    let ended = state(&journal, run);
    assert_eq!(ended.status, RunStatus::Stopped);
    assert!(ended.runner.is_none());
    let records = records(&journal, run);
    assert!(
        !records
            .iter()
            .any(|record| matches!(record.event, Event::DelayEnded { .. })),
        "{records:?}"
    );
    let view = journal.view().expect("view");
    assert!(view.soonest_delayed(10).expect("read").is_empty());
    assert_eq!(view.delayed_count().expect("read"), 0);
    crate::support::check_journal(&view, Some(&runjournal::Home::at(home.path())));
}

#[test]
fn a_start_time_already_past_or_beside_a_queue_is_refused_and_writes_nothing() {
    let home = TestHome::new();
    home.cmd()
        .args(["run", "--at", "2001-01-01T00:00:00Z", "--step", "true"])
        .assert()
        .code(2);
    home.cmd()
        .args(["run", "--at", "soon", "--step", "true"])
        .assert()
        .code(2);
    home.cmd()
        .args(["run", "--delay", "1s", "--queue", "q", "--step", "true"])
        .assert()
        .code(2);
    let listed = home.cmd().args(["list", "--json"]).assert().success();
    let listed: serde_json::Value =
        serde_json::from_slice(&listed.get_output().stdout).expect("JSON");
    assert_eq!(listed.as_array().map(Vec::len), Some(0), "{listed}");
}
