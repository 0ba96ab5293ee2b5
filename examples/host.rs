//! A host that embeds runjournal: it opens a home, sets a retention policy, launches a run,
//! follows it to its end, reads and consumes its result, then calls `maintain` (the upkeep a
//! host makes before it reads) until the policy has pruned the run, with no `prune` call.
//! It exits non-zero if any of that does not happen.
//!
//! The runner program is the `runjournal` binary: `$RUNJOURNAL_BIN`, else the one built beside
//! this example (`cargo build` first). `tests/it/host_example.rs` runs it in CI.

use std::ops::ControlFlow;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use runjournal::event::{StepAction, StepSpec};
use runjournal::journal::Retention;
use runjournal::launch::Followed;
use runjournal::spec::RunDraft;
use runjournal::{Home, RunnerProgram, Runs};

/// Most `maintain` calls the host makes before it says the run was never pruned.
const MAINTAIN_ATTEMPTS: u32 = 100;

fn main() -> ExitCode {
    match host() {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("host: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// The `runjournal` binary: `$RUNJOURNAL_BIN`, else `target/<profile>/runjournal` beside this
/// example's `target/<profile>/examples/`.
fn runjournal_binary() -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os("RUNJOURNAL_BIN") {
        return Ok(PathBuf::from(path));
    }
    let exe = std::env::current_exe().context("finding this example")?;
    let beside = exe
        .parent()
        .and_then(|examples| examples.parent())
        .map(|profile| profile.join("runjournal"))
        .context("finding the target directory")?;
    if !beside.exists() {
        bail!(
            "no runjournal binary at {}: build it (cargo build) or set RUNJOURNAL_BIN",
            beside.display()
        );
    }
    Ok(beside)
}

fn host() -> anyhow::Result<()> {
    let dir = tempfile::tempdir().context("making a temporary directory")?;
    let home = Home::at(dir.path().join("home"));
    let runs = Runs::open(home, RunnerProgram::runjournal(runjournal_binary()?))
        .context("opening the home")?;

    // Keep no ended run: one goes at the first pass after its result is consumed.
    runs.set_retention(&Retention {
        keep_runs: Some(0),
        ..Retention::DEFAULT
    })
    .context("setting the retention policy")?;

    let request = RunDraft {
        name: Some("greet".to_string()),
        steps: vec![StepSpec {
            name: "hello".to_string(),
            action: StepAction::Shell {
                script: "echo hello from a step".to_string(),
            },
        }],
        ..RunDraft::default()
    }
    .finish()
    .context("making the run's request")?;
    let mut launched = runs.launch(request).context("launching the run")?;
    let run = launched.run;
    println!("launched run {run}");

    // Follow it to its end; the host is the runner's parent and records how it exited.
    let followed = runs
        .follow(&mut launched, |record| {
            println!("  {}", record.event.name());
            ControlFlow::Continue(())
        })
        .context("following the run")?;
    let state = match followed {
        Followed::Ended { state, .. } => state,
        other => bail!("run {run} did not end as it should: {other:?}"),
    };
    println!("run {run} ended {}", state.status);
    // Its runner's exit is recorded after the run's end: only then is the run closed.
    let closed = runs
        .status(run)
        .context("reading the run")?
        .is_some_and(|state| state.is_closed());
    if !closed {
        bail!("run {run} ended, but its runner was not seen to exit");
    }

    // Read the result, then consume it: a host removes what it has taken.
    let result_path = runs.home().result_path(run);
    let result = std::fs::read_to_string(&result_path)
        .with_context(|| format!("reading {}", result_path.display()))?;
    let result: serde_json::Value =
        serde_json::from_str(&result).context("reading the result's JSON")?;
    println!("result: {}", result["summary"]);
    if result["exitCode"] != 0 {
        bail!("run {run} did not complete: {result}");
    }
    std::fs::remove_file(&result_path).context("consuming the result")?;

    // Upkeep, as before every read: the policy prunes the run, with no prune call.
    for attempt in 1..=MAINTAIN_ATTEMPTS {
        let done = runs.maintain();
        println!("maintain: {done}");
        if runs.status(run).context("reading the run")?.is_none() {
            println!("run {run} pruned by the policy after {attempt} maintain call(s)");
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("run {run} was never pruned by the policy after {MAINTAIN_ATTEMPTS} maintain calls")
}
