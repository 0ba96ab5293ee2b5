//! `runjournal hook set|show|off`, `runjournal hooks [RUN]` and the hidden `__deliver-hooks`.

use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;

use runjournal::hooks::{self, DeliveryOptions, HomeHookReport, HookReport};
use runjournal::store::ReadHome;
use runjournal::{Home, Store, show};

use crate::{CliResult, EXIT_ERROR, bad_input, check_run_text, open_store, print, print_line};

#[derive(Subcommand)]
pub enum HookCommand {
    /// Set the home's hook: `sh -c CMD` runs once each run has ended, with RUNJOURNAL_RUN_ID,
    /// RUNJOURNAL_RUN_STATE, RUNJOURNAL_EXIT_CODE and RUNJOURNAL_RESULT_PATH set beside the
    /// run's environment. Runs that end from now on get it.
    Set {
        /// The shell command.
        command: String,
    },
    /// Show the home's hook.
    Show {
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Remove the home's hook. Runs that already ended keep the hooks they ended with.
    Off,
}

/// `runjournal hook ...`.
pub fn hook(home: Home, command: HookCommand) -> CliResult {
    match command {
        HookCommand::Set { command } => {
            runjournal::run_env::check_hook_command(&command).map_err(bad_input)?;
            let store = open_store(home)?;
            store
                .journal()
                .set_home_hook(Some(&command))
                .context("setting the home's hook")?;
            print_line(&format!(
                "home hook set: {}",
                show::escape_control(&command)
            ))?;
        }
        HookCommand::Off => {
            let store = open_store(home)?;
            store
                .journal()
                .set_home_hook(None)
                .context("removing the home's hook")?;
            print_line("home hook off")?;
        }
        HookCommand::Show { json } => {
            let store = open_store(home)?;
            let command = store
                .journal()
                .view()
                .and_then(|view| view.home_hook())
                .context("reading the home's hook")?;
            if json {
                let report = HomeHookReport { command };
                print_line(&serde_json::to_string(&report).context("writing JSON")?)?;
            } else {
                match command {
                    Some(command) => print_line(&show::escape_control(&command))?,
                    None => print_line("no home hook is set")?,
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `runjournal hooks [RUN] [--json]`.
pub fn hooks(home: Home, run: Option<&str>, json: bool) -> CliResult {
    if let Some(text) = run {
        check_run_text(text)?;
    }
    let store = crate::open_for_reading(home)?;
    crate::reconcile_before_reading(&store);
    let run = run.map(|text| crate::resolve(&store, text)).transpose()?;
    let reports = {
        let view = store.view().context("reading the journal")?;
        match run {
            Some(run) => hooks::hooks_of(store.home(), &view, run),
            None => hooks::undelivered(store.home(), &view),
        }
        .context("reading the hooks")?
    };
    if json {
        print_line(&serde_json::to_string(&reports).context("writing JSON")?)?;
        return Ok(ExitCode::SUCCESS);
    }
    if reports.is_empty() {
        let line = match run {
            Some(run) => format!("run {run} has no hooks"),
            None => "no hook is pending, failing or given up".to_string(),
        };
        return print_line(&line).map(|()| ExitCode::SUCCESS);
    }
    let mut text = String::new();
    for report in &reports {
        text.push_str(&hook_line(report));
        text.push('\n');
    }
    print(&text)?;
    Ok(ExitCode::SUCCESS)
}

/// One hook in one line: run, hook, where it comes from, status, attempts, what went wrong
/// last, when it is tried again, and its command.
fn hook_line(report: &HookReport) -> String {
    let mut line = format!(
        "{}  hook {} ({})  {}  {} attempt{}",
        report.run_id,
        report.hook,
        report.source,
        report.status.as_str(),
        report.attempts,
        if report.attempts == 1 { "" } else { "s" }
    );
    if let Some(outcome) = &report.last_outcome_text {
        line.push_str(&format!("  last: {outcome}"));
    }
    if let Some(retry_at_ms) = report.retry_at_ms {
        line.push_str(&format!(
            "  next: {}",
            runjournal::duration::format_time_ms(retry_at_ms)
        ));
    }
    if let Some(by) = &report.claimed_by {
        line.push_str(&format!("  by {by}"));
    }
    line.push_str(&format!("  $ {}", report.command));
    show::escape_control(&line).into_owned()
}

/// `runjournal __deliver-hooks`: delivers what is due in the home, waiting for retries due
/// soon, and exits. Started detached by a reconcile pass; its stdout and stderr are /dev/null.
pub fn deliver(home: Home) -> CliResult {
    let store = Store::open(home).context("opening the home")?;
    let by = format!("deliverer (pid {})", std::process::id());
    let mut options = DeliveryOptions::from_env(by, hooks::DELIVERER_MAX_WAIT)
        .map_err(|reason| crate::Failure::Error(anyhow::anyhow!(reason)))?;
    // A process of its own, started for this: what a hook leaves outside its group is
    // inherited here and ended, as a runner does for its steps. Where there is no subreaper
    // (macOS), such orphans go to launchd.
    let _ = runjournal::platform::become_child_subreaper();
    options.ends_descendants = true;
    match hooks::deliver_due(&store, &options) {
        Ok(_) => {
            store.flush_projections(std::time::Duration::from_secs(2));
            Ok(ExitCode::SUCCESS)
        }
        Err(_) => Ok(ExitCode::from(EXIT_ERROR)),
    }
}
