//! `runjournal ship --to URL [--once]`: the journal's records into PostgreSQL
//! (`runjournal::ship`).

use std::process::ExitCode;
use std::time::Duration;

use runjournal::Home;
use runjournal::ship::shipper::{self, FollowEvent};
use runjournal::ship::{SHIP_URL_ENV, ShipOptions, Shipper, Target};
use runjournal::show::plural;

use crate::launch::duration_arg;
use crate::{CliResult, Failure, bad_input, print_line};

#[derive(clap::Args)]
pub struct ShipArgs {
    /// PostgreSQL URL: postgresql://user@host[:port]/database[?sslmode=...]
    /// [default: $RUNJOURNAL_SHIP_URL]. The password is best left out of it: it is found as
    /// libpq finds it ($PGPASSWORD, $PGPASSFILE or ~/.pgpass). Bounds on the server's
    /// answers: connect_timeout (seconds, default 10), statement_timeout (default 60s) and
    /// lock_timeout (default 10s) among its options.
    #[arg(long, value_name = "URL")]
    to: Option<String>,
    /// Stop shipping this home: the journal forgets what it proved shipped, and retention
    /// keeps nothing for a shipper any more (stop the shipper first; `ship` starts it again).
    #[arg(long, conflicts_with_all = ["to", "once", "host_name"])]
    off: bool,
    /// Ship what the journal holds now, then exit (0 shipped, 1 failed); without it the
    /// shipper follows the journal and retries failures until it is stopped.
    #[arg(long)]
    once: bool,
    /// The host's name in the fleet [default: this machine's host name].
    #[arg(long, value_name = "NAME")]
    host_name: Option<String>,
    /// Records per PostgreSQL transaction.
    #[arg(long, value_name = "N", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(1..=shipper::BATCH_RECORDS_MAX as u64))]
    batch_records: u64,
    /// How often a following shipper looks for new records.
    #[arg(long, value_name = "DURATION", value_parser = duration_arg, default_value = "250ms")]
    poll_interval: Duration,
    /// How often the journal's heartbeat is sent when there is nothing to ship.
    #[arg(long, value_name = "DURATION", value_parser = duration_arg, default_value = "10s")]
    heartbeat_interval: Duration,
}

/// `runjournal ship`.
pub fn command(home: Home, args: ShipArgs) -> CliResult {
    // A home of the other layout has its journal elsewhere: refused, as every command does.
    home.check_layout().map_err(bad_input)?;
    // So is a home someone else owns or may write (exit 1, naming the fix).
    runjournal::store::check_home(&home)
        .map_err(|error| Failure::Error(anyhow::Error::new(error)))?;
    if args.off {
        let store = crate::open_store(home)?;
        let stopped = runjournal::ship::state::stop(store.home(), store.journal())
            .map_err(|error| Failure::Error(anyhow::Error::new(error)))?;
        print_line(&stopped.to_string())?;
        return Ok(ExitCode::SUCCESS);
    }
    let (url, is_from_command_line) = match args.to {
        Some(url) => (url, true),
        None => (
            std::env::var(SHIP_URL_ENV)
                .ok()
                .filter(|url| !url.is_empty())
                .ok_or_else(|| bad_input(format!("ship needs --to URL (or {SHIP_URL_ENV})")))?,
            false,
        ),
    };
    let target = Target::parse(&url).map_err(bad_input)?;
    for warning in target.warnings() {
        note(warning);
    }
    if is_from_command_line && target.is_password_in_url() {
        note(&format!(
            "warning: the --to URL holds a password, which every user of this machine can read on the command line; leave it out and set PGPASSWORD or a ~/.pgpass file (0600), or give the URL in {SHIP_URL_ENV}"
        ));
        hide_url_from_command_line(&url);
    }
    let mut options = ShipOptions::new(
        target,
        args.host_name.unwrap_or_else(shipper::local_host_name),
    );
    options.batch_records =
        usize::try_from(args.batch_records).unwrap_or(shipper::BATCH_RECORDS_DEFAULT);
    options.poll_interval = args.poll_interval;
    options.heartbeat_interval = args.heartbeat_interval;
    let shown = options.target.shown().to_string();
    let mut shipper = Shipper::new(home, options);
    if args.once {
        let report = shipper
            .pass()
            .map_err(|error| Failure::Error(anyhow::Error::new(error)))?;
        print_line(&format!(
            "shipped {} in {} to {shown}; shipped through global seq {} (journal head {})",
            plural(report.records_shipped, "record"),
            match report.batches {
                1 => "1 batch".to_string(),
                batches => format!("{batches} batches"),
            },
            report.shipped_through,
            report.global_head,
        ))?;
        return Ok(ExitCode::SUCCESS);
    }
    note(&format!("following the journal into {shown}"));
    // Stopped by a signal: a shipper killed at any moment resumes exactly where the server's
    // cursor says, so there is nothing to finish first. A server refused as ahead of the
    // journal or diverged from it ends it: waiting will not mend that.
    let followed = shipper.follow(&|| false, &mut |event| match event {
        FollowEvent::Failing(error) => {
            note(&format!("{error:#}; retrying"));
        }
        FollowEvent::Recovered(report) => note(&format!(
            "shipping again; shipped through global seq {}",
            report.shipped_through
        )),
        FollowEvent::Shipped(_) => {}
    });
    followed.map_err(|error| Failure::Error(anyhow::Error::new(error)))?;
    Ok(ExitCode::SUCCESS)
}

/// A line on stderr (`runjournal: ship: ...`); a closed or full stderr does not stop the
/// shipper.
fn note(text: &str) {
    crate::note(&format!("ship: {text}"));
}

/// Starts this program again in this process (same pid), with `--to URL` taken off its
/// command line and the URL in [`SHIP_URL_ENV`] instead: a process's command line is readable
/// by every user (`/proc/<pid>/cmdline`), its environment only by its own user. Returns (and
/// the shipper goes on as it is) when the URL cannot be taken off cleanly or the exec fails.
fn hide_url_from_command_line(url: &str) {
    use std::os::unix::process::CommandExt;
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.is_empty() {
        return;
    }
    let program = args.remove(0);
    let mut kept = Vec::with_capacity(args.len());
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        if arg == "--to" {
            let _url = args.next();
        } else if !arg.to_str().is_some_and(|arg| arg.starts_with("--to=")) {
            kept.push(arg);
        }
    }
    let is_hidden = !kept
        .iter()
        .any(|arg| arg.to_str().is_some_and(|arg| arg.contains(url)));
    if !is_hidden {
        return;
    }
    let Ok(exe) = std::env::current_exe() else {
        return;
    };
    let error = std::process::Command::new(exe)
        .arg0(program)
        .args(kept)
        .env(SHIP_URL_ENV, url)
        .exec();
    note(&format!(
        "could not start again without the URL on the command line ({error}); going on"
    ));
}
