//! Every wait on the server has a deadline: a server that accepts the connection and says
//! nothing, one that goes silent after the startup, and a table another session keeps locked
//! each end `ship --once` with exit 1 and a line that says what did not answer, instead of a
//! wait without end. The bounds asserted are generous (the machine is busy); what matters is
//! that the command returns at all.

use std::net::TcpListener;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use rand::SeedableRng;
use runjournal::testkit::pg_cluster::PgCluster;
use runjournal::{Home, Store};

use super::fake_pg::{Answer, FakePg};
use super::{record_run, runjournal, ship_once};

/// How long a command may take before the test calls it hung: far above every bound it has.
const HUNG_AFTER: Duration = Duration::from_secs(60);

/// Runs `command` to its end, or kills it and fails the test once it has run [`HUNG_AFTER`].
pub(crate) fn output_within(command: &mut Command) -> Output {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the command starts");
    let started = Instant::now();
    loop {
        if child.try_wait().expect("the child is waited for").is_some() {
            return child.wait_with_output().expect("its output reads");
        }
        if started.elapsed() > HUNG_AFTER {
            let _ = child.kill();
            let output = child.wait_with_output().expect("its output reads");
            panic!(
                "still waiting after {HUNG_AFTER:?}: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A home with a journal of one run.
fn home_with_records(dir: &tempfile::TempDir) -> Home {
    let home = Home::at(dir.path().join("home"));
    let store = Store::open(home.clone()).expect("the home opens");
    record_run(&store, 2, &mut rand::rngs::StdRng::seed_from_u64(5));
    home
}

#[test]
fn a_server_that_accepts_and_never_speaks_ends_ship_once_within_its_connect_timeout() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a port on 127.0.0.1");
    let port = listener.local_addr().expect("its address").port();
    // Accepts every connection and keeps it open without a byte, as a hung server does.
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming().flatten() {
            held.push(stream);
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let home = home_with_records(&dir);
    // TLS is asked for first (the TCP default), so the handshake's first step is what hangs.
    let url = format!("postgresql://ship@127.0.0.1:{port}/fleet?connect_timeout=3");
    let output = output_within(runjournal(&home).args(["ship", "--once", "--to", &url]));
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("no answer to the connection") && stderr.contains("within 3s"),
        "{stderr}"
    );
    // The failure is the shipper's report too, for `status`.
    let report = runjournal::ship::state::read(&home).expect("the shipper reported");
    assert!(
        report
            .last_error
            .is_some_and(|error| error.contains("no answer"))
    );
}

#[test]
fn a_server_silent_after_the_startup_ends_ship_once_after_the_statement_deadline() {
    let server = FakePg::start(Answer::SilentAfterStartup);
    let dir = tempfile::tempdir().unwrap();
    let home = home_with_records(&dir);
    let url = format!(
        "postgresql://ship@127.0.0.1:{}/fleet?sslmode=disable&statement_timeout=1s",
        server.port
    );
    let output = output_within(runjournal(&home).args(["ship", "--once", "--to", &url]));
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    // The statement timeout, and the margin for the server's own cancellation to come back.
    assert!(
        stderr.contains("no answer to a statement within 6s"),
        "{stderr}"
    );
    assert_eq!(server.seen().startups, 1, "it got as far as the startup");
}

#[test]
fn a_table_locked_by_another_session_ends_ship_once_with_the_lock_timeout() {
    let Some(cluster) = PgCluster::start("ship_locked_table") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let home = home_with_records(&dir);
    ship_once(&home, &cluster.url());
    record_run(
        &Store::open(home.clone()).expect("the home opens"),
        1,
        &mut rand::rngs::StdRng::seed_from_u64(6),
    );
    let mut holder = cluster.client();
    let mut locked = holder.transaction().expect("a transaction");
    locked
        .batch_execute("LOCK TABLE runjournal_journals IN ACCESS EXCLUSIVE MODE")
        .expect("the lock is taken");
    let url = format!("{}&lock_timeout=1s", cluster.url());
    let output = output_within(runjournal(&home).args(["ship", "--once", "--to", &url]));
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("lock timeout") && stderr.contains("SQLSTATE 55P03"),
        "{stderr}"
    );
    locked.rollback().expect("the lock is let go");
    drop(holder);
    // Once the lock is gone, the same command ships.
    ship_once(&home, &url);
}

#[test]
fn a_timeout_of_zero_or_of_no_duration_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let home = Home::at(dir.path().join("home"));
    for query in [
        "statement_timeout=0",
        "lock_timeout=0ms",
        "statement_timeout=soon",
        "lock_timeout=5fortnights",
        "connect_timeout=0",
    ] {
        let url = format!("postgresql://ship@db.example/fleet?sslmode=disable&{query}");
        let output = output_within(runjournal(&home).args(["ship", "--once", "--to", &url]));
        assert_eq!(output.status.code(), Some(2), "{query}: {output:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        let name = query.split('=').next().unwrap_or_default();
        assert!(stderr.contains(name), "{query}: {stderr}");
    }
}
