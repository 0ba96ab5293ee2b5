//! runjournal makes background runs crash-safe: every lifecycle transition of a run is appended
//! to an embedded redb journal, durable before anyone acts on it, and the files hosts read
//! (`status.json`, result files, `events.jsonl`) are projections rebuilt from that journal.

// Unit tests are scenarios read top to bottom; the bound on a function's length is for the
// library's own code, which the build without `test` checks.
#![cfg_attr(test, allow(clippy::too_many_lines))]

pub mod capacity;
pub mod control;
pub mod control_inbox;
pub mod durable_fs;
pub mod duration;
pub mod event;
pub mod exit;
#[cfg(feature = "fuzz")]
#[doc(hidden)]
pub mod fuzz;
pub mod home;
pub mod hooks;
pub mod journal;
pub mod json;
pub mod launch;
pub mod liveness;
pub mod logs;
pub mod platform;
pub mod process_group;
pub mod projection;
pub mod reconcile;
pub mod recover;
pub mod replay;
pub mod resolve;
pub mod retention;
pub mod run_env;
pub mod runner;
pub mod runs;
pub mod scrub;
pub mod ship;
pub mod show;
pub mod source;
pub mod spec;
pub mod state;
pub mod stats;
pub mod store;
mod sync;
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;
pub mod text;
pub mod verify;

pub use event::{Event, HostIds, RunId, RunSpec};
pub use home::Home;
pub use journal::{Condition, Journal, JournalReader};
pub use launch::RunnerProgram;
pub use runs::{Maintained, Runs};
pub use state::{RunState, RunStatus, apply};
pub use store::Store;
