//! Several OS processes append to one journal at once, one of them is SIGKILLed mid-way, and a
//! read-only reader reads throughout. Afterwards every acknowledged event is present exactly
//! once, every run's sequence numbers are gap-free, and every snapshot equals the replay of its
//! records.
//!
//! The test re-executes its own binary as the writer processes (sled's self-respawning
//! harness): a child sees `CHILD_ENV` and writes instead of orchestrating.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use runjournal::HostIds;
use runjournal::journal::{Journal, JournalReader, View};
use runjournal::testkit::lifecycle::{chain_lifecycle, chain_spec};
use runjournal::{Condition, RunId, state};

const CHILD_ENV: &str = "RUNJOURNAL_TEST_WRITER";
const WRITERS: usize = 4;
const RUNS_PER_WRITER: usize = 12;

/// Child: append lifecycles, writing one line per acknowledged batch to the ack file:
/// `run writer writer_seq first_seq last_seq`. The line is written after `append` returned, so
/// a line means "acknowledged".
fn child_main(journal_path: &Path, ack_path: &Path) {
    let journal = Journal::open(journal_path).expect("child opens the journal");
    let mut acks = std::fs::File::create(ack_path).expect("child creates its ack file");
    let mut ack = |appended: &runjournal::journal::Appended, writer_seq: u64| {
        writeln!(
            acks,
            "{} {} {} {} {}",
            appended.run,
            journal.writer().0,
            writer_seq,
            appended.first_seq,
            appended.last_seq
        )
        .expect("child writes an ack");
    };
    let mut writer_seq = 0u64;
    for _ in 0..RUNS_PER_WRITER {
        let created = journal
            .create_run(chain_spec(3), HostIds::default())
            .expect("child creates a run");
        writer_seq += 1;
        ack(&created, writer_seq);
        for events in chain_lifecycle(3, std::process::id()) {
            let appended = journal
                .append(created.run, events, Condition::expect_not_terminal())
                .expect("child appends");
            writer_seq += 1;
            ack(&appended, writer_seq);
        }
    }
}

struct Ack {
    run: RunId,
    writer: u64,
    writer_seq: u64,
    first_seq: u64,
    last_seq: u64,
}

fn read_acks(path: &Path) -> Vec<Ack> {
    let file = std::fs::File::open(path).expect("ack file exists");
    std::io::BufReader::new(file)
        .lines()
        .map(|line| line.expect("ack line reads"))
        // A SIGKILL can cut the last line short; a line without its newline was never a
        // finished acknowledgement record, and `lines` hands back even a partial last line.
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            if fields.len() != 5 {
                return None;
            }
            Some(Ack {
                run: fields[0].parse().ok()?,
                writer: fields[1].parse().ok()?,
                writer_seq: fields[2].parse().ok()?,
                first_seq: fields[3].parse().ok()?,
                last_seq: fields[4].parse().ok()?,
            })
        })
        .collect()
}

fn spawn_writer(journal: &Path, ack: &Path) -> Child {
    Command::new(std::env::current_exe().expect("test binary path"))
        .args([
            "--exact",
            "concurrent_writers::processes_append_concurrently_and_a_killed_one_loses_nothing_acknowledged",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(
            CHILD_ENV,
            format!("{}\n{}", journal.display(), ack.display()),
        )
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn writer process")
}

/// Checks what must hold in any committed state: gap-free seqs, snapshot = replay.
fn check_view(view: &View) -> usize {
    let runs = view.all_runs().expect("list runs");
    for &run in &runs {
        let records = view.records(run).expect("records decode");
        let seqs: Vec<u64> = records.iter().map(|record| record.seq).collect();
        let expected: Vec<u64> = (1..=records.len() as u64).collect();
        assert_eq!(seqs, expected, "run {run}: seqs are gap-free from 1");
        let snapshot = view.snapshot(run).expect("snapshot").expect("run exists");
        let replayed = state::replay(&records)
            .expect("records fold")
            .expect("non-empty");
        assert_eq!(snapshot, replayed, "run {run}: snapshot equals replay");
    }
    runs.len()
}

#[test]
fn processes_append_concurrently_and_a_killed_one_loses_nothing_acknowledged() {
    if let Ok(paths) = std::env::var(CHILD_ENV) {
        let (journal, ack) = paths.split_once('\n').expect("two paths");
        child_main(Path::new(journal), Path::new(ack));
        return;
    }

    let dir = tempfile::tempdir().expect("temp dir");
    let journal_path = dir.path().join("journal.redb");
    // Create it first so the read-only reader can open it at once.
    drop(Journal::open(&journal_path).expect("create journal"));

    let ack_paths: Vec<PathBuf> = (0..WRITERS)
        .map(|index| dir.path().join(format!("acks-{index}")))
        .collect();
    let mut children: Vec<Child> = ack_paths
        .iter()
        .map(|ack| spawn_writer(&journal_path, ack))
        .collect();

    let done = Arc::new(AtomicBool::new(false));
    let views_checked = Arc::new(AtomicUsize::new(0));
    let reader = {
        let done = Arc::clone(&done);
        let views_checked = Arc::clone(&views_checked);
        let journal_path = journal_path.clone();
        std::thread::spawn(move || {
            let reader = JournalReader::open(&journal_path).expect("read-only open beside writers");
            while !done.load(Ordering::Acquire) {
                let view = reader.view().expect("read view");
                check_view(&view);
                views_checked.fetch_add(1, Ordering::Relaxed);
            }
        })
    };

    // Kill the first writer once it has acknowledged a few batches, while it is still busy.
    let victim_acks = &ack_paths[0];
    let started = Instant::now();
    loop {
        let acked = std::fs::read_to_string(victim_acks)
            .map(|text| text.lines().count())
            .unwrap_or(0);
        if acked >= 10 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "writer 0 acknowledged nothing within two minutes"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    children[0].kill().expect("SIGKILL writer 0");
    let killed = children[0].wait().expect("reap writer 0");
    assert!(
        !killed.success(),
        "writer 0 was killed mid-way, not finished"
    );
    for child in &mut children[1..] {
        let status = child.wait().expect("wait for writer");
        assert!(status.success(), "a surviving writer finished cleanly");
    }
    done.store(true, Ordering::Release);
    reader.join().expect("reader thread");
    assert!(
        views_checked.load(Ordering::Relaxed) > 0,
        "the reader read while writers wrote"
    );

    // Afterwards: every acknowledged batch present exactly once.
    let journal = JournalReader::open(&journal_path).expect("reopen read-only");
    let view = journal.view().expect("view");
    let run_count = check_view(&view);
    let mut acked_runs = BTreeSet::new();
    let mut acked_batches = 0;
    for path in &ack_paths {
        for ack in read_acks(path) {
            acked_runs.insert(ack.run);
            acked_batches += 1;
            let records = view.records(ack.run).expect("acked run has records");
            let of_batch: Vec<u64> = records
                .iter()
                .filter(|record| {
                    record.writer.0 == ack.writer && record.writer_seq == ack.writer_seq
                })
                .map(|record| record.seq)
                .collect();
            let expected: Vec<u64> = (ack.first_seq..=ack.last_seq).collect();
            assert_eq!(
                of_batch, expected,
                "run {}: acknowledged batch {} of writer {:x} is present exactly once",
                ack.run, ack.writer_seq, ack.writer
            );
        }
    }
    let survivors_runs = (WRITERS - 1) * RUNS_PER_WRITER;
    assert!(
        acked_runs.len() >= survivors_runs,
        "every surviving writer's runs were acknowledged"
    );
    assert!(run_count >= acked_runs.len());
    assert!(acked_batches > survivors_runs * chain_lifecycle(3, std::process::id()).len());

    // The global log names every record exactly once, in commit order.
    let log = view.records_after(0, usize::MAX).expect("log reads");
    assert_eq!(log.len() as u64, view.record_count().expect("count"));
    let mut seen = BTreeMap::new();
    for (global, record) in &log {
        assert!(
            seen.insert((record.run_id, record.seq), *global).is_none(),
            "record {} of run {} appears once in the log",
            record.seq,
            record.run_id
        );
    }
    let globals: Vec<u64> = log.iter().map(|(global, _)| *global).collect();
    assert_eq!(
        globals,
        (1..=log.len() as u64).collect::<Vec<_>>(),
        "global seqs are gap-free"
    );
}
