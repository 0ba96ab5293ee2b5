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

/// How long a connection attempt may take when the URL does not say (`connect_timeout`).
pub const CONNECT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);

/// A server to connect to.
#[derive(Clone)]
pub struct Target {
    config: postgres::Config,
    tls: Tls,
    shown: String,
    is_password_in_url: bool,
    warnings: Vec<String>,
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
        let (mut kept, mode, root_file) = split_tls_options(query)?;
        // Parsed once without the TLS options, to learn whether every host is a Unix socket.
        let bare: postgres::Config =
            format!("{base}?{}", kept.join("&"))
                .parse()
                .map_err(|error: postgres::Error| ShipError::Url {
                    reason: error.to_string(),
                })?;
        let is_socket_only = bare.get_hostaddrs().is_empty()
            && !bare.get_hosts().is_empty()
            && bare
                .get_hosts()
                .iter()
                .all(|host| !matches!(host, postgres::config::Host::Tcp(_)));
        let (mode_for_client, tls) = tls_of(mode.as_deref(), is_socket_only, root_file)?;
        kept.push(match mode_for_client {
            "disable" => "sslmode=disable",
            "require" => "sslmode=require",
            _ => "sslmode=prefer",
        });
        let rebuilt = format!("{base}?{}", kept.join("&"));
        let mut config: postgres::Config =
            rebuilt
                .parse()
                .map_err(|error: postgres::Error| ShipError::Url {
                    reason: error.to_string(),
                })?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT_DEFAULT);
        }
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
        })
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

    /// Connects (one attempt, bounded by the connect timeout).
    pub fn connect(&self) -> Result<postgres::Client, ShipError> {
        let server = |source| ShipError::Server {
            target: self.shown.clone(),
            error: source,
        };
        match &self.tls {
            Tls::Disabled => self.config.connect(postgres::NoTls).map_err(server),
            #[cfg(feature = "tls")]
            Tls::Rustls { root_file } => {
                let tls =
                    rustls_connector(root_file.as_ref()).map_err(|reason| ShipError::Tls {
                        target: self.shown.clone(),
                        reason,
                    })?;
                self.config.connect(tls).map_err(server)
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

/// What libpq matches a password file's lines against: the first host (a Unix socket
/// directory as it is; none as `localhost`), its port, the database and the user (each
/// The URL's options split into those the client library is given (`kept`) and the TLS ones
/// this module handles itself: `sslmode` and `sslrootcert`. Client certificates are refused.
#[allow(clippy::type_complexity)]
fn split_tls_options(
    query: Option<&str>,
) -> Result<(Vec<&str>, Option<String>, Option<PathBuf>), ShipError> {
    let mut kept: Vec<&str> = Vec::new();
    let mut mode: Option<String> = None;
    let mut root_file: Option<PathBuf> = None;
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
            "sslmode" => mode = Some(value),
            "sslrootcert" => root_file = Some(PathBuf::from(value)),
            "sslcert" | "sslkey" | "sslpassword" | "sslcrl" => {
                return Err(ShipError::Url {
                    reason: format!("{key} is not supported (no client certificates)"),
                });
            }
            _ => kept.push(pair),
        }
    }
    Ok((kept, mode, root_file))
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

/// defaulted as the client defaults it).
fn password_lookup(config: &postgres::Config) -> (String, u16, String, String) {
    use postgres::config::Host;
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

fn shown_target(config: &postgres::Config) -> String {
    use postgres::config::Host;
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
        use postgres::config::SslMode;
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
            postgres::config::SslMode::Require
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
