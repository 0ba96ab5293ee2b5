//! journal-tools beside real writers: a writer process SIGKILLed mid-append, whose journal is
//! copied and replayed; and inspection while a writer is appending.
//!
//! The test binary re-executes itself as the writer (sled's self-respawning harness): a child
//! sees `WRITER_ENV` and appends instead of testing.

use crate::common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{json_lines, run, tool};
use runjournal::HostIds;
use runjournal::event::{Event, Mode, RunSpec};
use runjournal::testkit::{
    completed, identity, runner_exited, runner_started, shell, spec, step_complete, step_running,
};
use runjournal::{Condition, Home, RunId, Store};

const WRITER_ENV: &str = "JOURNAL_TOOLS_TEST_WRITER";

/// Most batches a writer appends, so a writer nobody stops still ends.
const MAX_BATCHES: usize = 20_000;

/// A run's lifecycle as batches after its creation.
fn lifecycle() -> Vec<Vec<Event>> {
    vec![
        vec![runner_started(identity(4000), "writer")],
        vec![step_running(0, None)],
        vec![step_complete(0), completed("done")],
        vec![runner_exited("writer", 0)],
    ]
}

/// Child: appends lifecycles through a Store (journal and projections) until `stop` exists,
/// writing `run last_seq` to the ack file after each acknowledged batch.
fn writer_main(home: &Path, acks: &Path, stop: &Path) {
    let store = Store::open(Home::at(home)).expect("the writer opens the home");
    let mut acks = std::fs::File::create(acks).expect("the writer creates its ack file");
    let mut batches = 0;
    while batches < MAX_BATCHES && !stop.exists() {
        let spec = RunSpec {
            name: Some(format!("run-{batches}")),
            ..spec(Mode::Single, vec![shell("work", "true")])
        };
        let created = store
            .create_run(spec, HostIds::default())
            .expect("the writer creates a run");
        writeln!(acks, "{} {}", created.run, created.last_seq).expect("ack");
        batches += 1;
        for events in lifecycle() {
            let appended = store
                .append(created.run, events, Condition::none())
                .expect("the writer appends");
            writeln!(acks, "{} {}", appended.run, appended.last_seq).expect("ack");
            batches += 1;
        }
    }
}

fn spawn_writer(test_name: &str, home: &Path, acks: &Path, stop: &Path) -> Child {
    Command::new(std::env::current_exe().expect("the test binary"))
        .args([
            "--exact",
            &format!("crash::{test_name}"),
            "--nocapture",
            "--test-threads=1",
        ])
        .env(
            WRITER_ENV,
            format!("{}\n{}\n{}", home.display(), acks.display(), stop.display()),
        )
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn the writer")
}

/// In a child: runs the writer and returns true.
fn is_writer_child() -> bool {
    let Ok(paths) = std::env::var(WRITER_ENV) else {
        return false;
    };
    let paths: Vec<PathBuf> = paths.split('\n').map(PathBuf::from).collect();
    writer_main(&paths[0], &paths[1], &paths[2]);
    true
}

/// The acknowledged (run, last seq) pairs; a line cut short by the kill is ignored.
fn read_acks(path: &Path) -> Vec<(RunId, u64)> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let (run, seq) = line.split_once(' ')?;
            Some((run.parse().ok()?, seq.parse().ok()?))
        })
        .collect()
}

fn wait_for_acks(path: &Path, count: usize) {
    let started = Instant::now();
    while read_acks(path).len() < count {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the writer acknowledged fewer than {count} batches within two minutes"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_journal_copied_after_its_writer_was_killed_replays_and_verifies() {
    if is_writer_child() {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let home = dir.path().join("home");
    let acks = dir.path().join("acks");
    let mut writer = spawn_writer(
        "a_journal_copied_after_its_writer_was_killed_replays_and_verifies",
        &home,
        &acks,
        &dir.path().join("never"),
    );
    wait_for_acks(&acks, 40);
    writer.kill().expect("SIGKILL the writer");
    let status = writer.wait().expect("reap the writer");
    assert!(!status.success(), "the writer was killed, not finished");
    let acked = read_acks(&acks);

    let copy = dir.path().join("copied.redb");
    std::fs::copy(home.join("journal.redb"), &copy).expect("copy the journal");
    let copy_bytes = std::fs::read(&copy).expect("read the copy");
    let out = dir.path().join("out");
    let ran = run({
        let mut command = tool();
        command
            .arg("--journal")
            .arg(&copy)
            .args(["replay", "--all", "--out"])
            .arg(&out);
        command
    });
    assert_eq!(ran.code, 0, "{}{}", ran.stdout, ran.stderr);
    // The killed writer left the journal needing recovery: only a private copy is recovered.
    assert!(
        ran.stderr.contains("was not shut down cleanly"),
        "{}",
        ran.stderr
    );
    for (run, last_seq) in &acked {
        let status: serde_json::Value = serde_json::from_slice(
            &std::fs::read(out.join(format!("runs/{run}/status.json")))
                .expect("every acknowledged run is replayed"),
        )
        .expect("JSON");
        let journal_seq = status["journalSeq"].as_u64().expect("journalSeq");
        assert!(
            journal_seq >= *last_seq,
            "run {run}: acknowledged up to seq {last_seq}, replayed at {journal_seq}"
        );
    }

    let ran = run({
        let mut command = tool();
        command
            .arg("--journal")
            .arg(&copy)
            .args(["inspect", "verify", "--json"]);
        command
    });
    assert_eq!(ran.code, 0, "{}{}", ran.stdout, ran.stderr);
    let summary = json_lines(&ran.stdout).pop().expect("summary");
    assert_eq!(summary["integrity"], "passed", "{summary}");
    assert!(summary["runs"].as_u64().expect("runs") >= 8);
    assert_eq!(
        std::fs::read(&copy).expect("read the copy"),
        copy_bytes,
        "the copied journal itself was not written"
    );
}

#[test]
fn inspecting_while_a_writer_appends() {
    if is_writer_child() {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let home = dir.path().join("home");
    let acks = dir.path().join("acks");
    let stop = dir.path().join("stop");
    let mut writer = spawn_writer("inspecting_while_a_writer_appends", &home, &acks, &stop);
    wait_for_acks(&acks, 10);
    let at_home = |args: &[&str]| {
        let mut command = tool();
        command.arg("--home").arg(&home).args(args);
        command.timeout(Duration::from_secs(120));
        run(command)
    };

    let ran = at_home(&["inspect", "runs", "--json"]);
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert!(json_lines(&ran.stdout).len() >= 3);

    // --follow waits for commits made after it started, and prints them as they come.
    let head = json_lines(&at_home(&["inspect", "stats", "--json"]).stdout)[0]["globalHead"]
        .as_u64()
        .expect("a global head");
    let ran = at_home(&[
        "inspect",
        "events",
        "--follow",
        "--after-seq",
        &head.to_string(),
        "--limit",
        "12",
        "--json",
    ]);
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let events = json_lines(&ran.stdout);
    assert_eq!(events.len(), 13);
    let globals: Vec<u64> = events[..12]
        .iter()
        .map(|event| event["globalSeq"].as_u64().expect("global seq"))
        .collect();
    assert_eq!(globals, (head + 1..=head + 12).collect::<Vec<_>>());

    let ran = at_home(&["inspect", "verify"]);
    assert_eq!(ran.code, 0, "{}{}", ran.stdout, ran.stderr);
    let ran = at_home(&["replay", "--all", "--check"]);
    assert!(ran.code == 0, "{}{}", ran.stdout, ran.stderr);

    std::fs::write(&stop, b"").expect("ask the writer to stop");
    let status = writer.wait().expect("the writer ends");
    assert!(status.success(), "the writer finished cleanly");
    let ran = at_home(&["inspect", "verify"]);
    assert_eq!(ran.code, 0, "{}{}", ran.stdout, ran.stderr);
}
