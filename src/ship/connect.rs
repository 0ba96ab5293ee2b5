//! From a PostgreSQL URL to a connection.
//!
//! The URL is what tokio-postgres reads (`postgresql://user:password@host:port/db?options`;
//! a Unix socket directory as `?host=/run/postgresql`), with the TLS options handled here:
//!
//! * `sslmode=disable` — plain connection.
//! * `sslmode=prefer` (the default, as for libpq) — TLS when the server offers it.
//! * `sslmode=require` and `sslmode=verify-full` — TLS or no connection.
//! * `sslrootcert=FILE` — trust the PEM certificates in FILE instead of the system's roots.
//!
//! TLS is rustls (ring provider), so nothing links a system library; it is the cargo feature
//! `tls`, on by default (ring compiles C for its target: a build for a target without a C
//! toolchain, such as CI's lint of the macOS targets, turns it off, and then `prefer` connects
//! without TLS while `require` and `verify-full` are refused). Whenever TLS is used the
//! server's certificate is verified against the roots *and* its host name, so `prefer` and
//! `require` are as strict as libpq's `verify-full` (a server with a self-signed certificate
//! needs `sslrootcert`). `sslmode=verify-ca` (chain without host name) is refused rather than
//! silently upgraded. Client certificates (`sslcert`, `sslkey`) are not supported.

use std::path::PathBuf;
#[cfg(feature = "tls")]
use std::sync::Arc;
use std::time::Duration;

use percent_encoding::percent_decode_str;

use super::ShipError;

/// How long a connection attempt may take when the URL does not say (`connect_timeout`).
pub const CONNECT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);

/// A server to connect to.
#[derive(Clone)]
pub struct Target {
    config: postgres::Config,
    tls: Tls,
    shown: String,
}

#[derive(Clone)]
enum Tls {
    Disabled,
    #[cfg(feature = "tls")]
    Rustls {
        root_file: Option<PathBuf>,
    },
}

/// The TLS of `sslmode=prefer` (or none given): rustls, or none in a build without TLS.
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
        reason: "this build of runjournal has no TLS (built without the `tls` feature): use sslmode=disable, or a build with TLS".to_string(),
    })
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the password.
        write!(f, "Target({})", self.shown)
    }
}

impl Target {
    /// Parses a URL. Fails only on what the caller wrote (never contacts the server).
    pub fn parse(url: &str) -> Result<Target, ShipError> {
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
        let (mode_for_client, tls) = match mode.as_deref() {
            Some("disable") => ("disable", Tls::Disabled),
            None | Some("prefer") => ("prefer", preferred_tls(root_file)?),
            Some("require") | Some("verify-full") => ("require", required_tls(root_file)?),
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
        Ok(Target { config, tls, shown })
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

    #[test]
    fn a_unix_socket_directory_is_a_host() {
        let target = Target::parse("postgresql:///fleet?host=/tmp/pg&user=postgres").unwrap();
        assert_eq!(target.shown(), "postgres@/tmp/pg:5432/fleet");
    }

    #[cfg(feature = "tls")]
    #[test]
    fn tls_modes_are_mapped_or_refused() {
        for (url, is_ok) in [
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
