//! The state directory and where everything lives in it (docs/design.md, "Layout").
//!
//! A home has a [`Layout`]: runjournal's own (`journal.redb`, `runs/`, `results/` at its root),
//! or a pi-subagents temp root (`async-subagent-runs/`, `async-subagent-results/`, and
//! runjournal's own files under `runjournal/`), so that a pi-subagents host reads our runs
//! where it looks for its own. This module is the one place paths are built: nothing else
//! knows which layout a home has.
//!
//! A home remembers its layout by where its journal is: `journal.redb` at the root, or
//! `runjournal/journal.redb`. Opening a home under the other layout than the one its journal
//! was made in is refused ([`Home::check_layout`]), so one directory never gets two journals
//! by mistake.
//!
//! Invariant: every path under the home that names a run is built from a [`RunId`], whose
//! printed form is checked to be 26 characters of the Crockford alphabet, so no run path can
//! leave the home.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::{Component, Path, PathBuf};

pub mod segment;

use crate::event::{RunId, UnixMs};

/// Environment variable naming the home.
pub const HOME_ENV: &str = "RUNJOURNAL_HOME";

/// Environment variable naming the layout (`runjournal` or `pi-subagents`).
pub const LAYOUT_ENV: &str = "RUNJOURNAL_LAYOUT";

/// pi-subagents' own variable for its temp root: the default home of the pi-subagents layout.
pub const PI_SUBAGENTS_TEMP_ROOT_ENV: &str = "PI_SUBAGENTS_TEMP_ROOT";

/// How a home lays out its files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Layout {
    /// runjournal's own: `journal.redb`, `runs/<id>/`, `results/<id>.json` at the root.
    #[default]
    Runjournal,
    /// A pi-subagents (0.67) temp root: runs in `async-subagent-runs/<id>/`, results and
    /// result indexes in `async-subagent-results/`, active and terminal markers in
    /// `async-subagent-runs/.active-runs` and `.terminal-runs`, and everything of runjournal's
    /// own (journal, reserve, blocked-writer markers, the reconciler's cursor) in
    /// `runjournal/`.
    PiSubagents,
}

impl Layout {
    /// Its name, as `--layout` and [`LAYOUT_ENV`] take it.
    pub fn as_str(self) -> &'static str {
        match self {
            Layout::Runjournal => "runjournal",
            Layout::PiSubagents => "pi-subagents",
        }
    }

    /// The layout named by [`LAYOUT_ENV`], or the default when it is unset or empty.
    pub fn from_env() -> Result<Layout, UnknownLayout> {
        match std::env::var_os(LAYOUT_ENV).filter(|value| !value.is_empty()) {
            None => Ok(Layout::default()),
            Some(value) => value.to_string_lossy().parse(),
        }
    }

    /// Whether an entry of a home's root named `name` is one this layout makes (or, in the
    /// pi-subagents layout, one pi-subagents makes in its temp root).
    fn makes(self, name: &str) -> bool {
        match self {
            Layout::Runjournal => {
                matches!(name, "runs" | "results" | "blocked")
                    || [
                        "journal.redb",
                        "reserve",
                        "shipping.json",
                        ".shipping.json.",
                        "timer.lock",
                    ]
                    .iter()
                    .any(|prefix| name.starts_with(prefix))
            }
            Layout::PiSubagents => {
                matches!(
                    name,
                    "runjournal"
                        | "async-subagent-runs"
                        | "async-subagent-results"
                        | "chain-runs"
                        | "artifacts"
                        | "nested-subagent-runs"
                ) || name.starts_with("async-cfg-")
            }
        }
    }

    /// Where a journal of this layout is, under `root`.
    fn journal_path(self, root: &Path) -> PathBuf {
        match self {
            Layout::Runjournal => root.join("journal.redb"),
            Layout::PiSubagents => root.join("runjournal/journal.redb"),
        }
    }
}

impl std::fmt::Display for Layout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A layout name that is neither `runjournal` nor `pi-subagents`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown layout {0:?}: use runjournal or pi-subagents")]
pub struct UnknownLayout(pub String);

impl std::str::FromStr for Layout {
    type Err = UnknownLayout;

    fn from_str(text: &str) -> Result<Layout, UnknownLayout> {
        match text {
            "runjournal" => Ok(Layout::Runjournal),
            "pi-subagents" => Ok(Layout::PiSubagents),
            other => Err(UnknownLayout(other.to_string())),
        }
    }
}

/// The state directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Home {
    root: PathBuf,
    layout: Layout,
}

/// No home could be found, or the one given is no path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NoHome {
    #[error("no home directory: set {HOME_ENV}, XDG_STATE_HOME or HOME, or pass --home")]
    NotFound,
    /// `--home ''`: an empty path would mean the current directory, which nobody means.
    #[error("the home given is empty: pass --home DIR (an empty {HOME_ENV} counts as unset)")]
    Empty,
}

/// A home whose journal was made under another layout than the one it is opened with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{root} holds a journal of the {found} layout ({journal}), not of the {asked} layout: pass --layout {found} (or set {LAYOUT_ENV}={found})"
)]
pub struct LayoutMismatch {
    pub root: PathBuf,
    pub journal: PathBuf,
    pub found: Layout,
    pub asked: Layout,
}

/// A directory where no new home is made: the file system's root, or one that holds files of
/// something else and no journal. An existing home (its journal is there) is always opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NotAHomePlace {
    #[error(
        "{} is the root of the file system, which is never made a home: pass --home with a directory of its own",
        root.display()
    )]
    FileSystemRoot { root: PathBuf },
    #[error(
        "{} holds no journal but other files ({}): a home is made only in a missing or empty directory; pass --home with a new directory, or the home you meant",
        root.display(),
        listed_names(found, *more)
    )]
    Occupied {
        root: PathBuf,
        /// The first few names found, sorted.
        found: Vec<String>,
        /// How many more there are.
        more: usize,
    },
}

/// Names shown when a directory is refused as a new home.
const SHOWN_NAMES: usize = 3;

/// `a, b, c and 4 more`.
fn listed_names(found: &[String], more: usize) -> String {
    let mut text = found.join(", ");
    if more > 0 {
        text.push_str(&format!(" and {more} more"));
    }
    text
}

/// The lock file that the commit leader of the journal at `journal` holds while it takes
/// other processes' batches: the journal's file name with `.commit.lock` added, beside it.
/// Named after the journal file so that two journals in one directory never share a leader.
pub fn commit_lock_path(journal: &Path) -> PathBuf {
    with_suffix(journal, ".commit.lock")
}

/// The Unix socket where the commit leader of the journal at `journal` listens: the journal's
/// file name with `.commit.sock` added, beside it.
pub fn commit_socket_path(journal: &Path) -> PathBuf {
    with_suffix(journal, ".commit.sock")
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(suffix);
    path.with_file_name(name)
}

/// pi-subagents' default temp root (0.67, `shared/types.ts`): `<tmpdir>/pi-subagents-uid-<uid>`,
/// where tmpdir is Node's `os.tmpdir()` on POSIX: `$TMPDIR`, else `$TMP`, else `$TEMP`, else
/// `/tmp`, without a trailing slash. `var` reads the environment. Pure.
pub fn pi_subagents_default_root(var: impl Fn(&str) -> Option<OsString>, uid: u32) -> PathBuf {
    let tmpdir = ["TMPDIR", "TMP", "TEMP"]
        .into_iter()
        .find_map(|name| var(name).filter(|value| !value.is_empty()))
        .unwrap_or_else(|| OsString::from("/tmp"));
    let mut tmpdir = tmpdir.into_vec();
    if tmpdir.len() > 1 && tmpdir.ends_with(b"/") {
        tmpdir.pop();
    }
    PathBuf::from(OsString::from_vec(tmpdir)).join(format!("pi-subagents-uid-{uid}"))
}

/// `PI_SUBAGENTS_TEMP_ROOT` as pi-subagents reads it: trimmed, ignored when empty, and made
/// absolute against `cwd` with `.` and `..` resolved lexically (Node's `path.resolve`). Pure.
pub fn pi_subagents_configured_root(value: &str, cwd: &Path) -> Option<PathBuf> {
    let value = value.trim();
    if value.is_empty() {
        return None;
    }
    let mut resolved = PathBuf::new();
    for component in cwd.join(value).components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                resolved.pop();
            }
            other => resolved.push(other),
        }
    }
    Some(resolved)
}

impl Home {
    /// The home at `root`, in runjournal's own layout.
    pub fn at(root: impl Into<PathBuf>) -> Home {
        Home::in_layout(root, Layout::Runjournal)
    }

    /// The home at `root`, in `layout`.
    pub fn in_layout(root: impl Into<PathBuf>, layout: Layout) -> Home {
        Home {
            root: root.into(),
            layout,
        }
    }

    /// The home of `layout`: `explicit`, else `$RUNJOURNAL_HOME`; then, in runjournal's own
    /// layout, `$XDG_STATE_HOME/runjournal`, else `~/.local/state/runjournal`; in the
    /// pi-subagents layout, `$PI_SUBAGENTS_TEMP_ROOT`, else pi-subagents' own default root
    /// ([`pi_subagents_default_root`]).
    ///
    /// An empty `explicit` is refused ([`NoHome::Empty`]); an empty variable counts as unset,
    /// as XDG's do.
    pub fn resolve(explicit: Option<&Path>, layout: Layout) -> Result<Home, NoHome> {
        if let Some(root) = explicit {
            if root.as_os_str().is_empty() {
                return Err(NoHome::Empty);
            }
            return Ok(Home::in_layout(root, layout));
        }
        let non_empty = |name: &str| std::env::var_os(name).filter(|value| !value.is_empty());
        if let Some(root) = non_empty(HOME_ENV) {
            return Ok(Home::in_layout(root, layout));
        }
        if layout == Layout::PiSubagents {
            let configured = std::env::var(PI_SUBAGENTS_TEMP_ROOT_ENV)
                .ok()
                .and_then(|value| {
                    let cwd = std::env::current_dir().ok()?;
                    pi_subagents_configured_root(&value, &cwd)
                });
            let root = configured.unwrap_or_else(|| {
                pi_subagents_default_root(
                    |name| std::env::var_os(name),
                    nix::unistd::getuid().as_raw(),
                )
            });
            return Ok(Home::in_layout(root, layout));
        }
        if let Some(state) = non_empty("XDG_STATE_HOME") {
            return Ok(Home::at(PathBuf::from(state).join("runjournal")));
        }
        match non_empty("HOME") {
            Some(home) => Ok(Home::at(
                PathBuf::from(home).join(".local/state/runjournal"),
            )),
            None => Err(NoHome::NotFound),
        }
    }

    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// Refuses a home whose journal was made under the other layout: its journal is where
    /// the other layout keeps it, and not where this one does.
    pub fn check_layout(&self) -> Result<(), LayoutMismatch> {
        let other = match self.layout {
            Layout::Runjournal => Layout::PiSubagents,
            Layout::PiSubagents => Layout::Runjournal,
        };
        let theirs = other.journal_path(&self.root);
        if theirs.exists() && !self.journal_path().exists() {
            return Err(LayoutMismatch {
                root: self.root.clone(),
                journal: theirs,
                found: other,
                asked: self.layout,
            });
        }
        Ok(())
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Refuses to make a new home where something else lives: at the root of the file
    /// system, or in a directory that holds no journal (of this layout) but entries this
    /// layout does not make. A missing or empty directory, or one that holds only what this
    /// layout makes (in the pi-subagents layout, also what pi-subagents itself keeps in its
    /// temp root), may become a home; a directory with a journal, or with runs, is a home
    /// already and passes, whatever else it holds.
    pub fn check_place(&self) -> Result<(), NotAHomePlace> {
        if std::fs::canonicalize(&self.root).is_ok_and(|real| real == Path::new("/")) {
            return Err(NotAHomePlace::FileSystemRoot {
                root: self.root.clone(),
            });
        }
        // A journal, or runs and results without one (a home whose journal was lost, which
        // the journal's own checks refuse as such), is a home already.
        let has_runs = || {
            self.run_dirs_on_disk().is_ok_and(|runs| !runs.is_empty())
                || self
                    .result_files_on_disk()
                    .is_ok_and(|results| !results.is_empty())
        };
        if std::fs::symlink_metadata(self.journal_path()).is_ok() || has_runs() {
            return Ok(());
        }
        // A directory that cannot be listed is judged by the checks that open it.
        let Ok(entries) = std::fs::read_dir(&self.root) else {
            return Ok(());
        };
        let mut foreign: Vec<String> = entries
            .flatten()
            .map(|entry| entry.file_name().to_string_lossy().into_owned())
            .filter(|name| !self.layout.makes(name))
            .collect();
        if foreign.is_empty() {
            return Ok(());
        }
        foreign.sort();
        let more = foreign.len().saturating_sub(SHOWN_NAMES);
        foreign.truncate(SHOWN_NAMES);
        Err(NotAHomePlace::Occupied {
            root: self.root.clone(),
            found: foreign,
            more,
        })
    }

    /// The directories that must be private to this user (owned by it, writable by nobody
    /// else): the root, runjournal's own directory, and the directories of runs and of
    /// results, in this layout. Everything else under the home lives in one of them.
    pub fn private_dirs(&self) -> Vec<PathBuf> {
        let mut dirs = vec![
            self.root.clone(),
            self.state_dir(),
            self.runs_dir(),
            self.results_dir(),
        ];
        dirs.dedup();
        dirs
    }

    /// Where runjournal keeps its own files (journal, reserve, blocked-writer markers): the
    /// root, or `runjournal/` in the pi-subagents layout.
    pub fn state_dir(&self) -> PathBuf {
        match self.layout {
            Layout::Runjournal => self.root.clone(),
            Layout::PiSubagents => self.root.join("runjournal"),
        }
    }

    pub fn journal_path(&self) -> PathBuf {
        self.layout.journal_path(&self.root)
    }

    pub fn reserve_path(&self) -> PathBuf {
        self.state_dir().join("reserve")
    }

    /// `journal.redb.commit.lock`: held by the journal's commit leader (see
    /// [`commit_lock_path`]).
    pub fn commit_lock_path(&self) -> PathBuf {
        commit_lock_path(&self.journal_path())
    }

    /// `journal.redb.commit.sock`: where the journal's commit leader listens (see
    /// [`commit_socket_path`]).
    pub fn commit_socket_path(&self) -> PathBuf {
        commit_socket_path(&self.journal_path())
    }

    /// `shipping.json`: what `runjournal ship` last said (see `ship::state`), beside the
    /// journal it reports on.
    pub fn shipping_state_path(&self) -> PathBuf {
        self.state_dir().join("shipping.json")
    }

    /// `timer.lock`: held by the home's timer, the one process that sleeps until delayed runs
    /// are due (see `launch::delay`).
    pub fn timer_lock_path(&self) -> PathBuf {
        self.state_dir().join("timer.lock")
    }

    /// `scrub.lock`: held by the home's scrub while it runs, so that one runs at a time (see
    /// `scrub`).
    pub fn scrub_lock_path(&self) -> PathBuf {
        self.state_dir().join("scrub.lock")
    }

    /// `blocked/`: one empty marker per writer blocked on a full disk (see `capacity`).
    pub fn blocked_dir(&self) -> PathBuf {
        self.state_dir().join("blocked")
    }

    /// The root of the per-run directories (pi-subagents' async dir root).
    pub fn runs_dir(&self) -> PathBuf {
        match self.layout {
            Layout::Runjournal => self.root.join("runs"),
            Layout::PiSubagents => self.root.join("async-subagent-runs"),
        }
    }

    /// The runs that have a directory under [`Home::runs_dir`]: entries named by a run id, in
    /// no particular order (others, such as a pi-subagents host's own runs, are not ours).
    /// Empty when the directory does not exist.
    pub fn run_dirs_on_disk(&self) -> std::io::Result<Vec<RunId>> {
        ids_named_in(&self.runs_dir(), |name| name.parse().ok())
    }

    /// The runs that have a result file (`<run id>.json`) under [`Home::results_dir`], in no
    /// particular order. Empty when the directory does not exist.
    pub fn result_files_on_disk(&self) -> std::io::Result<Vec<RunId>> {
        ids_named_in(&self.results_dir(), |name| {
            name.strip_suffix(".json")?.parse().ok()
        })
    }

    pub fn run_dir(&self, run: RunId) -> PathBuf {
        self.runs_dir().join(run.to_string())
    }

    pub fn status_path(&self, run: RunId) -> PathBuf {
        self.run_dir(run).join("status.json")
    }

    /// The run's records, one JSON line each (what `recover` rebuilds a lost journal from):
    /// `events.jsonl`, but in the pi-subagents layout, whose `events.jsonl` holds pi-subagents'
    /// own event vocabulary ([`Home::pi_events_path`]), `runjournal-events.jsonl`.
    pub fn events_path(&self, run: RunId) -> PathBuf {
        match self.layout {
            Layout::Runjournal => self.run_dir(run).join("events.jsonl"),
            Layout::PiSubagents => self.run_dir(run).join("runjournal-events.jsonl"),
        }
    }

    /// The run's events in pi-subagents' vocabulary (`subagent.run.started`, ...), what its
    /// hosts tail: `events.jsonl` in the pi-subagents layout; none in runjournal's own.
    pub fn pi_events_path(&self, run: RunId) -> Option<PathBuf> {
        match self.layout {
            Layout::Runjournal => None,
            Layout::PiSubagents => Some(self.run_dir(run).join("events.jsonl")),
        }
    }

    /// pi-subagents' markdown log of an ended run (`subagent-log-<id>.md` in the run's
    /// directory): the pi-subagents layout only.
    pub fn pi_run_log_path(&self, run: RunId) -> Option<PathBuf> {
        match self.layout {
            Layout::Runjournal => None,
            Layout::PiSubagents => Some(self.run_dir(run).join(format!("subagent-log-{run}.md"))),
        }
    }

    /// pi-subagents' proof sidecar: how the run's runner process ended, and each step's.
    pub fn process_terminal_path(&self, run: RunId) -> PathBuf {
        self.run_dir(run).join("process-terminal.json")
    }

    /// The run's control inbox, where a host drops its requests (pi-subagents' layout of it,
    /// in both of ours).
    pub fn control_dir(&self, run: RunId) -> PathBuf {
        self.run_dir(run).join("control")
    }

    /// `control/stop-requests/`: one file per stop request.
    pub fn stop_requests_dir(&self, run: RunId) -> PathBuf {
        self.control_dir(run).join("stop-requests")
    }

    /// `control/steer-requests/`: one file per steer request.
    pub fn steer_requests_dir(&self, run: RunId) -> PathBuf {
        self.control_dir(run).join("steer-requests")
    }

    /// `control/refused/`: where refused control files are moved aside.
    pub fn control_refused_dir(&self, run: RunId) -> PathBuf {
        self.control_dir(run).join("refused")
    }

    /// `control/steer-inbox-closed.json`: there once the run takes no more steering.
    pub fn steer_inbox_closed_path(&self, run: RunId) -> PathBuf {
        self.control_dir(run).join("steer-inbox-closed.json")
    }

    /// Step `step`'s inbox: the directory its processes find in `RUNJOURNAL_INBOX`, one file
    /// per message for it.
    pub fn step_inbox_dir(&self, run: RunId, step: usize) -> PathBuf {
        self.run_dir(run).join(format!("inbox-{step}"))
    }

    /// Beside step `step`'s inbox, the runner's note of each message it wrote there: an empty
    /// file of the message's name, made once the message is in the inbox. A message noted
    /// there and gone from the inbox was taken by the step, whether or not its runner lived to
    /// see it go.
    pub fn step_inbox_written_dir(&self, run: RunId, step: usize) -> PathBuf {
        self.run_dir(run).join(format!("inbox-{step}.written"))
    }

    /// Where the reconciler notes how far into the log it has checked projections (see
    /// `reconcile::ProjectionCursor`).
    pub fn reconcile_cursor_path(&self) -> PathBuf {
        match self.layout {
            Layout::Runjournal => self.runs_dir().join(".reconciled-through"),
            // Not among the run directories: pi-subagents' repair scan takes every entry
            // there for a run.
            Layout::PiSubagents => self.state_dir().join("reconciled-through"),
        }
    }

    pub fn lock_path(&self, run: RunId) -> PathBuf {
        self.run_dir(run).join(".lock")
    }

    /// Made once the run's result file and its result-index entry were written (see
    /// `projection::ResultPolicy`).
    pub fn result_published_marker_path(&self, run: RunId) -> PathBuf {
        self.run_dir(run).join(".result-published")
    }

    /// The runner's stdout and stderr. In the pi-subagents layout it has the name of
    /// pi-subagents' runner stderr, whose tail its stale-run reconciler quotes.
    pub fn runner_log_path(&self, run: RunId) -> PathBuf {
        match self.layout {
            Layout::Runjournal => self.run_dir(run).join("runner.log"),
            Layout::PiSubagents => self.run_dir(run).join("runner.stderr.log"),
        }
    }

    /// Where a run's completion hooks write their output (best effort, as step logs).
    pub fn hook_log_path(&self, run: RunId) -> PathBuf {
        self.run_dir(run).join("hooks.log")
    }

    pub fn output_log_path(&self, run: RunId, step: usize) -> PathBuf {
        self.run_dir(run).join(format!("output-{step}.log"))
    }

    pub fn results_dir(&self) -> PathBuf {
        match self.layout {
            Layout::Runjournal => self.root.join("results"),
            Layout::PiSubagents => self.root.join("async-subagent-results"),
        }
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

    /// `results/result-index/runs/<run>.json`: the run's result index entry by run.
    pub fn result_run_index_path(&self, run: RunId) -> PathBuf {
        self.results_dir()
            .join("result-index/runs")
            .join(format!("{run}.json"))
    }

    /// `results/result-index/tool-calls/<seg(tool call)>/<run>.json`.
    pub fn result_tool_call_index_path(&self, tool_call_id: &str, run: RunId) -> PathBuf {
        self.results_dir()
            .join("result-index/tool-calls")
            .join(segment::encode(tool_call_id, segment::MAX_SEGMENT_BYTES))
            .join(format!("{run}.json"))
    }

    /// `results/result-pending/<seg(session)>/<run>.json`: where a result is written whole
    /// before it is renamed into `results/`.
    pub fn result_pending_path(&self, session_id: &str, run: RunId) -> PathBuf {
        self.results_dir()
            .join("result-pending")
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

/// The ids `parse` reads from the names of the entries of `dir`; none when it does not exist.
fn ids_named_in(dir: &Path, parse: impl Fn(&str) -> Option<RunId>) -> std::io::Result<Vec<RunId>> {
    let Some(names) = crate::durable_fs::dir_names(dir)? else {
        return Ok(Vec::new());
    };
    Ok(names
        .iter()
        .filter_map(|name| name.to_str().and_then(&parse))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run() -> RunId {
        "01ARZ3NDEKTSV4RRFFQ69G5FAV".parse().expect("a run id")
    }

    #[test]
    fn the_pi_subagents_layout_puts_runs_and_results_where_pi_subagents_looks() {
        let home = Home::in_layout("/t/root", Layout::PiSubagents);
        let run = run();
        let expected = [
            (home.journal_path(), "/t/root/runjournal/journal.redb"),
            (home.reserve_path(), "/t/root/runjournal/reserve"),
            (home.blocked_dir(), "/t/root/runjournal/blocked"),
            (
                home.shipping_state_path(),
                "/t/root/runjournal/shipping.json",
            ),
            (
                home.reconcile_cursor_path(),
                "/t/root/runjournal/reconciled-through",
            ),
            (
                home.status_path(run),
                "/t/root/async-subagent-runs/01ARZ3NDEKTSV4RRFFQ69G5FAV/status.json",
            ),
            (
                home.runner_log_path(run),
                "/t/root/async-subagent-runs/01ARZ3NDEKTSV4RRFFQ69G5FAV/runner.stderr.log",
            ),
            (
                home.events_path(run),
                "/t/root/async-subagent-runs/01ARZ3NDEKTSV4RRFFQ69G5FAV/runjournal-events.jsonl",
            ),
            (
                home.pi_events_path(run)
                    .expect("the pi-subagents layout has one"),
                "/t/root/async-subagent-runs/01ARZ3NDEKTSV4RRFFQ69G5FAV/events.jsonl",
            ),
            (
                home.steer_requests_dir(run),
                "/t/root/async-subagent-runs/01ARZ3NDEKTSV4RRFFQ69G5FAV/control/steer-requests",
            ),
            (
                home.result_path(run),
                "/t/root/async-subagent-results/01ARZ3NDEKTSV4RRFFQ69G5FAV.json",
            ),
            (
                home.result_session_index_path("s1", run),
                "/t/root/async-subagent-results/result-index/sessions/s1/01ARZ3NDEKTSV4RRFFQ69G5FAV.json",
            ),
            (
                home.active_marker_path(run),
                "/t/root/async-subagent-runs/.active-runs/01ARZ3NDEKTSV4RRFFQ69G5FAV",
            ),
            (
                home.tool_call_marker_path("call-1", run),
                "/t/root/async-subagent-runs/.active-runs/tool-calls/call-1/01ARZ3NDEKTSV4RRFFQ69G5FAV",
            ),
            (
                home.terminal_marker_path("s1", 42, run),
                "/t/root/async-subagent-runs/.terminal-runs/s1/0000000000000042-01ARZ3NDEKTSV4RRFFQ69G5FAV.json",
            ),
        ];
        for (path, want) in expected {
            assert_eq!(path, PathBuf::from(want));
        }
    }

    #[test]
    fn runjournals_own_layout_is_unchanged() {
        let home = Home::at("/h");
        let run = run();
        assert_eq!(home.layout(), Layout::Runjournal);
        let expected = [
            (home.journal_path(), "/h/journal.redb"),
            (home.reserve_path(), "/h/reserve"),
            (home.blocked_dir(), "/h/blocked"),
            (home.reconcile_cursor_path(), "/h/runs/.reconciled-through"),
            (
                home.status_path(run),
                "/h/runs/01ARZ3NDEKTSV4RRFFQ69G5FAV/status.json",
            ),
            (
                home.runner_log_path(run),
                "/h/runs/01ARZ3NDEKTSV4RRFFQ69G5FAV/runner.log",
            ),
            (
                home.events_path(run),
                "/h/runs/01ARZ3NDEKTSV4RRFFQ69G5FAV/events.jsonl",
            ),
            (
                home.result_path(run),
                "/h/results/01ARZ3NDEKTSV4RRFFQ69G5FAV.json",
            ),
        ];
        for (path, want) in expected {
            assert_eq!(path, PathBuf::from(want));
        }
        assert_eq!(
            home.pi_events_path(run),
            None,
            "its events.jsonl holds the records"
        );
    }

    #[test]
    fn the_private_dirs_of_each_layout_hold_everything_else() {
        assert_eq!(
            Home::at("/h").private_dirs(),
            ["/h", "/h/runs", "/h/results"].map(PathBuf::from)
        );
        assert_eq!(
            Home::in_layout("/t", Layout::PiSubagents).private_dirs(),
            [
                "/t",
                "/t/runjournal",
                "/t/async-subagent-runs",
                "/t/async-subagent-results"
            ]
            .map(PathBuf::from)
        );
    }

    #[test]
    fn an_empty_explicit_home_is_refused() {
        assert_eq!(
            Home::resolve(Some(Path::new("")), Layout::Runjournal),
            Err(NoHome::Empty)
        );
        assert_eq!(
            Home::resolve(Some(Path::new("")), Layout::PiSubagents),
            Err(NoHome::Empty)
        );
    }

    #[test]
    fn layout_names_round_trip_and_others_are_refused() {
        for layout in [Layout::Runjournal, Layout::PiSubagents] {
            assert_eq!(layout.as_str().parse::<Layout>(), Ok(layout));
        }
        assert_eq!("pi".parse::<Layout>(), Err(UnknownLayout("pi".to_string())));
    }

    #[test]
    fn pi_subagents_default_root_follows_nodes_tmpdir_and_the_uid() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(key, _)| *key == name)
                    .map(|(_, value)| OsString::from(value))
            }
        };
        assert_eq!(
            pi_subagents_default_root(env(&[]), 501),
            PathBuf::from("/tmp/pi-subagents-uid-501")
        );
        assert_eq!(
            pi_subagents_default_root(env(&[("TMPDIR", "/var/folders/xy/T/")]), 501),
            PathBuf::from("/var/folders/xy/T/pi-subagents-uid-501"),
            "macOS's per-user TMPDIR ends with a slash, which Node drops"
        );
        assert_eq!(
            pi_subagents_default_root(env(&[("TMPDIR", ""), ("TMP", "/t"), ("TEMP", "/u")]), 0),
            PathBuf::from("/t/pi-subagents-uid-0")
        );
        assert_eq!(
            pi_subagents_default_root(env(&[("TEMP", "/")]), 7),
            PathBuf::from("/pi-subagents-uid-7")
        );
    }

    #[test]
    fn pi_subagents_temp_root_is_trimmed_and_resolved_like_path_resolve() {
        let cwd = Path::new("/work/dir");
        assert_eq!(pi_subagents_configured_root("   ", cwd), None);
        assert_eq!(
            pi_subagents_configured_root(" /abs/root ", cwd),
            Some(PathBuf::from("/abs/root"))
        );
        assert_eq!(
            pi_subagents_configured_root("rel/./x/../root/", cwd),
            Some(PathBuf::from("/work/dir/rel/root"))
        );
        assert_eq!(
            pi_subagents_configured_root("../../../up", cwd),
            Some(PathBuf::from("/up"))
        );
    }

    #[test]
    fn a_home_is_refused_under_the_other_layout_than_its_journal() {
        let dir = tempfile::tempdir().expect("temp dir");
        let runjournal_home = Home::at(dir.path());
        let pi_home = Home::in_layout(dir.path(), Layout::PiSubagents);
        assert_eq!(runjournal_home.check_layout(), Ok(()), "an empty home");
        assert_eq!(pi_home.check_layout(), Ok(()), "an empty home");

        std::fs::create_dir_all(dir.path().join("runjournal")).expect("mkdir");
        std::fs::write(pi_home.journal_path(), b"").expect("a pi-layout journal");
        assert_eq!(pi_home.check_layout(), Ok(()));
        let mismatch = runjournal_home
            .check_layout()
            .expect_err("a pi-subagents journal is there");
        assert_eq!(mismatch.found, Layout::PiSubagents);
        assert_eq!(mismatch.asked, Layout::Runjournal);
        assert!(
            mismatch.to_string().contains("--layout pi-subagents"),
            "{mismatch}"
        );

        let other = tempfile::tempdir().expect("temp dir");
        std::fs::write(other.path().join("journal.redb"), b"").expect("a journal");
        let mismatch = Home::in_layout(other.path(), Layout::PiSubagents)
            .check_layout()
            .expect_err("a runjournal-layout journal is there");
        assert_eq!(mismatch.found, Layout::Runjournal);
    }

    #[test]
    fn a_new_home_is_made_only_where_nothing_else_lives() {
        let dir = tempfile::tempdir().expect("temp dir");
        let root = dir.path().join("home");
        assert_eq!(Home::at(&root).check_place(), Ok(()), "a missing directory");
        std::fs::create_dir(&root).expect("mkdir");
        assert_eq!(Home::at(&root).check_place(), Ok(()), "an empty directory");
        for name in [
            "runs",
            "results",
            "blocked",
            "reserve",
            "journal.redb.commit.lock",
            "timer.lock",
        ] {
            std::fs::write(root.join(name), b"").expect("what the layout makes");
        }
        assert_eq!(
            Home::at(&root).check_place(),
            Ok(()),
            "only the layout's own"
        );
        for name in ["a", "b", "c", "d", "e"] {
            std::fs::write(root.join(name), b"").expect("something else");
        }
        match Home::at(&root).check_place() {
            Err(NotAHomePlace::Occupied { found, more, .. }) => {
                assert_eq!(found, ["a", "b", "c"]);
                assert_eq!(more, 2);
            }
            other => panic!("a directory of other files: {other:?}"),
        }
        let refusal = Home::at(&root).check_place().expect_err("refused");
        assert!(
            refusal.to_string().contains("(a, b, c and 2 more)"),
            "{refusal}"
        );
        // A journal there: a home already, whatever else it holds.
        std::fs::write(root.join("journal.redb"), b"").expect("a journal");
        assert_eq!(Home::at(&root).check_place(), Ok(()));
        // The pi-subagents layout takes a temp root pi-subagents already uses.
        let temp_root = dir.path().join("pi");
        for name in ["async-subagent-runs", "chain-runs", "artifacts"] {
            std::fs::create_dir_all(temp_root.join(name)).expect("pi-subagents' own");
        }
        std::fs::write(temp_root.join("async-cfg-1.json"), b"{}").expect("a runner config");
        let pi = Home::in_layout(&temp_root, Layout::PiSubagents);
        assert_eq!(pi.check_place(), Ok(()));
        assert!(
            Home::at(&temp_root).check_place().is_err(),
            "not in runjournal's own layout"
        );
        assert!(matches!(
            Home::at("/").check_place(),
            Err(NotAHomePlace::FileSystemRoot { .. })
        ));
    }

    /// A directory that holds runs but no journal is a home whose journal was lost: the
    /// journal's own check says so, not this one.
    #[test]
    fn a_home_with_runs_and_no_journal_is_left_to_the_lost_journal_check() {
        let dir = tempfile::tempdir().expect("temp dir");
        let home = Home::at(dir.path());
        std::fs::create_dir_all(home.run_dir(run())).expect("a run's directory");
        std::fs::write(dir.path().join("notes.txt"), b"mine").expect("a file of the user's");
        assert_eq!(home.check_place(), Ok(()));
    }
}
