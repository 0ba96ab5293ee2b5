//! The runner's outcome rule: from how the steps ended and the control request the runner acted
//! on, to the run's `Terminal` (state, error, summary, exit code), as a table like
//! [`crate::reconcile::TABLE`]: one labelled row per case, each with a sentence of why.
//!
//! Invariants:
//! * pure: no I/O, no clock; the runner hands over what it saw;
//! * every combination of [`Inputs`] matches exactly one row of [`TABLE`].

use crate::event::{self, ControlAction, MAX_TEXT_BYTES, RunSpec, TerminalState};
use crate::state::ControlInfo;

use super::{EXIT_FAILED, EXIT_INTERRUPTED, EXIT_STOPPED, EXIT_TIMED_OUT};

/// The first step that failed, as the runner recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepFailure {
    pub step: usize,
    pub exit_code: Option<i32>,
    pub error: String,
}

/// What the first failed step left to pass on as the run's exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FirstFailure {
    /// No step failed.
    None,
    /// A step failed with an exit code of its own, not 0.
    WithExitCode,
    /// A step failed without one: the runner ended it, it could not be waited for, or its
    /// program exited 0 but the step failed all the same (an external job that failed).
    WithoutExitCode,
}

/// The facts one row of the table is chosen by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Inputs {
    /// The control request the runner acted on (the first one recorded).
    pub halt: Option<ControlAction>,
    /// Every step of the run recorded `complete`.
    pub is_every_step_complete: bool,
    pub first_failure: FirstFailure,
}

impl Inputs {
    /// Every combination of inputs, for tests that check the table covers them.
    pub fn all() -> Vec<Inputs> {
        let halts = [
            None,
            Some(ControlAction::Stop),
            Some(ControlAction::Timeout),
            Some(ControlAction::Interrupt),
        ];
        let failures = [
            FirstFailure::None,
            FirstFailure::WithExitCode,
            FirstFailure::WithoutExitCode,
        ];
        let mut out = Vec::new();
        for halt in halts {
            for is_every_step_complete in [false, true] {
                for first_failure in failures {
                    out.push(Inputs {
                        halt,
                        is_every_step_complete,
                        first_failure,
                    });
                }
            }
        }
        out
    }
}

/// How a row ends the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Ending {
    /// `stopped`, the request's error, [`EXIT_STOPPED`].
    Stopped,
    /// `failed`, the request's error, [`EXIT_TIMED_OUT`].
    TimedOut,
    /// `paused`, the request's error, [`EXIT_INTERRUPTED`].
    Interrupted,
    /// `failed`, naming the first failed step, with its exit code.
    StepFailedWithItsCode,
    /// `failed`, naming the first failed step, [`EXIT_FAILED`].
    StepFailed,
    /// `complete`, no error, 0.
    Complete,
}

/// One row of the outcome table.
#[derive(Debug)]
pub struct Row {
    pub name: &'static str,
    pub why: &'static str,
    pub matches: fn(&Inputs) -> bool,
    pub ending: Ending,
}

/// Whether a request ends the run: one made before every step completed. A request that came
/// after the work was all done changes nothing.
fn is_halted_by(inputs: &Inputs, action: ControlAction) -> bool {
    inputs.halt == Some(action) && !inputs.is_every_step_complete
}

/// No request ends the run: how the steps ended decides.
fn is_decided_by_steps(inputs: &Inputs) -> bool {
    inputs.halt.is_none() || inputs.is_every_step_complete
}

/// The runner's outcome rule, one row per case.
pub const TABLE: &[Row] = &[
    Row {
        name: "stopped",
        why: "a stop was requested before every step completed: the run is stopped, whatever its steps did",
        matches: |i| is_halted_by(i, ControlAction::Stop),
        ending: Ending::Stopped,
    },
    Row {
        name: "timed-out",
        why: "the run's timeout was reached before every step completed: a timeout is a failure, told apart by its exit code",
        matches: |i| is_halted_by(i, ControlAction::Timeout),
        ending: Ending::TimedOut,
    },
    Row {
        name: "interrupted",
        why: "an interrupt was requested before every step completed: the run is paused, to be resumed as a new run",
        matches: |i| is_halted_by(i, ControlAction::Interrupt),
        ending: Ending::Interrupted,
    },
    Row {
        name: "step-failed-with-its-code",
        why: "a step failed with an exit code of its own: the run fails with it, so a caller sees the step's code",
        matches: |i| is_decided_by_steps(i) && i.first_failure == FirstFailure::WithExitCode,
        ending: Ending::StepFailedWithItsCode,
    },
    Row {
        name: "step-failed",
        why: "a step failed without an exit code of its own (or with 0): the run fails with the generic failure code",
        matches: |i| is_decided_by_steps(i) && i.first_failure == FirstFailure::WithoutExitCode,
        ending: Ending::StepFailed,
    },
    Row {
        name: "complete",
        why: "no step failed and no request ended the run early: it is complete",
        matches: |i| is_decided_by_steps(i) && i.first_failure == FirstFailure::None,
        ending: Ending::Complete,
    },
];

/// The row for these inputs.
pub fn decide(inputs: &Inputs) -> &'static Row {
    let mut matching = TABLE.iter().filter(|row| (row.matches)(inputs));
    let row = matching
        .next()
        .expect("the outcome table covers every combination of inputs");
    debug_assert!(
        matching.next().is_none(),
        "exactly one row matches {inputs:?}"
    );
    row
}

/// The run's `Terminal`, without its summary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunEnd {
    pub state: TerminalState,
    /// At most [`MAX_TEXT_BYTES`]; `None` for a complete run.
    pub error: Option<String>,
    pub exit_code: i32,
}

/// The row and the `Terminal` of a run whose steps are over: `halt` is the request the runner
/// acted on, `first_failure` the first step that failed, `steps_complete` how many completed.
pub fn run_end(
    spec: &RunSpec,
    halt: Option<&ControlInfo>,
    first_failure: Option<&StepFailure>,
    steps_complete: usize,
) -> (&'static Row, RunEnd) {
    let inputs = Inputs {
        halt: halt.map(|control| control.action),
        is_every_step_complete: steps_complete == spec.steps.len(),
        first_failure: match first_failure {
            None => FirstFailure::None,
            Some(failure) if failure.exit_code.is_some_and(|code| code != 0) => {
                FirstFailure::WithExitCode
            }
            Some(_) => FirstFailure::WithoutExitCode,
        },
    };
    let row = decide(&inputs);
    let halt_text = || halt.map(halt_error).unwrap_or_default();
    let failure_text = || {
        first_failure
            .map(|failure| {
                let name = spec
                    .steps
                    .get(failure.step)
                    .map_or("?", |step| step.name.as_str());
                format!("step {} ({name}) failed: {}", failure.step, failure.error)
            })
            .unwrap_or_default()
    };
    let (state, error, exit_code) = match row.ending {
        Ending::Stopped => (TerminalState::Stopped, halt_text(), EXIT_STOPPED),
        Ending::TimedOut => (TerminalState::Failed, halt_text(), EXIT_TIMED_OUT),
        Ending::Interrupted => (TerminalState::Paused, halt_text(), EXIT_INTERRUPTED),
        Ending::StepFailedWithItsCode => (
            TerminalState::Failed,
            failure_text(),
            first_failure
                .and_then(|failure| failure.exit_code)
                .unwrap_or(EXIT_FAILED),
        ),
        Ending::StepFailed => (TerminalState::Failed, failure_text(), EXIT_FAILED),
        Ending::Complete => (TerminalState::Complete, String::new(), 0),
    };
    let error = (!error.is_empty()).then(|| event::truncate_text(&error, MAX_TEXT_BYTES));
    (
        row,
        RunEnd {
            state,
            error,
            exit_code,
        },
    )
}

/// The run's summary: the tail of the last finished step's output, or, when there is none, how
/// many steps completed.
pub fn summary(output_tail: String, steps_complete: usize, steps_total: usize) -> String {
    if output_tail.is_empty() {
        format!("{steps_complete} of {steps_total} steps complete")
    } else {
        output_tail
    }
}

/// The error text of a run or step ended by a control request.
pub fn halt_error(control: &ControlInfo) -> String {
    match control.action {
        ControlAction::Timeout => format!("timed out: {}", control.reason),
        ControlAction::Stop => format!("stopped by {}: {}", control.by, control.reason),
        ControlAction::Interrupt => format!("interrupted by {}: {}", control.by, control.reason),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::event::Mode;
    use crate::testkit as kit;

    #[test]
    fn every_combination_of_inputs_matches_exactly_one_row_and_every_row_is_used() {
        let mut used = HashSet::new();
        let all = Inputs::all();
        assert_eq!(all.len(), 4 * 2 * 3);
        for inputs in all {
            let matching: Vec<&str> = TABLE
                .iter()
                .filter(|row| (row.matches)(&inputs))
                .map(|row| row.name)
                .collect();
            assert_eq!(matching.len(), 1, "{inputs:?} matches {matching:?}");
            used.insert(matching[0]);
        }
        for row in TABLE {
            assert!(used.contains(row.name), "row {} is never used", row.name);
            assert!(!row.why.is_empty(), "row {} says why", row.name);
        }
    }

    fn spec(steps: usize) -> RunSpec {
        kit::spec(Mode::Chain, kit::numbered(steps, &kit::argv(&["true"])))
    }

    fn control(action: ControlAction) -> ControlInfo {
        ControlInfo {
            action,
            by: "alice".to_string(),
            reason: "enough".to_string(),
            at_ms: 1,
        }
    }

    fn failure(exit_code: Option<i32>) -> StepFailure {
        StepFailure {
            step: 1,
            exit_code,
            error: "exit code 3".to_string(),
        }
    }

    /// One run of three steps, and how it must end.
    struct Case {
        halt: Option<ControlAction>,
        first_failure: Option<StepFailure>,
        steps_complete: usize,
        row: &'static str,
        state: TerminalState,
        exit_code: i32,
        error: Option<&'static str>,
    }

    #[test]
    fn each_row_ends_the_run_with_its_state_exit_code_and_error() {
        let spec = spec(3);
        let stopped = Some("stopped by alice: enough");
        let step_failed = Some("step 1 (step-1) failed: exit code 3");
        let cases = [
            Case {
                halt: Some(ControlAction::Stop),
                first_failure: None,
                steps_complete: 1,
                row: "stopped",
                state: TerminalState::Stopped,
                exit_code: 143,
                error: stopped,
            },
            // A stop wins over a failed step.
            Case {
                halt: Some(ControlAction::Stop),
                first_failure: Some(failure(Some(3))),
                steps_complete: 0,
                row: "stopped",
                state: TerminalState::Stopped,
                exit_code: 143,
                error: stopped,
            },
            Case {
                halt: Some(ControlAction::Timeout),
                first_failure: None,
                steps_complete: 2,
                row: "timed-out",
                state: TerminalState::Failed,
                exit_code: 124,
                error: Some("timed out: enough"),
            },
            Case {
                halt: Some(ControlAction::Interrupt),
                first_failure: None,
                steps_complete: 0,
                row: "interrupted",
                state: TerminalState::Paused,
                exit_code: 130,
                error: Some("interrupted by alice: enough"),
            },
            Case {
                halt: None,
                first_failure: Some(failure(Some(3))),
                steps_complete: 1,
                row: "step-failed-with-its-code",
                state: TerminalState::Failed,
                exit_code: 3,
                error: step_failed,
            },
            Case {
                halt: None,
                first_failure: Some(failure(Some(0))),
                steps_complete: 1,
                row: "step-failed",
                state: TerminalState::Failed,
                exit_code: 1,
                error: step_failed,
            },
            Case {
                halt: None,
                first_failure: Some(failure(None)),
                steps_complete: 1,
                row: "step-failed",
                state: TerminalState::Failed,
                exit_code: 1,
                error: step_failed,
            },
            Case {
                halt: None,
                first_failure: None,
                steps_complete: 3,
                row: "complete",
                state: TerminalState::Complete,
                exit_code: 0,
                error: None,
            },
            // A stop that came once every step had completed changes nothing.
            Case {
                halt: Some(ControlAction::Stop),
                first_failure: None,
                steps_complete: 3,
                row: "complete",
                state: TerminalState::Complete,
                exit_code: 0,
                error: None,
            },
        ];
        for case in cases {
            let halt = case.halt.map(control);
            let (row, end) = run_end(
                &spec,
                halt.as_ref(),
                case.first_failure.as_ref(),
                case.steps_complete,
            );
            let label = format!("{halt:?} {:?} {}", case.first_failure, case.steps_complete);
            assert_eq!(row.name, case.row, "{label}");
            assert_eq!(end.state, case.state, "{label}");
            assert_eq!(end.exit_code, case.exit_code, "{label}");
            assert_eq!(end.error.as_deref(), case.error, "{label}");
        }
    }

    #[test]
    fn a_long_error_is_cut_to_the_text_limit() {
        let spec = spec(1);
        let long = StepFailure {
            step: 0,
            exit_code: Some(2),
            error: "x".repeat(MAX_TEXT_BYTES * 2),
        };
        let (_, end) = run_end(&spec, None, Some(&long), 0);
        let error = end.error.expect("a failed run has an error");
        assert!(error.len() <= MAX_TEXT_BYTES, "{}", error.len());
        assert!(error.starts_with("step 0 (step-0) failed: x"), "{error}");
    }

    #[test]
    fn the_summary_is_the_output_tail_else_the_count_of_complete_steps() {
        assert_eq!(summary("last line".to_string(), 1, 2), "last line");
        assert_eq!(summary(String::new(), 1, 2), "1 of 2 steps complete");
    }
}
