//! Acting on runs from outside: `stop`, `dismiss`, `job update`.

use std::process::ExitCode;

use clap::Subcommand;

use runjournal::Home;
use runjournal::control::{self, ControlError, DismissOutcome, StepStopOutcome, StopOutcome};
use runjournal::event::{
    ExternalJobStatus, JobState, MAX_STEER_MESSAGE_BYTES, MAX_TEXT_BYTES, SteerMode,
};

use crate::{CliResult, Failure, bad_input, check_run_text, open_store, print_line, resolve};

#[derive(Subcommand)]
pub enum JobCommand {
    /// Push an external job's status straight into the journal (the step must be running).
    Update {
        /// Run id, a unique prefix of one (8 characters or more), its name or tool-call id.
        run: String,
        /// The external-job step's number (from 0).
        step: String,
        /// queued, running, blocked, succeeded (or completed), failed, cancelled (or stopped).
        #[arg(long)]
        state: String,
        /// Progress, a finite number (as the provider reports it, e.g. 0.4 or 40).
        #[arg(long)]
        progress: Option<String>,
        #[arg(long)]
        message: Option<String>,
        #[arg(long)]
        url: Option<String>,
        /// The provider's id of the job.
        #[arg(long)]
        id: Option<String>,
    },
}

fn control_failure(error: ControlError) -> Failure {
    if error.is_bad_input() {
        bad_input(error)
    } else {
        Failure::Error(error.into())
    }
}

/// Refuses a `--reason` over the limit of a recorded text before anything is opened: a run
/// that has already ended would never record it, and must not make it pass.
fn check_reason(reason: &str) -> Result<(), Failure> {
    if reason.len() > MAX_TEXT_BYTES {
        return Err(bad_input(format!(
            "--reason is {} bytes, over the limit of {MAX_TEXT_BYTES}",
            reason.len()
        )));
    }
    Ok(())
}

/// `runjournal stop RUN`.
pub fn stop(home: Home, text: &str, reason: &str) -> CliResult {
    check_run_text(text)?;
    check_reason(reason)?;
    let store = open_store(home)?;
    let run = resolve(&store, text)?;
    let by = format!("runjournal stop (pid {})", std::process::id());
    let outcome = control::request_stop(&store, run, &by, reason).map_err(control_failure)?;
    match outcome {
        StopOutcome::Requested { signalled } | StopOutcome::AlreadyRequested { signalled } => {
            let again = if matches!(outcome, StopOutcome::AlreadyRequested { .. }) {
                " (already requested)"
            } else {
                ""
            };
            let how = if signalled {
                "runner signalled"
            } else {
                "the runner will see it when it next looks"
            };
            print_line(&format!("run {run}: stop requested{again}; {how}"))?;
        }
        StopOutcome::AlreadyEnded { state } => {
            print_line(&format!(
                "run {run} has already ended ({state}); nothing to stop"
            ))?;
        }
        StopOutcome::StoppedWaiting { waiting } => {
            print_line(&format!(
                "run {run}: stopped while it waited {waiting}; it never started"
            ))?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `runjournal stop RUN --step N`.
pub fn stop_step(home: Home, text: &str, step: u32, reason: &str) -> CliResult {
    check_run_text(text)?;
    check_reason(reason)?;
    let store = open_store(home)?;
    let run = resolve(&store, text)?;
    let by = format!("runjournal stop --step (pid {})", std::process::id());
    let outcome =
        control::request_step_stop(&store, run, step, &by, reason).map_err(control_failure)?;
    print_line(&match outcome {
        StepStopOutcome::Requested => {
            format!(
                "run {run}: stop of step {step} requested; the runner ends it when it next looks"
            )
        }
        StepStopOutcome::AlreadyRequested => {
            format!("run {run}: stop of step {step} already requested")
        }
        StepStopOutcome::StepEnded { status } => {
            format!("run {run}: step {step} has already ended ({status}); nothing to stop")
        }
        StepStopOutcome::AlreadyEnded { state } => {
            format!("run {run} has already ended ({state}); nothing to stop")
        }
    })?;
    Ok(ExitCode::SUCCESS)
}

/// `runjournal interrupt RUN [--reason TEXT]`.
pub fn interrupt(home: Home, text: &str, reason: &str) -> CliResult {
    check_run_text(text)?;
    check_reason(reason)?;
    let store = open_store(home)?;
    let run = resolve(&store, text)?;
    let by = format!("runjournal interrupt (pid {})", std::process::id());
    let outcome = control::request_interrupt(&store, run, &by, reason).map_err(control_failure)?;
    match outcome {
        StopOutcome::Requested { .. } => print_line(&format!(
            "run {run}: interrupt requested; the runner sees it when it next looks"
        ))?,
        StopOutcome::AlreadyRequested { .. } => {
            let control = store
                .journal()
                .view()
                .and_then(|view| view.snapshot(run))
                .ok()
                .flatten()
                .and_then(|state| state.controls.first().map(|control| control.action));
            let what = control.map_or("a control request", |action| action.as_str());
            print_line(&format!(
                "run {run}: {what} was already requested; it is what the run acts on"
            ))?;
        }
        StopOutcome::AlreadyEnded { state } => print_line(&format!(
            "run {run} has already ended ({state}); nothing to interrupt"
        ))?,
        // Only a stop ends a waiting run; an interrupt is recorded for when it starts.
        StopOutcome::StoppedWaiting { waiting } => {
            print_line(&format!("run {run}: stopped while it waited {waiting}"))?
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `--mode`'s values.
pub fn steer_mode_arg(text: &str) -> Result<SteerMode, String> {
    text.parse()
}

/// `runjournal steer RUN [--step N] [--mode steer|follow-up] MESSAGE`.
pub fn steer(
    home: Home,
    text: &str,
    step: Option<u32>,
    mode: SteerMode,
    message: &str,
    json: bool,
) -> CliResult {
    check_run_text(text)?;
    if message.trim().is_empty() {
        return Err(bad_input("the message is empty"));
    }
    if message.len() > MAX_STEER_MESSAGE_BYTES {
        return Err(bad_input(format!(
            "the message is {} bytes, over the limit of {MAX_STEER_MESSAGE_BYTES}",
            message.len()
        )));
    }
    let store = open_store(home)?;
    let run = resolve(&store, text)?;
    let source = format!("runjournal steer (pid {})", std::process::id());
    let steered = control::steer(&store, run, step, mode, message, &source).map_err(|error| {
        if error.is_bad_input() {
            bad_input(error)
        } else {
            Failure::Error(error.into())
        }
    })?;
    if json {
        let text = serde_json::to_string(&steered)
            .map_err(|error| Failure::Error(anyhow::Error::new(error)))?;
        print_line(&text)?;
    } else {
        let steps: Vec<String> = steered.steps.iter().map(u32::to_string).collect();
        let when = if steered.is_for_resume {
            "kept for the run that resumes it"
        } else {
            "handed to the step through its inbox"
        };
        print_line(&format!(
            "run {run}: {} {} for step {}; {when}",
            steered.mode,
            steered.request_id,
            steps.join(", ")
        ))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `runjournal dismiss RUN`.
pub fn dismiss(home: Home, text: &str) -> CliResult {
    check_run_text(text)?;
    let store = open_store(home)?;
    let run = resolve(&store, text)?;
    match control::dismiss(&store, run).map_err(control_failure)? {
        DismissOutcome::Dismissed => print_line(&format!("run {run} dismissed"))?,
        DismissOutcome::AlreadyDismissed => {
            print_line(&format!("run {run} was already dismissed"))?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `runjournal job ...`.
pub fn job(home: Home, command: JobCommand) -> CliResult {
    match command {
        JobCommand::Update {
            run,
            step,
            state,
            progress,
            message,
            url,
            id,
        } => {
            // Everything is checked before the journal is opened.
            check_run_text(&run)?;
            let step: u32 = step.parse().map_err(|_| {
                bad_input(format!("step {step:?} is not a step number (0, 1, ...)"))
            })?;
            let state: JobState = state.parse().map_err(bad_input)?;
            let progress = progress
                .map(|text| match text.parse::<f64>() {
                    Ok(value) if value.is_finite() => Ok(value),
                    _ => Err(bad_input(format!(
                        "progress {text:?} is not a finite number"
                    ))),
                })
                .transpose()?;
            for (field, value) in [("message", &message), ("url", &url), ("id", &id)] {
                if let Some(value) = value.as_ref().filter(|value| value.len() > MAX_TEXT_BYTES) {
                    return Err(bad_input(format!(
                        "--{field} is {} bytes, over the limit of {MAX_TEXT_BYTES}",
                        value.len()
                    )));
                }
            }
            let status = ExternalJobStatus {
                state,
                id,
                progress,
                message,
                url,
            };
            let store = open_store(home)?;
            let run = resolve(&store, &run)?;
            let appended =
                control::push_job_update(&store, run, step, status).map_err(control_failure)?;
            print_line(&format!(
                "run {run}: step {step} job {} (record {})",
                state.as_str(),
                appended.last_seq
            ))?;
            Ok(ExitCode::SUCCESS)
        }
    }
}
