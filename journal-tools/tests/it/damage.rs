//! `inspect verify` and `replay --check` catch damage: a projection edited or deleted, a
//! snapshot rewritten behind the library's back (another state, another run's, another layout,
//! flipped bytes), a flipped byte in a record (through redb, and in the raw file). Each is
//! reported with the run (and seq or file) it concerns, the other runs are still checked, and
//! the exit code says how bad it is: a snapshot is a cache, so one that is wrong is
//! inconsistent (1), while a damaged record is damage (4).

use crate::common;

use std::path::Path;

use common::{Fixture, fixture, json_lines, run, tool, tool_at};
use redb::{ReadableDatabase, ReadableTable, TableDefinition};
use runjournal::RunId;
use runjournal::journal::JournalReader;
use runjournal::testkit::{encode_snapshot, snapshot_of_layout_two};

const RECORDS: TableDefinition<&[u8; 24], &[u8]> = TableDefinition::new("records");
const RUNS: TableDefinition<&[u8; 16], &[u8]> = TableDefinition::new("runs");

/// The journal file opened with redb directly, as another program would.
fn open_raw(path: &Path) -> redb::Database {
    redb::Database::builder()
        .set_concurrency_mode(redb::ConcurrencyMode::MultiWriter)
        .open(path)
        .expect("the journal opens as a redb database")
}

fn record_key(run: RunId, seq: u64) -> [u8; 24] {
    let mut key = [0u8; 24];
    key[..16].copy_from_slice(&run.to_bytes());
    key[16..].copy_from_slice(&seq.to_be_bytes());
    key
}

fn verify(fixture: &Fixture) -> common::Ran {
    run(tool_at(fixture, &["inspect", "verify"]))
}

fn check(fixture: &Fixture) -> common::Ran {
    run(tool_at(fixture, &["replay", "--all", "--check"]))
}

#[test]
fn an_edited_status_json_is_reported_with_the_fields_that_differ_and_replay_repairs_it() {
    let fixture = fixture();
    let status_path = fixture.home.status_path(fixture.complete);
    let mut status: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&status_path).expect("status.json")).expect("JSON");
    status["state"] = "running".into();
    status["journalSeq"] = 3.into();
    std::fs::write(
        &status_path,
        serde_json::to_vec_pretty(&status).expect("JSON"),
    )
    .expect("overwrite status.json");
    std::fs::remove_file(fixture.home.events_path(fixture.failed)).expect("delete events.jsonl");

    let ran = verify(&fixture);
    common::redactions().bind(|| {
        insta::assert_snapshot!("verify_damaged_projections", fixture.redact(&ran.stdout))
    });
    for ran in [ran, check(&fixture)] {
        assert_eq!(ran.code, 1, "{}{}", ran.stdout, ran.stderr);
        let out = fixture.redact(&ran.stdout);
        assert!(
            out.contains(
                "inconsistent status of run <complete-run> differs from a fresh projection"
            ),
            "{out}"
        );
        assert!(out.contains("runs/<complete-run>/status.json"), "{out}");
        assert!(
            out.contains(r#"state: "running" on disk, "complete" expected"#),
            "{out}"
        );
        assert!(out.contains("journalSeq: 3 on disk, 6 expected"), "{out}");
        assert!(
            out.contains("inconsistent events of run <failed-run> is missing"),
            "{out}"
        );
    }
    let objects = json_lines(&run(tool_at(&fixture, &["inspect", "verify", "--json"])).stdout);
    let problems: Vec<_> = objects.iter().filter(|o| o["type"] == "problem").collect();
    assert_eq!(problems.len(), 2, "{objects:?}");
    assert_eq!(problems[0]["fileKind"], "events");
    assert_eq!(problems[1]["kind"], "projection");
    assert_eq!(problems[1]["runId"], fixture.complete.to_string());

    let ran = run(tool_at(&fixture, &["replay", "--all"]));
    assert_eq!(ran.code, 0, "{}{}", ran.stdout, ran.stderr);
    let out = fixture.redact(&ran.stdout);
    assert!(
        out.contains("repaired     status         runs/<complete-run>/status.json (was differing)"),
        "{out}"
    );
    assert!(
        out.contains("repaired     events         runs/<failed-run>/events.jsonl (was missing)"),
        "{out}"
    );
    assert_eq!(verify(&fixture).code, 0);
    assert_eq!(check(&fixture).code, 0);
}

#[test]
fn a_consumed_result_is_a_note_but_an_edited_one_is_a_problem() {
    let fixture = fixture();
    let result_path = fixture.home.result_path(fixture.complete);
    std::fs::remove_file(&result_path).expect("the host consumed the result");

    for ran in [verify(&fixture), check(&fixture)] {
        assert_eq!(ran.code, 0, "{}{}", ran.stdout, ran.stderr);
        assert!(
            fixture.redact(&ran.stdout).contains(
                "note         result of run <complete-run> was published and is gone (consumed by the host)"
            ),
            "{}",
            ran.stdout
        );
    }
    // In place, replay leaves it absent (writing it again would deliver it twice) unless asked.
    let ran = run(tool_at(&fixture, &["replay", "--all"]));
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert!(ran.stdout.contains("left-absent"), "{}", ran.stdout);
    assert!(!result_path.exists());
    let ran = run(tool_at(&fixture, &["replay", "--all", "--restore-results"]));
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert!(result_path.exists());

    let failed_result = fixture.home.result_path(fixture.failed);
    let edited = std::fs::read_to_string(&failed_result)
        .expect("result")
        .replace("\"success\": false", "\"success\": true");
    std::fs::write(&failed_result, edited).expect("edit the result");
    let ran = check(&fixture);
    assert_eq!(ran.code, 1, "{}", ran.stdout);
    assert!(
        ran.stdout.contains("success: true on disk, false expected"),
        "{}",
        ran.stdout
    );
}

#[test]
fn an_edited_snapshot_is_reported_as_differing_from_the_fold() {
    let fixture = fixture();
    let mut state = {
        let reader = JournalReader::open(fixture.journal_path()).expect("open");
        let view = reader.view().expect("view");
        view.snapshot(fixture.complete)
            .expect("reads")
            .expect("the run exists")
    };
    // A valid snapshot of another state: the run's summary and head rewritten.
    if let Some(terminal) = state.terminal.as_mut() {
        terminal.summary = "said goodbye".to_string();
    }
    state.head_seq = 5;
    let bytes = encode_snapshot(&state).expect("encodes");
    {
        let db = open_raw(&fixture.journal_path());
        let txn = db.begin_write().expect("write");
        txn.open_table(RUNS)
            .expect("runs")
            .insert(&fixture.complete.to_bytes(), bytes.as_slice())
            .expect("insert");
        txn.commit().expect("commit");
    }

    for ran in [verify(&fixture), check(&fixture)] {
        assert_eq!(ran.code, 1, "{}{}", ran.stdout, ran.stderr);
        let out = fixture.redact(&ran.stdout);
        assert!(
            out.contains(
                "inconsistent the stored snapshot of run <complete-run> differs from the fold of its 6 records"
            ),
            "{out}"
        );
        assert!(
            out.contains(r#"terminal.summary: "said goodbye" stored, "said hello" folded"#),
            "{out}"
        );
        assert!(out.contains("head_seq: 5 stored, 6 folded"), "{out}");
    }
    // The projection is rendered from the fold, the truth, so it still matches the disk.
    let ran = check(&fixture);
    assert!(!ran.stdout.contains("status of run"), "{}", ran.stdout);
}

/// Puts `bytes` in the `runs` table as the snapshot of `run`.
fn overwrite_snapshot(fixture: &Fixture, run: RunId, bytes: &[u8]) {
    let db = open_raw(&fixture.journal_path());
    let txn = db.begin_write().expect("write");
    txn.open_table(RUNS)
        .expect("runs")
        .insert(&run.to_bytes(), bytes)
        .expect("insert");
    txn.commit().expect("commit");
}

/// A snapshot is a cache of its run's records: one that does not decode is an inconsistency
/// (exit 1), not damage (exit 4), and every read still shows the run, re-derived.
#[test]
fn a_snapshot_of_another_run_is_an_inconsistent_cache_and_the_run_still_reads() {
    let fixture = fixture();
    let other = {
        let db = open_raw(&fixture.journal_path());
        let txn = db.begin_read().expect("read");
        let runs = txn.open_table(RUNS).expect("runs");
        runs.get(&fixture.failed.to_bytes())
            .expect("reads")
            .expect("exists")
            .value()
            .to_vec()
    };
    overwrite_snapshot(&fixture, fixture.complete, &other);

    for ran in [verify(&fixture), check(&fixture)] {
        assert_eq!(ran.code, 1, "{}{}", ran.stdout, ran.stderr);
        let out = fixture.redact(&ran.stdout);
        assert!(
            out.contains("inconsistent snapshot of run <complete-run>: it holds the state of run <failed-run> (a cache"),
            "{out}"
        );
        assert!(
            !out.lines().any(|line| line.starts_with("damaged")),
            "{out}"
        );
    }
    let objects = json_lines(&run(tool_at(&fixture, &["inspect", "runs", "--json"])).stdout);
    let complete = objects
        .iter()
        .find(|object| object["runId"] == fixture.complete.to_string())
        .expect("the run is listed");
    assert_eq!(complete["state"], "complete");
    assert_eq!(complete["headSeq"], 6);
}

/// Snapshot bytes of a later layout (a hypothetical layout 2 with a field added at the end),
/// and snapshot bytes that fail their checksum: both inconsistent, neither damage.
#[test]
fn a_snapshot_of_another_layout_or_with_damaged_bytes_is_an_inconsistent_cache() {
    let fixture = fixture();
    let stored = |run: RunId| {
        let db = open_raw(&fixture.journal_path());
        let txn = db.begin_read().expect("read");
        let runs = txn.open_table(RUNS).expect("runs");
        runs.get(&run.to_bytes())
            .expect("reads")
            .expect("exists")
            .value()
            .to_vec()
    };
    let layout_two = snapshot_of_layout_two(&stored(fixture.complete), Some(1))
        .expect("the stored snapshot is of layout 1");
    overwrite_snapshot(&fixture, fixture.complete, &layout_two);
    let mut flipped = stored(fixture.failed);
    flipped[20] ^= 0x01;
    overwrite_snapshot(&fixture, fixture.failed, &flipped);

    let ran = verify(&fixture);
    assert_eq!(ran.code, 1, "{}{}", ran.stdout, ran.stderr);
    let out = fixture.redact(&ran.stdout);
    for expected in [
        "inconsistent snapshot of run <complete-run>: it is in layout 2; this build reads layout 1",
        "inconsistent snapshot of run <failed-run>: it fails its checksum",
        "2 inconsistent",
    ] {
        assert!(out.contains(expected), "{expected}\n{out}");
    }
    assert!(
        !out.lines().any(|line| line.starts_with("damaged")),
        "{out}"
    );
    // Reading the runs re-derives them: nothing to report there.
    let ran = run(tool_at(&fixture, &["inspect", "runs"]));
    assert_eq!(ran.code, 0, "{}{}", ran.stdout, ran.stderr);
    assert!(
        ran.stdout.contains(&fixture.failed.to_string()),
        "{}",
        ran.stdout
    );
}

#[test]
fn a_flipped_byte_in_a_record_names_the_run_and_seq_and_exits_4() {
    let fixture = fixture();
    {
        let db = open_raw(&fixture.journal_path());
        let key = record_key(fixture.failed, 6);
        let mut bytes = {
            let txn = db.begin_read().expect("read");
            let records = txn.open_table(RECORDS).expect("records");
            records
                .get(&key)
                .expect("reads")
                .expect("record 6 exists")
                .value()
                .to_vec()
        };
        let at = bytes
            .windows(5)
            .position(|window| window == b"quota")
            .expect("the job message is in record 6");
        bytes[at] ^= 0x01;
        let txn = db.begin_write().expect("write");
        txn.open_table(RECORDS)
            .expect("records")
            .insert(&key, bytes.as_slice())
            .expect("insert");
        txn.commit().expect("commit");
    }

    let ran = verify(&fixture);
    assert_eq!(ran.code, 4, "{}{}", ran.stdout, ran.stderr);
    let out = fixture.redact(&ran.stdout);
    assert!(
        out.contains("damaged      record 6 of run <failed-run>: record fails its checksum"),
        "{out}"
    );
    assert!(
        out.contains("run <failed-run> was not folded or projected"),
        "{out}"
    );
    // The other runs were still checked, and redb's own pages are sound.
    assert!(out.contains("verified 3 runs, 20 records"), "{out}");
    assert!(out.contains("redb integrity check passed"), "{out}");
    let objects = json_lines(&run(tool_at(&fixture, &["inspect", "verify", "--json"])).stdout);
    let record = objects
        .iter()
        .find(|object| object["kind"] == "record")
        .expect("the record problem");
    assert_eq!(record["runId"], fixture.failed.to_string());
    assert_eq!(record["seq"], 6);
    assert_eq!(record["severity"], "damaged");

    let ran = check(&fixture);
    assert_eq!(ran.code, 4, "{}{}", ran.stdout, ran.stderr);
    let out = fixture.redact(&ran.stdout);
    assert!(out.contains("record 6 of run <failed-run>"), "{out}");
    assert!(out.contains("(1 run skipped"), "{out}");

    // Reading the run says the same, and exits 4.
    let ran = run(tool_at(&fixture, &["inspect", "run", "deploy"]));
    assert_eq!(ran.code, 4, "{}", ran.stderr);
    assert!(
        fixture
            .redact(&ran.stderr)
            .contains("record 6 of run <failed-run>: record fails its checksum"),
        "{}",
        ran.stderr
    );
}

#[test]
fn a_flipped_byte_in_a_record_page_is_named_by_its_record_and_found_by_the_full_page_check() {
    let fixture = fixture();
    let path = fixture.journal_path();
    let mut bytes = std::fs::read(&path).expect("read the journal");
    let needle = b"quota exceeded";
    let positions: Vec<usize> = bytes
        .windows(needle.len())
        .enumerate()
        .filter(|(_, window)| *window == needle)
        .map(|(at, _)| at)
        .collect();
    assert!(!positions.is_empty(), "the job message is in the file");
    for at in positions {
        bytes[at] ^= 0x01;
    }
    std::fs::write(&path, &bytes).expect("write the damaged journal");

    let ran = run({
        let mut command = tool();
        command
            .arg("--journal")
            .arg(&path)
            .args(["inspect", "verify"]);
        command
    });
    // Commands read the journal in place (the pages are checked by the home's scrub, not at
    // every open): verify names the record whose own checksum fails, and its full check of
    // every page, on a copy, finds the page that holds it damaged too.
    assert_eq!(ran.code, 4, "{}{}", ran.stdout, ran.stderr);
    let out = fixture.redact(&ran.stdout);
    assert!(
        out.contains("record 6 of run <failed-run>: record fails its checksum"),
        "{out}"
    );
    assert!(out.contains("redb's integrity check failed"), "{out}");
}

#[test]
fn indexes_that_disagree_with_the_runs_are_each_reported() {
    const ACTIVE: TableDefinition<&[u8; 16], ()> = TableDefinition::new("active");
    const TERMINAL: TableDefinition<&[u8; 24], ()> = TableDefinition::new("terminal");
    const ALIASES: TableDefinition<&str, &[u8; 16]> = TableDefinition::new("aliases");
    const LOG: TableDefinition<u64, &[u8; 24]> = TableDefinition::new("log");
    let fixture = fixture();
    {
        let db = open_raw(&fixture.journal_path());
        let txn = db.begin_write().expect("write");
        txn.open_table(ACTIVE)
            .expect("active")
            .remove(&fixture.running.to_bytes())
            .expect("remove");
        {
            let mut terminal = txn.open_table(TERMINAL).expect("terminal");
            let key = terminal
                .iter()
                .expect("iterate")
                .map(|entry| *entry.expect("entry").0.value())
                .find(|key| key[8..] == fixture.complete.to_bytes())
                .expect("the complete run is listed");
            terminal.remove(&key).expect("remove");
        }
        txn.open_table(ALIASES)
            .expect("aliases")
            .insert("name:hello", &fixture.failed.to_bytes())
            .expect("insert");
        txn.open_table(LOG)
            .expect("log")
            .remove(20)
            .expect("remove");
        txn.commit().expect("commit");
    }
    let ran = verify(&fixture);
    assert_eq!(ran.code, 1, "{}{}", ran.stdout, ran.stderr);
    let out = fixture.redact(&ran.stdout);
    for expected in [
        "run <running-run> is not closed but the active index lacks it",
        "but the terminal index lacks it",
        r#"alias "name:hello" points to run <failed-run>, but the latest run it names is <complete-run>"#,
        "the log names records up to seq 4 of run <running-run>, which has 5 records",
    ] {
        assert!(out.contains(expected), "{expected}\n{out}");
    }
    assert!(out.contains("4 inconsistent"), "{out}");
}

/// The journal-tools commands run on a damaged home, each with the exit codes it may have on
/// one: as on the intact home, 1 (a problem found) or 4 (damage).
const COMMANDS: &[&[&str]] = &[
    &["inspect", "runs"],
    &["inspect", "run", "deploy"],
    &["inspect", "events"],
    &["inspect", "stats"],
    &["inspect", "verify"],
    &["replay", "--all", "--check"],
    &["replay", "--all"],
];

/// Runs `args` on the home at `root`, bounded: a command past the bound is killed and fails
/// the test rather than hanging it.
fn bounded(root: &Path, args: &[&str]) -> common::Ran {
    let mut command = tool();
    command
        .arg("--home")
        .arg(root)
        .args(args)
        .timeout(std::time::Duration::from_secs(60));
    let ran = run(command);
    assert!(
        ran.code >= 0,
        "{args:?} was killed, by the bound or a signal: {}",
        ran.stderr
    );
    ran
}

/// One flipped byte in a page of the journal — redb's header, a b-tree's page — makes redb
/// panic or fail inside the tool's reads: each command says the journal is damaged (exit 4),
/// none panics (exit 101) or hangs; `recover --from-projections` rebuilds the journal from the
/// intact events.jsonl exactly when `inspect verify` finds it damaged, keeping the file aside.
#[test]
fn every_command_on_a_journal_with_a_flipped_byte_says_it_is_damaged_and_recover_rebuilds_it() {
    use runjournal::testkit::damage::{copy_tree, flip_byte, flip_offsets};

    let fixture = fixture();
    let scratch = tempfile::tempdir().expect("a temporary directory");
    let intact = scratch.path().join("intact");
    copy_tree(fixture.root(), &intact);
    let baseline: Vec<i32> = COMMANDS
        .iter()
        .map(|args| bounded(&intact, args).code)
        .collect();
    let bytes = std::fs::metadata(fixture.journal_path())
        .expect("the journal")
        .len();
    let mut reported = std::collections::BTreeSet::new();
    let mut rebuilt = 0;
    for offset in flip_offsets(bytes) {
        let root = scratch.path().join(format!("flip-{offset}"));
        copy_tree(fixture.root(), &root);
        let journal = root.join("journal.redb");
        flip_byte(&journal, offset);
        let mut verify_code = None;
        for (args, expected) in COMMANDS.iter().zip(&baseline) {
            let ran = bounded(&root, args);
            let at = format!("{args:?} with the byte at {offset} flipped");
            assert!(
                ran.code == *expected || ran.code == 1 || ran.code == 4,
                "{at}: exit {}, not {expected}, 1 or 4: {}",
                ran.code,
                ran.stderr
            );
            assert!(!ran.stderr.contains("thread '"), "{at}: {}", ran.stderr);
            if ran.code == 4 {
                reported.insert(offset);
                assert!(
                    ran.stderr.is_empty() || ran.stderr.contains(&journal.display().to_string()),
                    "{at}: the message names the file: {}",
                    ran.stderr
                );
            }
            if args == &["inspect", "verify"] {
                verify_code = Some(ran.code);
            }
        }

        let fresh = scratch.path().join(format!("recover-{offset}"));
        copy_tree(fixture.root(), &fresh);
        flip_byte(&fresh.join("journal.redb"), offset);
        let recovered = bounded(&fresh, &["recover", "--from-projections"]);
        if verify_code == Some(4) {
            assert_eq!(
                recovered.code, 0,
                "flip at {offset}: a journal verify finds damaged is rebuilt: {}{}",
                recovered.stdout, recovered.stderr
            );
            assert!(
                recovered.stdout.contains("rebuilt 3 runs"),
                "flip at {offset}: every run is rebuilt: {}",
                recovered.stdout
            );
            assert!(
                std::fs::read_dir(&fresh)
                    .expect("the home")
                    .filter_map(Result::ok)
                    .any(|entry| entry.file_name().to_string_lossy().contains(".lost-")),
                "flip at {offset}: the damaged file is kept aside"
            );
            rebuilt += 1;
            let listed = bounded(&fresh, &["inspect", "runs"]);
            assert_eq!(listed.code, 0, "flip at {offset}: {}", listed.stderr);
            for run in [fixture.failed, fixture.complete, fixture.running] {
                assert!(
                    listed.stdout.contains(&run.to_string()),
                    "flip at {offset}: run {run} is back: {}",
                    listed.stdout
                );
            }
        } else {
            assert_eq!(
                recovered.code, 2,
                "flip at {offset}: a journal verify reads whole is left alone: {}",
                recovered.stderr
            );
            assert!(
                recovered.stderr.contains("nothing to recover"),
                "{}",
                recovered.stderr
            );
        }
    }
    assert!(
        reported.len() >= 3 && rebuilt >= 3,
        "flips in the header and in b-tree pages are damage: {reported:?}, {rebuilt} rebuilt"
    );
}
