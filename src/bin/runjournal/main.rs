//! The `runjournal` command line: argument parsing, printing and exit codes. The work is in
//! the library (`runjournal::launch`, `runjournal::runner`, `runjournal::control`,
//! `runjournal::resolve`), and so are the words (`runjournal::show`).
//!
//! Every write goes through `print` (stdout) or `note` (stderr), neither of which panics. A
//! closed stdout (`| head`) ends any command at once, quietly, with exit 0 — as `journal-tools`
//! and ripgrep do: the reader has what it wanted. A run being followed goes on by itself.

mod control;
mod hooks;
mod inspect;
mod launch;
mod output;
mod reconcile;
mod retention;
mod scrub;
#[cfg(feature = "ship")]
mod ship;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use runjournal::home::Layout;
use runjournal::journal::Tombstone;
use runjournal::journal::{AppendError, CommitSharing, ResolveError};
use runjournal::store::{ForReading, ReadHome, StoreOptions};
use runjournal::{Home, RunId, Store};

/// Exit code: success.
pub const EXIT_OK: u8 = 0;
/// Exit code: the journal or the system failed (I/O, storage, a runner that died).
pub const EXIT_ERROR: u8 = 1;
/// Exit code: bad input (usage, unknown or ambiguous run id, malformed spec, bad duration, ...).
/// Nothing was written.
pub const EXIT_BAD_INPUT: u8 = 2;
/// Exit code: the command gave up while what it wrote may still be recorded: its batch was
/// handed to the journal's commit leader, which waited for the write lock of a stopped process
/// past the command's bound (or, for `run`, its run was created but whether its runner takes it
/// is unknown). Check with `runjournal status ID` before doing it again.
pub const EXIT_UNKNOWN: u8 = 3;
/// Exit code: the journal is damaged, lost or of an unknown format
/// ([`runjournal::journal::is_damage`]), as `journal-tools` says it, and a runner stopped on
/// it. Nothing was written.
pub const EXIT_DAMAGED: u8 = runjournal::journal::DAMAGE_EXIT_CODE;
/// What every report of damage names: the command that rebuilds the journal.
const RECOVER_ADVICE: &str = "recover --from-projections";
/// Exit code of `wait --timeout` when the run is still going (EX_TEMPFAIL).
pub const EXIT_WAIT_TIMEOUT: u8 = 75;

const EXIT_CODES_HELP: &str = "\
Exit codes:
  0    success
  1    the journal or the system failed, or the home is not safe to use (another user owns
       it or may write it); or a run failed with code 1, for run --wait and wait
  2    bad input: usage, unknown or ambiguous run id, malformed spec, bad duration, step out of
       range, an update of a step that is not an external job; nothing was written
  3    unknown: the command gave up on a process that keeps the journal's write lock while
       what it wrote may still land (run: its run may still be created or run); the message
       names the run: check with `runjournal status ID` before trying again
  4    the journal is damaged, lost or of an unknown format: see what is damaged with
       `journal-tools inspect verify`; rebuild it with `journal-tools recover --from-projections`
  75   wait --timeout: the run is still going
  run --wait and wait exit with the run's own exit code: 0 complete; a failed run's failing
  step's code (128+N if killed by signal N, 127 if its program was not found), else 1;
  124 timed out; 143 stopped; 130 interrupted.";

/// Crash-safe background runs: every transition journaled before it is acted on.
#[derive(Parser)]
#[command(version, about, after_help = EXIT_CODES_HELP)]
struct Cli {
    /// State directory [default: $RUNJOURNAL_HOME, else $XDG_STATE_HOME/runjournal, else
    /// ~/.local/state/runjournal; with --layout pi-subagents: $RUNJOURNAL_HOME, else
    /// $PI_SUBAGENTS_TEMP_ROOT, else pi-subagents' own temp root].
    #[arg(long, global = true, value_name = "DIR")]
    home: Option<PathBuf>,
    /// How the home is laid out: runjournal's own, or pi-subagents (the home is then a
    /// pi-subagents temp root: runs in async-subagent-runs/, results in
    /// async-subagent-results/, the journal in runjournal/).
    #[arg(long, global = true, value_name = "LAYOUT", env = "RUNJOURNAL_LAYOUT",
          value_parser = parse_layout, default_value = "runjournal")]
    layout: Layout,
    /// Size of the space reserve kept beside the journal and released on a full disk, in
    /// bytes; 0 disables it [default: $RUNJOURNAL_RESERVE_BYTES, else 8388608].
    #[arg(long, global = true, value_name = "BYTES")]
    reserve_bytes: Option<u64>,
    /// How long journal storage errors other than a full disk (EIO, EROFS, timeouts) are
    /// retried before a command or runner gives up (30s, 10m, 1h) [default:
    /// $RUNJOURNAL_IO_RETRY_WINDOW, else 10m]. A full disk is waited out whatever this says.
    #[arg(long, global = true, value_name = "DURATION", value_parser = launch::duration_arg)]
    io_retry_window: Option<std::time::Duration>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Launch a run in the background: its steps run in a detached runner that outlives this
    /// command.
    Run(Box<launch::RunArgs>),
    /// Show a run's state.
    Status {
        /// Run id, a unique prefix of one (8 characters or more), its name or tool-call id.
        #[arg(required_unless_present = "home_health")]
        run: Option<String>,
        /// Instead of a run: the home's health, what its last scrub of the journal found and
        /// when the next is due.
        #[arg(long, conflicts_with_all = ["run", "show_env"])]
        home_health: bool,
        /// Print the status document (status.json's format) as JSON.
        #[arg(long)]
        json: bool,
        /// Also print the environment its launcher gave it: the variables' values (secrets,
        /// which are never shown otherwise).
        #[arg(long)]
        show_env: bool,
    },
    /// List runs: active ones and recently ended ones, newest first.
    List {
        /// Only runs in this state (queued, running, complete, failed, stopped, paused).
        #[arg(long, value_name = "STATE")]
        state: Option<String>,
        /// Every run, dismissed ones included.
        #[arg(long)]
        all: bool,
        /// Print a JSON array.
        #[arg(long)]
        json: bool,
    },
    /// Wait until a run has ended; exit with its exit code.
    Wait {
        /// Run id, a unique prefix of one (8 characters or more), its name or tool-call id.
        run: String,
        /// Give up after this long (500ms, 30s, 5m, 1h30m) and exit 75.
        #[arg(long, value_name = "DURATION", value_parser = launch::duration_arg)]
        timeout: Option<std::time::Duration>,
    },
    /// Print a run's step output (all steps, or one).
    Logs {
        /// Run id, a unique prefix of one (8 characters or more), its name or tool-call id.
        run: String,
        /// Only this step (numbered from 0).
        #[arg(long, value_name = "N")]
        step: Option<u32>,
        /// Keep printing new output until the run has ended.
        #[arg(long)]
        follow: bool,
    },
    /// Ask a run to stop: recorded in the journal, then the runner is sent SIGTERM. With
    /// --step, only that step: the runner ends it (or skips it, not started yet), the others
    /// of a parallel run go on, a chain ends there, and the run ends failed.
    Stop {
        /// Run id, a unique prefix of one (8 characters or more), its name or tool-call id.
        run: String,
        /// Stop only this step (numbered from 0).
        #[arg(long, value_name = "N")]
        step: Option<u32>,
        /// Why, as recorded with the request.
        #[arg(long, default_value = "requested from the command line")]
        reason: String,
    },
    /// Ask a run to pause: recorded in the journal; the runner sends each running step's
    /// process group SIGINT, then after the grace SIGTERM and SIGKILL; the run ends paused
    /// (exit 130).
    Interrupt {
        /// Run id, a unique prefix of one (8 characters or more), its name or tool-call id.
        run: String,
        /// Why, as recorded with the request.
        #[arg(long, default_value = "requested from the command line")]
        reason: String,
    },
    /// Hand a message to a run's step: kept in the journal, then put in the step's inbox (a
    /// directory the step finds in $RUNJOURNAL_INBOX, one JSON file per message) for the step
    /// to take; at most 20 wait at once. A paused run keeps it for its resume.
    Steer {
        /// Run id, a unique prefix of one (8 characters or more), its name or tool-call id.
        run: String,
        /// The step it is for (numbered from 0) [default: the steps the run is at].
        #[arg(long, value_name = "N")]
        step: Option<u32>,
        /// steer (into what the step is doing) or follow-up (once it is done with it).
        #[arg(long, default_value = "steer", value_parser = control::steer_mode_arg)]
        mode: runjournal::event::SteerMode,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
        /// The message, at most 128 KiB.
        message: String,
    },
    /// Carry a paused run on in a new run: a chain's interrupted step and the rest, a parallel
    /// run's steps that did not complete, a single run's step; with the paused run's name,
    /// cwd, host ids and the timeout it had left. The two runs are linked in the journal and in
    /// status.json (resumedFrom, resumedBy). A run is resumed once.
    Resume(launch::ResumeArgs),
    /// Hide a run from `list` (without --all). Nothing is stopped.
    Dismiss {
        /// Run id, a unique prefix of one (8 characters or more), its name or tool-call id.
        run: String,
    },
    /// Close runs whose runner died and rebuild damaged projections, printing what was done
    /// for each active run (also done before status, list and wait).
    Reconcile {
        /// JSON Lines: one object per active run, then a summary.
        #[arg(long)]
        json: bool,
    },
    /// Show a queue (its limit and what it holds), or set its limit: at most N of its runs
    /// are active at once; the others wait, first in first (`run --queue NAME`).
    Queue {
        /// The queue's name: letters, digits, '.', '_' and '-'.
        name: String,
        /// Most runs of the queue active at once. Kept in the journal.
        #[arg(long, value_name = "N")]
        max_active: Option<u64>,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Show the timeout a run gets when its launch names none, or set it (DURATION, `off` for
    /// none, `layout` for the layout's: 30m in the pi-subagents layout, none in runjournal's).
    /// Kept in the journal; runs launched from then on get it.
    DefaultTimeout {
        /// DURATION (30m, 2h), `off` or `layout`.
        #[arg(value_name = "DURATION|off|layout", value_parser = launch::timeout_setting)]
        timeout: Option<launch::TimeoutSetting>,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Show the retention policy, or set it: how long ended runs are kept, how many, and how
    /// much room the home may take. Kept in the journal: every process of the home applies
    /// it, at each reconcile pass.
    Retention(retention::RetentionArgs),
    /// Prune ended runs now, by the home's retention policy (or the bounds given here).
    Prune(retention::PruneArgs),
    /// Ship the journal's records to PostgreSQL, in commit order, exactly once; follows the
    /// journal unless --once.
    #[cfg(feature = "ship")]
    Ship(ship::ShipArgs),
    /// External jobs.
    Job {
        #[command(subcommand)]
        command: control::JobCommand,
    },
    /// The home's completion hook: a shell command run once every run has ended, whatever
    /// ended it (beside each run's own --on-exit hooks). Kept in the journal.
    Hook {
        #[command(subcommand)]
        command: hooks::HookCommand,
    },
    /// Completion hooks not delivered: pending, failing (retried later) and given up; with a
    /// run, every hook of it and how its deliveries went.
    Hooks {
        /// Run id, a unique prefix of one (8 characters or more), its name or tool-call id.
        run: Option<String>,
        /// Print a JSON array.
        #[arg(long)]
        json: bool,
    },
    /// Check every page of the journal against its checksum now, on a copy (the home's
    /// maintenance does it on a schedule: daily, and after a restart of the host); exit 4 if
    /// the journal is damaged. With --every, set how often instead.
    Scrub {
        /// How often the home's maintenance scrubs the journal (1d, 12h), kept in the journal.
        #[arg(long, value_name = "DURATION", value_parser = launch::duration_arg)]
        every: Option<std::time::Duration>,
        /// Print the scrub's record as one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// A scheduled scrub (started by a maintenance pass when one is due; not for direct use).
    #[command(name = "__scrub", hide = true)]
    ScheduledScrub,
    /// Delivers the completion hooks due in the home (started by a reconcile pass; not for
    /// direct use).
    #[command(name = "__deliver-hooks", hide = true)]
    DeliverHooks,
    /// Starts delayed runs as they come due, and exits once none waits (started when a run is
    /// delayed, and by a reconcile pass; not for direct use).
    #[command(name = "__timer", hide = true)]
    Timer,
    /// The runner of a run (started by `run`; not for direct use).
    #[command(name = "__runner", hide = true)]
    Runner {
        /// The full run id.
        run: String,
        /// Most time between two status.json writes while the runner lives.
        #[arg(long, value_name = "DURATION", env = runjournal::runner::HEARTBEAT_ENV,
              value_parser = launch::duration_arg)]
        heartbeat: Option<std::time::Duration>,
        /// End a step quiet (no output, no job status) this long, timed out.
        #[arg(long, value_name = "DURATION", value_parser = launch::duration_arg)]
        idle_timeout: Option<std::time::Duration>,
    },
}

/// How a command failed.
pub enum Failure {
    /// The caller asked for something that cannot be: exit 2, nothing written.
    BadInput(anyhow::Error),
    /// Something went wrong underneath: exit 1.
    Error(anyhow::Error),
    /// Stdout was closed by its reader: stop, quietly, exit 0.
    StdoutClosed,
    /// The command gave up without knowing whether what it wrote on `run` was recorded: exit
    /// [`EXIT_UNKNOWN`], naming the run to check.
    Unknown { run: RunId, error: anyhow::Error },
}

impl From<anyhow::Error> for Failure {
    fn from(error: anyhow::Error) -> Failure {
        Failure::Error(error)
    }
}

/// A bad-input failure with this message.
pub fn bad_input(message: impl std::fmt::Display) -> Failure {
    Failure::BadInput(anyhow::anyhow!("{message}"))
}

pub type CliResult = Result<ExitCode, Failure>;

fn main() -> ExitCode {
    let matches = match Cli::command().try_get_matches() {
        Ok(matches) => matches,
        Err(error) => return usage_error(error),
    };
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(error) => return usage_error(error),
    };
    if let Some(bytes) = cli.reserve_bytes {
        // SAFETY: still single-threaded here, before any store or runtime starts a thread; the
        // variable is how the setting reaches every store this process opens and the runners
        // it starts.
        unsafe { std::env::set_var(runjournal::capacity::RESERVE_ENV, bytes.to_string()) };
    }
    if let Some(window) = cli.io_retry_window {
        let window = runjournal::duration::format_duration(window);
        // SAFETY: as above, before any thread starts; runners inherit it.
        unsafe { std::env::set_var(runjournal::capacity::IO_RETRY_WINDOW_ENV, window) };
    }
    let mut journal = None;
    let result = match Home::resolve(cli.home.as_deref(), cli.layout) {
        Ok(home) => {
            journal = Some(home.journal_path());
            dispatch(home, cli.command, &matches)
        }
        Err(error) => Err(Failure::BadInput(error.into())),
    };
    match result {
        Ok(code) => code,
        Err(Failure::BadInput(error)) => {
            note(&one_line(&format!("{error:#}")));
            ExitCode::from(EXIT_BAD_INPUT)
        }
        Err(Failure::Error(error)) => match uncertain_run(&error) {
            Some((run, held)) => report_unknown(
                run,
                &anyhow::anyhow!(
                    "what it wrote was handed to the commit leader, which may still commit it \
                     once the lock is let go ({held})"
                ),
            ),
            None if error.chain().any(runjournal::journal::is_damage) => {
                let mut text = format!("{error:#}");
                // Damage met past the open (a page a read reached) says what failed, not what
                // to do: name the file and the remedy as the open's own refusal does.
                if let Some(journal) = journal.filter(|_| !text.contains(RECOVER_ADVICE)) {
                    text = format!("{text}; {}", runjournal::journal::damage_advice(&journal));
                }
                note(&one_line(&text));
                ExitCode::from(EXIT_DAMAGED)
            }
            None => {
                note(&one_line(&format!("{error:#}")));
                ExitCode::from(EXIT_ERROR)
            }
        },
        Err(Failure::Unknown { run, error }) => report_unknown(run, &error),
        Err(Failure::StdoutClosed) => ExitCode::from(EXIT_OK),
    }
}

/// The run of an append in `error`'s chain whose fate is unknown
/// ([`AppendError::Uncertain`]).
fn uncertain_run(error: &anyhow::Error) -> Option<(RunId, runjournal::journal::LockHeld)> {
    let uncertain = |error: &AppendError| match error {
        AppendError::Uncertain { run, held } => Some((*run, held.clone())),
        _ => None,
    };
    error.chain().find_map(|cause| {
        if let Some(error) = cause.downcast_ref::<AppendError>() {
            return uncertain(error);
        }
        // Transparent: the append's error is not in the chain of its own.
        match cause.downcast_ref::<runjournal::control::ControlError>() {
            Some(runjournal::control::ControlError::Append(error)) => uncertain(error),
            _ => None,
        }
    })
}

/// Says that `run` may or may not be recorded, and how to find out: exit [`EXIT_UNKNOWN`].
fn report_unknown(run: RunId, error: &anyhow::Error) -> ExitCode {
    note(&format!(
        "run {run}: unknown: check with `runjournal status {run}` before trying again ({})",
        one_line(&format!("{error:#}"))
    ));
    ExitCode::from(EXIT_UNKNOWN)
}

/// `--layout`'s values.
fn parse_layout(text: &str) -> Result<Layout, String> {
    text.parse()
        .map_err(|error: runjournal::home::UnknownLayout| error.to_string())
}

/// Writes `text` to stdout. A closed pipe (`| head`) is [`Failure::StdoutClosed`]: the
/// command ends quietly with 0. Any other failure to write (a full disk) is an error.
pub fn print(text: &str) -> Result<(), Failure> {
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
        .map_err(stdout_failure)
}

/// What a failed write to stdout means: a closed pipe ends the command quietly; anything else
/// is an error.
pub fn stdout_failure(error: std::io::Error) -> Failure {
    if error.kind() == std::io::ErrorKind::BrokenPipe {
        Failure::StdoutClosed
    } else {
        Failure::Error(anyhow::Error::new(error).context("writing to stdout"))
    }
}

/// [`print`] of one line.
pub fn print_line(line: &str) -> Result<(), Failure> {
    print(&format!("{line}\n"))
}

/// A message on stderr, after `runjournal: `, with its control characters shown visibly
/// ([`one_line`]). A failure to write it changes nothing.
pub fn note(text: &str) {
    let _ = writeln!(std::io::stderr().lock(), "runjournal: {}", one_line(text));
}

/// Prints a usage error as one line (help and version print as clap does).
fn usage_error(error: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    match error.kind() {
        ErrorKind::DisplayHelp
        | ErrorKind::DisplayVersion
        | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => error.exit(),
        _ => {
            let rendered = error.render().to_string();
            let mut lines = rendered.lines();
            let first = lines.next().unwrap_or("invalid arguments");
            let mut first = first.strip_prefix("error: ").unwrap_or(first).to_string();
            // "the following required arguments were not provided:" names them on the lines
            // that follow, indented: keep them on the one line.
            if first.ends_with(':') {
                let named: Vec<&str> = lines
                    .take_while(|line| line.starts_with("  "))
                    .map(str::trim)
                    .collect();
                first = format!("{first} {}", named.join(", "));
            }
            note(first.trim_end());
            ExitCode::from(EXIT_BAD_INPUT)
        }
    }
}

/// Error messages are one line, and hold no control character of a run's or a file's text:
/// newlines become `\n`, escape sequences `\x1b...` ([`runjournal::show::escape_control`]).
fn one_line(text: &str) -> String {
    runjournal::show::escape_control(text).into_owned()
}

fn dispatch(home: Home, command: Command, matches: &clap::ArgMatches) -> CliResult {
    match command {
        Command::Run(args) => {
            let order = matches
                .subcommand_matches("run")
                .map(launch::StepOrder::from_matches)
                .unwrap_or_default();
            launch::run(home, *args, order)
        }
        Command::Status {
            run,
            home_health,
            json,
            show_env,
        } => match run {
            Some(run) if !home_health => inspect::status(home, &run, json, show_env),
            _ => scrub::home_health(home, json),
        },
        Command::Scrub { every, json } => scrub::command(home, every, json, false),
        Command::ScheduledScrub => scrub::command(home, None, false, true),
        Command::List { state, all, json } => inspect::list(home, state.as_deref(), all, json),
        Command::Wait { run, timeout } => inspect::wait(home, &run, timeout),
        Command::Logs { run, step, follow } => inspect::logs(home, &run, step, follow),
        Command::Stop { run, step, reason } => match step {
            Some(step) => control::stop_step(home, &run, step, &reason),
            None => control::stop(home, &run, &reason),
        },
        Command::Interrupt { run, reason } => control::interrupt(home, &run, &reason),
        Command::Steer {
            run,
            step,
            mode,
            json,
            message,
        } => control::steer(home, &run, step, mode, &message, json),
        Command::Resume(args) => launch::resume(home, args),
        Command::Dismiss { run } => control::dismiss(home, &run),
        Command::Job { command } => control::job(home, command),
        Command::Hook { command } => hooks::hook(home, command),
        Command::Hooks { run, json } => hooks::hooks(home, run.as_deref(), json),
        Command::DeliverHooks => hooks::deliver(home),
        Command::Timer => launch::timer(home),
        Command::Reconcile { json } => reconcile::command(home, json),
        Command::Queue {
            name,
            max_active,
            json,
        } => launch::queue(home, &name, max_active, json),
        #[cfg(feature = "ship")]
        Command::Ship(args) => ship::command(home, args),
        Command::Retention(args) => retention::retention(home, args),
        Command::DefaultTimeout { timeout, json } => launch::default_timeout(home, timeout, json),
        Command::Prune(args) => retention::prune(home, args),
        Command::Runner {
            run,
            heartbeat,
            idle_timeout,
        } => launch::runner(home, &run, heartbeat, idle_timeout),
    }
}

/// The reconciler (docs/design.md, "Reconciler"), run at the start of every command that reads state
/// (`status`, `list`, `wait`) and when a waited-for runner is found gone; skipped, with one
/// line saying who keeps the journal's write lock, when the home could only be read.
pub fn reconcile_before_reading(home: &ForReading) {
    match home {
        ForReading::Store(store) => reconcile::before_reading(store),
        ForReading::ReadOnly { held, .. } => note(&runjournal::runs::skipped_line(held)),
    }
}

/// Says on stderr, in one line, what a reconcile pass the command made (or the library made
/// for it) repaired, or why it failed; routine bookkeeping says nothing.
pub fn report_reconciled<E: std::fmt::Display>(pass: &Result<runjournal::reconcile::Report, E>) {
    match pass {
        Ok(report) => {
            if let Some(line) = runjournal::show::repairs_line(report) {
                note(&line);
            }
        }
        Err(error) => note(&format!("reconciling: {error}")),
    }
}

/// Checks a run's text (id, prefix, name or tool-call id) before anything (a path, the
/// journal) is touched with it.
pub fn check_run_text(text: &str) -> Result<(), Failure> {
    runjournal::resolve::check_text(text).map_err(bad_input)
}

/// How long a reading command waits for the journal's write lock before it reads without
/// it: the passes before a read are upkeep, and a live process lets the lock go within
/// milliseconds.
const READING_LOCK_BOUND: std::time::Duration =
    runjournal::journal::lock_wait::DEFAULT_NOTICE_AFTER;

/// Opens the home for a command that reads it (`status`, `list`, `wait`, `logs`): as a store
/// ([`open_store`]) if the journal's write lock can be had within [`READING_LOCK_BOUND`] (or
/// the command's bound, if shorter), else read-only. Either way the command answers.
pub fn open_for_reading(home: Home) -> Result<ForReading, Failure> {
    home.check_layout().map_err(bad_input)?;
    home.check_place().map_err(bad_input)?;
    let root = home.root().display().to_string();
    let failure = |error: anyhow::Error| Failure::Error(error.context(format!("home {root}")));
    let mut options = command_options().map_err(|reason| failure(anyhow::anyhow!(reason)))?;
    let bound = options
        .lock_wait
        .give_up_after
        .map_or(READING_LOCK_BOUND, |bound| bound.min(READING_LOCK_BOUND));
    options.lock_wait = runjournal::journal::lock_wait::LockWait::give_up_after(bound);
    ForReading::open(home, options).map_err(|error| failure(anyhow::Error::new(error)))
}

/// A command's store options: from the environment, joining a commit leader but never
/// leading, and giving up on the journal's write lock after the command's bound.
fn command_options() -> Result<StoreOptions, String> {
    let mut options = StoreOptions::from_env()?;
    if options.commit_sharing == CommitSharing::Shared {
        options.commit_sharing = CommitSharing::Join;
    }
    // A command gives up on a journal whose write lock another process keeps (one stopped
    // inside a commit), rather than hang; a runner waits longer.
    let bound = runjournal::journal::lock_wait::command_bound_from_env()?;
    options.lock_wait = runjournal::journal::lock_wait::LockWait::give_up_after(bound);
    Ok(options)
}

/// Opens the home's store. A home whose journal is of the other layout, or a new home where
/// something else lives (`/`, a directory of other files), is bad input: nothing is made in
/// it. A command hands its commits to the journal's commit leader (a runner) when
/// there is one, but never leads: it is short-lived, and may be stopped from its terminal.
pub fn open_store(home: Home) -> Result<Store, Failure> {
    home.check_layout().map_err(bad_input)?;
    home.check_place().map_err(bad_input)?;
    let root = home.root().display().to_string();
    let failure = |error: anyhow::Error| Failure::Error(error.context(format!("home {root}")));
    let options = command_options().map_err(|reason| failure(anyhow::anyhow!(reason)))?;
    Store::open_with(home, options).map_err(|error| failure(anyhow::Error::new(error)))
}

/// A failure to open the home for `what`, a fact kept only in the journal (a queue's limit,
/// the retention policy): when the journal is lost or damaged, the message begins by saying
/// that the journal must be rebuilt first; the error itself goes on to say how.
pub fn needs_journal(failure: Failure, what: &str) -> Failure {
    match failure {
        Failure::Error(error) if error.chain().any(runjournal::journal::is_damage) => {
            Failure::Error(error.context(format!(
                "{what} is kept in the journal, which must be rebuilt first"
            )))
        }
        other => other,
    }
}

/// A run as a command names it: in the journal, or pruned from it.
pub enum Named {
    Run(RunId),
    Pruned(Tombstone),
}

/// The run named by `text` (a full id, a unique prefix, its name or its tool-call id), in the
/// journal or pruned from it.
pub fn resolve_named(store: &dyn ReadHome, text: &str) -> Result<Named, Failure> {
    let view = store.view().map_err(|error| Failure::Error(error.into()))?;
    let run = runjournal::resolve::resolve_run(&view, text).map_err(|error| match error {
        ResolveError::Read(error) => Failure::Error(error.into()),
        other => bad_input(other),
    })?;
    let is_in_journal = view
        .snapshot(run)
        .map_err(|error| Failure::Error(error.into()))?
        .is_some();
    if is_in_journal {
        return Ok(Named::Run(run));
    }
    match view
        .tombstone(run)
        .map_err(|error| Failure::Error(error.into()))?
    {
        Some(tombstone) => Ok(Named::Pruned(tombstone)),
        None => Ok(Named::Run(run)),
    }
}

/// The run named by `text`, which must still be in the journal: a pruned run is bad input,
/// said as what is left of it.
pub fn resolve(store: &dyn ReadHome, text: &str) -> Result<RunId, Failure> {
    match resolve_named(store, text)? {
        Named::Run(run) => Ok(run),
        Named::Pruned(tombstone) => Err(bad_input(format!(
            "{}: nothing else is left of it",
            runjournal::show::pruned_line(&tombstone)
        ))),
    }
}
