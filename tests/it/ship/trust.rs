//! The journal decides what was shipped. A journal restored from a backup taken before the
//! last ship finds the server ahead of it: `ship --once` is refused (exit 1, naming the
//! server's seq and the journal's head), `status` and `list` say so, and `prune` keeps every
//! run the journal's own mark does not prove shipped — with the shipper's report file
//! (`shipping.json`) or without it. Once the restored journal has grown past the server's
//! cursor, the server's record there is another run's: refused as diverged. `ship --off`
//! ends it all: retention then keeps nothing for a shipper.

use std::collections::BTreeSet;
use std::time::Duration;

use runjournal::RunId;
use runjournal::testkit::pg_cluster::PgCluster;
use serde_json::Value;

use super::deadlines::output_within;
use super::{journal_id, server_hashes, shipped_through};
use crate::support::{TestHome, run_id_of};

/// `runjournal` in `home`, with no password or URL from whoever runs the tests.
fn runjournal(home: &TestHome) -> std::process::Command {
    let mut command = std::process::Command::new(assert_cmd::cargo::cargo_bin!("runjournal"));
    command
        .env_remove("RUNJOURNAL_HOME")
        .env_remove("RUNJOURNAL_SHIP_URL")
        .env_remove("PGPASSWORD")
        .env("PGPASSFILE", home.file("no-password-file"))
        .arg("--home")
        .arg(home.path());
    command
}

/// One run of `true`, to its end and closed; its result consumed, so only shipping keeps it.
fn run_to_end(home: &TestHome) -> RunId {
    let output =
        output_within(runjournal(home).args(["run", "--wait", "--json", "--step", "true"]));
    assert!(output.status.success(), "{output:?}");
    let run = run_id_of(&output.stdout);
    for _ in 0..600 {
        let is_closed = home
            .journal()
            .view()
            .expect("a view")
            .snapshot(run)
            .expect("the run reads")
            .is_some_and(|state| state.is_closed());
        if is_closed {
            let result = home.file(&format!("results/{run}.json"));
            std::fs::remove_file(&result)
                .unwrap_or_else(|error| panic!("{}: {error}", result.display()));
            return run;
        }
        let _ = output_within(runjournal(home).arg("reconcile"));
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("run {run} was never closed");
}

fn global_head(home: &TestHome) -> u64 {
    home.journal()
        .view()
        .expect("a view")
        .global_head()
        .expect("the head reads")
}

fn ship_once(home: &TestHome, url: &str) -> std::process::Output {
    output_within(runjournal(home).args(["ship", "--once", "--to", url]))
}

/// `prune --keep-runs 0 --json`: every ended run may go but for what keeps it.
fn prune_all(home: &TestHome) -> (BTreeSet<RunId>, Vec<(String, String)>) {
    let output = output_within(runjournal(home).args(["prune", "--json", "--keep-runs", "0"]));
    assert!(output.status.success(), "{output:?}");
    let report: Value = serde_json::from_slice(&output.stdout).expect("prune --json prints JSON");
    let pruned = report["runs"]
        .as_array()
        .expect("runs")
        .iter()
        .map(|run| {
            run["runId"]
                .as_str()
                .expect("an id")
                .parse()
                .expect("a run id")
        })
        .collect();
    let kept = report["kept"]
        .as_array()
        .expect("kept")
        .iter()
        .map(|kept| {
            (
                kept["runId"].as_str().unwrap_or_default().to_string(),
                kept["why"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    (pruned, kept)
}

/// A fresh home whose retention only the test's own bounds drive: the file system's free space
/// (shared with whatever else runs on the machine) is not one of them.
fn home_without_space_bounds() -> TestHome {
    let home = TestHome::new();
    let output = output_within(runjournal(&home).args(["retention", "--keep-free", "off"]));
    assert!(output.status.success(), "{output:?}");
    home
}

fn is_in_journal(home: &TestHome, run: RunId) -> bool {
    home.journal()
        .view()
        .expect("a view")
        .snapshot(run)
        .expect("the run reads")
        .is_some()
}

/// The line of `status RUN` that starts with `shipping`.
fn shipping_line(home: &TestHome, run: RunId) -> Option<String> {
    let output = output_within(runjournal(home).args(["status", &run.to_string()]));
    assert!(output.status.success(), "{output:?}");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .find(|line| line.starts_with("shipping "))
        .map(str::to_string)
}

#[test]
fn a_journal_restored_behind_the_server_is_refused_and_keeps_its_unshipped_runs() {
    let Some(cluster) = PgCluster::start("ship_restored_journal") else {
        return;
    };
    let url = cluster.url();
    let home = home_without_space_bounds();
    let shipped: Vec<RunId> = (0..2).map(|_| run_to_end(&home)).collect();
    assert!(ship_once(&home, &url).status.success());
    let backup_head = global_head(&home);
    let backup = home.file("journal.redb.backup");
    std::fs::copy(home.file("journal.redb"), &backup).expect("the backup is taken");

    // The home goes on and ships: the server holds more than the backup.
    for _ in 0..2 {
        run_to_end(&home);
    }
    assert!(ship_once(&home, &url).status.success());
    let server_head = global_head(&home);
    let id = journal_id(&runjournal::Home::at(home.path()));
    assert_eq!(shipped_through(&cluster, &id), Some(server_head as i64));

    // The backup comes back (nothing has the journal open), and a new run lands in it.
    std::fs::copy(&backup, home.file("journal.redb")).expect("the backup is restored");
    let after_restore = run_to_end(&home);
    let head = global_head(&home);
    assert!(
        backup_head < head && head < server_head,
        "{backup_head} < {head} < {server_head}"
    );
    let output = ship_once(&home, &url);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!("through global seq {server_head}"))
            && stderr.contains(&format!("this journal's head is {head}")),
        "{stderr}"
    );
    assert_eq!(
        shipped_through(&cluster, &id),
        Some(server_head as i64),
        "nothing was shipped"
    );
    let line = shipping_line(&home, after_restore).expect("status says shipping is refused");
    assert!(
        line.contains(&format!("through global seq {server_head}")),
        "{line}"
    );
    let list = output_within(runjournal(&home).arg("list"));
    assert!(
        String::from_utf8_lossy(&list.stdout)
            .lines()
            .any(|line| line.starts_with("shipping ") && line.contains("this journal's head")),
        "{list:?}"
    );

    // Retention keeps what the journal's mark does not prove shipped: the run recorded after
    // the restore; the runs shipped before the backup may go.
    let (pruned, kept) = prune_all(&home);
    assert_eq!(pruned, shipped.iter().copied().collect());
    assert!(
        kept.iter()
            .any(|(run, why)| *run == after_restore.to_string() && why.contains("not shipped")),
        "{kept:?}"
    );
    assert!(is_in_journal(&home, after_restore));

    // Without the shipper's report, nothing changes: the mark is the journal's.
    std::fs::remove_file(home.file("shipping.json")).expect("the report is there");
    let (pruned, _) = prune_all(&home);
    assert!(pruned.is_empty(), "{pruned:?}");
    assert!(is_in_journal(&home, after_restore));
    let line = shipping_line(&home, after_restore).expect("status still says records wait");
    assert!(
        line.starts_with(&format!("shipping {} records behind", head - backup_head)),
        "{line}"
    );

    // The restored journal grows past the server's cursor: the server's record there is
    // another run's.
    while global_head(&home) < server_head {
        run_to_end(&home);
    }
    let output = ship_once(&home, &url);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!(
            "through global seq {server_head}, but its record there"
        )) && stderr.contains("is not this journal's"),
        "{stderr}"
    );
    let (server, rows) = server_hashes(&cluster, &id);
    assert_eq!(
        rows, server_head as i64,
        "the server's rows are as they were"
    );
    assert_eq!(server.len() as u64, server_head);
    let (pruned, _) = prune_all(&home);
    assert!(
        pruned.is_empty(),
        "nothing newer than the mark goes: {pruned:?}"
    );

    // A home that stops shipping keeps nothing for a shipper any more.
    let output = output_within(runjournal(&home).args(["ship", "--off"]));
    assert!(output.status.success(), "{output:?}");
    assert!(
        String::from_utf8_lossy(&output.stdout).starts_with("this home no longer ships"),
        "{output:?}"
    );
    let (pruned, _) = prune_all(&home);
    assert!(pruned.contains(&after_restore), "{pruned:?}");

    // The way out the refusal names: the server's copy of the journal goes, and the journal
    // ships again from its start.
    let mut client = cluster.client();
    for table in [
        "runjournal_records",
        "runjournal_runs",
        "runjournal_journals",
    ] {
        client
            .execute(
                &format!("DELETE FROM {table} WHERE journal_id = $1"),
                &[&id],
            )
            .expect("the server's copy is deleted");
    }
    let last = run_to_end(&home);
    let output = ship_once(&home, &url);
    assert!(output.status.success(), "{output:?}");
    assert_eq!(
        shipped_through(&cluster, &id),
        Some(global_head(&home) as i64)
    );
    let (server, _) = server_hashes(&cluster, &id);
    let local = super::local_hashes(&runjournal::Home::at(home.path()));
    assert_eq!(server, local, "the server holds what the journal holds");
    assert!(is_in_journal(&home, last));
}

#[test]
fn a_home_that_starts_shipping_keeps_its_runs_from_then_on_even_while_the_server_is_away() {
    let home = home_without_space_bounds();
    let before = run_to_end(&home);
    // Not shipping yet: retention takes what its bounds allow.
    let (pruned, _) = prune_all(&home);
    assert_eq!(pruned, BTreeSet::from([before]));
    let run = run_to_end(&home);
    // A shipper starts, and finds nobody at its address (port 1 refuses).
    let output = ship_once(
        &home,
        "postgresql://ship@127.0.0.1:1/fleet?sslmode=disable&connect_timeout=2",
    );
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let (pruned, kept) = prune_all(&home);
    assert!(pruned.is_empty(), "{pruned:?}");
    assert!(
        kept.iter()
            .any(|(kept, why)| *kept == run.to_string() && why.contains("not shipped")),
        "{kept:?}"
    );
    assert_eq!(
        home.journal()
            .view()
            .expect("a view")
            .shipped_through()
            .expect("the mark reads"),
        Some(0),
        "the home ships, nothing proven"
    );
}
