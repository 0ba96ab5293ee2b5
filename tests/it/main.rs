//! The integration tests, one crate so they link once. Each module is one file of tests;
//! `support` holds the helpers they share, beside the library's `testkit`.

// Tests are scenarios read top to bottom: the bound on a function's length is for the library.
#![allow(clippy::too_many_lines)]

mod architecture_map;
mod cli_bad_input;
mod cli_control;
mod cli_json;
mod cli_layout;
mod cli_live;
mod cli_run;
mod commit_leader;
mod concurrent_writers;
mod crash_kill;
mod damaged_journal;
mod delay;
mod dependencies;
mod fault_sweep;
mod flaky_disk;
mod full_disk;
mod fuzz_corpus;
mod golden;
mod golden_snapshots;
mod group_commit;
mod hooks;
mod host_example;
mod launch;
mod layers;
mod lost_journal;
mod model;
mod pi_control;
mod pi_subagents_compat;
#[cfg(target_os = "linux")]
mod power_cut;
mod power_loss;
mod projection_incremental;
mod projection_repair;
mod queue;
mod resume;
mod retention;
mod retry;
mod run_env;
mod runner_hygiene;
mod scrub;
mod ship;
mod stall;
mod stopped_leader;
mod strangers;
mod support;
mod unique;
mod watch;
