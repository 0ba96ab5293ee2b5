//! Queues with the real binaries: a queue's limit holds whatever the launchers do at once, its
//! runs are admitted first in first, a waiting run can be stopped or dismissed, and a reboot
//! frees the slots of the earlier boot's runs. How many runs were active at any moment is
//! read from the journal's log, in commit order, not from clocks.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};

use redb::ReadableTable;
use runjournal::event::{Event, ProcessIdentity, RunId, StepAction};
use runjournal::journal::Condition;
use runjournal::spec::{RunDraft, named_step};
use runjournal::{Home, Journal, RunStatus, Store};

use crate::support::{TestHome, state, wait_for, wait_terminal};

/// What the journal's log says of one queue: for each commit of a `QueueAdmitted` or of a
/// `Terminal` of one of its admitted runs, how many of its runs were active after it; and the
/// order runs joined and were admitted in.
struct QueueHistory {
    most_active: usize,
    joined: Vec<RunId>,
    admitted: Vec<RunId>,
}

fn queue_history(journal: &Journal, queue: &str) -> QueueHistory {
    let view = journal.view().expect("view");
    let mut in_queue: BTreeMap<RunId, bool> = BTreeMap::new();
    let mut active = 0usize;
    let mut most_active = 0usize;
    let mut joined = Vec::new();
    let mut admitted = Vec::new();
    let mut after = 0;
    loop {
        let page = view.records_after(after, 1000).expect("the log reads");
        let Some((last, _)) = page.last() else {
            break;
        };
        after = *last;
        for (_, record) in page {
            match &record.event {
                Event::QueueJoined { queue: name, .. } if name == queue => {
                    in_queue.insert(record.run_id, false);
                    joined.push(record.run_id);
                }
                Event::QueueAdmitted { .. } if in_queue.contains_key(&record.run_id) => {
                    in_queue.insert(record.run_id, true);
                    admitted.push(record.run_id);
                    active += 1;
                    most_active = most_active.max(active);
                }
                Event::Terminal { .. } if in_queue.get(&record.run_id) == Some(&true) => {
                    active -= 1;
                }
                _ => {}
            }
        }
    }
    QueueHistory {
        most_active,
        joined,
        admitted,
    }
}

/// Starts `count` launchers of `run --queue q --json -- sh -c SCRIPT` at once; their run ids,
/// in the order they were started (not the order they joined).
fn launch_at_once(home: &TestHome, count: usize, script: &str) -> Vec<(RunId, String)> {
    let children: Vec<std::process::Child> = (0..count)
        .map(|_| {
            Command::new(env!("CARGO_BIN_EXE_runjournal"))
                .env_remove("RUNJOURNAL_HOME")
                .env_remove("RUNJOURNAL_LAYOUT")
                .arg("--home")
                .arg(home.path())
                .args(["run", "--queue", "q", "--json", "--", "sh", "-c", script])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("a launcher starts")
        })
        .collect();
    children
        .into_iter()
        .map(|child| {
            let output = child.wait_with_output().expect("the launcher ends");
            assert!(
                output.status.success(),
                "launcher: {}",
                String::from_utf8_lossy(&output.stderr)
            );
            let object: serde_json::Value =
                serde_json::from_slice(&output.stdout).expect("run --json prints JSON");
            let run = object["runId"]
                .as_str()
                .expect("a run id")
                .parse()
                .expect("a run id");
            let state = object["state"].as_str().expect("a state").to_string();
            (run, state)
        })
        .collect()
}

fn set_limit(home: &TestHome, max_active: u64) {
    home.cmd()
        .args(["queue", "q", "--max-active", &max_active.to_string()])
        .assert()
        .success();
}

#[test]
fn twenty_runs_launched_at_once_run_at_most_two_at_a_time_first_in_first() {
    let home = TestHome::new();
    set_limit(&home, 2);
    let launched = launch_at_once(&home, 20, "sleep 0.2");
    let journal = home.journal();
    // Sampled while they run: never more than two hold a slot.
    let mut samples = 0;
    loop {
        let view = journal.view().expect("view");
        let usage = view.queue_usage("q").expect("usage");
        assert!(usage.active <= 2, "{usage:?}");
        samples += 1;
        if usage.active == 0 && usage.waiting == 0 {
            break;
        }
        drop(view);
        assert!(samples < 20_000, "the queue never drained");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    for (run, _) in &launched {
        let state = wait_terminal(&journal, *run);
        assert_eq!(state.status, RunStatus::Complete, "{run}");
    }
    let history = queue_history(&journal, "q");
    assert_eq!(history.most_active, 2, "two at a time, never more");
    assert_eq!(history.joined.len(), 20);
    assert_eq!(
        history.admitted, history.joined,
        "admitted in the order they joined"
    );
    assert_verifies(&home);
    let started: usize = launched
        .iter()
        .filter(|(_, state)| state == "running")
        .count();
    // A launcher may start another launcher's run (the first waiting) and say its own is
    // queued, so as few as none may say `running`; never more than the two slots.
    assert!(
        started <= 2,
        "at most two launchers found a free slot: {started}"
    );
}

#[test]
fn launchers_racing_for_the_last_slot_take_it_once() {
    let home = TestHome::new();
    set_limit(&home, 1);
    let launched = launch_at_once(&home, 8, "sleep 30");
    // A launcher admits the queue's first waiting run, which may be another launcher's: that
    // launcher then finds its run admitted but not yet started, and says `queued`. So at most
    // one says `running`; the journal says which run holds the slot.
    let said_running: Vec<RunId> = launched
        .iter()
        .filter(|(_, state)| state == "running")
        .map(|(run, _)| *run)
        .collect();
    let said_queued = launched
        .iter()
        .filter(|(_, state)| state == "queued")
        .count();
    assert!(said_running.len() <= 1, "{launched:?}");
    assert_eq!(said_running.len() + said_queued, 8, "{launched:?}");
    let journal = home.journal();
    let view = journal.view().expect("view");
    let running = view.queue_active("q").expect("active");
    assert_eq!(running.len(), 1, "one run holds the one slot: {launched:?}");
    assert!(said_running.iter().all(|run| running.contains(run)));
    assert_eq!(view.queue_usage("q").expect("usage").waiting, 7);
    drop(view);
    // `list` and `status` show a waiting run's place and the queue's use.
    let waiting = journal
        .view()
        .expect("view")
        .queue_waiting("q", 1)
        .expect("waiting")[0];
    let status = home
        .cmd()
        .args(["status", &waiting.to_string()])
        .assert()
        .success();
    let text = String::from_utf8_lossy(&status.get_output().stdout).into_owned();
    assert!(text.contains("q: place 1; 1/1 active, 7 queued"), "{text}");
    let list = home.cmd().arg("list").assert().success();
    let text = String::from_utf8_lossy(&list.get_output().stdout).into_owned();
    assert!(text.contains("queued (q #7)"), "{text}");
    assert!(text.contains("queue q: 1/1 active, 7 queued"), "{text}");
    // Stop every waiting run (they end without a runner), then the running one.
    for (run, _) in &launched {
        if *run != running[0] {
            home.cmd()
                .args(["stop", &run.to_string()])
                .assert()
                .success();
            let stopped = wait_terminal(&journal, *run);
            assert_eq!(stopped.status, RunStatus::Stopped);
            assert!(stopped.runner.is_none(), "no runner ever started for it");
        }
    }
    home.cmd()
        .args(["stop", &running[0].to_string()])
        .assert()
        .success();
    assert_eq!(
        wait_terminal(&journal, running[0]).status,
        RunStatus::Stopped
    );
    // A run is terminal before its runner has written the files of its end: they are checked
    // once the runner is gone.
    wait_for(&journal, running[0], "its runner to be gone", |state| {
        state.runner.as_ref().is_some_and(|runner| {
            matches!(
                runjournal::liveness::check(&runner.identity),
                Ok(runjournal::liveness::Liveness::Dead)
            )
        })
    });
    assert_eq!(queue_history(&journal, "q").most_active, 1);
    assert_verifies(&home);
}

/// `verify` finds the journal whole: every queue index agrees with the runs' records, and
/// every run's files with a fresh projection. A run's files follow each commit, written by the
/// process that made it right after it: a run whose runner was just seen to end may have its
/// last files written a moment after the test sees the record, so the files are given a few
/// seconds to catch up; the indexes, read in the same transaction as the records, never are.
fn assert_verifies(home: &TestHome) {
    let journal = home.journal();
    let problems = || {
        let view = journal.view().expect("view");
        runjournal::verify::verify(&view, Some(&Home::at(home.path())))
            .problems
            .into_iter()
            .filter(|problem| problem.severity != runjournal::verify::Severity::Note)
            .collect::<Vec<_>>()
    };
    let mut found = problems();
    for _ in 0..100 {
        assert!(
            found
                .iter()
                .all(|problem| problem.kind == runjournal::verify::ProblemKind::Projection),
            "{found:#?}"
        );
        if found.is_empty() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
        found = problems();
    }
    assert!(found.is_empty(), "{found:#?}");
}

/// `verify` tells a queue index that disagrees with the records: a waiting run's entry removed
/// behind the journal's back. A limit of 0 holds every run (no runner holds the file open).
#[test]
fn verify_finds_a_queue_index_that_disagrees_with_the_records() {
    let home = TestHome::new();
    set_limit(&home, 0);
    let waiting = launch_at_once(&home, 1, "true");
    assert_eq!(waiting[0].1, "queued", "a limit of 0 admits nothing");
    let journal = home.journal();
    let view = journal.view().expect("view");
    let report = runjournal::verify::verify(&view, None);
    assert!(
        !report
            .problems
            .iter()
            .any(|problem| problem.kind == runjournal::verify::ProblemKind::QueueIndex),
        "{:?}",
        report.problems
    );
    drop(view);
    drop(journal);
    home.stop_watcher();
    {
        let db = redb::Database::open(home.path().join("journal.redb")).expect("opens");
        let txn = db.begin_write().expect("write");
        {
            let mut table = txn
                .open_table(redb::TableDefinition::<&[u8], &[u8; 16]>::new(
                    "queue_waiting",
                ))
                .expect("the table");
            let key = table
                .iter()
                .expect("iter")
                .next()
                .expect("an entry")
                .expect("reads")
                .0
                .value()
                .to_vec();
            table.remove(key.as_slice()).expect("removed");
        }
        txn.commit().expect("commits");
    }
    let journal = home.journal();
    let view = journal.view().expect("view");
    let report = runjournal::verify::verify(&view, None);
    assert!(
        report.problems.iter().any(|problem| {
            problem.kind == runjournal::verify::ProblemKind::QueueIndex
                && problem.run == Some(waiting[0].0)
        }),
        "{:?}",
        report.problems
    );
    drop(view);
    drop(journal);
    home.cmd()
        .args(["stop", &waiting[0].0.to_string()])
        .assert()
        .success();
}

#[test]
fn a_waiting_run_can_be_dismissed_and_still_runs_when_its_turn_comes() {
    let home = TestHome::new();
    set_limit(&home, 1);
    let launched = launch_at_once(&home, 1, "sleep 1");
    let second = launch_at_once(&home, 1, "true");
    assert_eq!(second[0].1, "queued");
    home.cmd()
        .args(["dismiss", &second[0].0.to_string()])
        .assert()
        .success();
    let journal = home.journal();
    let state = wait_terminal(&journal, second[0].0);
    assert_eq!(state.status, RunStatus::Complete);
    assert!(state.dismissed_at_ms.is_some());
    assert_eq!(
        wait_terminal(&journal, launched[0].0).status,
        RunStatus::Complete
    );
}

#[test]
fn a_run_without_a_queue_limit_is_refused_and_nothing_is_written() {
    let home = TestHome::new();
    home.cmd()
        .args(["run", "--queue", "nowhere", "--", "true"])
        .assert()
        .code(2);
    home.cmd()
        .args(["run", "--queue", "a b", "--", "true"])
        .assert()
        .code(2);
    let journal = home.journal();
    assert_eq!(journal.view().expect("view").run_count().expect("count"), 0);
}

/// A run of an earlier boot holds the only slot: the next reconcile pass (here `list`) fails
/// it, "host restarted", and starts the waiting run in its place.
#[test]
fn a_reboot_frees_the_slots_of_the_earlier_boots_runs() {
    let home = TestHome::new();
    set_limit(&home, 1);
    let store = Store::open(Home::at(home.path())).expect("open");
    let mut request = RunDraft {
        steps: vec![named_step(StepAction::Shell {
            script: "sleep 60".to_string(),
        })],
        ..RunDraft::default()
    }
    .finish()
    .expect("valid");
    request.queue = Some("q".to_string());
    let joined = Event::QueueJoined {
        queue: "q".to_string(),
        idle_timeout_ms: None,
        heartbeat_ms: None,
    };
    let earlier = store
        .create_queued_run(request.spec, request.hosts, joined)
        .expect("created")
        .run;
    let earlier_boot = ProcessIdentity {
        pid: std::process::id(),
        start_time: 1,
        boot_id: "an-earlier-boot".to_string(),
        pid_namespace: None,
    };
    store
        .append(
            earlier,
            vec![
                Event::QueueAdmitted {
                    by: "test".to_string(),
                },
                Event::RunnerStarted {
                    runner: earlier_boot,
                    instance_id: "i-earlier".to_string(),
                },
            ],
            Condition::expect_head(2),
        )
        .expect("admitted and started, in an earlier boot");
    drop(store);
    let waiting = launch_at_once(&home, 1, "true");
    assert_eq!(
        waiting[0].1, "queued",
        "the earlier boot's run holds the slot"
    );
    home.cmd().arg("list").assert().success();
    let journal = home.journal();
    let failed = state(&journal, earlier);
    assert_eq!(failed.status, RunStatus::Failed);
    assert!(
        failed
            .terminal
            .as_ref()
            .and_then(|terminal| terminal.error.as_deref())
            .is_some_and(|error| error.contains("restarted")),
        "{:?}",
        failed.terminal
    );
    let next = wait_for(&journal, waiting[0].0, "the run to complete", |state| {
        state.is_terminal()
    });
    assert_eq!(next.status, RunStatus::Complete);
}

const CRASH_SEED_ENV: &str = "RUNJOURNAL_QUEUE_CRASH_SEED";
const CRASH_ITERATIONS_ENV: &str = "RUNJOURNAL_QUEUE_CRASH_ITERATIONS";

/// The `runjournal` command of `home`, as a plain process the test may kill.
fn runjournal_process(home: &TestHome, args: &[&str]) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_runjournal"))
        .env_remove("RUNJOURNAL_HOME")
        .env_remove("RUNJOURNAL_LAYOUT")
        .arg("--home")
        .arg(home.path())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("runjournal starts")
}

/// SIGKILLs of launchers, runners and reconcilers at random moments, beside a queue of limit
/// 2 whose runs wait at a gate (so none ends but by a kill): never more than two active in
/// the log; after the kills and one reconcile pass, no free slot beside a waiting run; then,
/// the gate opened, every run ends, admitted first in first, and `verify` finds the journal
/// whole. Seeded: `RUNJOURNAL_QUEUE_CRASH_SEED=<seed>` replays an iteration's choices,
/// `RUNJOURNAL_QUEUE_CRASH_ITERATIONS` runs more.
#[test]
fn kills_at_random_moments_never_leave_a_free_slot_beside_a_waiting_run() {
    use rand::rngs::StdRng;
    use rand::{RngExt, SeedableRng};
    let iterations: u64 = std::env::var(CRASH_ITERATIONS_ENV)
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(2);
    let first_seed: u64 = std::env::var(CRASH_SEED_ENV)
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or_else(runjournal::event::now_ms);
    for iteration in 0..iterations {
        let seed = first_seed.wrapping_add(iteration);
        eprintln!("queue crash iteration {iteration}: {CRASH_SEED_ENV}={seed}");
        let mut rng = StdRng::seed_from_u64(seed);
        let home = TestHome::new();
        set_limit(&home, 2);
        let gate = home.path().join("gate");
        let script = format!("while [ ! -e '{}' ]; do sleep 0.05; done", gate.display());
        let mut launchers: Vec<std::process::Child> = (0..8)
            .map(|_| runjournal_process(&home, &["run", "--queue", "q", "--", "sh", "-c", &script]))
            .collect();
        let mut reconcilers: Vec<std::process::Child> = Vec::new();
        let journal = home.journal();
        let mut kills = 0;
        for _ in 0..40 {
            std::thread::sleep(std::time::Duration::from_millis(rng.random_range(5..60)));
            if rng.random_range(0..3) == 0 {
                reconcilers.push(runjournal_process(&home, &["reconcile"]));
            }
            match rng.random_range(0..6) {
                0 => {
                    let live: Vec<usize> = (0..launchers.len())
                        .filter(|index| launchers[*index].try_wait().ok().flatten().is_none())
                        .collect();
                    if let Some(index) = live.get(rng.random_range(0..live.len().max(1))) {
                        let _ = launchers[*index].kill();
                        kills += 1;
                    }
                }
                1 => {
                    let live: Vec<usize> = (0..reconcilers.len())
                        .filter(|index| reconcilers[*index].try_wait().ok().flatten().is_none())
                        .collect();
                    if let Some(index) = live.get(rng.random_range(0..live.len().max(1))) {
                        let _ = reconcilers[*index].kill();
                        kills += 1;
                    }
                }
                2 => {
                    let view = journal.view().expect("view");
                    let runners: Vec<ProcessIdentity> = view
                        .queue_active("q")
                        .expect("active")
                        .into_iter()
                        .filter_map(|run| view.snapshot(run).ok().flatten()?.runner)
                        .map(|runner| runner.identity)
                        .collect();
                    drop(view);
                    if let Some(identity) = runners.get(rng.random_range(0..runners.len().max(1)))
                        && runjournal::process_group::signal_process(
                            identity,
                            nix::sys::signal::Signal::SIGKILL,
                        )
                        .unwrap_or(false)
                    {
                        kills += 1;
                    }
                }
                _ => {}
            }
            let usage = journal.view().expect("view").queue_usage("q").expect("use");
            assert!(usage.active <= 2, "seed {seed}: {usage:?}");
        }
        for child in launchers.iter_mut().chain(reconcilers.iter_mut()) {
            let _ = child.wait();
        }
        // Nothing ends by itself while the gate is shut: after one pass, a waiting run has no
        // free slot beside it.
        home.cmd().arg("reconcile").assert().success();
        let usage = journal.view().expect("view").queue_usage("q").expect("use");
        assert!(
            usage.waiting == 0 || usage.active == 2,
            "seed {seed}: a free slot beside a waiting run after a pass: {usage:?}"
        );
        std::fs::write(&gate, b"").expect("open the gate");
        let mut passes = 0;
        loop {
            let view = journal.view().expect("view");
            let usage = view.queue_usage("q").expect("use");
            let is_done = usage.active == 0 && usage.waiting == 0;
            drop(view);
            if is_done {
                break;
            }
            passes += 1;
            assert!(
                passes < 600,
                "seed {seed}: the queue never drained: {usage:?}"
            );
            home.cmd().arg("reconcile").assert().success();
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let history = queue_history(&journal, "q");
        assert!(history.most_active <= 2, "seed {seed}");
        assert_eq!(
            history.admitted, history.joined,
            "seed {seed}: every run admitted, first in first"
        );
        for run in &history.joined {
            assert!(state(&journal, *run).is_terminal(), "seed {seed}: {run}");
        }
        // The runs' ends are recorded; one more pass closes them, then the journal is whole.
        home.cmd().arg("reconcile").assert().success();
        assert_verifies(&home);
        eprintln!(
            "queue crash iteration {iteration}: {kills} kills, {} runs",
            history.joined.len()
        );
    }
}

/// Admitting a queue's next run costs the same however many wait: in one journal, a queue of
/// 10 waiting runs and one of 10,000, an admission from each, on a handle just opened (its
/// page cache cold), reads and writes as many bytes (the indexes are read and changed at one
/// place, never scanned). Counted by the file backend, not timed.
#[test]
fn admitting_writes_as_much_with_ten_thousand_waiting_as_with_ten() {
    use runjournal::journal::instrumented::{DiskCounters, InstrumentedFile};
    use runjournal::journal::{AppendError, WriterOptions};
    use std::sync::Arc;
    use std::sync::atomic::Ordering;
    let dir = tempfile::tempdir().expect("temp dir");
    let counters = Arc::new(DiskCounters::default());
    let source =
        InstrumentedFile::source(dir.path().join("journal.redb"), Arc::clone(&counters), None);
    let open = || Journal::open_with(source.clone(), WriterOptions::default()).expect("opens");
    let journal = open();
    journal.set_queue_limit("small", 1).expect("limit");
    journal.set_queue_limit("big", 1).expect("limit");
    let spec = RunDraft {
        steps: vec![named_step(StepAction::Shell {
            script: "true".to_string(),
        })],
        ..RunDraft::default()
    }
    .finish()
    .expect("valid")
    .spec;
    let creation = |queue: &str| {
        vec![
            Event::RunCreated {
                spec: std::sync::Arc::new(spec.clone()),
                created_at_ms: 1,
                session_id: None,
                completion_owner_id: None,
                tool_call_id: None,
            },
            Event::QueueJoined {
                queue: queue.to_string(),
                idle_timeout_ms: None,
                heartbeat_ms: None,
            },
        ]
    };
    let batches = |queue: &'static str, count: usize| {
        (0..count).map(move |_| {
            (
                RunId::generate(),
                creation(queue),
                Condition::expect_head(0),
            )
        })
    };
    let results: Vec<Result<_, AppendError>> =
        journal.append_all(batches("small", 10).chain(batches("big", 10_000)));
    assert!(results.iter().all(Result::is_ok));
    drop(journal);
    // Admits the queue's first run on a fresh handle and ends it (the end not counted); the
    // bytes the admission read and wrote.
    let admit_and_end = |queue: &str| -> (u64, u64) {
        let journal = open();
        let first = journal
            .view()
            .expect("view")
            .queue_waiting(queue, 1)
            .expect("w")[0];
        let read_before = counters.bytes_read.load(Ordering::Relaxed);
        let before = counters.bytes_written.load(Ordering::Relaxed);
        journal
            .append(
                first,
                vec![Event::QueueAdmitted {
                    by: "test".to_string(),
                }],
                Condition::none(),
            )
            .expect("admitted");
        let written = counters.bytes_written.load(Ordering::Relaxed) - before;
        let read = counters.bytes_read.load(Ordering::Relaxed) - read_before;
        journal
            .append(
                first,
                vec![Event::Terminal {
                    state: runjournal::event::TerminalState::Stopped,
                    error: None,
                    summary: "ended".to_string(),
                    exit_code: 143,
                    repaired_by: None,
                }],
                Condition::none(),
            )
            .expect("ended");
        (read, written)
    };
    // Interleaved, so both see the journal at the same size.
    let (mut small, mut big) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        small.push(admit_and_end("small"));
        big.push(admit_and_end("big"));
    }
    small.sort_unstable();
    big.sort_unstable();
    let (small, big) = (small[2], big[2]);
    eprintln!("bytes (read, written) per admission: 10 waiting {small:?}, 10,000 waiting {big:?}");
    // One more level of the waiting index's tree is all 10,000 entries may cost: a page or two
    // each way (a scan of them would read some 100 pages).
    assert!(
        big.0 <= small.0 + 2 * 4096 && big.1 <= small.1 + 2 * 4096,
        "10 waiting: {small:?} bytes; 10,000 waiting: {big:?} bytes"
    );
}

/// `run --wait` of a run that finds its queue full says it is queued, follows it through its
/// admission and start, and exits as the run did; a waiting run that is stopped ends `stopped`
/// without a runner ever starting for it.
#[test]
fn run_wait_follows_a_queued_run_through_its_start_and_a_stopped_waiting_run_never_starts() {
    let home = TestHome::new();
    set_limit(&home, 1);
    let gate = home.file("gate");
    let holder = launch_at_once(
        &home,
        1,
        &format!("while [ ! -e '{}' ]; do sleep 0.05; done", gate.display()),
    );
    assert_eq!(holder[0].1, "running");
    let waiter = Command::new(env!("CARGO_BIN_EXE_runjournal"))
        .env_remove("RUNJOURNAL_HOME")
        .env_remove("RUNJOURNAL_LAYOUT")
        .arg("--home")
        .arg(home.path())
        .args(["run", "--wait", "--queue", "q", "--", "sh", "-c", "exit 3"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("a waiting launcher starts");
    let stopped = launch_at_once(&home, 1, "true");
    assert_eq!(stopped[0].1, "queued");
    let journal = home.journal();
    // The waiter's run joined the queue before the stopped one: it is first in it.
    wait_for(&journal, stopped[0].0, "the second waiting run", |state| {
        state.queue.is_some()
    });
    home.cmd()
        .args(["stop", &stopped[0].0.to_string()])
        .assert()
        .success();
    std::fs::write(&gate, b"").expect("the gate opens");
    let output = waiter.wait_with_output().expect("the waiter ends");
    assert_eq!(output.status.code(), Some(3), "{output:?}");
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(printed.contains("queued"), "{printed}");
    // The stopped run is closed by a reconcile pass; no runner ever took it.
    home.cmd().arg("reconcile").assert().success();
    let state = wait_terminal(&journal, stopped[0].0);
    assert_eq!(state.status, RunStatus::Stopped);
    assert!(
        state.runner.is_none(),
        "no runner started for a stopped waiting run"
    );
    assert_eq!(
        wait_terminal(&journal, holder[0].0).status,
        RunStatus::Complete
    );
}
