//! A chain run as the journal tests append it through the library: its spec, made-up process
//! identities, and every batch of its life after `RunCreated` — the runner started, each step
//! running and finished complete, then `Terminal` with `ProcessTerminalObserved` in one batch.

use runjournal::event::{
    Event, Mode, Observer, ProcessExit, ProcessIdentity, Proof, RunSpec, StepAction, StepEnd,
    StepOutcome, StepSpec, TerminalState,
};

/// A chain of `steps` steps, each the shell script `true`.
pub fn chain_spec(steps: u32) -> RunSpec {
    RunSpec {
        name: None,
        mode: Mode::Chain,
        concurrency: 1,
        timeout_ms: None,
        cwd: None,
        steps: (0..steps)
            .map(|index| StepSpec {
                name: format!("step-{index}"),
                action: StepAction::Shell {
                    script: "true".to_string(),
                },
            })
            .collect(),
    }
}

/// The PID namespace every [`identity`] is recorded in (Linux's initial one), as a runner
/// records its processes: it must reach the journal as it was sent, through a commit leader
/// too (`tests/it/commit_leader.rs` checks it).
pub const PID_NAMESPACE: u64 = 4_026_531_836;

/// A process identity of a boot no machine has: never alive, never signalled.
pub fn identity(pid: u32) -> ProcessIdentity {
    ProcessIdentity {
        pid,
        start_time: 1,
        boot_id: "test-boot".to_string(),
        pid_namespace: Some(PID_NAMESPACE),
    }
}

/// The batches of a complete life of a [`chain_spec`] run of `steps` steps, its runner recorded
/// as `runner_pid` and step `i`'s process as `1000 + i`.
pub fn chain_lifecycle(steps: u32, runner_pid: u32) -> Vec<Vec<Event>> {
    let mut batches = vec![vec![Event::RunnerStarted {
        runner: identity(runner_pid),
        instance_id: "instance".to_string(),
    }]];
    for step in 0..steps {
        batches.push(vec![Event::StepRunning {
            step,
            process: Some(identity(1000 + step)),
        }]);
        batches.push(vec![Event::StepFinished {
            step,
            outcome: StepOutcome {
                end: StepEnd::Complete,
                exit_code: Some(0),
                error: None,
            },
        }]);
    }
    batches.push(vec![
        Event::Terminal {
            state: TerminalState::Complete,
            error: None,
            summary: "done".to_string(),
            exit_code: 0,
            repaired_by: None,
        },
        Event::ProcessTerminalObserved {
            instance_id: "instance".to_string(),
            exit: Some(ProcessExit {
                code: Some(0),
                signal: None,
            }),
            proof: Proof::Observed,
            observer: Observer::RunnerParent,
        },
    ]);
    batches
}
