//! How a process ended, in words: the one wording used for what is journaled (a step's
//! `StepFinished` error, the reconciler's `Terminal` reason, the launcher's give-up error) and
//! for what is shown (`runjournal`, `journal-tools`), so one fact is never recorded in two
//! wordings.
//!
//! Invariant: pure; every description of a [`ProcessExit`] anywhere in the crate or its
//! binaries comes from [`describe_exit`].

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

use crate::event::ProcessExit;

/// The words a step's error holds when members of its process group outlived SIGKILL: the
/// group was not seen empty (pi-subagents' proof of the step then says its process tree is
/// unknown).
pub const SURVIVORS_NOTE: &str = "members of the step's process group were still alive";

/// The exit code shells give a command they could not find.
pub const EXIT_CODE_NOT_FOUND: i32 = 127;

/// An exit of which nothing is known (an observer that saw the process gone, not how).
pub const UNKNOWN_EXIT: ProcessExit = ProcessExit {
    code: None,
    signal: None,
};

impl From<ExitStatus> for ProcessExit {
    fn from(status: ExitStatus) -> ProcessExit {
        ProcessExit {
            code: status.code(),
            signal: status.signal(),
        }
    }
}

/// "exited with code 3", "exited with code 127 (command not found)", "killed by signal 9
/// (SIGKILL)", "exit status unknown". A code wins over a signal: a process that exited
/// has no signal of its own.
pub fn describe_exit(exit: ProcessExit) -> String {
    match (exit.code, exit.signal) {
        (Some(EXIT_CODE_NOT_FOUND), _) => {
            format!("exited with code {EXIT_CODE_NOT_FOUND} (command not found)")
        }
        (Some(code), _) => format!("exited with code {code}"),
        (None, Some(signal)) => {
            let name = nix::sys::signal::Signal::try_from(signal)
                .map_or("unknown signal", nix::sys::signal::Signal::as_str);
            format!("killed by signal {signal} ({name})")
        }
        (None, None) => "exit status unknown".to_string(),
    }
}

/// The name of the signal that killed a process, from an error that starts with what
/// [`describe_exit`] says of it ("killed by signal 9 (SIGKILL)…" gives `SIGKILL`); `None` for
/// any other error. The one reader of that wording.
pub fn killing_signal(error: &str) -> Option<&str> {
    let rest = error.strip_prefix("killed by signal ")?;
    let (number, rest) = rest.split_once(" (")?;
    let (name, _) = rest.split_once(')')?;
    (number.parse::<i32>().is_ok() && name.starts_with("SIG")).then_some(name)
}

/// How an attempt to deliver a completion hook ended: "delivered", "failed (exited with code
/// 3)", "timed out", "could not start: ...", "abandoned: ...".
pub fn describe_hook_outcome(outcome: &crate::event::HookOutcome) -> String {
    use crate::event::HookOutcome;
    match outcome {
        HookOutcome::Delivered => "delivered".to_string(),
        HookOutcome::Failed { exit } => format!("failed ({})", describe_exit(*exit)),
        HookOutcome::TimedOut => "timed out".to_string(),
        HookOutcome::NotStarted { error } => format!("could not start: {error}"),
        HookOutcome::Abandoned { reason } => format!("abandoned: {reason}"),
    }
}

/// [`describe_exit`] of what an observer recorded, [`UNKNOWN_EXIT`] when it recorded nothing.
pub fn describe_observed_exit(exit: Option<ProcessExit>) -> String {
    describe_exit(exit.unwrap_or(UNKNOWN_EXIT))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exit(code: Option<i32>, signal: Option<i32>) -> ProcessExit {
        ProcessExit { code, signal }
    }

    #[test]
    fn a_code_is_described() {
        assert_eq!(describe_exit(exit(Some(3), None)), "exited with code 3");
        assert_eq!(describe_exit(exit(Some(0), None)), "exited with code 0");
    }

    #[test]
    fn a_signal_is_described_with_its_name() {
        assert_eq!(
            describe_exit(exit(None, Some(9))),
            "killed by signal 9 (SIGKILL)"
        );
        assert_eq!(
            describe_exit(exit(None, Some(15))),
            "killed by signal 15 (SIGTERM)"
        );
        assert_eq!(
            describe_exit(exit(None, Some(250))),
            "killed by signal 250 (unknown signal)"
        );
    }

    #[test]
    fn code_127_says_the_command_was_not_found() {
        assert_eq!(
            describe_exit(exit(Some(127), None)),
            "exited with code 127 (command not found)"
        );
    }

    #[test]
    fn neither_code_nor_signal_is_unknown() {
        assert_eq!(describe_exit(UNKNOWN_EXIT), "exit status unknown");
        assert_eq!(describe_observed_exit(None), "exit status unknown");
        assert_eq!(
            describe_observed_exit(Some(exit(Some(1), None))),
            "exited with code 1"
        );
    }

    #[test]
    fn an_exit_status_converts_as_the_kernel_reports_it() {
        // Raw wait statuses: the code in the second byte, or the signal in the low bits.
        assert_eq!(
            ProcessExit::from(ExitStatus::from_raw(3 << 8)),
            exit(Some(3), None)
        );
        assert_eq!(
            ProcessExit::from(ExitStatus::from_raw(9)),
            exit(None, Some(9))
        );
        assert_eq!(
            describe_exit(ExitStatus::from_raw(9).into()),
            "killed by signal 9 (SIGKILL)"
        );
    }

    #[test]
    fn the_killing_signal_is_read_back_from_what_describe_exit_says() {
        let killed = describe_exit(ProcessExit {
            code: None,
            signal: Some(9),
        });
        assert_eq!(killing_signal(&killed), Some("SIGKILL"));
        let with_more = format!("{killed}; ended 2 processes it left outside its process group");
        assert_eq!(killing_signal(&with_more), Some("SIGKILL"));
        let exited = describe_exit(ProcessExit {
            code: Some(137),
            signal: None,
        });
        assert_eq!(killing_signal(&exited), None);
        assert_eq!(
            killing_signal("the step was killed by signal 9 (SIGKILL)"),
            None
        );
    }
}
