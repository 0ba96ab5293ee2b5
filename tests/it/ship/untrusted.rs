//! What the server says is input: a row of the fleet tables that no shipper wrote is a clear
//! error naming its table and column (exit 1), never a panic; a server's error text reaches
//! `runjournal list` and `status` escaped.

use rand::SeedableRng;
use runjournal::{Home, Store};

use super::fake_pg::{Answer, FakePg};
use super::{record_run, runjournal, ship_once};
use runjournal::testkit::pg_cluster::PgCluster;

fn home_with_a_run(dir: &tempfile::TempDir) -> Home {
    let home = Home::at(dir.path().join("home"));
    let store = Store::open(home.clone()).expect("the store opens");
    let mut rng = rand::rngs::StdRng::seed_from_u64(21);
    record_run(&store, 2, &mut rng);
    home
}

#[test]
fn a_tampered_cursor_row_is_an_error_naming_table_and_column_not_a_panic() {
    let Some(cluster) = PgCluster::start("ship_tampered_cursor") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let home = home_with_a_run(&dir);
    ship_once(&home, &cluster.url());
    let mut client = cluster.client();
    let ship_fails_naming = |named: &str| {
        let output = runjournal(&home)
            .args(["ship", "--once", "--to", &cluster.url()])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains(named), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    };
    client
        .batch_execute(
            "ALTER TABLE runjournal_journals ALTER COLUMN shipped_through DROP NOT NULL;
             UPDATE runjournal_journals SET shipped_through = NULL",
        )
        .unwrap();
    ship_fails_naming(
        "column shipped_through of runjournal_journals is NULL where a value is required",
    );
    client
        .batch_execute(
            "UPDATE runjournal_journals SET shipped_through = 0;
             ALTER TABLE runjournal_journals ALTER COLUMN shipped_through TYPE numeric",
        )
        .unwrap();
    ship_fails_naming("column shipped_through of runjournal_journals has type numeric");
}

#[test]
fn a_hostile_server_error_is_shown_escaped_by_list_and_status() {
    let hostile = "no such role \u{1b}]2;pwned\u{7}\u{1b}[2J\u{1b}[31mred\nsecond line";
    let fake = FakePg::start(Answer::Error(hostile.to_string()));
    let dir = tempfile::tempdir().unwrap();
    let home = home_with_a_run(&dir);
    let url = format!(
        "postgresql://ship@127.0.0.1:{}/fleet?sslmode=disable",
        fake.port
    );
    let output = runjournal(&home)
        .args(["ship", "--once", "--to", &url])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(fake.seen().startups, 1, "the server was asked and answered");
    // The state file keeps one line (its newline a space); every control shows visibly.
    let escaped = "no such role \\x1b]2;pwned\\x07\\x1b[2J\\x1b[31mred";
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains(escaped), "{stderr}");
    assert!(!stderr.contains('\u{1b}'), "{stderr:?}");

    let run = {
        let reader = runjournal::JournalReader::open(home.journal_path()).unwrap();
        let runs = reader.view().unwrap().all_runs().unwrap();
        runs[0].to_string()
    };
    for args in [vec!["list", "--all"], vec!["status", run.as_str()]] {
        let output = runjournal(&home).args(&args).output().unwrap();
        assert!(output.status.success(), "{args:?}");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let line = stdout
            .lines()
            .find(|line| line.starts_with("shipping "))
            .unwrap_or_else(|| panic!("{args:?} says shipping fails: {stdout}"));
        assert!(line.contains(escaped), "{args:?}: {line}");
        assert!(!stdout.contains('\u{1b}'), "{args:?}: {stdout:?}");
        assert!(!stdout.contains('\u{7}'), "{args:?}: {stdout:?}");
    }
    // JSON keeps the text as it came, escaped JSON's way.
    let output = runjournal(&home)
        .args(["status", run.as_str(), "--json"])
        .output()
        .unwrap();
    let status: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let reason = status["shipping"]["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("no such role \u{1b}]2;pwned\u{7}\u{1b}[2J\u{1b}[31mred"),
        "{reason:?}"
    );
}
