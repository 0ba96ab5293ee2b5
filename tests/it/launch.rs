//! The launcher's handshake through the journal when the runner does not take the run: the
//! run ends failed with a not-started process terminal, the runner process is gone, and a
//! runner that comes late is refused. And a host that follows its launch through the library
//! records what the CLI records: the runner's exit, as its parent.

use std::time::Duration;

use runjournal::event::{Event, Observer, ProcessExit, Proof, Repairer, StepAction};
use runjournal::launch::{self, Followed, RunnerExitSeen, RunnerProgram, RunnerStart};
use runjournal::spec::{RunDraft, RunRequest, named_step};
use runjournal::{Home, RunStatus, Store};

fn request() -> RunRequest {
    request_of("true")
}

fn request_of(script: &str) -> RunRequest {
    RunDraft {
        steps: vec![named_step(StepAction::Shell {
            script: script.to_string(),
        })],
        ..RunDraft::default()
    }
    .finish()
    .expect("a valid run")
}

/// The real runner: `runjournal __runner RUN --home HOME`.
fn real_runner() -> RunnerProgram {
    RunnerProgram {
        program: env!("CARGO_BIN_EXE_runjournal").into(),
        leading_args: vec!["__runner".into()],
    }
}

fn open(dir: &tempfile::TempDir) -> Store {
    Store::open(Home::at(dir.path())).expect("open the home")
}

#[test]
fn a_runner_that_exits_at_once_leaves_the_run_failed_and_not_started() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = open(&dir);
    let program = RunnerProgram {
        program: "false".into(),
        leading_args: Vec::new(),
    };
    let launched = launch::launch(&store, request(), &program, launch::RUNNER_START_TIMEOUT)
        .expect("the launch is recorded");
    let RunnerStart::NotStarted { error } = &launched.start else {
        panic!("the runner cannot have started: {:?}", launched.start);
    };
    assert!(error.contains("exited (exited with code 1)"), "{error}");
    let state = store
        .journal()
        .view()
        .and_then(|view| view.snapshot(launched.run))
        .expect("read")
        .expect("the run exists");
    assert_eq!(state.status, RunStatus::Failed);
    assert_eq!(
        state
            .terminal
            .as_ref()
            .and_then(|terminal| terminal.repaired_by),
        Some(Repairer::Launcher)
    );
    let observed = state.process_terminal.expect("process terminal recorded");
    assert_eq!(observed.proof, Proof::NotStarted);
    assert_eq!(observed.observer, Observer::Launcher);
    assert_eq!(observed.exit.and_then(|exit| exit.code), Some(1));
}

/// What broke: a runner that stopped on a damaged journal before taking its run (exit 4, as
/// every command does) was reported by `run` as a runner that exited, exit 1. The launch now
/// reports the damage, so the command says so and exits 4; the run is recorded failed. The
/// runner here is the real one, pointed at a home whose journal is zero-filled: the launcher's
/// own journal is sound, as when the damaged page is one only the runner reads.
#[test]
fn a_runner_that_stopped_on_a_damaged_journal_makes_the_launch_report_damage() {
    let damaged = tempfile::tempdir().expect("temp dir");
    {
        let store = open(&damaged);
        launch::launch(
            &store,
            request(),
            &RunnerProgram {
                program: "false".into(),
                leading_args: Vec::new(),
            },
            launch::RUNNER_START_TIMEOUT,
        )
        .expect("a run in the home to damage");
    }
    let journal = damaged.path().join("journal.redb");
    let length = std::fs::metadata(&journal).expect("the journal").len();
    std::fs::write(
        &journal,
        vec![0u8; usize::try_from(length).expect("a length")],
    )
    .expect("the journal zero-filled");
    let dir = tempfile::tempdir().expect("temp dir");
    let store = open(&dir);
    // `runjournal --home DAMAGED __runner RUN`, whatever else the launch passes.
    let program = RunnerProgram {
        program: "sh".into(),
        leading_args: vec![
            "-c".into(),
            "exec \"$0\" --home \"$1\" __runner \"$2\"".into(),
            env!("CARGO_BIN_EXE_runjournal").into(),
            damaged.path().into(),
        ],
    };
    let error = launch::launch(&store, request(), &program, launch::RUNNER_START_TIMEOUT)
        .expect_err("the launch reports the damage");
    let launch::LaunchError::RunnerFoundDamage { run, .. } = &error else {
        panic!("reported as damage: {error:?}");
    };
    assert!(
        runjournal::journal::is_damage_in_chain(&error),
        "the commands' one rule reads it as damage (exit 4): {error}"
    );
    assert!(
        error.to_string().contains("recover --from-projections"),
        "{error}"
    );
    let state = store
        .journal()
        .view()
        .and_then(|view| view.snapshot(*run))
        .expect("read")
        .expect("the run exists");
    assert_eq!(
        state.status,
        RunStatus::Failed,
        "the run is recorded failed"
    );
}

#[test]
fn a_runner_that_never_takes_the_run_is_given_up_then_killed_and_refused_later() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = open(&dir);
    // A "runner" that ignores its arguments and never records RunnerStarted.
    let program = RunnerProgram {
        program: "sh".into(),
        leading_args: vec!["-c".into(), "exec sleep 100".into(), "sh".into()],
    };
    let mut launched = launch::launch(&store, request(), &program, Duration::from_millis(300))
        .expect("the launch is recorded");
    let RunnerStart::NotStarted { error } = &launched.start else {
        panic!("the runner cannot have started: {:?}", launched.start);
    };
    assert!(error.contains("did not start within 300ms"), "{error}");
    let runner = launched
        .runner
        .as_mut()
        .expect("the launcher keeps its child");
    let status = runner
        .try_wait()
        .expect("try_wait")
        .expect("the launcher killed and reaped the runner");
    assert!(!status.success());
    let run = launched.run;
    let count = || {
        store
            .journal()
            .view()
            .and_then(|view| view.records(run))
            .expect("records")
            .len()
    };
    let before = count();
    // The real runner, arriving late, is refused by the journal and writes nothing.
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_runjournal"))
        .arg("--home")
        .arg(dir.path())
        .args(["__runner", &run.to_string()])
        .output()
        .expect("run the runner");
    assert!(!output.status.success());
    // The runner says why in its own log (runner.log), which it writes itself.
    let log = std::fs::read_to_string(store.home().runner_log_path(run)).expect("runner.log");
    assert!(log.contains("cannot be taken by a runner"), "{log}");
    assert_eq!(count(), before);
}

#[test]
fn a_host_following_its_launch_records_the_runner_exit_as_its_parent() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = open(&dir);
    let mut launched = launch::launch(
        &store,
        request_of("echo hi"),
        &real_runner(),
        launch::RUNNER_START_TIMEOUT,
    )
    .expect("launched");
    assert!(
        matches!(launched.start, RunnerStart::Started { .. }),
        "{:?}",
        launched.start
    );
    let mut seen = Vec::new();
    let followed = launch::follow_launched(&store, &mut launched, |record| {
        seen.push(record.seq);
        std::ops::ControlFlow::Continue(())
    })
    .expect("followed");
    let Followed::Ended { state, runner } = followed else {
        panic!("the run ends: {followed:?}");
    };
    assert_eq!(state.status, RunStatus::Complete);
    let RunnerExitSeen::Recorded(exit) = runner else {
        panic!("the runner's exit is recorded: {runner:?}");
    };
    assert_eq!(
        exit,
        ProcessExit {
            code: Some(0),
            signal: None
        }
    );
    assert!(launched.runner.is_none(), "the runner was reaped");
    // Every record up to the Terminal was handed over once, in order.
    assert_eq!(seen, (1..=state.head_seq).collect::<Vec<_>>());
    let now = store
        .journal()
        .view()
        .and_then(|view| view.snapshot(launched.run))
        .expect("read")
        .expect("the run exists");
    assert!(now.is_closed());
    let observed = now.process_terminal.expect("the runner's exit is recorded");
    assert_eq!(observed.observer, Observer::RunnerParent);
    assert_eq!(observed.proof, Proof::Observed);
    assert_eq!(observed.exit, Some(exit));
}

#[test]
fn a_runner_killed_under_a_following_host_is_recorded_by_it_and_the_run_reconciled() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = open(&dir);
    let mut launched = launch::launch(
        &store,
        request_of("exec sleep 100"),
        &real_runner(),
        launch::RUNNER_START_TIMEOUT,
    )
    .expect("launched");
    let RunnerStart::Started { pid, .. } = launched.start.clone() else {
        panic!("the runner started: {:?}", launched.start);
    };
    // What the host and its pass do, with no watcher to repair the run first.
    crate::support::stop_watcher(store.home());
    let followed = launch::follow_launched(&store, &mut launched, |record| {
        // Once its step runs, the runner dies without recording an outcome.
        if matches!(record.event, Event::StepRunning { .. }) {
            let pid = nix::unistd::Pid::from_raw(i32::try_from(pid).expect("a pid"));
            nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).expect("kill");
        }
        std::ops::ControlFlow::Continue(())
    })
    .expect("followed");
    let Followed::RunnerDied {
        exit, reconciled, ..
    } = followed
    else {
        panic!("the runner died: {followed:?}");
    };
    assert_eq!(
        exit,
        ProcessExit {
            code: None,
            signal: Some(9)
        }
    );
    let report = reconciled.expect("the reconcile pass ran");
    assert!(
        report
            .outcomes
            .iter()
            .any(|outcome| outcome.run == launched.run && outcome.row == "stale"),
        "{report:?}"
    );
    let state = store
        .journal()
        .view()
        .and_then(|view| view.snapshot(launched.run))
        .expect("read")
        .expect("the run exists");
    assert_eq!(state.status, RunStatus::Failed);
    assert!(state.is_closed());
    let step = state.steps[0].process.as_ref().expect("the step's process");
    assert_ne!(
        runjournal::liveness::check(step).expect("looked at"),
        runjournal::liveness::Liveness::Alive,
        "the step the dead runner left is ended"
    );
    let observed = state.process_terminal.expect("observed");
    assert_eq!(observed.observer, Observer::RunnerParent);
    assert_eq!(observed.exit, Some(exit));
    let error = state
        .terminal
        .and_then(|terminal| terminal.error)
        .expect("a reason");
    assert!(error.contains("killed by signal 9 (SIGKILL)"), "{error}");
}

/// `Runs::launch` of a run with its own runner settings that waits for a run already ended:
/// the launch starts its runner at once, with the settings once (the runner refuses a flag
/// given twice). The CLI and the handle choose the runner's program by one rule
/// (`RunnerProgram::for_request`).
#[test]
fn runs_launch_of_a_run_after_an_ended_one_with_its_own_settings_starts_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let runs = runjournal::Runs::open(Home::at(dir.path()), real_runner()).expect("the handle");
    let mut first = runs.launch(request()).expect("launched");
    let followed = runs
        .follow(&mut first, |_| std::ops::ControlFlow::Continue(()))
        .expect("followed");
    assert!(matches!(followed, launch::Followed::Ended { .. }));
    let mut second = request();
    second.after = vec![first.run.to_string()];
    second.heartbeat = Some(std::time::Duration::from_millis(700));
    second.idle_timeout = Some(std::time::Duration::from_secs(30));
    let mut launched = runs.launch(second).expect("launched");
    assert!(
        matches!(launched.start, RunnerStart::Started { .. }),
        "its dependency ended: it starts at once, {:?}",
        launched.start
    );
    let followed = runs
        .follow(&mut launched, |_| std::ops::ControlFlow::Continue(()))
        .expect("followed");
    let launch::Followed::Ended { state, .. } = followed else {
        panic!("{followed:?}");
    };
    assert_eq!(state.status, RunStatus::Complete, "{:?}", state.terminal);
}
