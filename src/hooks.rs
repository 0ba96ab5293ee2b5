//! Completion hooks that are never lost (docs/design.md, "Hooks"): the shell commands run once
//! a run's end is journaled, whatever ended it — its runner, a stop, a timeout, an interrupt,
//! the reconciler after a runner died or a reboot, a host's repair.
//!
//! A run's hooks are its own (`run --on-exit`) and the home's (`runjournal hook set`), fixed in
//! the transaction of its `Terminal`, which also lists the run in `hooks_due`. Each attempt is
//! journaled: `HookAttempted` claims it, conditional on the run's head, naming this process and
//! a lease; then the hook runs; then `HookEnded` records how it went and when the next attempt
//! is due. Whoever delivers — the ending runner right after its `Terminal` is durable, or a
//! deliverer started by a reconcile pass for what is left — runs this same code.
//!
//! Invariants:
//! * a hook runs only after its claim is durable, and a claim lands only on the head it was
//!   judged on: of two deliverers, one claims and the other finds the claim;
//! * a claim is taken over only once its claimant is dead (by its full identity) or its lease
//!   has run out, which outlasts the hook's own bound: two deliveries of one hook overlap only
//!   when the first one's claimant died (and its hook with it, where the platform allows);
//! * after a delivery is journaled, no attempt of that hook is made again: the reducer refuses
//!   one ([`crate::state::TransitionError::HookSettled`]);
//! * a hook's runtime is bounded: past [`DeliveryOptions::timeout`] its process group is ended
//!   as a step's is, and the attempt counts as failed;
//! * a hook's process group is led by a sentinel started before the hook, which kills the
//!   whole group the moment its deliverer dies: an abandoned attempt is not still running;
//! * once a hook exits, what is left of its group is ended, and a deliverer of its own (a
//!   runner, `__deliver-hooks`) also ends what the hook left outside it, as a runner does for
//!   its steps ([`DeliveryOptions::ends_descendants`]);
//! * attempts are bounded ([`MAX_HOOK_ATTEMPTS`]): the last that fails gives the hook up.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::io::{self, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::durable_fs;
use crate::event::{
    self, Event, HookOutcome, MAX_HOOK_ATTEMPTS, ProcessExit, ProcessIdentity, RunId, UnixMs,
};
use crate::home::Home;
use crate::journal::{AppendError, Condition, ReadError, View};
use crate::liveness::{self, Liveness};
use crate::platform;
use crate::process_group::{self, Reaping};
use crate::run_env::HookCommands;
use crate::state::{HookState, RunState};
use crate::store::Store;

/// How long a hook may run before its process group is ended and the attempt counts as
/// failed, unless [`HOOK_TIMEOUT_ENV`] says otherwise.
pub const DEFAULT_HOOK_TIMEOUT: Duration = Duration::from_secs(30);

/// The environment variable that sets a hook's timeout (`30s`, `2m`).
pub const HOOK_TIMEOUT_ENV: &str = "RUNJOURNAL_HOOK_TIMEOUT";

/// Between SIGTERM and SIGKILL when a hook's process group is ended.
pub const HOOK_GRACE: Duration = Duration::from_secs(3);

/// The wait before attempt `n + 1` after attempt `n` failed (`RETRY_DELAYS[n - 1]`): the
/// first retries come soon, so a runner makes them before it exits; the later ones are a
/// deliverer's.
pub const RETRY_DELAYS: [Duration; MAX_HOOK_ATTEMPTS as usize - 1] = [
    Duration::from_secs(1),
    Duration::from_secs(4),
    Duration::from_secs(15),
    Duration::from_secs(60),
];

/// How much longer than a hook's own bound (timeout, grace, the check that its group is
/// empty) its claim holds, for a claimant that is alive but slow to record the end.
const LEASE_MARGIN: Duration = Duration::from_secs(10);

/// The longest an ending runner waits for a hook's retry before it leaves the rest to a
/// deliverer: it covers the first two retries of a hook that fails at once.
pub const RUNNER_MAX_WAIT: Duration = Duration::from_secs(6);

/// The longest a deliverer waits for a retry: the longest delay, and then some.
pub const DELIVERER_MAX_WAIT: Duration = Duration::from_secs(70);

/// Most rounds of looking at one run's hooks in one delivery: each round claims, runs or
/// abandons what is due, or sleeps until the next retry.
const MAX_ROUNDS: usize = 64;

/// The hidden subcommand of `runjournal` that delivers what is due in a home and exits
/// (`runjournal __deliver-hooks --home HOME --layout LAYOUT`), started detached by a reconcile
/// pass ([`start_deliverer`]).
pub const DELIVERER_SUBCOMMAND: &str = "__deliver-hooks";

/// The environment variable of a test hook, in builds with the `testkit` feature: when it
/// names a file, the deliverer that finds it there removes it and SIGKILLs itself after a
/// hook exited and before its `HookEnded` is recorded — the kill point that may cost one more
/// delivery.
pub const KILL_AFTER_HOOK_ENV: &str = "RUNJOURNAL_TEST_KILL_AFTER_HOOK";

/// Variables a hook sees beside the run's recorded environment.
pub const ENV_RUN_ID: &str = "RUNJOURNAL_RUN_ID";
pub const ENV_RUN_STATE: &str = "RUNJOURNAL_RUN_STATE";
pub const ENV_EXIT_CODE: &str = "RUNJOURNAL_EXIT_CODE";
pub const ENV_RESULT_PATH: &str = "RUNJOURNAL_RESULT_PATH";
pub const ENV_STATUS_PATH: &str = "RUNJOURNAL_STATUS_PATH";
pub const ENV_RUN_NAME: &str = "RUNJOURNAL_RUN_NAME";
pub const ENV_HOOK: &str = "RUNJOURNAL_HOOK";
pub const ENV_HOOK_ATTEMPT: &str = "RUNJOURNAL_HOOK_ATTEMPT";
pub const ENV_HOME: &str = crate::home::HOME_ENV;
pub const ENV_LAYOUT: &str = crate::home::LAYOUT_ENV;

/// How this process delivers hooks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryOptions {
    /// A hook's own bound.
    pub timeout: Duration,
    /// Between SIGTERM and SIGKILL when a hook is ended.
    pub grace: Duration,
    /// The longest this process waits for a retry to be due before it leaves it to another.
    pub max_wait: Duration,
    /// Who delivers, as recorded in each claim.
    pub by: String,
    /// Whether this process is a deliverer of its own — a runner, or `runjournal
    /// __deliver-hooks` — and its descendants' child subreaper: after each attempt every
    /// descendant left is then what the hook left outside its group (`setsid`, a double fork),
    /// ended as a step's leftovers are. False from [`DeliveryOptions::from_env`]: a host that
    /// delivers inside its own process has children that are not the hook's.
    pub ends_descendants: bool,
}

impl DeliveryOptions {
    /// Options with the hook timeout of [`HOOK_TIMEOUT_ENV`] (else the default).
    pub fn from_env(by: String, max_wait: Duration) -> Result<DeliveryOptions, String> {
        let timeout = match std::env::var(HOOK_TIMEOUT_ENV) {
            Ok(text) if !text.is_empty() => crate::duration::parse_duration(&text)
                .map_err(|error| format!("{HOOK_TIMEOUT_ENV}: {error}"))?,
            _ => DEFAULT_HOOK_TIMEOUT,
        };
        Ok(DeliveryOptions {
            timeout,
            grace: HOOK_GRACE,
            max_wait,
            by,
            ends_descendants: false,
        })
    }

    /// How long a claim holds while its claimant lives.
    fn lease(&self) -> Duration {
        self.timeout + self.grace + process_group::KILL_VERIFY_TIMEOUT + LEASE_MARGIN
    }
}

/// Why delivering failed. What was journaled stays.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HookError {
    #[error("reading the journal: {0}")]
    Read(#[from] ReadError),
    #[error("run {run}: recording a hook's attempt: {source}")]
    Append {
        run: RunId,
        #[source]
        source: AppendError,
    },
    #[error("reading this process's identity: {0}")]
    Identity(#[source] io::Error),
    #[error("starting a deliverer: {0}")]
    Start(#[source] io::Error),
}

/// One attempt this process made, and how it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempted {
    pub run: RunId,
    pub hook: u32,
    pub attempt: u32,
    pub outcome: HookOutcome,
    /// Its `HookEnded` is journaled (else someone took the claim over first).
    pub is_recorded: bool,
    /// What the hook left running outside its process group and this process ended, as a
    /// step's error names it ([`DeliveryOptions::ends_descendants`]); also in `hooks.log`.
    pub left_behind: Option<String>,
}

/// What one delivery did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Delivery {
    /// The attempts it ran.
    pub attempts: Vec<Attempted>,
    /// The attempts it found abandoned (their claimant dead, or their lease run out) and
    /// recorded so: (run, hook, attempt).
    pub abandoned: Vec<(RunId, u32, u32)>,
}

/// What to do next about one hook, from its state ([`next_step`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NextStep {
    /// Delivered or given up.
    Settled,
    /// A live claimant holds it.
    Claimed,
    /// Its open attempt is lost: record it abandoned.
    Abandon { attempt: u32, reason: String },
    /// Its next attempt is due at this time (now or past: at once).
    DueAt(UnixMs),
}

/// What to do next about hook `state` (`None`: never attempted) of a run that ended at
/// `ended_at_ms`, at `now_ms`, with `liveness` judging a claimant. Pure but for `liveness`.
pub fn next_step(
    state: Option<&HookState>,
    ended_at_ms: UnixMs,
    now_ms: UnixMs,
    liveness: impl Fn(&ProcessIdentity) -> Liveness,
) -> NextStep {
    let Some(state) = state else {
        return NextStep::DueAt(ended_at_ms);
    };
    if state.is_settled() {
        return NextStep::Settled;
    }
    if let Some(claim) = &state.claim {
        let lease_end = claim.at_ms.saturating_add(claim.lease_ms);
        return match liveness(&claim.claimant) {
            Liveness::Dead | Liveness::OtherBoot => NextStep::Abandon {
                attempt: claim.attempt,
                reason: format!(
                    "its deliverer ({}, pid {}) died before recording how it ended",
                    claim.by, claim.claimant.pid
                ),
            },
            Liveness::Alive | Liveness::OtherNamespace if now_ms > lease_end => NextStep::Abandon {
                attempt: claim.attempt,
                reason: format!(
                    "its deliverer ({}, pid {}) held it past its lease",
                    claim.by, claim.claimant.pid
                ),
            },
            Liveness::Alive | Liveness::OtherNamespace => NextStep::Claimed,
        };
    }
    match state.last.as_ref().and_then(|last| last.retry_at_ms) {
        Some(retry_at_ms) => NextStep::DueAt(retry_at_ms),
        // Settled is handled above: an ended attempt without a retry settles its hook.
        None => NextStep::Settled,
    }
}

/// When attempt `attempt + 1` is due after attempt `attempt` ended at `now_ms` without a
/// delivery; `None` after the last attempt: the hook is given up.
pub fn retry_at(attempt: u32, now_ms: UnixMs) -> Option<UnixMs> {
    let delay = RETRY_DELAYS.get(usize::try_from(attempt).ok()?.checked_sub(1)?)?;
    Some(now_ms.saturating_add(u64::try_from(delay.as_millis()).unwrap_or(u64::MAX)))
}

fn liveness_of(identity: &ProcessIdentity) -> Liveness {
    // A look that fails says nothing: the claim stands until its lease runs out.
    liveness::check(identity).unwrap_or(Liveness::OtherNamespace)
}

/// Delivers what is due of `run`'s hooks: each attempt claimed, run and recorded; what another
/// live process holds is left to it. Waits for a retry due within `options.max_wait`, and
/// leaves later ones to the next deliverer. Nothing for a run that has not ended.
pub fn deliver_run(
    store: &Store,
    run: RunId,
    options: &DeliveryOptions,
) -> Result<Delivery, HookError> {
    deliver(store, Some(run), options)
}

/// Delivers what is due of every run in the journal's `hooks_due`, as [`deliver_run`] does,
/// waiting for the earliest retry of any of them.
pub fn deliver_due(store: &Store, options: &DeliveryOptions) -> Result<Delivery, HookError> {
    deliver(store, None, options)
}

fn deliver(
    store: &Store,
    only: Option<RunId>,
    options: &DeliveryOptions,
) -> Result<Delivery, HookError> {
    let me = liveness::current().map_err(HookError::Identity)?;
    let mut delivery = Delivery::default();
    for _ in 0..MAX_ROUNDS {
        let runs = match only {
            Some(run) => vec![run],
            None => store.journal().view()?.hooks_due()?,
        };
        let mut next_due: Option<UnixMs> = None;
        for run in runs {
            if let Some(at) = round(store, run, options, &me, &mut delivery)? {
                next_due = Some(next_due.map_or(at, |next| next.min(at)));
            }
        }
        let Some(next_due) = next_due else {
            break;
        };
        let wait = Duration::from_millis(next_due.saturating_sub(event::now_ms()));
        if wait > options.max_wait {
            break;
        }
        std::thread::sleep(wait);
    }
    Ok(delivery)
}

/// Whether some run's hook is due now and nobody alive holds it: what makes a reconcile pass
/// start a deliverer. Reads the runs of `hooks_due` only.
pub fn needs_delivery(view: &View, now_ms: UnixMs) -> Result<bool, ReadError> {
    for run in view.hooks_due()? {
        let Some(state) = view.snapshot(run)? else {
            continue;
        };
        let Some(ended_at_ms) = state.ended_at_ms() else {
            continue;
        };
        let count = u32::try_from(view.run_hooks(run)?.len()).unwrap_or(u32::MAX);
        for hook in 0..count {
            match next_step(state.hook(hook), ended_at_ms, now_ms, liveness_of) {
                NextStep::Abandon { .. } => return Ok(true),
                NextStep::DueAt(at) if at <= now_ms => return Ok(true),
                NextStep::DueAt(_) | NextStep::Claimed | NextStep::Settled => {}
            }
        }
    }
    Ok(false)
}

/// One look at `run`'s hooks: records abandoned attempts, claims and runs each hook due now.
/// Returns when the next retry is due (`None`: nothing left for this process to wait for).
fn round(
    store: &Store,
    run: RunId,
    options: &DeliveryOptions,
    me: &ProcessIdentity,
    delivery: &mut Delivery,
) -> Result<Option<UnixMs>, HookError> {
    let (mut state, hooks) = {
        let view = store.journal().view()?;
        let Some(state) = view.snapshot(run)? else {
            return Ok(None);
        };
        (state, view.run_hooks(run)?)
    };
    let Some(ended_at_ms) = state.ended_at_ms() else {
        return Ok(None);
    };
    let mut next_due: Option<UnixMs> = None;
    let mut due = |at: UnixMs| next_due = Some(next_due.map_or(at, |next| next.min(at)));
    for (hook, command) in hooks.all().into_iter().enumerate() {
        let hook = u32::try_from(hook).unwrap_or(u32::MAX);
        let now = event::now_ms();
        match next_step(state.hook(hook), ended_at_ms, now, liveness_of) {
            NextStep::Settled | NextStep::Claimed => {}
            NextStep::Abandon { attempt, reason } => {
                let retry_at_ms = retry_at(attempt, now);
                let ended = Event::HookEnded {
                    hook,
                    attempt,
                    outcome: HookOutcome::Abandoned {
                        reason: event::truncate_text(&reason, event::MAX_TEXT_BYTES),
                    },
                    retry_at_ms,
                };
                match store.append(run, vec![ended], Condition::expect_head(state.head_seq)) {
                    Ok(appended) => {
                        state = appended.state;
                        delivery.abandoned.push((run, hook, attempt));
                        if let Some(at) = retry_at_ms {
                            due(at);
                        }
                    }
                    // Someone moved the run first: look again at once.
                    Err(AppendError::HeadMismatch { .. } | AppendError::Transition { .. }) => {
                        return Ok(Some(event::now_ms()));
                    }
                    Err(source) => return Err(HookError::Append { run, source }),
                }
            }
            NextStep::DueAt(at) if at > now => due(at),
            NextStep::DueAt(_) => {
                let attempt = state.hook(hook).map_or(0, |hook| hook.attempts) + 1;
                let claim = Event::HookAttempted {
                    hook,
                    attempt,
                    claimant: me.clone(),
                    by: event::truncate_text(&options.by, event::MAX_TEXT_BYTES),
                    lease_ms: u64::try_from(options.lease().as_millis()).unwrap_or(u64::MAX),
                };
                match store.append(run, vec![claim], Condition::expect_head(state.head_seq)) {
                    Ok(appended) => state = appended.state,
                    Err(AppendError::HeadMismatch { .. } | AppendError::Transition { .. }) => {
                        return Ok(Some(event::now_ms()));
                    }
                    Err(source) => return Err(HookError::Append { run, source }),
                }
                let (outcome, left_behind) =
                    run_hook(store, &state, hook, attempt, command, options);
                crate::liveness::die_here_if_asked(KILL_AFTER_HOOK_ENV);
                let retry_at_ms = if outcome.is_delivered() {
                    None
                } else {
                    retry_at(attempt, event::now_ms())
                };
                let ended = Event::HookEnded {
                    hook,
                    attempt,
                    outcome: outcome.clone(),
                    retry_at_ms,
                };
                // No head condition: other hooks of the run may move it meanwhile; the reducer
                // takes this end only while this attempt is still the one claimed.
                let is_recorded = match store.append(run, vec![ended], Condition::none()) {
                    Ok(appended) => {
                        state = appended.state;
                        true
                    }
                    Err(AppendError::Transition { .. }) => false,
                    Err(source) => return Err(HookError::Append { run, source }),
                };
                if let (true, Some(at)) = (is_recorded, retry_at_ms) {
                    due(at);
                }
                delivery.attempts.push(Attempted {
                    run,
                    hook,
                    attempt,
                    outcome,
                    is_recorded,
                    left_behind,
                });
            }
        }
    }
    Ok(next_due)
}

/// Runs one attempt of hook `hook` of the ended run `state`: `sh -c COMMAND` in the run's
/// recorded environment (its cwd when it is still there, else `/`), with the run's id, state,
/// exit code and result path beside it, its output appended to the run's `hooks.log`, in a
/// process group of its own, led by a [`Sentinel`] that ends the group should this process
/// die; the group is ended once the hook exits (what it left behind) or past the timeout, and
/// what left the group is swept where `options.ends_descendants` says this process may.
fn run_hook(
    store: &Store,
    state: &RunState,
    hook: u32,
    attempt: u32,
    command_text: &str,
    options: &DeliveryOptions,
) -> (HookOutcome, Option<String>) {
    let not_started = |error: String| {
        (
            HookOutcome::NotStarted {
                error: event::truncate_text(&error, event::MAX_TEXT_BYTES),
            },
            None,
        )
    };
    let run = state.run_id;
    let home = store.home();
    let environment = match store.start_environment(run, state.spec.cwd.as_deref()) {
        Ok(environment) => environment,
        Err(error) => return not_started(format!("reading the run's environment: {error}")),
    };
    let log = durable_fs::ensure_private_dir(&home.run_dir(run))
        .and_then(|()| durable_fs::open_append(&home.hook_log_path(run)))
        .ok();
    // The group's leader first: no process of the hook exists before its group can be ended.
    let sentinel = match Sentinel::start() {
        Ok(sentinel) => sentinel,
        Err(error) => return not_started(format!("starting the hook's process group: {error}")),
    };
    let mut command = Command::new("sh");
    command.arg("-c").arg(command_text);
    environment.apply(&mut command);
    let exit_code = state
        .terminal
        .as_ref()
        .map_or(String::new(), |terminal| terminal.exit_code.to_string());
    command
        .current_dir(environment.existing_cwd().unwrap_or(Path::new("/")))
        .env(ENV_RUN_ID, run.to_string())
        .env(ENV_RUN_STATE, state.status.as_str())
        .env(ENV_EXIT_CODE, exit_code)
        .env(ENV_RESULT_PATH, home.result_path(run))
        .env(ENV_STATUS_PATH, home.status_path(run))
        .env(ENV_HOME, home.root())
        .env(ENV_LAYOUT, home.layout().as_str())
        .env(ENV_HOOK, hook.to_string())
        .env(ENV_HOOK_ATTEMPT, attempt.to_string())
        .stdin(Stdio::null())
        .process_group(sentinel.group_id());
    if let Some(name) = &state.spec.name {
        command.env(ENV_RUN_NAME, name);
    }
    match log
        .as_ref()
        .map(|file| (file.try_clone(), file.try_clone()))
    {
        Some((Ok(out), Ok(err))) => {
            command.stdout(Stdio::from(out)).stderr(Stdio::from(err));
        }
        _ => {
            command.stdout(Stdio::null()).stderr(Stdio::null());
        }
    }
    let parent = std::process::id();
    // SAFETY: prctl, getppid and the descriptor walk are raw system calls, async-signal-safe,
    // as calls between fork and exec must be.
    unsafe {
        command.pre_exec(move || {
            platform::die_with_parent(parent)?;
            platform::mark_cloexec_from(3)
        });
    }
    let spawned = command.spawn();
    drop(command);
    let child = match spawned {
        Ok(child) => child,
        Err(error) => {
            sentinel.dismiss(options);
            return not_started(error.to_string());
        }
    };
    let outcome = follow_hook(child, sentinel, options);
    let left_behind = options
        .ends_descendants
        .then(|| end_left_behind(options))
        .flatten();
    if let (Some(text), Some(mut file)) = (&left_behind, log.as_ref()) {
        // Best effort, as the hook's own output: the journal has the attempt's outcome.
        let _ = writeln!(file, "runjournal: hook {hook} attempt {attempt}: {text}");
    }
    (outcome, left_behind)
}

/// Waits for a hook's process up to the timeout, reaps it, and ends its group (what it left
/// behind, or all of it past the timeout).
fn follow_hook(mut child: Child, sentinel: Sentinel, options: &DeliveryOptions) -> HookOutcome {
    let pid = child.id();
    let deadline = Instant::now() + options.timeout;
    let has_exited = wait_exited(pid, deadline, || matches!(child.try_wait(), Ok(Some(_))));
    if !has_exited {
        sentinel.dismiss(options);
        // Ended with its group: reaped now, its status is the timeout's.
        let _ = child.wait();
        return HookOutcome::TimedOut;
    }
    // Reaped at once: the sentinel, not the hook, holds the group's id.
    let status = child.wait();
    sentinel.dismiss(options);
    match status {
        Ok(status) if status.success() => HookOutcome::Delivered,
        Ok(status) => HookOutcome::Failed {
            exit: ProcessExit::from(status),
        },
        Err(error) => HookOutcome::NotStarted {
            error: event::truncate_text(
                &format!("waiting for the hook: {error}"),
                event::MAX_TEXT_BYTES,
            ),
        },
    }
}

/// Polls until process `pid` (this process's child, unreaped) has exited, or `deadline`;
/// whether it exited. `has_exited` is asked when the platform cannot tell.
fn wait_exited(pid: u32, deadline: Instant, mut has_exited: impl FnMut() -> bool) -> bool {
    let mut pause = Duration::from_millis(1);
    loop {
        let is_exited = match platform::process(pid) {
            Ok(Some(info)) => info.is_zombie,
            Ok(None) => true,
            Err(_) => has_exited(),
        };
        if is_exited {
            return true;
        }
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        std::thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}

/// Ends what a hook left below this process outside its group (`setsid`, a double fork),
/// inherited as its child subreaper: every descendant, since a deliverer of its own runs
/// nothing else meanwhile ([`DeliveryOptions::ends_descendants`]). The sentence that names
/// what was ended, if anything was.
fn end_left_behind(options: &DeliveryOptions) -> Option<String> {
    let swept =
        crate::process_group::sweep::sweep(std::process::id(), &BTreeSet::new(), options.grace)
            .ok()?;
    (!swept.is_empty()).then(|| swept.describe())
}

/// How long a sentinel told to stand down has to exit before its group is ended anyway (it
/// exits at once; a stopped one is ended with the group).
const SENTINEL_EXIT_WAIT: Duration = Duration::from_secs(1);

/// What a sentinel runs: it ignores the signals a hook may send its own group (`kill 0`), and
/// reads its standard input, a pipe whose only writer is the deliverer. A line means the
/// deliverer is done with the group: it exits. End of file without one means the deliverer
/// died: it kills its whole group, the hook and everything the hook started in it.
const SENTINEL_SCRIPT: &str =
    "trap '' HUP INT QUIT TERM USR1 USR2 ALRM PIPE; read -r line && exit 0; kill -s KILL 0";

/// The leader of a hook's process group: a shell that does nothing but wait for the
/// deliverer's word, started before the hook joins its group. When the deliverer dies — killed,
/// crashed, at any point — the kernel closes its end of the sentinel's pipe, and the sentinel
/// kills the group: an attempt found abandoned is not still running. While the sentinel is
/// unreaped (this process reaps it only after ending the group) it holds the group's id, so
/// the group is ended by the sentinel's identity, as a step's group is by its leader's.
struct Sentinel {
    child: Child,
    identity: ProcessIdentity,
    /// The deliverer's end of the pipe: dropped (closed) only by [`Sentinel::dismiss`] or by
    /// this process's death.
    word: Option<std::fs::File>,
}

impl Sentinel {
    fn start() -> io::Result<Sentinel> {
        let (read_end, write_end) = platform::pipe_cloexec()?;
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg(SENTINEL_SCRIPT)
            .current_dir("/")
            .stdin(Stdio::from(read_end))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0);
        // SAFETY: the descriptor walk is raw system calls, async-signal-safe.
        unsafe {
            command.pre_exec(|| platform::mark_cloexec_from(3));
        }
        let mut child = command.spawn()?;
        // The read end is the sentinel's alone: this process's copy goes with the command.
        drop(command);
        let identity = match platform::identity_of(child.id()) {
            Ok(Some(identity)) => identity,
            outcome => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(match outcome {
                    Err(error) => error,
                    _ => io::Error::other("the group's leader vanished as it started"),
                });
            }
        };
        Ok(Sentinel {
            child,
            identity,
            word: Some(std::fs::File::from(write_end)),
        })
    }

    /// The group's id, which the hook joins.
    fn group_id(&self) -> i32 {
        i32::try_from(self.identity.pid).unwrap_or(i32::MAX)
    }

    /// The deliverer is done with the group: tells the sentinel to exit, then ends the group
    /// as a step's is (what is left of it: SIGTERM, the grace, SIGKILL), then reaps the
    /// sentinel.
    fn dismiss(mut self, options: &DeliveryOptions) {
        if let Some(mut word) = self.word.take() {
            // A sentinel already gone (the hook killed its group) cannot read it: no matter.
            let _ = word.write_all(b"\n");
        }
        let _ = wait_exited(
            self.identity.pid,
            Instant::now() + SENTINEL_EXIT_WAIT,
            || matches!(self.child.try_wait(), Ok(Some(_))),
        );
        // Members this process inherited (a runner is its steps' subreaper) are reaped by the
        // sweep that follows; the hook by its waiter.
        let _ = process_group::end(&self.identity, None, options.grace, Reaping::Nothing);
        let _ = self.child.wait();
    }
}

/// Starts a deliverer detached: `program DELIVERER_SUBCOMMAND --home HOME --layout LAYOUT`, in
/// a session of its own, with no descriptor of this process's but /dev/null on 0-2, reaped by
/// a thread of this process (a process that exits first leaves it to init). What a reconcile
/// pass does when [`needs_delivery`] says so: the pass never waits on a hook.
pub fn start_deliverer(home: &Home, program: &Path) -> io::Result<u32> {
    start_detached(program, &deliverer_args(home)?)
}

/// Starts `program args...` detached, as a deliverer is ([`start_deliverer`]): in a session of
/// its own, /dev/null on 0-2 and no other descriptor of this process's, reaped by a thread of
/// this process. Also how the home's timer is started (`launch::delay`).
pub fn start_detached(program: &Path, args: &[OsString]) -> io::Result<u32> {
    let mut command = Command::new(program);
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: setsid and the descriptor walk are raw system calls, async-signal-safe.
    unsafe {
        command.pre_exec(|| {
            nix::unistd::setsid().map_err(io::Error::from)?;
            platform::mark_cloexec_from(3)
        });
    }
    let mut child = command.spawn()?;
    let pid = child.id();
    let reaper = std::thread::Builder::new()
        .name("runjournal-reap".to_string())
        .spawn(move || {
            let _ = child.wait();
        });
    // Without a thread, the child stays a zombie until this process exits: harmless.
    drop(reaper);
    Ok(pid)
}

/// What a reconcile pass does for hooks: when a hook is due and nobody alive holds it
/// ([`needs_delivery`]), starts a deliverer ([`start_deliverer`]) with `program` (the
/// `runjournal` binary, or a host's program that takes [`DELIVERER_SUBCOMMAND`]); its pid.
/// Two passes may each start one: their claims settle which runs a hook.
pub fn start_deliverer_if_needed(store: &Store, program: &Path) -> Result<Option<u32>, HookError> {
    let view = store.journal().view()?;
    if !needs_delivery(&view, event::now_ms())? {
        return Ok(None);
    }
    drop(view);
    start_deliverer(store.home(), program)
        .map(Some)
        .map_err(HookError::Start)
}

/// A hook's delivery, as `runjournal hooks` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum HookStatus {
    /// The run has not ended yet.
    Waiting,
    /// Due: not attempted yet, or its next attempt is due.
    Pending,
    /// An attempt is claimed and running.
    Running,
    /// Its last attempt failed; another is due at a later time.
    Failed,
    Delivered,
    GivenUp,
}

impl HookStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            HookStatus::Waiting => "waiting",
            HookStatus::Pending => "pending",
            HookStatus::Running => "running",
            HookStatus::Failed => "failed",
            HookStatus::Delivered => "delivered",
            HookStatus::GivenUp => "given-up",
        }
    }
}

/// One hook of one run, as `runjournal hooks --json` prints it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HookReport {
    pub run_id: String,
    pub hook: u32,
    /// `run` (its own, `--on-exit`) or `home` (`runjournal hook set`).
    pub source: &'static str,
    pub command: String,
    pub status: HookStatus,
    pub attempts: u32,
    /// How its last ended attempt went (`delivered`, `failed`, `timed-out`, `not-started`,
    /// `abandoned`), and in words.
    pub last_outcome: Option<&'static str>,
    pub last_outcome_text: Option<String>,
    /// When its next attempt is due.
    pub retry_at_ms: Option<UnixMs>,
    /// Who holds its open attempt.
    pub claimed_by: Option<String>,
    pub log_path: PathBuf,
}

/// Every hook of `run`, delivered or not.
pub fn hooks_of(home: &Home, view: &View, run: RunId) -> Result<Vec<HookReport>, ReadError> {
    let Some(state) = view.snapshot(run)? else {
        return Ok(Vec::new());
    };
    let hooks = view.run_hooks(run)?;
    Ok(reports(home, &state, &hooks))
}

/// The hooks not delivered of every run that has one due or given up: what `runjournal hooks`
/// lists. Reads the runs of `hooks_due` and `hooks_given_up` only.
pub fn undelivered(home: &Home, view: &View) -> Result<Vec<HookReport>, ReadError> {
    let mut runs = view.hooks_due()?;
    runs.extend(view.hooks_given_up()?);
    runs.sort();
    runs.dedup();
    let mut listed = Vec::new();
    for run in runs {
        listed.extend(
            hooks_of(home, view, run)?
                .into_iter()
                .filter(|report| report.status != HookStatus::Delivered),
        );
    }
    Ok(listed)
}

fn reports(home: &Home, state: &RunState, hooks: &HookCommands) -> Vec<HookReport> {
    let own = hooks.own.len();
    hooks
        .all()
        .into_iter()
        .enumerate()
        .map(|(index, command)| {
            let hook = u32::try_from(index).unwrap_or(u32::MAX);
            let delivery = state.hook(hook);
            let status = match delivery {
                _ if !state.is_terminal() => HookStatus::Waiting,
                None => HookStatus::Pending,
                Some(delivery) if delivery.is_delivered() => HookStatus::Delivered,
                Some(delivery) if delivery.is_given_up() => HookStatus::GivenUp,
                Some(delivery) if delivery.claim.is_some() => HookStatus::Running,
                Some(_) => HookStatus::Failed,
            };
            let last = delivery.and_then(|delivery| delivery.last.as_ref());
            HookReport {
                run_id: state.run_id.to_string(),
                hook,
                source: if index < own { "run" } else { "home" },
                command: command.to_string(),
                status,
                attempts: delivery.map_or(0, |delivery| delivery.attempts),
                last_outcome: last.map(|last| last.outcome.as_str()),
                last_outcome_text: last
                    .map(|last| crate::exit::describe_hook_outcome(&last.outcome)),
                retry_at_ms: last
                    .and_then(|last| last.retry_at_ms)
                    .filter(|_| status == HookStatus::Failed),
                claimed_by: delivery
                    .and_then(|delivery| delivery.claim.as_ref())
                    .map(|claim| format!("{} (pid {})", claim.by, claim.claimant.pid)),
                log_path: home.hook_log_path(state.run_id),
            }
        })
        .collect()
}

/// The home's hook as `runjournal hook show --json` prints it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HomeHookReport {
    /// `None`: no hook is set.
    pub command: Option<String>,
}

/// The arguments a deliverer is started with, after the program: for tests and hosts that
/// start one themselves.
pub fn deliverer_args(home: &Home) -> io::Result<Vec<OsString>> {
    home_subcommand_args(DELIVERER_SUBCOMMAND, home)
}

/// `subcommand --home HOME --layout LAYOUT`, the home absolute: how a process of the home
/// started detached ([`start_detached`]: a deliverer, the timer, a scrub) is told its home.
pub fn home_subcommand_args(subcommand: &str, home: &Home) -> io::Result<Vec<OsString>> {
    Ok(vec![
        subcommand.into(),
        "--home".into(),
        std::path::absolute(home.root())?.into_os_string(),
        "--layout".into(),
        home.layout().as_str().into(),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::HookOutcome;
    use crate::state::{HookAttemptEnd, HookClaim};

    fn claimant() -> ProcessIdentity {
        ProcessIdentity {
            pid: 4242,
            start_time: 1,
            boot_id: "b".to_string(),
            pid_namespace: None,
        }
    }

    fn claimed(at_ms: UnixMs) -> HookState {
        HookState {
            hook: 0,
            attempts: 1,
            claim: Some(HookClaim {
                attempt: 1,
                claimant: claimant(),
                by: "runner".to_string(),
                lease_ms: 1_000,
                at_ms,
            }),
            last: None,
        }
    }

    fn ended(outcome: HookOutcome, retry_at_ms: Option<UnixMs>) -> HookState {
        HookState {
            hook: 0,
            attempts: 1,
            claim: None,
            last: Some(HookAttemptEnd {
                attempt: 1,
                outcome,
                retry_at_ms,
                at_ms: 10,
            }),
        }
    }

    #[test]
    fn a_hook_never_attempted_is_due_from_the_runs_end() {
        assert_eq!(
            next_step(None, 100, 50, |_| Liveness::Alive),
            NextStep::DueAt(100)
        );
    }

    #[test]
    fn a_claim_holds_while_its_claimant_lives_within_its_lease() {
        let state = claimed(1_000);
        assert_eq!(
            next_step(Some(&state), 0, 1_500, |_| Liveness::Alive),
            NextStep::Claimed
        );
        assert!(matches!(
            next_step(Some(&state), 0, 2_001, |_| Liveness::Alive),
            NextStep::Abandon { attempt: 1, .. }
        ));
        assert!(matches!(
            next_step(Some(&state), 0, 1_500, |_| Liveness::Dead),
            NextStep::Abandon { attempt: 1, .. }
        ));
        assert!(matches!(
            next_step(Some(&state), 0, 1_500, |_| Liveness::OtherBoot),
            NextStep::Abandon { attempt: 1, .. }
        ));
        assert_eq!(
            next_step(Some(&state), 0, 1_500, |_| Liveness::OtherNamespace),
            NextStep::Claimed
        );
    }

    #[test]
    fn a_delivered_or_given_up_hook_is_settled_and_a_failed_one_is_due_at_its_retry() {
        let delivered = ended(HookOutcome::Delivered, None);
        assert_eq!(
            next_step(Some(&delivered), 0, 5, |_| Liveness::Dead),
            NextStep::Settled
        );
        let given_up = ended(HookOutcome::TimedOut, None);
        assert_eq!(
            next_step(Some(&given_up), 0, 5, |_| Liveness::Dead),
            NextStep::Settled
        );
        let failed = ended(HookOutcome::TimedOut, Some(77));
        assert_eq!(
            next_step(Some(&failed), 0, 5, |_| Liveness::Dead),
            NextStep::DueAt(77)
        );
    }

    #[test]
    fn retries_back_off_and_stop_at_the_last_attempt() {
        assert_eq!(retry_at(1, 1_000), Some(2_000));
        assert_eq!(retry_at(2, 1_000), Some(5_000));
        assert_eq!(retry_at(MAX_HOOK_ATTEMPTS - 1, 0), Some(60_000));
        assert_eq!(retry_at(MAX_HOOK_ATTEMPTS, 0), None);
        assert_eq!(retry_at(0, 0), None);
    }
}
