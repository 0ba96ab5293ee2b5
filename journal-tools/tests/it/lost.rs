//! A lost journal beside runs: missing, emptied, zero-filled or truncated, it is
//! refused by every command (exit 4, a damaged journal) with a message naming what was found,
//! and nothing in the home changes; `recover --from-projections` rebuilds it from the runs'
//! events.jsonl — the same records, in the same order — moves the lost file aside, and
//! `inspect verify` accepts the result.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use runjournal::event::Record;
use runjournal::testkit::damage::{Damage, tree};
use runjournal::{JournalReader, RunId};

use crate::common::{Fixture, fixture, json_lines, run, tool_at};

/// Every record of the journal by run, and the global log as (run, seq) in commit order.
type Contents = (BTreeMap<RunId, Vec<Record>>, Vec<(RunId, u64)>);

fn contents(journal: &Path) -> Contents {
    let reader = JournalReader::open(journal).expect("the journal opens");
    let view = reader.view().expect("a view");
    let runs = view
        .all_runs()
        .expect("runs")
        .into_iter()
        .map(|run| (run, view.records(run).expect("records")))
        .collect();
    let mut log = Vec::new();
    view.scan_log(|_, run, seq| {
        log.push((run, seq));
        true
    })
    .expect("the log reads");
    (runs, log)
}

#[test]
fn every_command_refuses_a_lost_journal_beside_runs_and_changes_nothing() {
    for damage in Damage::ALL {
        let fixture = fixture();
        damage.apply(&fixture.journal_path());
        let before = tree(fixture.root());
        let out = fixture.dir.path().join("out");
        let out = out.to_str().expect("utf-8");
        for args in [
            &["inspect", "runs"][..],
            &["inspect", "run", "deploy"],
            &["inspect", "events"],
            &["inspect", "stats"],
            &["inspect", "verify"],
            &["replay", "--all"],
            &["replay", "--all", "--check"],
            &["replay", "--run", "deploy", "--out", out],
        ] {
            let ran = run(tool_at(&fixture, args));
            assert_eq!(
                ran.code, 4,
                "{damage:?} {args:?}: {}{}",
                ran.stdout, ran.stderr
            );
            assert!(
                ran.stderr.contains(damage.named())
                    && ran.stderr.contains("the home holds 3 runs")
                    && ran.stderr.contains("recover --from-projections"),
                "{damage:?} {args:?} names what was found: {}",
                ran.stderr
            );
            assert_eq!(ran.stdout, "", "{damage:?} {args:?}");
        }
        assert_eq!(tree(fixture.root()), before, "{damage:?}: nothing changed");
        assert!(!Path::new(out).exists(), "{damage:?}: nothing was replayed");
    }
}

fn recovered(fixture: &Fixture, damage: Damage) {
    let journal = fixture.journal_path();
    let (runs, log) = contents(&journal);
    damage.apply(&journal);
    let damaged = std::fs::read(&journal).ok();

    let ran = run(tool_at(fixture, &["recover", "--from-projections"]));
    assert_eq!(ran.code, 0, "{damage:?}: {}{}", ran.stdout, ran.stderr);
    assert!(
        ran.stdout.contains(&format!(
            "journal journal.redb was {}",
            damage.named().trim_start_matches("is ")
        )) && ran
            .stdout
            .contains("rebuilt 3 runs with 20 records from their events.jsonl; 1 active run left to the reconciler"),
        "{damage:?}: {}",
        ran.stdout
    );
    let aside: Vec<PathBuf> = std::fs::read_dir(fixture.home.state_dir())
        .expect("read_dir")
        .map(|entry| entry.expect("entry").path())
        .filter(|path| {
            path.file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| name.starts_with("journal.redb.lost-"))
        })
        .collect();
    match damaged {
        None => assert!(aside.is_empty(), "{damage:?}: nothing to move aside"),
        Some(bytes) => {
            assert_eq!(aside.len(), 1, "{damage:?}: {aside:?}");
            assert_eq!(
                std::fs::read(&aside[0]).expect("the lost file"),
                bytes,
                "{damage:?}: the lost file is kept as it was"
            );
        }
    }
    assert_eq!(
        contents(&journal),
        (runs, log),
        "{damage:?}: the same records (runs, seqs, times, writers, events), in the same order"
    );
    let verified = run(tool_at(fixture, &["inspect", "verify"]));
    assert_eq!(
        verified.code, 0,
        "{damage:?}: {}{}",
        verified.stdout, verified.stderr
    );
    let runs = run(tool_at(fixture, &["inspect", "runs", "--json"]));
    let running = json_lines(&runs.stdout)
        .into_iter()
        .find(|object| object["runId"] == fixture.running.to_string())
        .expect("the running run is listed");
    assert_eq!(
        running["state"], "running",
        "{damage:?}: left to the reconciler"
    );
}

#[test]
fn recover_from_projections_gives_back_the_same_journal_that_verify_accepts() {
    for damage in Damage::ALL {
        recovered(&fixture(), damage);
    }
}

#[test]
fn recover_reports_a_run_whose_events_jsonl_is_damaged_and_rebuilds_the_others() {
    let fixture = fixture();
    let events = fixture.home.events_path(fixture.complete);
    let text = std::fs::read_to_string(&events).expect("events.jsonl");
    let cut = text.len() - 10;
    std::fs::write(&events, &text[..cut]).expect("cut the last line short");
    Damage::Emptied.apply(&fixture.journal_path());

    let ran = run(tool_at(&fixture, &["recover", "--from-projections"]));
    assert_eq!(ran.code, 1, "{}{}", ran.stdout, ran.stderr);
    assert!(
        ran.stdout.contains(&format!(
            "not rebuilt: run {}: events.jsonl line 6 is cut short (no newline)",
            fixture.complete
        )) && ran.stdout.contains("rebuilt 2 runs"),
        "{}",
        ran.stdout
    );
    assert_eq!(
        std::fs::read_to_string(&events).expect("events.jsonl"),
        text[..cut],
        "the damaged run's files are left as they are"
    );
    let (runs, _) = contents(&fixture.journal_path());
    assert_eq!(runs.keys().copied().collect::<Vec<_>>(), {
        let mut ids = vec![fixture.failed, fixture.running];
        ids.sort();
        ids
    });
}

#[test]
fn recover_refuses_a_readable_journal_and_a_home_without_runs() {
    let fixture = fixture();
    let before = tree(fixture.root());
    let ran = run(tool_at(&fixture, &["recover", "--from-projections"]));
    assert_eq!(ran.code, 2, "{}{}", ran.stdout, ran.stderr);
    assert!(
        ran.stderr.contains("is a readable journal") && ran.stderr.contains("nothing was changed"),
        "{}",
        ran.stderr
    );
    assert_eq!(tree(fixture.root()), before);

    let empty = tempfile::tempdir().expect("temp dir");
    let ran = run({
        let mut command = crate::common::tool();
        command
            .arg("--home")
            .arg(empty.path())
            .args(["recover", "--from-projections"]);
        command
    });
    assert_eq!(ran.code, 2, "{}", ran.stderr);
    assert!(
        ran.stderr.contains("is missing, and the home holds no run"),
        "{}",
        ran.stderr
    );
    assert!(
        std::fs::read_dir(empty.path())
            .expect("read_dir")
            .next()
            .is_none(),
        "nothing was made"
    );
}

/// A home whose runs used a queue, its journal lost: recovery prints the limit it gave the
/// queue (its own lived only in the journal) and what else it could not recover, as words and
/// as JSON, and the rebuilt journal keeps the queue's runs where they were.
#[test]
fn recover_gives_a_queue_the_limit_its_runs_show_and_says_what_it_could_not_recover() {
    use runjournal::event::{Event, HostIds, Mode};
    use runjournal::testkit::{shell, spec};
    use runjournal::{Condition, Store};

    let fixture = fixture();
    let store = Store::open(fixture.home.clone()).expect("the home opens");
    store
        .journal()
        .set_queue_limit("q1", 2)
        .expect("the limit is set");
    let joined = || Event::QueueJoined {
        queue: "q1".to_string(),
        idle_timeout_ms: None,
        heartbeat_ms: None,
    };
    let mut queued = Vec::new();
    for _ in 0..2 {
        let run = store
            .create_queued_run(
                spec(Mode::Single, vec![shell("wait", "true")]),
                HostIds::default(),
                joined(),
            )
            .expect("a queued run")
            .run;
        queued.push(run);
    }
    store
        .append(
            queued[0],
            vec![Event::QueueAdmitted {
                by: "test".to_string(),
            }],
            Condition::none(),
        )
        .expect("the first is admitted");
    for run in &queued {
        store.project(*run).expect("projected");
    }
    drop(store);
    Damage::Missing.apply(&fixture.journal_path());

    let ran = run(tool_at(&fixture, &["recover", "--from-projections"]));
    assert_eq!(ran.code, 0, "{}{}", ran.stdout, ran.stderr);
    assert!(
        ran.stdout.contains(
            "queue q1: limit set to 1, the most of its runs the rebuilt records show holding a slot at once"
        ) && ran
            .stdout
            .contains("set another with `runjournal queue q1 --max-active N`"),
        "{}",
        ran.stdout
    );
    assert!(
        ran.stdout.contains(
            "not recovered: the retention policy, if one was set: it was kept only in the journal"
        ) && ran
            .stdout
            .contains("not recovered: the tombstones of pruned runs"),
        "{}",
        ran.stdout
    );

    // Once more, lost again, as JSON.
    Damage::Emptied.apply(&fixture.journal_path());
    let ran = run(tool_at(
        &fixture,
        &["--json", "recover", "--from-projections"],
    ));
    assert_eq!(ran.code, 0, "{}{}", ran.stdout, ran.stderr);
    let lines = json_lines(&ran.stdout);
    let queue = lines
        .iter()
        .find(|line| line["type"] == "queue")
        .expect("a queue line");
    assert_eq!(queue["name"], "q1");
    assert_eq!(queue["maxActive"], 1);
    let facts = lines
        .iter()
        .filter(|line| line["type"] == "factNotRecovered")
        .count();
    let summary = lines.last().expect("the summary");
    assert_eq!(summary["queues"], 1);
    assert_eq!(summary["factsNotRecovered"], facts);
    assert!(facts >= 2, "{}", ran.stdout);

    let reader = JournalReader::open(fixture.journal_path()).expect("the rebuilt journal");
    let view = reader.view().expect("a view");
    assert_eq!(view.queue_limit("q1").expect("reads"), Some(1));
    assert_eq!(view.queue_active("q1").expect("reads"), vec![queued[0]]);
    assert_eq!(
        view.queue_waiting("q1", 10).expect("reads"),
        vec![queued[1]]
    );
}
