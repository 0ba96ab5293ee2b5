//! A projection deleted, truncated or corrupted is rebuilt, by projecting again, byte for byte
//! as it was; the files are private (0600 in 0700 directories) and readable in the
//! pi-subagents format.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use runjournal::HostIds;
use runjournal::event::{
    Event, ExternalJobStatus, JobState, Mode, RunSpec, StepEnd, TerminalState,
};
use runjournal::projection::{
    self, Content, FileKind, Problem, ResultPolicy, documents::StatusDoc,
};
use runjournal::testkit as kit;
use runjournal::{Condition, Home, RunId, Store};

/// A chain whose second step (an external job) fails: status, events, result, result index,
/// tool-call and terminal markers all exist.
fn finished_run(store: &Store) -> RunId {
    let (spec, hosts) = spec_and_hosts();
    let run = store.create_run(spec, hosts).expect("create").run;
    for events in lifecycle() {
        store
            .append(run, events, Condition::none())
            .expect("append");
    }
    run
}

/// The run of [`finished_run`]: its spec and its host's ids (a session, so it has a result
/// index entry).
fn spec_and_hosts() -> (RunSpec, HostIds) {
    let spec = RunSpec {
        name: Some("repair".to_string()),
        timeout_ms: Some(60_000),
        ..kit::spec(
            Mode::Chain,
            vec![
                kit::shell("build", "make"),
                kit::step("deploy", kit::provider("deployer --watch")),
                kit::step("notify", kit::argv(&["true"])),
            ],
        )
    };
    let hosts = kit::hosts(
        Some("session/with odd chars"),
        Some("owner-1"),
        Some("call-9"),
    );
    (spec, hosts)
}

/// The batches of [`finished_run`] after `RunCreated`: the last but one ends the run.
fn lifecycle() -> Vec<Vec<Event>> {
    let failed = ExternalJobStatus {
        progress: Some(0.5),
        message: Some("quota exceeded".to_string()),
        url: Some("https://jobs.example/7".to_string()),
        ..kit::job(JobState::Failed, "job-7", None)
    };
    vec![
        vec![kit::runner_started(kit::identity(100), "runner-a")],
        vec![kit::step_running(0, Some(kit::identity(101)))],
        vec![kit::step_complete(0)],
        vec![kit::step_running(1, Some(kit::identity(102)))],
        vec![kit::job_updated(1, failed)],
        vec![
            kit::step_finished(
                1,
                StepEnd::Failed,
                Some(1),
                Some("external job failed: quota exceeded"),
            ),
            kit::terminal(
                TerminalState::Failed,
                1,
                "deploy failed",
                Some("step 1 (deploy) failed"),
            ),
        ],
        vec![kit::runner_exited("runner-a", 1)],
    ]
}

/// Every file of the run's projection that should exist, with its bytes.
fn projected_files(store: &Store, run: RunId) -> BTreeMap<PathBuf, (FileKind, Vec<u8>)> {
    let view = store.journal().view().expect("view");
    let (state, records, links) = projection::load(&view, run).expect("load");
    projection::plan(store.home(), &state, &records, &links)
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
            let (state, records, links) = projection::load(&view, run).expect("load");
            let differences =
                projection::check_plan(&projection::plan(store.home(), &state, &records, &links));
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
    let (state, records, links) = projection::load(&view, run).expect("load");
    let differences =
        projection::check_plan(&projection::plan(store.home(), &state, &records, &links));
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
    // pi-subagents has no `skipped`: a step a failed run never ran is `failed` there, and ours
    // says it never ran.
    assert_eq!(status["steps"][2]["status"], "failed");
    assert_eq!(status["steps"][2]["skipped"], true);
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
    let spec = kit::spec(Mode::Single, vec![kit::shell("only", "sleep 1")]);
    let hosts = kit::hosts(None, None, Some("call-1"));
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

/// The files of a run's plan a host may consume (its result's index entries, then the result),
/// as a fresh projection has them.
fn result_files(store_home: &Home, view: &runjournal::journal::View, run: RunId) -> Vec<PathBuf> {
    let (state, records, links) = projection::load(view, run).expect("load");
    projection::plan(store_home, &state, &records, &links)
        .files
        .into_iter()
        .filter(|file| file.kind.may_be_consumed())
        .map(|file| file.path)
        .collect()
}

const KILLED_PROJECTOR_ENV: &str = "RUNJOURNAL_TEST_KILLED_PROJECTOR";

/// In the child: the run of [`finished_run`] appended through a journal alone (no projection
/// after each commit), then projected as after its last commit, and SIGKILLed by the test hook
/// right after the result's session index entry is written, before the result file.
fn killed_projector_child(home: &Path) {
    let home = Home::at(home);
    let journal = runjournal::Journal::open(home.journal_path()).expect("the journal opens");
    let (spec, hosts) = spec_and_hosts();
    let run = journal.create_run(spec, hosts).expect("create").run;
    for events in lifecycle() {
        journal
            .append(run, events, Condition::none())
            .expect("append");
    }
    let view = journal.view().expect("view");
    let (state, records, links) = projection::load(&view, run).expect("load");
    let plan = projection::plan(&home, &state, &records, &links);
    // As `projection::project` does before it writes.
    std::fs::create_dir_all(home.run_dir(run)).expect("the run's directory");
    projection::write_plan_observed(&plan, ResultPolicy::Publish, &mut |file| {
        if file.kind == FileKind::ResultIndex {
            let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
        }
    })
    .expect("the projection is written up to the kill");
    panic!("the child was not killed after writing the result's index entry");
}

/// Regression: the `.result-published` marker was once made right after the result file,
/// before the session's result index entry, and a projector killed between the two left the
/// entry missing with the marker in place, which every later projection took for "consumed by
/// the host" and never wrote again. The marker comes after every file a host may consume (the
/// index entries, then the result, in pi-subagents' order), so a kill between two of them
/// leaves the result unpublished and the reconciler's repair writes the rest.
#[test]
fn a_result_lost_to_a_kill_after_its_index_entry_is_written_again_not_called_consumed() {
    if let Ok(home) = std::env::var(KILLED_PROJECTOR_ENV) {
        killed_projector_child(Path::new(&home));
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let home = Home::at(dir.path());
    drop(Store::open(home.clone()).expect("the home is made"));
    let output = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "projection_repair::a_result_lost_to_a_kill_after_its_index_entry_is_written_again_not_called_consumed",
            "--test-threads=1",
        ])
        .env(KILLED_PROJECTOR_ENV, dir.path())
        .output()
        .expect("spawn the child");
    let stdout = String::from_utf8_lossy(&output.stdout);
    // A renamed test would make the filter match nothing, and an empty run exits 0.
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&output.status),
        Some(9),
        "the child was SIGKILLed at the hook: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("running 1 test"), "{stdout}");

    let store = Store::open(home.clone()).expect("open");
    let run = store
        .journal()
        .view()
        .expect("view")
        .all_runs()
        .expect("runs")[0];
    let view = store.journal().view().expect("view");
    let files = result_files(&home, &view, run);
    drop(view);
    let [index, by_run, by_call, result] = files.as_slice() else {
        panic!(
            "a result and its index entries by session, run and tool call are planned: {files:?}"
        );
    };
    assert!(
        index.exists(),
        "the session's index entry was written before the kill"
    );
    assert!(
        !by_run.exists() && !by_call.exists() && !result.exists(),
        "the kill came before the rest"
    );
    assert!(
        !home.result_published_marker_path(run).exists(),
        "the result is not published while it is missing"
    );

    // The reconciler checks the runs changed since its last pass and repairs them.
    let report = runjournal::reconcile::reconcile(&store, &Default::default()).expect("reconcile");
    assert!(
        report
            .changed()
            .any(|outcome| outcome.run == run && outcome.reprojected),
        "the pass repaired the run's projection: {report:?}"
    );
    let view = store.journal().view().expect("view");
    let (state, records, links) = projection::load(&view, run).expect("load");
    let differences = projection::check_plan(&projection::plan(&home, &state, &records, &links));
    assert_eq!(
        differences,
        vec![],
        "every file is as a fresh projection has it"
    );
    assert!(
        by_run.exists()
            && by_call.exists()
            && result.exists()
            && home.result_published_marker_path(run).exists()
    );
}

/// A full disk (here: the session's index directory cannot be made) failing the result index
/// write leaves the result unpublished: the store's projection retry writes the entry once the
/// obstacle is gone, instead of taking the missing entry for one a host consumed.
#[test]
fn a_failed_result_index_write_is_retried_not_called_consumed() {
    let dir = tempfile::tempdir().expect("temp dir");
    let home = Home::at(dir.path());
    let store = Store::open(home.clone()).expect("open");
    let (spec, hosts) = spec_and_hosts();
    let session_id = hosts.session_id.clone().expect("the run has a session");
    let run = store.create_run(spec, hosts).expect("create").run;
    let index = home.result_session_index_path(&session_id, run);
    let obstacle = index
        .parent()
        .expect("the entry has a directory")
        .to_path_buf();
    std::fs::create_dir_all(obstacle.parent().expect("the sessions directory")).expect("mkdir");
    std::fs::write(&obstacle, b"").expect("a file where the session's directory goes");
    for events in lifecycle() {
        store
            .append(run, events, Condition::none())
            .expect("the appends land whatever the projection does");
    }
    assert!(
        !home.result_path(run).exists(),
        "the result comes after its index entries, as pi-subagents publishes it"
    );
    assert!(!index.exists());
    assert!(
        !home.result_published_marker_path(run).exists(),
        "not published while the index entry could not be written"
    );
    assert_eq!(
        store.pending_projections(),
        1,
        "the projection waits for a retry"
    );

    std::fs::remove_file(&obstacle).expect("the obstacle goes");
    assert_eq!(
        store.flush_projections(std::time::Duration::from_secs(60)),
        0,
        "the retry lands"
    );
    assert!(index.exists(), "the retry wrote the index entry");
    let view = store.journal().view().expect("view");
    let (state, records, links) = projection::load(&view, run).expect("load");
    assert_eq!(
        projection::check_plan(&projection::plan(&home, &state, &records, &links)),
        vec![]
    );
}
