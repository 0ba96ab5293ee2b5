//! Shared by the journal-tools tests: a home with a few runs built through the library, the
//! command under test, and redaction of what changes from run to run (ids, times, paths).

// Each test binary uses a different part of this module.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use assert_cmd::Command;
use runjournal::HostIds;
use runjournal::event::{
    Event, ExternalJobStatus, JobState, Mode, Observer, ProcessExit, ProcessIdentity, Proof,
    RunSpec, StepAction, StepEnd, StepOutcome, StepSpec, TerminalState,
};
use runjournal::home::Layout;
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

/// A recorded process that cannot be alive here: its boot is not this one.
pub fn identity(pid: u32) -> ProcessIdentity {
    ProcessIdentity {
        pid,
        start_time: 7,
        boot_id: "test-boot".to_string(),
        pid_namespace: None,
    }
}

fn shell(name: &str, script: &str) -> StepSpec {
    StepSpec {
        name: name.to_string(),
        action: StepAction::Shell {
            script: script.to_string(),
        },
    }
}

fn finished(step: u32, end: StepEnd, exit_code: i32, error: Option<&str>) -> Event {
    Event::StepFinished {
        step,
        outcome: StepOutcome {
            end,
            exit_code: Some(exit_code),
            error: error.map(str::to_string),
        },
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
                mode: Mode::Chain,
                concurrency: 1,
                timeout_ms: None,
                cwd: None,
                steps: vec![
                    shell("build", "make"),
                    StepSpec {
                        name: "ship".to_string(),
                        action: StepAction::ExternalJob {
                            provider: "deployer --watch".to_string(),
                        },
                    },
                    shell("notify", "true"),
                ],
            },
            HostIds {
                session_id: Some("session-1".to_string()),
                completion_owner_id: None,
                tool_call_id: Some("call-1".to_string()),
            },
        )
        .expect("created")
        .run;
    append(
        &store,
        failed,
        vec![
            vec![Event::RunnerStarted {
                runner: identity(100),
                instance_id: "runner-a".to_string(),
            }],
            vec![Event::StepRunning {
                step: 0,
                process: Some(identity(101)),
            }],
            vec![finished(0, StepEnd::Complete, 0, None)],
            vec![Event::StepRunning {
                step: 1,
                process: Some(identity(102)),
            }],
            vec![Event::ExternalJobUpdated {
                step: 1,
                job: ExternalJobStatus {
                    state: JobState::Failed,
                    id: Some("job-7".to_string()),
                    progress: Some(0.5),
                    message: Some("quota exceeded".to_string()),
                    url: None,
                },
            }],
            vec![
                finished(1, StepEnd::Failed, 1, Some("external job failed")),
                Event::Terminal {
                    state: TerminalState::Failed,
                    error: Some("step 1 (ship) failed".to_string()),
                    summary: "ship failed".to_string(),
                    exit_code: 1,
                    repaired_by: None,
                },
                Event::ProcessTerminalObserved {
                    instance_id: "runner-a".to_string(),
                    exit: Some(ProcessExit {
                        code: Some(1),
                        signal: None,
                    }),
                    proof: Proof::Observed,
                    observer: Observer::RunnerParent,
                },
            ],
        ],
    );

    let complete = store
        .create_run(
            RunSpec {
                name: Some("hello".to_string()),
                mode: Mode::Single,
                concurrency: 1,
                timeout_ms: None,
                cwd: None,
                steps: vec![shell("greet", "echo hello")],
            },
            HostIds::default(),
        )
        .expect("created")
        .run;
    append(
        &store,
        complete,
        vec![
            vec![Event::RunnerStarted {
                runner: identity(200),
                instance_id: "runner-b".to_string(),
            }],
            vec![Event::StepRunning {
                step: 0,
                process: Some(identity(201)),
            }],
            vec![
                finished(0, StepEnd::Complete, 0, None),
                Event::Terminal {
                    state: TerminalState::Complete,
                    error: None,
                    summary: "said hello".to_string(),
                    exit_code: 0,
                    repaired_by: None,
                },
                Event::ProcessTerminalObserved {
                    instance_id: "runner-b".to_string(),
                    exit: Some(ProcessExit {
                        code: Some(0),
                        signal: None,
                    }),
                    proof: Proof::Observed,
                    observer: Observer::RunnerParent,
                },
            ],
        ],
    );

    let running = store
        .create_run(
            RunSpec {
                name: None,
                mode: Mode::Parallel,
                concurrency: 2,
                timeout_ms: Some(60_000),
                cwd: None,
                steps: vec![shell("left", "sleep 100"), shell("right", "sleep 100")],
            },
            HostIds {
                session_id: None,
                completion_owner_id: None,
                tool_call_id: Some("call-3".to_string()),
            },
        )
        .expect("created")
        .run;
    append(
        &store,
        running,
        vec![
            vec![Event::RunnerStarted {
                runner: identity(300),
                instance_id: "runner-c".to_string(),
            }],
            vec![
                Event::StepRunning {
                    step: 0,
                    process: Some(identity(301)),
                },
                Event::StepRunning {
                    step: 1,
                    process: None,
                },
            ],
            vec![Event::ControlRequested {
                action: runjournal::event::ControlAction::Stop,
                by: "tester".to_string(),
                reason: "enough".to_string(),
            }],
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
