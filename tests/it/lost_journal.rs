//! A lost journal is refused, never re-created: beside runs, a missing, emptied,
//! zero-filled or truncated `journal.redb` makes every `runjournal` command exit 1 with a
//! message naming what was found, and nothing in the home changes; once rebuilt from the runs'
//! events.jsonl (the library's `recover`, which `journal-tools recover --from-projections`
//! prints; its own tests run the tool), the commands work again on the same runs. In a home
//! without runs, an empty journal file is still made a journal, as before.

use runjournal::testkit::damage::{Damage, tree};
use runjournal::{Home, RunId};

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
                Some(1),
                "{damage:?} {args:?}: {stderr}"
            );
            assert!(
                stderr.contains(&named(damage))
                    && stderr.contains("nothing was changed")
                    && stderr.contains("journal-tools recover --from-projections"),
                "{damage:?} {args:?} names what it found: {stderr}"
            );
            assert!(output.stdout.is_empty(), "{damage:?} {args:?}");
        }
        assert_eq!(tree(home.path()), before, "{damage:?}: nothing was changed");

        // The runner says it in its own log (its stderr is not kept), and changes nothing else.
        let runner_log = home.path().join("runs").join(&id).join("runner.log");
        let output = home.cmd().args(["__runner", &id]).output().expect("runs");
        assert_eq!(output.status.code(), Some(1), "{damage:?} __runner");
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
        Some(1)
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
