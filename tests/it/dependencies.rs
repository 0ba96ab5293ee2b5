//! Dependencies between runs with the real binaries (docs/design.md, "Dependencies"): `run
//! --after` chains run in order, a failed dependency ends its dependents without starting
//! them, `--after-any` starts after a failure, and a run that waits for both a dependency and
//! a full queue starts only once both allow. Order is read from the journal: each record's
//! place in the log (commit order) and its recorded time.

use std::path::Path;

use runjournal::event::{Event, RunId};
use runjournal::{Journal, RunStatus};
use serde_json::Value;

use crate::support::{TestHome, state, wait_for, wait_terminal};

/// `run --json ARGS`: the run's id and the launch's JSON.
fn launch(home: &TestHome, args: &[&str]) -> (RunId, Value) {
    let output = home
        .cmd()
        .args(["run", "--json"])
        .args(args)
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let object: Value = serde_json::from_slice(&output).expect("run --json prints JSON");
    let run = object["runId"]
        .as_str()
        .expect("a run id")
        .parse()
        .expect("a run id");
    (run, object)
}

/// Where `run`'s first record of `name` is: its place in the log (commit order) and its time.
fn first(journal: &Journal, run: RunId, name: &str) -> Option<(u64, u64)> {
    let view = journal.view().expect("view");
    let mut after = 0;
    loop {
        let page = view.records_after(after, 1000).expect("the log reads");
        let (last, _) = page.last()?;
        after = *last;
        for (global, record) in page {
            if record.run_id == run && record.event.name() == name {
                return Some((global, record.time_ms));
            }
        }
    }
}

/// Asserts that `later`'s `later_event` was committed after `earlier`'s `earlier_event`, and
/// recorded at the same time or later.
fn assert_after(
    journal: &Journal,
    (later, later_event): (RunId, &str),
    (earlier, earlier_event): (RunId, &str),
) {
    let (later_at, later_ms) = first(journal, later, later_event)
        .unwrap_or_else(|| panic!("{later} has no {later_event}"));
    let (earlier_at, earlier_ms) = first(journal, earlier, earlier_event)
        .unwrap_or_else(|| panic!("{earlier} has no {earlier_event}"));
    assert!(
        later_at > earlier_at,
        "{later}'s {later_event} (log {later_at}) comes after {earlier}'s {earlier_event} (log {earlier_at})"
    );
    assert!(
        later_ms >= earlier_ms,
        "{later}'s {later_event} at {later_ms} ms, {earlier}'s {earlier_event} at {earlier_ms} ms"
    );
}

/// A step that waits until `gate` exists (for at most a minute).
fn gated(gate: &Path) -> String {
    format!(
        "for i in $(seq 1200); do [ -e '{gate}' ] && break; sleep 0.05; done; [ -e '{gate}' ] || exit 9",
        gate = gate.display()
    )
}

#[test]
fn after_chains_run_in_order_each_starting_after_its_dependency_ended() {
    let home = TestHome::new();
    let (a, _) = launch(&home, &["--", "sh", "-c", "sleep 0.3"]);
    let (b, launched_b) = launch(&home, &["--after", &a.to_string(), "--", "true"]);
    assert_eq!(launched_b["state"], "queued", "{launched_b}");
    assert_eq!(launched_b["waitingFor"][0], a.to_string(), "{launched_b}");
    let (c, _) = launch(&home, &["--after", &b.to_string(), "--", "true"]);
    let journal = home.journal();
    for run in [a, b, c] {
        assert_eq!(
            wait_terminal(&journal, run).status,
            RunStatus::Complete,
            "{run}"
        );
    }
    // No reconcile pass ran: each ending runner started the next.
    assert_after(&journal, (b, "RunnerStarted"), (a, "Terminal"));
    assert_after(&journal, (c, "RunnerStarted"), (b, "Terminal"));
    assert_after(&journal, (b, "DependenciesMet"), (a, "Terminal"));
}

#[test]
fn a_failed_dependency_skips_its_dependents_and_names_it_in_their_reason() {
    let home = TestHome::new();
    let gate = home.file("gate");
    let (a, _) = launch(
        &home,
        &["--", "sh", "-c", &format!("{}; exit 3", gated(&gate))],
    );
    let (b, _) = launch(&home, &["--after", &a.to_string(), "--", "true"]);
    let (c, _) = launch(
        &home,
        &[
            "--after",
            &b.to_string(),
            "--",
            "sh",
            "-c",
            "echo c; echo c2",
        ],
    );
    let journal = home.journal();
    // Both wait, and say for what.
    let list = home.cmd().args(["list", "--json"]).assert().success();
    let rows: Value = serde_json::from_slice(&list.get_output().stdout).expect("JSON");
    let row_of = |run: RunId| {
        rows.as_array()
            .expect("an array")
            .iter()
            .find(|row| row["runId"] == run.to_string())
            .cloned()
            .expect("listed")
    };
    assert_eq!(row_of(b)["state"], "queued");
    assert_eq!(row_of(b)["waitingFor"][0], a.to_string());
    assert_eq!(row_of(c)["waitingFor"][0], b.to_string());
    std::fs::write(&gate, b"").expect("the gate opens");
    assert_eq!(wait_terminal(&journal, a).status, RunStatus::Failed);
    for (run, dependency) in [(b, a), (c, b)] {
        let ended = wait_terminal(&journal, run);
        assert_eq!(ended.status, RunStatus::Failed, "{run}");
        assert!(ended.runner.is_none(), "{run} never started");
        assert!(
            ended
                .steps
                .iter()
                .all(|step| step.status.as_str() == "skipped"),
            "{run}: {:?}",
            ended.steps
        );
        let error = ended
            .terminal
            .as_ref()
            .and_then(|terminal| terminal.error.clone())
            .unwrap_or_default();
        assert!(
            error.contains(&dependency.to_string()),
            "{run}'s reason names {dependency}: {error}"
        );
    }
    // The chain failed through in the ending runner's pass, with no reconcile pass between.
    assert_after(&journal, (c, "Terminal"), (b, "Terminal"));
    let status = home
        .cmd()
        .args(["status", &c.to_string()])
        .assert()
        .success();
    let text = String::from_utf8_lossy(&status.get_output().stdout).into_owned();
    assert!(
        text.contains(&format!("dependency {b} ended failed")),
        "{text}"
    );
}

#[test]
fn after_any_starts_after_a_failure() {
    let home = TestHome::new();
    let (a, _) = launch(&home, &["--", "sh", "-c", "sleep 0.2; exit 3"]);
    let (b, _) = launch(&home, &["--after-any", &a.to_string(), "--", "true"]);
    let journal = home.journal();
    assert_eq!(wait_terminal(&journal, a).status, RunStatus::Failed);
    assert_eq!(wait_terminal(&journal, b).status, RunStatus::Complete);
    assert_after(&journal, (b, "RunnerStarted"), (a, "Terminal"));
}

#[test]
fn a_dependency_already_ended_is_judged_at_launch() {
    let home = TestHome::new();
    let (a, _) = launch(&home, &["--", "true"]);
    let (failed, _) = launch(&home, &["--", "false"]);
    let journal = home.journal();
    wait_terminal(&journal, a);
    wait_terminal(&journal, failed);
    let (b, launched) = launch(&home, &["--after", &a.to_string(), "--", "true"]);
    assert_eq!(launched["state"], "running", "{launched}");
    assert_eq!(wait_terminal(&journal, b).status, RunStatus::Complete);
    let output = home
        .cmd()
        .args([
            "run",
            "--json",
            "--after",
            &failed.to_string(),
            "--",
            "true",
        ])
        .assert()
        .code(1)
        .get_output()
        .stdout
        .clone();
    let object: Value = serde_json::from_slice(&output).expect("JSON");
    let c: RunId = object["runId"]
        .as_str()
        .expect("an id")
        .parse()
        .expect("an id");
    let ended = state(&journal, c);
    assert_eq!(ended.status, RunStatus::Failed);
    assert!(ended.runner.is_none());
}

#[test]
fn after_and_after_any_take_a_name_a_tool_call_id_and_a_prefix_as_status_does() {
    let home = TestHome::new();
    let (a, _) = launch(
        &home,
        &["--name", "build", "--", "sh", "-c", "sleep 0.3; exit 3"],
    );
    let (b, _) = launch(
        &home,
        &[
            "--tool-call-id",
            "call-7",
            "--after-any",
            "build",
            "--",
            "true",
        ],
    );
    let prefix = &b.to_string()[..12];
    let (c, launched_c) = launch(&home, &["--after", prefix, "--", "true"]);
    assert_eq!(launched_c["waitingFor"][0], b.to_string(), "{launched_c}");
    let (d, launched_d) = launch(&home, &["--after", "call-7", "--", "true"]);
    assert_eq!(launched_d["waitingFor"][0], b.to_string(), "{launched_d}");
    let journal = home.journal();
    assert_eq!(wait_terminal(&journal, a).status, RunStatus::Failed);
    for run in [b, c, d] {
        assert_eq!(
            wait_terminal(&journal, run).status,
            RunStatus::Complete,
            "{run}"
        );
    }
    assert_after(&journal, (b, "RunnerStarted"), (a, "Terminal"));
    assert_after(&journal, (c, "RunnerStarted"), (b, "Terminal"));
    assert_after(&journal, (d, "RunnerStarted"), (b, "Terminal"));

    // A text that names different runs by different ways is refused, naming each.
    launch(&home, &["--name", "call-7", "--", "true"]);
    let assert = home
        .cmd()
        .args(["run", "--after", "call-7", "--", "true"])
        .assert()
        .code(2);
    let stderr = String::from_utf8_lossy(&assert.get_output().stderr).into_owned();
    assert!(
        stderr.contains("by name")
            && stderr.contains("by tool-call id")
            && stderr.contains(&b.to_string()),
        "the refusal names both runs: {stderr}"
    );
}

#[test]
fn a_dependency_that_is_not_in_the_journal_is_refused_at_launch_and_nothing_is_written() {
    let home = TestHome::new();
    home.cmd().args(["run", "--", "true"]).assert().success();
    let before = home
        .journal()
        .view()
        .expect("view")
        .run_count()
        .expect("count");
    for missing in [RunId::generate().to_string(), "no-such-name".to_string()] {
        let assert = home
            .cmd()
            .args(["run", "--after", &missing, "--", "true"])
            .assert()
            .code(2);
        let stderr = String::from_utf8_lossy(&assert.get_output().stderr).into_owned();
        assert!(stderr.contains(&missing), "the refusal names it: {stderr}");
    }
    let after = home
        .journal()
        .view()
        .expect("view")
        .run_count()
        .expect("count");
    assert_eq!(before, after, "nothing was written");
}

#[test]
fn a_run_waiting_for_a_dependency_and_a_full_queue_starts_only_when_both_allow() {
    let home = TestHome::new();
    home.cmd()
        .args(["queue", "q", "--max-active", "1"])
        .assert()
        .success();
    let slot_gate = home.file("slot-gate");
    let dependency_gate = home.file("dependency-gate");
    let (holder, _) = launch(
        &home,
        &["--queue", "q", "--", "sh", "-c", &gated(&slot_gate)],
    );
    let (dependency, _) = launch(&home, &["--", "sh", "-c", &gated(&dependency_gate)]);
    let (waiter, launched) = launch(
        &home,
        &[
            "--queue",
            "q",
            "--after",
            &dependency.to_string(),
            "--",
            "true",
        ],
    );
    assert_eq!(
        launched["waitingFor"][0],
        dependency.to_string(),
        "{launched}"
    );
    let journal = home.journal();
    // Its dependency ends first: it is met, and waits for the slot the holder keeps.
    std::fs::write(&dependency_gate, b"").expect("the gate opens");
    assert_eq!(
        wait_terminal(&journal, dependency).status,
        RunStatus::Complete
    );
    let met = wait_for(&journal, waiter, "its dependencies met", |state| {
        state
            .dependencies
            .as_ref()
            .is_some_and(|dependencies| dependencies.met.is_some())
    });
    assert!(met.is_waiting_for_slot(), "it waits for the slot now");
    assert!(met.runner.is_none());
    let status = home
        .cmd()
        .args(["status", "--json", &waiter.to_string()])
        .assert()
        .success();
    let document: Value = serde_json::from_slice(&status.get_output().stdout).expect("JSON");
    assert_eq!(document["queueUse"]["place"], 1, "{document}");
    assert_eq!(
        document["dependencies"]["waitingFor"],
        Value::Array(Vec::new())
    );
    // The slot frees: it starts.
    std::fs::write(&slot_gate, b"").expect("the gate opens");
    assert_eq!(wait_terminal(&journal, holder).status, RunStatus::Complete);
    assert_eq!(wait_terminal(&journal, waiter).status, RunStatus::Complete);
    assert_after(
        &journal,
        (waiter, "DependenciesMet"),
        (dependency, "Terminal"),
    );
    assert_after(&journal, (waiter, "QueueAdmitted"), (holder, "Terminal"));
    assert_after(
        &journal,
        (waiter, "QueueAdmitted"),
        (waiter, "DependenciesMet"),
    );
}

#[test]
fn the_queue_is_not_held_by_a_run_waiting_for_its_dependency() {
    let home = TestHome::new();
    home.cmd()
        .args(["queue", "q", "--max-active", "1"])
        .assert()
        .success();
    let gate = home.file("gate");
    let (dependency, _) = launch(&home, &["--", "sh", "-c", &gated(&gate)]);
    let (waiter, _) = launch(
        &home,
        &[
            "--queue",
            "q",
            "--after",
            &dependency.to_string(),
            "--",
            "true",
        ],
    );
    // A later run of the queue is not kept behind the waiting one: the slot is free.
    let (later, _) = launch(&home, &["--queue", "q", "--", "true"]);
    let journal = home.journal();
    assert_eq!(wait_terminal(&journal, later).status, RunStatus::Complete);
    assert!(state(&journal, waiter).is_waiting_for_dependencies());
    std::fs::write(&gate, b"").expect("the gate opens");
    assert_eq!(wait_terminal(&journal, waiter).status, RunStatus::Complete);
}

#[test]
fn stop_of_a_run_waiting_for_its_dependency_ends_it_without_starting_and_prune_keeps_the_dependency()
 {
    let home = TestHome::new();
    let gate = home.file("gate");
    let (done, _) = launch(&home, &["--", "true"]);
    wait_terminal(&home.journal(), done);
    let (dependency, _) = launch(&home, &["--", "sh", "-c", &gated(&gate)]);
    let (waiter, _) = launch(
        &home,
        &[
            "--after",
            &dependency.to_string(),
            "--after-any",
            &done.to_string(),
            "--",
            "true",
        ],
    );
    // `done` has ended and is closed, but a waiting run depends on it: prune keeps it.
    crate::support::reconcile_until_closed(&home.file("journal.redb"), &[done], || {
        let _ = home.cmd().arg("reconcile").output();
    });
    let output = home
        .cmd()
        .args(["prune", "--json", "--keep-runs", "0"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let report: Value = serde_json::from_slice(&output).expect("prune --json prints JSON");
    let kept = report["kept"].as_array().expect("kept is an array");
    assert!(
        kept.iter().any(|kept| kept["runId"] == done.to_string()
            && kept["why"]
                .as_str()
                .is_some_and(|why| why.contains("depends on it"))),
        "{report}"
    );
    let journal = home.journal();
    assert!(
        journal
            .view()
            .expect("view")
            .snapshot(done)
            .expect("reads")
            .is_some()
    );
    home.cmd()
        .args(["stop", &waiter.to_string()])
        .assert()
        .success();
    let stopped = wait_terminal(&journal, waiter);
    assert_eq!(stopped.status, RunStatus::Stopped);
    assert!(stopped.runner.is_none(), "no runner ever started for it");
    assert!(
        !journal
            .view()
            .expect("view")
            .records(waiter)
            .expect("records")
            .iter()
            .any(|record| matches!(record.event, Event::DependenciesMet { .. }))
    );
    std::fs::write(&gate, b"").expect("the gate opens");
    wait_terminal(&journal, dependency);
}

/// A dependency whose runner was SIGKILLed is closed by a reconcile pass, and the same pass
/// judges its dependents on that recorded end: the `--after` one ends failed after it, the
/// `--after-any` one starts after it. Nothing of either comes before the dependency's end.
#[test]
fn a_dependency_and_its_dependents_closed_in_one_reconcile_pass_stay_in_order() {
    let home = TestHome::new();
    let (dependency, launched) = launch(&home, &["--", "sleep", "60"]);
    let runner =
        i32::try_from(launched["runnerPid"].as_u64().expect("a runner pid")).expect("a pid");
    let (after, _) = launch(&home, &["--after", &dependency.to_string(), "--", "true"]);
    let (after_any, _) = launch(
        &home,
        &["--after-any", &dependency.to_string(), "--", "true"],
    );
    let journal = home.journal();
    wait_for(&journal, dependency, "its runner to take it", |state| {
        state.status == RunStatus::Running
    });
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(runner),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("the runner is killed");
    // The runner is seen gone only once init reaps it; each pass until then finds it alive.
    wait_for(&journal, dependency, "a pass to close it", |_| {
        home.cmd().arg("reconcile").assert().success();
        state(&journal, dependency).is_terminal()
    });
    assert_eq!(state(&journal, dependency).status, RunStatus::Failed);
    // The pass that recorded its end judged them: no further pass is needed.
    let failed = wait_terminal(&journal, after);
    assert_eq!(failed.status, RunStatus::Failed);
    assert!(failed.runner.is_none());
    assert_eq!(
        wait_terminal(&journal, after_any).status,
        RunStatus::Complete
    );
    assert_after(&journal, (after, "Terminal"), (dependency, "Terminal"));
    assert_after(
        &journal,
        (after_any, "DependenciesMet"),
        (dependency, "Terminal"),
    );
    assert_after(
        &journal,
        (after_any, "RunnerStarted"),
        (dependency, "Terminal"),
    );
}

/// `verify` checks the dependents index against the records, as it checks the queue and
/// delayed indexes: a waiting run's entry removed behind the journal's back is found, and so is
/// an entry no run waits for. The dependency waits in a queue of limit 0, so no runner holds
/// the journal open while it is edited.
#[test]
fn verify_finds_a_dependents_index_that_disagrees_with_the_records() {
    use redb::ReadableTableMetadata;
    use runjournal::verify::{ProblemKind, verify};

    let home = TestHome::new();
    home.cmd()
        .args(["queue", "q", "--max-active", "0"])
        .assert()
        .success();
    let (a, _) = launch(&home, &["--queue", "q", "--", "true"]);
    let (b, launched_b) = launch(&home, &["--after", &a.to_string(), "--", "true"]);
    assert_eq!(launched_b["waitingFor"][0], a.to_string(), "{launched_b}");
    let dependents_problems = || {
        let journal = home.journal();
        let view = journal.view().expect("view");
        verify(&view, None)
            .problems
            .into_iter()
            .filter(|problem| problem.kind == ProblemKind::DependentsIndex)
            .map(|problem| (problem.run, problem.message))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        dependents_problems(),
        Vec::new(),
        "the index agrees at first"
    );

    type Dependents<'txn> = redb::Table<'txn, &'static [u8; 32], ()>;
    let edit = |change: &dyn Fn(&mut Dependents)| {
        home.stop_watcher();
        let db = redb::Database::open(home.path().join("journal.redb")).expect("opens");
        let txn = db.begin_write().expect("write");
        {
            let mut table = txn
                .open_table(redb::TableDefinition::<&[u8; 32], ()>::new("dependents"))
                .expect("the table");
            change(&mut table);
        }
        txn.commit().expect("commits");
    };
    let mut key = [0u8; 32];
    key[..16].copy_from_slice(&a.to_bytes());
    key[16..].copy_from_slice(&b.to_bytes());
    edit(&|table| {
        assert_eq!(table.len().expect("len"), 1, "one entry: b waits for a");
        table.remove(&key).expect("removed");
    });
    let found = dependents_problems();
    assert!(
        found.len() == 1 && found[0].0 == Some(b) && found[0].1.contains("lacks"),
        "{found:?}"
    );

    // Put back, and one more that nothing waits for: a waits for b.
    let mut stray = [0u8; 32];
    stray[..16].copy_from_slice(&b.to_bytes());
    stray[16..].copy_from_slice(&a.to_bytes());
    edit(&|table| {
        table.insert(&key, ()).expect("put back");
        table.insert(&stray, ()).expect("a stray entry");
    });
    let found = dependents_problems();
    assert!(
        found.len() == 1 && found[0].0 == Some(a) && found[0].1.contains("does not wait"),
        "{found:?}"
    );
    home.cmd().args(["stop", &b.to_string()]).assert().success();
    home.cmd().args(["stop", &a.to_string()]).assert().success();
}
