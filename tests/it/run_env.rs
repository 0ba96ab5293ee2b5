//! A run keeps its launcher's environment, with the real binaries: a queued run started by
//! another process (its admitter) sees its launcher's variables, cwd and umask and nothing of
//! the admitter's; `--env`, `--clear-env` and a spec's `env` shape what it keeps; a resume
//! keeps the paused run's; the values are shown only when asked and are in no record; an
//! environment past its bound is refused with nothing written.

use std::process::Command;

use runjournal::{RunId, RunStatus};
use serde_json::Value;

use crate::support::{TestHome, launch, records, wait_for, wait_terminal};

/// The step's output of `run`'s step 0.
fn output_of(home: &TestHome, run: RunId) -> String {
    std::fs::read_to_string(
        home.path()
            .join("runs")
            .join(run.to_string())
            .join("output-0.log"),
    )
    .unwrap_or_default()
}

/// What broke: a run behind a full queue ran with the environment of whichever process
/// admitted it (its `PATH`, its secrets), not its launcher's. Here the launcher has a secret,
/// a `PATH` of its own, a cwd and a umask; the admitter (`queue q --max-active 1`, run from
/// elsewhere with none of them) starts the runner; the step sees the launcher's.
#[test]
fn a_queued_run_sees_its_launchers_variables_not_its_admitters() {
    let home = TestHome::new();
    home.cmd()
        .args(["queue", "q", "--max-active", "0"])
        .assert()
        .success();
    let launcher_dir = tempfile::tempdir().expect("a directory");
    let admitter_dir = tempfile::tempdir().expect("a directory");
    let path = std::env::var("PATH").unwrap_or_default();
    let launcher_path = format!("{path}:/launcher-only");
    let script = r#"echo "secret=$MYSECRET path=$PATH"; echo "umask=$(umask)"; echo "cwd=$(pwd)""#;
    // `sh -c 'umask 027; exec runjournal ...'`: the launcher's own umask.
    let output = Command::new("sh")
        .arg("-c")
        .arg("umask 027; exec \"$0\" \"$@\"")
        .arg(env!("CARGO_BIN_EXE_runjournal"))
        .args(["--home"])
        .arg(home.path())
        .args(["run", "--json", "--queue", "q", "--", "sh", "-c", script])
        .current_dir(launcher_dir.path())
        .env_remove("RUNJOURNAL_HOME")
        .env("MYSECRET", "launcher-A")
        .env("PATH", &launcher_path)
        .output()
        .expect("the launcher runs");
    assert!(output.status.success(), "{output:?}");
    let run = crate::support::run_id_of(&output.stdout);
    let journal = home.journal();
    assert_eq!(
        crate::support::state(&journal, run).status,
        RunStatus::Queued
    );
    // The admitter: another cwd, umask and PATH, no secret.
    let admitted = Command::new("sh")
        .arg("-c")
        .arg("umask 077; exec \"$0\" \"$@\"")
        .arg(env!("CARGO_BIN_EXE_runjournal"))
        .args(["--home"])
        .arg(home.path())
        .args(["queue", "q", "--max-active", "1"])
        .current_dir(admitter_dir.path())
        .env_remove("RUNJOURNAL_HOME")
        .env_remove("MYSECRET")
        .env("PATH", "/usr/bin:/bin:/admitter-only")
        .output()
        .expect("the admitter runs");
    assert!(admitted.status.success(), "{admitted:?}");
    let state = wait_terminal(&journal, run);
    assert_eq!(state.status, RunStatus::Complete);
    let output = output_of(&home, run);
    assert!(
        output.contains(&format!("secret=launcher-A path={launcher_path}\n")),
        "{output}"
    );
    assert!(!output.contains("admitter-only"), "{output}");
    assert!(output.contains("umask=0027"), "{output}");
    let launcher_cwd = launcher_dir
        .path()
        .canonicalize()
        .expect("the launcher's cwd");
    assert!(
        output.contains(&format!("cwd={}\n", launcher_cwd.display())),
        "{output}"
    );
}

/// `--clear-env` keeps only what `--env` gives; a spec's `env` goes over the launcher's, and
/// `--env` over the spec's.
#[test]
fn clear_env_keeps_only_what_env_gives_and_env_goes_over_a_specs() {
    let home = TestHome::new();
    let cleared = launch(
        &home,
        &["--clear-env", "--env", "ONLY=this", "--", "/usr/bin/env"],
    );
    let journal = home.journal();
    wait_terminal(&journal, cleared);
    let output = output_of(&home, cleared);
    let names: Vec<&str> = output
        .lines()
        .filter_map(|line| line.split_once('=').map(|(name, _)| name))
        .collect();
    // The variables runjournal sets for every step, and the one asked for: nothing else.
    let mut expected = vec![
        "ONLY",
        "RUNJOURNAL_HOME",
        "RUNJOURNAL_INBOX",
        "RUNJOURNAL_LAYOUT",
        "RUNJOURNAL_RUN_ID",
        "RUNJOURNAL_STEP",
    ];
    let mut names = names;
    names.sort_unstable();
    expected.sort_unstable();
    assert_eq!(names, expected, "{output}");

    let spec = home.path().join("spec.json");
    std::fs::write(
        &spec,
        r#"{"env": {"FROM_SPEC": "spec", "BOTH": "spec"},
            "steps": [{"shell": "echo \"$FROM_SPEC $BOTH $FROM_LAUNCHER\""}]}"#,
    )
    .expect("the spec");
    let output = home
        .cmd()
        .env("FROM_LAUNCHER", "launcher")
        .args(["run", "--json", "--env", "BOTH=flag", "--spec"])
        .arg(&spec)
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let run = crate::support::run_id_of(&output);
    wait_terminal(&journal, run);
    assert_eq!(output_of(&home, run), "spec flag launcher\n");
}

/// A resume keeps the paused run's environment, whoever resumes it, with `resume --env` over it.
#[test]
fn a_resumed_run_keeps_the_paused_runs_environment() {
    let home = TestHome::new();
    let script = r#"echo "var=$PAUSED_VAR other=$OTHER"; [ -n "$OTHER" ] || sleep 60"#;
    let output = home
        .cmd()
        .env("PAUSED_VAR", "from-the-first-launcher")
        .args(["run", "--json", "--", "sh", "-c", script])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let paused = crate::support::run_id_of(&output);
    let journal = home.journal();
    crate::support::wait_output(&home, paused, 0, "var=from-the-first-launcher");
    home.cmd()
        .args(["interrupt", &paused.to_string()])
        .assert()
        .success();
    wait_for(&journal, paused, "the run to pause", |state| {
        state.status == RunStatus::Paused
    });
    let output = home
        .cmd()
        .env_remove("PAUSED_VAR")
        .args([
            "resume",
            &paused.to_string(),
            "--json",
            "--env",
            "OTHER=given-at-resume",
        ])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let resumed: Value = serde_json::from_slice(&output).expect("JSON");
    let resumed: RunId = resumed["runId"]
        .as_str()
        .expect("a run id")
        .parse()
        .expect("a run id");
    let state = wait_terminal(&journal, resumed);
    assert_eq!(state.status, RunStatus::Complete);
    assert_eq!(
        output_of(&home, resumed),
        "var=from-the-first-launcher other=given-at-resume\n"
    );
}

/// The values are secrets: in no record, no projection, not in `status` or `status --json`,
/// which say how many variables there are; `status --show-env` prints them.
#[test]
fn the_values_are_shown_only_with_show_env_and_are_in_no_record_or_projection() {
    const SECRET: &str = "hunter2-env-secret";
    let home = TestHome::new();
    let run = {
        let output = home
            .cmd()
            .env("API_TOKEN", SECRET)
            .args(["run", "--json", "--env", "ALSO=also-secret", "--", "true"])
            .assert()
            .success()
            .get_output()
            .stdout
            .clone();
        crate::support::run_id_of(&output)
    };
    let journal = home.journal();
    wait_terminal(&journal, run);
    for record in records(&journal, run) {
        let bytes = record.encode().expect("encodes");
        let text = String::from_utf8_lossy(&bytes);
        assert!(
            !text.contains(SECRET) && !text.contains("also-secret"),
            "{record:?}"
        );
    }
    let run_dir = home.path().join("runs").join(run.to_string());
    for file in ["status.json", "events.jsonl"] {
        let text = std::fs::read_to_string(run_dir.join(file)).expect("the projection");
        assert!(!text.contains(SECRET), "{file}: {text}");
    }
    for args in [vec!["status"], vec!["status", "--json"]] {
        let output = home
            .cmd()
            .args(&args)
            .arg(run.to_string())
            .assert()
            .success()
            .get_output()
            .stdout
            .clone();
        let text = String::from_utf8_lossy(&output);
        assert!(!text.contains(SECRET), "{args:?}: {text}");
        assert!(!text.contains("also-secret"), "{args:?}: {text}");
    }
    let summary = home
        .cmd()
        .args(["status", &run.to_string()])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    assert!(
        String::from_utf8_lossy(&summary).contains("(shown with --show-env)"),
        "{}",
        String::from_utf8_lossy(&summary)
    );
    let shown = home
        .cmd()
        .args(["status", &run.to_string(), "--show-env"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let shown = String::from_utf8_lossy(&shown);
    assert!(shown.contains(&format!("API_TOKEN={SECRET}")), "{shown}");
    assert!(shown.contains("ALSO=also-secret"), "{shown}");
    let shown = home
        .cmd()
        .args(["status", &run.to_string(), "--show-env", "--json"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let shown: Value = serde_json::from_slice(&shown).expect("JSON");
    let values = shown["environment"]["values"]
        .as_array()
        .expect("the variables");
    assert!(
        values
            .iter()
            .any(|variable| variable["name"] == "API_TOKEN" && variable["value"] == SECRET),
        "{shown}"
    );
}

/// An environment past its bound is bad input: exit 2, one line saying what to do, nothing
/// written.
#[test]
fn an_environment_past_its_bound_is_refused_and_nothing_is_written() {
    let home = TestHome::new();
    // Each variable under the kernel's bound on one string, the whole over the run's.
    let big = "x".repeat(100 * 1024);
    let output = home
        .cmd()
        .env("BIG_ONE", &big)
        .env("BIG_TWO", &big)
        .env("BIG_THREE", &big)
        .args(["run", "--", "true"])
        .output()
        .expect("runs");
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("over the limit"), "{stderr}");
    assert!(stderr.contains("--clear-env"), "{stderr}");
    let runs = home
        .journal()
        .view()
        .expect("view")
        .run_count()
        .expect("counts");
    assert_eq!(runs, 0, "no run was created");
    // The same launcher with --clear-env keeps only what it gives, and runs.
    home.cmd()
        .env("BIG_ONE", &big)
        .env("BIG_TWO", &big)
        .env("BIG_THREE", &big)
        .args([
            "run",
            "--clear-env",
            "--env",
            "A=1",
            "--wait",
            "--",
            "/bin/true",
        ])
        .assert()
        .success();
    // A name that is not one is a usage error.
    home.cmd()
        .args(["run", "--env", "NO_EQUALS", "--", "true"])
        .assert()
        .code(2);
}
