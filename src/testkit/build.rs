//! Builders of specs and events, so that a test reads as the story of its runs: each builder
//! takes what tests vary and fixes the rest. A test that needs a field the builder fixes
//! writes it with struct update syntax (`RunSpec { name: …, ..spec(…) }`).

use std::sync::Arc;

use crate::event::{
    ControlAction, Event, ExternalJobStatus, HostIds, JobState, Mode, Observer, ProcessExit,
    ProcessIdentity, Proof, RunSpec, SteerMode, StepAction, StepEnd, StepOutcome, StepSpec,
    TerminalState, UnixMs,
};

/// The action of a shell step running `script`.
pub fn sh(script: &str) -> StepAction {
    StepAction::Shell {
        script: script.to_string(),
    }
}

/// The action of a command step running `argv`.
pub fn argv(argv: &[&str]) -> StepAction {
    StepAction::Command {
        argv: argv.iter().map(|arg| arg.to_string()).collect(),
    }
}

/// The action of an external-job step whose provider is `provider`.
pub fn provider(provider: &str) -> StepAction {
    StepAction::ExternalJob {
        provider: provider.to_string(),
    }
}

/// A step named `name` doing `action`.
pub fn step(name: &str, action: StepAction) -> StepSpec {
    StepSpec {
        name: name.to_string(),
        action,
    }
}

/// A shell step.
pub fn shell(name: &str, script: &str) -> StepSpec {
    step(name, sh(script))
}

/// A command step running `make <name>`.
pub fn make_step(name: &str) -> StepSpec {
    step(name, argv(&["make", name]))
}

/// A shell step echoing its name.
pub fn echo_step(name: &str) -> StepSpec {
    shell(name, &format!("echo {name}"))
}

/// An external-job step of the provider `render-farm`.
pub fn farm_step(name: &str) -> StepSpec {
    step(name, provider("render-farm"))
}

/// `count` steps named `step-0`, `step-1`, …, each doing `action`.
pub fn numbered(count: usize, action: &StepAction) -> Vec<StepSpec> {
    (0..count)
        .map(|index| step(&format!("step-{index}"), action.clone()))
        .collect()
}

/// An unnamed run of `steps` in `mode`, one at a time, without a timeout or a working
/// directory.
pub fn spec(mode: Mode, steps: Vec<StepSpec>) -> RunSpec {
    RunSpec {
        name: None,
        mode,
        concurrency: 1,
        timeout_ms: None,
        cwd: None,
        steps,
    }
}

/// An unnamed chain of `steps` shell steps `step-0`, `step-1`, …, each the script `true`.
pub fn chain_spec(steps: u32) -> RunSpec {
    spec(Mode::Chain, numbered(steps as usize, &sh("true")))
}

/// The host ids of a run: its session, completion owner and tool call.
pub fn hosts(session: Option<&str>, owner: Option<&str>, tool_call: Option<&str>) -> HostIds {
    HostIds {
        session_id: session.map(str::to_string),
        completion_owner_id: owner.map(str::to_string),
        tool_call_id: tool_call.map(str::to_string),
    }
}

/// The `RunCreated` of a run of `spec`, created at `created_at_ms` for `hosts`.
pub fn created(spec: impl Into<Arc<RunSpec>>, created_at_ms: UnixMs, hosts: HostIds) -> Event {
    Event::RunCreated {
        spec: spec.into(),
        created_at_ms,
        session_id: hosts.session_id,
        completion_owner_id: hosts.completion_owner_id,
        tool_call_id: hosts.tool_call_id,
    }
}

/// A runner started as process `runner`, instance `instance`.
pub fn runner_started(runner: ProcessIdentity, instance: &str) -> Event {
    Event::RunnerStarted {
        runner,
        instance_id: instance.to_string(),
    }
}

/// Step `step` running as `process`.
pub fn step_running(step: u32, process: Option<ProcessIdentity>) -> Event {
    Event::StepRunning { step, process }
}

/// Step `step` ended as `end`, with this exit code and error.
pub fn step_finished(
    step: u32,
    end: StepEnd,
    exit_code: Option<i32>,
    error: Option<&str>,
) -> Event {
    Event::StepFinished {
        step,
        outcome: StepOutcome {
            end,
            exit_code,
            error: error.map(str::to_string),
        },
    }
}

/// Step `step` complete: it exited 0.
pub fn step_complete(step: u32) -> Event {
    step_finished(step, StepEnd::Complete, Some(0), None)
}

/// A job status of job `id` in `state` at `progress`, without a message or a URL.
pub fn job(state: JobState, id: &str, progress: Option<f64>) -> ExternalJobStatus {
    ExternalJobStatus {
        state,
        id: Some(id.to_string()),
        progress,
        message: None,
        url: None,
    }
}

/// Step `step`'s external job reported `job`.
pub fn job_updated(step: u32, job: ExternalJobStatus) -> Event {
    Event::ExternalJobUpdated { step, job }
}

/// `by` asked for `action` because of `reason`.
pub fn control(action: ControlAction, by: &str, reason: &str) -> Event {
    Event::ControlRequested {
        action,
        by: by.to_string(),
        reason: reason.to_string(),
    }
}

/// The run ended as `state`, not repaired.
pub fn terminal(state: TerminalState, exit_code: i32, summary: &str, error: Option<&str>) -> Event {
    Event::Terminal {
        state,
        error: error.map(str::to_string),
        summary: summary.to_string(),
        exit_code,
        repaired_by: None,
    }
}

/// The run complete (exit code 0), with `summary`.
pub fn completed(summary: &str) -> Event {
    terminal(TerminalState::Complete, 0, summary, None)
}

/// The runner `instance` seen gone by `observer`: it exited with `exit_code` (`None`: how is
/// not known), which `proof` shows.
pub fn process_terminal(
    instance: &str,
    exit_code: Option<i32>,
    proof: Proof,
    observer: Observer,
) -> Event {
    Event::ProcessTerminalObserved {
        instance_id: instance.to_string(),
        exit: exit_code.map(|code| ProcessExit {
            code: Some(code),
            signal: None,
        }),
        proof,
        observer,
    }
}

/// The runner `instance` seen exiting with `code` by its parent.
pub fn runner_exited(instance: &str, code: i32) -> Event {
    process_terminal(
        instance,
        Some(code),
        Proof::Observed,
        Observer::RunnerParent,
    )
}

/// A steer request `id` for `steps`, from the command line, in the `steer` mode.
pub fn steer_requested(id: &str, steps: &[u32], message: &str) -> Event {
    Event::SteerRequested {
        id: id.to_string(),
        steps: steps.to_vec(),
        mode: SteerMode::Steer,
        message: message.to_string(),
        source: "cli".to_string(),
    }
}

/// Step `step` took steer request `id`.
pub fn steer_delivered(id: &str, step: u32) -> Event {
    Event::SteerDelivered {
        id: id.to_string(),
        step,
    }
}

/// A host's repair that failed the run at `ended_at_ms`, its result published at
/// `result_path`.
pub fn host_ended(message: &str, ended_at_ms: UnixMs, result_path: Option<&str>) -> Event {
    Event::HostEnded {
        state: TerminalState::Failed,
        exit_code: 1,
        message: message.to_string(),
        ended_at_ms,
        result_path: result_path.map(str::to_string),
    }
}
