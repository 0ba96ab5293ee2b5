//! A flaky disk under the real binaries: EIO on every write and sync of the journal
//! file for a while, injected by an `LD_PRELOAD` shim (tests/it/support/eio_shim.c, compiled
//! here with `cc`) into `runjournal` and the runner it starts, while a control file exists.
//!
//! * In the middle of a two-step chain, the runner's transition fails, the writer retries it
//!   on fresh handles and shows itself blocked on storage errors (`status`, `list`; how
//!   `journal-tools inspect stats` shows it is checked in its own tests), the chain waits, and once the disk works again the run
//!   completes with the very records of the same run without the fault.
//! * When the errors outlast the retry window, the runner ends its steps' groups, says why in
//!   runner.log and exits 1; once the journal works, the reconciler fails the run naming it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use runjournal::capacity::{self, BlockCause};
use runjournal::event::{Event, ProcessIdentity, Record};
use runjournal::liveness::{self, Liveness};
use runjournal::{Home, Journal, RunId, RunState, RunStatus};

use crate::support::{self, TestHome};

const SHIM_SOURCE: &str = include_str!("support/eio_shim.c");

/// Longest any wait of these tests polls before it calls the test stuck.
const DEADLINE: Duration = Duration::from_secs(120);

/// A step that waits (polling, bounded) for the file `$RUNJOURNAL_TEST_GATE`, then prints.
const GATED_STEP: &str = "i=0; until [ -e \"$RUNJOURNAL_TEST_GATE\" ] || [ $i -ge 12000 ]; do sleep 0.01; i=$((i+1)); done; echo one";

/// The shim, compiled once per test process into the target's temp dir.
fn shim() -> &'static Path {
    static SHIM: OnceLock<PathBuf> = OnceLock::new();
    SHIM.get_or_init(|| support::compile_shim("eio_shim", SHIM_SOURCE))
}

/// The files of one faulted or fault-free run.
struct Scene {
    home: TestHome,
    /// While it exists, the journal's writes and syncs fail (for processes with the shim).
    control: PathBuf,
    /// Step 0 ends once it exists.
    gate: PathBuf,
    /// Holds the control and gate files.
    _files: tempfile::TempDir,
}

impl Scene {
    fn new() -> Scene {
        let files = tempfile::tempdir().expect("a temporary directory");
        Scene {
            home: TestHome::new(),
            control: files.path().join("fail-journal-writes"),
            gate: files.path().join("gate"),
            _files: files,
        }
    }

    /// `runjournal` on this home, with the shim loaded when `is_faulted`.
    fn runjournal(&self, is_faulted: bool) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_runjournal"));
        command
            .env_remove("RUNJOURNAL_HOME")
            .env_remove("RUNJOURNAL_LAYOUT")
            .env("RUNJOURNAL_TEST_GATE", &self.gate)
            .arg("--home")
            .arg(self.home.path());
        if is_faulted {
            command
                .env("LD_PRELOAD", shim())
                .env("RUNJOURNAL_TEST_FAULT_CONTROL", &self.control);
        }
        command
    }

    /// Runs a command without the shim (a person looking while the disk is flaky for the
    /// runner) and returns its output.
    fn look(&self, args: &[&str]) -> Output {
        let output = self
            .runjournal(false)
            .args(args)
            .output()
            .expect("runjournal runs");
        assert!(
            output.status.success(),
            "runjournal {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        output
    }

    fn journal(&self) -> Journal {
        self.home.journal()
    }

    fn home(&self) -> Home {
        Home::at(self.home.path())
    }
}

/// Polls `condition` until it holds; the deadline only bounds a hang.
fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let started = Instant::now();
    while !condition() {
        assert!(started.elapsed() < DEADLINE, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The run named `name`, once it exists.
fn run_named(journal: &Journal, name: &str) -> RunId {
    let alias = runjournal::journal::name_alias(name);
    let mut found = None;
    wait_until(&format!("run {name} to exist"), || {
        found = journal
            .view()
            .ok()
            .and_then(|view| view.lookup_alias(&alias).ok().flatten());
        found.is_some()
    });
    found.expect("found")
}

/// Waits until step `step` of `run` is running.
fn wait_step_running(journal: &Journal, run: RunId, step: usize) -> RunState {
    support::wait_for(journal, run, "the step to run", |state| {
        state.steps[step].status == runjournal::state::StepStatus::Running
    })
}

/// A record as two runs of the same spec can agree on: no times, pids, instance ids.
fn comparable(record: &Record) -> (u64, Event) {
    let placeholder = ProcessIdentity {
        pid: 0,
        start_time: 0,
        boot_id: String::new(),
        pid_namespace: None,
    };
    let event = match record.event.clone() {
        Event::RunCreated {
            spec,
            session_id,
            completion_owner_id,
            tool_call_id,
            ..
        } => Event::RunCreated {
            spec,
            created_at_ms: 0,
            session_id,
            completion_owner_id,
            tool_call_id,
        },
        Event::RunnerStarted { .. } => Event::RunnerStarted {
            runner: placeholder,
            instance_id: String::new(),
        },
        Event::StepRunning { step, process } => Event::StepRunning {
            step,
            process: process.map(|_| placeholder),
        },
        Event::ProcessTerminalObserved {
            exit,
            proof,
            observer,
            ..
        } => Event::ProcessTerminalObserved {
            instance_id: String::new(),
            exit,
            proof,
            observer,
        },
        other => other,
    };
    (record.seq, event)
}

/// Runs the two-step chain on `scene` to its end with `run --wait`; when `is_faulted`, the
/// journal fails between step 0's end and the test's healing of the disk, and `while_failing`
/// runs meanwhile, once the runner is known to be blocked. Returns the run's records.
fn chain(
    scene: &Scene,
    is_faulted: bool,
    while_failing: impl FnOnce(&Scene, RunId),
) -> Vec<Record> {
    let launcher = scene
        .runjournal(is_faulted)
        .args([
            "run", "--wait", "--name", "flaky", "--step", GATED_STEP, "--step", "echo two",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the launcher starts");
    let journal = scene.journal();
    let run = run_named(&journal, "flaky");
    wait_step_running(&journal, run, 0);
    if is_faulted {
        std::fs::write(&scene.control, b"").expect("the fault on");
    }
    std::fs::write(&scene.gate, b"").expect("step 0 may end");
    if is_faulted {
        wait_until("the runner to be blocked on storage errors", || {
            capacity::read_status(&scene.home())
                .expect("the capacity state reads")
                .blocked
                .iter()
                .any(|blocked| blocked.cause == BlockCause::Io { errno: 5 })
        });
        while_failing(scene, run);
        std::fs::remove_file(&scene.control).expect("the disk works again");
    }
    let output = launcher.wait_with_output().expect("the launcher ends");
    assert!(
        output.status.success(),
        "the run completed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let state = support::state(&journal, run);
    assert_eq!(state.status, RunStatus::Complete);
    assert!(state.is_closed(), "the launcher recorded the runner's exit");
    support::records(&journal, run)
}

#[test]
fn a_window_of_eio_on_the_journal_in_the_middle_of_a_chain_changes_none_of_its_records() {
    let reference = chain(&Scene::new(), false, |_, _| {});
    let scene = Scene::new();
    let faulted = chain(&scene, true, |scene, run| {
        // The chain waits: step 0's end is not durable, so step 1 has not started.
        let state = support::state(&scene.journal(), run);
        assert_eq!(
            state.steps[0].status,
            runjournal::state::StepStatus::Running,
            "step 0's end waits for the journal"
        );
        assert_eq!(
            state.steps[1].status,
            runjournal::state::StepStatus::Pending
        );
        let runner = state.runner.as_ref().expect("a runner").identity.clone();
        assert_eq!(
            liveness::check(&runner).expect("liveness"),
            Liveness::Alive,
            "the runner rides it out"
        );
        for (args, wanted) in [
            (
                &["status", "flaky"][..],
                "journal: blocked on storage errors (I/O error)",
            ),
            (
                &["list"][..],
                "journal: blocked on storage errors (I/O error)",
            ),
        ] {
            let shown = String::from_utf8_lossy(&scene.look(args).stdout).into_owned();
            assert!(shown.contains(wanted), "{args:?} says so: {shown}");
        }
        let status = scene.look(&["status", "flaky", "--json"]);
        let status: serde_json::Value =
            serde_json::from_slice(&status.stdout).expect("status --json is JSON");
        assert_eq!(status["journalCapacity"]["blocked"][0]["cause"], "io");
        assert_eq!(status["journalCapacity"]["blocked"][0]["errno"], 5);
        // What `journal-tools inspect stats` shows (its own test checks how it shows it).
        let blocked = capacity::read_status(&scene.home()).expect("capacity state");
        assert_eq!(blocked.blocked.len(), 1, "{blocked:?}");
        assert_eq!(
            blocked.blocked[0].writer, runner,
            "the runner is the one blocked"
        );
        let log = std::fs::read_to_string(scene.home().runner_log_path(run)).expect("runner.log");
        assert!(
            log.contains("journal blocked on storage errors (I/O error)"),
            "runner.log says so: {log}"
        );
    });
    assert_eq!(
        faulted.iter().map(comparable).collect::<Vec<_>>(),
        reference.iter().map(comparable).collect::<Vec<_>>(),
        "the faulted run's records are those of the run without the fault"
    );
    assert!(
        capacity::read_status(&scene.home())
            .expect("capacity state")
            .blocked
            .is_empty(),
        "no writer is blocked any more"
    );
    let log = std::fs::read_to_string(scene.home().runner_log_path(faulted[0].run_id))
        .expect("runner.log");
    assert!(log.contains("journal writes resumed after"), "{log}");
}

#[test]
fn a_runner_whose_journal_fails_past_its_retry_window_ends_its_steps_and_the_run_is_failed() {
    let scene = Scene::new();
    let launched = scene
        .runjournal(true)
        .args([
            "--io-retry-window",
            "1s",
            "run",
            "--json",
            "--name",
            "given-up",
            "--mode",
            "parallel",
            "--step",
            "sleep 300",
            "--step",
            GATED_STEP,
        ])
        .output()
        .expect("the launcher runs");
    assert!(
        launched.status.success(),
        "{}",
        String::from_utf8_lossy(&launched.stderr)
    );
    let run = support::run_id_of(&launched.stdout);
    let journal = scene.journal();
    wait_step_running(&journal, run, 0);
    let state = wait_step_running(&journal, run, 1);
    let runner = state.runner.as_ref().expect("a runner").identity.clone();
    let sleeper = state.steps[0].process.clone().expect("step 0's process");

    std::fs::write(&scene.control, b"").expect("the fault on");
    std::fs::write(&scene.gate, b"").expect("step 1 may end");
    // Step 1's end cannot be recorded; after the window the runner gives up.
    wait_until("the runner to exit", || {
        liveness::check(&runner).expect("liveness") != Liveness::Alive
    });
    assert_ne!(
        liveness::check(&sleeper).expect("liveness"),
        Liveness::Alive,
        "the runner ended step 0's group before it exited"
    );
    let log = std::fs::read_to_string(scene.home().runner_log_path(run)).expect("runner.log");
    for said in [
        "journal blocked on storage errors (I/O error)",
        "the whole retry window",
        "giving up",
        "cannot go on",
        "ending 1 running step(s)",
    ] {
        assert!(log.contains(said), "runner.log says {said:?}: {log}");
    }
    let state = support::state(&journal, run);
    assert_eq!(
        state.status,
        RunStatus::Running,
        "nothing more was recorded while the journal failed"
    );

    // The journal works again: the next look reconciles the run as failed, naming the runner.
    std::fs::remove_file(&scene.control).expect("the disk works again");
    let shown = String::from_utf8_lossy(&scene.look(&["status", "given-up"]).stdout).into_owned();
    assert!(shown.contains("failed"), "{shown}");
    let state = support::state(&journal, run);
    assert_eq!(state.status, RunStatus::Failed);
    assert!(state.is_closed());
    let error = state
        .terminal
        .as_ref()
        .and_then(|terminal| terminal.error.clone())
        .expect("a reason");
    assert!(
        error.contains(&format!(
            "runner {} exited without recording an outcome",
            runner.pid
        )) && error.contains("exiting without recording an outcome"),
        "the reason names the runner and quotes its log: {error}"
    );
    // What `journal-tools inspect verify` checks.
    let source = runjournal::source::JournalSource::open(
        Some(scene.home.path()),
        None,
        runjournal::home::Layout::Runjournal,
    )
    .expect("the journal opens read-only");
    let verification = source.verify().expect("verification runs");
    assert!(
        verification
            .report
            .worst()
            .is_none_or(|worst| worst <= runjournal::verify::Severity::Note),
        "{:?}",
        verification.report.problems
    );
}
