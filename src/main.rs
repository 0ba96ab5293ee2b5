//! The `runjournal` command line: argument parsing, output and exit codes. The work is in the
//! library.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};

use runjournal::event::{
    Event, Mode, Observer, ProcessExit, Proof, StepAction, StepEnd, StepOutcome, StepSpec,
    TerminalState,
};
use runjournal::{Condition, Home, HostIds, RunSpec, Store, liveness};

/// Crash-safe background runs: every transition journaled before it is acted on.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    /// State directory [default: $RUNJOURNAL_HOME, else $XDG_STATE_HOME/runjournal, else
    /// ~/.local/state/runjournal].
    #[arg(long, global = true, value_name = "DIR")]
    home: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Record a small run's whole lifecycle (one step, `echo hello`) and print where its
    /// status.json and result file are.
    Demo,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("runjournal: {error:#}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let home = Home::resolve(cli.home.as_deref())?;
    match cli.command {
        Command::Demo => demo(home),
    }
}

fn demo(home: Home) -> anyhow::Result<ExitCode> {
    let store = Store::open(home).context("opening the home")?;
    let spec = RunSpec {
        name: Some("demo".to_string()),
        mode: Mode::Single,
        concurrency: 1,
        timeout_ms: None,
        cwd: None,
        steps: vec![StepSpec {
            name: "hello".to_string(),
            action: StepAction::Shell {
                script: "echo hello".to_string(),
            },
        }],
    };
    let created = store.create_run(spec, HostIds::default())?;
    let run = created.run;
    let me = liveness::current().context("reading this process's identity")?;
    let instance_id = format!("demo-{}", std::process::id());
    store.append(
        run,
        vec![Event::RunnerStarted {
            runner: me,
            instance_id: instance_id.clone(),
        }],
        Condition::expect_head(1),
    )?;
    let log_path = store.home().output_log_path(run, 0);
    let log = std::fs::File::create(&log_path)
        .with_context(|| format!("creating {}", log_path.display()))?;
    let mut child = std::process::Command::new("sh")
        .args(["-c", "echo hello"])
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("starting the demo step")?;
    let process = liveness::identity_of(child.id())?;
    store.append(
        run,
        vec![Event::StepRunning { step: 0, process }],
        Condition::expect_not_terminal(),
    )?;
    let status = child.wait().context("waiting for the demo step")?;
    let exit_code = status.code().unwrap_or(1);
    let (end, state) = if status.success() {
        (StepEnd::Complete, TerminalState::Complete)
    } else {
        (StepEnd::Failed, TerminalState::Failed)
    };
    store.append(
        run,
        vec![
            Event::StepFinished {
                step: 0,
                outcome: StepOutcome {
                    end,
                    exit_code: Some(exit_code),
                    error: None,
                },
            },
            Event::Terminal {
                state,
                error: None,
                summary: "hello".to_string(),
                exit_code,
                repaired_by: None,
            },
            Event::ProcessTerminalObserved {
                instance_id,
                exit: Some(ProcessExit {
                    code: Some(0),
                    signal: None,
                }),
                proof: Proof::Observed,
                observer: Observer::RunnerParent,
            },
        ],
        Condition::expect_not_terminal(),
    )?;
    if store.flush_projections(std::time::Duration::from_secs(5)) > 0 {
        anyhow::bail!("run {run} is journaled but its projection could not be written yet");
    }
    println!("run {run} complete");
    println!("status: {}", store.home().status_path(run).display());
    println!("result: {}", store.home().result_path(run).display());
    Ok(ExitCode::SUCCESS)
}
