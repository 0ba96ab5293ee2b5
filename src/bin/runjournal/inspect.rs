//! Looking at runs: `status`, `list`, `wait`, `logs`.

use std::io::{Read, Seek, SeekFrom, Write};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;

use runjournal::launch::{self, FollowEnd};
use runjournal::projection::documents;
use runjournal::{Home, RunId, RunState, RunStatus, Store};

use crate::launch::exit_code_of;
use crate::{
    CliResult, EXIT_WAIT_TIMEOUT, Failure, bad_input, check_run_text, open_store,
    reconcile_before_reading, render, resolve,
};

/// How many recently ended runs `list` shows without `--all`.
const RECENT_TERMINAL_LIMIT: usize = 50;

/// How often `logs --follow` looks for new output.
const LOGS_POLL_INTERVAL: Duration = Duration::from_millis(200);

fn read_state(store: &Store, run: RunId) -> Result<RunState, Failure> {
    store
        .journal()
        .view()
        .and_then(|view| view.snapshot(run))
        .context("reading the run")?
        .ok_or_else(|| bad_input(format!("run {run} is not in the journal")))
}

/// `runjournal status RUN [--json]`.
pub fn status(home: Home, text: &str, json: bool) -> CliResult {
    check_run_text(text)?;
    let store = open_store(home)?;
    let run = resolve(&store, text)?;
    reconcile_before_reading(&store);
    let state = read_state(&store, run)?;
    if json {
        let document = documents::status_doc(store.home(), &state);
        let mut value = serde_json::to_value(&document).context("rendering the status")?;
        // An extra field, as readers of the status.json format ignore ones they do not know.
        if let Some(object) = value.as_object_mut() {
            object.insert(
                "journalCapacity".to_string(),
                render::capacity_json(store.home()),
            );
            let lag = render::ship_lag(&store);
            object.insert("shipping".to_string(), render::ship_lag_json(lag.as_ref()));
        }
        let text = serde_json::to_string_pretty(&value).context("rendering the status")?;
        println!("{text}");
    } else {
        print!("{}", render::status_text(store.home(), &state));
        if let Some(notice) = render::capacity_notice(store.home(), runjournal::event::now_ms()) {
            println!("{notice}");
        }
        if let Some(lag) = render::ship_lag(&store) {
            writeln!(std::io::stdout(), "{}", lag.line()).context("writing the status")?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `runjournal list [--state S] [--all] [--json]`.
pub fn list(home: Home, state_filter: Option<&str>, all: bool, json: bool) -> CliResult {
    let state_filter: Option<RunStatus> = state_filter
        .map(str::parse)
        .transpose()
        .map_err(bad_input)?;
    let store = open_store(home)?;
    reconcile_before_reading(&store);
    let view = store.journal().view().context("reading the journal")?;
    // Without --all: the active index and the most recently ended runs, not every run.
    let ids: Vec<RunId> = if all {
        view.all_runs().context("listing runs")?
    } else {
        let mut ids = view.active_runs().context("listing active runs")?;
        ids.extend(
            view.recent_terminal(RECENT_TERMINAL_LIMIT)
                .context("listing ended runs")?
                .into_iter()
                .map(|(_, run)| run),
        );
        ids.sort_unstable();
        ids.dedup();
        ids
    };
    let mut states = Vec::with_capacity(ids.len());
    for run in ids {
        let Some(state) = view.snapshot(run).context("reading a run")? else {
            continue;
        };
        if !all && state.dismissed_at_ms.is_some() {
            continue;
        }
        if state_filter.is_some_and(|wanted| state.status != wanted) {
            continue;
        }
        states.push(state);
    }
    drop(view);
    // Newest first: ids sort by creation time.
    states.sort_by_key(|state| std::cmp::Reverse(state.run_id));
    let now_ms = runjournal::event::now_ms();
    let notice = render::capacity_notice(store.home(), now_ms);
    let ship_lag = render::ship_lag(&store).map(|lag| lag.line());
    if json {
        let rows: Vec<serde_json::Value> = states.iter().map(render::list_json).collect();
        let text = serde_json::to_string_pretty(&rows).context("rendering the list")?;
        println!("{text}");
        // The array stays the data; the notice goes beside it.
        for notice in notice.iter().chain(&ship_lag) {
            // The array on stdout is the data; a notice that cannot be written changes nothing.
            let _ = writeln!(std::io::stderr(), "runjournal: {notice}");
        }
    } else {
        for notice in notice.iter().chain(&ship_lag) {
            writeln!(std::io::stdout(), "{notice}").context("writing the list")?;
        }
        print!("{}", render::list_table(&states, now_ms));
    }
    Ok(ExitCode::SUCCESS)
}

/// `runjournal wait RUN [--timeout DURATION]`.
pub fn wait(home: Home, text: &str, timeout: Option<Duration>) -> CliResult {
    check_run_text(text)?;
    let store = open_store(home)?;
    let run = resolve(&store, text)?;
    reconcile_before_reading(&store);
    let deadline = timeout.map(|timeout| Instant::now() + timeout);
    let head = read_state(&store, run)?.head_seq;
    let mut end =
        launch::follow(&store, run, head, None, deadline, |_| {}).context("following the run")?;
    if let FollowEnd::RunnerGone(_) = end {
        // The runner died without recording an outcome: the reconciler records it.
        reconcile_before_reading(&store);
        let state = read_state(&store, run)?;
        if state.is_terminal() {
            end = FollowEnd::Terminal(state);
        }
    }
    match end {
        FollowEnd::Terminal(state) => {
            println!("{}", render::end_line(&state));
            Ok(exit_code_of(&state))
        }
        FollowEnd::TimedOut(state) => {
            eprintln!(
                "runjournal: run {run} is still {} (wait timed out)",
                state.status
            );
            Ok(ExitCode::from(EXIT_WAIT_TIMEOUT))
        }
        FollowEnd::RunnerGone(state) | FollowEnd::RunnerExited { state, .. } => {
            let pid = state
                .runner
                .as_ref()
                .map(|runner| runner.identity.pid.to_string())
                .unwrap_or_else(|| "?".to_string());
            Err(Failure::Error(anyhow::anyhow!(
                "run {run} is {} but its runner (pid {pid}) is gone without recording an outcome; see {}",
                state.status,
                store.home().runner_log_path(run).display()
            )))
        }
    }
}

/// `runjournal logs RUN [--step N] [--follow]`. With several steps, each chunk of output is
/// headed by the step it comes from, as `tail` heads files.
pub fn logs(home: Home, text: &str, step: Option<u32>, follow: bool) -> CliResult {
    check_run_text(text)?;
    let store = open_store(home)?;
    let run = resolve(&store, text)?;
    let state = read_state(&store, run)?;
    let count = state.spec.steps.len();
    let steps: Vec<usize> = match step {
        Some(step) if (step as usize) < count => vec![step as usize],
        Some(step) => {
            return Err(bad_input(format!(
                "run {run} has no step {step} (it has {count} steps, numbered from 0)"
            )));
        }
        None => (0..count).collect(),
    };
    let show_headers = steps.len() > 1;
    let mut offsets = vec![0u64; steps.len()];
    let mut last_shown: Option<usize> = None;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    loop {
        // Read the state first: output written before it ended is then surely drained below.
        let is_over = !follow || read_state(&store, run)?.is_terminal();
        for (slot, &index) in steps.iter().enumerate() {
            let path = store.home().output_log_path(run, index);
            let chunk = read_from(&path, offsets[slot])
                .with_context(|| format!("reading {}", path.display()))?;
            if chunk.is_empty() {
                continue;
            }
            offsets[slot] += chunk.len() as u64;
            if show_headers && last_shown != Some(index) {
                if last_shown.is_some() {
                    writeln!(out).context("writing output")?;
                }
                writeln!(
                    out,
                    "==> step {index} ({}) <==",
                    state.spec.steps[index].name
                )
                .context("writing output")?;
                last_shown = Some(index);
            }
            out.write_all(&chunk).context("writing output")?;
        }
        out.flush().context("writing output")?;
        if is_over {
            return Ok(ExitCode::SUCCESS);
        }
        std::thread::sleep(LOGS_POLL_INTERVAL);
    }
}

/// The bytes of a file from `offset` on; nothing for a file that does not exist yet.
fn read_from(path: &std::path::Path, offset: u64) -> std::io::Result<Vec<u8>> {
    let mut file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => return Err(error),
    };
    file.seek(SeekFrom::Start(offset))?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    Ok(bytes)
}
