//! `journal-tools`: look inside a runjournal journal and rebuild its projections. It opens the
//! journal read-only, so it works while runs are live.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;

use runjournal::{Home, JournalReader};

/// Look inside a runjournal journal.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    /// State directory [default: $RUNJOURNAL_HOME, else $XDG_STATE_HOME/runjournal, else
    /// ~/.local/state/runjournal].
    #[arg(long, value_name = "DIR")]
    home: Option<PathBuf>,
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("journal-tools: {error:#}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let home = Home::resolve(cli.home.as_deref())?;
    let journal = JournalReader::open(home.journal_path())?;
    let view = journal.view().context("reading the journal")?;
    let meta = view.meta()?;
    println!(
        "{}: format {}, {} runs, {} records",
        journal.path().display(),
        meta.format_version,
        view.run_count()?,
        view.record_count()?
    );
    Ok(())
}
