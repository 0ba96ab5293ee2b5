//! What a run keeps in the home only is never shipped: a run launched with secrets in its
//! environment and in its hook's command, ended and its hook delivered, is shipped to a real
//! PostgreSQL, and no row of any table of the server holds a secret's value — while its
//! records, hook attempts included, are all there.

use runjournal::{Home, RunId};

use super::{global_head, ship_once};
use runjournal::testkit::pg_cluster::PgCluster;

const ENV_SECRET: &str = "ship-me-not-env-3f9c1";
const FLAG_SECRET: &str = "ship-me-not-flag-7a2e4";
const HOOK_SECRET: &str = "ship-me-not-hook-c0d5b";

#[test]
fn a_runs_environment_and_hook_commands_are_in_no_row_of_the_server() {
    let Some(cluster) = PgCluster::start("ship_environments") else {
        return;
    };
    let dir = tempfile::tempdir().expect("a directory");
    let home = Home::at(dir.path().join("home"));
    let hook = format!("true {HOOK_SECRET}");
    let output = super::runjournal(&home)
        .env("API_TOKEN", ENV_SECRET)
        .args([
            "run",
            "--wait",
            "--json",
            "--env",
            &format!("ALSO={FLAG_SECRET}"),
            "--on-exit",
            &hook,
            "--",
            "true",
        ])
        .output()
        .expect("runjournal runs");
    assert!(output.status.success(), "{output:?}");
    let object: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    let run: RunId = object["runId"]
        .as_str()
        .expect("a run id")
        .parse()
        .expect("a run id");
    // The runner delivered the hook before it exited, which `--wait` waits for.
    let reader = runjournal::JournalReader::open(home.journal_path()).expect("the journal");
    let view = reader.view().expect("a view");
    assert!(
        !view.has_hooks_due(run).expect("reads"),
        "the hook was delivered"
    );
    assert!(
        view.run_env(run).expect("reads").is_some(),
        "the run kept one"
    );
    drop(view);
    let head = global_head(&home);
    ship_once(&home, &cluster.url());

    let mut client = cluster.client();
    let tables: Vec<String> = client
        .query(
            "SELECT table_name::text FROM information_schema.tables WHERE table_schema = 'public'",
            &[],
        )
        .expect("the tables list")
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert!(
        tables.iter().any(|table| table == "runjournal_records"),
        "{tables:?}"
    );
    let mut rows = 0;
    for table in &tables {
        let query = format!("SELECT row_to_json(t)::text FROM \"{table}\" t");
        for row in client.query(query.as_str(), &[]).expect("the table reads") {
            let text: String = row.get(0);
            rows += 1;
            for secret in [ENV_SECRET, FLAG_SECRET, HOOK_SECRET] {
                assert!(!text.contains(secret), "{table}: {text}");
            }
        }
    }
    let shipped: i64 = client
        .query_one(
            "SELECT count(*) FROM runjournal_records WHERE event_type IN ('HookAttempted', 'HookEnded')",
            &[],
        )
        .expect("counts")
        .get(0);
    assert_eq!(shipped, 2, "the hook's records are shipped");
    assert!(rows as i64 > head, "every record and more was read: {rows}");
}
