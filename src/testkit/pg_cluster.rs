//! A throwaway PostgreSQL cluster for one test: `initdb` into a temporary directory (as the
//! `postgres` user when running as root, since PostgreSQL refuses to run as root), `pg_ctl`
//! serving only a Unix socket inside that directory (no TCP port, so tests never collide and
//! never touch a shared server), stopped and deleted on drop even when the test fails.
//!
//! Used by `tests/it`, `journal-tools/tests/it` and the shipping benchmark. Without
//! PostgreSQL's server binaries a test skips, saying so, or fails where every test must run
//! ([`super::skip`]; CI installs them).

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Where the server binaries are: `pg_config --bindir`, else the newest
/// `/usr/lib/postgresql/<version>/bin`, else whatever `initdb` is on the PATH.
pub fn server_bin_dir() -> Option<PathBuf> {
    let has_server = |dir: &Path| dir.join("initdb").is_file() && dir.join("pg_ctl").is_file();
    if let Ok(output) = Command::new("pg_config").arg("--bindir").output()
        && output.status.success()
    {
        let dir = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
        if has_server(&dir) {
            return Some(dir);
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            Some((version, entry.path().join("bin")))
        })
        .filter(|(_, dir)| has_server(dir))
        .collect();
    versions.sort();
    if let Some((_, dir)) = versions.pop() {
        return Some(dir);
    }
    std::env::var_os("PATH")
        .and_then(|paths| std::env::split_paths(&paths).find(|dir| has_server(dir)))
}

/// A running cluster; stopped and removed on drop.
pub struct PgCluster {
    dir: tempfile::TempDir,
    bin: PathBuf,
    /// Whether the server fsyncs (benchmarks); tests run without, for speed.
    is_durable: bool,
    /// Set when running as root: the user the server runs as.
    owner: Option<(nix::unistd::Uid, nix::unistd::Gid)>,
}

impl PgCluster {
    /// Starts a cluster for `test`; `None` (after saying so) when PostgreSQL is not installed.
    pub fn start(test: &str) -> Option<PgCluster> {
        PgCluster::start_with(test, false)
    }

    /// Starts a cluster that fsyncs its commits as a production server does (for benchmarks).
    pub fn start_durable(test: &str) -> Option<PgCluster> {
        PgCluster::start_with(test, true)
    }

    fn start_with(test: &str, is_durable: bool) -> Option<PgCluster> {
        let Some(bin) = server_bin_dir() else {
            return skip(
                test,
                "PostgreSQL's server binaries (initdb, pg_ctl) are not installed",
            );
        };
        let owner = if nix::unistd::geteuid().is_root() {
            match nix::unistd::User::from_name("postgres") {
                Ok(Some(user)) => Some((user.uid, user.gid)),
                _ => {
                    return skip(
                        test,
                        "running as root and there is no postgres user to run the server as",
                    );
                }
            }
        } else {
            None
        };
        // The server runs as `postgres` when this is root: its directory must be one that user
        // can reach, wherever the build tree and the temporary directory are.
        let dir = match owner {
            Some(_) => super::other_user::reachable_dir(),
            None => tempfile::Builder::new()
                .prefix("runjournal-pg-")
                .tempdir()
                .expect("a temporary directory for the cluster"),
        };
        if let Some((uid, gid)) = owner {
            nix::unistd::chown(dir.path(), Some(uid), Some(gid)).expect("chown the cluster dir");
            std::fs::set_permissions(
                dir.path(),
                std::os::unix::fs::PermissionsExt::from_mode(0o700),
            )
            .expect("the cluster dir private to its server");
        }
        let cluster = PgCluster {
            dir,
            bin,
            is_durable,
            owner,
        };
        let data = cluster.data_dir();
        cluster.run(
            "initdb",
            &[
                "-D".as_ref(),
                data.as_os_str(),
                "-U".as_ref(),
                "postgres".as_ref(),
                "-A".as_ref(),
                "trust".as_ref(),
                "-E".as_ref(),
                "UTF8".as_ref(),
                "--locale=C".as_ref(),
                "--no-sync".as_ref(),
            ],
        );
        cluster.start_server();
        Some(cluster)
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// The directory of the server's Unix socket.
    pub fn socket_dir(&self) -> &Path {
        self.dir.path()
    }

    /// The URL of database `postgres` as the superuser, over the Unix socket.
    pub fn url(&self) -> String {
        self.url_of("postgres")
    }

    /// The URL of another database of this cluster (see [`PgCluster::create_database`]).
    pub fn url_of(&self, database: &str) -> String {
        format!(
            "postgresql:///{database}?host={}&user=postgres&sslmode=disable",
            self.socket_dir().display()
        )
    }

    /// A client connected to `postgres`, for a test's own checks.
    pub fn client(&self) -> postgres::Client {
        postgres::Client::connect(&self.url(), postgres::NoTls)
            .expect("connect to the test cluster")
    }

    pub fn create_database(&self, name: &str) {
        self.client()
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .expect("CREATE DATABASE");
    }

    /// Starts the server (again, after [`PgCluster::stop`]).
    pub fn start_server(&self) {
        let data = self.data_dir();
        let log = self.dir.path().join("server.log");
        let options = format!(
            "-k {} -c listen_addresses= -c max_connections=40{}",
            self.socket_dir().display(),
            if self.is_durable { "" } else { " -c fsync=off" }
        );
        self.run(
            "pg_ctl",
            &[
                "-D".as_ref(),
                data.as_os_str(),
                "-l".as_ref(),
                log.as_os_str(),
                "-o".as_ref(),
                options.as_ref(),
                "-w".as_ref(),
                "-t".as_ref(),
                "60".as_ref(),
                "start".as_ref(),
            ],
        );
    }

    /// Stops the server (`fast`: clients are disconnected, the server shuts down cleanly).
    pub fn stop(&self) {
        let data = self.data_dir();
        self.run(
            "pg_ctl",
            &[
                "-D".as_ref(),
                data.as_os_str(),
                "-m".as_ref(),
                "fast".as_ref(),
                "-w".as_ref(),
                "stop".as_ref(),
            ],
        );
    }

    fn command(&self, program: &str) -> Command {
        let mut command = Command::new(self.bin.join(program));
        command.current_dir(self.dir.path());
        command.env("LC_ALL", "C");
        if let Some((uid, gid)) = self.owner {
            command.uid(uid.as_raw()).gid(gid.as_raw());
            command.env("HOME", self.dir.path());
        }
        command
    }

    fn run(&self, program: &str, args: &[&std::ffi::OsStr]) -> Output {
        let output = self
            .command(program)
            .args(args)
            .output()
            .unwrap_or_else(|error| panic!("{program}: {error}"));
        let log = std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default();
        assert!(
            output.status.success(),
            "{program} {args:?} failed: {}{}\nserver log:\n{log}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        output
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        // Immediate: nothing of the server is needed any more, and a test that failed may
        // have left clients connected.
        let data = self.data_dir();
        let _ = self
            .command("pg_ctl")
            .args(["-D".as_ref(), data.as_os_str()])
            .args(["-m", "immediate", "-w", "stop"])
            .output();
    }
}

fn skip<T>(test: &str, why: &str) -> Option<T> {
    super::skip::skip(test, why);
    None
}
