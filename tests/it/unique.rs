//! Runs launched once (docs/design.md, "Launched once") with the real binaries: launchers
//! racing with one `--unique` key get one run, a second launch is answered the run that holds
//! the key, the key is free again once its run ended, and `--unique-for` holds it past the end.

use std::process::{Command, Stdio};

use runjournal::RunStatus;
use serde_json::Value;

use crate::support::{
    TestHome, assert_indexes_verify, launch_json as launch, run_id_in, wait_terminal,
};

#[test]
fn launchers_racing_with_one_key_get_one_run() {
    let home = TestHome::new();
    let launchers: Vec<std::process::Child> = (0..8)
        .map(|_| {
            Command::new(env!("CARGO_BIN_EXE_runjournal"))
                .env_remove("RUNJOURNAL_HOME")
                .env_remove("RUNJOURNAL_LAYOUT")
                .arg("--home")
                .arg(home.path())
                .args(["run", "--json", "--unique", "deploy", "--", "sleep", "1"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("a launcher starts")
        })
        .collect();
    let answers: Vec<Value> = launchers
        .into_iter()
        .map(|launcher| {
            let output = launcher.wait_with_output().expect("the launcher ends");
            assert!(
                output.status.success(),
                "exit {:?}: {}",
                output.status.code(),
                String::from_utf8_lossy(&output.stderr)
            );
            serde_json::from_slice(&output.stdout).expect("run --json prints JSON")
        })
        .collect();
    let run = run_id_in(&answers[0]);
    for answer in &answers {
        assert_eq!(
            run_id_in(answer),
            run,
            "every launcher is answered the one run: {answer}"
        );
    }
    let existing = answers
        .iter()
        .filter(|answer| answer["existing"] == true)
        .count();
    assert_eq!(existing, 7, "one created it, seven found it: {answers:?}");
    let journal = home.journal();
    assert_eq!(journal.view().expect("view").run_count().expect("count"), 1);
    assert_eq!(wait_terminal(&journal, run).status, RunStatus::Complete);
    assert_indexes_verify(&home);
}

#[test]
fn a_key_is_free_again_once_its_run_ended_and_held_past_it_with_unique_for() {
    let home = TestHome::new();
    let first = run_id_in(&launch(&home, &["--unique", "k", "--", "sleep", "30"]));
    let again = launch(&home, &["--unique", "k", "--", "true"]);
    assert_eq!(run_id_in(&again), first, "{again}");
    assert_eq!(again["existing"], true, "{again}");
    assert_eq!(again["state"], "running", "{again}");
    assert_eq!(again["uniqueKey"], "k", "{again}");
    // Without --json: said, exit 0, and nothing else created.
    let said = home
        .cmd()
        .args(["run", "--unique", "k", "--", "true"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let said = String::from_utf8_lossy(&said).into_owned();
    assert!(
        said.contains(&format!("run {first} already holds the key \"k\"")),
        "{said}"
    );
    home.cmd()
        .args(["stop", &first.to_string()])
        .assert()
        .success();
    let journal = home.journal();
    assert_eq!(wait_terminal(&journal, first).status, RunStatus::Stopped);
    let second = launch(&home, &["--unique", "k", "--wait", "--", "true"]);
    let second_run = run_id_in(&second);
    assert_ne!(second_run, first, "free once its run ended: {second}");
    assert_eq!(second["existing"], Value::Null, "{second}");
    assert_eq!(journal.view().expect("view").run_count().expect("count"), 2);

    // Held for an hour after its creation, ended or not.
    let held = run_id_in(&launch(
        &home,
        &[
            "--unique",
            "h",
            "--unique-for",
            "1h",
            "--wait",
            "--",
            "true",
        ],
    ));
    assert_eq!(wait_terminal(&journal, held).status, RunStatus::Complete);
    let again = launch(&home, &["--unique", "h", "--", "true"]);
    assert_eq!(run_id_in(&again), held, "{again}");
    assert_eq!(again["state"], "complete", "{again}");
    // And retention keeps the run while it holds its key.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    home.cmd()
        .args(["prune", "--older-than", "1s"])
        .assert()
        .success();
    let view = journal.view().expect("view");
    assert!(
        view.snapshot(held).expect("reads").is_some(),
        "kept: it holds its key"
    );
    assert!(
        view.snapshot(first).expect("reads").is_none(),
        "pruned: its key was free"
    );
    // Both runs that took "k" ended over a second ago: pruned, and the key's entry with them.
    assert!(view.snapshot(second_run).expect("reads").is_none());
    assert_eq!(view.unique_holder("k").expect("reads"), None);
    assert_eq!(view.unique_holder("h").expect("reads"), Some(held));
    drop(view);
    assert_indexes_verify(&home);
}

/// `run --wait` with a key another run holds follows that run to its end and exits with its
/// exit code.
#[test]
fn run_wait_with_a_held_key_waits_for_the_run_that_holds_it() {
    let home = TestHome::new();
    let first = run_id_in(&launch(
        &home,
        &["--unique", "w", "--", "sh", "-c", "sleep 0.5; exit 3"],
    ));
    let output = home
        .cmd()
        .args(["run", "--unique", "w", "--wait", "--", "true"])
        .assert()
        .code(3)
        .get_output()
        .stdout
        .clone();
    let output = String::from_utf8_lossy(&output).into_owned();
    assert!(
        output.contains("Terminal") || output.contains("failed"),
        "{output}"
    );
    let journal = home.journal();
    assert_eq!(wait_terminal(&journal, first).status, RunStatus::Failed);
    assert_eq!(journal.view().expect("view").run_count().expect("count"), 1);
}

#[test]
fn a_key_that_cannot_be_one_is_refused_and_nothing_is_written() {
    let home = TestHome::new();
    let long = "k".repeat(257);
    for args in [
        vec!["--unique", ""],
        vec!["--unique", "a\u{7}b"],
        vec!["--unique", &long],
        vec!["--unique-for", "1h"],
    ] {
        home.cmd()
            .arg("run")
            .args(&args)
            .args(["--", "true"])
            .assert()
            .code(2);
    }
    assert_eq!(
        home.journal()
            .view()
            .expect("view")
            .run_count()
            .expect("count"),
        0
    );
}

/// A pi-subagents host launches one run per tool call: with `--unique-tool-call` the run's
/// tool-call id is its key, so a host that launches again for the same call gets the same run.
#[test]
fn the_tool_call_id_is_the_key_when_the_host_asks_for_it() {
    let home = TestHome::new();
    let args = [
        "--tool-call-id",
        "call-1",
        "--unique-tool-call",
        "--",
        "sleep",
        "30",
    ];
    let first = launch(&home, &args);
    let again = launch(&home, &args);
    assert_eq!(run_id_in(&again), run_id_in(&first), "{again}");
    assert_eq!(again["existing"], true, "{again}");
    assert_eq!(again["uniqueKey"], "tool-call:call-1", "{again}");
    // Another call is another run.
    let other = launch(
        &home,
        &[
            "--tool-call-id",
            "call-2",
            "--unique-tool-call",
            "--",
            "true",
        ],
    );
    assert_ne!(run_id_in(&other), run_id_in(&first));
    // Without a tool-call id, or beside a key of its own, it is bad input.
    for args in [
        vec!["--unique-tool-call"],
        vec![
            "--tool-call-id",
            "call-3",
            "--unique-tool-call",
            "--unique",
            "k",
        ],
    ] {
        home.cmd()
            .arg("run")
            .args(&args)
            .args(["--", "true"])
            .assert()
            .code(2);
    }
    home.cmd()
        .args(["stop", &run_id_in(&first).to_string()])
        .assert()
        .success();
}
