//! The launcher's handshake through the journal when the runner does not take the run: the
//! run ends failed with a not-started process terminal, the runner process is gone, and a
//! runner that comes late is refused.

use std::time::Duration;

use runjournal::event::{Observer, Proof, Repairer, StepAction};
use runjournal::launch::{self, RunnerProgram, RunnerStart};
use runjournal::spec::{RunDraft, RunRequest, named_step};
use runjournal::{Home, RunStatus, Store};

fn request() -> RunRequest {
    RunDraft {
        steps: vec![named_step(StepAction::Shell {
            script: "true".to_string(),
        })],
        ..RunDraft::default()
    }
    .finish()
    .expect("a valid run")
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
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("cannot be taken by a runner"), "{stderr}");
    assert_eq!(count(), before);
}
