//! `runjournal run` and the hidden `__runner`.

use std::ops::ControlFlow;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Args;

use runjournal::durable_fs::{self, Bounded};
use runjournal::duration::format_duration;
use runjournal::event::{Event, Mode, StepAction};
use runjournal::exit::describe_exit;
use runjournal::json::{EndedDoc, LaunchedDoc};
use runjournal::launch::{
    self, Followed, Launched, RunnerExitSeen, RunnerProgram, RunnerStart, after, delay, queue,
};
use runjournal::runner::{self, RunnerConfig, RunnerOutcome};
use runjournal::show;
use runjournal::spec::{self, RunDraft, RunRequest, SpecFile};
use runjournal::{Home, RunId, RunState, Store};

use crate::{
    CliResult, EXIT_ERROR, Failure, bad_input, note, open_store, print, print_line,
    report_reconciled,
};

#[derive(Args)]
pub struct RunArgs {
    /// A name for the run (shown by list and status; `name:<NAME>` alias in the journal).
    #[arg(long)]
    name: Option<String>,
    /// single (one step), chain (in order, stop at the first failure) or parallel
    /// [default: single for one step, else chain].
    #[arg(long, value_parser = mode_arg)]
    mode: Option<Mode>,
    /// Most steps at once in parallel mode [default: all].
    #[arg(long, value_name = "N")]
    concurrency: Option<u32>,
    /// End the run, failed, after this long (500ms, 30s, 5m, 1h30m), or `off`: no timeout,
    /// not even the home's default (`runjournal default-timeout`).
    #[arg(long, value_name = "DURATION|off", value_parser = duration_setting)]
    timeout: Option<Setting<Duration>>,
    /// The host's session id (recorded, and used for the result index).
    #[arg(long, value_name = "S")]
    session_id: Option<String>,
    /// The host's completion owner id.
    #[arg(long, value_name = "O")]
    owner_id: Option<String>,
    /// The host's tool call id (`tool-call:<T>` alias in the journal).
    #[arg(long, value_name = "T")]
    tool_call_id: Option<String>,
    /// While its runner lives, write the run's status.json at least this often, so a host
    /// that judges a live run by `lastUpdate`'s age sees a quiet one move [default: 10m].
    #[arg(long, value_name = "DURATION", env = runjournal::runner::HEARTBEAT_ENV,
          value_parser = duration_arg)]
    heartbeat: Option<Duration>,
    /// End a step, timed out (exit 124), once it has written no output and reported no job
    /// status for this long.
    #[arg(long, value_name = "DURATION", value_parser = duration_arg)]
    idle_timeout: Option<Duration>,
    /// Put the run in this queue: it starts once the queue has a free slot (first in, first
    /// out); until then it is `queued` and `run` returns at once saying so.
    #[arg(long, value_name = "NAME")]
    queue: Option<String>,
    /// Start only once this run has ended `complete` (repeatable: once they all have); if it
    /// ends otherwise, this run ends `failed` without starting. An id, a unique prefix, a name
    /// (its latest run) or a tool-call id, as `status` takes them.
    #[arg(long = "after", value_name = "RUN")]
    after: Vec<String>,
    /// Start only once this run has ended, however it ended (repeatable; named as `--after`).
    #[arg(long = "after-any", value_name = "RUN")]
    after_any: Vec<String>,
    /// Launch once: while a run launched with this key has not ended, launching with it again
    /// creates nothing and answers that run (exit 0; `"existing": true` in --json).
    #[arg(long, value_name = "KEY")]
    unique: Option<String>,
    /// With --unique: the key stays held this long after its run's creation, even once the run
    /// ended (a launcher that crashed and launches again within it gets the same run).
    #[arg(long, value_name = "DURATION", value_parser = duration_arg)]
    unique_for: Option<Duration>,
    /// Launch once by the run's tool-call id (--tool-call-id), as a pi-subagents host launches
    /// one run per tool call: the key is `tool-call:ID`.
    #[arg(long, conflicts_with = "unique")]
    unique_tool_call: bool,
    /// Try the run again, up to N more times, when an attempt fails as --retry-on says. The
    /// run keeps its id; each attempt starts afresh (every step again) once its backoff passed,
    /// and hooks fire only for the last attempt's end.
    #[arg(long, value_name = "N")]
    retries: Option<u32>,
    /// The first retry's wait, doubling at each attempt up to MAX (up to half of it taken off
    /// at random) [default: 1s..10m].
    #[arg(long, value_name = "D[..MAX]", value_parser = backoff_arg)]
    retry_backoff: Option<(Duration, Duration)>,
    /// Which failures are tried again, comma-separated: exit (a step exited non-zero;
    /// exit:3:75 only those codes), crash (the runner died: killed, the host restarted),
    /// timeout (--timeout ended it), any [default: exit,crash].
    #[arg(long, value_name = "CAUSES",
          value_parser = |text: &str| text.parse::<runjournal::event::RetryOn>())]
    retry_on: Option<runjournal::event::RetryOn>,
    /// Start the run no sooner than this time: RFC 3339 (2025-01-31T14:30:00+01:00) or a
    /// local time today (14:30). Until then it is `queued`; a timer process starts it.
    #[arg(long, value_name = "TIME", conflicts_with_all = ["delay", "queue"])]
    at: Option<String>,
    /// Start the run no sooner than this long from now (30s, 5m, 2h).
    #[arg(long, value_name = "DURATION", value_parser = duration_arg,
          conflicts_with = "queue")]
    delay: Option<Duration>,
    /// Set a variable in the environment the run keeps (repeatable). The run keeps this
    /// command's environment (and its cwd and umask) with these over it: every runner of the
    /// run starts its steps with exactly that, whoever starts it later (a queue, a resume).
    #[arg(long = "env", value_name = "NAME=VALUE", value_parser = env_arg)]
    env: Vec<(String, String)>,
    /// Keep none of this command's variables: the run's steps get only what --env gives.
    #[arg(long)]
    clear_env: bool,
    /// A completion hook (repeatable): `sh -c CMD` runs once the run has ended, whatever ended
    /// it, with RUNJOURNAL_RUN_ID, RUNJOURNAL_RUN_STATE, RUNJOURNAL_EXIT_CODE and
    /// RUNJOURNAL_RESULT_PATH set; retried if it fails, until delivered or given up.
    #[arg(long = "on-exit", value_name = "CMD")]
    on_exit: Vec<String>,
    /// Follow the run to its end, printing its steps' output as it comes and each transition;
    /// exit with the run's exit code.
    #[arg(long)]
    wait: bool,
    /// With --wait: print only the transitions, not the steps' output.
    #[arg(long, requires = "wait")]
    quiet: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// A step run by `sh -c` (repeatable; kept in order with --external-job).
    #[arg(long = "step", value_name = "SHELL CMD", conflicts_with = "command")]
    steps: Vec<String>,
    /// An external-job step: a provider command, run by `sh -c`, that prints one JSON status
    /// per line (repeatable; kept in order with --step).
    #[arg(
        long = "external-job",
        value_name = "PROVIDER CMD",
        conflicts_with = "command"
    )]
    external_jobs: Vec<String>,
    /// The run as a JSON file (see docs/running.md, "Spec files"); flags given as well override its fields.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["steps", "external_jobs", "command"])]
    spec: Option<PathBuf>,
    /// A single command step: a program and its arguments, run without a shell.
    #[arg(last = true, value_name = "CMD")]
    command: Vec<String>,
}

/// The command-line positions of `--step` and `--external-job` values, so their steps keep the
/// order in which they were given.
#[derive(Default)]
pub struct StepOrder {
    steps: Vec<usize>,
    external_jobs: Vec<usize>,
}

impl StepOrder {
    pub fn from_matches(matches: &clap::ArgMatches) -> StepOrder {
        let indices = |id: &str| -> Vec<usize> {
            matches
                .indices_of(id)
                .map(|indices| indices.collect())
                .unwrap_or_default()
        };
        StepOrder {
            steps: indices("steps"),
            external_jobs: indices("external_jobs"),
        }
    }
}

pub fn mode_arg(text: &str) -> Result<Mode, String> {
    match text {
        "single" => Ok(Mode::Single),
        "chain" => Ok(Mode::Chain),
        "parallel" => Ok(Mode::Parallel),
        other => Err(format!(
            "unknown mode {other:?} (expected single, chain or parallel)"
        )),
    }
}

pub fn duration_arg(text: &str) -> Result<Duration, String> {
    runjournal::duration::parse_duration(text).map_err(|error| error.to_string())
}

/// A bound as given on the command line: `off`, or a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setting<T> {
    Off,
    To(T),
}

impl<T> Setting<T> {
    pub fn value(self) -> Option<T> {
        match self {
            Setting::Off => None,
            Setting::To(value) => Some(value),
        }
    }
}

pub fn off_or<T>(
    text: &str,
    parse: impl Fn(&str) -> Result<T, String>,
) -> Result<Setting<T>, String> {
    if text.trim().eq_ignore_ascii_case("off") {
        Ok(Setting::Off)
    } else {
        parse(text).map(Setting::To)
    }
}

pub fn duration_setting(text: &str) -> Result<Setting<Duration>, String> {
    off_or(text, duration_arg)
}

/// What `runjournal default-timeout` sets: a timeout or none, or back to the layout's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeoutSetting {
    Layout,
    Home(Setting<Duration>),
}

pub fn timeout_setting(text: &str) -> Result<TimeoutSetting, String> {
    if text.trim().eq_ignore_ascii_case("layout") {
        return Ok(TimeoutSetting::Layout);
    }
    duration_setting(text).map(TimeoutSetting::Home)
}

/// `runjournal default-timeout [DURATION|off|layout] [--json]`.
pub fn default_timeout(home: Home, setting: Option<TimeoutSetting>, json: bool) -> CliResult {
    let store = open_store(home)
        .map_err(|failure| crate::needs_journal(failure, "the default run timeout"))?;
    if let Some(setting) = setting {
        let set = match setting {
            TimeoutSetting::Layout => None,
            TimeoutSetting::Home(timeout) => Some(
                timeout
                    .value()
                    .map(|timeout| u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX)),
            ),
        };
        store
            .journal()
            .set_run_timeout(set)
            .context("writing the default run timeout")?;
    }
    let set = store
        .journal()
        .view()
        .and_then(|view| view.run_timeout_set())
        .context("reading the default run timeout")?;
    let report = runjournal::json::DefaultTimeoutDoc::of(set, store.home().layout());
    if json {
        let text = serde_json::to_string(&report).context("rendering the default run timeout")?;
        return print_line(&text).map(|()| ExitCode::SUCCESS);
    }
    print(&report.to_string())?;
    Ok(ExitCode::SUCCESS)
}

/// `--env NAME=VALUE`.
pub fn env_arg(text: &str) -> Result<(String, String), String> {
    let (name, value) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?} is not NAME=VALUE"))?;
    runjournal::run_env::check_var(name.as_bytes(), value.as_bytes())
        .map_err(|error| error.to_string())?;
    Ok((name.to_string(), value.to_string()))
}

/// A backoff as `--retry-backoff` takes it: `D` or `D..MAX`.
fn backoff_arg(text: &str) -> Result<(Duration, Duration), String> {
    spec::parse_retry_backoff(text)
}

/// Turns the arguments into a checked run; nothing is written.
fn request(args: &RunArgs, order: StepOrder) -> Result<RunRequest, Failure> {
    let mut draft = draft_of(args, &order)?;
    // Flags override the spec file's fields.
    if args.name.is_some() {
        draft.name = args.name.clone();
    }
    if args.mode.is_some() {
        draft.mode = args.mode;
    }
    if args.concurrency.is_some() {
        draft.concurrency = args.concurrency;
    }
    if let Some(timeout) = args.timeout {
        draft.no_timeout = timeout == Setting::Off;
        draft.timeout = timeout.value();
    }
    if args.idle_timeout.is_some() {
        draft.idle_timeout = args.idle_timeout;
    }
    if args.queue.is_some() {
        draft.queue = args.queue.clone();
    }
    // Flags go over the spec file's: its variables, then these; its hooks, then these.
    draft.env.set.extend(args.env.iter().cloned());
    draft.env.clear |= args.clear_env;
    draft.on_exit.extend(args.on_exit.iter().cloned());
    draft.after.extend(args.after.iter().cloned());
    draft.after_any.extend(args.after_any.iter().cloned());
    if args.unique.is_some() {
        draft.unique = args.unique.clone();
    }
    if args.unique_for.is_some() {
        draft.unique_for = args.unique_for;
    }
    draft.unique_tool_call |= args.unique_tool_call;
    if args.retries.is_some() {
        draft.retries = args.retries;
    }
    if args.retry_backoff.is_some() {
        draft.retry_backoff = args.retry_backoff;
    }
    if args.retry_on.is_some() {
        draft.retry_on.clone_from(&args.retry_on);
    }
    let hosts = &mut draft.hosts;
    for (field, flag) in [
        (&mut hosts.session_id, &args.session_id),
        (&mut hosts.completion_owner_id, &args.owner_id),
        (&mut hosts.tool_call_id, &args.tool_call_id),
    ] {
        if flag.is_some() {
            field.clone_from(flag);
        }
    }
    if draft.cwd.is_none() {
        draft.cwd = std::env::current_dir()
            .ok()
            .and_then(|dir| dir.to_str().map(str::to_string));
    }
    draft.finish().map_err(bad_input)
}

/// The run as the spec file gives it, or as the flags' steps and command give it.
fn draft_of(args: &RunArgs, order: &StepOrder) -> Result<RunDraft, Failure> {
    Ok(match &args.spec {
        Some(path) => {
            let refused = |error: String| bad_input(format!("spec {}: {error}", path.display()));
            // Bounded: `--spec /dev/zero` is refused after the limit, not read forever.
            let bytes = match std::fs::File::open(path)
                .and_then(|file| durable_fs::read_bounded(file, spec::MAX_SPEC_FILE_BYTES))
            {
                Ok(Bounded::Whole(bytes)) => bytes,
                Ok(Bounded::Over(_)) => {
                    return Err(refused(format!(
                        "over the limit of {} bytes for a spec file",
                        spec::MAX_SPEC_FILE_BYTES
                    )));
                }
                Err(error) => return Err(refused(error.to_string())),
            };
            SpecFile::parse(&bytes)
                .and_then(SpecFile::into_draft)
                .map_err(|error| bad_input(format!("spec {}: {error}", path.display())))?
        }
        None => {
            let mut positioned: Vec<(usize, StepAction)> = Vec::new();
            for (script, position) in args.steps.iter().zip(order.steps.iter().copied()) {
                positioned.push((
                    position,
                    StepAction::Shell {
                        script: script.clone(),
                    },
                ));
            }
            for (provider, position) in args
                .external_jobs
                .iter()
                .zip(order.external_jobs.iter().copied())
            {
                positioned.push((
                    position,
                    StepAction::ExternalJob {
                        provider: provider.clone(),
                    },
                ));
            }
            positioned.sort_by_key(|(position, _)| *position);
            let mut steps: Vec<_> = positioned
                .into_iter()
                .map(|(_, action)| spec::named_step(action))
                .collect();
            if !args.command.is_empty() {
                steps.push(spec::named_step(StepAction::Command {
                    argv: args.command.clone(),
                }));
            }
            RunDraft {
                steps,
                ..RunDraft::default()
            }
        }
    })
}

#[derive(Args)]
pub struct ResumeArgs {
    /// The paused run: its id, a unique prefix of one (8 characters or more), its name or
    /// tool-call id.
    run: String,
    /// While its runner lives, write the new run's status.json at least this often
    /// [default: 10m].
    #[arg(long, value_name = "DURATION", env = runjournal::runner::HEARTBEAT_ENV,
          value_parser = duration_arg)]
    heartbeat: Option<Duration>,
    /// End a step of the new run, timed out, once it has written no output and reported no
    /// job status for this long (the paused run's is not recorded, so give it again).
    #[arg(long, value_name = "DURATION", value_parser = duration_arg)]
    idle_timeout: Option<Duration>,
    /// Set a variable over the environment the paused run kept (repeatable): the new run
    /// keeps the paused run's environment, cwd and umask, not this command's.
    #[arg(long = "env", value_name = "NAME=VALUE", value_parser = env_arg)]
    env: Vec<(String, String)>,
    /// Keep none of the paused run's variables: the new run's steps get only what --env gives.
    #[arg(long)]
    clear_env: bool,
    /// A completion hook of the new run, after the paused run's own (repeatable).
    #[arg(long = "on-exit", value_name = "CMD")]
    on_exit: Vec<String>,
    /// Follow the new run to its end, printing its steps' output as it comes and each
    /// transition; exit with its exit code.
    #[arg(long)]
    wait: bool,
    /// With --wait: print only the transitions, not the steps' output.
    #[arg(long, requires = "wait")]
    quiet: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// `runjournal resume RUN`.
pub fn resume(home: Home, args: ResumeArgs) -> CliResult {
    crate::check_run_text(&args.run)?;
    let store = open_store(home)?;
    let run = crate::resolve(&store, &args.run)?;
    let program = runner_base()?.with_settings(args.heartbeat, args.idle_timeout);
    let options = launch::ResumeOptions {
        idle_timeout: args.idle_timeout,
        env: spec::EnvRequest {
            set: args.env.clone(),
            clear: args.clear_env,
        },
        on_exit: args.on_exit.clone(),
    };
    let resumed = launch::resume_with(
        &store,
        run,
        &options,
        &program,
        launch::RUNNER_START_TIMEOUT,
    )
    .map_err(|error| match error {
        error if error.is_bad_input() => bad_input(error),
        launch::ResumeError::Launch { source, .. } => launch_failure(*source),
        error => Failure::Error(error.into()),
    })?;
    let new_run = resumed.launched.run;
    if !args.json {
        let steps: Vec<String> = resumed
            .plan
            .steps
            .iter()
            .zip(&resumed.plan.spec.steps)
            .map(|(index, step)| format!("{index} ({})", show::escape_control(&step.name)))
            .collect();
        print_line(&format!(
            "run {new_run} resumes paused run {run}: steps {}",
            steps.join(", ")
        ))?;
    }
    if args.wait {
        follow(&store, resumed.launched, Shown::of(args.json, args.quiet))
    } else if args.json {
        report_resume(&store, &resumed)
    } else {
        report_launch(&store, &resumed.launched, false)
    }
}

fn report_resume(store: &Store, resumed: &launch::Resumed) -> CliResult {
    let report = launch::ResumeReport::of(store.home(), resumed);
    print_line(&serde_json::to_string(&report).context("writing the report")?)?;
    match report.error {
        None => Ok(ExitCode::SUCCESS),
        Some(error) => {
            note(&format!("run {}: {error}", report.run_id));
            Ok(ExitCode::from(EXIT_ERROR))
        }
    }
}

/// `runjournal run`.
pub fn run(home: Home, args: RunArgs, order: StepOrder) -> CliResult {
    let mut request = request(&args, order)?;
    request.heartbeat = args.heartbeat;
    let now_ms = runjournal::event::now_ms();
    request.start_at_ms = match (&args.at, args.delay) {
        (Some(at), _) => Some(
            runjournal::duration::parse_start_time(at, now_ms)
                .map_err(|error| bad_input(format!("--at: {error}")))?,
        ),
        (None, Some(delay)) => {
            Some(now_ms.saturating_add(u64::try_from(delay.as_millis()).unwrap_or(u64::MAX)))
        }
        (None, None) => None,
    };
    let store = open_store(home)?;
    if let Some(queue) = &request.queue {
        let limit = store
            .journal()
            .view()
            .and_then(|view| view.queue_limit(queue))
            .context("reading the queue")?;
        if limit.is_none() {
            return Err(bad_input(format!(
                "queue {queue} has no limit set; set one first with `runjournal queue {queue} --max-active N`"
            )));
        }
    }
    let program = runner_base()?.for_request(&request);
    let launched = launch::launch(&store, request, &program, launch::RUNNER_START_TIMEOUT)
        .map_err(launch_failure)?;
    if args.wait {
        follow(&store, launched, Shown::of(args.json, args.quiet))
    } else {
        report_launch(&store, &launched, args.json)
    }
}

/// A failed launch as the command reports it. A launch that gave up on the journal's write
/// lock after its run was created, or whose creation was handed to a commit leader that may
/// still commit it, cannot say whether its run will run: that is [`Failure::Unknown`], never
/// "nothing was written".
pub fn launch_failure(error: launch::LaunchError) -> Failure {
    use runjournal::journal::AppendError;
    match error {
        launch::LaunchError::Create(AppendError::Uncertain { run, held }) => Failure::Unknown {
            run,
            error: anyhow::anyhow!(
                "its creation was handed to the commit leader, which may still commit it once the \
                 lock is let go ({held})"
            ),
        },
        // Created, and its runner may still take it: the give-up was not recorded.
        launch::LaunchError::RecordFailure {
            run,
            source: AppendError::WriteLockHeld(held),
        } => Failure::Unknown {
            run,
            error: anyhow::anyhow!(
                "it was created, but its runner did not take it in time and the launch could \
                 not record that it gave up on it: the runner may still take it once the lock is \
                 let go ({held})"
            ),
        },
        launch::LaunchError::RecordFailure {
            run,
            source: AppendError::Uncertain { held, .. },
        } => Failure::Unknown {
            run,
            error: anyhow::anyhow!(
                "it was created, but its runner did not take it in time, and the launch's giving \
                 up on it was handed to the commit leader, which may still record it: either may \
                 still come first ({held})"
            ),
        },
        error if error.is_bad_input() => bad_input(error),
        error => Failure::Error(anyhow::Error::new(error).context("launching the run")),
    }
}

/// The runner program with no setting of its own: `runjournal __runner`, for runs whose
/// settings the journal keeps (queued runs).
pub fn runner_base() -> anyhow::Result<RunnerProgram> {
    Ok(RunnerProgram {
        program: std::env::current_exe().context("finding this program to start the runner")?,
        leading_args: vec!["__runner".into()],
    })
}

/// `runjournal __timer`: the home's timer. Starts delayed runs as they come due and exits
/// once none waits; exits at once if another timer holds the home's lock. Started detached;
/// its stdout and stderr are /dev/null.
pub fn timer(home: Home) -> CliResult {
    let store = Store::open(home).context("opening the home")?;
    let by = format!("timer (pid {})", std::process::id());
    let base = runner_base()?;
    match delay::run_timer(&store, &base, &by, &mut |line| note(line)) {
        Ok(_) => {
            store.flush_projections(std::time::Duration::from_secs(2));
            Ok(ExitCode::SUCCESS)
        }
        Err(error) => Err(Failure::Error(anyhow::Error::new(error))),
    }
}

/// `runjournal queue NAME [--max-active N] [--json]`.
pub fn queue(home: Home, name: &str, max_active: Option<u64>, json: bool) -> CliResult {
    runjournal::event::check_queue_name(name).map_err(bad_input)?;
    let store = open_store(home)
        .map_err(|failure| crate::needs_journal(failure, &format!("queue {name}'s limit")))?;
    let runs = runjournal::Runs::new(store, runner_base()?);
    if let Some(max_active) = max_active {
        // A raised limit frees slots now: the runs it allows are started.
        runs.set_queue_limit(name, max_active)
            .context("setting the queue's limit")?;
    }
    let view = runs
        .queue(name, QUEUE_SHOWN_RUNS)
        .context("reading the queue")?;
    if json {
        let text = serde_json::to_string(&queue::QueueReport::of(&view)).context("writing JSON")?;
        print_line(&text)?;
    } else {
        let mut text = format!("queue {name}: {}\n", queue::usage_text(&view.usage));
        for run in &view.active {
            text.push_str(&format!("  active   {run}\n"));
        }
        for (index, run) in view.first_waiting.iter().enumerate() {
            text.push_str(&format!("  queued   {run}  place {}\n", index + 1));
        }
        if view.usage.waiting > view.first_waiting.len() as u64 {
            text.push_str(&format!(
                "  ... and {} more queued\n",
                view.usage.waiting - view.first_waiting.len() as u64
            ));
        }
        print(&text)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Most waiting runs `queue NAME` names.
const QUEUE_SHOWN_RUNS: usize = 20;

fn report_launch(store: &Store, launched: &Launched, json: bool) -> CliResult {
    let run = launched.run;
    let home = store.home();
    if let RunnerStart::Queued {
        queue,
        place,
        usage,
    } = &launched.start
    {
        if json {
            let report = queue::QueuedLaunchReport {
                run_id: run.to_string(),
                state: "queued",
                queue: queue.clone(),
                place: *place,
                active: usage.active,
                max_active: usage.max_active,
                waiting: usage.waiting,
                status_path: home.status_path(run),
                result_path: home.result_path(run),
            };
            print_line(&serde_json::to_string(&report).context("writing JSON")?)?;
        } else {
            let place = place.map_or_else(String::new, |place| format!("place {place}, "));
            print(&format!(
                "run {run} queued in {queue} ({place}{})\nstatus: {}\nresult: {}\n",
                queue::usage_text(usage),
                show::escape_control(&home.status_path(run).display().to_string()),
                show::escape_control(&home.result_path(run).display().to_string())
            ))?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    if let RunnerStart::Waiting { pending } = &launched.start {
        let report = after::WaitingLaunchReport::of(home, run, pending);
        if json {
            print_line(&serde_json::to_string(&report).context("writing JSON")?)?;
        } else {
            print(&format!(
                "run {run} waits for {}\nstatus: {}\nresult: {}\n",
                report.waiting_for.join(", "),
                show::escape_control(&home.status_path(run).display().to_string()),
                show::escape_control(&home.result_path(run).display().to_string())
            ))?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    if let RunnerStart::Delayed { due_at_ms, timer } = &launched.start {
        return report_delayed(home, run, *due_at_ms, timer, json);
    }
    if let RunnerStart::Existing { key } = &launched.start {
        return report_existing(store, run, key, json);
    }
    let runner = match &launched.start {
        RunnerStart::Started { pid, .. } => Ok(*pid),
        RunnerStart::NotStarted { error } => Err(error.clone()),
        RunnerStart::Queued { .. }
        | RunnerStart::Waiting { .. }
        | RunnerStart::Delayed { .. }
        | RunnerStart::Existing { .. } => {
            unreachable!("a waiting or existing launch was reported above")
        }
    };
    let runner_pid = runner.as_ref().ok().copied();
    let error = runner.as_ref().err().cloned();
    if json {
        let object = serde_json::to_string(&LaunchedDoc::of(home, run, runner))
            .context("rendering the launch")?;
        print_line(&object)?;
    } else {
        let started = match runner_pid {
            Some(pid) => format!("run {run} started (runner pid {pid})"),
            None => format!("run {run} failed to start"),
        };
        print(&format!(
            "{started}\nstatus: {}\nresult: {}\n",
            show::escape_control(&home.status_path(run).display().to_string()),
            show::escape_control(&home.result_path(run).display().to_string())
        ))?;
    }
    match error {
        None => Ok(ExitCode::SUCCESS),
        Some(error) => {
            note(&format!("run {run}: {error}"));
            Ok(ExitCode::from(EXIT_ERROR))
        }
    }
}

/// What `run` prints when another run held its key: that run, as it stands, and that nothing
/// was created.
fn report_existing(store: &Store, run: RunId, key: &str, json: bool) -> CliResult {
    let home = store.home();
    let state = store
        .journal()
        .view()
        .and_then(|view| view.snapshot(run))
        .context("reading the run that holds the key")?;
    let status = state.as_ref().map(|state| state.status.as_str());
    if json {
        let report = runjournal::json::ExistingLaunchDoc::of(home, run, key, status);
        print_line(&serde_json::to_string(&report).context("writing JSON")?)?;
    } else {
        print(&format!(
            "run {run} already holds the key {}{}: nothing launched\nstatus: {}\nresult: {}\n",
            show::escape_control(&format!("{key:?}")),
            status.map_or_else(String::new, |status| format!(" ({status})")),
            show::escape_control(&home.status_path(run).display().to_string()),
            show::escape_control(&home.result_path(run).display().to_string())
        ))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// What `run` prints for a delayed run: its due time, or its JSON document; and a note when
/// the home's timer could not be started.
fn report_delayed(
    home: &Home,
    run: RunId,
    due_at_ms: runjournal::event::UnixMs,
    timer: &Result<u32, String>,
    json: bool,
) -> CliResult {
    if json {
        let report = delay::DelayedLaunchReport {
            run_id: run.to_string(),
            state: "queued",
            due_at_ms,
            timer_pid: timer.as_ref().ok().copied(),
            status_path: home.status_path(run),
            result_path: home.result_path(run),
        };
        print_line(&serde_json::to_string(&report).context("writing JSON")?)?;
    } else {
        print(&format!(
            "run {run} delayed until {}\nstatus: {}\nresult: {}\n",
            runjournal::duration::format_time_s(due_at_ms),
            show::escape_control(&home.status_path(run).display().to_string()),
            show::escape_control(&home.result_path(run).display().to_string())
        ))?;
    }
    if let Err(error) = timer {
        note(&format!(
            "run {run}: starting the home's timer: {error}; the next reconcile pass (`runjournal list`) starts it"
        ));
    }
    Ok(ExitCode::SUCCESS)
}

/// What `run --wait` prints while it follows.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Shown {
    /// The steps' output as it comes, and each transition.
    OutputAndTransitions,
    /// Each transition (`--quiet`).
    Transitions,
    /// Nothing until the end (`--json`: one object).
    End,
}

impl Shown {
    fn of(json: bool, quiet: bool) -> Shown {
        match (json, quiet) {
            (true, _) => Shown::End,
            (false, true) => Shown::Transitions,
            (false, false) => Shown::OutputAndTransitions,
        }
    }
}

/// `run --wait`: prints the steps' output as it comes and each transition as it lands; the
/// library records the runner's exit as its parent. Exits with the run's exit code.
fn follow(store: &Store, mut launched: Launched, shown: Shown) -> CliResult {
    let json = shown == Shown::End;
    let run = launched.run;
    let state = store
        .journal()
        .view()
        .and_then(|view| view.snapshot(run))
        .context("reading the run")?
        .context("the run vanished from the journal")?;
    let spec = state.spec.clone();
    let output =
        std::cell::RefCell::new(crate::output::StepOutput::every_step_once_announced(&state));
    // A closed stdout ends the following (and the command, quietly); the run goes on. Any
    // other failed write does not: the runner's exit is still recorded, and the failure is
    // reported at the end. Both callbacks write through it; the library calls them in turn.
    let write_failure: std::cell::RefCell<Option<Failure>> = std::cell::RefCell::new(None);
    let verdict = |failure: &Option<Failure>| match failure {
        Some(Failure::StdoutClosed) => ControlFlow::Break(()),
        _ => ControlFlow::Continue(()),
    };
    let followed = launch::follow_launched_looking(
        store,
        &mut launched,
        || {
            let mut failure = write_failure.borrow_mut();
            if shown == Shown::OutputAndTransitions && failure.is_none() {
                let stdout = std::io::stdout();
                *failure = output
                    .borrow_mut()
                    .show_new(store.home(), &mut stdout.lock())
                    .err();
            }
            verdict(&failure)
        },
        |record| {
            let mut failure = write_failure.borrow_mut();
            if !json && failure.is_none() {
                // What the announced steps wrote before this record landed, then the record.
                let mut output = output.borrow_mut();
                let stdout = std::io::stdout();
                let shown = if shown == Shown::OutputAndTransitions {
                    output.show_new(store.home(), &mut stdout.lock())
                } else {
                    Ok(())
                };
                *failure = shown
                    .and_then(|()| output.end_chunk(&mut stdout.lock()))
                    .and_then(|()| print_line(&show::record_line(record, &spec)))
                    .err();
                if let Event::StepRunning { step, .. } = &record.event {
                    output.announce(*step as usize);
                }
            }
            verdict(&failure)
        },
    )
    .context("following the run")?;
    if let Some(failure) = write_failure.into_inner() {
        return Err(failure);
    }
    let state = match followed {
        Followed::Ended { state, runner } => {
            match runner {
                RunnerExitSeen::StillRunning => note(&format!(
                    "run {run}: the runner has not exited {} after the run ended; leaving it",
                    format_duration(launch::RUNNER_EXIT_TIMEOUT)
                )),
                RunnerExitSeen::WaitFailed(error) => {
                    note(&format!(
                        "run {run}: waiting for the runner failed: {error}"
                    ));
                }
                RunnerExitSeen::Recorded(_) | RunnerExitSeen::NotOurs => {}
            }
            state
        }
        Followed::RunnerDied {
            state,
            exit,
            reconciled,
        } => {
            report_reconciled(&reconciled);
            return Err(Failure::Error(anyhow::anyhow!(
                "run {run}: its runner exited ({}) without recording an outcome (state {}); see {}",
                describe_exit(exit),
                state.status,
                store.home().runner_log_path(run).display()
            )));
        }
        Followed::Stopped { state } | Followed::Left { state } => {
            return Err(Failure::Error(anyhow::anyhow!(
                "run {run}: stopped following it while {}",
                state.status
            )));
        }
    };
    print_end(store, &state, json)?;
    Ok(exit_code_of(&state))
}

fn print_end(store: &Store, state: &RunState, json: bool) -> Result<(), Failure> {
    let run = state.run_id;
    let home = store.home();
    if json {
        let object =
            serde_json::to_string(&EndedDoc::of(home, state)).context("rendering the end")?;
        print_line(&object)
    } else {
        print(&format!(
            "status: {}\nresult: {}\n",
            show::escape_control(&home.status_path(run).display().to_string()),
            show::escape_control(&home.result_path(run).display().to_string())
        ))
    }
}

/// The exit code of a terminal run, as a process exit code (0-255).
pub fn exit_code_of(state: &RunState) -> ExitCode {
    let code = state
        .terminal
        .as_ref()
        .map_or(i32::from(EXIT_ERROR), |terminal| terminal.exit_code);
    ExitCode::from(u8::try_from(code.rem_euclid(256)).unwrap_or(EXIT_ERROR))
}

/// `runjournal __runner RUN`: runs the run's steps. It writes runner.log itself (its stdout
/// and stderr are runner.log too, when the launcher could make it, else /dev/null); a failure
/// is written there by the runner, not repeated on stderr.
pub fn runner(
    home: Home,
    run: &str,
    heartbeat: Option<Duration>,
    idle_timeout: Option<Duration>,
) -> CliResult {
    let run: RunId = run.parse().map_err(bad_input)?;
    let mut config = RunnerConfig::default();
    if let Some(heartbeat) = heartbeat {
        config.heartbeat = heartbeat;
    }
    config.idle_timeout = idle_timeout;
    // Its last act: the run (or its attempt) ended, so the slot it held is free, and its
    // queue's next run starts now, through the runner's own store; a run tried again waits
    // for its next attempt's due time. A runner that could not record its run's
    // end freed no slot (the reconciler fails the run, and its pass admits the next).
    let outcome = runner::run_in_process(home, run, config, |store| {
        start_next_in_queue(store, run);
    });
    match outcome {
        Ok(
            RunnerOutcome::Ended { .. }
            | RunnerOutcome::EndedElsewhere { .. }
            | RunnerOutcome::AttemptEnded { .. },
        ) => Ok(ExitCode::SUCCESS),
        Err(error) if error.is_damage() => Ok(ExitCode::from(crate::EXIT_DAMAGED)),
        Err(_) => Ok(ExitCode::from(EXIT_ERROR)),
    }
}

/// After a runner's run ended: judges the runs waiting for it, then admits what the run's queue
/// now allows, and starts those runs' runners. Best effort: a failure is written to runner.log's
/// stream (stderr), and the next reconcile pass judges and admits them.
fn start_next_in_queue(store: &Store, run: RunId) {
    let started = (|| -> anyhow::Result<()> {
        let by = format!("runner of {run} (pid {})", std::process::id());
        // The runs waiting for this one are judged first: those met take their place in their
        // queue, and those failed fail their own dependents.
        after::settle(store, &runner_base()?, &by, after::Scope::DependentsOf(run))?;
        let queue = store
            .journal()
            .view()?
            .snapshot(run)?
            .and_then(|state| state.queue.map(|queue| queue.name));
        if let Some(queue) = queue {
            queue::start_admissible(store, &runner_base()?, &by, Some(&queue))?;
        }
        // An attempt that ended and is tried again waits for its due time as a delayed run:
        // started now if due, else by the home's timer, started here if none runs.
        let is_retried = store
            .journal()
            .view()?
            .snapshot(run)?
            .is_some_and(|state| state.is_between_attempts());
        if is_retried {
            delay::reconcile_delayed(store, &runner_base()?, &by)?;
        }
        Ok(())
    })();
    if let Err(error) = started {
        use std::io::Write;
        // Its stderr is runner.log, or /dev/null: a failed write changes nothing.
        let _ = writeln!(
            std::io::stderr(),
            "runjournal runner: starting its queue's next run: {error:#}"
        );
    }
}
