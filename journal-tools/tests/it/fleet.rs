//! `journal-tools --from URL` and `inspect verify --against URL` against a real PostgreSQL
//! (a throwaway cluster per test): two homes shipped into one database, listed together; a
//! silent host; a deleted, an altered and an extra row caught.

use std::collections::BTreeMap;

use runjournal::Home;
use runjournal::HostIds;
use runjournal::event::{Event, JobState, Mode, RunSpec};
use runjournal::ship::{ShipOptions, Shipper, Target};
use runjournal::testkit::pg_cluster::PgCluster;
use runjournal::testkit::{
    identity, job, job_updated, provider, runner_started, spec, step, step_running,
};
use runjournal::{Condition, Store};
use serde_json::Value;

use crate::common::{Fixture, fixture, json_lines, run, tool, tool_at};

fn ship(home: &Home, url: &str, host: &str) -> u64 {
    let target = Target::parse(url).expect("the test URL parses");
    let mut shipper = Shipper::new(home.clone(), ShipOptions::new(target, host));
    shipper.pass().expect("the journal ships").records_shipped
}

fn from(url: &str, args: &[&str]) -> assert_cmd::Command {
    let mut command = tool();
    command
        .env_remove("JOURNAL_TOOLS_FROM")
        .env_remove("PGPASSWORD")
        .arg("--from")
        .arg(url)
        .args(args);
    command
}

fn record_count(fixture: &Fixture) -> u64 {
    let reader = runjournal::JournalReader::open(fixture.journal_path()).unwrap();
    reader.view().unwrap().record_count().unwrap()
}

#[test]
fn two_hosts_shipping_into_one_database_are_listed_together() {
    let Some(cluster) = PgCluster::start("fleet_two_hosts") else {
        return;
    };
    cluster.create_database("fleet");
    let url = cluster.url_of("fleet");
    let (a, b) = (fixture(), fixture());
    // A long external job on host-b: enough records that the fleet's events come in more
    // than one page.
    let store = Store::open(b.home.clone()).unwrap();
    let long = store
        .create_run(
            RunSpec {
                name: Some("long".to_string()),
                ..spec(Mode::Single, vec![step("upload", provider("uploader"))])
            },
            HostIds::default(),
        )
        .unwrap()
        .run;
    store
        .append(
            long,
            vec![
                runner_started(identity(400), "runner-d"),
                step_running(0, None),
            ],
            Condition::none(),
        )
        .unwrap();
    for batch in 0..11 {
        let updates = (0..100)
            .map(|index| {
                job_updated(
                    0,
                    job(
                        JobState::Running,
                        "job",
                        Some(f64::from(batch * 100 + index)),
                    ),
                )
            })
            .collect();
        store.append(long, updates, Condition::none()).unwrap();
    }
    drop(store);
    assert_eq!(ship(&a.home, &url, "host-a"), record_count(&a));
    assert_eq!(ship(&b.home, &url, "host-b"), record_count(&b));

    let ran = run(from(&url, &["--json", "inspect", "runs"]));
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let objects = json_lines(&ran.stdout);
    let mut per_host: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for object in objects.iter().filter(|object| object["type"] == "run") {
        assert_eq!(object["journalId"].as_str().map(str::len), Some(32));
        assert_eq!(
            object["hostSilentSinceMs"],
            Value::Null,
            "both hosts beat just now"
        );
        per_host
            .entry(object["host"].as_str().unwrap().to_string())
            .or_default()
            .push(object["runId"].as_str().unwrap().to_string());
    }
    let expected = |fixture: &Fixture| {
        let mut runs = vec![
            fixture.failed.to_string(),
            fixture.complete.to_string(),
            fixture.running.to_string(),
        ];
        runs.sort();
        runs
    };
    for runs in per_host.values_mut() {
        runs.sort();
    }
    assert_eq!(per_host.get("host-a"), Some(&expected(&a)));
    let mut expected_b = expected(&b);
    expected_b.push(long.to_string());
    expected_b.sort();
    assert_eq!(per_host.get("host-b"), Some(&expected_b));
    assert_eq!(objects.last().unwrap()["journals"], Value::from(2));

    let ran = run(from(&url, &["inspect", "runs"]));
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let header = ran.stdout.lines().next().unwrap();
    assert_eq!(
        header.split_whitespace().take(3).collect::<Vec<_>>(),
        ["HOST", "JOURNAL", "RUN"],
        "{header}"
    );
    assert_eq!(
        ran.stdout
            .lines()
            .filter(|line| line.starts_with("host-a "))
            .count(),
        3
    );
    assert_eq!(
        ran.stdout
            .lines()
            .filter(|line| line.starts_with("host-b "))
            .count(),
        4
    );

    // One run, folded from its shipped records, with its host.
    let prefix = &a.failed.to_string()[..12];
    let ran = run(from(&url, &["inspect", "run", prefix]));
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let has_line = |text: &str, words: &[&str]| {
        text.lines()
            .any(|line| line.split_whitespace().collect::<Vec<_>>() == words)
    };
    assert!(has_line(&ran.stdout, &["host", "host-a"]), "{}", ran.stdout);
    assert!(
        has_line(&ran.stdout, &["state", "failed", "(closed)"]),
        "{}",
        ran.stdout
    );
    assert!(
        ran.stdout.contains("pid 100, on its host,"),
        "{}",
        ran.stdout
    );
    let local = run(tool_at(&a, &["inspect", "run", prefix]));
    let timeline = |text: &str| {
        text.split("timeline")
            .nth(1)
            .unwrap_or_default()
            .to_string()
    };
    assert_eq!(
        timeline(&ran.stdout),
        timeline(&local.stdout),
        "the same timeline as local"
    );

    // Events of both journals; stats per journal.
    let ran = run(from(&url, &["--json", "inspect", "events"]));
    let events = json_lines(&ran.stdout);
    assert_eq!(
        events
            .iter()
            .filter(|object| object["type"] == "event")
            .count() as u64,
        record_count(&a) + record_count(&b)
    );
    let ran = run(from(
        &url,
        &["--json", "inspect", "events", "--limit", "1050"],
    ));
    let events = json_lines(&ran.stdout);
    assert_eq!(events.len(), 1051, "1,050 events and the summary");
    let mut seen = std::collections::HashSet::new();
    for event in events.iter().filter(|object| object["type"] == "event") {
        let key = (
            event["journalId"].to_string(),
            event["globalSeq"].to_string(),
        );
        assert!(seen.insert(key), "no event twice across pages: {event}");
    }
    let ran = run(from(&url, &["--json", "inspect", "stats"]));
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let stats = json_lines(&ran.stdout);
    let journals: Vec<&Value> = stats.iter().filter(|o| o["type"] == "journal").collect();
    assert_eq!(journals.len(), 2);
    for journal in journals {
        let is_b = journal["host"] == "host-b";
        assert_eq!(journal["runs"], Value::from(if is_b { 4 } else { 3 }));
        assert_eq!(
            journal["runsOpen"],
            Value::from(if is_b { 2 } else { 1 }),
            "running runs"
        );
        assert_eq!(journal["shippedThrough"], journal["records"]);
    }

    // host-b goes silent: its open run shows it; its closed runs and host-a's do not.
    let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    client
        .execute(
            "UPDATE runjournal_journals SET heartbeat_at = now() - interval '1 hour'
             WHERE host_name = 'host-b'",
            &[],
        )
        .unwrap();
    let ran = run(from(&url, &["--json", "inspect", "runs"]));
    let silent: Vec<(String, String)> = json_lines(&ran.stdout)
        .iter()
        .filter(|object| object["type"] == "run" && !object["hostSilentSinceMs"].is_null())
        .map(|object| {
            (
                object["host"].as_str().unwrap().to_string(),
                object["runId"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let mut expected_silent = vec![
        ("host-b".to_string(), b.running.to_string()),
        ("host-b".to_string(), long.to_string()),
    ];
    expected_silent.sort();
    let mut silent = silent;
    silent.sort();
    assert_eq!(silent, expected_silent);
    let ran = run(from(&url, &["inspect", "runs"]));
    let line = ran
        .stdout
        .lines()
        .find(|line| line.contains(&b.running.to_string()))
        .unwrap();
    assert!(line.contains("host silent since "), "{line}");
    assert!(
        line.contains("running"),
        "the run is not closed by anyone else: {line}"
    );
    let ran = run(from(&url, &["--silent-after", "2h", "inspect", "runs"]));
    assert!(
        !ran.stdout.contains("host silent"),
        "a longer threshold: not silent"
    );
    let ran = run(from(&url, &["inspect", "stats"]));
    assert!(
        ran.stdout
            .lines()
            .any(|line| line.starts_with("host-b") && line.contains("silent since")),
        "{}",
        ran.stdout
    );
}

#[test]
fn verify_against_catches_a_deleted_an_altered_and_an_extra_row() {
    let Some(cluster) = PgCluster::start("fleet_verify_against") else {
        return;
    };
    let url = cluster.url();
    let a = fixture();
    ship(&a.home, &url, "host-a");
    let verify = || run(tool_at(&a, &["inspect", "verify", "--against", &url]));
    let ran = verify();
    assert_eq!(ran.code, 0, "{}{}", ran.stdout, ran.stderr);
    assert!(ran.stdout.contains(": no differences"), "{}", ran.stdout);

    // A record committed after the last shipment is not a difference.
    let store = Store::open(a.home.clone()).unwrap();
    store
        .append(
            a.complete,
            vec![Event::Dismissed { at_ms: 5 }],
            Condition::none(),
        )
        .unwrap();
    drop(store);
    let ran = verify();
    assert_eq!(ran.code, 0, "{}{}", ran.stdout, ran.stderr);
    assert!(ran.stdout.contains("1 not shipped yet"), "{}", ran.stdout);

    let id = {
        let reader = runjournal::JournalReader::open(a.journal_path()).unwrap();
        let meta = reader.view().unwrap().meta().unwrap();
        runjournal::ship::journal_id_text(&meta.journal_id)
    };
    let mut client = cluster.client();
    client
        .execute(
            "DELETE FROM runjournal_records WHERE journal_id = $1 AND global_seq = 3",
            &[&id],
        )
        .unwrap();
    client
        .execute(
            "UPDATE runjournal_records SET event = jsonb_set(event, '{ts}', '1')
             WHERE journal_id = $1 AND global_seq = 5",
            &[&id],
        )
        .unwrap();
    client
        .execute(
            "INSERT INTO runjournal_records
             SELECT journal_id, 9999, run_id, seq, time_ms, event_type, event
             FROM runjournal_records WHERE journal_id = $1 AND global_seq = 1",
            &[&id],
        )
        .unwrap();
    let ran = verify();
    assert_eq!(ran.code, 1, "{}{}", ran.stdout, ran.stderr);
    assert!(
        ran.stdout
            .contains("(global seq 3) is missing on the server"),
        "{}",
        ran.stdout
    );
    assert!(
        ran.stdout.contains("(global seq 5) differs on the server"),
        "{}",
        ran.stdout
    );
    assert!(
        ran.stdout.contains("event.ts: 1 on the server, "),
        "{}",
        ran.stdout
    );
    assert!(
        ran.stdout
            .contains("at global seq 9999 but not in the journal"),
        "{}",
        ran.stdout
    );
    assert!(
        ran.stdout.contains("1 missing, 1 extra, 1 different"),
        "{}",
        ran.stdout
    );

    let ran = run(tool_at(
        &a,
        &["--json", "inspect", "verify", "--against", &url],
    ));
    assert_eq!(ran.code, 1);
    let objects = json_lines(&ran.stdout);
    let summary = objects.last().unwrap();
    assert_eq!(summary["missing"], Value::from(1));
    assert_eq!(summary["different"], Value::from(1));
    assert_eq!(summary["extra"], Value::from(1));
    assert_eq!(summary["notYetShipped"], Value::from(1));
    assert!(
        objects
            .iter()
            .filter(|object| object["type"] == "problem")
            .all(|object| object["kind"] == "shipped")
    );
}

#[test]
fn fleet_commands_refuse_what_they_cannot_do() {
    let a = fixture();
    for args in [
        vec![
            "--from",
            "postgresql:///x?host=/nonexistent",
            "replay",
            "--all",
        ],
        vec![
            "--from",
            "postgresql:///x?host=/nonexistent",
            "inspect",
            "verify",
        ],
        vec!["--from", "mysql://db/x", "inspect", "runs"],
        vec![
            "--from",
            "postgresql:///x?host=/nonexistent",
            "inspect",
            "events",
            "--follow",
        ],
        vec![
            "inspect",
            "verify",
            "--against",
            "postgresql://db/x?sslmode=verify-ca",
        ],
    ] {
        let ran = run(tool_at(&a, &args));
        assert_eq!(ran.code, 2, "{args:?}: {}", ran.stderr);
        assert_eq!(ran.stderr.lines().count(), 1, "{args:?}: {}", ran.stderr);
    }
    // A server that is not there: exit 2, the line names it.
    let ran = run(tool_at(
        &a,
        &[
            "--from",
            "postgresql:///x?host=/nonexistent&connect_timeout=2",
            "inspect",
            "runs",
        ],
    ));
    assert_eq!(ran.code, 2, "{}", ran.stderr);
    assert!(ran.stderr.contains("PostgreSQL at "), "{}", ran.stderr);
}

#[test]
fn tampered_fleet_rows_are_an_error_naming_table_and_column_not_a_panic() {
    let Some(cluster) = PgCluster::start("fleet_tampered_rows") else {
        return;
    };
    let url = cluster.url();
    let a = fixture();
    ship(&a.home, &url, "host-a");
    let ran = run(from(&url, &["inspect", "runs"]));
    assert_eq!(ran.code, 0, "{}{}", ran.stdout, ran.stderr);
    let mut client = cluster.client();
    let inspect_fails_naming = |args: &[&str], named: &str| {
        let ran = run(from(&url, args));
        assert_eq!(ran.code, 1, "{args:?}: {}{}", ran.stdout, ran.stderr);
        assert!(ran.stderr.contains(named), "{args:?}: {}", ran.stderr);
        assert!(!ran.stderr.contains("panicked"), "{}", ran.stderr);
    };

    // A NULL where the shipper always writes a value.
    client
        .batch_execute(
            "ALTER TABLE runjournal_runs ALTER COLUMN state DROP NOT NULL;
             UPDATE runjournal_runs SET state = NULL",
        )
        .unwrap();
    let null = "column state of runjournal_runs is NULL where a value is required";
    inspect_fails_naming(&["inspect", "runs"], null);
    inspect_fails_naming(&["inspect", "stats"], null);
    client
        .batch_execute("UPDATE runjournal_runs SET state = 'complete'")
        .unwrap();
    let ran = run(from(&url, &["inspect", "runs"]));
    assert_eq!(ran.code, 0, "mended: {}{}", ran.stdout, ran.stderr);

    // A column of another type.
    client
        .batch_execute("ALTER TABLE runjournal_runs ALTER COLUMN steps_done TYPE bigint")
        .unwrap();
    inspect_fails_naming(
        &["inspect", "runs"],
        "column steps_done of runjournal_runs has type int8",
    );
    client
        .batch_execute(
            "ALTER TABLE runjournal_journals ALTER COLUMN home TYPE bytea USING home::bytea;
             ALTER TABLE runjournal_records ALTER COLUMN event_type TYPE bytea
                 USING event_type::bytea",
        )
        .unwrap();
    inspect_fails_naming(
        &["inspect", "stats"],
        "column home of runjournal_journals has type bytea",
    );
    inspect_fails_naming(
        &["inspect", "events"],
        "column event_type of runjournal_records has type bytea",
    );
}

#[test]
fn more_runs_than_a_page_holds_are_each_listed_once_whatever_their_size() {
    let Some(cluster) = PgCluster::start("fleet_pages") else {
        return;
    };
    let url = cluster.url();
    let a = fixture();
    ship(&a.home, &url, "host-a");
    let mut client = cluster.client();
    let template = a.complete.to_string();
    // Copies of one run with the same creation time (so only the run id orders them), a few
    // of them large enough that a page's bytes run out before its rows do.
    let copies: Vec<String> = (0..1_100).map(|i| format!("01M8P9GC{i:018}")).collect();
    let large: Vec<String> = copies.iter().step_by(20).cloned().collect();
    client
        .execute(
            "INSERT INTO runjournal_runs
             SELECT (jsonb_populate_record(NULL::runjournal_runs,
                 to_jsonb(r) || jsonb_build_object('run_id', id, 'status',
                     CASE WHEN id = ANY($3) THEN r.status || jsonb_build_object('pad', repeat('x', 200000))
                          ELSE r.status END))).*
             FROM runjournal_runs r, unnest($1::text[]) AS id WHERE r.run_id = $2",
            &[&copies, &template, &large],
        )
        .unwrap();
    let total_runs: i64 = client
        .query_one("SELECT count(*) FROM runjournal_runs", &[])
        .unwrap()
        .get(0);
    assert!(total_runs > 1_100);
    let ran = run(from(&url, &["--json", "inspect", "runs"]));
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let listed: Vec<String> = json_lines(&ran.stdout)
        .iter()
        .filter(|object| object["type"] == "run")
        .map(|object| object["runId"].as_str().unwrap_or_default().to_string())
        .collect();
    let unique: std::collections::BTreeSet<&String> = listed.iter().collect();
    assert_eq!(listed.len() as i64, total_runs, "every run listed");
    assert_eq!(unique.len(), listed.len(), "none twice");
    let ran = run(from(&url, &["--json", "inspect", "runs", "--limit", "700"]));
    let limited = json_lines(&ran.stdout)
        .iter()
        .filter(|object| object["type"] == "run")
        .count();
    assert_eq!(limited, 700);
}

#[test]
fn the_fleet_url_may_come_from_the_environment_and_a_password_on_the_command_line_is_warned_about()
{
    let Some(cluster) = PgCluster::start("fleet_url_sources") else {
        return;
    };
    let url = cluster.url();
    let a = fixture();
    ship(&a.home, &url, "host-a");
    let socket = cluster.socket_dir().display().to_string();
    // The cluster trusts its socket, so the password is sent to no one; only where it was
    // written matters here.
    let with_password =
        format!("postgresql://postgres:not-on-argv@/postgres?host={socket}&sslmode=disable");
    let mut command = tool();
    command
        .env_remove("PGPASSWORD")
        .env("JOURNAL_TOOLS_FROM", &with_password)
        .args(["inspect", "runs"]);
    let ran = run(command);
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert!(ran.stdout.contains("host-a"), "{}", ran.stdout);
    assert!(!ran.stderr.contains("warning"), "{}", ran.stderr);

    let ran = run(from(&with_password, &["inspect", "runs"]));
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert!(
        ran.stderr
            .contains("warning: the --from URL holds a password"),
        "{}",
        ran.stderr
    );
    assert!(!ran.stderr.contains("not-on-argv"), "{}", ran.stderr);
    let ran = run(tool_at(
        &a,
        &["inspect", "verify", "--against", &with_password],
    ));
    assert_eq!(ran.code, 0, "{}{}", ran.stdout, ran.stderr);
    assert!(
        ran.stderr
            .contains("warning: the --against URL holds a password"),
        "{}",
        ran.stderr
    );
}

/// How long a fleet command may take before the test calls it hung: far above its bounds.
const HUNG_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

#[test]
fn a_server_that_accepts_and_never_speaks_ends_inspect_runs_within_its_connect_timeout() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a port on 127.0.0.1");
    let port = listener.local_addr().expect("its address").port();
    // Accepts every connection and keeps it open without a byte, as a hung server does.
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming().flatten() {
            held.push(stream);
        }
    });
    for url in [
        format!("postgresql://reader@127.0.0.1:{port}/fleet?sslmode=disable&connect_timeout=2"),
        // TLS asked for: the handshake's first step is what hangs.
        format!("postgresql://reader@127.0.0.1:{port}/fleet?connect_timeout=2"),
    ] {
        let mut command = from(&url, &["inspect", "runs"]);
        command.timeout(HUNG_AFTER);
        let ran = run(command);
        assert_eq!(ran.code, 2, "{url}: {}", ran.stderr);
        assert!(
            ran.stderr.contains("no answer to the connection") && ran.stderr.contains("within 2s"),
            "{url}: {}",
            ran.stderr
        );
    }
}

#[test]
fn a_fleet_table_locked_by_another_session_ends_inspect_runs_with_the_lock_timeout() {
    let Some(cluster) = PgCluster::start("fleet_locked_table") else {
        return;
    };
    let url = cluster.url();
    let a = fixture();
    ship(&a.home, &url, "host-a");
    let mut holder = cluster.client();
    let mut locked = holder.transaction().expect("a transaction");
    locked
        .batch_execute("LOCK TABLE runjournal_runs IN ACCESS EXCLUSIVE MODE")
        .expect("the lock is taken");
    // Its own bound from the URL, and the default one.
    for (url, bound) in [
        (format!("{url}&lock_timeout=1s"), "1s"),
        (url.clone(), "10s"),
    ] {
        let mut command = from(&url, &["inspect", "runs"]);
        command.timeout(HUNG_AFTER);
        let ran = run(command);
        assert_eq!(ran.code, 2, "{bound}: {}", ran.stderr);
        assert!(
            ran.stderr.contains("lock timeout") && ran.stderr.contains("SQLSTATE 55P03"),
            "{bound}: {}",
            ran.stderr
        );
    }
    locked.rollback().expect("the lock is let go");
    let ran = run(from(&url, &["inspect", "runs"]));
    assert_eq!(ran.code, 0, "{}", ran.stderr);
}

#[test]
fn a_row_of_a_hundred_and_fifty_megabytes_is_refused_naming_it_and_read_in_bounded_memory() {
    use std::os::unix::process::CommandExt;
    let Some(cluster) = PgCluster::start("fleet_oversized_row") else {
        return;
    };
    let url = cluster.url();
    let a = fixture();
    ship(&a.home, &url, "host-a");
    // A run's row whose status document someone made 150 MB (jsonb takes up to 255 MB).
    let mut client = cluster.client();
    client
        .execute(
            "UPDATE runjournal_runs
             SET status = jsonb_build_object('pad', repeat('x', 150000000))
             WHERE run_id = $1",
            &[&a.complete.to_string()],
        )
        .expect("the row is made large");
    // The reader may use 256 MiB of data at most: reading that row whole took about four
    // times its size.
    const DATA_BYTES_MAX: u64 = 256 << 20;
    let mut command = std::process::Command::new(assert_cmd::cargo::cargo_bin!("journal-tools"));
    command
        .env_remove("JOURNAL_TOOLS_FROM")
        .env_remove("PGPASSWORD")
        .args(["--from", &url, "inspect", "runs"]);
    // SAFETY: setrlimit is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        command.pre_exec(|| {
            nix::sys::resource::setrlimit(
                nix::sys::resource::Resource::RLIMIT_DATA,
                DATA_BYTES_MAX,
                DATA_BYTES_MAX,
            )
            .map_err(std::io::Error::from)
        });
    }
    let mut child = command
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("journal-tools starts");
    let started = std::time::Instant::now();
    while child.try_wait().expect("it is waited for").is_none() {
        assert!(
            started.elapsed() < HUNG_AFTER,
            "still running after {HUNG_AFTER:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let output = child.wait_with_output().expect("its output");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("run {} of journal", a.complete))
            && stderr.contains("column status of runjournal_runs holds a value of 150000")
            && stderr.contains("bytes, more than the 33554432 runjournal reads back"),
        "{stderr}"
    );
}
