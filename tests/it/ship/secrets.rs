//! Shipping keeps its password: never sent in clear to whoever answers on a TCP address
//! unless the URL allows plain text; found in `PGPASSWORD` or a password file so it need not
//! be on the command line; and not left on a following shipper's command line.

use std::process::{Output, Stdio};
use std::time::Duration;

use rand::SeedableRng;
use runjournal::{Home, Store};

use super::fake_pg::{Answer, FakePg};
use super::{ChildGuard, global_head, journal_id, poll_until, record_run, runjournal};
use runjournal::testkit::pg_cluster::PgCluster;

const SECRET: &str = "hunter2-not-for-impostors";

fn home_with_a_run(dir: &tempfile::TempDir) -> Home {
    let home = Home::at(dir.path().join("home"));
    let store = Store::open(home.clone()).expect("the store opens");
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    record_run(&store, 2, &mut rng);
    home
}

/// The server's cursor for the journal in database `fleet`.
fn shipped_through(cluster: &PgCluster, journal_id: &str) -> Option<i64> {
    let mut client = postgres::Client::connect(&cluster.url_of("fleet"), postgres::NoTls).ok()?;
    let row = client
        .query_opt(
            "SELECT shipped_through FROM runjournal_journals WHERE journal_id = $1",
            &[&journal_id],
        )
        .ok()??;
    row.try_get(0).ok()
}

fn ship_once_with(home: &Home, url: &str, envs: &[(&str, &str)]) -> Output {
    let mut command = runjournal(home);
    for (key, value) in envs {
        command.env(key, value);
    }
    command
        .args(["ship", "--once", "--to", url])
        .output()
        .expect("runjournal ship runs")
}

#[test]
fn an_impostor_declining_tls_never_gets_the_password_unless_the_url_allows_plain_text() {
    let fake = FakePg::start(Answer::CleartextPassword);
    let dir = tempfile::tempdir().unwrap();
    let home = home_with_a_run(&dir);
    let base = format!("postgresql://ship@127.0.0.1:{}/fleet", fake.port);

    // The default, with the password from PGPASSWORD and in the URL: refused before the
    // startup message, so no password message can follow.
    for (url, envs) in [
        (base.clone(), vec![("PGPASSWORD", SECRET)]),
        (
            format!("postgresql://ship:{SECRET}@127.0.0.1:{}/fleet", fake.port),
            vec![],
        ),
        (
            format!("{base}?sslmode=require"),
            vec![("PGPASSWORD", SECRET)],
        ),
    ] {
        let output = ship_once_with(&home, &url, &envs);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{url}: {stderr}");
        assert!(stderr.contains("server does not support TLS"), "{stderr}");
        assert!(!stderr.contains(SECRET), "{stderr}");
    }
    let seen = fake.seen();
    assert_eq!(seen.ssl_requests, 3, "{seen:?}");
    assert_eq!(seen.startups, 0, "{seen:?}");
    assert!(seen.passwords.is_empty(), "{seen:?}");

    // Plain text asked for: the impostor gets it (so the test can see a password).
    for mode in ["prefer", "disable"] {
        let url = format!("{base}?sslmode={mode}");
        let output = ship_once_with(&home, &url, &[("PGPASSWORD", SECRET)]);
        assert_eq!(output.status.code(), Some(1), "{url}");
    }
    let seen = fake.seen();
    assert_eq!(seen.startups, 2, "{seen:?}");
    assert_eq!(seen.passwords, [SECRET, SECRET], "{seen:?}");
}

/// A cluster whose role `shipper` (owner of database `fleet`) must give its password over
/// the Unix socket; every other role keeps the cluster's trust.
fn cluster_with_a_password_role(test: &str) -> Option<PgCluster> {
    let cluster = PgCluster::start(test)?;
    let mut client = cluster.client();
    client
        .batch_execute(&format!("CREATE ROLE shipper LOGIN PASSWORD '{SECRET}'"))
        .expect("the role");
    client
        .batch_execute("CREATE DATABASE fleet OWNER shipper")
        .expect("its database");
    let hba = cluster.data_dir().join("pg_hba.conf");
    let rules = std::fs::read_to_string(&hba).expect("pg_hba.conf");
    std::fs::write(&hba, format!("local all shipper scram-sha-256\n{rules}"))
        .expect("pg_hba.conf written");
    client
        .batch_execute("SELECT pg_reload_conf()")
        .expect("reload");
    let config = format!(
        "host={} user=shipper dbname=fleet",
        cluster.socket_dir().display()
    );
    poll_until("the server asks shipper for a password", || {
        postgres::Client::connect(&config, postgres::NoTls).is_err()
    });
    Some(cluster)
}

#[test]
fn a_password_from_pgpassword_or_a_private_pgpass_file_is_used_for_a_url_without_one() {
    let Some(cluster) = cluster_with_a_password_role("ship_password_sources") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let home = home_with_a_run(&dir);
    let socket = cluster.socket_dir().display().to_string();
    let url = format!("postgresql:///fleet?host={socket}&user=shipper");

    // Without a password the server refuses: the test's server really asks for one.
    let output = ship_once_with(&home, &url, &[]);
    assert_eq!(output.status.code(), Some(1));

    let output = ship_once_with(&home, &url, &[("PGPASSWORD", SECRET)]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(!stderr.contains("warning"), "no warning: {stderr}");
    let id = journal_id(&home);
    assert_eq!(shipped_through(&cluster, &id), Some(global_head(&home)));

    // The password file: a line for another user and one with a wildcard port before the
    // socket's line, which escapes nothing; the first that matches wins.
    let file = dir.path().join("pgpass");
    std::fs::write(
        &file,
        format!(
            "# fleet\n{socket}:5432:fleet:postgres:wrong\n{socket}:*:fleet:shipper:{SECRET}\n*:*:*:*:wrong\n"
        ),
    )
    .unwrap();
    let set_mode = |mode: u32| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    set_mode(0o600);
    let file_text = file.display().to_string();
    record_run(
        &Store::open(home.clone()).unwrap(),
        1,
        &mut rand::rngs::StdRng::seed_from_u64(12),
    );
    let output = ship_once_with(&home, &url, &[("PGPASSFILE", &file_text)]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert_eq!(shipped_through(&cluster, &id), Some(global_head(&home)));

    // Open to others: ignored with libpq's warning, so the server refuses.
    set_mode(0o644);
    let output = ship_once_with(&home, &url, &[("PGPASSFILE", &file_text)]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("has group or world access; it is ignored"),
        "{stderr}"
    );
    assert!(!stderr.contains(SECRET), "{stderr}");
}

#[test]
fn a_password_on_the_command_line_is_warned_about_and_gone_from_a_following_shippers() {
    let Some(cluster) = cluster_with_a_password_role("ship_password_argv") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let home = home_with_a_run(&dir);
    let socket = cluster.socket_dir().display().to_string();
    let url = format!("postgresql://shipper:{SECRET}@/fleet?host={socket}");
    let stderr_path = dir.path().join("stderr");
    let child = runjournal(&home)
        .args(["ship", "--poll-interval", "20ms", "--to", &url])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr_path).unwrap())
        .spawn()
        .expect("the shipper starts");
    let child = ChildGuard(child);
    let id = journal_id(&home);
    let head = global_head(&home);
    poll_until("the shipper ships", || {
        shipped_through(&cluster, &id) == Some(head)
    });
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", child.0.id())).unwrap();
    let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
    assert!(cmdline.contains(" ship "), "the shipper itself: {cmdline}");
    assert!(!cmdline.contains(SECRET), "{cmdline}");
    assert!(!cmdline.contains("--to"), "{cmdline}");
    drop(child);
    std::thread::sleep(Duration::from_millis(50));
    let stderr = std::fs::read_to_string(&stderr_path).unwrap();
    assert!(
        stderr.contains("warning: the --to URL holds a password"),
        "{stderr}"
    );
    assert!(!stderr.contains(SECRET), "{stderr}");

    // From the environment the same URL gets no warning: nobody else can read it there.
    let output = runjournal(&home)
        .env("RUNJOURNAL_SHIP_URL", &url)
        .args(["ship", "--once"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(!stderr.contains("warning"), "{stderr}");
    // --once warns too.
    let output = ship_once_with(&home, &url, &[]);
    assert!(output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("warning: the --to URL"));
}
