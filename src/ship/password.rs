//! Where a password comes from when the URL holds none, as libpq finds it: `PGPASSWORD`, then
//! the password file (`PGPASSFILE`, else `~/.pgpass`), so that a password need never be on a
//! command line, where every user of the machine can read it (`/proc/<pid>/cmdline`).
//!
//! The file has libpq's format: one `host:port:database:user:password` a line, `#` starting a
//! comment line, `*` as a whole field matching anything, `\` escaping the next character (a
//! `:` or `\` inside a field). The first line that matches wins. As libpq does, a file that is
//! not a regular file, or that its group or others may read or write (mode not 0600 or
//! stricter), is ignored with a warning; a file that does not exist is no warning.
//!
//! Invariant: [`find`] never returns a password the caller did not ask for by user, host, port
//! and database; the file's lines are only parsed here.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The variable holding a password (libpq's).
pub const PASSWORD_ENV: &str = "PGPASSWORD";

/// The variable naming the password file (libpq's).
pub const PASSWORD_FILE_ENV: &str = "PGPASSFILE";

/// The largest password file read: libpq's files are a few lines; anything much larger is not
/// one.
const PASSWORD_FILE_BYTES_MAX: u64 = 1024 * 1024;

/// What a password is looked up for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lookup<'a> {
    /// The host as libpq matches it: a TCP host name or address, `localhost` for no host, or a
    /// Unix socket directory.
    pub host: &'a str,
    pub port: u16,
    pub database: &'a str,
    pub user: &'a str,
}

/// Where to look, read from the environment by [`Sources::from_env`] (apart for tests).
#[derive(Debug, Clone, Default)]
pub struct Sources {
    /// `PGPASSWORD`, when set and not empty.
    pub password: Option<String>,
    /// The password file: `PGPASSFILE`, else `~/.pgpass`.
    pub file: Option<PathBuf>,
}

impl Sources {
    /// The sources the environment names.
    pub fn from_env() -> Sources {
        let password = std::env::var(PASSWORD_ENV)
            .ok()
            .filter(|password| !password.is_empty());
        let file = std::env::var_os(PASSWORD_FILE_ENV)
            .filter(|path| !path.is_empty())
            .map(PathBuf::from)
            .or_else(|| home_dir().map(|home| home.join(".pgpass")));
        Sources { password, file }
    }
}

/// The home directory: `$HOME`, else the user database's.
fn home_dir() -> Option<PathBuf> {
    std::env::var_os("HOME")
        .filter(|home| !home.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            nix::unistd::User::from_uid(nix::unistd::getuid())
                .ok()
                .flatten()
                .map(|user| user.dir)
        })
}

/// A password found, with where it came from (for messages; never the password itself).
#[derive(Clone, PartialEq, Eq)]
pub struct Found {
    pub password: String,
    pub origin: String,
}

impl std::fmt::Debug for Found {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Found(from {})", self.origin)
    }
}

/// The password for `lookup`: `PGPASSWORD`, else the first matching line of the password
/// file. Warnings (a password file ignored, and why) are pushed onto `warnings`.
pub fn find(sources: &Sources, lookup: &Lookup<'_>, warnings: &mut Vec<String>) -> Option<Found> {
    if let Some(password) = &sources.password {
        return Some(Found {
            password: password.clone(),
            origin: PASSWORD_ENV.to_string(),
        });
    }
    let path = sources.file.as_ref()?;
    let text = read_private_file(path, warnings)?;
    let password = match_lines(&text, lookup)?;
    Some(Found {
        password,
        origin: path.display().to_string(),
    })
}

/// The file's text, or `None` (with a warning unless it does not exist) when it is not a
/// regular file, is open to the group or others, or cannot be read.
fn read_private_file(path: &Path, warnings: &mut Vec<String>) -> Option<String> {
    let metadata = match std::fs::metadata(path) {
        Ok(metadata) => metadata,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return None,
        Err(error) => {
            warnings.push(format!("password file {}: {error}", path.display()));
            return None;
        }
    };
    if !metadata.is_file() {
        warnings.push(format!(
            "password file {} is not a plain file; it is ignored",
            path.display()
        ));
        return None;
    }
    if metadata.permissions().mode() & 0o077 != 0 {
        warnings.push(format!(
            "password file {} has group or world access; it is ignored (permissions should be u=rw (0600) or less)",
            path.display()
        ));
        return None;
    }
    if metadata.len() > PASSWORD_FILE_BYTES_MAX {
        warnings.push(format!(
            "password file {} is over {PASSWORD_FILE_BYTES_MAX} bytes; it is ignored",
            path.display()
        ));
        return None;
    }
    match std::fs::read(path) {
        Ok(bytes) => match String::from_utf8(bytes) {
            Ok(text) => Some(text),
            Err(_) => {
                warnings.push(format!(
                    "password file {} is not UTF-8; it is ignored",
                    path.display()
                ));
                None
            }
        },
        Err(error) => {
            warnings.push(format!("password file {}: {error}", path.display()));
            None
        }
    }
}

/// The password of the first line of `text` that matches `lookup` (pure).
pub fn match_lines(text: &str, lookup: &Lookup<'_>) -> Option<String> {
    let port = lookup.port.to_string();
    let wanted = [lookup.host, port.as_str(), lookup.database, lookup.user];
    text.lines()
        .map(|line| line.strip_suffix('\r').unwrap_or(line))
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .find_map(|line| {
            let mut rest = line;
            for value in wanted {
                rest = field_matches(rest, value)?;
            }
            Some(unescape_password(rest))
        })
}

/// When the field at the start of `line` matches `value` (`*` alone matches anything; `\`
/// escapes the next character), the rest of the line after the field's `:`.
fn field_matches<'a>(line: &'a str, value: &str) -> Option<&'a str> {
    if let Some(rest) = line.strip_prefix("*:") {
        return Some(rest);
    }
    let mut chars = line.char_indices();
    let mut expected = value.chars();
    while let Some((index, c)) = chars.next() {
        let c = match c {
            ':' => {
                return expected.next().is_none().then(|| &line[index + 1..]);
            }
            '\\' => match chars.next() {
                Some((_, escaped)) => escaped,
                None => return None,
            },
            c => c,
        };
        if expected.next() != Some(c) {
            return None;
        }
    }
    // A line that ends before its password field is no match.
    None
}

/// The password field: up to an unescaped `:` or the end, with `\` escapes removed.
fn unescape_password(field: &str) -> String {
    let mut password = String::with_capacity(field.len());
    let mut chars = field.chars();
    while let Some(c) = chars.next() {
        match c {
            ':' => break,
            '\\' => match chars.next() {
                Some(escaped) => password.push(escaped),
                None => password.push('\\'),
            },
            c => password.push(c),
        }
    }
    password
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup() -> Lookup<'static> {
        Lookup {
            host: "db.example",
            port: 5432,
            database: "fleet",
            user: "ship",
        }
    }

    #[test]
    fn the_first_matching_line_wins_and_wildcards_match_anything() {
        let text = "# comment\n\
                    other:5432:fleet:ship:wrong-host\n\
                    db.example:5433:fleet:ship:wrong-port\n\
                    db.example:5432:fleet:reader:wrong-user\n\
                    *:5432:*:ship:right\n\
                    db.example:5432:fleet:ship:later\n";
        assert_eq!(match_lines(text, &lookup()).as_deref(), Some("right"));
        assert_eq!(
            match_lines("db.example:*:fleet:ship:exact\r\n", &lookup()).as_deref(),
            Some("exact")
        );
        assert_eq!(match_lines("db.example:5432:fleet:ship\n", &lookup()), None);
        assert_eq!(match_lines("db.example:5432:fleet\n", &lookup()), None);
        assert_eq!(match_lines("", &lookup()), None);
    }

    #[test]
    fn backslashes_escape_colons_and_backslashes_in_fields_and_the_password() {
        let lookup = Lookup {
            host: "/run/pg:1",
            port: 5432,
            database: "a\\b",
            user: "ship",
        };
        let text = "/run/pg\\:1:5432:a\\\\b:ship:p\\:w\\\\d:ignored\n";
        assert_eq!(match_lines(text, &lookup).as_deref(), Some("p:w\\d"));
        // An escaped star is a star, not a wildcard.
        assert_eq!(
            match_lines("\\*:5432:a\\\\b:ship:x\n", &lookup),
            None,
            "\\* matches only a host named *"
        );
    }

    #[test]
    fn pgpassword_comes_before_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pgpass");
        std::fs::write(&file, "*:*:*:*:from-file\n").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let mut warnings = Vec::new();
        let mut sources = Sources {
            password: Some("from-env".to_string()),
            file: Some(file.clone()),
        };
        let found = find(&sources, &lookup(), &mut warnings).unwrap();
        assert_eq!(found.password, "from-env");
        assert_eq!(found.origin, PASSWORD_ENV);
        sources.password = None;
        assert_eq!(
            find(&sources, &lookup(), &mut warnings).unwrap().password,
            "from-file"
        );
        assert!(warnings.is_empty(), "{warnings:?}");
    }

    #[test]
    fn a_file_open_to_others_is_ignored_with_a_warning_and_a_missing_one_silently() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pgpass");
        std::fs::write(&file, "*:*:*:*:secret\n").unwrap();
        for mode in [0o640, 0o604, 0o660] {
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
            let mut warnings = Vec::new();
            let sources = Sources {
                password: None,
                file: Some(file.clone()),
            };
            assert_eq!(find(&sources, &lookup(), &mut warnings), None, "{mode:o}");
            assert_eq!(warnings.len(), 1, "{mode:o}");
            assert!(
                warnings[0].contains("group or world access"),
                "{warnings:?}"
            );
        }
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o400)).unwrap();
        let mut warnings = Vec::new();
        let sources = Sources {
            password: None,
            file: Some(file.clone()),
        };
        assert!(find(&sources, &lookup(), &mut warnings).is_some());
        let missing = Sources {
            password: None,
            file: Some(dir.path().join("absent")),
        };
        assert_eq!(find(&missing, &lookup(), &mut warnings), None);
        let directory = Sources {
            password: None,
            file: Some(dir.path().to_path_buf()),
        };
        assert_eq!(find(&directory, &lookup(), &mut warnings), None);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains("not a plain file"), "{warnings:?}");
    }
}
