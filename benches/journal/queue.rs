//! Queues: how long a freed slot stays unused before the next run's step starts, and what
//! admitting a queue's next run costs with 10 runs waiting and with 10,000 (the journal's
//! index of waiting runs is read at one place, so the two should cost the same); and the same
//! for a reconcile pass's delayed starts with 10 and 10,000 delayed runs waiting.

use std::path::Path;
use std::time::{Duration, Instant};

use runjournal::event::{Event, RunId, TerminalState};
use runjournal::journal::Condition;
use runjournal::launch::queue;
use runjournal::{Home, Store};

use crate::felt::{binary, open_store, running_run};
use crate::report::Measured;
use crate::{Way, fixture, timed};

/// Runs waiting in the large queue.
const MANY_WAITING: usize = 10_000;
/// Runs waiting in the small queue.
const FEW_WAITING: usize = 10;

pub const QUEUE_IDS: [&str; 7] = [
    "process-start",
    "durable-commit",
    "admit-10",
    "admit-10000",
    "slot-to-step",
    "delayed-10",
    "delayed-10000",
];

/// The `queue` group, when reported.
pub fn measure(
    scratch: &Path,
    measured: &mut Measured,
    budget: impl Fn(u64) -> Duration,
    is_reported: impl Fn(&str) -> bool,
) {
    if is_reported("queue") {
        eprintln!("queues (10,000 waiting runs, then slots freed under the real binary)...");
        measured.run_rounds("queue", queue_ways(scratch), budget(600));
    }
}

/// A waiting run's creation batch.
fn waiting(queue: &str) -> (RunId, Vec<Event>, Condition) {
    (
        RunId::generate(),
        vec![
            fixture::created(fixture::job_spec()),
            Event::QueueJoined {
                queue: queue.to_string(),
                idle_timeout_ms: None,
                heartbeat_ms: None,
            },
        ],
        Condition::expect_head(0),
    )
}

/// A delayed run's creation batch, due in a day: it waits through the benchmark.
fn delayed() -> (RunId, Vec<Event>, Condition) {
    (
        RunId::generate(),
        vec![
            fixture::created(fixture::job_spec()),
            Event::StartDelayed {
                due_at_ms: runjournal::event::now_ms() + 86_400_000,
                idle_timeout_ms: None,
                heartbeat_ms: None,
            },
        ],
        Condition::expect_head(0),
    )
}

/// The delayed starts of a reconcile pass (`launch::delay::reconcile_delayed`) in a home of
/// `count` delayed runs waiting: what is due is read from the `delayed` index, so 10 and 10,000
/// should cost the same. The bench holds the home's timer lock, and rewrites it before each
/// sample as a live timer does at each look, so no timer is started (a silent holder is taken
/// for stopped, and a timer started to take over).
fn delayed_pass(dir: &Path, count: usize) -> Box<dyn FnMut(u64) -> Duration> {
    let store = open_store(dir);
    let joined = store.append_all(std::iter::repeat_with(delayed).take(count));
    assert!(
        joined.iter().all(Result::is_ok),
        "the delayed runs are created"
    );
    let lock = runjournal::durable_fs::FileLock::try_acquire(&store.home().timer_lock_path())
        .expect("the timer lock opens")
        .expect("no timer holds it");
    let base = runjournal::launch::RunnerProgram {
        program: "/nonexistent/runjournal".into(),
        leading_args: Vec::new(),
    };
    Box::new(move |iters| {
        let _ = lock.write_note(b"bench\n");
        timed(iters, || {
            let started = runjournal::launch::delay::reconcile_delayed(&store, &base, "bench")
                .expect("the pass reads the index");
            assert!(started.is_empty(), "nothing is due");
        })
    })
}

/// Ends a run, stopped: its slot frees.
fn end(store: &Store, run: RunId) {
    store
        .append(
            run,
            vec![Event::Terminal {
                state: TerminalState::Stopped,
                error: None,
                summary: "ended by the benchmark".to_string(),
                exit_code: 143,
                repaired_by: None,
            }],
            Condition::none(),
        )
        .expect("the run ends");
}

/// One iteration = a process start (`runjournal --version`); a durable commit
/// (`Store::append`, projected); admitting a queue's next run (`launch::queue::admit_next`: a
/// read of the index and a conditional append) with 10 runs waiting, and with 10,000 (after
/// each, untimed: the run ends and a new one joins, so the counts stay); and, through the real
/// binary, a run ending in a full queue of limit 1 until the next run's step runs, timed by the
/// journal's own record times (the first's `Terminal`, the second's `StepRunning`).
pub fn queue_ways(scratch: &Path) -> Vec<Way<'static>> {
    let dir = scratch.join("queue");
    let store = open_store(&dir);
    let mut update_run = running_run(&store);
    let mut progress = 0u32;
    let admit_store = open_store(&dir);
    queue::set_limit(&admit_store, "few", 1).expect("limit");
    queue::set_limit(&admit_store, "many", 1).expect("limit");
    let joined = admit_store.append_all(
        std::iter::repeat_with(|| waiting("few"))
            .take(FEW_WAITING)
            .chain(std::iter::repeat_with(|| waiting("many")).take(MANY_WAITING)),
    );
    assert!(joined.iter().all(Result::is_ok), "the waiting runs join");
    let admit_store = std::rc::Rc::new(admit_store);
    let admit = |queue_name: &'static str| -> Box<dyn FnMut(u64) -> Duration> {
        let store = std::rc::Rc::clone(&admit_store);
        Box::new(move |iters| {
            let mut elapsed = Duration::ZERO;
            for _ in 0..iters {
                let started = Instant::now();
                let admitted = queue::admit_next(&store, queue_name, "bench")
                    .expect("the admission is judged")
                    .expect("a slot is free and a run waits");
                elapsed += started.elapsed();
                end(&store, admitted.run_id);
                let (run, events, condition) = waiting(queue_name);
                store.append(run, events, condition).expect("a run joins");
            }
            elapsed
        })
    };
    let slot_home = scratch.join("queue-slot");
    std::fs::create_dir_all(&slot_home).expect("a home");
    let slot_store = open_store(&slot_home);
    queue::set_limit(&slot_store, "q", 1).expect("limit");
    drop(slot_store);
    let mut gates = 0u64;
    vec![
        (
            QUEUE_IDS[0].into(),
            Box::new(|iters| {
                timed(iters, || {
                    let status = binary().arg("--version").status().expect("runs");
                    assert!(status.success());
                })
            }),
        ),
        (
            QUEUE_IDS[1].into(),
            Box::new(move |iters| {
                timed(iters, || {
                    progress += 1;
                    if progress.is_multiple_of(50) {
                        update_run = running_run(&store);
                    } else {
                        store
                            .append(
                                update_run,
                                vec![fixture::job_update(progress)],
                                Condition::none(),
                            )
                            .expect("an update is acknowledged");
                    }
                })
            }),
        ),
        (QUEUE_IDS[2].into(), admit("few")),
        (QUEUE_IDS[3].into(), admit("many")),
        (
            QUEUE_IDS[5].into(),
            delayed_pass(&scratch.join("delayed-few"), FEW_WAITING),
        ),
        (
            QUEUE_IDS[6].into(),
            delayed_pass(&scratch.join("delayed-many"), MANY_WAITING),
        ),
        (
            QUEUE_IDS[4].into(),
            Box::new(move |iters| {
                let mut elapsed = Duration::ZERO;
                for _ in 0..iters {
                    gates += 1;
                    elapsed += slot_to_step(&slot_home, gates);
                }
                elapsed
            }),
        ),
    ]
}

/// Launches a run that waits at a gate (it takes the queue's one slot) and a second run
/// (`true`, queued behind it), opens the gate, and returns the time from the first run's
/// `Terminal` to the second's `StepRunning`, as the journal recorded them (whole milliseconds).
fn slot_to_step(home: &Path, gate_number: u64) -> Duration {
    let gate = home.join(format!("gate-{gate_number}"));
    let launch = |script: &str| -> RunId {
        let output = binary()
            .arg("--home")
            .arg(home)
            .args(["run", "--json", "--queue", "q", "--", "sh", "-c", script])
            .stdout(std::process::Stdio::piped())
            .output()
            .expect("runjournal runs");
        assert!(output.status.success(), "run failed");
        let printed: serde_json::Value =
            serde_json::from_slice(&output.stdout).expect("run --json prints JSON");
        printed["runId"]
            .as_str()
            .and_then(|text| text.parse().ok())
            .expect("a run id")
    };
    let first = launch(&format!(
        "while [ ! -e '{}' ]; do sleep 0.005; done",
        gate.display()
    ));
    let second = launch("true");
    std::fs::write(&gate, b"").expect("open the gate");
    let reader = runjournal::JournalReader::open(Home::at(home).journal_path()).expect("a reader");
    let time_of = |run: RunId, name: &str| -> Option<u64> {
        let view = reader.view().ok()?;
        view.records(run)
            .ok()?
            .into_iter()
            .find(|record| record.event.name() == name)
            .map(|record| record.time_ms)
    };
    for _ in 0..4_000 {
        if let (Some(freed), Some(stepped)) =
            (time_of(first, "Terminal"), time_of(second, "StepRunning"))
        {
            // Let the second run end, so the next iteration's first run finds the slot free.
            for _ in 0..4_000 {
                if time_of(second, "Terminal").is_some() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            return Duration::from_millis(stepped.saturating_sub(freed));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    panic!("the queued run's step never started");
}
