//! `runjournal ship` against a real PostgreSQL (a throwaway cluster per test, see
//! `runjournal::testkit::pg_cluster`): exactly the journal's records on the server, whatever kills the
//! shipper and whenever the server goes away; local work never waits for it.

#![cfg_attr(not(feature = "ship"), allow(dead_code, unused_imports))]

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rand::{RngExt, SeedableRng};
use runjournal::HostIds;
use runjournal::event::{Event, ExternalJobStatus, JobState, Mode, RunSpec};
use runjournal::projection::documents;
use runjournal::ship::state;
use runjournal::{Condition, Home, RunId, Store};
use serde_json::Value;
use sha2::{Digest, Sha256};

use runjournal::testkit::{self as kit, pg_cluster::PgCluster};

// The tests need the `ship` subcommand, which is the cargo feature `ship`; the helpers here
// also serve the power-cut test, which ships only when the feature is on.
#[cfg(feature = "ship")]
mod deadlines;
#[cfg(feature = "ship")]
mod environments;
mod fake_pg;
#[cfg(feature = "ship")]
mod secrets;
#[cfg(feature = "ship")]
mod trust;
#[cfg(feature = "ship")]
mod untrusted;

/// Most polls of a bounded wait, and the pause between two.
const POLL_ATTEMPTS: u32 = 1200;
const POLL_INTERVAL: Duration = Duration::from_millis(50);

fn poll_until(what: &str, mut is_done: impl FnMut() -> bool) {
    for _ in 0..POLL_ATTEMPTS {
        if is_done() {
            return;
        }
        std::thread::sleep(POLL_INTERVAL);
    }
    panic!("gave up waiting until {what}");
}

/// Records one whole run life: created, started, `updates` job updates in batches of one to
/// three, finished, closed. Returns the number of records it appended.
fn record_run(store: &Store, updates: u32, rng: &mut impl RngExt) -> u64 {
    let spec = RunSpec {
        name: Some(format!("job-{}", rng.random_range(0..1000))),
        ..kit::spec(
            Mode::Single,
            vec![kit::step("deploy", kit::provider("deployer --watch"))],
        )
    };
    let run = store
        .create_run(spec, HostIds::default())
        .expect("a run is created")
        .run;
    let mut appended = 1;
    let mut append = |events: Vec<Event>| {
        appended += events.len() as u64;
        store
            .append(run, events, Condition::none())
            .expect("a legal batch is appended");
    };
    append(vec![
        kit::runner_started(kit::identity(100), "runner"),
        kit::step_running(0, Some(kit::identity(101))),
    ]);
    let mut done = 0;
    while done < updates {
        let count = rng.random_range(1..=3).min(updates - done);
        let events = (done..done + count)
            .map(|index| {
                let job = ExternalJobStatus {
                    message: Some(format!("step {index} \"quoted\" \u{e9}")),
                    ..kit::job(
                        JobState::Running,
                        "job",
                        Some(f64::from(index) / f64::from(updates)),
                    )
                };
                kit::job_updated(0, job)
            })
            .collect();
        append(events);
        done += count;
    }
    append(vec![
        kit::step_complete(0),
        kit::completed("done"),
        kit::runner_exited("runner", 0),
    ]);
    appended
}

/// JSON with object keys sorted, so the server's `jsonb` (which reorders keys) hashes alike.
fn canonical(value: &Value) -> String {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            let fields: Vec<String> = keys
                .into_iter()
                .map(|key| format!("{}:{}", Value::from(key.as_str()), canonical(&map[key])))
                .collect();
            format!("{{{}}}", fields.join(","))
        }
        Value::Array(items) => format!(
            "[{}]",
            items.iter().map(canonical).collect::<Vec<_>>().join(",")
        ),
        other => other.to_string(),
    }
}

fn record_hash(run: &str, seq: i64, time_ms: i64, kind: &str, event: &Value) -> String {
    let text = format!("{run}|{seq}|{time_ms}|{kind}|{}", canonical(event));
    Sha256::digest(text.as_bytes())
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// Every record of the home's journal by global seq, hashed.
pub(crate) fn local_hashes(home: &Home) -> BTreeMap<i64, String> {
    let reader = runjournal::JournalReader::open(home.journal_path()).expect("the journal opens");
    let view = reader.view().expect("a view");
    let mut out = BTreeMap::new();
    let mut cursor = 0;
    loop {
        let page = view.records_after(cursor, 1000).expect("the log reads");
        let Some((last, _)) = page.last() else { break };
        cursor = *last;
        for (global, record) in page {
            let event = documents::event_line(&record);
            out.insert(
                global as i64,
                record_hash(
                    &record.run_id.to_string(),
                    record.seq as i64,
                    record.time_ms as i64,
                    record.event.name(),
                    &event,
                ),
            );
        }
    }
    out
}

/// What the server holds of the home's journal: global seq → hash, and the count of rows
/// (equal to the map's size unless a global seq appears twice).
pub(crate) fn server_hashes(cluster: &PgCluster, journal_id: &str) -> (BTreeMap<i64, String>, i64) {
    let mut client = cluster.client();
    let rows = client
        .query(
            "SELECT global_seq, run_id, seq, time_ms, event_type, event FROM runjournal_records
             WHERE journal_id = $1 ORDER BY global_seq",
            &[&journal_id],
        )
        .expect("the records read");
    let count = rows.len() as i64;
    let map = rows
        .iter()
        .map(|row| {
            let event: Value = row.get(5);
            (
                row.get::<_, i64>(0),
                record_hash(row.get(1), row.get(2), row.get(3), row.get(4), &event),
            )
        })
        .collect();
    (map, count)
}

pub(crate) fn journal_id(home: &Home) -> String {
    let reader = runjournal::JournalReader::open(home.journal_path()).expect("the journal opens");
    let meta = reader.view().expect("a view").meta().expect("meta");
    runjournal::ship::journal_id_text(&meta.journal_id)
}

pub(crate) fn shipped_through(cluster: &PgCluster, journal_id: &str) -> Option<i64> {
    let mut client = cluster.client();
    let row = client
        .query_opt(
            "SELECT shipped_through FROM runjournal_journals WHERE journal_id = $1",
            &[&journal_id],
        )
        .ok()??;
    Some(row.get(0))
}

pub(crate) fn global_head(home: &Home) -> i64 {
    let reader = runjournal::JournalReader::open(home.journal_path()).expect("the journal opens");
    reader.view().expect("a view").global_head().expect("head") as i64
}

fn runjournal(home: &Home) -> Command {
    let mut command = Command::new(assert_cmd::cargo::cargo_bin!("runjournal"));
    command
        .env_remove("RUNJOURNAL_HOME")
        .env_remove("RUNJOURNAL_SHIP_URL")
        // No password from the environment of whoever runs the tests.
        .env_remove("PGPASSWORD")
        .env("PGPASSFILE", home.root().join("no-password-file"))
        .arg("--home")
        .arg(home.root());
    command
}

fn ship_once(home: &Home, url: &str) -> String {
    let output = runjournal(home)
        .args(["ship", "--once", "--to", url])
        .output()
        .expect("runjournal ship runs");
    assert!(
        output.status.success(),
        "ship --once failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Exactly the journal's records: the same global seqs (no gap, no duplicate, nothing else)
/// with the same content, and every run's row at the run's head.
fn assert_server_matches(cluster: &PgCluster, home: &Home) {
    let id = journal_id(home);
    let local = local_hashes(home);
    let (server, count) = server_hashes(cluster, &id);
    assert_eq!(count, local.len() as i64, "one row per record");
    let expected: Vec<i64> = (1..=local.len() as i64).collect();
    assert_eq!(local.keys().copied().collect::<Vec<_>>(), expected);
    assert_eq!(
        server.keys().copied().collect::<Vec<_>>(),
        expected,
        "no gap, nothing extra"
    );
    for (global, hash) in &local {
        assert_eq!(
            server.get(global),
            Some(hash),
            "record at global seq {global}"
        );
    }
    assert_eq!(shipped_through(cluster, &id), Some(local.len() as i64));
    let reader = runjournal::JournalReader::open(home.journal_path()).expect("the journal opens");
    let view = reader.view().expect("a view");
    let mut client = cluster.client();
    let runs = view.all_runs().expect("runs");
    let rows = client
        .query(
            "SELECT run_id, head_seq, state, status FROM runjournal_runs WHERE journal_id = $1",
            &[&id],
        )
        .expect("runs read");
    assert_eq!(rows.len(), runs.len(), "one row per run");
    for row in rows {
        let run: RunId = row.get::<_, String>(0).parse().expect("a run id");
        let state = view
            .snapshot(run)
            .expect("a snapshot")
            .expect("the run exists");
        assert_eq!(
            row.get::<_, i64>(1),
            state.head_seq as i64,
            "run {run}'s head"
        );
        assert_eq!(row.get::<_, String>(2), state.status.as_str());
        let status: Value = row.get(3);
        assert_eq!(status["runId"], Value::from(run.to_string()));
    }
}

/// Kills the child on drop, so a failing test leaves no shipper behind.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[cfg(feature = "ship")]
#[test]
fn a_shipped_journal_is_on_the_server_exactly_and_shipping_again_changes_nothing() {
    let Some(cluster) = PgCluster::start("ship_once") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let home = Home::at(dir.path().join("home"));
    let store = Store::open(home.clone()).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for _ in 0..5 {
        record_run(&store, 12, &mut rng);
    }
    let head = global_head(&home);
    let said = ship_once(&home, &cluster.url());
    assert!(
        said.starts_with(&format!("shipped {head} records in 1 batch to postgres@")),
        "{said}"
    );
    assert_server_matches(&cluster, &home);

    // Nothing new: nothing sent.
    let said = ship_once(&home, &cluster.url());
    assert!(said.starts_with("shipped 0 records in 0 batches"), "{said}");

    // The same batches sent again (the cursor set back on the server, as a restore from an
    // old backup would): the conflict rule keeps every row as it was, once.
    let id = journal_id(&home);
    cluster
        .client()
        .execute(
            "UPDATE runjournal_journals SET shipped_through = 0 WHERE journal_id = $1",
            &[&id],
        )
        .unwrap();
    let said = ship_once(&home, &cluster.url());
    assert!(
        said.starts_with(&format!("shipped {head} records")),
        "{said}"
    );
    assert_server_matches(&cluster, &home);

    // Records added later follow, in small batches.
    record_run(&store, 30, &mut rng);
    let output = runjournal(&home)
        .args([
            "ship",
            "--once",
            "--batch-records",
            "7",
            "--to",
            &cluster.url(),
        ])
        .output()
        .unwrap();
    assert!(output.status.success());
    let new_head = global_head(&home);
    let said = String::from_utf8_lossy(&output.stdout);
    let batches = (new_head - head + 6) / 7;
    assert!(
        said.starts_with(&format!(
            "shipped {} records in {batches} batches",
            new_head - head
        )),
        "{said}"
    );
    assert_server_matches(&cluster, &home);

    // The state file reports it, and there is nothing to say in `status`.
    let state = state::read(&home).expect("the shipper wrote its state");
    assert_eq!(state.shipped_through, new_head as u64);
    assert_eq!(state.failing_since_ms, None);
}

#[cfg(feature = "ship")]
#[test]
fn a_shipper_killed_at_random_moments_ships_every_record_exactly_once() {
    let Some(cluster) = PgCluster::start("ship_crash") else {
        return;
    };
    let kills: u32 = std::env::var("RUNJOURNAL_SHIP_KILLS")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(100);
    let seed: u64 = std::env::var("RUNJOURNAL_SHIP_SEED")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("ship_crash: seed {seed} (RUNJOURNAL_SHIP_SEED), {kills} kills");
    let dir = tempfile::tempdir().unwrap();
    let home = Home::at(dir.path().join("home"));
    let store = Arc::new(Store::open(home.clone()).unwrap());
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    record_run(&store, 20, &mut rng);

    // Runs are recorded all along, as on a busy host.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (store, stop) = (Arc::clone(&store), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x5eed);
            let mut runs = 0u32;
            while !stop.load(Ordering::Relaxed) && runs < 2000 {
                record_run(&store, rng.random_range(1..25), &mut rng);
                runs += 1;
            }
        })
    };

    let id = journal_id(&home);
    let mut moved_while_killing = 0u32;
    let mut last_through = 0i64;
    for _ in 0..kills {
        let child = runjournal(&home)
            .args(["ship", "--batch-records", "16", "--poll-interval", "5ms"])
            .args(["--heartbeat-interval", "20ms", "--to", &cluster.url()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the shipper starts");
        let mut child = ChildGuard(child);
        std::thread::sleep(Duration::from_millis(rng.random_range(0..150)));
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.0.id() as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .expect("SIGKILL");
        let status = child.0.wait().expect("the shipper is reaped");
        assert!(
            status.code().is_none(),
            "the shipper died of the signal, not on its own: {status}"
        );
        let through = shipped_through(&cluster, &id).unwrap_or(0);
        if through > last_through {
            moved_while_killing += 1;
            last_through = through;
        }
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().expect("the writer thread");
    assert!(
        moved_while_killing > 0,
        "the shipper never committed a batch between kills: the test killed nothing that mattered"
    );
    eprintln!("ship_crash: the cursor moved during {moved_while_killing} of {kills} shipper lives");

    ship_once(&home, &cluster.url());
    assert_server_matches(&cluster, &home);
}

#[cfg(feature = "ship")]
#[test]
fn postgres_stopped_mid_ship_delays_shipping_and_says_so_but_local_work_goes_on() {
    let Some(cluster) = PgCluster::start("ship_server_restart") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let home = Home::at(dir.path().join("home"));
    let store = Store::open(home.clone()).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    record_run(&store, 10, &mut rng);
    let id = journal_id(&home);
    let shipper = runjournal(&home)
        .args(["ship", "--poll-interval", "20ms", "--to", &cluster.url()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the shipper starts");
    let _shipper = ChildGuard(shipper);
    poll_until("the shipper caught up", || {
        shipped_through(&cluster, &id) == Some(global_head(&home))
    });
    let caught_up = global_head(&home);

    cluster.stop();
    // Local work does not wait for the server: whole runs are recorded while it is down.
    let mut appended = 0;
    for _ in 0..3 {
        appended += record_run(&store, 8, &mut rng);
    }
    assert_eq!(global_head(&home), caught_up + appended as i64);
    poll_until("the shipper reported the failure", || {
        state::read(&home).is_some_and(|state| state.failing_since_ms.is_some())
    });
    let run = store
        .journal()
        .view()
        .unwrap()
        .all_runs()
        .unwrap()
        .into_iter()
        .last()
        .unwrap();
    let status = runjournal(&home)
        .args(["status", &run.to_string()])
        .output()
        .unwrap();
    assert!(status.status.success());
    let text = String::from_utf8_lossy(&status.stdout);
    let line = text
        .lines()
        .find(|line| line.starts_with("shipping "))
        .unwrap_or_else(|| panic!("no shipping line in:\n{text}"));
    assert!(
        line.starts_with(&format!("shipping {appended} records behind since ")),
        "{line}"
    );
    assert!(line.contains("PostgreSQL at postgres@"), "{line}");
    let list = runjournal(&home).arg("list").output().unwrap();
    assert!(
        String::from_utf8_lossy(&list.stdout)
            .lines()
            .any(|line| line.starts_with(&format!("shipping {appended} records behind"))),
        "list says it too"
    );

    cluster.start_server();
    poll_until("the shipper caught up after the restart", || {
        shipped_through(&cluster, &id) == Some(global_head(&home))
    });
    poll_until("the shipper reported recovery", || {
        state::read(&home).is_some_and(|state| state.failing_since_ms.is_none())
    });
    assert_server_matches(&cluster, &home);
    let status = runjournal(&home)
        .args(["status", &run.to_string()])
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&status.stdout).contains("shipping "),
        "no line once shipping keeps up"
    );
}

#[cfg(feature = "ship")]
#[test]
fn a_bad_url_is_a_usage_error_and_no_url_is_one_too() {
    let dir = tempfile::tempdir().unwrap();
    let home = Home::at(dir.path().join("home"));
    for args in [
        vec!["ship", "--once", "--to", "mysql://db/x"],
        vec![
            "ship",
            "--once",
            "--to",
            "postgresql://db/x?sslmode=verify-ca",
        ],
        vec!["ship", "--once"],
    ] {
        let output = runjournal(&home).args(&args).output().unwrap();
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    }
    assert!(!home.journal_path().exists(), "nothing was written");
}

#[cfg(feature = "ship")]
#[test]
fn a_schema_of_a_later_version_is_refused_with_a_clear_line_and_nothing_written() {
    let Some(cluster) = PgCluster::start("ship_schema_newer") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let home = Home::at(dir.path().join("home"));
    let store = Store::open(home.clone()).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    record_run(&store, 2, &mut rng);
    ship_once(&home, &cluster.url());
    cluster
        .client()
        .execute("INSERT INTO runjournal_schema (version) VALUES (99)", &[])
        .unwrap();
    record_run(&store, 2, &mut rng);
    let output = runjournal(&home)
        .args(["ship", "--once", "--to", &cluster.url()])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("its runjournal schema is version 99; this build knows version 1"),
        "{stderr}"
    );
    let state = state::read(&home).expect("the failure is reported");
    assert!(state.failing_since_ms.is_some());
    assert!(state.last_error.unwrap_or_default().contains("version 99"));
    let id = journal_id(&home);
    let (server, _) = server_hashes(&cluster, &id);
    assert!(
        (server.len() as i64) < global_head(&home),
        "nothing more was shipped into a schema this build does not know"
    );
}
