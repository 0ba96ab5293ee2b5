//! Showing a run's step output as it grows: `logs [--follow]` and `run --wait`.

use std::io::Write;

use runjournal::logs::CopyError;
use runjournal::{Home, RunId, RunState};

use crate::{Failure, stdout_failure};

/// Where each shown step's output was read up to, and which step's output was shown last. With
/// several steps, each chunk of output is headed by the step it comes from, as `tail` heads
/// files.
pub struct StepOutput {
    run: RunId,
    /// The steps, each with its name, the offset of its log read up to, and whether its
    /// output is shown yet.
    steps: Vec<(usize, String, u64, bool)>,
    show_headers: bool,
    /// The step whose header was printed last.
    headed: Option<usize>,
    /// Whether output was shown since the last [`StepOutput::end_chunk`], and whether its last
    /// byte ended a line.
    open_chunk: Option<bool>,
}

impl StepOutput {
    /// Shows the output of `steps` (indexes into the run's spec) of `state`'s run.
    pub fn new(state: &RunState, steps: Vec<usize>) -> StepOutput {
        StepOutput::of(state, steps, true)
    }

    /// Every step of `state`'s run, each shown once [announced](StepOutput::announce): a look
    /// may find a step's output before the records it read include the step's `StepRunning`,
    /// and its output goes after that transition.
    pub fn every_step_once_announced(state: &RunState) -> StepOutput {
        StepOutput::of(state, (0..state.spec.steps.len()).collect(), false)
    }

    fn of(state: &RunState, steps: Vec<usize>, is_shown: bool) -> StepOutput {
        let steps: Vec<(usize, String, u64, bool)> = steps
            .into_iter()
            .filter_map(|index| {
                let name = state.spec.steps.get(index)?.name.clone();
                Some((index, name, 0, is_shown))
            })
            .collect();
        StepOutput {
            run: state.run_id,
            show_headers: steps.len() > 1,
            steps,
            headed: None,
            open_chunk: None,
        }
    }

    /// Shows the output of step `index` from now on.
    pub fn announce(&mut self, index: usize) {
        for (step, _, _, is_shown) in &mut self.steps {
            if *step == index {
                *is_shown = true;
            }
        }
    }

    /// Writes to `out` what the steps' logs gained since the last call (streamed: a log is
    /// never held in memory whole, whatever its size), then flushes it.
    pub fn show_new(&mut self, home: &Home, out: &mut dyn Write) -> Result<(), Failure> {
        for (index, name, offset, is_shown) in &mut self.steps {
            if !*is_shown {
                continue;
            }
            let path = home.output_log_path(self.run, *index);
            let reading = |error| {
                Failure::Error(
                    anyhow::Error::new(error).context(format!("reading {}", path.display())),
                )
            };
            let Some(new_bytes) = runjournal::logs::new_bytes(&path, *offset).map_err(reading)?
            else {
                continue;
            };
            if self.show_headers && self.headed != Some(*index) {
                if self.headed.is_some() {
                    writeln!(out).map_err(stdout_failure)?;
                }
                writeln!(
                    out,
                    "==> step {index} ({}) <==",
                    runjournal::show::escape_control(name)
                )
                .map_err(stdout_failure)?;
                self.headed = Some(*index);
            }
            let mut tracked = LastByte {
                out: &mut *out,
                last: None,
            };
            *offset += new_bytes
                .copy_to(&mut tracked)
                .map_err(|error| match error {
                    CopyError::Write(error) => stdout_failure(error),
                    CopyError::Read(error) => reading(error),
                    other => Failure::Error(other.into()),
                })?;
            if let Some(last) = tracked.last {
                self.open_chunk = Some(last == b'\n');
            }
        }
        out.flush().map_err(stdout_failure)
    }

    /// Ends the output shown since the last call, so that a line of another kind (a
    /// transition) printed next starts a line of its own, and the next output is headed again.
    pub fn end_chunk(&mut self, out: &mut dyn Write) -> Result<(), Failure> {
        if self.open_chunk.take() == Some(false) {
            writeln!(out).map_err(stdout_failure)?;
            out.flush().map_err(stdout_failure)?;
        }
        self.headed = None;
        Ok(())
    }
}

/// A writer that remembers the last byte written through it.
struct LastByte<'a> {
    out: &'a mut dyn Write,
    last: Option<u8>,
}

impl Write for LastByte<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let written = self.out.write(buf)?;
        if let Some(&last) = buf[..written].last() {
            self.last = Some(last);
        }
        Ok(written)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}
