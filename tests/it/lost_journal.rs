//! A lost journal is refused, never re-created: beside runs, a missing, emptied,
//! zero-filled or truncated `journal.redb` makes every `runjournal` command exit 4 (as for a
//! damaged journal) with a message naming what was found and the command that rebuilds it,
//! and nothing in the home changes; once rebuilt from the runs'
//! events.jsonl (the library's `recover`, which `journal-tools recover --from-projections`
//! prints; its own tests run the tool), the commands work again on the same runs. In a home
//! without runs, an empty journal file is still made a journal, as before.

use runjournal::testkit::damage::{Damage, tree};
use runjournal::{Home, RunId, projection};

use crate::pi_subagents_compat::runjournal as pi_home;
use crate::support::{self, TestHome};

/// A truncated journal here keeps its first third.
const TRUNCATED_TO: u64 = 3;

/// How the refusal names `damage`: a journal missing or empty beside runs is said to be so
/// with the runs and results the home holds.
fn named(damage: Damage) -> String {
    match damage {
        Damage::Missing | Damage::Emptied => format!(
            "{}, but the home holds 2 runs and 2 results",
            damage.named()
        ),
        Damage::ZeroFilled | Damage::Truncated => damage.named().to_string(),
    }
}

/// A home with two ended runs made by the binary; returns the runs' ids.
fn home_with_runs() -> (TestHome, [RunId; 2]) {
    let home = TestHome::new();
    let mut runs = Vec::new();
    for (name, step) in [("first", "echo one"), ("second", "exit 3")] {
        let output = home
            .cmd()
            .args(["run", "--wait", "--json", "--name", name, "--step", step])
            .output()
            .expect("run");
        runs.push(support::run_id_of(&output.stdout));
    }
    // The home's watcher, which the launches started, rewrites its lock file while it
    // lingers: gone, nothing in the home changes but by the commands the tests run.
    home.stop_watcher();
    (home, [runs[0], runs[1]])
}

#[test]
fn every_runjournal_command_refuses_a_lost_journal_beside_runs_and_changes_nothing() {
    for damage in Damage::ALL {
        let (home, [first, _]) = home_with_runs();
        damage.apply_keeping(&home.file("journal.redb"), TRUNCATED_TO);
        let before = tree(home.path());
        let id = first.to_string();
        for args in [
            &["run", "--", "true"][..],
            &["run", "--wait", "--step", "true"],
            &["status", "first"],
            &["status", "first", "--json"],
            &["list"],
            &["list", "--all", "--json"],
            &["wait", "first"],
            &["logs", "first"],
            &["stop", "first"],
            &["dismiss", "first"],
            &["reconcile"],
            &["job", "update", "first", "0", "--state", "running"],
        ] {
            let output = home.cmd().args(args).output().expect("runs");
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert_eq!(
                output.status.code(),
                Some(4),
                "{damage:?} {args:?}: a lost journal exits as a damaged one: {stderr}"
            );
            assert!(
                stderr.contains(&named(damage))
                    && stderr.contains("nothing was changed")
                    && stderr.contains(&format!(
                        "journal-tools --home {} recover --from-projections",
                        home.path().display()
                    )),
                "{damage:?} {args:?} names what it found and what to run: {stderr}"
            );
            assert!(output.stdout.is_empty(), "{damage:?} {args:?}");
        }
        assert_eq!(tree(home.path()), before, "{damage:?}: nothing was changed");

        // The runner says it in its own log (its stderr is not kept), and changes nothing else.
        let runner_log = home.path().join("runs").join(&id).join("runner.log");
        let output = home.cmd().args(["__runner", &id]).output().expect("runs");
        assert_eq!(output.status.code(), Some(4), "{damage:?} __runner");
        let log = std::fs::read_to_string(&runner_log).expect("runner.log");
        assert!(
            log.contains(&named(damage)) && log.contains("nothing was changed"),
            "{damage:?} __runner names what it found in runner.log: {log}"
        );
        let mut after = tree(home.path());
        after.insert(
            runner_log.clone(),
            before.get(&runner_log).cloned().flatten(),
        );
        assert_eq!(after, before, "{damage:?}: the runner changed nothing else");
    }
}

#[test]
fn a_journal_rebuilt_from_events_jsonl_serves_the_same_runs_again() {
    let (home, runs) = home_with_runs();
    let listed = home
        .cmd()
        .args(["list", "--all", "--json"])
        .output()
        .expect("list");
    assert!(listed.status.success());
    Damage::Truncated.apply_keeping(&home.file("journal.redb"), TRUNCATED_TO);
    assert_eq!(
        home.cmd().arg("list").output().expect("list").status.code(),
        Some(4)
    );
    let recovery = runjournal::recover::recover_from_projections(&Home::at(home.path()))
        .expect("the journal is rebuilt");
    assert_eq!(recovery.runs.len(), 2);
    assert!(recovery.unrecoverable.is_empty());
    assert!(
        recovery
            .moved_aside
            .as_ref()
            .is_some_and(|aside| aside.exists()),
        "the truncated file is kept aside"
    );
    let relisted = home
        .cmd()
        .args(["list", "--all", "--json"])
        .output()
        .expect("list");
    assert!(
        relisted.status.success(),
        "{}",
        String::from_utf8_lossy(&relisted.stderr)
    );
    assert_eq!(
        relisted.stdout, listed.stdout,
        "the same runs, the same way"
    );
    let status = home
        .cmd()
        .args(["status", "second"])
        .output()
        .expect("status");
    assert!(status.status.success());
    assert!(String::from_utf8_lossy(&status.stdout).contains("failed"));
    let journal = home.journal();
    for run in runs {
        assert!(support::state(&journal, run).is_closed());
    }
    // New runs go into the rebuilt journal.
    let again = home
        .cmd()
        .args(["run", "--wait", "--", "true"])
        .output()
        .expect("run");
    assert!(
        again.status.success(),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
}

/// The case that was already handled: a journal file whose creation was cut short (here:
/// empty) in a home that holds nothing is made a journal, not refused.
#[test]
fn an_empty_journal_in_an_empty_home_is_still_made_a_journal() {
    let home = TestHome::new();
    std::fs::write(home.file("journal.redb"), b"").expect("an empty journal file");
    let listed = home.cmd().arg("list").output().expect("list");
    assert!(
        listed.status.success(),
        "{}",
        String::from_utf8_lossy(&listed.stderr)
    );
    assert!(
        !runjournal::journal::examine(&home.file("journal.redb"))
            .expect("examine")
            .is_lost(),
        "it is a journal now"
    );
}

const PI_SESSION: &str = "pi-session-1";

/// `run --json --session-id … ARGS` in the pi-subagents home; returns the run's id and what
/// `run` said its state is.
fn pi_launch(root: &std::path::Path, args: &[&str]) -> (String, String) {
    let output = pi_home(root)
        .args(["run", "--json", "--session-id", PI_SESSION])
        .args(args)
        .output()
        .expect("run");
    assert!(output.status.success(), "{output:?}");
    let launched: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    (
        launched["runId"].as_str().expect("runId").to_string(),
        launched["state"].as_str().expect("state").to_string(),
    )
}

fn pi_wait(root: &std::path::Path, run: &str) {
    let output = pi_home(root).args(["wait", run]).output().expect("wait");
    assert!(
        output
            .status
            .code()
            .is_some_and(|code| code != 2 && code != 75),
        "{output:?}"
    );
}

/// A home that used everything the journal alone keeps — a queue's limit (a queue that ran
/// two runs one at a time, and a held one with a run waiting), a paused run and the run that
/// resumed it, a retention policy, a pruned run's tombstone — loses its journal. `queue` and
/// `retention` say what to run first; recovery rebuilds every run, gives each queue the limit
/// its runs show (1, and 0 for the held one) and says what it could not recover; then the home
/// works as before — the queues admit, the paused run is not resumed twice — and pi-subagents'
/// own readers read every rebuilt run, list it, and repair none.
#[test]
fn a_home_that_used_queues_resume_and_retention_is_rebuilt_whole_and_pi_subagents_reads_it() {
    use std::collections::BTreeMap;

    use runjournal::home::Layout;

    use crate::pi_subagents_compat::{
        changed_files, files_under, pi_subagents, read_with_pi_subagents,
    };

    let Some(install) = pi_subagents() else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path().join("pi-root");
    let mut expected: BTreeMap<String, &str> = BTreeMap::new();

    // A queue of one slot: its second run waits for the first, then runs.
    pi_home(&root)
        .args(["queue", "q1", "--max-active", "1"])
        .assert()
        .success();
    let (first, _) = pi_launch(
        &root,
        &["--queue", "q1", "--", "sh", "-c", "sleep 1; echo q-one"],
    );
    let (second, state) = pi_launch(&root, &["--queue", "q1", "--", "sh", "-c", "echo q-two"]);
    assert_eq!(state, "queued", "the queue's one slot is taken");
    pi_wait(&root, &first);
    pi_wait(&root, &second);
    expected.insert(first.clone(), "complete");
    expected.insert(second.clone(), "complete");
    // A held queue, its run waiting.
    pi_home(&root)
        .args(["queue", "held", "--max-active", "0"])
        .assert()
        .success();
    let (waiting, state) = pi_launch(&root, &["--queue", "held", "--", "true"]);
    assert_eq!(state, "queued");
    expected.insert(waiting.clone(), "queued");
    // A paused run, and the run that resumed it.
    let marker = dir.path().join("paused.marker");
    let pausing = format!(
        "if [ -e '{0}' ]; then echo carried-on; exit 0; fi; touch '{0}'; echo ready; while true; do sleep 0.1; done",
        marker.display()
    );
    let (paused, _) = pi_launch(&root, &["--step", "echo first", "--step", &pausing]);
    let log = root
        .join("async-subagent-runs")
        .join(&paused)
        .join("output-1.log");
    for _ in 0..600 {
        if std::fs::read_to_string(&log).is_ok_and(|output| output.contains("ready")) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    pi_home(&root)
        .args(["interrupt", &paused])
        .assert()
        .success();
    pi_wait(&root, &paused);
    expected.insert(paused.clone(), "paused");
    let resumed = pi_home(&root)
        .args(["resume", &paused, "--wait", "--json"])
        .assert()
        .success();
    let resumed: serde_json::Value =
        serde_json::from_slice(&resumed.get_output().stdout).expect("JSON");
    let resumed = resumed["runId"].as_str().expect("runId").to_string();
    expected.insert(resumed.clone(), "complete");
    // A run pruned (its result consumed), so the journal holds a tombstone; and a policy.
    let (pruned, _) = pi_launch(&root, &["--", "echo", "soon-pruned"]);
    pi_wait(&root, &pruned);
    // Its runner outlives its `Terminal` a little; prune keeps it until it is seen to end.
    crate::support::reconcile_until_closed(
        &root.join("runjournal").join("journal.redb"),
        &[pruned.parse().expect("a run id")],
        || {
            pi_home(&root).arg("reconcile").assert().success();
        },
    );
    std::fs::remove_file(
        root.join("async-subagent-results")
            .join(format!("{pruned}.json")),
    )
    .expect("the host consumes the result");
    pi_home(&root)
        .args(["prune", "--keep-runs", "0"])
        .assert()
        .success();
    assert!(
        !root.join("async-subagent-runs").join(&pruned).exists(),
        "the consumed run is pruned"
    );
    pi_home(&root)
        .args(["retention", "--keep-for", "90d"])
        .assert()
        .success();
    pi_home(&root).arg("reconcile").assert().success();

    // The journal is lost.
    let journal = root.join("runjournal").join("journal.redb");
    std::fs::remove_file(&journal).expect("the journal is deleted");
    let recover_command = format!(
        "journal-tools --home {} --layout pi-subagents recover --from-projections",
        root.display()
    );
    for (args, what) in [
        (
            &["queue", "q1", "--max-active", "2"][..],
            "queue q1's limit",
        ),
        (&["retention"][..], "the retention policy"),
    ] {
        let output = pi_home(&root).args(args).output().expect("runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(4), "{args:?}: {stderr}");
        assert!(
            stderr.contains(&format!(
                "{what} is kept in the journal, which must be rebuilt first"
            )) && stderr.contains(&recover_command),
            "{args:?} says precisely what to run first: {stderr}"
        );
    }
    assert!(!journal.exists(), "nothing made a journal meanwhile");

    let recovery = runjournal::recover::recover_from_projections(&runjournal::Home::in_layout(
        &root,
        Layout::PiSubagents,
    ))
    .expect("the journal is rebuilt");
    assert!(
        recovery.unrecoverable.is_empty(),
        "{:?}",
        recovery.unrecoverable
    );
    let mut rebuilt: Vec<String> = recovery
        .runs
        .iter()
        .map(|run| run.run.to_string())
        .collect();
    rebuilt.sort();
    assert_eq!(
        rebuilt,
        expected.keys().cloned().collect::<Vec<_>>(),
        "every run is rebuilt"
    );
    let limits: BTreeMap<&str, u64> = recovery
        .queues
        .iter()
        .map(|queue| (queue.name.as_str(), queue.max_active))
        .collect();
    assert_eq!(
        limits,
        BTreeMap::from([("held", 0), ("q1", 1)]),
        "each queue gets the most of its runs that held a slot at once"
    );
    let home_facts: Vec<&str> = recovery
        .home_facts_not_recovered
        .iter()
        .map(|fact| fact.fact.as_str())
        .collect();
    assert!(
        home_facts
            .iter()
            .any(|fact| fact.contains("retention policy"))
            && home_facts.iter().any(|fact| fact.contains("tombstones")),
        "what was kept only in the journal is named: {home_facts:?}"
    );
    assert!(
        recovery.runs.iter().all(|run| run
            .facts_not_recovered
            .iter()
            .all(|fact| !fact.fact.contains("resume link"))),
        "every run's links were rebuilt with it"
    );
    let note = runjournal::journal::JournalReader::open(&journal)
        .expect("the rebuilt journal opens")
        .view()
        .expect("a view")
        .recovery_note()
        .expect("meta reads")
        .expect("the rebuild left its note");
    assert_eq!(
        note.queues, recovery.queues,
        "the choice is noted in the journal"
    );

    // The home works as before.
    let queue = pi_home(&root)
        .args(["queue", "held"])
        .output()
        .expect("queue");
    assert!(queue.status.success(), "{queue:?}");
    assert!(
        String::from_utf8_lossy(&queue.stdout).contains(&waiting),
        "the held queue still holds its run: {}",
        String::from_utf8_lossy(&queue.stdout)
    );
    let again = pi_home(&root)
        .args(["resume", &paused])
        .output()
        .expect("resume");
    assert_eq!(
        again.status.code(),
        Some(2),
        "the paused run was resumed already: {}",
        String::from_utf8_lossy(&again.stderr)
    );
    let (third, _) = pi_launch(&root, &["--queue", "q1", "--", "echo", "q-three"]);
    pi_wait(&root, &third);
    expected.insert(third, "complete");
    // Every ended run's runner seen to end (by the home's watcher or a pass, which record it
    // and then project it), and a pass after that, which brings every file to the journal:
    // only then does nothing of ours change the files while pi-subagents reads them.
    let ended: Vec<runjournal::RunId> = expected
        .iter()
        .filter(|(_, state)| **state != "queued")
        .map(|(run, _)| run.parse().expect("a run id"))
        .collect();
    crate::support::reconcile_until_closed(
        &root.join("runjournal").join("journal.redb"),
        &ended,
        || {
            pi_home(&root).arg("reconcile").assert().success();
        },
    );
    pi_home(&root).arg("reconcile").assert().success();

    let mut before = BTreeMap::new();
    files_under(&root.join("async-subagent-runs"), &mut before);
    files_under(&root.join("async-subagent-results"), &mut before);
    let report = read_with_pi_subagents(
        &install,
        &[("PI_SUBAGENTS_TEMP_ROOT", &root)],
        &["--read", PI_SESSION],
    );
    let runs = report["runs"].as_object().expect("runs");
    assert_eq!(
        runs.keys().cloned().collect::<Vec<_>>(),
        expected.keys().cloned().collect::<Vec<_>>(),
        "every run directory, and nothing else, is a run to pi-subagents"
    );
    for (run, state) in &expected {
        let seen = &runs[run.as_str()];
        assert_eq!(seen["read"]["state"], *state, "{run}: {seen}");
        assert_eq!(seen["repaired"], false, "{run} was repaired: {seen}");
        assert_eq!(seen["reconciledState"], *state, "{run}: {seen}");
    }
    let listed: BTreeMap<String, String> = report["listed"]["repairScan"]
        .as_array()
        .expect("the listing")
        .iter()
        .map(|run| {
            (
                run["id"].as_str().expect("id").to_string(),
                run["state"].as_str().expect("state").to_string(),
            )
        })
        .collect();
    assert_eq!(
        listed,
        expected
            .iter()
            .map(|(run, state)| (run.clone(), state.to_string()))
            .collect::<BTreeMap<_, _>>()
    );
    let mut after = BTreeMap::new();
    files_under(&root.join("async-subagent-runs"), &mut after);
    files_under(&root.join("async-subagent-results"), &mut after);
    assert_eq!(
        changed_files(&before, &after),
        Vec::<&std::path::PathBuf>::new(),
        "pi-subagents repaired nothing"
    );
}

/// A paused run carried on by a new one, twice; the journal is lost, and with it, for one pair
/// the paused run's events.jsonl, for the other the new run's. Recovery goes on: it rebuilds
/// the two runs whose history is intact and reports, for each, the resume link it could not
/// rebuild (to the run it resumed, from the run that resumed it) with why; the two runs it
/// cannot rebuild are reported as such; nothing refuses the home.
#[test]
fn a_resume_link_to_a_run_not_rebuilt_is_reported_for_its_run_and_recovery_goes_on() {
    let home = TestHome::new();
    let dir = tempfile::tempdir().expect("temp dir");
    let mut pairs = Vec::new();
    for pair in ["a", "b"] {
        let marker = dir.path().join(format!("{pair}.marker"));
        let step = format!(
            "if [ -e '{0}' ]; then echo carried-on; exit 0; fi; touch '{0}'; \
             trap 'exit 0' INT; echo ready; while true; do sleep 0.1; done",
            marker.display()
        );
        let paused = support::launch(&home, &["--step", "echo first", "--step", &step]);
        support::wait_output(&home, paused, 1, "ready");
        home.cmd()
            .args(["interrupt", &paused.to_string()])
            .assert()
            .success();
        home.cmd()
            .args(["wait", &paused.to_string()])
            .assert()
            .code(130);
        let output = home
            .cmd()
            .args(["resume", &paused.to_string(), "--wait", "--json"])
            .output()
            .expect("resume runs");
        assert!(output.status.success(), "{output:?}");
        pairs.push((paused, support::run_id_of(&output.stdout)));
    }
    let [(paused_a, resumer_a), (paused_b, resumer_b)] = [pairs[0], pairs[1]];
    // Every runner seen to end, then the home's watcher gone: it keeps the journal it opened
    // after the file is unlinked, and a pass of it would write the lost histories again.
    crate::support::reconcile_until_closed(
        &home.file("journal.redb"),
        &[paused_a, resumer_a, paused_b, resumer_b],
        || {
            home.cmd().arg("reconcile").assert().success();
        },
    );
    home.stop_watcher();

    let layout = Home::at(home.path());
    std::fs::remove_file(home.file("journal.redb")).expect("the journal is lost");
    std::fs::remove_file(layout.events_path(paused_a)).expect("a's paused history is lost");
    std::fs::remove_file(layout.events_path(resumer_b)).expect("b's new run's history is lost");

    let recovery = runjournal::recover::recover_from_projections(&layout)
        .expect("recovery goes on past what it cannot rebuild");
    let mut unrecoverable: Vec<RunId> = recovery.unrecoverable.iter().map(|run| run.run).collect();
    unrecoverable.sort();
    let mut expected = vec![paused_a, resumer_b];
    expected.sort();
    assert_eq!(unrecoverable, expected, "the runs without events.jsonl");
    let facts = |run: RunId| -> Vec<(String, String)> {
        recovery
            .runs
            .iter()
            .find(|rebuilt| rebuilt.run == run)
            .unwrap_or_else(|| panic!("run {run} is rebuilt"))
            .facts_not_recovered
            .iter()
            .map(|fact| (fact.fact.clone(), fact.reason.clone()))
            .collect()
    };
    let of_a = facts(resumer_a);
    assert!(
        of_a.len() == 1
            && of_a[0].0 == format!("the resume link to run {paused_a}, which it resumed")
            && of_a[0].1.contains("is not rebuilt"),
        "the new run of pair a names the link it lost: {of_a:?}"
    );
    let of_b = facts(paused_b);
    // Resumable again, as far as the rebuilt journal knows: its kept environment is lost too.
    assert!(
        of_b.len() == 2
            && of_b[0].0.contains("kept environment")
            && of_b[1].0 == format!("the resume link from run {resumer_b}, which resumed it")
            && of_b[1].1.contains("would carry it on again"),
        "the paused run of pair b names the link it lost: {of_b:?}"
    );

    // The home works again on what was rebuilt.
    let listed = home
        .cmd()
        .args(["list", "--all", "--json"])
        .output()
        .expect("list");
    assert!(listed.status.success(), "{listed:?}");
    let listed = String::from_utf8_lossy(&listed.stdout);
    for run in [resumer_a, paused_b] {
        assert!(listed.contains(&run.to_string()), "{run}: {listed}");
    }
}

/// Regression: a home that shipped lost its shipping mark with its journal, and the rebuilt
/// journal counted as one that never shipped: retention would then prune runs its shipper had
/// never sent (the rebuilt journal is a new one to the server). Rebuilt, it ships from its
/// start: its mark is at 0, so a prune that would otherwise take every ended run keeps them,
/// even once the shipper's state file is gone.
#[cfg(feature = "ship")]
#[test]
fn a_rebuilt_journal_of_a_home_that_shipped_ships_from_its_start_and_prune_keeps_its_runs() {
    let (home, runs) = home_with_runs();
    let journal_home = Home::at(home.path());
    let shipped = runjournal::ship::state::ShipState {
        shipper: None,
        target: "postgresql://db.example/runs".to_string(),
        journal_id: None,
        host_name: "host".to_string(),
        shipped_through: 9,
        shipped_at_ms: None,
        failing_since_ms: None,
        last_error: None,
        updated_at_ms: 1,
    };
    runjournal::ship::state::write(&journal_home, &shipped).expect("the shipper's state");
    Damage::Missing.apply(&home.file("journal.redb"));
    let recovery = runjournal::recover::recover_from_projections(&journal_home)
        .expect("the journal is rebuilt");
    assert_eq!(recovery.runs.len(), 2);
    assert!(
        recovery
            .home_facts_not_recovered
            .iter()
            .any(|fact| fact.fact.contains("journal's id")),
        "{:?}",
        recovery.home_facts_not_recovered
    );
    let journal = home.journal();
    assert_eq!(
        journal
            .view()
            .expect("a view")
            .shipped_through()
            .expect("the mark reads"),
        Some(0),
        "the rebuilt journal ships, with nothing proven shipped"
    );
    drop(journal);
    std::fs::remove_file(journal_home.shipping_state_path()).expect("the state file goes");
    let pruned = home
        .cmd()
        .args(["prune", "--keep-runs", "0"])
        .output()
        .expect("prune");
    assert!(
        pruned.status.success(),
        "{}",
        String::from_utf8_lossy(&pruned.stderr)
    );
    let journal = home.journal();
    for run in runs {
        assert!(
            journal
                .view()
                .expect("a view")
                .snapshot(run)
                .expect("reads")
                .is_some(),
            "run {run} is kept until this journal is shipped"
        );
    }
}

/// What a lost journal takes with it of environments and hooks is named per run: a run whose
/// hook was attempted and never delivered (its runner killed while the hook ran) names that
/// hook, whose command only the journal kept; a run still waiting in a queue names its kept
/// environment, which its runner will not have; a run that ended with its hook delivered names
/// neither.
#[test]
fn recovery_names_undelivered_hooks_and_lost_environments_per_run() {
    let home = TestHome::new();
    let launched = home
        .cmd()
        .args([
            "run",
            "--json",
            "--on-exit",
            // The first attempt runs until its deliverer is killed; one made again after
            // that attempt is found abandoned fails at once: the hook is never delivered,
            // and no deliverer holds the journal for long.
            &format!(
                "[ -e '{0}' ] && exit 1; touch '{0}'; sleep 60",
                home.input("attempted").display()
            ),
            "--",
            "true",
        ])
        .output()
        .expect("run");
    assert!(launched.status.success(), "{launched:?}");
    let hooked = support::run_id_of(&launched.stdout);
    let document: serde_json::Value = serde_json::from_slice(&launched.stdout).expect("JSON");
    let runner = document["runnerPid"].as_i64().expect("the runner's pid");
    let journal = home.journal();
    support::wait_for(&journal, hooked, "its hook to be attempted", |state| {
        !state.hooks.is_empty()
    });
    // The runner is killed while its hook runs: the attempt is never ended.
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(runner).expect("a pid")),
        nix::sys::signal::Signal::SIGKILL,
    );
    let delivered = home
        .cmd()
        .args(["run", "--wait", "--json", "--on-exit", "true", "--", "true"])
        .output()
        .expect("run");
    let delivered = support::run_id_of(&delivered.stdout);
    support::wait_for(&journal, delivered, "its hook to be delivered", |state| {
        state.hooks.iter().any(|hook| hook.is_settled())
    });
    home.cmd()
        .args(["queue", "held", "--max-active", "0"])
        .assert()
        .success();
    let waiting = home
        .cmd()
        .args(["run", "--json", "--queue", "held", "--", "true"])
        .output()
        .expect("run");
    let waiting = support::run_id_of(&waiting.stdout);
    // No reconcile pass from here on (the home's watcher makes them, and they would deliver
    // the hook again).
    home.stop_watcher();
    // `recover` rebuilds what the runs' events.jsonl hold: the runner killed above may have
    // committed its hook's attempt and not yet projected it, until its files are projected
    // again.
    for _ in 0..600 {
        let view = journal.view().expect("a view");
        let is_projected = [hooked, delivered, waiting].iter().all(|run| {
            let recorded = view.records(*run).expect("records").len();
            let events = home
                .path()
                .join("runs")
                .join(run.to_string())
                .join("events.jsonl");
            std::fs::read_to_string(events).is_ok_and(|text| {
                text.lines().filter(|line| !line.trim().is_empty()).count() == recorded
            })
        });
        if is_projected {
            break;
        }
        for run in [hooked, delivered, waiting] {
            let (state, records, links) = projection::load(&view, run).expect("load");
            let plan = projection::plan(&Home::at(home.path()), &state, &records, &links);
            projection::write_plan(&plan, projection::ResultPolicy::Publish)
                .expect("the projection is written");
        }
        drop(view);
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    drop(journal);

    Damage::Missing.apply(&home.file("journal.redb"));
    // A deliverer the watcher started before it was stopped holds the journal for a moment.
    let mut recovered = None;
    for _ in 0..200 {
        match runjournal::recover::recover_from_projections(&Home::at(home.path())) {
            Err(runjournal::recover::RecoverError::InUse { .. }) => {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            other => {
                recovered = Some(other);
                break;
            }
        }
    }
    let recovery = recovered
        .expect("the journal is let go")
        .expect("the journal is rebuilt");
    let facts = |run: RunId| -> Vec<String> {
        recovery
            .runs
            .iter()
            .find(|rebuilt| rebuilt.run == run)
            .unwrap_or_else(|| panic!("run {run} is rebuilt"))
            .facts_not_recovered
            .iter()
            .map(|fact| fact.fact.clone())
            .collect()
    };
    assert_eq!(
        facts(hooked),
        vec!["the delivery of its completion hook 0".to_string()]
    );
    assert!(facts(delivered).is_empty(), "{:?}", facts(delivered));
    assert_eq!(
        facts(waiting),
        vec!["its kept environment (variables, working directory, umask)".to_string()]
    );
}

/// A waiting run whose dependency is not rebuilt (its run directory is gone) is named with that
/// lost fact; the rebuilt journal still holds its dependencies (they are in its records), and
/// the next pass judges it: an `--after` run whose dependency is gone ends failed, naming it,
/// and an `--after-any` one starts.
#[test]
fn a_dependency_not_rebuilt_is_named_for_its_waiting_run_and_the_next_pass_judges_it() {
    let home = TestHome::new();
    home.cmd()
        .args(["queue", "held", "--max-active", "0"])
        .assert()
        .success();
    let launch = |args: &[&str]| {
        let output = home
            .cmd()
            .args(["run", "--json"])
            .args(args)
            .output()
            .expect("run");
        assert!(output.status.success(), "{output:?}");
        support::run_id_of(&output.stdout)
    };
    let dependency = launch(&["--queue", "held", "--", "true"]);
    let after = launch(&["--after", &dependency.to_string(), "--", "true"]);
    let after_any = launch(&["--after-any", &dependency.to_string(), "--", "true"]);
    let layout = Home::at(home.path());
    std::fs::remove_dir_all(layout.run_dir(dependency)).expect("its run directory goes");
    Damage::Missing.apply(&home.file("journal.redb"));
    let recovery =
        runjournal::recover::recover_from_projections(&layout).expect("the journal is rebuilt");
    for run in [after, after_any] {
        let rebuilt = recovery
            .runs
            .iter()
            .find(|rebuilt| rebuilt.run == run)
            .unwrap_or_else(|| panic!("run {run} is rebuilt"));
        assert!(
            rebuilt
                .facts_not_recovered
                .iter()
                .any(|fact| fact.fact == format!("its dependency on run {dependency}")),
            "{:?}",
            rebuilt.facts_not_recovered
        );
    }
    home.cmd().arg("reconcile").assert().success();
    let journal = home.journal();
    let failed = support::wait_terminal(&journal, after);
    assert_eq!(failed.status, runjournal::RunStatus::Failed);
    let error = failed
        .terminal
        .and_then(|terminal| terminal.error)
        .unwrap_or_default();
    assert!(error.contains(&dependency.to_string()), "{error}");
    assert_eq!(
        support::wait_terminal(&journal, after_any).status,
        runjournal::RunStatus::Complete
    );
}

/// A delayed run's due time is in its own record (`StartDelayed`), so a journal rebuilt from
/// events.jsonl holds the run waiting for it, in the `delayed` index a reconcile pass reads:
/// nothing of the delay is lost (only its kept environment, as for any run still to start).
/// Stopped, it ends without starting.
#[test]
fn a_delayed_run_is_rebuilt_waiting_for_its_due_time_and_a_pass_finds_it() {
    let home = TestHome::new();
    let launched = home
        .cmd()
        .args(["run", "--json", "--delay", "1h", "--", "true"])
        .output()
        .expect("run");
    assert!(launched.status.success(), "{launched:?}");
    let delayed = support::run_id_of(&launched.stdout);
    let document: serde_json::Value = serde_json::from_slice(&launched.stdout).expect("JSON");
    let due_at_ms = document["dueAtMs"].as_u64().expect("dueAtMs");

    Damage::Missing.apply(&home.file("journal.redb"));
    let recovery = runjournal::recover::recover_from_projections(&Home::at(home.path()))
        .expect("the journal is rebuilt");
    let facts: Vec<String> = recovery
        .runs
        .iter()
        .find(|rebuilt| rebuilt.run == delayed)
        .expect("the delayed run is rebuilt")
        .facts_not_recovered
        .iter()
        .map(|fact| fact.fact.clone())
        .collect();
    assert_eq!(
        facts,
        vec!["its kept environment (variables, working directory, umask)".to_string()]
    );
    let journal = home.journal();
    let state = support::state(&journal, delayed);
    assert!(state.is_waiting_for_due(), "{state:?}");
    let view = journal.view().expect("view");
    assert_eq!(
        view.soonest_delayed(10).expect("the index reads"),
        vec![(due_at_ms, delayed)]
    );
    drop(view);
    home.cmd()
        .args(["stop", &delayed.to_string()])
        .assert()
        .success();
    let stopped = support::state(&journal, delayed);
    assert_eq!(stopped.status, runjournal::RunStatus::Stopped);
    assert!(stopped.runner.is_none());
}

/// A process that still has the lost journal open (a runner, a pass, a host: here a `sleep`
/// holding it as its input) could commit into the file recover moves aside, or project a record
/// after recover read the runs' files: recover refuses the home, naming the process, and
/// changes nothing; once the process has exited, it rebuilds. Both for a journal damaged in
/// place and for one removed while open.
#[test]
fn recover_refuses_a_journal_another_process_has_open() {
    for removed in [false, true] {
        // The only process holding the journal is the test's: the home's watcher is gone.
        let (home, _runs) = home_with_runs();
        let journal = home.file("journal.redb");
        let mut holder = std::process::Command::new("sleep")
            .arg("600")
            .stdin(std::fs::File::open(&journal).expect("the journal opens"))
            .spawn()
            .expect("sleep runs");
        if removed {
            std::fs::remove_file(&journal).expect("the journal removed");
        } else {
            Damage::ZeroFilled.apply_keeping(&journal, TRUNCATED_TO);
        }
        let before = std::fs::read_dir(home.path()).expect("the home").count();
        let refused = runjournal::recover::recover_from_projections(&Home::at(home.path()));
        let _ = holder.kill();
        let _ = holder.wait();
        let error = refused.expect_err("refused while the journal is open elsewhere");
        assert!(
            error.is_refusal(),
            "removed {removed}: a refusal (journal-tools exits 2): {error}"
        );
        assert!(
            error
                .to_string()
                .contains(&format!("open in process {} (sleep)", holder.id())),
            "removed {removed}: names the process: {error}"
        );
        assert_eq!(
            std::fs::read_dir(home.path()).expect("the home").count(),
            before,
            "removed {removed}: nothing was changed"
        );
        let recovery = runjournal::recover::recover_from_projections(&Home::at(home.path()))
            .expect("rebuilt once nobody holds it");
        assert_eq!(recovery.runs.len(), 2);
    }
}
