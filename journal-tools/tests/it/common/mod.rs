//! Shared by the journal-tools tests: a home with a few runs built through the library, the
//! command under test, and redaction of what changes from run to run (ids, times, paths).

// Each test binary uses a different part of this module.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use assert_cmd::Command;
use runjournal::HostIds;
use runjournal::event::{
    ControlAction, Event, ExternalJobStatus, JobState, Mode, RunSpec, StepEnd, TerminalState,
};
use runjournal::home::Layout;
use runjournal::testkit::{
    completed, control, hosts, identity, job, job_updated, provider, runner_exited, runner_started,
    shell, spec, step, step_complete, step_finished, step_running, terminal,
};
use runjournal::{Condition, Home, RunId, Store};

/// The test's home and the runs in it.
pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub home: Home,
    /// A chain whose external-job step failed; closed; has a session and tool-call id.
    pub failed: RunId,
    /// A single step run, complete and closed.
    pub complete: RunId,
    /// A parallel run still running, with a stop requested.
    pub running: RunId,
}

impl Fixture {
    pub fn root(&self) -> &Path {
        self.home.root()
    }

    pub fn journal_path(&self) -> PathBuf {
        self.home.journal_path()
    }

    /// Replaces the run ids with their names and the home's path with `<home>`.
    pub fn redact(&self, text: &str) -> String {
        let mut text = text.replace(&self.root().display().to_string(), "<home>");
        for (run, name) in [
            (self.failed, "<failed-run>"),
            (self.complete, "<complete-run>"),
            (self.running, "<running-run>"),
        ] {
            text = text.replace(&run.to_string(), name);
        }
        text
    }
}

fn append(store: &Store, run: RunId, batches: Vec<Vec<Event>>) {
    for events in batches {
        store
            .append(run, events, Condition::none())
            .expect("a legal batch is appended");
    }
}

/// Builds the fixture: three runs, created in the order failed, complete, running.
pub fn fixture() -> Fixture {
    fixture_in(Layout::Runjournal)
}

/// The fixture in a home of `layout`.
pub fn fixture_in(layout: Layout) -> Fixture {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let home = Home::in_layout(dir.path().join("home"), layout);
    let store = Store::open(home.clone()).expect("the home opens");

    let failed = store
        .create_run(
            RunSpec {
                name: Some("deploy".to_string()),
                ..spec(
                    Mode::Chain,
                    vec![
                        shell("build", "make"),
                        step("ship", provider("deployer --watch")),
                        shell("notify", "true"),
                    ],
                )
            },
            hosts(Some("session-1"), None, Some("call-1")),
        )
        .expect("created")
        .run;
    append(
        &store,
        failed,
        vec![
            vec![runner_started(identity(100), "runner-a")],
            vec![step_running(0, Some(identity(101)))],
            vec![step_complete(0)],
            vec![step_running(1, Some(identity(102)))],
            vec![job_updated(
                1,
                ExternalJobStatus {
                    progress: Some(0.5),
                    message: Some("quota exceeded".to_string()),
                    ..job(JobState::Failed, "job-7", None)
                },
            )],
            vec![
                step_finished(1, StepEnd::Failed, Some(1), Some("external job failed")),
                terminal(
                    TerminalState::Failed,
                    1,
                    "ship failed",
                    Some("step 1 (ship) failed"),
                ),
                runner_exited("runner-a", 1),
            ],
        ],
    );

    let complete = store
        .create_run(
            RunSpec {
                name: Some("hello".to_string()),
                ..spec(Mode::Single, vec![shell("greet", "echo hello")])
            },
            HostIds::default(),
        )
        .expect("created")
        .run;
    append(
        &store,
        complete,
        vec![
            vec![runner_started(identity(200), "runner-b")],
            vec![step_running(0, Some(identity(201)))],
            vec![
                step_complete(0),
                completed("said hello"),
                runner_exited("runner-b", 0),
            ],
        ],
    );

    let running = store
        .create_run(
            RunSpec {
                concurrency: 2,
                timeout_ms: Some(60_000),
                ..spec(
                    Mode::Parallel,
                    vec![shell("left", "sleep 100"), shell("right", "sleep 100")],
                )
            },
            hosts(None, None, Some("call-3")),
        )
        .expect("created")
        .run;
    append(
        &store,
        running,
        vec![
            vec![runner_started(identity(300), "runner-c")],
            vec![step_running(0, Some(identity(301))), step_running(1, None)],
            vec![control(ControlAction::Stop, "tester", "enough")],
        ],
    );
    assert!(
        store.pending_projections() == 0,
        "every projection was written"
    );
    drop(store);
    Fixture {
        dir,
        home,
        failed,
        complete,
        running,
    }
}

/// `journal-tools` with a clean environment: no home from the outside, no colour settings.
pub fn tool() -> Command {
    let mut command = Command::cargo_bin("journal-tools").expect("the binary is built");
    command
        .env_remove("RUNJOURNAL_HOME")
        .env_remove("RUNJOURNAL_LAYOUT")
        .env_remove("NO_COLOR")
        .env_remove("XDG_STATE_HOME");
    command
}

/// `journal-tools --home <fixture home> ARGS`.
pub fn tool_at(fixture: &Fixture, args: &[&str]) -> Command {
    let mut command = tool();
    command.arg("--home").arg(fixture.root()).args(args);
    command
}

/// What a finished command printed, and how it exited.
pub struct Ran {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

pub fn run(mut command: Command) -> Ran {
    let output = command.output().expect("the command runs");
    Ran {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// Parses JSON Lines output, checking that every object has a "type" and the last is the
/// summary.
pub fn json_lines(stdout: &str) -> Vec<serde_json::Value> {
    let objects: Vec<serde_json::Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).expect("each line is one JSON object"))
        .collect();
    for object in &objects {
        assert!(
            object["type"].is_string(),
            "every object has a type: {object}"
        );
    }
    assert_eq!(
        objects.last().map(|last| last["type"].clone()),
        Some("summary".into()),
        "the last object is the summary: {stdout}"
    );
    objects
}

/// insta settings that redact times, writer ids and sizes.
pub fn redactions() -> insta::Settings {
    let mut settings = insta::Settings::clone_current();
    for (pattern, replacement) in [
        (r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\.\d{3}Z", "<time-ms>"),
        (r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}Z", "<time>"),
        (r"\b[0-9a-f]{16}/", "<writer>/"),
        (r"createdAtMs=\d+", "createdAtMs=<ms>"),
        (r"\b[0-9a-f]{32}\b", "<journal-id>"),
        (r"\d+ bytes \([0-9.]+ [KMG]iB\)", "<size>"),
        // A human size (`132.0 KiB`, `0 B`) and a file system's mount point.
        (r"\b[0-9]+(\.[0-9])? (B|KiB|MiB|GiB|TiB)\b", "<bytes>"),
        (r" at /[^,\n]*,", " at <mount>,"),
        (r"journal-tools-[A-Za-z0-9]+", "journal-tools-<tmp>"),
        (r#""pid":\d+"#, r#""pid":<pid>"#),
        (r"\bpid \d+", "pid <pid>"),
        (r"\b\d+ (alive|dead|unknown)\b", "<pid> $1"),
    ] {
        settings.add_filter(pattern, replacement);
    }
    settings.set_prepend_module_to_snapshot(false);
    settings
}
