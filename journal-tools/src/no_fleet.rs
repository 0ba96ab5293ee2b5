//! The fleet's commands in a build without the cargo feature `ship`: the same options as
//! `fleet.rs`, each refused as a usage error (exit 2) naming what the build lacks.

use runjournal::source::JournalSource;

use crate::output::Out;
use crate::{EventsArgs, RunsArgs, Status, UsageError};

/// The variable naming the fleet's URL when `--from` is not given.
pub const FROM_ENV: &str = "JOURNAL_TOOLS_FROM";

/// The fleet's options, from the command line: filled as for `fleet.rs`, read by nothing here.
#[expect(
    dead_code,
    reason = "the same fields as fleet.rs's, which main.rs fills in either build"
)]
pub struct FleetArgs {
    pub url: String,
    pub is_on_command_line: bool,
    pub silent_after_ms: u64,
}

fn refused() -> anyhow::Result<Status> {
    Err(UsageError(
        "this build of journal-tools reads no fleet: it was built without the cargo feature `ship` (PostgreSQL)".to_string(),
    )
    .into())
}

pub fn runs(_: &FleetArgs, _: &mut Out, _: &RunsArgs) -> anyhow::Result<Status> {
    refused()
}

pub fn run(_: &FleetArgs, _: &mut Out, _: &str) -> anyhow::Result<Status> {
    refused()
}

pub fn events(_: &FleetArgs, _: &mut Out, _: &EventsArgs) -> anyhow::Result<Status> {
    refused()
}

pub fn stats(_: &FleetArgs, _: &mut Out) -> anyhow::Result<Status> {
    refused()
}

pub fn verify_against(_: &JournalSource, _: &mut Out, _: &str) -> anyhow::Result<Status> {
    refused()
}
