//! What a person or a host writes to describe a run: the JSON of a spec file (`runjournal run
//! --spec FILE`) and step names derived from commands. Durations (`timeout`) are read by
//! [`crate::duration`], the one grammar of every binary.
//!
//! Everything here is pure and checked on the way in: a spec that parses here still goes through
//! [`RunSpec::check`] before anything is written.

use std::time::Duration;

use serde::Deserialize;

use crate::duration::{DurationError, parse_duration};
use crate::event::{HostIds, Mode, RunSpec, SpecError, StepAction, StepSpec};

/// Longest step name derived from a command; longer commands are cut on a character boundary.
pub const DERIVED_NAME_MAX_BYTES: usize = 48;

/// The largest spec file `runjournal run --spec` reads, in bytes: a spec holds at most
/// `event::MAX_STEPS` steps of `event::MAX_STEP_BYTES`, far below it. A larger file (or an
/// endless one, `/dev/zero`) is refused after this many bytes and one more.
pub const MAX_SPEC_FILE_BYTES: u64 = 1 << 20;

/// A spec file: a run as JSON.
///
/// ```json
/// {
///   "name": "nightly",
///   "mode": "chain",
///   "timeout": "10m",
///   "env": {"DEPLOY_ENV": "staging"},
///   "onExit": ["notify-send \"nightly $RUNJOURNAL_RUN_STATE\""],
///   "steps": [
///     {"name": "fetch", "command": ["git", "fetch", "--all"]},
///     {"name": "build", "shell": "make -j2 && make test"},
///     {"name": "deploy", "externalJob": "./deploy-provider.sh"}
///   ]
/// }
/// ```
///
/// Each step has exactly one of `command` (a program and its arguments, no shell), `shell` (a
/// script for `sh -c`) or `externalJob` (a provider command for `sh -c` that reports the job on
/// stdout). `mode` defaults to `single` for one step and `chain` otherwise; `concurrency`
/// (parallel only) defaults to the number of steps. `env` sets variables over the launcher's
/// environment, which the run keeps (`clearEnv`: only these); `onExit` lists completion hooks,
/// shell commands run once the run has ended (docs/design.md, "Environment", "Hooks"). Unknown
/// fields are refused.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SpecFile {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub mode: Option<Mode>,
    #[serde(default)]
    pub concurrency: Option<u32>,
    /// A duration text, as [`parse_duration`] reads it, or `off`: no timeout, not even the
    /// home's default.
    #[serde(default)]
    pub timeout: Option<String>,
    /// A duration text: a step quiet this long (no output, no job status) is ended, timed out.
    #[serde(default)]
    pub idle_timeout: Option<String>,
    #[serde(default)]
    pub cwd: Option<String>,
    #[serde(default)]
    pub session_id: Option<String>,
    #[serde(default)]
    pub owner_id: Option<String>,
    #[serde(default)]
    pub tool_call_id: Option<String>,
    /// The queue the run waits in for a slot (docs/design.md, "Queues").
    #[serde(default)]
    pub queue: Option<String>,
    /// Variables set over the launcher's environment, which the run keeps.
    #[serde(default)]
    pub env: Option<std::collections::BTreeMap<String, String>>,
    /// The run keeps only `env`, none of the launcher's own variables.
    #[serde(default)]
    pub clear_env: Option<bool>,
    /// Completion hooks: shell commands run once the run has ended, whatever ended it.
    #[serde(default)]
    pub on_exit: Option<Vec<String>>,
    /// Runs (ids, unique prefixes or names) that must end `complete` before this run starts.
    #[serde(default)]
    pub after: Option<Vec<String>>,
    /// Runs that must end, however, before this run starts.
    #[serde(default)]
    pub after_any: Option<Vec<String>>,
    /// The key that makes the run launched once (`--unique`).
    #[serde(default)]
    pub unique: Option<String>,
    /// How long the key stays held after the run's creation, ended or not (`--unique-for`).
    #[serde(default)]
    pub unique_for: Option<String>,
    /// The run's tool-call id is its key (`--unique-tool-call`).
    #[serde(default)]
    pub unique_tool_call: Option<bool>,
    /// Attempts after the first, when one fails as `retryOn` says (`--retries`).
    #[serde(default)]
    pub retries: Option<u32>,
    /// The first retry's wait, and at most how long one waits: `D` or `D..MAX`
    /// (`--retry-backoff`).
    #[serde(default)]
    pub retry_backoff: Option<String>,
    /// Which failures are tried again: `exit`, `exit:CODE[:CODE...]`, `crash`, `timeout`, `any`,
    /// comma-separated (`--retry-on`).
    #[serde(default)]
    pub retry_on: Option<String>,
    pub steps: Vec<SpecFileStep>,
}

/// One step of a spec file.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SpecFileStep {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub command: Option<Vec<String>>,
    #[serde(default)]
    pub shell: Option<String>,
    #[serde(default)]
    pub external_job: Option<String>,
}

/// Why a spec (from a file or from command-line flags) cannot become a run. Nothing was written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SpecInputError {
    #[error("spec is not valid JSON for a run: {reason}")]
    Json { reason: String },
    #[error("step {step} needs exactly one of \"command\", \"shell\" or \"externalJob\"")]
    StepAction { step: usize },
    #[error("timeout: {0}")]
    Timeout(#[from] DurationError),
    #[error("idleTimeout: {0}")]
    IdleTimeout(DurationError),
    #[error("no steps: give -- CMD ARGS..., --step, --external-job or --spec")]
    NoSteps,
    #[error(transparent)]
    Invalid(#[from] SpecError),
    #[error(transparent)]
    Queue(#[from] crate::event::QueueNameError),
    #[error("unique: {reason}")]
    Unique { reason: String },
    #[error("retries: {reason}")]
    Retry { reason: String },
}

/// The environment a run keeps, as asked: the launcher's own variables with `set` over them,
/// or only `set` (`clear`). The launch reads the launcher's and checks the whole
/// (`run_env::RunEnvironment::capture`) before anything is written. Its `Debug` shows names
/// only: values may be secrets.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct EnvRequest {
    pub set: Vec<(String, String)>,
    pub clear: bool,
}

impl std::fmt::Debug for EnvRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EnvRequest")
            .field(
                "set",
                &self.set.iter().map(|(name, _)| name).collect::<Vec<_>>(),
            )
            .field("clear", &self.clear)
            .finish()
    }
}

/// A run ready to be created: its spec and the host's ids.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRequest {
    pub spec: RunSpec,
    pub hosts: HostIds,
    /// A step quiet this long is ended as timed out. A setting of the run's runner, which its
    /// launcher passes on (`__runner --idle-timeout`), not part of the journaled spec: what
    /// the journal keeps of it is the step's error when it fires.
    pub idle_timeout: Option<Duration>,
    /// The queue the run waits in for a slot; `None`: it starts at once.
    pub queue: Option<String>,
    /// How often its runner rewrites status.json while it lives, when not the default; kept
    /// for a queued run, whose runner someone else starts later.
    pub heartbeat: Option<Duration>,
    /// The environment the run keeps (its launcher's, unless cleared).
    pub env: EnvRequest,
    /// Its completion hooks (`--on-exit`), in order.
    pub on_exit: Vec<String>,
    /// Runs it waits for, to end `complete` (`--after`), as given: ids, unique prefixes or
    /// names, resolved in the journal at launch (docs/design.md, "Dependencies").
    pub after: Vec<String>,
    /// Runs it waits for, to end however (`--after-any`), as given.
    pub after_any: Vec<String>,
    /// When it may start (`--at`, `--delay`); `None`: at once.
    pub start_at_ms: Option<crate::event::UnixMs>,
    /// The key that makes it launched once (`--unique`; docs/design.md, "Launched once").
    pub unique: Option<UniqueRequest>,
    /// How it is tried again (`--retries`; docs/design.md, "Retries").
    pub retry: Option<RetryRequest>,
    /// Whether the home's default timeout applies when the spec names none (false: the run
    /// asked for none, `--timeout off`; docs/design.md, "Timeouts").
    pub home_timeout: bool,
}

/// A run tried again: up to `retries` attempts after the first, each failed as `on` says, the
/// k-th waiting `backoff · 2^(k-1)` (at most `backoff_max`, less up to half at random).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryRequest {
    pub retries: u32,
    pub backoff: Duration,
    pub backoff_max: Duration,
    pub on: crate::event::RetryOn,
}

/// The first retry's wait when none is given.
pub const DEFAULT_RETRY_BACKOFF: Duration = Duration::from_secs(1);

/// The longest a retry waits when no longest is given (and the first is shorter).
pub const DEFAULT_RETRY_BACKOFF_MAX: Duration = Duration::from_secs(600);

/// A backoff as `--retry-backoff` and `retryBackoff` take it: `D` (the first wait; at most
/// [`DEFAULT_RETRY_BACKOFF_MAX`] or `D`, whichever is longer) or `D..MAX`.
pub fn parse_retry_backoff(text: &str) -> Result<(Duration, Duration), String> {
    let (first, max) = match text.split_once("..") {
        Some((first, max)) => (first, Some(max)),
        None => (text, None),
    };
    let first = parse_duration(first.trim()).map_err(|error| format!("{text:?}: {error}"))?;
    let max = match max {
        Some(max) => parse_duration(max.trim()).map_err(|error| format!("{text:?}: {error}"))?,
        None => first.max(DEFAULT_RETRY_BACKOFF_MAX),
    };
    if max < first {
        return Err(format!(
            "{text:?}: its longest wait is shorter than its first"
        ));
    }
    Ok((first, max))
}

/// A run launched once: no other run is created with `key` while a run holding it has not
/// ended, nor, with `hold`, until that long after that run's creation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UniqueRequest {
    pub key: String,
    pub hold: Option<Duration>,
}

/// What a run is made of before defaults are applied: the flags of `runjournal run`, or a spec
/// file turned into the same shape.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunDraft {
    pub name: Option<String>,
    pub mode: Option<Mode>,
    pub concurrency: Option<u32>,
    pub timeout: Option<Duration>,
    /// No timeout at all, not even the home's default (`--timeout off`).
    pub no_timeout: bool,
    /// The runner's idle timeout (see [`RunRequest::idle_timeout`]).
    pub idle_timeout: Option<Duration>,
    pub cwd: Option<String>,
    pub hosts: HostIds,
    pub steps: Vec<StepSpec>,
    /// The queue (see [`RunRequest::queue`]).
    pub queue: Option<String>,
    /// The environment (see [`RunRequest::env`]).
    pub env: EnvRequest,
    /// The completion hooks (see [`RunRequest::on_exit`]).
    pub on_exit: Vec<String>,
    /// See [`RunRequest::after`].
    pub after: Vec<String>,
    /// See [`RunRequest::after_any`].
    pub after_any: Vec<String>,
    /// See [`RunRequest::unique`]: its key.
    pub unique: Option<String>,
    /// See [`RunRequest::unique`]: its hold.
    pub unique_for: Option<Duration>,
    /// See [`RunRequest::unique`]: the key is the run's tool-call id (`tool-call:ID`), as a
    /// pi-subagents host launches one run per tool call.
    pub unique_tool_call: bool,
    /// See [`RunRequest::retry`]: attempts after the first.
    pub retries: Option<u32>,
    /// See [`RunRequest::retry`]: the first wait and the longest.
    pub retry_backoff: Option<(Duration, Duration)>,
    /// See [`RunRequest::retry`]: which failures.
    pub retry_on: Option<crate::event::RetryOn>,
}

impl RunDraft {
    /// The retry policy asked, checked: retries with a backoff or causes need a count.
    fn retry(&self) -> Result<Option<RetryRequest>, SpecInputError> {
        let Some(retries) = self.retries else {
            if self.retry_backoff.is_some() || self.retry_on.is_some() {
                return Err(SpecInputError::Retry {
                    reason: "a backoff (retryBackoff, --retry-backoff) or causes (retryOn, \
                             --retry-on) need a count (retries, --retries)"
                        .to_string(),
                });
            }
            return Ok(None);
        };
        let (backoff, backoff_max) = self
            .retry_backoff
            .unwrap_or((DEFAULT_RETRY_BACKOFF, DEFAULT_RETRY_BACKOFF_MAX));
        let millis = |duration: Duration| u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
        if let Some(flaw) =
            crate::event::retry_policy_flaw(retries, millis(backoff), millis(backoff_max))
        {
            return Err(SpecInputError::Retry { reason: flaw });
        }
        Ok(Some(RetryRequest {
            retries,
            backoff,
            backoff_max,
            on: self
                .retry_on
                .clone()
                .unwrap_or_else(crate::event::RetryOn::default_causes),
        }))
    }

    /// Applies the defaults (mode from the step count, concurrency = step count in parallel
    /// mode) and checks the result with [`RunSpec::check`].
    pub fn finish(self) -> Result<RunRequest, SpecInputError> {
        let retry = self.retry()?;
        if self.steps.is_empty() {
            return Err(SpecInputError::NoSteps);
        }
        let mode = self.mode.unwrap_or(if self.steps.len() == 1 {
            Mode::Single
        } else {
            Mode::Chain
        });
        let concurrency = match mode {
            Mode::Parallel => self
                .concurrency
                .unwrap_or_else(|| u32::try_from(self.steps.len()).unwrap_or(u32::MAX)),
            Mode::Single | Mode::Chain => 1,
        };
        let spec = RunSpec {
            name: self.name,
            mode,
            concurrency,
            timeout_ms: self
                .timeout
                .map(|timeout| u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX)),
            cwd: self.cwd,
            steps: self.steps,
        };
        spec.check()?;
        self.hosts.check()?;
        if let Some(queue) = &self.queue {
            crate::event::check_queue_name(queue)?;
        }
        let key = match (self.unique, self.unique_tool_call, &self.hosts.tool_call_id) {
            (Some(_), true, _) => {
                return Err(SpecInputError::Unique {
                    reason: "give a key (unique, --unique) or ask for the tool-call id's \
                             (uniqueToolCall, --unique-tool-call), not both"
                        .to_string(),
                });
            }
            (None, true, None) => {
                return Err(SpecInputError::Unique {
                    reason: "the tool-call id's key (uniqueToolCall, --unique-tool-call) needs a \
                             tool-call id (toolCallId, --tool-call-id)"
                        .to_string(),
                });
            }
            (None, true, Some(tool_call_id)) => Some(format!("tool-call:{tool_call_id}")),
            (key, false, _) => key,
        };
        let unique = match (key, self.unique_for) {
            (Some(key), hold) => {
                if let Some(flaw) = crate::event::unique_key_flaw(&key) {
                    return Err(SpecInputError::Unique {
                        reason: format!("the key {flaw}"),
                    });
                }
                Some(UniqueRequest { key, hold })
            }
            (None, Some(_)) => {
                return Err(SpecInputError::Unique {
                    reason: "a hold (uniqueFor, --unique-for) needs a key (unique, --unique)"
                        .to_string(),
                });
            }
            (None, None) => None,
        };
        Ok(RunRequest {
            spec,
            hosts: self.hosts,
            idle_timeout: self.idle_timeout,
            queue: self.queue,
            heartbeat: None,
            env: self.env,
            on_exit: self.on_exit,
            after: self.after,
            after_any: self.after_any,
            start_at_ms: None,
            unique,
            retry,
            home_timeout: !self.no_timeout,
        })
    }
}

impl SpecFile {
    /// Parses a spec file's bytes.
    pub fn parse(bytes: &[u8]) -> Result<SpecFile, SpecInputError> {
        serde_json::from_slice(bytes).map_err(|error| SpecInputError::Json {
            reason: error.to_string(),
        })
    }

    /// The spec file as a draft, its steps resolved and its timeout parsed.
    pub fn into_draft(self) -> Result<RunDraft, SpecInputError> {
        let mut steps = Vec::with_capacity(self.steps.len());
        for (index, step) in self.steps.into_iter().enumerate() {
            let action = match (step.command, step.shell, step.external_job) {
                (Some(argv), None, None) => StepAction::Command { argv },
                (None, Some(script), None) => StepAction::Shell { script },
                (None, None, Some(provider)) => StepAction::ExternalJob { provider },
                _ => return Err(SpecInputError::StepAction { step: index }),
            };
            steps.push(match step.name {
                Some(name) => StepSpec { name, action },
                None => named_step(action),
            });
        }
        let no_timeout = self
            .timeout
            .as_deref()
            .is_some_and(|text| text.trim().eq_ignore_ascii_case("off"));
        let timeout = match self.timeout.as_deref() {
            Some(text) if !no_timeout => Some(parse_duration(text)?),
            _ => None,
        };
        let idle_timeout = self
            .idle_timeout
            .as_deref()
            .map(parse_duration)
            .transpose()
            .map_err(SpecInputError::IdleTimeout)?;
        let unique_for = self
            .unique_for
            .as_deref()
            .map(parse_duration)
            .transpose()
            .map_err(|error| SpecInputError::Unique {
                reason: format!("uniqueFor: {error}"),
            })?;
        let retry_backoff = self
            .retry_backoff
            .as_deref()
            .map(parse_retry_backoff)
            .transpose()
            .map_err(|reason| SpecInputError::Retry {
                reason: format!("retryBackoff: {reason}"),
            })?;
        let retry_on = self
            .retry_on
            .as_deref()
            .map(str::parse::<crate::event::RetryOn>)
            .transpose()
            .map_err(|reason| SpecInputError::Retry {
                reason: format!("retryOn: {reason}"),
            })?;
        Ok(RunDraft {
            name: self.name,
            mode: self.mode,
            concurrency: self.concurrency,
            timeout,
            no_timeout,
            idle_timeout,
            cwd: self.cwd,
            hosts: HostIds {
                session_id: self.session_id,
                completion_owner_id: self.owner_id,
                tool_call_id: self.tool_call_id,
            },
            steps,
            queue: self.queue,
            env: EnvRequest {
                set: self.env.unwrap_or_default().into_iter().collect(),
                clear: self.clear_env.unwrap_or(false),
            },
            on_exit: self.on_exit.unwrap_or_default(),
            after: self.after.unwrap_or_default(),
            after_any: self.after_any.unwrap_or_default(),
            unique: self.unique,
            unique_for,
            unique_tool_call: self.unique_tool_call.unwrap_or(false),
            retries: self.retries,
            retry_backoff,
            retry_on,
        })
    }
}

/// A step whose name is its command text, cut to [`DERIVED_NAME_MAX_BYTES`].
pub fn named_step(action: StepAction) -> StepSpec {
    let text = match &action {
        StepAction::Command { argv } => argv.join(" "),
        StepAction::Shell { script } => script.clone(),
        StepAction::ExternalJob { provider } => provider.clone(),
    };
    let one_line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut name = if one_line.is_empty() {
        "step".to_string()
    } else {
        one_line
    };
    if name.len() > DERIVED_NAME_MAX_BYTES {
        let mut end = DERIVED_NAME_MAX_BYTES - 3;
        while !name.is_char_boundary(end) {
            end -= 1;
        }
        name.truncate(end);
        name.push_str("...");
    }
    StepSpec { name, action }
}

/// What pi-subagents' layout shows of the task a run was given in place of its text: its word
/// for a prompt it never shows.
pub const TASK_REDACTED: &str = "[prompt redacted]";

/// A step as pi-subagents' layout names it (its `agent`): the name the step was given, but
/// for a name derived from the step's command ([`named_step`]), which holds the task's own
/// text, only its program (a command's program without its directory, `sh` for a shell step,
/// a provider's program): pi-subagents shows an agent's name and never its task. The journal
/// keeps the command whole.
pub fn agent_name(step: &StepSpec) -> String {
    if named_step(step.action.clone()).name != step.name {
        return step.name.clone();
    }
    let program = match &step.action {
        StepAction::Command { argv } => argv.first().map(String::as_str),
        StepAction::Shell { .. } => Some("sh"),
        StepAction::ExternalJob { provider } => provider.split_whitespace().next(),
    };
    program
        .and_then(|program| program.rsplit('/').find(|part| !part.is_empty()))
        .unwrap_or("step")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_derived_name_shows_only_its_program_and_a_given_one_shows_whole() {
        let command = |argv: &[&str]| StepAction::Command {
            argv: argv.iter().map(|arg| arg.to_string()).collect(),
        };
        let secret = command(&["/usr/bin/claude", "-p", "the secret task"]);
        assert_eq!(agent_name(&named_step(secret.clone())), "claude");
        let given = StepSpec {
            name: "reviewer".to_string(),
            action: secret,
        };
        assert_eq!(agent_name(&given), "reviewer");
        let shell = StepAction::Shell {
            script: "echo the secret task".to_string(),
        };
        assert_eq!(agent_name(&named_step(shell)), "sh");
        let provider = StepAction::ExternalJob {
            provider: "./jobs/provider.sh --token s3cret".to_string(),
        };
        assert_eq!(agent_name(&named_step(provider)), "provider.sh");
        assert_eq!(agent_name(&named_step(command(&["true"]))), "true");
    }

    #[test]
    fn a_spec_file_becomes_a_checked_run() {
        let file = SpecFile::parse(
            br#"{"name": "n", "mode": "parallel", "timeout": "1m", "sessionId": "s",
                 "steps": [{"command": ["echo", "hi"]}, {"name": "b", "shell": "true"},
                           {"externalJob": "./p.sh"}]}"#,
        )
        .expect("parses");
        let request = file.into_draft().expect("draft").finish().expect("valid");
        assert_eq!(request.spec.mode, Mode::Parallel);
        assert_eq!(request.spec.concurrency, 3);
        assert_eq!(request.spec.timeout_ms, Some(60_000));
        assert_eq!(request.spec.steps[0].name, "echo hi");
        assert_eq!(request.spec.steps[1].name, "b");
        assert!(request.spec.steps[2].is_external_job());
        assert_eq!(request.hosts.session_id.as_deref(), Some("s"));
        assert!(
            request.home_timeout,
            "a timeout of its own: the default never applies"
        );
    }

    /// `"timeout": "off"`: no timeout, and the home's default does not apply either; a run
    /// that names none takes the default.
    #[test]
    fn a_spec_timeout_of_off_refuses_the_homes_default() {
        let request_of = |json: &[u8]| {
            SpecFile::parse(json)
                .expect("parses")
                .into_draft()
                .expect("draft")
                .finish()
                .expect("valid")
        };
        let off = request_of(br#"{"timeout": "off", "steps": [{"shell": "true"}]}"#);
        assert_eq!((off.spec.timeout_ms, off.home_timeout), (None, false));
        let unnamed = request_of(br#"{"steps": [{"shell": "true"}]}"#);
        assert_eq!(
            (unnamed.spec.timeout_ms, unnamed.home_timeout),
            (None, true)
        );
        assert!(
            SpecFile::parse(br#"{"timeout": "never", "steps": [{"shell": "true"}]}"#)
                .expect("parses")
                .into_draft()
                .is_err(),
            "a timeout that is neither a duration nor off is refused"
        );
    }

    #[test]
    fn a_spec_file_keeps_its_env_and_hooks() {
        let file = SpecFile::parse(
            br#"{"env": {"B": "2", "A": "1"}, "clearEnv": true, "onExit": ["echo done"],
                 "steps": [{"shell": "true"}]}"#,
        )
        .expect("parses");
        let request = file.into_draft().expect("draft").finish().expect("valid");
        assert_eq!(
            request.env.set,
            vec![
                ("A".to_string(), "1".to_string()),
                ("B".to_string(), "2".to_string())
            ]
        );
        assert!(request.env.clear);
        assert_eq!(request.on_exit, vec!["echo done".to_string()]);
    }

    #[test]
    fn a_step_with_two_actions_is_refused() {
        let file =
            SpecFile::parse(br#"{"steps": [{"command": ["a"], "shell": "b"}]}"#).expect("parses");
        assert_eq!(
            file.into_draft(),
            Err(SpecInputError::StepAction { step: 0 })
        );
    }

    #[test]
    fn unknown_fields_and_bad_modes_are_refused() {
        assert!(SpecFile::parse(br#"{"steps": [], "colour": 1}"#).is_err());
        assert!(SpecFile::parse(br#"{"mode": "serial", "steps": []}"#).is_err());
    }

    #[test]
    fn long_commands_give_short_names() {
        let step = named_step(StepAction::Shell {
            script: "é".repeat(100),
        });
        assert!(step.name.len() <= DERIVED_NAME_MAX_BYTES);
        assert!(step.name.ends_with("..."));
    }
}
