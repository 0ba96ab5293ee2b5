//! Commits shared across processes, with real processes: appenders hand their batches to
//! the journal's commit leader (whichever of them took the commit lock), while the test
//! SIGKILLs leaders at random moments, SIGKILLs clients mid-request, or fills the leader's
//! disk. Afterwards every acknowledged batch is present exactly once, each run's seqs are
//! gap-free and its snapshot equals its replay, and each writer's batches landed in the order
//! it made them.
//!
//! The test re-executes its own binary as the appender processes (as `concurrent_writers`
//! does): a child sees `CHILD_ENV` and appends instead of orchestrating. Seeded: each test
//! prints its seed; `RUNJOURNAL_LEADER_SEED=<seed>` replays one.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use runjournal::event::{Event, StepAction};
use runjournal::journal::{
    Appended, CommitSharing, Journal, JournalReader, Location, View, WriterOptions,
};
use runjournal::testkit::PID_NAMESPACE;
use runjournal::testkit::lifecycle::{chain_lifecycle, chain_spec};
use runjournal::{Condition, Home, RunId, Store, capacity, state};

const CHILD_ENV: &str = "RUNJOURNAL_TEST_SHARED_APPENDER";
const SEED_ENV: &str = "RUNJOURNAL_LEADER_SEED";

/// What a child is asked to do, passed in `CHILD_ENV` as lines.
struct Job {
    journal: PathBuf,
    acks: PathBuf,
    runs: usize,
    /// Pause after each acknowledged batch, so kills find children mid-way.
    pause_ms: u64,
    /// Runs of big specs (a full disk comes sooner), and the writer marks itself blocked in
    /// the journal's directory as a home's writer does.
    is_big: bool,
    /// Joins a leader but never leads, as the `runjournal` commands do.
    is_join_only: bool,
}

impl Job {
    fn to_env(&self) -> String {
        format!(
            "{}\n{}\n{}\n{}\n{}\n{}",
            self.journal.display(),
            self.acks.display(),
            self.runs,
            self.pause_ms,
            self.is_big,
            self.is_join_only
        )
    }

    fn from_env(text: &str) -> Job {
        let lines: Vec<&str> = text.lines().collect();
        Job {
            journal: PathBuf::from(lines[0]),
            acks: PathBuf::from(lines[1]),
            runs: lines[2].parse().expect("runs"),
            pause_ms: lines[3].parse().expect("pause"),
            is_big: lines[4].parse().expect("is_big"),
            is_join_only: lines[5].parse().expect("is_join_only"),
        }
    }
}

/// Child: appends `runs` lifecycles, each batch on the condition that the run's head is the
/// last one acknowledged (as a runner appends its `StepRunning`). After each acknowledged batch
/// it writes `ack <run> <writer> <first_seq> <last_seq>`; at the end `stats <through_leader>
/// <for_others>`. A line is written only after `append` returned, so a line means
/// "acknowledged"; an error panics, and the child exits unsuccessfully: a batch that landed
/// through a leader killed before it answered must be answered as committed when sent again,
/// never refused because its head moved (by itself).
fn child_main(job: &Job) {
    let home = Home::at(job.journal.parent().expect("the journal is in a directory"));
    // Runner-like: a runner has no terminal and may lead; so may these, whatever runs the
    // tests. Or command-like: joins, never leads.
    let options = WriterOptions {
        blocked_markers: job.is_big.then_some(home),
        commit_sharing: if job.is_join_only {
            CommitSharing::Join
        } else {
            CommitSharing::Lead
        },
        ..WriterOptions::default()
    };
    let journal = Journal::open_with(Location::Path(job.journal.clone()), options)
        .expect("child opens the journal");
    let mut acks = std::fs::File::create(&job.acks).expect("child creates its ack file");
    let writer = journal.writer().0;
    // Batches a dead leader had committed without answering, recognised when sent again.
    let mut duplicates = 0u64;
    let mut ack = |run: RunId, appended: &Appended| {
        duplicates += u64::from(appended.was_duplicate);
        writeln!(
            acks,
            "ack {run} {writer} {} {}",
            appended.first_seq, appended.last_seq
        )
        .expect("child writes an ack");
        std::thread::sleep(Duration::from_millis(job.pause_ms));
    };
    for _ in 0..job.runs {
        let created = journal
            .append(
                RunId::generate(),
                vec![created_event(job.is_big)],
                Condition::expect_head(0),
            )
            .expect("child creates a run");
        ack(created.run, &created);
        let mut head = created.last_seq;
        for events in chain_lifecycle(2, std::process::id()) {
            let appended = journal
                .append(created.run, events, Condition::expect_head(head))
                .expect("child appends");
            head = appended.last_seq;
            ack(created.run, &appended);
        }
    }
    let stats = journal.writer_stats();
    writeln!(
        acks,
        "stats {} {} {duplicates}",
        stats.through_leader.load(Ordering::Relaxed),
        stats.for_others.load(Ordering::Relaxed)
    )
    .expect("child writes its stats");
}

fn created_event(is_big: bool) -> Event {
    let mut spec = chain_spec(2);
    if is_big {
        for step in &mut spec.steps {
            step.action = StepAction::Shell {
                script: format!("echo {}", "x".repeat(4000)),
            };
        }
    }
    Event::RunCreated {
        spec: Arc::new(spec),
        created_at_ms: runjournal::event::now_ms(),
        session_id: None,
        completion_owner_id: None,
        tool_call_id: None,
    }
}

/// Runs the child's part if this process is a child; `true` then.
fn is_child() -> bool {
    match std::env::var(CHILD_ENV) {
        Ok(text) => {
            child_main(&Job::from_env(&text));
            true
        }
        Err(_) => false,
    }
}

fn spawn(test: &str, job: &Job) -> Child {
    Command::new(std::env::current_exe().expect("test binary path"))
        .args([
            "--exact",
            &format!("commit_leader::{test}"),
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, job.to_env())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn an appender")
}

fn seeded_rng(test: &str) -> (u64, StdRng) {
    let seed = std::env::var(SEED_ENV)
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("{test}: seed {seed} ({SEED_ENV}={seed} replays it)");
    (seed, StdRng::seed_from_u64(seed))
}

struct Ack {
    run: RunId,
    writer: u64,
    first_seq: u64,
    last_seq: u64,
}

/// A child's acknowledged batches in its order, and its stats if it finished: batches handed
/// to a leader, batches taken as the leader, batches answered as duplicates.
fn read_acks(path: &Path) -> (Vec<Ack>, Option<(u64, u64, u64)>) {
    let Ok(file) = std::fs::File::open(path) else {
        return (Vec::new(), None);
    };
    let mut acks = Vec::new();
    let mut stats = None;
    for line in std::io::BufReader::new(file).lines() {
        let line = line.expect("ack line reads");
        let fields: Vec<&str> = line.split(' ').collect();
        // A SIGKILL can cut the last line short: such a line is no acknowledgement.
        match fields.as_slice() {
            ["ack", run, writer, first, last] => {
                let parsed = (|| {
                    Some(Ack {
                        run: run.parse().ok()?,
                        writer: writer.parse().ok()?,
                        first_seq: first.parse().ok()?,
                        last_seq: last.parse().ok()?,
                    })
                })();
                acks.extend(parsed);
            }
            ["stats", through, served, duplicates] => {
                stats = Some((
                    through.parse().expect("stats"),
                    served.parse().expect("stats"),
                    duplicates.parse().expect("stats"),
                ));
            }
            _ => {}
        }
    }
    (acks, stats)
}

fn ack_count(path: &Path) -> usize {
    read_acks(path).0.len()
}

/// The pid the commit lock's holder wrote into it, if any.
fn leader_pid(journal: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(runjournal::home::commit_lock_path(journal)).ok()?;
    text.trim().parse().ok()
}

/// A record of a batch: its run, its seq, its position in the log.
type Landed = (RunId, u64, u64);

/// Checks everything that must hold of the journal and the children's acknowledgements.
fn check(seed: u64, journal: &Path, ack_files: &[PathBuf]) {
    let reader = JournalReader::open(journal).expect("the journal opens read-only");
    let view = reader.view().expect("view");
    check_runs(seed, &view);
    let log = view.records_after(0, usize::MAX).expect("the log reads");
    // Where each (writer, writer seq) landed: its records' (run, seq) and log positions.
    let mut batches: HashMap<(u64, u64), Vec<Landed>> = HashMap::new();
    let mut last_seq_of_writer: HashMap<u64, u64> = HashMap::new();
    for (global, record) in &log {
        batches
            .entry((record.writer.0, record.writer_seq))
            .or_default()
            .push((record.run_id, record.seq, *global));
        let last = last_seq_of_writer.entry(record.writer.0).or_insert(0);
        assert!(
            record.writer_seq >= *last,
            "seed {seed}: writer {:x} committed seq {} after seq {last}",
            record.writer.0,
            record.writer_seq
        );
        *last = record.writer_seq;
    }
    let mut acknowledged = 0usize;
    for path in ack_files {
        let mut previous_global = 0;
        for ack in read_acks(path).0 {
            acknowledged += 1;
            let records = view
                .records(ack.run)
                .expect("an acknowledged run has records");
            let of_ack: Vec<_> = records
                .iter()
                .filter(|record| (ack.first_seq..=ack.last_seq).contains(&record.seq))
                .collect();
            assert_eq!(
                of_ack.len() as u64,
                ack.last_seq - ack.first_seq + 1,
                "seed {seed}: run {}: acknowledged seqs {}..={} are in the journal",
                ack.run,
                ack.first_seq,
                ack.last_seq
            );
            let writer_seq = of_ack[0].writer_seq;
            assert!(
                of_ack
                    .iter()
                    .all(|record| record.writer.0 == ack.writer && record.writer_seq == writer_seq),
                "seed {seed}: run {}: seqs {}..={} are one batch of writer {:x}",
                ack.run,
                ack.first_seq,
                ack.last_seq,
                ack.writer
            );
            let landed = &batches[&(ack.writer, writer_seq)];
            assert_eq!(
                landed
                    .iter()
                    .map(|(run, seq, _)| (*run, *seq))
                    .collect::<Vec<_>>(),
                (ack.first_seq..=ack.last_seq)
                    .map(|seq| (ack.run, seq))
                    .collect::<Vec<_>>(),
                "seed {seed}: batch {writer_seq} of writer {:x} is in the journal exactly once",
                ack.writer
            );
            let global = landed[0].2;
            assert!(
                global > previous_global,
                "seed {seed}: writer {:x}'s acknowledged batches landed in its order",
                ack.writer
            );
            previous_global = global;
        }
    }
    assert!(acknowledged > 0, "seed {seed}: something was acknowledged");
    eprintln!(
        "seed {seed}: {acknowledged} acknowledged batches of {} processes checked",
        ack_files.len()
    );
}

/// Each run's seqs are gap-free from 1, its snapshot equals the replay of its records, and
/// every process identity it records kept its PID namespace.
fn check_runs(seed: u64, view: &View) {
    for run in view.all_runs().expect("runs") {
        let records = view.records(run).expect("records decode");
        for record in &records {
            if let Some(process) = record.event.process_identity() {
                assert_eq!(
                    process.pid_namespace,
                    Some(PID_NAMESPACE),
                    "seed {seed}: run {run} seq {}: the identity is recorded as sent",
                    record.seq
                );
            }
        }
        let seqs: Vec<u64> = records.iter().map(|record| record.seq).collect();
        assert_eq!(
            seqs,
            (1..=records.len() as u64).collect::<Vec<_>>(),
            "seed {seed}: run {run}: seqs are gap-free from 1"
        );
        let snapshot = view.snapshot(run).expect("snapshot").expect("run exists");
        let replayed = state::replay(&records)
            .expect("records fold")
            .expect("non-empty");
        assert_eq!(
            snapshot, replayed,
            "seed {seed}: run {run}: snapshot equals replay"
        );
    }
}

/// Children by pid, with their ack files.
struct Children {
    test: &'static str,
    journal: PathBuf,
    dir: PathBuf,
    live: BTreeMap<u32, Child>,
    ack_files: Vec<PathBuf>,
    is_big: bool,
    /// Every other child of the first `APPENDERS` joins without leading (the others may lead,
    /// so that there is a leader to kill).
    are_some_join_only: bool,
    /// Every child spawned from now on joins without leading.
    are_all_join_only: bool,
}

impl Children {
    /// Children appending to a new journal in the home `home`, writing acks to `dir`.
    fn new(test: &'static str, home: &Path, dir: &Path) -> Children {
        let options = runjournal::store::StoreOptions::default();
        // Made first (with the home's directories), so that no child races another to
        // create it.
        let store = Store::open_with(Home::at(home), options).expect("create the home");
        let journal = store.home().journal_path();
        drop(store);
        Children {
            test,
            journal,
            dir: dir.to_path_buf(),
            live: BTreeMap::new(),
            ack_files: Vec::new(),
            is_big: false,
            are_some_join_only: false,
            are_all_join_only: false,
        }
    }

    fn spawn(&mut self, runs: usize, pause_ms: u64) -> u32 {
        let acks = self.dir.join(format!("acks-{}", self.ack_files.len()));
        let child = spawn(
            self.test,
            &Job {
                journal: self.journal.clone(),
                acks: acks.clone(),
                runs,
                pause_ms,
                is_big: self.is_big,
                is_join_only: self.are_all_join_only
                    || (self.are_some_join_only
                        && self.ack_files.len() < APPENDERS
                        && self.ack_files.len() % 2 == 1),
            },
        );
        self.ack_files.push(acks);
        let pid = child.id();
        self.live.insert(pid, child);
        pid
    }

    fn kill(&mut self, pid: u32) {
        let mut child = self.live.remove(&pid).expect("a live child");
        child.kill().expect("SIGKILL");
        child.wait().expect("reap");
    }

    /// Waits for every live child; each must finish cleanly.
    fn finish(&mut self, seed: u64) {
        for (pid, mut child) in std::mem::take(&mut self.live) {
            let status = child.wait().expect("wait");
            assert!(
                status.success(),
                "seed {seed}: appender {pid} failed: {status}"
            );
        }
    }

    /// Sums of the finished children's stats (see [`read_acks`]).
    fn stats(&self) -> (u64, u64, u64) {
        self.ack_files
            .iter()
            .filter_map(|path| read_acks(path).1)
            .fold((0, 0, 0), |(a, b, c), (d, e, f)| (a + d, b + e, c + f))
    }
}

const APPENDERS: usize = 6;
const LEADER_KILLS: usize = 5;

#[test]
fn leaders_killed_at_random_moments_lose_nothing_acknowledged() {
    if is_child() {
        return;
    }
    let test = "leaders_killed_at_random_moments_lose_nothing_acknowledged";
    let (seed, mut rng) = seeded_rng(test);
    let dir = tempfile::tempdir().expect("temp dir");
    let mut children = Children::new(test, &dir.path().join("home"), dir.path());
    // Half of them never lead: when their leader dies, they must go on without leading.
    children.are_some_join_only = true;
    for _ in 0..APPENDERS {
        children.spawn(12, 2);
    }
    let mut leaders_killed = 0;
    let started = Instant::now();
    while leaders_killed < LEADER_KILLS {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "seed {seed}: only {leaders_killed} leaders killed in two minutes"
        );
        std::thread::sleep(Duration::from_millis(rng.random_range(20..150)));
        let Some(pid) = leader_pid(&children.journal) else {
            continue;
        };
        if !children.live.contains_key(&pid) {
            // No leader yet, or the last one's note outlived it: look again soon.
            continue;
        }
        children.kill(pid);
        leaders_killed += 1;
        children.spawn(12, 2);
    }
    children.finish(seed);
    check(seed, &children.journal, &children.ack_files);
    let (through_leader, for_others, duplicates) = children.stats();
    eprintln!(
        "seed {seed}: {leaders_killed} leaders killed; the survivors handed {through_leader} \
         batches to leaders and took {for_others}; {duplicates} sent again were already in"
    );
    assert!(
        through_leader > 0 && for_others > 0,
        "seed {seed}: batches were committed through leaders ({through_leader} handed over, \
         {for_others} taken by the survivors)"
    );
}

/// Clients that may not lead (as `runjournal` commands) lose their leader mid-request, and no
/// other process may lead: they see the lock free, so the leader judges nothing more, and
/// commit what it left unanswered themselves — they neither wait for a leader that cannot come
/// nor give up.
#[test]
fn clients_that_may_not_lead_go_on_alone_when_their_leader_is_killed() {
    if is_child() {
        return;
    }
    let test = "clients_that_may_not_lead_go_on_alone_when_their_leader_is_killed";
    let (seed, mut rng) = seeded_rng(test);
    let dir = tempfile::tempdir().expect("temp dir");
    let mut children = Children::new(test, &dir.path().join("home"), dir.path());
    let leader = children.spawn(200, 5);
    let started = Instant::now();
    while leader_pid(&children.journal) != Some(leader) {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "seed {seed}: the first appender never led"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    children.are_all_join_only = true;
    for _ in 0..3 {
        children.spawn(20, 0);
    }
    let started = Instant::now();
    while children.ack_files[1..]
        .iter()
        .any(|path| ack_count(path) < 3)
    {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "seed {seed}: the clients did not get going"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(rng.random_range(0..20)));
    children.kill(leader);
    children.finish(seed);
    check(seed, &children.journal, &children.ack_files);
    let (through_leader, for_others, duplicates) = children.stats();
    eprintln!(
        "seed {seed}: the clients handed {through_leader} batches to the leader before it was \
         killed; {duplicates} sent again were already in"
    );
    assert!(through_leader > 0, "seed {seed}: the clients had a leader");
    assert_eq!(for_others, 0, "seed {seed}: no client led");
}

#[test]
fn a_client_killed_mid_request_leaves_its_leader_serving_the_rest() {
    if is_child() {
        return;
    }
    let test = "a_client_killed_mid_request_leaves_its_leader_serving_the_rest";
    let (seed, mut rng) = seeded_rng(test);
    let dir = tempfile::tempdir().expect("temp dir");
    let mut children = Children::new(test, &dir.path().join("home"), dir.path());
    // The leader: the first to commit, and long-lived.
    let leader = children.spawn(40, 10);
    let started = Instant::now();
    while leader_pid(&children.journal) != Some(leader) {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "seed {seed}: the first appender never led"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut clients: Vec<u32> = (0..4).map(|_| children.spawn(10, 0)).collect();
    for _ in 0..6 {
        std::thread::sleep(Duration::from_millis(rng.random_range(5..60)));
        let victim = clients.remove(rng.random_range(0..clients.len()));
        if children.live.contains_key(&victim) {
            children.kill(victim);
        }
        clients.push(children.spawn(10, 0));
    }
    let last_client = children.ack_files.len() - 1;
    children.finish(seed);
    check(seed, &children.journal, &children.ack_files);
    let (_, leader_served, _) = read_acks(&children.ack_files[0])
        .1
        .expect("the leader finished");
    let (last_handed_over, _, _) = read_acks(&children.ack_files[last_client])
        .1
        .expect("the last client finished");
    assert!(
        leader_served > 0 && last_handed_over > 0,
        "seed {seed}: the leader served clients ({leader_served} batches), also after the \
         kills ({last_handed_over} batches of the last client)"
    );
}

#[test]
fn a_leaders_full_disk_makes_its_clients_wait_and_loses_nothing() {
    if is_child() {
        return;
    }
    let test = "a_leaders_full_disk_makes_its_clients_wait_and_loses_nothing";
    if !crate::full_disk::can_mount(test) {
        return;
    }
    let (seed, _) = seeded_rng(test);
    let disk = crate::full_disk::SmallFs::tmpfs("64m");
    let acks_dir = tempfile::tempdir().expect("temp dir");
    let home = disk.path().join("home");
    let mut children = Children::new(test, &home, acks_dir.path());
    children.is_big = true;
    // All but 1 MiB of the disk taken, so the appenders fill it long before they are done.
    let ballast = disk.path().join("ballast");
    crate::full_disk::fill(&ballast);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&ballast)
        .expect("ballast");
    let length = file.metadata().expect("stat").len();
    file.set_len(length.saturating_sub(1 << 20)).expect("room");
    drop(file);
    let leader = children.spawn(200, 0);
    let started = Instant::now();
    while leader_pid(&children.journal) != Some(leader) {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "seed {seed}: the first appender never led"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    for _ in 0..3 {
        children.spawn(200, 0);
    }
    let home = Home::at(&home);
    let started = Instant::now();
    while capacity::read_status(&home)
        .expect("capacity status")
        .blocked_since_ms()
        .is_none()
    {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "seed {seed}: the leader was never blocked by the full disk"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Blocked: nobody's batch lands, and nobody gives up.
    let total = |children: &Children| -> usize {
        children.ack_files.iter().map(|path| ack_count(path)).sum()
    };
    std::thread::sleep(Duration::from_millis(500));
    let before = total(&children);
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        total(&children),
        before,
        "seed {seed}: nothing is acknowledged while the leader's disk is full"
    );
    for (pid, child) in &mut children.live {
        assert_eq!(
            child.try_wait().expect("poll"),
            None,
            "seed {seed}: appender {pid} waits, neither failing nor done"
        );
    }
    std::fs::remove_file(&ballast).expect("space returns");
    children.finish(seed);
    check(seed, &children.journal, &children.ack_files);
    let (through_leader, _, _) = children.stats();
    assert!(
        through_leader > 0,
        "seed {seed}: the clients' batches went through the leader"
    );
}
