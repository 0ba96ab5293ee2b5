//! From a PostgreSQL URL to a connection.
//!
//! The URL is what tokio-postgres reads (`postgresql://user[:password]@host:port/db?options`;
//! a Unix socket directory as `?host=/run/postgresql`), with the TLS options handled here:
//!
//! * `sslmode=require` (the default over TCP) and `sslmode=verify-full` — TLS or no
//!   connection, so a password is never sent in clear to whoever answers on the address.
//! * `sslmode=disable` (the default over a Unix socket, which PostgreSQL serves without TLS)
//!   — plain connection.
//! * `sslmode=prefer` — TLS when the server offers it, else plain: only when asked for, since
//!   an impostor that declines TLS and asks for a cleartext password then receives it.
//! * `sslrootcert=FILE` — trust the PEM certificates in FILE instead of the system's roots.
//!
//! A URL without a password gets one as libpq finds it (`super::password`: `PGPASSWORD`, then
//! `PGPASSFILE` or `~/.pgpass`), so the password need not be on a command line.
//!
//! Every wait on the server is bounded ([`super::session`]): `connect_timeout` (default
//! [`CONNECT_TIMEOUT_DEFAULT`]) bounds the whole connection to each host, TLS and
//! authentication included; `statement_timeout` and `lock_timeout` (defaults
//! [`STATEMENT_TIMEOUT_DEFAULT`], [`LOCK_TIMEOUT_DEFAULT`]) are set on the server, read from the
//! URL's options of those names or from `options=-c statement_timeout=...` as libpq passes
//! them, and a statement the server has not answered [`DEADLINE_MARGIN`] after its timeout is
//! given up by the client.
//!
//! TLS is rustls (ring provider), so nothing links a system library; it is the cargo feature
//! `tls`, on by default (ring compiles C for its target: a build for a target without a C
//! toolchain, such as CI's lint of the macOS targets, turns it off, and then only
//! `sslmode=disable`, `prefer` and Unix sockets connect). Whenever TLS is used the server's
//! certificate is verified against the roots *and* its host name, so `prefer` and `require`
//! are as strict as libpq's `verify-full` (a server with a self-signed certificate needs
//! `sslrootcert`). `sslmode=verify-ca` (chain without host name) is refused rather than
//! silently upgraded. Client certificates (`sslcert`, `sslkey`) are not supported.
//!
//! Invariant: over TCP, a password leaves this process unencrypted only when the URL says
//! `sslmode=disable` or `sslmode=prefer`.

use std::path::PathBuf;
#[cfg(feature = "tls")]
use std::sync::Arc;
use std::time::Duration;

use percent_encoding::percent_decode_str;

use super::ShipError;
use super::password::{self, Lookup, Sources};
use super::session::Session;

/// How long a connection to one host may take when the URL does not say (`connect_timeout`):
/// TCP, TLS, startup and authentication.
pub const CONNECT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);
/// How long a statement may run when the URL does not say (`statement_timeout`).
pub const STATEMENT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(60);
/// How long a statement may wait for a lock when the URL does not say (`lock_timeout`).
pub const LOCK_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);
/// How long past a statement's timeout the client still waits for the server's own
/// cancellation before it gives the server up as silent.
pub const DEADLINE_MARGIN: Duration = Duration::from_secs(5);
/// The longest timeout PostgreSQL takes (`INT_MAX` milliseconds).
const TIMEOUT_MAX_MS: u64 = i32::MAX as u64;

/// A server to connect to.
#[derive(Clone)]
pub struct Target {
    config: tokio_postgres::Config,
    tls: Tls,
    shown: String,
    is_password_in_url: bool,
    warnings: Vec<String>,
    statement_timeout: Duration,
    lock_timeout: Duration,
}

#[derive(Clone)]
enum Tls {
    Disabled,
    #[cfg(feature = "tls")]
    Rustls {
        root_file: Option<PathBuf>,
    },
}

/// The TLS of `sslmode=prefer`: rustls, or none in a build without TLS.
#[cfg(feature = "tls")]
fn preferred_tls(root_file: Option<PathBuf>) -> Result<Tls, ShipError> {
    Ok(Tls::Rustls { root_file })
}

#[cfg(not(feature = "tls"))]
fn preferred_tls(_root_file: Option<PathBuf>) -> Result<Tls, ShipError> {
    Ok(Tls::Disabled)
}

/// The TLS of `sslmode=require` or `verify-full`: rustls, or a refusal in a build without TLS.
#[cfg(feature = "tls")]
fn required_tls(root_file: Option<PathBuf>) -> Result<Tls, ShipError> {
    Ok(Tls::Rustls { root_file })
}

#[cfg(not(feature = "tls"))]
fn required_tls(_root_file: Option<PathBuf>) -> Result<Tls, ShipError> {
    Err(ShipError::Url {
        reason: "this build of runjournal has no TLS (built without the `tls` feature), and a TCP connection needs it unless the URL says sslmode=disable (or prefer): use a Unix socket, sslmode=disable, or a build with TLS".to_string(),
    })
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the password.
        write!(f, "Target({})", self.shown)
    }
}

impl Target {
    /// Parses a URL, finding its password as libpq does when it holds none (`PGPASSWORD`,
    /// `PGPASSFILE`, `~/.pgpass`). Fails only on what the caller wrote (never contacts the
    /// server).
    pub fn parse(url: &str) -> Result<Target, ShipError> {
        Target::parse_with(url, &Sources::from_env())
    }

    /// [`Target::parse`] with the password's sources given rather than read from the
    /// environment.
    pub fn parse_with(url: &str, sources: &Sources) -> Result<Target, ShipError> {
        let url = url.trim();
        let is_url = url.starts_with("postgresql://") || url.starts_with("postgres://");
        if !is_url {
            return Err(ShipError::Url {
                reason:
                    "expected postgresql://[user[:password]@][host][:port][/database][?options]"
                        .to_string(),
            });
        }
        let (base, query) = match url.split_once('?') {
            Some((base, query)) => (base, Some(query)),
            None => (url, None),
        };
        let ours = split_our_options(query)?;
        let mut kept = ours.kept;
        let (mode, root_file) = (ours.sslmode, ours.root_file);
        // Parsed once without the TLS options, to learn whether every host is a Unix socket.
        let bare: tokio_postgres::Config = format!("{base}?{}", kept.join("&")).parse().map_err(
            |error: tokio_postgres::Error| ShipError::Url {
                reason: error.to_string(),
            },
        )?;
        let is_socket_only = bare.get_hostaddrs().is_empty()
            && !bare.get_hosts().is_empty()
            && bare
                .get_hosts()
                .iter()
                .all(|host| !matches!(host, tokio_postgres::config::Host::Tcp(_)));
        let (mode_for_client, tls) = tls_of(mode.as_deref(), is_socket_only, root_file)?;
        kept.push(match mode_for_client {
            "disable" => "sslmode=disable",
            "require" => "sslmode=require",
            _ => "sslmode=prefer",
        });
        let rebuilt = format!("{base}?{}", kept.join("&"));
        let mut config: tokio_postgres::Config =
            rebuilt
                .parse()
                .map_err(|error: tokio_postgres::Error| ShipError::Url {
                    reason: error.to_string(),
                })?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT_DEFAULT);
        }
        let from_options = |name: &str| {
            config
                .get_options()
                .and_then(|options| server_option(options, name))
        };
        let statement_timeout = timeout_option(
            "statement_timeout",
            ours.statement_timeout
                .or_else(|| from_options("statement_timeout")),
            STATEMENT_TIMEOUT_DEFAULT,
        )?;
        let lock_timeout = timeout_option(
            "lock_timeout",
            ours.lock_timeout.or_else(|| from_options("lock_timeout")),
            LOCK_TIMEOUT_DEFAULT,
        )?;
        // A server that stops answering mid-transaction is noticed, not waited on forever.
        config.keepalives(true);
        config.keepalives_idle(Duration::from_secs(30));
        if config.get_application_name().is_none() {
            config.application_name("runjournal");
        }
        let shown = shown_target(&config);
        let is_password_in_url = config.get_password().is_some();
        let mut warnings = Vec::new();
        if !is_password_in_url {
            let lookup = password_lookup(&config);
            let lookup = Lookup {
                host: &lookup.0,
                port: lookup.1,
                database: &lookup.2,
                user: &lookup.3,
            };
            if let Some(found) = password::find(sources, &lookup, &mut warnings) {
                config.password(found.password);
            }
        }
        Ok(Target {
            config,
            tls,
            shown,
            is_password_in_url,
            warnings,
            statement_timeout,
            lock_timeout,
        })
    }

    /// How long the whole connection may take: `connect_timeout` for each host the URL names.
    pub fn connect_deadline(&self) -> Duration {
        let per_host = self
            .config
            .get_connect_timeout()
            .copied()
            .unwrap_or(CONNECT_TIMEOUT_DEFAULT);
        let hosts = self
            .config
            .get_hosts()
            .len()
            .max(self.config.get_hostaddrs().len())
            .max(1);
        per_host.saturating_mul(u32::try_from(hosts).unwrap_or(u32::MAX))
    }

    /// The `statement_timeout` the server is told to keep.
    pub fn statement_timeout(&self) -> Duration {
        self.statement_timeout
    }

    /// The `lock_timeout` the server is told to keep.
    pub fn lock_timeout(&self) -> Duration {
        self.lock_timeout
    }

    /// How long the client waits for a statement's answer, its last row included: the
    /// statement timeout and a margin for the server's own cancellation to arrive first.
    pub fn statement_deadline(&self) -> Duration {
        self.statement_timeout.saturating_add(DEADLINE_MARGIN)
    }

    /// Whether the URL itself holds a password (which then sits wherever the URL was given:
    /// a command line is readable by every user of the machine).
    pub fn is_password_in_url(&self) -> bool {
        self.is_password_in_url
    }

    /// What the caller should be told about how the password was looked up (a password file
    /// ignored, and why), one line each.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// The server as shown in messages: user, host, port and database, never the password.
    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// Connects (one attempt, bounded by [`Target::connect_deadline`]), and sets the
    /// statement and lock timeouts on the server.
    pub fn connect(&self) -> Result<Session, ShipError> {
        match &self.tls {
            Tls::Disabled => Session::open(self, &self.config, tokio_postgres::NoTls),
            #[cfg(feature = "tls")]
            Tls::Rustls { root_file } => {
                let tls =
                    rustls_connector(root_file.as_ref()).map_err(|reason| ShipError::Tls {
                        target: self.shown.clone(),
                        reason,
                    })?;
                Session::open(self, &self.config, tls)
            }
        }
    }
}

#[cfg(feature = "tls")]
fn rustls_connector(
    root_file: Option<&PathBuf>,
) -> Result<tokio_postgres_rustls::MakeRustlsConnect, String> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    match root_file {
        Some(path) => {
            let certificates = CertificateDer::pem_file_iter(path)
                .map_err(|error| format!("reading {}: {error}", path.display()))?;
            for certificate in certificates {
                let certificate =
                    certificate.map_err(|error| format!("reading {}: {error}", path.display()))?;
                roots
                    .add(certificate)
                    .map_err(|error| format!("a certificate in {}: {error}", path.display()))?;
            }
            if roots.is_empty() {
                return Err(format!("{} holds no PEM certificate", path.display()));
            }
        }
        None => {
            // Unreadable entries of the system store are skipped; an empty store only fails
            // when a server actually offers TLS.
            let found = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(found.certs);
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|error| error.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(tokio_postgres_rustls::MakeRustlsConnect::new(config))
}

/// The URL's options this module reads itself rather than the client library: the TLS ones
/// (`sslmode`, `sslrootcert`) and the server's timeouts; the rest (`kept`) goes to the client
/// library. Client certificates are refused.
struct OurOptions<'u> {
    kept: Vec<&'u str>,
    sslmode: Option<String>,
    root_file: Option<PathBuf>,
    statement_timeout: Option<String>,
    lock_timeout: Option<String>,
}

fn split_our_options(query: Option<&str>) -> Result<OurOptions<'_>, ShipError> {
    let mut ours = OurOptions {
        kept: Vec::new(),
        sslmode: None,
        root_file: None,
        statement_timeout: None,
        lock_timeout: None,
    };
    for pair in query
        .unwrap_or_default()
        .split('&')
        .filter(|pair| !pair.is_empty())
    {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = percent_decode_str(value)
            .decode_utf8()
            .map_err(|_| ShipError::Url {
                reason: format!("option {key} is not UTF-8"),
            })?
            .into_owned();
        match key {
            "sslmode" => ours.sslmode = Some(value),
            "sslrootcert" => ours.root_file = Some(PathBuf::from(value)),
            "statement_timeout" => ours.statement_timeout = Some(value),
            "lock_timeout" => ours.lock_timeout = Some(value),
            // The client library takes 0 (libpq: wait for ever) as no bound at all.
            "connect_timeout"
                if value
                    .trim()
                    .parse::<i64>()
                    .is_ok_and(|seconds| seconds <= 0) =>
            {
                return Err(ShipError::Url {
                    reason: format!(
                        "connect_timeout={value:?}: zero waits for ever, and runjournal bounds every wait: give a number of seconds above zero"
                    ),
                });
            }
            "sslcert" | "sslkey" | "sslpassword" | "sslcrl" => {
                return Err(ShipError::Url {
                    reason: format!("{key} is not supported (no client certificates)"),
                });
            }
            _ => ours.kept.push(pair),
        }
    }
    Ok(ours)
}

/// The value of server setting `name` in a libpq `options` string (`-c name=value`,
/// `-cname=value` or `--name=value`, `-` and `_` alike in the name); the last one wins, as on
/// the server.
fn server_option(options: &str, name: &str) -> Option<String> {
    let mut found = None;
    let mut words = options.split_whitespace();
    while let Some(word) = words.next() {
        let setting = if word == "-c" {
            words.next()
        } else {
            word.strip_prefix("-c").or_else(|| word.strip_prefix("--"))
        };
        let Some((key, value)) = setting.and_then(|setting| setting.split_once('=')) else {
            continue;
        };
        if key.replace('-', "_") == name {
            found = Some(value.to_string());
        }
    }
    found
}

/// A timeout option as PostgreSQL reads it — a number, whole or not, then `us`, `ms`, `s`,
/// `min`, `h` or `d` (milliseconds when none) — or `default` when absent. Zero, which turns
/// the server's bound off, is refused: every statement here has a bound.
fn timeout_option(
    name: &str,
    text: Option<String>,
    default: Duration,
) -> Result<Duration, ShipError> {
    let Some(text) = text else {
        return Ok(default);
    };
    let refused = |why: &str| ShipError::Url {
        reason: format!("{name}={text:?}: {why}"),
    };
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| refused("expected a duration such as 30s, 1500ms or 2min"))?;
    let unit_ms = match unit.trim() {
        "us" => 0.001,
        "" | "ms" => 1.0,
        "s" => 1_000.0,
        "min" => 60_000.0,
        "h" => 3_600_000.0,
        "d" => 86_400_000.0,
        _ => return Err(refused("the unit is not one of us, ms, s, min, h, d")),
    };
    let ms = (number * unit_ms).ceil();
    if !ms.is_finite() || ms <= 0.0 {
        return Err(refused(
            "zero turns the server's bound off, and runjournal bounds every statement: give a duration above zero",
        ));
    }
    if ms > TIMEOUT_MAX_MS as f64 {
        return Err(refused("PostgreSQL takes at most 2147483647ms"));
    }
    Ok(Duration::from_millis(ms as u64))
}

/// The `sslmode` handed to the client library and the TLS to connect with, for the URL's
/// `sslmode` (`None`: not given). Without one, TCP requires TLS and a Unix socket has none.
fn tls_of(
    mode: Option<&str>,
    is_socket_only: bool,
    root_file: Option<PathBuf>,
) -> Result<(&'static str, Tls), ShipError> {
    let chosen = match mode {
        Some("disable") => ("disable", Tls::Disabled),
        // PostgreSQL serves no TLS on a Unix socket, and nothing on it crosses a network.
        None if is_socket_only => ("disable", Tls::Disabled),
        Some("prefer") => ("prefer", preferred_tls(root_file)?),
        None | Some("require") | Some("verify-full") => ("require", required_tls(root_file)?),
        Some("verify-ca") => {
            return Err(ShipError::Url {
                reason: "sslmode=verify-ca is not supported: certificates are always checked against the host name too (use verify-full or require)".to_string(),
            });
        }
        Some(other) => {
            return Err(ShipError::Url {
                reason: format!(
                    "sslmode={other:?} is not one of disable, prefer, require, verify-full"
                ),
            });
        }
    };
    Ok(chosen)
}

/// What libpq matches a password file's lines against: the first host (a Unix socket
/// directory as it is; none as `localhost`), its port, the database and the user (each
/// defaulted as the client defaults it).
fn password_lookup(config: &tokio_postgres::Config) -> (String, u16, String, String) {
    use tokio_postgres::config::Host;
    let host = match (config.get_hosts().first(), config.get_hostaddrs().first()) {
        (Some(Host::Tcp(name)), _) => name.clone(),
        (Some(Host::Unix(path)), _) => path.display().to_string(),
        (None, Some(address)) => address.to_string(),
        (None, None) => "localhost".to_string(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    // The client's default user is the one running this process.
    let user = match config.get_user() {
        Some(user) => user.to_string(),
        None => nix::unistd::User::from_uid(nix::unistd::getuid())
            .ok()
            .flatten()
            .map(|user| user.name)
            .unwrap_or_default(),
    };
    let database = config.get_dbname().unwrap_or(&user).to_string();
    (host, port, database, user)
}

fn shown_target(config: &tokio_postgres::Config) -> String {
    use tokio_postgres::config::Host;
    let user = config.get_user().unwrap_or("");
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(name)) => name.clone(),
        Some(Host::Unix(path)) => path.display().to_string(),
        None => "localhost".to_string(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let database = config.get_dbname().unwrap_or(user);
    if user.is_empty() {
        format!("{host}:{port}/{database}")
    } else {
        format!("{user}@{host}:{port}/{database}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_never_shows() {
        let target = Target::parse("postgresql://ship:s3cret@db.example:6543/fleet").unwrap();
        assert_eq!(target.shown(), "ship@db.example:6543/fleet");
        assert!(!format!("{target:?}").contains("s3cret"));
    }

    #[cfg(feature = "tls")]
    #[test]
    fn tcp_requires_tls_unless_told_otherwise_and_a_unix_socket_stays_plain() {
        use tokio_postgres::config::SslMode;
        for (url, mode) in [
            ("postgresql://ship@db.example/fleet", SslMode::Require),
            ("postgresql://ship@127.0.0.1:5432/fleet", SslMode::Require),
            (
                "postgresql://db.example/fleet?sslmode=prefer",
                SslMode::Prefer,
            ),
            (
                "postgresql://db.example/fleet?sslmode=disable",
                SslMode::Disable,
            ),
            ("postgresql:///fleet?host=/run/postgresql", SslMode::Disable),
            (
                "postgresql:///fleet?host=/run/pg&sslmode=require",
                SslMode::Require,
            ),
            // One TCP host among sockets makes the whole list need TLS.
            (
                "postgresql://db.example/fleet?host=/run/pg",
                SslMode::Require,
            ),
            (
                "postgresql:///fleet?host=/run/pg&hostaddr=10.0.0.1",
                SslMode::Require,
            ),
        ] {
            let target = Target::parse_with(url, &Sources::default()).unwrap();
            assert_eq!(target.config.get_ssl_mode(), mode, "{url}");
            assert_eq!(
                matches!(target.tls, Tls::Disabled),
                mode == SslMode::Disable,
                "{url}"
            );
        }
    }

    #[cfg(not(feature = "tls"))]
    #[test]
    fn without_tls_a_tcp_url_needs_plain_text_asked_for() {
        let refused = Target::parse_with("postgresql://h/db", &Sources::default());
        assert!(refused.is_err_and(|error| error.is_usage()));
        for url in [
            "postgresql://h/db?sslmode=disable",
            "postgresql://h/db?sslmode=prefer",
            "postgresql:///db?host=/run/pg",
        ] {
            assert!(
                Target::parse_with(url, &Sources::default()).is_ok(),
                "{url}"
            );
        }
    }

    #[test]
    fn a_url_without_a_password_gets_the_one_libpq_would_find() {
        let sources = Sources {
            password: Some("from-env".to_string()),
            file: None,
        };
        let target =
            Target::parse_with("postgresql://ship@db/fleet?sslmode=disable", &sources).unwrap();
        assert!(!target.is_password_in_url());
        assert_eq!(target.config.get_password(), Some(&b"from-env"[..]));
        let given =
            Target::parse_with("postgresql://ship:given@db/fleet?sslmode=disable", &sources)
                .unwrap();
        assert!(given.is_password_in_url());
        assert_eq!(given.config.get_password(), Some(&b"given"[..]));
        let in_query = Target::parse_with(
            "postgresql://ship@db/fleet?password=q&sslmode=disable",
            &sources,
        )
        .unwrap();
        assert!(in_query.is_password_in_url());

        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pgpass");
        std::fs::write(
            &file,
            "db:5432:fleet:reader:not-this\n/run/pg:5432:fleet:ship:socket\ndb:5432:fleet:ship:tcp\n",
        )
        .unwrap();
        let from_file = |mode: u32| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
            Sources {
                password: None,
                file: Some(file.clone()),
            }
        };
        let tcp = Target::parse_with(
            "postgresql://ship@db/fleet?sslmode=disable",
            &from_file(0o600),
        )
        .unwrap();
        assert_eq!(tcp.config.get_password(), Some(&b"tcp"[..]));
        assert!(tcp.warnings().is_empty());
        let socket = Target::parse_with(
            "postgresql:///fleet?host=/run/pg&user=ship",
            &from_file(0o600),
        )
        .unwrap();
        assert_eq!(socket.config.get_password(), Some(&b"socket"[..]));
        let open = Target::parse_with(
            "postgresql://ship@db/fleet?sslmode=disable",
            &from_file(0o644),
        )
        .unwrap();
        assert_eq!(open.config.get_password(), None);
        assert_eq!(open.warnings().len(), 1, "{:?}", open.warnings());
    }

    #[test]
    fn timeouts_come_from_the_url_or_its_server_options_else_the_defaults() {
        let parse = |url: &str| Target::parse_with(url, &Sources::default());
        let target = parse("postgresql://h/db?sslmode=disable").unwrap();
        assert_eq!(target.statement_timeout(), STATEMENT_TIMEOUT_DEFAULT);
        assert_eq!(target.lock_timeout(), LOCK_TIMEOUT_DEFAULT);
        assert_eq!(target.connect_deadline(), CONNECT_TIMEOUT_DEFAULT);
        assert_eq!(
            target.statement_deadline(),
            STATEMENT_TIMEOUT_DEFAULT + DEADLINE_MARGIN
        );
        let target = parse(
            "postgresql://h/db?sslmode=disable&statement_timeout=1.5s&lock_timeout=2min&connect_timeout=3",
        )
        .unwrap();
        assert_eq!(target.statement_timeout(), Duration::from_millis(1_500));
        assert_eq!(target.lock_timeout(), Duration::from_secs(120));
        assert_eq!(target.connect_deadline(), Duration::from_secs(3));
        // As libpq passes them to the server; the URL's own option wins.
        let target = parse(
            "postgresql://h/db?sslmode=disable&options=-c%20statement_timeout%3D250%20--lock-timeout%3D4s&lock_timeout=5s",
        )
        .unwrap();
        assert_eq!(target.statement_timeout(), Duration::from_millis(250));
        assert_eq!(target.lock_timeout(), Duration::from_secs(5));
        // Each host the URL names gets its connect timeout.
        let target = parse("postgresql://a,b/db?sslmode=disable&connect_timeout=4").unwrap();
        assert_eq!(target.connect_deadline(), Duration::from_secs(8));
    }

    #[test]
    fn a_timeout_that_waits_for_ever_or_is_no_duration_is_refused() {
        for query in [
            "statement_timeout=0",
            "lock_timeout=0s",
            "statement_timeout=-5s",
            "statement_timeout=soon",
            "lock_timeout=3 weeks",
            "statement_timeout=30d",
            "connect_timeout=0",
            "connect_timeout=-1",
        ] {
            let url = format!("postgresql://h/db?sslmode=disable&{query}");
            let refused = Target::parse_with(&url, &Sources::default());
            assert!(
                refused.as_ref().is_err_and(ShipError::is_usage),
                "{query}: {refused:?}"
            );
        }
    }

    #[test]
    fn a_server_setting_is_found_in_every_form_libpq_passes() {
        for (options, found) in [
            ("-c statement_timeout=5s", Some("5s")),
            ("-cstatement_timeout=6s", Some("6s")),
            ("--statement-timeout=7s -c search_path=x", Some("7s")),
            (
                "-c statement_timeout=1s -c statement_timeout=2s",
                Some("2s"),
            ),
            ("-c search_path=x", None),
            ("statement_timeout=9s", None),
        ] {
            assert_eq!(
                server_option(options, "statement_timeout").as_deref(),
                found,
                "{options}"
            );
        }
    }

    #[test]
    fn a_unix_socket_directory_is_a_host() {
        let target = Target::parse("postgresql:///fleet?host=/tmp/pg&user=postgres").unwrap();
        assert_eq!(target.shown(), "postgres@/tmp/pg:5432/fleet");
    }

    #[cfg(feature = "tls")]
    #[test]
    fn tls_modes_are_mapped_or_refused() {
        for (url, is_ok) in [
            ("postgresql://h/db", true),
            ("postgresql://h/db?sslmode=disable", true),
            ("postgresql://h/db?sslmode=prefer", true),
            ("postgresql://h/db?sslmode=require", true),
            (
                "postgresql://h/db?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem",
                true,
            ),
            ("postgresql://h/db?sslmode=verify-ca", false),
            ("postgresql://h/db?sslmode=allow-ish", false),
            ("postgresql://h/db?sslcert=/c.pem", false),
            ("mysql://h/db", false),
        ] {
            let parsed = Target::parse(url);
            assert_eq!(parsed.is_ok(), is_ok, "{url}: {parsed:?}");
            if let Err(error) = parsed {
                assert!(error.is_usage(), "{url}: {error}");
            }
        }
        let disabled = Target::parse("postgresql://h/db?sslmode=disable").unwrap();
        assert!(matches!(disabled.tls, Tls::Disabled));
        let rooted =
            Target::parse("postgresql://h/db?sslmode=verify-full&sslrootcert=%2Fca.pem").unwrap();
        assert!(
            matches!(&rooted.tls, Tls::Rustls { root_file: Some(path) } if path == &PathBuf::from("/ca.pem"))
        );
        assert_eq!(
            rooted.config.get_ssl_mode(),
            tokio_postgres::config::SslMode::Require
        );
    }

    #[cfg(feature = "tls")]
    #[test]
    fn a_missing_root_file_is_a_tls_error_naming_it() {
        let error = rustls_connector(Some(&PathBuf::from("/nonexistent/ca.pem")))
            .err()
            .unwrap();
        assert!(error.contains("/nonexistent/ca.pem"), "{error}");
    }
}
