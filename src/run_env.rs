//! The launcher's environment, kept with a run (docs/design.md, "Environment"): the variables,
//! working directory and umask of whoever launched it, so that every runner of the run — the
//! launcher's own, or one started later by whoever admits it from a queue, a resume, a retry
//! or a timer — starts its steps with exactly that environment, never its starter's.
//!
//! The values are secrets. They live in the home only, in a journal table of their own
//! (`run_env`, docs/journal-format.md) written in the transaction of the run's creation batch,
//! never in a record: records are shipped verbatim, and an environment is not.
//! [`RunEnvironment`]'s `Debug` shows names, never values.
//!
//! Invariants:
//! * an environment is bounded ([`MAX_ENV_BYTES`], [`MAX_ENV_VARS`]); one past the bound is
//!   refused before anything is written;
//! * a step of a run with a recorded environment starts with that environment alone (cleared,
//!   then set), its cwd and its umask ([`StepEnvironment::apply`]), whoever started its runner.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};

use crate::event::{self, MAX_ENV_BYTES, MAX_ENV_VARS};
use crate::platform;

/// The layout of the stored environment this build writes and reads.
const ENV_LAYOUT: u16 = 1;

/// Most bytes of a stored environment: the variables' bound, and room for the cwd and framing.
pub const MAX_STORED_ENV_BYTES: usize = MAX_ENV_BYTES + 2 * event::MAX_TEXT_BYTES + 64 * 1024;

/// A run's environment as its launcher gave it: variables (sorted by name, each name once),
/// working directory and umask. Bytes, as the OS has them: a name or value need not be UTF-8.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunEnvironment {
    pub vars: Vec<(Vec<u8>, Vec<u8>)>,
    /// The launcher's working directory: a step's cwd, or what a relative spec cwd is taken
    /// from. `None`: it had none that could be read.
    pub cwd: Option<Vec<u8>>,
    /// The launcher's file mode creation mask.
    pub umask: Option<u32>,
}

impl fmt::Debug for RunEnvironment {
    /// Names only: the values are secrets.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunEnvironment")
            .field(
                "names",
                &self
                    .vars
                    .iter()
                    .map(|(name, _)| String::from_utf8_lossy(name))
                    .collect::<Vec<_>>(),
            )
            .field("cwd", &self.cwd.as_deref().map(String::from_utf8_lossy))
            .field("umask", &self.umask.map(|umask| format!("{umask:04o}")))
            .finish()
    }
}

/// Why an environment cannot be kept with a run. Nothing was written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EnvError {
    #[error(
        "the run's environment is {bytes} bytes, over the limit of {MAX_ENV_BYTES}; launch it with --clear-env and the --env it needs, or unset large variables"
    )]
    TooLarge { bytes: usize },
    #[error(
        "the run's environment has {count} variables, over the limit of {MAX_ENV_VARS}; launch it with --clear-env and the --env it needs"
    )]
    TooMany { count: usize },
    #[error(
        "environment variable name {name:?} is not one: it must be non-empty, without '=' or a NUL"
    )]
    BadName { name: String },
    #[error("environment variable {name} has a NUL in its value")]
    BadValue { name: String },
}

/// Why stored environment bytes do not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the stored environment does not read: {reason}")]
pub struct EnvDecodeError {
    pub reason: String,
}

/// Checks a variable's name and value as `--env` or a spec gives them.
pub fn check_var(name: &[u8], value: &[u8]) -> Result<(), EnvError> {
    if name.is_empty() || name.contains(&b'=') || name.contains(&0) {
        return Err(EnvError::BadName {
            name: String::from_utf8_lossy(name).chars().take(64).collect(),
        });
    }
    if value.contains(&0) {
        return Err(EnvError::BadValue {
            name: String::from_utf8_lossy(name).chars().take(64).collect(),
        });
    }
    Ok(())
}

impl RunEnvironment {
    /// The environment this process would give a run: its own variables (none with `clear`),
    /// then `set` over them, its working directory and its umask. Refused past the bounds.
    pub fn capture(set: &[(String, String)], clear: bool) -> Result<RunEnvironment, EnvError> {
        let inherited: Vec<(OsString, OsString)> = if clear {
            Vec::new()
        } else {
            std::env::vars_os().collect()
        };
        let cwd = std::env::current_dir().ok();
        RunEnvironment::of(
            inherited
                .into_iter()
                .map(|(name, value)| (name.into_vec(), value.into_vec())),
            set,
            cwd.as_deref(),
            Some(platform::umask()),
        )
    }

    /// `base`, with `set` over it, in `cwd` with `umask`: sorted, each name once (the last
    /// given wins), checked against the bounds.
    pub fn of(
        base: impl IntoIterator<Item = (Vec<u8>, Vec<u8>)>,
        set: &[(String, String)],
        cwd: Option<&Path>,
        umask: Option<u32>,
    ) -> Result<RunEnvironment, EnvError> {
        let mut vars: std::collections::BTreeMap<Vec<u8>, Vec<u8>> = base.into_iter().collect();
        for (name, value) in set {
            vars.insert(name.as_bytes().to_vec(), value.as_bytes().to_vec());
        }
        let environment = RunEnvironment {
            vars: vars.into_iter().collect(),
            cwd: cwd.map(|cwd| cwd.as_os_str().as_bytes().to_vec()),
            umask,
        };
        environment.check()?;
        Ok(environment)
    }

    /// This environment with `set` over it (`clear`: only `set`), in the same cwd and umask: a
    /// resume's, from the paused run's.
    pub fn overlay(
        &self,
        set: &[(String, String)],
        clear: bool,
    ) -> Result<RunEnvironment, EnvError> {
        let base = if clear { Vec::new() } else { self.vars.clone() };
        let cwd = self
            .cwd
            .as_deref()
            .map(|cwd| Path::new(OsStr::from_bytes(cwd)));
        RunEnvironment::of(base, set, cwd, self.umask)
    }

    /// Checks every name and value and the bounds.
    pub fn check(&self) -> Result<(), EnvError> {
        if self.vars.len() > MAX_ENV_VARS {
            return Err(EnvError::TooMany {
                count: self.vars.len(),
            });
        }
        let bytes = self.bytes();
        if bytes > MAX_ENV_BYTES {
            return Err(EnvError::TooLarge { bytes });
        }
        for (name, value) in &self.vars {
            check_var(name, value)?;
        }
        Ok(())
    }

    /// The variables' size, as the bounds count it.
    pub fn bytes(&self) -> usize {
        self.vars
            .iter()
            .map(|(name, value)| name.len() + value.len() + 2)
            .sum()
    }

    /// The variables' names, for showing without the values.
    pub fn names(&self) -> impl Iterator<Item = String> + '_ {
        self.vars
            .iter()
            .map(|(name, _)| String::from_utf8_lossy(name).into_owned())
    }

    /// The working directory, as a path.
    pub fn cwd_path(&self) -> Option<&Path> {
        self.cwd
            .as_deref()
            .map(|cwd| Path::new(OsStr::from_bytes(cwd)))
    }

    /// The stored bytes (the `run_env` table): layout, then postcard, then a CRC-32C.
    pub fn encode(&self) -> Vec<u8> {
        let stored = Stored {
            layout: ENV_LAYOUT,
            environment: self.clone(),
        };
        // A Vec of bytes and integers always encodes.
        event::encode_checked(&stored).expect("an environment encodes")
    }

    /// Reads stored bytes back, checking the checksum, the layout and the bounds: what comes
    /// from disk is checked like input.
    pub fn decode(bytes: &[u8]) -> Result<RunEnvironment, EnvDecodeError> {
        let stored: Stored =
            event::decode_checked(bytes, MAX_STORED_ENV_BYTES).map_err(|error| EnvDecodeError {
                reason: error.to_string(),
            })?;
        if stored.layout != ENV_LAYOUT {
            return Err(EnvDecodeError {
                reason: format!("layout {} (this build reads {ENV_LAYOUT})", stored.layout),
            });
        }
        stored.environment.check().map_err(|error| EnvDecodeError {
            reason: error.to_string(),
        })?;
        Ok(stored.environment)
    }
}

/// [`RunEnvironment`] as stored: its layout first, which [`event::decode_checked`] reads as
/// the format version it checks first.
#[derive(Serialize, Deserialize)]
struct Stored {
    layout: u16,
    environment: RunEnvironment,
}

/// What a run keeps in the home only, written with its creation batch: its environment, and
/// the completion hooks it gave itself (`run --on-exit`). Travels with the batch, also to a
/// commit leader, never into a record.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunPrivate {
    pub env: Option<RunEnvironment>,
    pub on_exit: Vec<String>,
}

impl RunPrivate {
    /// Whether there is anything to keep.
    pub fn is_empty(&self) -> bool {
        self.env.is_none() && self.on_exit.is_empty()
    }
}

/// A run's completion hooks (docs/design.md, "Hooks"): shell commands, run with `sh -c`, as
/// the `run_hooks` table stores them: its own (`run --on-exit`), then, once the run has ended,
/// the home's hook that was in force then. A hook is named by its place in [`Self::all`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HookCommands {
    pub own: Vec<String>,
    pub home: Option<String>,
}

/// Most bytes of a stored hook list: every hook at the text limit, with room for framing.
const MAX_STORED_HOOKS_BYTES: usize =
    (event::MAX_HOOKS as usize) * (event::MAX_TEXT_BYTES + 8) + 64;

impl HookCommands {
    /// Every hook, in order: hook `i` is `all()[i]`.
    pub fn all(&self) -> Vec<&str> {
        self.own
            .iter()
            .map(String::as_str)
            .chain(self.home.as_deref())
            .collect()
    }

    /// How many hooks there are.
    pub fn len(&self) -> usize {
        self.own.len() + usize::from(self.home.is_some())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The stored bytes: layout, then postcard, then a CRC-32C.
    pub fn encode(&self) -> Vec<u8> {
        let stored = StoredHooks {
            layout: ENV_LAYOUT,
            hooks: self.clone(),
        };
        event::encode_checked(&stored).expect("a list of texts encodes")
    }

    /// Reads stored bytes back, checking the checksum, the layout and the bounds.
    pub fn decode(bytes: &[u8]) -> Result<HookCommands, EnvDecodeError> {
        let stored: StoredHooks =
            event::decode_checked(bytes, MAX_STORED_HOOKS_BYTES).map_err(|error| {
                EnvDecodeError {
                    reason: error.to_string(),
                }
            })?;
        let hooks = stored.hooks;
        let is_bounded = hooks.own.len() <= event::MAX_RUN_HOOKS
            && hooks
                .all()
                .iter()
                .all(|command| command.len() <= event::MAX_TEXT_BYTES);
        if stored.layout != ENV_LAYOUT || !is_bounded {
            return Err(EnvDecodeError {
                reason: "not a hook list this build writes".to_string(),
            });
        }
        Ok(hooks)
    }
}

#[derive(Serialize, Deserialize)]
struct StoredHooks {
    layout: u16,
    hooks: HookCommands,
}

/// Why a hook command cannot be one of a run's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HookCommandError {
    #[error("an --on-exit hook is empty")]
    Empty,
    #[error(
        "an --on-exit hook is {bytes} bytes, over the limit of {}",
        event::MAX_TEXT_BYTES
    )]
    TooLong { bytes: usize },
    #[error("{count} --on-exit hooks, over the limit of {}", event::MAX_RUN_HOOKS)]
    TooMany { count: usize },
}

/// Checks a run's own hooks: at most [`event::MAX_RUN_HOOKS`], each a non-empty command within
/// the text limit.
pub fn check_hook_commands(commands: &[String]) -> Result<(), HookCommandError> {
    if commands.len() > event::MAX_RUN_HOOKS {
        return Err(HookCommandError::TooMany {
            count: commands.len(),
        });
    }
    for command in commands {
        check_hook_command(command)?;
    }
    Ok(())
}

/// Checks one hook command: non-empty, within the text limit.
pub fn check_hook_command(command: &str) -> Result<(), HookCommandError> {
    if command.trim().is_empty() {
        return Err(HookCommandError::Empty);
    }
    if command.len() > event::MAX_TEXT_BYTES {
        return Err(HookCommandError::TooLong {
            bytes: command.len(),
        });
    }
    Ok(())
}

/// How a run's steps (and its hooks) start: the recorded environment, in the cwd its spec
/// names (taken from the launcher's when relative), with the launcher's umask. Made once per
/// runner from the journal, so every start path — the launcher's, a queue's admitter, a
/// resume, a retry, a timer — starts steps the same way.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepEnvironment {
    /// `None`: a run recorded without one (by an earlier version): the starter's own
    /// environment, as then.
    pub recorded: Option<RunEnvironment>,
    pub cwd: Option<PathBuf>,
}

impl StepEnvironment {
    /// The environment of a run whose spec names `spec_cwd` and whose launcher recorded
    /// `recorded`.
    pub fn of(spec_cwd: Option<&str>, recorded: Option<RunEnvironment>) -> StepEnvironment {
        let launcher_cwd = recorded.as_ref().and_then(RunEnvironment::cwd_path);
        let cwd = match (spec_cwd, launcher_cwd) {
            (Some(cwd), Some(base)) => Some(base.join(cwd)),
            (Some(cwd), None) => Some(PathBuf::from(cwd)),
            (None, base) => base.map(Path::to_path_buf),
        };
        StepEnvironment { recorded, cwd }
    }

    /// Sets `command` up to start in this environment: with a recorded one, the environment
    /// cleared and set to it, and the umask set in the child; the cwd. Call it before adding
    /// variables of runjournal's own: clearing removes those set before.
    pub fn apply(&self, command: &mut Command) {
        if let Some(recorded) = &self.recorded {
            command.env_clear();
            for (name, value) in &recorded.vars {
                command.env(OsStr::from_bytes(name), OsStr::from_bytes(value));
            }
            if let Some(mask) = recorded.umask {
                // SAFETY: one system call (umask), async-signal-safe, between fork and exec.
                unsafe {
                    command.pre_exec(move || {
                        platform::set_umask(mask);
                        Ok(())
                    });
                }
            }
        }
        if let Some(cwd) = &self.cwd {
            command.current_dir(cwd);
        }
    }

    /// The cwd, if it is still a directory: a hook runs there, else in `/`.
    pub fn existing_cwd(&self) -> Option<&Path> {
        self.cwd.as_deref().filter(|cwd| cwd.is_dir())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn var(name: &str, value: &str) -> (Vec<u8>, Vec<u8>) {
        (name.as_bytes().to_vec(), value.as_bytes().to_vec())
    }

    #[test]
    fn set_variables_go_over_the_base_and_the_result_is_sorted() {
        let environment = RunEnvironment::of(
            [var("PATH", "/a"), var("B", "1")],
            &[("PATH".to_string(), "/b".to_string())],
            Some(Path::new("/work")),
            Some(0o022),
        )
        .expect("small");
        assert_eq!(environment.vars, vec![var("B", "1"), var("PATH", "/b")]);
        assert_eq!(environment.cwd_path(), Some(Path::new("/work")));
    }

    #[test]
    fn an_environment_past_its_bounds_is_refused() {
        let big = "x".repeat(MAX_ENV_BYTES);
        let refused = RunEnvironment::of([var("BIG", &big)], &[], None, None);
        assert!(
            matches!(refused, Err(EnvError::TooLarge { .. })),
            "{refused:?}"
        );
        let many = (0..=MAX_ENV_VARS).map(|index| var(&format!("V{index}"), ""));
        let refused = RunEnvironment::of(many, &[], None, None);
        assert!(
            matches!(refused, Err(EnvError::TooMany { .. })),
            "{refused:?}"
        );
        let refused = RunEnvironment::of([], &[("A=B".to_string(), "c".to_string())], None, None);
        assert!(
            matches!(refused, Err(EnvError::BadName { .. })),
            "{refused:?}"
        );
    }

    #[test]
    fn the_stored_bytes_read_back_and_a_flipped_byte_does_not() {
        let environment = RunEnvironment::of(
            [var("SECRET", "s3cr3t"), (b"RAW".to_vec(), vec![0xff, 0xfe])],
            &[],
            Some(Path::new("/tmp")),
            Some(0o027),
        )
        .expect("small");
        let bytes = environment.encode();
        assert_eq!(RunEnvironment::decode(&bytes), Ok(environment));
        let mut damaged = bytes.clone();
        let last = damaged.len() - 6;
        damaged[last] ^= 1;
        assert!(RunEnvironment::decode(&damaged).is_err());
    }

    #[test]
    fn its_debug_names_variables_and_never_shows_a_value() {
        let environment =
            RunEnvironment::of([var("TOKEN", "hunter2")], &[], None, None).expect("small");
        let shown = format!("{environment:?}");
        assert!(shown.contains("TOKEN"), "{shown}");
        assert!(!shown.contains("hunter2"), "{shown}");
    }

    #[test]
    fn a_relative_spec_cwd_is_taken_from_the_launchers() {
        let recorded = RunEnvironment::of([], &[], Some(Path::new("/home/a")), None).ok();
        let environment = StepEnvironment::of(Some("sub"), recorded.clone());
        assert_eq!(environment.cwd, Some(PathBuf::from("/home/a/sub")));
        let environment = StepEnvironment::of(Some("/abs"), recorded.clone());
        assert_eq!(environment.cwd, Some(PathBuf::from("/abs")));
        let environment = StepEnvironment::of(None, recorded);
        assert_eq!(environment.cwd, Some(PathBuf::from("/home/a")));
    }

    #[test]
    fn a_step_started_in_a_recorded_environment_sees_it_and_nothing_of_its_starter() {
        let recorded = RunEnvironment::of(
            [
                var("ONLY_THIS", "from-the-launcher"),
                var("PATH", "/usr/bin:/bin"),
            ],
            &[],
            Some(Path::new("/")),
            Some(0o077),
        )
        .expect("small");
        let environment = StepEnvironment::of(None, Some(recorded));
        let mut command = Command::new("/bin/sh");
        command.args(["-c", "env; umask; pwd"]);
        environment.apply(&mut command);
        let output = command.output().expect("sh runs");
        let text = String::from_utf8_lossy(&output.stdout);
        assert!(text.contains("ONLY_THIS=from-the-launcher"), "{text}");
        assert!(
            !text.contains("CARGO"),
            "the starter's variables leaked: {text}"
        );
        assert!(text.lines().any(|line| line == "0077"), "{text}");
        assert!(text.lines().any(|line| line == "/"), "{text}");
    }
}
