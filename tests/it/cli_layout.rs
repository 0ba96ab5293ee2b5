//! `--layout pi-subagents` (and `RUNJOURNAL_LAYOUT`): the home is a pi-subagents temp root, and
//! a home is never opened under the other layout than its journal's.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support::TestHome;

/// `runjournal` with no home or layout from the outside.
fn runjournal() -> assert_cmd::Command {
    let mut command = assert_cmd::cargo::cargo_bin_cmd!("runjournal");
    command
        .env_remove("RUNJOURNAL_HOME")
        .env_remove("RUNJOURNAL_LAYOUT")
        .env_remove("PI_SUBAGENTS_TEMP_ROOT")
        .env("RUNJOURNAL_RESERVE_BYTES", "0")
        .timeout(Duration::from_secs(120));
    command
}

/// Runs `run --json --wait`-free launch and returns (run id, status path).
fn launch(command: &mut assert_cmd::Command, args: &[&str]) -> (String, PathBuf) {
    let output = command.args(args).output().expect("runjournal runs");
    assert!(output.status.success(), "{output:?}");
    let line = String::from_utf8_lossy(&output.stdout);
    let launched: serde_json::Value =
        serde_json::from_str(line.trim()).unwrap_or_else(|_| panic!("one JSON line: {line}"));
    (
        launched["runId"].as_str().expect("runId").to_string(),
        PathBuf::from(launched["statusPath"].as_str().expect("statusPath")),
    )
}

/// Waits for the run's end, then reconciles: the runner projects after its last commit, so
/// only a pass under the run's lock makes sure every file is there to look at.
fn wait(root: &Path, run: &str, layout: &str) {
    runjournal()
        .arg("--home")
        .arg(root)
        .args(["--layout", layout, "wait", run])
        .assert()
        .success();
    runjournal()
        .arg("--home")
        .arg(root)
        .args(["--layout", layout, "reconcile"])
        .assert()
        .success();
}

#[test]
fn a_run_in_the_pi_subagents_layout_is_where_pi_subagents_looks() {
    let home = TestHome::new();
    let root = home.path();
    let (run, status_path) = launch(
        runjournal().arg("--home").arg(root),
        &[
            "--layout",
            "pi-subagents",
            "run",
            "--json",
            "--session-id",
            "session-1",
            "--tool-call-id",
            "call-1",
            "--",
            "sh",
            "-c",
            "printf %s \"$RUNJOURNAL_LAYOUT\"",
        ],
    );
    wait(root, &run, "pi-subagents");
    let run_dir = root.join("async-subagent-runs").join(&run);
    assert_eq!(status_path, run_dir.join("status.json"));
    for file in [
        "status.json",
        "events.jsonl",
        "output-0.log",
        "runner.stderr.log",
    ] {
        assert!(run_dir.join(file).is_file(), "{file}");
    }
    assert_eq!(
        std::fs::read_to_string(run_dir.join("output-0.log")).expect("output"),
        "pi-subagents",
        "a step is told the layout, so its own runjournal commands find the same home"
    );
    let results = root.join("async-subagent-results");
    assert!(results.join(format!("{run}.json")).is_file());
    assert!(
        results
            .join("result-index/sessions/session-1")
            .join(format!("{run}.json"))
            .is_file()
    );
    let terminal_markers: Vec<_> =
        std::fs::read_dir(root.join("async-subagent-runs/.terminal-runs/session-1"))
            .expect("terminal index")
            .map(|entry| entry.expect("entry").file_name())
            .collect();
    assert_eq!(terminal_markers.len(), 1, "{terminal_markers:?}");
    assert!(root.join("runjournal/journal.redb").is_file());
    assert!(root.join("runjournal/reconciled-through").is_file());
    for not_there in ["journal.redb", "runs", "results", "reserve", "blocked"] {
        assert!(!root.join(not_there).exists(), "{not_there} at the root");
    }
    let entries: Vec<_> = std::fs::read_dir(root.join("async-subagent-runs"))
        .expect("runs dir")
        .map(|entry| {
            entry
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    let mut entries = entries;
    entries.sort();
    assert_eq!(
        entries,
        vec![
            ".active-runs".to_string(),
            ".terminal-runs".to_string(),
            run.clone()
        ],
        "only run directories and pi-subagents' indexes among the runs"
    );
}

#[test]
fn the_layout_and_its_root_come_from_the_environment_without_home() {
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path().join("pi-root");
    let (run, status_path) = launch(
        runjournal()
            .env("RUNJOURNAL_LAYOUT", "pi-subagents")
            .env("PI_SUBAGENTS_TEMP_ROOT", format!("  {}  ", root.display())),
        &["run", "--json", "--", "true"],
    );
    assert_eq!(
        status_path,
        root.join("async-subagent-runs")
            .join(&run)
            .join("status.json")
    );
    wait(&root, &run, "pi-subagents");

    // Neither --home nor PI_SUBAGENTS_TEMP_ROOT: pi-subagents' own default root.
    let tmpdir = dir.path().join("tmp");
    std::fs::create_dir(&tmpdir).expect("mkdir");
    let (run, status_path) = launch(
        runjournal()
            .env("TMPDIR", format!("{}/", tmpdir.display()))
            .args(["--layout", "pi-subagents"]),
        &["run", "--json", "--", "true"],
    );
    let default_root = tmpdir.join(format!("pi-subagents-uid-{}", nix::unistd::getuid()));
    assert_eq!(
        status_path,
        default_root
            .join("async-subagent-runs")
            .join(&run)
            .join("status.json")
    );
    wait(&default_root, &run, "pi-subagents");
}

#[test]
fn a_home_is_refused_under_the_other_layout_and_nothing_is_made() {
    let home = TestHome::new();
    home.cmd()
        .args(["run", "--wait", "--", "true"])
        .assert()
        .success();
    let output = home
        .cmd()
        .args(["--layout", "pi-subagents", "list"])
        .output()
        .expect("list");
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--layout runjournal"), "{stderr}");
    for not_made in [
        "runjournal",
        "async-subagent-runs",
        "async-subagent-results",
    ] {
        assert!(!home.file(not_made).exists(), "{not_made} was made");
    }
    let output = home
        .cmd()
        .env("RUNJOURNAL_LAYOUT", "pi")
        .arg("list")
        .output()
        .expect("list");
    assert_eq!(
        output.status.code(),
        Some(2),
        "an unknown layout is bad input"
    );
}
