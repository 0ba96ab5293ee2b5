//! A projection deleted, truncated or corrupted is rebuilt, by projecting again, byte for byte
//! as it was; the files are private (0600 in 0700 directories) and readable in the
//! pi-subagents format.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use runjournal::HostIds;
use runjournal::event::{
    Event, ExternalJobStatus, JobState, Mode, Observer, ProcessExit, ProcessIdentity, Proof,
    RunSpec, StepAction, StepEnd, StepOutcome, StepSpec, TerminalState,
};
use runjournal::projection::{
    self, Content, FileKind, Problem, ResultPolicy, documents::StatusDoc,
};
use runjournal::{Condition, Home, RunId, Store};

fn identity(pid: u32) -> ProcessIdentity {
    ProcessIdentity {
        pid,
        start_time: 7,
        boot_id: "boot".to_string(),
        pid_namespace: None,
    }
}

/// A chain whose second step (an external job) fails: status, events, result, result index,
/// tool-call and terminal markers all exist.
fn finished_run(store: &Store) -> RunId {
    let spec = RunSpec {
        name: Some("repair".to_string()),
        mode: Mode::Chain,
        concurrency: 1,
        timeout_ms: Some(60_000),
        cwd: None,
        steps: vec![
            StepSpec {
                name: "build".to_string(),
                action: StepAction::Shell {
                    script: "make".to_string(),
                },
            },
            StepSpec {
                name: "deploy".to_string(),
                action: StepAction::ExternalJob {
                    provider: "deployer --watch".to_string(),
                },
            },
            StepSpec {
                name: "notify".to_string(),
                action: StepAction::Command {
                    argv: vec!["true".to_string()],
                },
            },
        ],
    };
    let hosts = HostIds {
        session_id: Some("session/with odd chars".to_string()),
        completion_owner_id: Some("owner-1".to_string()),
        tool_call_id: Some("call-9".to_string()),
    };
    let run = store.create_run(spec, hosts).expect("create").run;
    let batches = vec![
        vec![Event::RunnerStarted {
            runner: identity(100),
            instance_id: "runner-a".to_string(),
        }],
        vec![Event::StepRunning {
            step: 0,
            process: Some(identity(101)),
        }],
        vec![Event::StepFinished {
            step: 0,
            outcome: StepOutcome {
                end: StepEnd::Complete,
                exit_code: Some(0),
                error: None,
            },
        }],
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
                url: Some("https://jobs.example/7".to_string()),
            },
        }],
        vec![
            Event::StepFinished {
                step: 1,
                outcome: StepOutcome {
                    end: StepEnd::Failed,
                    exit_code: Some(1),
                    error: Some("external job failed: quota exceeded".to_string()),
                },
            },
            Event::Terminal {
                state: TerminalState::Failed,
                error: Some("step 1 (deploy) failed".to_string()),
                summary: "deploy failed".to_string(),
                exit_code: 1,
                repaired_by: None,
            },
        ],
        vec![Event::ProcessTerminalObserved {
            instance_id: "runner-a".to_string(),
            exit: Some(ProcessExit {
                code: Some(1),
                signal: None,
            }),
            proof: Proof::Observed,
            observer: Observer::RunnerParent,
        }],
    ];
    for events in batches {
        store
            .append(run, events, Condition::none())
            .expect("append");
    }
    run
}

/// Every file of the run's projection that should exist, with its bytes.
fn projected_files(store: &Store, run: RunId) -> BTreeMap<PathBuf, (FileKind, Vec<u8>)> {
    let view = store.journal().view().expect("view");
    let (state, records) = projection::load(&view, run).expect("load");
    projection::plan(store.home(), &state, &records)
        .files
        .into_iter()
        .filter(|file| file.content != Content::Absent)
        .map(|file| {
            let bytes = std::fs::read(&file.path).expect("projected file exists");
            (file.path, (file.kind, bytes))
        })
        .collect()
}

fn mode_of(path: &Path) -> u32 {
    std::fs::metadata(path).expect("stat").permissions().mode() & 0o777
}

#[test]
fn damaged_projections_are_rebuilt_byte_for_byte() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Store::open(Home::at(dir.path())).expect("open");
    let run = finished_run(&store);
    let original = projected_files(&store, run);
    let kinds: Vec<FileKind> = original.values().map(|(kind, _)| *kind).collect();
    for kind in [
        FileKind::Status,
        FileKind::Events,
        FileKind::Result,
        FileKind::ResultIndex,
        FileKind::TerminalMarker,
    ] {
        assert!(kinds.contains(&kind), "{kind:?} is projected");
    }

    type Damage = fn(&Path);
    let damages: [(&str, Damage); 3] = [
        ("deleted", |path| {
            std::fs::remove_file(path).expect("delete")
        }),
        ("truncated", |path| {
            let file = std::fs::OpenOptions::new()
                .write(true)
                .open(path)
                .expect("open");
            file.set_len(3).expect("truncate");
        }),
        ("corrupted", |path| {
            std::fs::write(path, b"{\"state\": \"running\"").expect("overwrite")
        }),
    ];
    for (path, (kind, bytes)) in &original {
        for (how, damage) in &damages {
            damage(path);
            let view = store.journal().view().expect("view");
            let (state, records) = projection::load(&view, run).expect("load");
            let differences =
                projection::check_plan(&projection::plan(store.home(), &state, &records));
            assert!(
                differences
                    .iter()
                    .any(|difference| difference.path == *path),
                "the check sees {kind:?} {how}"
            );
            // What `journal-tools replay` does: a full rewrite, result included.
            projection::project(store.home(), store.journal(), run, ResultPolicy::Rewrite)
                .expect("project again");
            let rebuilt = std::fs::read(path).expect("rebuilt file exists");
            assert_eq!(&rebuilt, bytes, "{kind:?} {how}: rebuilt byte for byte");
            assert_eq!(mode_of(path), 0o600, "{kind:?} is private");
        }
    }
    assert_eq!(projected_files(&store, run), original);
    for dir in [
        store.home().run_dir(run),
        store.home().runs_dir(),
        store.home().results_dir(),
    ] {
        assert_eq!(mode_of(&dir), 0o700, "{} is private", dir.display());
    }
    // The active and tool-call markers of a closed run are gone.
    assert!(!store.home().active_marker_path(run).exists());
    assert!(!store.home().tool_call_marker_path("call-9", run).exists());
}

#[test]
fn the_after_commit_projection_repairs_damage_but_does_not_republish_a_consumed_result() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Store::open(Home::at(dir.path())).expect("open");
    let run = finished_run(&store);
    let original = projected_files(&store, run);
    let status = store.home().status_path(run);
    let result = store.home().result_path(run);

    // A damaged result is damage: the next projection writes it again.
    std::fs::write(&result, b"{}").expect("damage the result");
    std::fs::write(&status, b"{}").expect("damage the status");
    store.project(run).expect("project");
    assert_eq!(std::fs::read(&result).expect("result"), original[&result].1);
    assert_eq!(std::fs::read(&status).expect("status"), original[&status].1);

    // A deleted one was consumed by a host: it is reported as such and left alone.
    std::fs::remove_file(&result).expect("a host consumes the result");
    let view = store.journal().view().expect("view");
    let (state, records) = projection::load(&view, run).expect("load");
    let differences = projection::check_plan(&projection::plan(store.home(), &state, &records));
    assert!(
        differences
            .iter()
            .any(|difference| difference.path == result && difference.problem == Problem::Consumed),
        "{differences:?}"
    );
    assert!(differences.iter().all(|difference| !difference.is_damage()));
    store.project(run).expect("project");
    assert!(!result.exists(), "a consumed result is not delivered again");
}

#[test]
fn status_json_reads_as_the_pi_subagents_format() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Store::open(Home::at(dir.path())).expect("open");
    let run = finished_run(&store);
    let text = std::fs::read_to_string(store.home().status_path(run)).expect("status.json");
    assert!(
        !text.ends_with('\n'),
        "no trailing newline, like JSON.stringify"
    );
    let status: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    assert_eq!(status["runId"], run.to_string());
    assert_eq!(status["mode"], "chain");
    assert_eq!(status["state"], "failed");
    assert_eq!(status["lifecycleArtifactVersion"], 3);
    assert_eq!(status["pid"], 100);
    assert_eq!(status["sessionId"], "session/with odd chars");
    assert_eq!(status["completionOwnerId"], "owner-1");
    assert_eq!(status["chainStepCount"], 3);
    assert_eq!(status["steps"][0]["agent"], "build");
    assert_eq!(status["steps"][0]["status"], "complete");
    assert_eq!(status["steps"][1]["status"], "failed");
    assert_eq!(status["steps"][1]["externalJob"]["state"], "failed");
    assert_eq!(status["steps"][1]["externalJob"]["providerJobId"], "job-7");
    assert_eq!(status["steps"][2]["status"], "skipped");
    assert_eq!(status["processTerminal"]["state"], "observed");
    assert_eq!(
        status["processTerminal"]["runnerProcessInstanceId"],
        "runner-a"
    );
    assert_eq!(status["processTerminal"]["instances"][0]["kind"], "runner");
    assert_eq!(status["journalSeq"], 9);
    let typed: StatusDoc = serde_json::from_str(&text).expect("our own type reads it back");
    assert_eq!(typed.run_id, run.to_string());

    let result: serde_json::Value =
        serde_json::from_slice(&std::fs::read(store.home().result_path(run)).expect("result file"))
            .expect("valid JSON");
    assert_eq!(result["id"], run.to_string());
    assert_eq!(result["success"], false);
    assert_eq!(result["state"], "failed");
    assert_eq!(result["exitCode"], 1);
    assert_eq!(result["agent"], "chain:build->deploy->notify");
    assert_eq!(result["results"].as_array().map(Vec::len), Some(3));
    assert_eq!(
        result["journalSeq"], 8,
        "stamped with the Terminal record's seq"
    );

    let terminal_markers = std::fs::read_dir(
        store
            .home()
            .runs_dir()
            .join(".terminal-runs")
            .join("session%2Fwith%20odd%20chars"),
    )
    .expect("terminal index dir")
    .count();
    assert_eq!(terminal_markers, 1);
}

#[test]
fn an_active_run_has_its_markers_and_a_pending_process_terminal() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Store::open(Home::at(dir.path())).expect("open");
    let spec = RunSpec {
        name: None,
        mode: Mode::Single,
        concurrency: 1,
        timeout_ms: None,
        cwd: None,
        steps: vec![StepSpec {
            name: "only".to_string(),
            action: StepAction::Shell {
                script: "sleep 1".to_string(),
            },
        }],
    };
    let hosts = HostIds {
        tool_call_id: Some("call-1".to_string()),
        ..HostIds::default()
    };
    let run = store.create_run(spec, hosts).expect("create").run;
    assert!(store.home().active_marker_path(run).exists());
    assert!(store.home().tool_call_marker_path("call-1", run).exists());
    assert!(!store.home().result_path(run).exists());
    let status: serde_json::Value =
        serde_json::from_slice(&std::fs::read(store.home().status_path(run)).expect("status"))
            .expect("json");
    assert_eq!(status["state"], "queued");
    assert_eq!(status["processTerminal"]["state"], "pending");
    assert_eq!(status["journalSeq"], 1);
}
