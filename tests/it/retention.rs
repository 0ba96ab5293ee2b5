//! Retention with the real binaries: `runjournal retention` sets the policy, `runjournal prune`
//! and every reconcile pass apply it. Each bound at its boundaries; what is never pruned (an
//! active run, an unshipped run, an unconsumed result); prunes SIGKILLed at random moments; a
//! prune on a full disk; what `status`, `wait` and `list --all` say of a pruned run.

use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use std::time::Duration;

use rand::{RngExt, SeedableRng};
use runjournal::event::HostIds;
use runjournal::store::StoreOptions;
use runjournal::{Home, RunId, Store};
use serde_json::Value;

use crate::support::{TestHome, run_id_of};
use runjournal::testkit::lifecycle::{chain_lifecycle, chain_spec};

/// Launches a run of `step` and returns its id once the run is closed (its runner seen gone).
fn run_to_end(home: &TestHome, step: &str) -> RunId {
    let output = home
        .cmd()
        .args(["run", "--json", "--step", step])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let run = run_id_of(&output);
    let _ = home.cmd().args(["wait", &run.to_string()]).output();
    wait_closed(home, run);
    run
}

/// Reconciles until the run is closed: its runner's end is recorded by its parent or by a pass.
fn wait_closed(home: &TestHome, run: RunId) {
    crate::support::reconcile_until_closed(&home.file("journal.redb"), &[run], || {
        let _ = home.cmd().arg("reconcile").output();
    });
}

/// Deletes the run's result file, as a host does once it delivered it.
fn consume_result(home: &TestHome, run: RunId) {
    let path = home.file(&format!("results/{run}.json"));
    std::fs::remove_file(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
}

fn prune_json(home: &TestHome, args: &[&str]) -> Value {
    let output = home
        .cmd()
        .args(["prune", "--json"])
        .args(args)
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    serde_json::from_slice(&output).expect("prune --json prints JSON")
}

fn pruned_ids(report: &Value) -> BTreeSet<RunId> {
    report["runs"]
        .as_array()
        .expect("runs is an array")
        .iter()
        .map(|run| {
            run["runId"]
                .as_str()
                .expect("a run id")
                .parse()
                .expect("a run id")
        })
        .collect()
}

fn set_policy(home: &TestHome, args: &[&str]) {
    home.cmd().arg("retention").args(args).assert().success();
}

/// A home whose policy has no free-space floor, for a test of another bound: under the default
/// floor (10 % of the file system free), a test machine's nearly full disk would prune consumed
/// runs at every reconcile pass, whatever the bound under test says.
fn home_without_space_pressure() -> TestHome {
    let home = TestHome::new();
    set_policy(&home, &["--keep-free", "off"]);
    home
}

/// Whether the journal holds the run (not pruned).
fn is_in_journal(home: &TestHome, run: RunId) -> bool {
    home.journal()
        .view()
        .expect("a view")
        .snapshot(run)
        .expect("the run reads")
        .is_some()
}

/// Checks that a pruned run is wholly gone but its tombstone, and a kept one wholly there.
fn assert_whole(home: &TestHome, run: RunId) {
    let journal = home.journal();
    let view = journal.view().expect("a view");
    assert_whole_in(&view, run);
}

fn assert_whole_in(view: &runjournal::journal::View, run: RunId) {
    let records = view.records(run).expect("records read");
    let snapshot = view.snapshot(run).expect("the run reads");
    let tombstone = view.tombstone(run).expect("the tombstone reads");
    match (snapshot, tombstone) {
        (Some(state), None) => {
            assert_eq!(records.len() as u64, state.head_seq, "run {run} is whole");
        }
        (None, Some(tombstone)) => {
            assert!(records.is_empty(), "pruned run {run} kept records");
            assert_eq!(tombstone.run_id, run);
        }
        (snapshot, tombstone) => panic!(
            "run {run} is half there: snapshot {:?}, tombstone {tombstone:?}",
            snapshot.map(|state| state.status)
        ),
    }
}

/// What `journal-tools inspect verify` checks (the library's `verify`, with the home's
/// projections): nothing inconsistent or damaged.
fn verify_clean(home: &TestHome) {
    let journal = home.journal();
    let view = journal.view().expect("a view");
    let home = Home::in_layout(home.path(), runjournal::home::Layout::Runjournal);
    crate::support::check_journal(&view, Some(&home));
}

#[test]
fn the_count_bound_prunes_the_oldest_ended_runs_beyond_it_and_no_more() {
    let home = home_without_space_pressure();
    let runs: Vec<RunId> = (0..5).map(|_| run_to_end(&home, "true")).collect();
    for &run in &runs {
        consume_result(&home, run);
    }
    // At the bound: nothing to prune.
    set_policy(&home, &["--keep-runs", "5"]);
    assert!(pruned_ids(&prune_json(&home, &[])).is_empty());
    // One below it: exactly the oldest goes; then two more.
    set_policy(&home, &["--keep-runs", "4"]);
    assert_eq!(
        pruned_ids(&prune_json(&home, &[])),
        BTreeSet::from([runs[0]])
    );
    let report = prune_json(&home, &["--keep-runs", "2"]);
    assert_eq!(pruned_ids(&report), BTreeSet::from([runs[1], runs[2]]));
    for &run in &runs {
        assert_whole(&home, run);
    }
    for &run in &runs[..3] {
        assert!(!is_in_journal(&home, run));
        assert!(
            !home.file(&format!("runs/{run}")).exists(),
            "{run}'s directory is gone"
        );
    }
    for &run in &runs[3..] {
        assert!(is_in_journal(&home, run));
        assert!(home.file(&format!("runs/{run}")).exists());
    }
    // The policy set is still 4: a reconcile pass (status, list) prunes nothing more.
    home.cmd().arg("list").assert().success();
    assert!(is_in_journal(&home, runs[3]));
    // keep-runs 0 takes every ended run.
    let report = prune_json(&home, &["--keep-runs", "0"]);
    assert_eq!(pruned_ids(&report), BTreeSet::from([runs[3], runs[4]]));
    verify_clean(&home);
}

#[test]
fn status_wait_and_list_say_how_a_pruned_run_ended_and_wait_exits_as_it_did() {
    let home = TestHome::new();
    let failed = {
        let output = home
            .cmd()
            .args(["run", "--json", "--name", "doomed", "--step", "exit 3"])
            .assert()
            .success()
            .get_output()
            .stdout
            .clone();
        run_id_of(&output)
    };
    let _ = home.cmd().args(["wait", &failed.to_string()]).output();
    wait_closed(&home, failed);
    consume_result(&home, failed);
    let report = prune_json(&home, &["--keep-runs", "0"]);
    assert_eq!(pruned_ids(&report), BTreeSet::from([failed]));

    // By id, by a prefix and by its name.
    let id = failed.to_string();
    for text in [id.as_str(), &id[..10], "doomed"] {
        let output = home.cmd().args(["status", text]).assert().success();
        let stdout = String::from_utf8_lossy(&output.get_output().stdout).into_owned();
        assert!(
            stdout.contains("was pruned on") && stdout.contains("ended failed (exit 3)"),
            "{stdout}"
        );
    }
    let json: Value = serde_json::from_slice(
        &home
            .cmd()
            .args(["status", "--json", &id])
            .assert()
            .success()
            .get_output()
            .stdout,
    )
    .expect("status --json prints JSON");
    assert_eq!(json["pruned"], Value::Bool(true));
    assert_eq!(json["state"], "failed");
    assert_eq!(json["exitCode"], 3);
    // wait exits as the run did.
    home.cmd().args(["wait", &id]).assert().code(3);
    // list shows it with --all only.
    let list = home.cmd().arg("list").assert().success();
    assert!(!String::from_utf8_lossy(&list.get_output().stdout).contains(&id));
    let list = home.cmd().args(["list", "--all"]).assert().success();
    let stdout = String::from_utf8_lossy(&list.get_output().stdout).into_owned();
    assert!(
        stdout.contains(&id) && stdout.contains("failed (pruned"),
        "{stdout}"
    );
    // A command that would act on it says what is left of it, and writes nothing.
    let output = home.cmd().args(["dismiss", &id]).assert().code(2);
    assert!(String::from_utf8_lossy(&output.get_output().stderr).contains("was pruned on"));
    verify_clean(&home);
}

#[test]
fn the_age_bound_takes_runs_ended_longer_ago_and_unconsumed_results_only_past_it() {
    let home = home_without_space_pressure();
    let old_consumed = run_to_end(&home, "true");
    let old_unconsumed = run_to_end(&home, "true");
    consume_result(&home, old_consumed);
    // Both ended over a second ago from here on.
    std::thread::sleep(Duration::from_millis(1500));
    let young = run_to_end(&home, "true");
    consume_result(&home, young);
    // An hour: nothing is that old.
    assert!(pruned_ids(&prune_json(&home, &["--older-than", "1h"])).is_empty());
    // Space pressure (the whole file system wanted free) takes consumed runs of any age, but an
    // unconsumed result only past its age: with no age bound, never.
    set_policy(&home, &["--keep-for", "off", "--keep-free", "100%"]);
    let report = prune_json(&home, &[]);
    assert_eq!(pruned_ids(&report), BTreeSet::from([old_consumed, young]));
    assert!(
        report["kept"]
            .as_array()
            .expect("kept is an array")
            .iter()
            .any(|kept| kept["runId"] == old_unconsumed.to_string()
                && kept["why"]
                    .as_str()
                    .is_some_and(|why| why.contains("not consumed"))),
        "{report}"
    );
    // Past the age bound, the unconsumed result goes too, and the report says so.
    set_policy(&home, &["--keep-free", "off"]);
    let report = prune_json(&home, &["--older-than", "1s"]);
    assert_eq!(pruned_ids(&report), BTreeSet::from([old_unconsumed]));
    assert_eq!(report["runs"][0]["unconsumedResult"], Value::Bool(true));
    assert!(
        !home
            .file(&format!("results/{old_unconsumed}.json"))
            .exists()
    );
    verify_clean(&home);
}

#[test]
fn the_size_bound_prunes_until_the_home_fits_and_a_roomy_one_prunes_nothing() {
    let home = TestHome::new();
    let runs: Vec<RunId> = (0..3).map(|_| run_to_end(&home, "seq 1 2000")).collect();
    for &run in &runs {
        consume_result(&home, run);
    }
    set_policy(
        &home,
        &[
            "--keep-for",
            "off",
            "--keep-free",
            "off",
            "--max-size",
            "1T",
        ],
    );
    assert!(pruned_ids(&prune_json(&home, &["--dry-run"])).is_empty());
    // The home can never be one byte: every ended run goes (a dry run first, which prunes
    // nothing and names the bytes).
    set_policy(&home, &["--max-size", "1"]);
    let dry = prune_json(&home, &["--dry-run"]);
    assert_eq!(pruned_ids(&dry), runs.iter().copied().collect());
    assert!(
        dry["bytes"].as_u64().is_some_and(|bytes| bytes > 0),
        "{dry}"
    );
    assert!(runs.iter().all(|&run| is_in_journal(&home, run)));
    let report = prune_json(&home, &[]);
    assert_eq!(pruned_ids(&report), runs.iter().copied().collect());
    verify_clean(&home);
}

#[test]
fn the_policy_is_kept_in_the_journal_and_off_turns_a_bound_off() {
    let home = TestHome::new();
    let shown = |home: &TestHome| -> Value {
        serde_json::from_slice(
            &home
                .cmd()
                .args(["retention", "--json"])
                .assert()
                .success()
                .get_output()
                .stdout,
        )
        .expect("retention --json prints JSON")
    };
    let defaults = shown(&home);
    assert_eq!(defaults["isDefault"], Value::Bool(true));
    assert_eq!(defaults["keepForMs"], 30 * 24 * 3600 * 1000u64);
    assert_eq!(defaults["keepFreePercent"], 10);
    set_policy(
        &home,
        &[
            "--keep-for",
            "off",
            "--keep-runs",
            "7",
            "--max-size",
            "2G",
            "--keep-free",
            "5G",
        ],
    );
    let set = shown(&home);
    assert_eq!(set["isDefault"], Value::Bool(false));
    assert_eq!(set["keepForMs"], Value::Null);
    assert_eq!(set["keepRuns"], 7);
    assert_eq!(set["maxSizeBytes"], 2u64 << 30);
    assert_eq!(set["keepFreeBytes"], 5u64 << 30);
    // Bad values are bad input, and change nothing.
    for args in [
        &["--keep-runs", "many"][..],
        &["--keep-free", "120%"],
        &["--max-size", "1.5G"],
        &["--keep-for", "0s"],
    ] {
        home.cmd().arg("retention").args(args).assert().code(2);
    }
    assert_eq!(shown(&home), set);
}

#[test]
fn an_active_run_is_never_pruned_whatever_the_bounds() {
    let home = TestHome::new();
    let ended = run_to_end(&home, "true");
    consume_result(&home, ended);
    let output = home
        .cmd()
        .args(["run", "--json", "--step", "sleep 60"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let active = run_id_of(&output);
    set_policy(
        &home,
        &["--keep-runs", "0", "--keep-free", "100%", "--max-size", "1"],
    );
    let report = prune_json(&home, &["--older-than", "1ms"]);
    assert_eq!(pruned_ids(&report), BTreeSet::from([ended]));
    assert!(is_in_journal(&home, active));
    home.cmd()
        .args(["stop", &active.to_string()])
        .assert()
        .success();
    let _ = home.cmd().args(["wait", &active.to_string()]).output();
}

#[test]
fn pruned_runs_leave_the_journal_from_growing_and_compact_shrinks_it_only_alone() {
    let home = TestHome::new();
    set_policy(&home, &["--keep-runs", "0"]);
    let journal = home.file("journal.redb");
    let mut sizes = Vec::new();
    for round in 0..4 {
        for _ in 0..8 {
            let run = run_to_end(&home, "seq 1 500");
            consume_result(&home, run);
        }
        prune_json(&home, &[]);
        sizes.push(std::fs::metadata(&journal).expect("the journal").len());
        eprintln!("round {round}: journal {} bytes", sizes[round]);
    }
    // Pages the pruned runs freed are reused: later rounds do not grow the file past the
    // first round's size by more than redb's growth step. A round may end before redb frees
    // what its prune released (a read transaction of another process still sees it), so the
    // smaller of the last two rounds is judged: a journal that reused nothing would be about
    // three and four times the first by then.
    let later = sizes[2].min(sizes[3]);
    assert!(later <= sizes[0] * 2, "the journal grew: {sizes:?}");
    // Compaction while another handle holds the journal open is refused.
    let holder = home.journal();
    let refused = runjournal::journal::compact::compact(&journal);
    assert!(
        matches!(
            refused,
            Err(runjournal::journal::compact::CompactError::InUse { .. })
        ),
        "{refused:?}"
    );
    drop(holder);
    let compacted = runjournal::journal::compact::compact(&journal).expect("compaction");
    assert!(
        compacted.bytes_after < compacted.bytes_before,
        "compaction shrank nothing: {compacted:?}"
    );
    // The compacted journal is whole and still takes runs.
    verify_clean(&home);
    run_to_end(&home, "true");
    verify_clean(&home);
}

/// Records `count` complete runs through the library, projected, their results consumed.
fn record_ended_runs(home: &Home, count: usize) -> Vec<RunId> {
    let store = Store::open_with(home.clone(), StoreOptions::default()).expect("the store opens");
    let mut runs = Vec::new();
    for index in 0..count {
        let created = store
            .create_run(chain_spec(2), HostIds::default())
            .expect("the run is created");
        for batch in chain_lifecycle(2, 4_000_000 + index as u32) {
            store
                .append(created.run, batch, runjournal::Condition::none())
                .expect("the batch lands");
        }
        store.project(created.run).expect("the run is projected");
        runs.push(created.run);
    }
    store.flush_projections(Duration::from_secs(10));
    drop(store);
    for &run in &runs {
        std::fs::remove_file(home.result_path(run)).expect("the result is there to consume");
    }
    runs
}

/// `/proc/<pid>/stat`'s state letter.
fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Where a prune is killed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KillPoint {
    /// At a random moment of its life (of about twice an unkilled prune's time).
    Random,
    /// Stopped inside a write transaction of its own, then killed.
    InCommit,
    /// Stopped right after its prune's transaction committed, before any of the pruned runs'
    /// files went, then killed.
    AfterPrune,
}

#[test]
fn prunes_killed_at_random_moments_leave_no_run_half_pruned_and_the_next_pass_finishes_them() {
    let iterations: usize = std::env::var("RUNJOURNAL_PRUNE_KILLS")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(102);
    let seed: u64 = std::env::var("RUNJOURNAL_CRASH_SEED")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("seed {seed} (RUNJOURNAL_CRASH_SEED={seed} replays the choices)");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let test_home = TestHome::new();
    let home = Home::in_layout(test_home.path(), runjournal::home::Layout::Runjournal);
    set_policy(&test_home, &["--keep-runs", "0"]);
    let hook = test_home.file("stop-hook");
    let prune = |env: Option<&str>| {
        let mut command = Command::new(assert_cmd::cargo::cargo_bin!("runjournal"));
        command
            .env_remove("RUNJOURNAL_HOME")
            .env_remove("RUNJOURNAL_LAYOUT")
            .arg("--home")
            .arg(test_home.path())
            .arg("prune")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(env) = env {
            std::fs::write(&hook, b"").expect("the hook's file");
            command.env(env, &hook);
        }
        command.spawn().expect("prune starts")
    };
    // How long a whole prune of six runs takes on this machine now: random kills fall within
    // about twice that, however loaded the machine is.
    let mut all = record_ended_runs(&home, 6);
    let started = std::time::Instant::now();
    let status = prune(None).wait().expect("prune ends");
    assert!(status.success(), "{status:?}");
    let whole = started.elapsed().as_micros().max(1000) as u64;
    let mut killed = [0usize; 3];
    let mut cut_after_commit = 0usize;
    let mut cut_amid_files = 0usize;
    for iteration in 0..iterations {
        all.extend(record_ended_runs(&home, 6));
        let point = [
            KillPoint::Random,
            KillPoint::InCommit,
            KillPoint::AfterPrune,
        ][iteration % 3];
        let mut child = match point {
            KillPoint::Random => prune(None),
            KillPoint::InCommit => prune(Some("RUNJOURNAL_TEST_STOP_IN_COMMIT")),
            KillPoint::AfterPrune => prune(Some(runjournal::retention::STOP_AFTER_PRUNE_ENV)),
        };
        match point {
            KillPoint::Random => {
                std::thread::sleep(Duration::from_micros(rng.random_range(0..2 * whole)));
            }
            KillPoint::InCommit | KillPoint::AfterPrune => {
                // Until it stops at the hook (or, having nothing to stop for, ends).
                let pid = child.id();
                for _ in 0..6000 {
                    if process_state(pid) == Some('T')
                        || child.try_wait().expect("prune is there").is_some()
                    {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        }
        let _ = child.kill();
        let status = child.wait().expect("prune is reaped");
        let _ = std::fs::remove_file(&hook);
        if status.code().is_none() {
            killed[point as usize] += 1;
        }
        let journal = test_home.journal();
        let view = journal.view().expect("a view");
        for &run in &all {
            assert_whole_in(&view, run);
        }
        // Killed after a prune's transaction, before its pass saw the files gone.
        let pending = view.pruning().expect("pruning reads");
        cut_after_commit += usize::from(status.code().is_none() && !pending.is_empty());
        cut_amid_files += usize::from(
            pending
                .iter()
                .any(|tombstone| home.run_dir(tombstone.run_id).exists()),
        );
    }
    // One more pass finishes every prune cut short: no file of a pruned run is left.
    prune_json(&test_home, &[]);
    let journal = test_home.journal();
    let view = journal.view().expect("a view");
    assert!(view.pruning().expect("pruning reads").is_empty());
    for &run in &all {
        assert!(
            view.snapshot(run).expect("reads").is_none(),
            "{run} was never pruned"
        );
        assert!(!home.run_dir(run).exists(), "{run}'s directory was left");
    }
    drop(view);
    drop(journal);
    verify_clean(&test_home);
    eprintln!(
        "of {iterations} prunes, killed: {} at random moments (within {whole} µs x 2), {} inside a commit, {} after their prune's commit; {cut_after_commit} left runs pruned but not finished, {cut_amid_files} with a pruned run's files still there",
        killed[0], killed[1], killed[2]
    );
    // Every stop at a hook is a kill there: each prune had runs to prune.
    let per_point = iterations / 3;
    assert_eq!(killed[1], per_point, "kills inside a commit");
    assert_eq!(killed[2], per_point, "kills after the prune's commit");
    assert!(
        cut_amid_files >= per_point,
        "a kill after the prune's commit leaves its runs' files for the next pass: {cut_amid_files}"
    );
}

// Shipping is the cargo feature `ship`.
#[cfg(feature = "ship")]
#[test]
fn a_run_not_yet_shipped_is_kept_until_the_shipper_has_it() {
    let Some(cluster) = runjournal::testkit::pg_cluster::PgCluster::start("retention_unshipped")
    else {
        return;
    };
    let home = TestHome::new();
    let url = cluster.url();
    let ship_once = |home: &TestHome| {
        home.cmd()
            .env_remove("RUNJOURNAL_SHIP_URL")
            .env_remove("PGPASSWORD")
            .env("PGPASSFILE", home.file("no-password-file"))
            .args(["ship", "--once", "--to", &url])
            .assert()
            .success();
    };
    let shipped: Vec<RunId> = (0..2).map(|_| run_to_end(&home, "true")).collect();
    ship_once(&home);
    let unshipped = run_to_end(&home, "true");
    for &run in shipped.iter().chain([&unshipped]) {
        consume_result(&home, run);
    }
    let report = prune_json(&home, &["--keep-runs", "0"]);
    assert_eq!(pruned_ids(&report), shipped.iter().copied().collect());
    assert!(
        report["kept"]
            .as_array()
            .expect("kept")
            .iter()
            .any(|kept| kept["runId"] == unshipped.to_string()
                && kept["why"]
                    .as_str()
                    .is_some_and(|why| why.contains("not shipped"))),
        "{report}"
    );
    assert!(is_in_journal(&home, unshipped));
    // Once shipped, it goes; the server holds every record of all three exactly once.
    ship_once(&home);
    let report = prune_json(&home, &["--keep-runs", "0"]);
    assert_eq!(pruned_ids(&report), BTreeSet::from([unshipped]));
    let head = home
        .journal()
        .view()
        .expect("a view")
        .global_head()
        .expect("the head reads");
    let mut client = cluster.client();
    let row = client
        .query_one(
            "SELECT count(*), count(DISTINCT global_seq), max(global_seq) FROM runjournal_records",
            &[],
        )
        .expect("the server answers");
    let (count, distinct, max): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
    assert_eq!((count, distinct), (max, max), "each record once");
    assert!(
        u64::try_from(max).expect("a positive seq") <= head,
        "the server holds {max}, the journal's head is {head}"
    );
    verify_clean(&home);
}

/// `runjournal --home ROOT` for a home on a small file system of the test's own, with no space
/// reserve (so that the file system fills exactly as the test fills it).
fn small_home_cmd(root: &std::path::Path) -> assert_cmd::Command {
    let mut command = assert_cmd::cargo::cargo_bin_cmd!("runjournal");
    command
        .env_remove("RUNJOURNAL_HOME")
        .env_remove("RUNJOURNAL_LAYOUT")
        .env("RUNJOURNAL_RESERVE_BYTES", "0")
        .arg("--home")
        .arg(root)
        .timeout(Duration::from_secs(120));
    command
}

/// Makes reconcile passes until every one of `runs` is closed (its runner seen gone).
fn reconcile_until_closed(root: &std::path::Path, runs: &[RunId]) {
    crate::support::reconcile_until_closed(&root.join("journal.redb"), runs, || {
        small_home_cmd(root).arg("reconcile").assert().success();
    });
}

#[test]
fn a_prune_on_a_full_disk_waits_for_room_and_completes() {
    if !crate::full_disk::can_mount("a_prune_on_a_full_disk_waits_for_room_and_completes") {
        return;
    }
    let fs = crate::full_disk::SmallFs::tmpfs("24M");
    let root = fs.path().join("home");
    let cmd = || small_home_cmd(&root);
    let mut runs = Vec::new();
    for _ in 0..4 {
        let output = cmd()
            .args(["run", "--json", "--step", "seq 1 20000"])
            .assert()
            .success()
            .get_output()
            .stdout
            .clone();
        let run = run_id_of(&output);
        let _ = cmd().args(["wait", &run.to_string()]).output();
        runs.push(run);
    }
    reconcile_until_closed(&root, &runs);
    for &run in &runs {
        std::fs::remove_file(root.join(format!("results/{run}.json"))).expect("consumed");
    }
    // Fill the file system to the last byte.
    let filler = fs.path().join("filler");
    {
        use std::io::Write;
        let mut file = std::fs::File::create(&filler).expect("the filler");
        let block = vec![7u8; 64 * 1024];
        while file.write_all(&block).is_ok() {}
        while file.write_all(&[7u8]).is_ok() {}
        let _ = file.sync_all();
    }
    let mut prune = Command::new(assert_cmd::cargo::cargo_bin!("runjournal"))
        .env_remove("RUNJOURNAL_HOME")
        .env_remove("RUNJOURNAL_LAYOUT")
        .env("RUNJOURNAL_RESERVE_BYTES", "0")
        .arg("--home")
        .arg(&root)
        .args(["prune", "--keep-runs", "0", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("prune starts");
    // Whether it could write or had to wait, room comes back after a while.
    std::thread::sleep(Duration::from_millis(1500));
    let waited = prune.try_wait().expect("prune is there").is_none();
    std::fs::remove_file(&filler).expect("the filler goes");
    let output = prune.wait_with_output().expect("prune ends");
    assert!(output.status.success(), "{output:?}");
    let report: Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(pruned_ids(&report), runs.iter().copied().collect());
    eprintln!(
        "the prune {} for room",
        if waited { "waited" } else { "did not wait" }
    );
    let journal = runjournal::Journal::open(root.join("journal.redb")).expect("opens");
    let view = journal.view().expect("a view");
    for &run in &runs {
        assert_whole_in(&view, run);
        assert!(view.snapshot(run).expect("reads").is_none());
        assert!(!root.join(format!("runs/{run}")).exists());
    }
    let home = Home::in_layout(&root, runjournal::home::Layout::Runjournal);
    crate::support::check_journal(&view, Some(&home));
}

#[test]
fn the_free_space_floor_prunes_the_oldest_first_and_status_and_list_warn_under_it() {
    let name = "the_free_space_floor_prunes_the_oldest_first_and_status_and_list_warn_under_it";
    if !crate::full_disk::can_mount(name) {
        return;
    }
    let fs = crate::full_disk::SmallFs::tmpfs("24M");
    let root = fs.path().join("home");
    let cmd = || small_home_cmd(&root);
    // Four ended runs of about 100 KiB of output each.
    let mut runs = Vec::new();
    for _ in 0..4 {
        let output = cmd()
            .args(["run", "--json", "--wait", "--step", "seq 1 20000"])
            .assert()
            .success()
            .get_output()
            .stdout
            .clone();
        runs.push(run_id_of(&output));
    }
    reconcile_until_closed(&root, &runs);
    // The last one's result is never consumed: with the age bound off, it stays.
    let unconsumed = runs.pop().expect("four runs");
    for &run in &runs {
        std::fs::remove_file(root.join(format!("results/{run}.json"))).expect("consumed");
    }
    cmd()
        .args(["retention", "--keep-for", "off", "--keep-runs", "off"])
        .args(["--max-size", "off", "--keep-free", "off"])
        .assert()
        .success();
    // Leave exactly 1 MiB free: fill the file system, then give back 1 MiB of the filler.
    let filler = fs.path().join("filler");
    {
        use std::io::Write;
        let mut file = std::fs::File::create(&filler).expect("the filler");
        let block = vec![7u8; 64 * 1024];
        while file.write_all(&block).is_ok() {}
        let length = file.metadata().expect("the filler's size").len();
        file.set_len(length.saturating_sub(1 << 20))
            .expect("the filler shrinks");
        file.sync_all().expect("the filler syncs");
    }
    // A floor 40 KiB above what is free: the oldest run alone (over 100 KiB) makes up for it.
    cmd()
        .args(["retention", "--keep-free", &format!("{}K", 1024 + 40)])
        .assert()
        .success();
    let dry = cmd()
        .args(["prune", "--dry-run", "--json"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let dry: Value = serde_json::from_slice(&dry).expect("JSON");
    assert_eq!(pruned_ids(&dry), BTreeSet::from([runs[0]]), "{dry}");
    assert_eq!(dry["runs"][0]["why"], "space pressure", "{dry}");
    // A floor no pruning can reach: every ended run goes, and both commands say the disk is
    // under it (after their own passes pruned what they could).
    cmd()
        .args(["retention", "--keep-free", "90%"])
        .assert()
        .success();
    let listed = cmd().arg("list").assert().success().get_output().clone();
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(
        listed.contains("the retention policy keeps free"),
        "list says nothing of the floor:\n{listed}"
    );
    let status = cmd()
        .args(["status", &unconsumed.to_string()])
        .assert()
        .success()
        .get_output()
        .clone();
    let status = String::from_utf8_lossy(&status.stdout);
    assert!(
        status.contains("the retention policy keeps free"),
        "status says nothing of the floor:\n{status}"
    );
    let journal = runjournal::Journal::open(root.join("journal.redb")).expect("opens");
    let view = journal.view().expect("a view");
    for &run in &runs {
        assert_whole_in(&view, run);
        assert!(
            view.snapshot(run).expect("reads").is_none(),
            "{run} is pruned by the passes of list and status"
        );
    }
    assert!(view.snapshot(unconsumed).expect("reads").is_some());
    // Room again: nothing to say.
    drop(view);
    drop(journal);
    std::fs::remove_file(&filler).expect("the filler goes");
    let listed = cmd().arg("list").assert().success().get_output().clone();
    assert!(
        !String::from_utf8_lossy(&listed.stdout).contains("keeps free"),
        "{listed:?}"
    );
}

#[test]
fn while_a_writer_waits_on_a_full_disk_list_and_status_say_what_pruning_could_free() {
    use runjournal::capacity::{BlockCause, Blocked};
    let test_home = TestHome::new();
    let home = Home::in_layout(test_home.path(), runjournal::home::Layout::Runjournal);
    // No bound that the passes of list and status would act on.
    set_policy(&test_home, &["--keep-for", "off", "--keep-free", "off"]);
    let runs = record_ended_runs(&home, 3);
    let blocked = Blocked {
        writer: runjournal::liveness::current().expect("this process has an identity"),
        since_ms: runjournal::event::now_ms(),
        cause: BlockCause::Capacity,
    };
    runjournal::capacity::mark_blocked(&home, &blocked).expect("the marker is written");
    let listed = test_home.cmd().arg("list").assert().success();
    let listed = String::from_utf8_lossy(&listed.get_output().stdout).into_owned();
    assert!(listed.contains("blocked on a full disk"), "{listed}");
    assert!(
        listed.contains("pruning could free") && listed.contains("(3 ended run(s))"),
        "{listed}"
    );
    let status = test_home
        .cmd()
        .args(["status", &runs[0].to_string()])
        .assert()
        .success();
    let status = String::from_utf8_lossy(&status.get_output().stdout).into_owned();
    assert!(status.contains("pruning could free"), "{status}");
    // Saying so prunes nothing.
    assert!(runs.iter().all(|&run| is_in_journal(&test_home, run)));
    runjournal::capacity::clear_blocked(&home, &blocked).expect("the marker goes");
    let listed = test_home.cmd().arg("list").assert().success();
    let listed = String::from_utf8_lossy(&listed.get_output().stdout).into_owned();
    assert!(!listed.contains("pruning could free"), "{listed}");
}

/// The home's size as the journal keeps it (`retention::size`) against a walk of `runs/` and
/// `results/`, through every way the home changes: runs that end, an active run's output
/// growing, a prune, and a drift only a walk can see (a file of a counted run grown behind the
/// count's back, as a crash between a file's growth and the count's update leaves it), which
/// the next walk corrects.
#[test]
fn the_kept_home_size_tracks_the_walked_size_through_runs_prunes_and_a_drift_a_walk_corrects() {
    use runjournal::retention::{self, PassOptions, size::KeptSize};
    let test_home = TestHome::new();
    let home = Home::in_layout(test_home.path(), runjournal::home::Layout::Runjournal);
    set_policy(
        &test_home,
        &[
            "--keep-for",
            "off",
            "--keep-free",
            "off",
            "--max-size",
            "1T",
        ],
    );
    let walked = || {
        let bytes = retention::home_bytes(&home);
        bytes.runs + bytes.results
    };
    let store = Store::open_with(home.clone(), StoreOptions::default()).expect("the store opens");
    let pass = |options: &PassOptions| {
        let report = retention::pass(&store, options).expect("a pass");
        (
            report.size.clone().expect("max-size asks for the size"),
            report,
        )
    };
    let reconcile = PassOptions::reconcile();

    // No count yet: the first pass walks.
    let ended = record_ended_runs(&home, 4);
    let (size, _) = pass(&reconcile);
    assert!(size.walked, "the first pass walks");
    assert_eq!(size.files, walked());

    // Runs that ended since, and an active run whose output grows: counted without a walk.
    let mut ended = [ended, record_ended_runs(&home, 4)].concat();
    let active = store
        .create_run(chain_spec(1), HostIds::default())
        .expect("the run is created");
    for batch in chain_lifecycle(1, 5_000_000).into_iter().take(2) {
        store
            .append(active.run, batch, runjournal::Condition::none())
            .expect("the batch lands");
    }
    store.project(active.run).expect("the run is projected");
    store.flush_projections(Duration::from_secs(10));
    let output = home.output_log_path(active.run, 0);
    let grow = |bytes: usize| {
        use std::io::Write;
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&output)
            .expect("the step's log opens");
        file.write_all(&vec![b'x'; bytes]).expect("the log grows");
    };
    grow(10_000);
    let (size, _) = pass(&reconcile);
    assert!(!size.walked, "a fresh count is not walked again");
    assert_eq!(size.files, walked());
    grow(5_000);
    let (size, _) = pass(&reconcile);
    assert!(!size.walked);
    assert_eq!(
        size.files,
        walked(),
        "an active run is measured as it grows"
    );

    // A prune takes the pruned runs off the count.
    let mut policy = store.journal().view().unwrap().retention().unwrap();
    policy.keep_runs = Some(3);
    let (_, report) = pass(&PassOptions {
        policy: Some(policy),
        ..PassOptions::reconcile()
    });
    assert_eq!(report.chosen.len(), ended.len() - 3, "{report:?}");
    ended.drain(..ended.len() - 3);
    let (size, _) = pass(&reconcile);
    assert!(!size.walked);
    assert_eq!(size.files, walked(), "the pruned runs left the count");

    // A kept run's file grows behind the count's back: the count misses it...
    let drift = 3_000;
    std::fs::write(
        home.run_dir(ended[0]).join("grown-behind-the-count"),
        vec![b'y'; drift],
    )
    .expect("a file grows");
    let (size, _) = pass(&reconcile);
    assert!(!size.walked);
    assert_eq!(size.files + drift as u64, walked(), "only a walk sees it");
    // ...until the next walk, due once the count is older than its interval.
    store
        .journal()
        .update_home_size(|stored| {
            let mut kept = KeptSize::decode(stored?)?;
            kept.walked_at_ms = 0;
            Some(kept.encode())
        })
        .expect("the count is aged");
    let (size, _) = pass(&reconcile);
    assert!(size.walked, "an old count is walked");
    assert_eq!(size.files, walked(), "the walk corrects the count");
    let (size, _) = pass(&reconcile);
    assert!(!size.walked);
    assert_eq!(size.files, walked(), "and the count goes on from there");
}

/// The clock shim: a wall clock that jumps, for the processes it is preloaded into.
fn clock_shim() -> &'static std::path::Path {
    static SHIM: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    SHIM.get_or_init(|| {
        crate::support::compile_shim("clock_shim", include_str!("support/clock_shim.c"))
    })
}

/// `runjournal ARGS` with the wall clock a year ahead (the uptime, which the shim leaves
/// alone, does not move).
fn a_year_ahead(home: &TestHome, args: &[&str]) -> std::process::Output {
    home.cmd()
        .env("LD_PRELOAD", clock_shim())
        .env(
            "RUNJOURNAL_TEST_CLOCK_OFFSET_S",
            (365 * 24 * 60 * 60).to_string(),
        )
        .args(args)
        .timeout(Duration::from_secs(120))
        .output()
        .expect("runs")
}

/// Regression: a wall clock a year ahead (a bad RTC before NTP, a VM resumed with skew) made
/// the first reading command prune every ended run, unconsumed results and all, "older than
/// the age bound". Ages are now judged against a clock held to what the home has seen: the
/// jump prunes nothing the true clock would not, and the commands say the clock was held back.
#[test]
fn a_clock_a_year_ahead_prunes_nothing() {
    let home = home_without_space_pressure();
    let runs = [
        run_to_end(&home, "true"),
        run_to_end(&home, "true"),
        run_to_end(&home, "false"),
    ];
    consume_result(&home, runs[0]);
    // The shim does move the clock: a process under it reads a year on.
    let year = |preload: bool| {
        let mut command = std::process::Command::new("date");
        command.arg("-u").arg("+%Y");
        if preload {
            command.env("LD_PRELOAD", clock_shim()).env(
                "RUNJOURNAL_TEST_CLOCK_OFFSET_S",
                (365 * 24 * 60 * 60).to_string(),
            );
        }
        let output = command.output().expect("date runs");
        String::from_utf8_lossy(&output.stdout)
            .trim()
            .parse::<u32>()
            .expect("a year")
    };
    assert!(year(true) > year(false), "the shim moves the wall clock on");
    for args in [
        &["list"][..],
        &["list", "--all", "--json"],
        &["reconcile"],
        &["status", &runs[0].to_string()],
        &["prune"],
        &["prune", "--older-than", "1h"],
    ] {
        let output = a_year_ahead(&home, args);
        assert!(output.status.success(), "{args:?}: {output:?}");
        let said = String::from_utf8_lossy(&output.stderr);
        if args[0] == "prune" {
            assert!(
                said.contains("ages of ended runs were judged as of"),
                "{args:?} says the clock was held back: {said}"
            );
        }
        for run in runs {
            assert!(
                is_in_journal(&home, run),
                "{args:?} pruned {run}: {output:?}"
            );
        }
    }
    for run in &runs[1..] {
        assert!(home.file(&format!("results/{run}.json")).exists());
    }
    // Under the true clock, a bound the runs are past still prunes them.
    std::thread::sleep(Duration::from_millis(1100));
    let report = prune_json(&home, &["--older-than", "1s"]);
    assert_eq!(pruned_ids(&report), BTreeSet::from(runs), "{report}");
}

/// A projection that comes after its run was pruned (a retry, a lingering process's, the
/// home's watcher's) writes nothing: taking the run's lock would make its directory again, and
/// the directory is not left behind. (The whole suite met a pruned run's directory made again
/// this way, after a prune on a full disk.)
#[test]
fn a_projection_after_its_run_was_pruned_leaves_no_directory() {
    let home = TestHome::new();
    let output = home
        .cmd()
        .args(["run", "--wait", "--json", "--step", "true"])
        .output()
        .expect("run");
    let run = run_id_of(&output.stdout);
    let journal = home.journal();
    crate::support::wait_for(&journal, run, "its runner's exit recorded", |state| {
        state.process_terminal.is_some()
    });
    drop(journal);
    home.stop_watcher();
    std::fs::remove_file(home.path().join(format!("results/{run}.json"))).expect("consumed");
    home.cmd()
        .args(["prune", "--keep-runs", "0"])
        .assert()
        .success();
    let run_dir = home.path().join(format!("runs/{run}"));
    assert!(!run_dir.exists(), "pruned");
    let store = Store::open(Home::at(home.path())).expect("the store opens");
    let projected = store.project(run);
    assert!(
        matches!(
            projected,
            Err(runjournal::projection::ProjectionError::UnknownRun { .. })
        ),
        "{projected:?}"
    );
    assert!(!run_dir.exists(), "a late projection leaves no directory");
}
