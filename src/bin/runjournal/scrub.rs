//! `runjournal scrub`: check every page of the journal now, or set how often the home's
//! maintenance does it; `runjournal status --home-health`: what the last scrub found.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

use runjournal::Home;
use runjournal::scrub::{self, ScrubOutcome, ScrubRecord};
use runjournal::store::ReadHome;

use crate::{
    CliResult, EXIT_DAMAGED, EXIT_ERROR, Failure, note, open_for_reading, open_store, print_line,
};

/// `runjournal scrub [--every DURATION] [--json]`, and the scheduled `__scrub` (`quiet`: no
/// output, the exit code alone).
pub fn command(home: Home, every: Option<Duration>, json: bool, quiet: bool) -> CliResult {
    if every.is_some_and(|every| every.is_zero()) {
        return Err(crate::bad_input("--every must be longer than 0s"));
    }
    let store = open_store(home)?;
    if let Some(every) = every {
        scrub::set_interval(&store, every).map_err(|error| Failure::Error(error.into()))?;
        if !quiet {
            print_line(&format!(
                "the home's journal is scrubbed every {}",
                runjournal::duration::format_duration(every)
            ))?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    let journal = store.home().journal_path();
    if !quiet && std::io::stderr().is_terminal() {
        let bytes = std::fs::metadata(&journal).map_or(0, |metadata| metadata.len());
        note(&format!(
            "scrubbing {} ({bytes} bytes): copying it, then checking every page",
            journal.display()
        ));
    }
    let record = scrub::scrub(&store).map_err(|error| Failure::Error(error.into()))?;
    if !quiet {
        if json {
            let text = serde_json::to_string(&record).map_err(anyhow::Error::from)?;
            print_line(&text)?;
        } else {
            print_line(&record.to_string())?;
        }
    }
    Ok(exit_of(&record, &journal))
}

/// 0 for a clean journal, 4 for a damaged one, 1 for a scrub that could not run.
fn exit_of(record: &ScrubRecord, journal: &std::path::Path) -> ExitCode {
    match record.outcome {
        ScrubOutcome::Clean => ExitCode::SUCCESS,
        ScrubOutcome::Damaged { .. } => {
            note(&runjournal::journal::damage_advice(journal));
            ExitCode::from(EXIT_DAMAGED)
        }
        ScrubOutcome::NotRun { .. } => ExitCode::from(EXIT_ERROR),
    }
}

/// `runjournal status --home-health`: the last scrub, the next one and the interval.
pub fn home_health(home: Home, json: bool) -> CliResult {
    let store = open_for_reading(home)?;
    let view = store.view().map_err(|error| Failure::Error(error.into()))?;
    let boot_id = runjournal::platform::boot_id().unwrap_or_default();
    let health = runjournal::json::HomeHealth::of(&view, &boot_id)
        .map_err(|error| Failure::Error(error.into()))?;
    if json {
        print_line(&serde_json::to_string(&health).map_err(anyhow::Error::from)?)?;
    } else {
        print_line(&health.to_string())?;
    }
    Ok(ExitCode::SUCCESS)
}
