//! The standard lifecycle: a chain run as the tests append it through the library, every batch
//! of its life after `RunCreated` — the runner started, each step running and finished
//! complete, then `Terminal` with `ProcessTerminalObserved` in one batch.

use crate::event::Event;

pub use super::build::chain_spec;
use super::build::{completed, runner_exited, runner_started, step_complete, step_running};
use super::identity::namespaced_identity;

/// The instance id of the runner of a [`chain_lifecycle`].
pub const INSTANCE: &str = "instance";

/// The batches of a complete life of a [`chain_spec`] run of `steps` steps, its runner recorded
/// as `runner_pid` and step `i`'s process as `1000 + i` (made-up identities in a PID namespace,
/// [`namespaced_identity`]).
pub fn chain_lifecycle(steps: u32, runner_pid: u32) -> Vec<Vec<Event>> {
    let mut batches = vec![vec![runner_started(
        namespaced_identity(runner_pid),
        INSTANCE,
    )]];
    for step in 0..steps {
        batches.push(vec![step_running(
            step,
            Some(namespaced_identity(1000 + step)),
        )]);
        batches.push(vec![step_complete(step)]);
    }
    batches.push(vec![completed("done"), runner_exited(INSTANCE, 0)]);
    batches
}
