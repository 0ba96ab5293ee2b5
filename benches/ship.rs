//! Shipping rate: a 100,000-record journal shipped into a fresh PostgreSQL database
//! by `runjournal::ship::Shipper`, against PostgreSQL's own insert rate for the same record
//! rows (the same batched `INSERT ... SELECT FROM unnest(...)` of 1,000 rows a transaction into
//! a table of the same shape, rows already in memory), measured in the same run, in alternating
//! rounds, on a throwaway cluster that fsyncs its commits.
//!
//! `cargo bench --bench ship` prints the table and writes `target/bench-ship-report.md`.
//! Without PostgreSQL's server binaries it says so and exits 0.

// A benchmark's workload and its report read top to bottom: the bound on a function's length
// is for the library.
#![allow(clippy::too_many_lines)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use runjournal::event::{Event, ExternalJobStatus, JobState, Mode, RunId, RunSpec, now_ms};
use runjournal::journal::Condition;
use runjournal::ship::rows::{self, RecordRow};
use runjournal::ship::{ShipOptions, Shipper, Target};
use runjournal::testkit::{self as kit, pg_cluster::PgCluster};
use runjournal::{Home, Journal, JournalReader};

/// Runs of ten records each: 100,000 records.
const RUNS: usize = 10_000;
const RECORDS_PER_RUN: usize = 10;
const BATCH_RECORDS: usize = 1_000;
const ROUNDS: usize = 3;

/// A run's ten records: created, started, step running, four job updates, finished, terminal,
/// seen gone.
fn lifecycle() -> Vec<Event> {
    let spec = RunSpec {
        name: Some("deploy-staging".to_string()),
        timeout_ms: Some(600_000),
        cwd: Some("/srv/app".to_string()),
        ..kit::spec(
            Mode::Single,
            vec![kit::step(
                "deploy",
                kit::provider("./deploy-provider.sh --env staging"),
            )],
        )
    };
    let hosts = kit::hosts(Some("session-7f3a9c"), None, None);
    let mut events = vec![
        kit::created(spec, now_ms(), hosts),
        kit::runner_started(kit::uuid_boot_identity(4242), "runner-4242-1"),
        kit::step_running(0, Some(kit::uuid_boot_identity(4243))),
    ];
    for progress in [10.0, 40.0, 70.0, 95.0] {
        let job = ExternalJobStatus {
            message: Some("uploading artifacts to the staging bucket".to_string()),
            url: Some("https://ci.example.com/jobs/5f2e8a61".to_string()),
            ..kit::job(JobState::Running, "job-5f2e8a61", Some(progress))
        };
        events.push(kit::job_updated(0, job));
    }
    events.extend([
        kit::step_complete(0),
        kit::completed("deployed"),
        kit::runner_exited("runner-4242-1", 0),
    ]);
    assert_eq!(events.len(), RECORDS_PER_RUN);
    events
}

/// A home whose journal holds `RUNS` closed runs, cached under `target/bench-fixtures`.
fn home(cache: &std::path::Path) -> Home {
    let home = Home::at(cache.join(format!("ship-home-{RUNS}x{RECORDS_PER_RUN}")));
    if let Ok(reader) = JournalReader::open(home.journal_path())
        && reader
            .view()
            .and_then(|view| view.global_head())
            .is_ok_and(|head| head == (RUNS * RECORDS_PER_RUN) as u64)
    {
        return home;
    }
    let _ = std::fs::remove_dir_all(home.root());
    std::fs::create_dir_all(home.root()).expect("the fixture home can be made");
    let journal = Journal::open(home.journal_path()).expect("a new journal opens");
    for _ in 0..RUNS / 1000 {
        let batches =
            (0..1000).map(|_| (RunId::generate(), lifecycle(), Condition::expect_head(0)));
        for result in journal.append_all(batches) {
            result.expect("a closed lifecycle is a legal batch");
        }
    }
    home
}

fn record_rows(home: &Home) -> Vec<RecordRow> {
    let reader = JournalReader::open(home.journal_path()).expect("the fixture opens");
    let view = reader.view().expect("a view");
    let mut out = Vec::new();
    let mut cursor = 0;
    loop {
        let page = view.records_after(cursor, 10_000).expect("the log reads");
        let Some((last, _)) = page.last() else { break };
        cursor = *last;
        for (global, record) in &page {
            out.push(rows::record_row(*global, record).expect("a record row"));
        }
    }
    out
}

/// PostgreSQL alone: the rows, already in memory, in 1,000-row transactions.
fn insert_baseline(client: &mut postgres::Client, rows: &[RecordRow]) -> Duration {
    client
        .batch_execute(
            "DROP TABLE IF EXISTS baseline_records;
             CREATE TABLE baseline_records (
                 journal_id text NOT NULL, global_seq bigint NOT NULL, run_id text NOT NULL,
                 seq bigint NOT NULL, time_ms bigint NOT NULL, event_type text NOT NULL,
                 event jsonb NOT NULL, PRIMARY KEY (journal_id, global_seq));
             CREATE INDEX ON baseline_records (journal_id, run_id, seq);",
        )
        .expect("the baseline table");
    let insert = client
        .prepare(
            "INSERT INTO baseline_records
             SELECT $1::text, g, r, s, t, y, e
             FROM unnest($2::bigint[], $3::text[], $4::bigint[], $5::bigint[], $6::text[],
                         $7::jsonb[]) AS batch (g, r, s, t, y, e)
             ON CONFLICT (journal_id, global_seq) DO NOTHING",
        )
        .expect("prepared");
    let journal = "baseline".to_string();
    let started = Instant::now();
    for chunk in rows.chunks(BATCH_RECORDS) {
        let globals: Vec<i64> = chunk.iter().map(|row| row.global_seq).collect();
        let runs: Vec<&str> = chunk.iter().map(|row| row.run_id.as_str()).collect();
        let seqs: Vec<i64> = chunk.iter().map(|row| row.seq).collect();
        let times: Vec<i64> = chunk.iter().map(|row| row.time_ms).collect();
        let types: Vec<&str> = chunk.iter().map(|row| row.event_type.as_str()).collect();
        let events: Vec<&serde_json::Value> = chunk.iter().map(|row| &row.event).collect();
        let mut transaction = client.transaction().expect("begin");
        transaction
            .execute(
                &insert,
                &[&journal, &globals, &runs, &seqs, &times, &types, &events],
            )
            .expect("the baseline batch");
        transaction.commit().expect("commit");
    }
    started.elapsed()
}

fn ship_into(cluster: &PgCluster, home: &Home, database: &str) -> (Duration, u64) {
    cluster.create_database(database);
    let target = Target::parse(&cluster.url_of(database)).expect("the URL parses");
    let mut options = ShipOptions::new(target, "bench-host");
    options.batch_records = BATCH_RECORDS;
    let mut shipper = Shipper::new(home.clone(), options);
    let started = Instant::now();
    let report = shipper.pass().expect("the journal ships");
    let elapsed = started.elapsed();
    assert_eq!(report.records_shipped, (RUNS * RECORDS_PER_RUN) as u64);
    (elapsed, report.batches)
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    // `cargo bench` passes filters and `--bench`; this bench has one workload and takes none.
    let Some(cluster) = PgCluster::start_durable("bench ship") else {
        return;
    };
    let target_dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .map(PathBuf::from)
        .expect("target/tmp has a parent");
    let started = Instant::now();
    let home = home(&target_dir.join("bench-fixtures"));
    eprintln!("fixture ready in {:.1} s", started.elapsed().as_secs_f64());
    let rows = record_rows(&home);
    let records = rows.len() as f64;
    let mut baseline_client = cluster.client();
    let (mut ship_rates, mut base_rates, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    let mut batches = 0;
    for round in 0..ROUNDS {
        let base = insert_baseline(&mut baseline_client, &rows);
        let (ship, shipped_batches) = ship_into(&cluster, &home, &format!("round{round}"));
        batches = shipped_batches;
        let ship_rate = records / ship.as_secs_f64();
        let base_rate = records / base.as_secs_f64();
        eprintln!(
            "round {round}: shipper {ship_rate:.0} records/s, PostgreSQL alone {base_rate:.0} rows/s"
        );
        ship_rates.push(ship_rate);
        base_rates.push(base_rate);
        ratios.push(ship_rate / base_rate);
    }
    let (low, high) = ratios
        .iter()
        .fold((f64::MAX, f64::MIN), |(low, high), ratio| {
            (low.min(*ratio), high.max(*ratio))
        });
    let ratio = median(&mut ratios);
    let mut client = postgres::Client::connect(&cluster.url_of("round0"), postgres::NoTls)
        .expect("connect to the last round's database");
    let bytes: i64 = client
        .query_one(
            "SELECT pg_total_relation_size('runjournal_records')
                  + pg_total_relation_size('runjournal_runs')",
            &[],
        )
        .expect("sizes")
        .get(0);
    let report = format!(
        "**Shipping** a journal of {records:.0} records ({RUNS} closed runs of {RECORDS_PER_RUN} records) into a fresh PostgreSQL database, {BATCH_RECORDS} records a transaction ({batches} transactions), against PostgreSQL inserting the same record rows alone (already in memory, same statement, same batches, same indexes; no run rows, no cursor). The server fsyncs its commits; {ROUNDS} alternating rounds, medians.\n\n\
| way | records/s | × PostgreSQL alone | target |\n|---|---|---|---|\n\
| PostgreSQL alone: the same rows, `INSERT ... SELECT FROM unnest(...)` | {:.0} | 1.00× | |\n\
| `runjournal ship`: read the log, fold runs, records + runs + cursor per transaction | {:.0} | {ratio:.2}× ({low:.2}–{high:.2}) | ≥ 0.5×: **{}** |\n\n\
On the server: {:.0} bytes per shipped record (records and runs tables with their indexes).\n",
        median(&mut base_rates),
        median(&mut ship_rates),
        if ratio >= 0.5 { "met" } else { "missed" },
        bytes as f64 / records,
    );
    print!("{report}");
    let path = target_dir.join("bench-ship-report.md");
    if let Err(error) = std::fs::write(&path, &report) {
        eprintln!("writing {}: {error}", path.display());
    }
}
