//! The state directory and where everything lives in it (DESIGN.md section 4, "Layout").
//!
//! Invariant: every path under the home that names a run is built from a [`RunId`], whose
//! printed form is checked to be 26 characters of the Crockford alphabet, so no run path can
//! leave the home.

use std::path::{Path, PathBuf};

pub mod segment;

use crate::event::{RunId, UnixMs};

/// Environment variable naming the home.
pub const HOME_ENV: &str = "RUNJOURNAL_HOME";

/// The state directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Home {
    root: PathBuf,
}

/// No home could be found.
#[derive(Debug, thiserror::Error)]
#[error("no home directory: set {HOME_ENV}, XDG_STATE_HOME or HOME, or pass --home")]
pub struct NoHome;

impl Home {
    /// The home at `root`.
    pub fn at(root: impl Into<PathBuf>) -> Home {
        Home { root: root.into() }
    }

    /// `explicit`, else `$RUNJOURNAL_HOME`, else `$XDG_STATE_HOME/runjournal`, else
    /// `~/.local/state/runjournal`.
    pub fn resolve(explicit: Option<&Path>) -> Result<Home, NoHome> {
        if let Some(root) = explicit {
            return Ok(Home::at(root));
        }
        let non_empty = |name: &str| std::env::var_os(name).filter(|value| !value.is_empty());
        if let Some(root) = non_empty(HOME_ENV) {
            return Ok(Home::at(root));
        }
        if let Some(state) = non_empty("XDG_STATE_HOME") {
            return Ok(Home::at(PathBuf::from(state).join("runjournal")));
        }
        match non_empty("HOME") {
            Some(home) => Ok(Home::at(
                PathBuf::from(home).join(".local/state/runjournal"),
            )),
            None => Err(NoHome),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn journal_path(&self) -> PathBuf {
        self.root.join("journal.redb")
    }

    pub fn reserve_path(&self) -> PathBuf {
        self.root.join("reserve")
    }

    /// The root of the per-run directories (pi-subagents' async dir root).
    pub fn runs_dir(&self) -> PathBuf {
        self.root.join("runs")
    }

    pub fn run_dir(&self, run: RunId) -> PathBuf {
        self.runs_dir().join(run.to_string())
    }

    pub fn status_path(&self, run: RunId) -> PathBuf {
        self.run_dir(run).join("status.json")
    }

    pub fn events_path(&self, run: RunId) -> PathBuf {
        self.run_dir(run).join("events.jsonl")
    }

    /// Where the reconciler notes how far into the log it has checked projections (see
    /// `reconcile::ProjectionCursor`).
    pub fn reconcile_cursor_path(&self) -> PathBuf {
        self.runs_dir().join(".reconciled-through")
    }

    pub fn lock_path(&self, run: RunId) -> PathBuf {
        self.run_dir(run).join(".lock")
    }

    /// Made once the run's result file was written (see `projection::ResultPolicy`).
    pub fn result_published_marker_path(&self, run: RunId) -> PathBuf {
        self.run_dir(run).join(".result-published")
    }

    pub fn runner_log_path(&self, run: RunId) -> PathBuf {
        self.run_dir(run).join("runner.log")
    }

    pub fn output_log_path(&self, run: RunId, step: usize) -> PathBuf {
        self.run_dir(run).join(format!("output-{step}.log"))
    }

    pub fn results_dir(&self) -> PathBuf {
        self.root.join("results")
    }

    pub fn result_path(&self, run: RunId) -> PathBuf {
        self.results_dir().join(format!("{run}.json"))
    }

    /// `results/result-index/sessions/<seg(session)>/<run>.json`.
    pub fn result_session_index_path(&self, session_id: &str, run: RunId) -> PathBuf {
        self.results_dir()
            .join("result-index/sessions")
            .join(segment::encode(session_id, segment::MAX_SEGMENT_BYTES))
            .join(format!("{run}.json"))
    }

    /// `runs/.active-runs`: one empty marker per queued or running run.
    pub fn active_index_dir(&self) -> PathBuf {
        self.runs_dir().join(".active-runs")
    }

    pub fn active_marker_path(&self, run: RunId) -> PathBuf {
        self.active_index_dir().join(run.to_string())
    }

    /// `runs/.active-runs/tool-calls/<seg(tool call)>`.
    pub fn tool_call_marker_dir(&self, tool_call_id: &str) -> PathBuf {
        self.active_index_dir()
            .join("tool-calls")
            .join(segment::encode(tool_call_id, segment::MAX_SEGMENT_BYTES))
    }

    pub fn tool_call_marker_path(&self, tool_call_id: &str, run: RunId) -> PathBuf {
        self.tool_call_marker_dir(tool_call_id)
            .join(run.to_string())
    }

    /// `runs/.terminal-runs/<seg(session)>/<16-digit ended at>-<run>.json`.
    pub fn terminal_marker_path(
        &self,
        session_id: &str,
        ended_at_ms: UnixMs,
        run: RunId,
    ) -> PathBuf {
        self.runs_dir()
            .join(".terminal-runs")
            .join(segment::encode(session_id, segment::MAX_SEGMENT_BYTES))
            .join(format!("{ended_at_ms:016}-{run}.json"))
    }
}
