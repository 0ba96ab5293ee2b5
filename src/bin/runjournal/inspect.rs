//! Looking at runs: `status`, `list`, `wait`, `logs`.

use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;

use runjournal::launch::{self, WaitEnd, queue};
use runjournal::logs::CopyError;
use runjournal::projection::documents;
use runjournal::show::{self, Cell, RunView};
use runjournal::{Home, RunId, RunState, RunStatus, Store};

use crate::launch::exit_code_of;
use crate::reconcile::report_reconciled;
use crate::{
    CliResult, EXIT_WAIT_TIMEOUT, Failure, Named, bad_input, check_run_text, note, open_store,
    print, print_line, reconcile_before_reading, resolve, resolve_named, stdout_failure,
};
use runjournal::journal::prune::Tombstone;

/// How many recently ended runs `list` shows without `--all`.
const RECENT_TERMINAL_LIMIT: usize = 50;

/// The longest `logs --follow` sleeps between two looks for new output; a watch of the run's
/// directory wakes it sooner when a file there is written.
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
    let run = match resolve_named(&store, text)? {
        Named::Run(run) => run,
        Named::Pruned(tombstone) => return pruned_status(&tombstone, json),
    };
    reconcile_before_reading(&store);
    let state = read_state(&store, run)?;
    let home = store.home();
    let shipping_lag = {
        let view = store.journal().view().context("reading the journal")?;
        show::shipping_lag(home, &view)
    };
    // What the runner's heartbeat last wrote, while the run is live.
    let heard_at = (!state.is_terminal())
        .then(|| runjournal::projection::read_runner_heard_at(home, run))
        .flatten();
    // CPU and memory of the running steps' processes, looked at now; not journaled.
    let resources = match show::look_at_resources(&state) {
        Ok(resources) => Some(resources),
        Err(error) => {
            note(&format!(
                "cannot look at the running steps' processes: {error}"
            ));
            None
        }
    };
    let queue_use = QueueUse::of(&store, &state)?;
    if json {
        let mut document = documents::status_doc(home, &state);
        document.runner_heard_at = heard_at;
        let mut value = serde_json::to_value(&document).context("rendering the status")?;
        // An extra field, as readers of the status.json format ignore ones they do not know.
        if let Some(object) = value.as_object_mut() {
            object.insert("journalCapacity".to_string(), capacity_json(home));
            object.insert(
                "resources".to_string(),
                serde_json::to_value(&resources).context("rendering the status")?,
            );
            object.insert(
                "shipping".to_string(),
                serde_json::to_value(&shipping_lag).context("rendering the status")?,
            );
            if let Some(queue) = &queue_use {
                object.insert(
                    "queueUse".to_string(),
                    serde_json::to_value(queue).context("rendering the status")?,
                );
            }
        }
        let text = serde_json::to_string_pretty(&value).context("rendering the status")?;
        return print_line(&text).map(|()| ExitCode::SUCCESS);
    }
    let mut view = RunView::of(&state, show::look_at_runner(&state));
    if let Some(queue) = &queue_use {
        view.fields
            .push(("queue".to_string(), Cell::plain(queue.line())));
    }
    if let Some(heard_at) = heard_at {
        let now = runjournal::event::now_ms();
        view.fields.push((
            "heard from".to_string(),
            Cell::plain(format!(
                "runner heartbeat at {} ({} ago)",
                show::time_or_dash(Some(heard_at)),
                show::age(now, heard_at)
            )),
        ));
    }
    for step in resources.iter().flatten() {
        view.fields.push((
            format!("step {}", step.step),
            Cell::plain(format!(
                "CPU {:.1}% ({} ms used), {} resident, {} (group {})",
                step.usage.cpu_percent,
                step.usage.cpu_time_ms,
                show::format_bytes(step.usage.resident_bytes),
                match step.usage.pids.len() {
                    1 => "1 process".to_string(),
                    count => format!("{count} processes"),
                },
                step.process_group
            )),
        ));
    }
    for (label, path) in [
        ("status", home.status_path(run)),
        ("result", home.result_path(run)),
        ("output", home.run_dir(run)),
    ] {
        view.fields
            .push((label.to_string(), Cell::plain(path.display().to_string())));
    }
    let mut text = view.lines(&show::no_colour).join("\n");
    text.push('\n');
    let notices = show::capacity_notice(home, runjournal::event::now_ms())
        .into_iter()
        .chain(shipping_lag.map(|lag| lag.line()));
    for notice in notices {
        text.push_str(&notice);
        text.push('\n');
    }
    print(&text)?;
    Ok(ExitCode::SUCCESS)
}

/// A run's queue as `status` shows it: its place while it waits, and the queue's use.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct QueueUse {
    queue: String,
    /// 1: the next to be admitted; `None` once admitted (or ended).
    place: Option<u64>,
    active: u64,
    max_active: Option<u64>,
    waiting: u64,
    #[serde(skip)]
    usage: runjournal::journal::QueueUsage,
}

impl QueueUse {
    fn of(store: &Store, state: &RunState) -> Result<Option<QueueUse>, Failure> {
        let Some(queue) = &state.queue else {
            return Ok(None);
        };
        let place = queue::place_of(store, state).context("reading the queue")?;
        let usage = queue::view(store, &queue.name, 0)
            .context("reading the queue")?
            .usage;
        Ok(Some(QueueUse {
            queue: queue.name.clone(),
            place,
            active: usage.active,
            max_active: usage.max_active,
            waiting: usage.waiting,
            usage,
        }))
    }

    fn line(&self) -> String {
        let place = self
            .place
            .map_or_else(String::new, |place| format!("place {place}; "));
        format!("{}: {place}{}", self.queue, queue::usage_text(&self.usage))
    }
}

/// A pruned run as `status --json` and `list --json` show it.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct PrunedJson<'a> {
    run_id: String,
    name: &'a Option<String>,
    state: &'static str,
    pruned: bool,
    pruned_at: u64,
    created_at: u64,
    ended_at: u64,
    exit_code: i32,
    session_id: &'a Option<String>,
    tool_call_id: &'a Option<String>,
}

impl PrunedJson<'_> {
    fn of(tombstone: &Tombstone) -> PrunedJson<'_> {
        PrunedJson {
            run_id: tombstone.run_id.to_string(),
            name: &tombstone.name,
            state: RunStatus::from(tombstone.state).as_str(),
            pruned: true,
            pruned_at: tombstone.pruned_at_ms,
            created_at: tombstone.created_at_ms,
            ended_at: tombstone.ended_at_ms,
            exit_code: tombstone.exit_code,
            session_id: &tombstone.session_id,
            tool_call_id: &tombstone.tool_call_id,
        }
    }
}

/// `status` of a pruned run: what its tombstone says.
fn pruned_status(tombstone: &Tombstone, json: bool) -> CliResult {
    if json {
        let text = serde_json::to_string_pretty(&PrunedJson::of(tombstone))
            .context("rendering the status")?;
        return print_line(&text).map(|()| ExitCode::SUCCESS);
    }
    print_line(&show::pruned_line(tombstone))?;
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
    // With --all, the pruned runs that kept their tombstone too.
    let mut pruned: Vec<Tombstone> = if all {
        view.tombstones().context("listing pruned runs")?
    } else {
        Vec::new()
    };
    pruned.retain(|tombstone| {
        state_filter.is_none_or(|wanted| RunStatus::from(tombstone.state) == wanted)
    });
    pruned.sort_by_key(|tombstone| std::cmp::Reverse(tombstone.run_id));
    // Each queue a listed run is in: its waiting runs in order (for their places), and its use.
    let mut queues: std::collections::BTreeMap<
        String,
        (Vec<RunId>, runjournal::journal::QueueUsage),
    > = std::collections::BTreeMap::new();
    for state in &states {
        if let Some(queue) = &state.queue
            && !queues.contains_key(&queue.name)
        {
            let waiting = view
                .queue_waiting(&queue.name, usize::MAX)
                .context("reading a queue")?;
            let usage = view.queue_usage(&queue.name).context("reading a queue")?;
            queues.insert(queue.name.clone(), (waiting, usage));
        }
    }
    let place_of = |state: &RunState| -> Option<(String, u64)> {
        let queue = state.queue.as_ref()?;
        let (waiting, _) = queues.get(&queue.name)?;
        let index = waiting.iter().position(|run| *run == state.run_id)?;
        Some((queue.name.clone(), index as u64 + 1))
    };
    let notices: Vec<String> = show::capacity_notice(store.home(), runjournal::event::now_ms())
        .into_iter()
        .chain(show::shipping_lag(store.home(), &view).map(|lag| lag.line()))
        .collect();
    drop(view);
    // Newest first: ids sort by creation time.
    states.sort_by_key(|state| std::cmp::Reverse(state.run_id));
    let now_ms = runjournal::event::now_ms();
    if json {
        let mut rows: Vec<serde_json::Value> = states
            .iter()
            .map(|state| list_json(state, place_of(state).map(|(_, place)| place)))
            .collect();
        for tombstone in &pruned {
            rows.push(
                serde_json::to_value(PrunedJson::of(tombstone)).context("rendering the list")?,
            );
        }
        let text = serde_json::to_string_pretty(&rows).context("rendering the list")?;
        print_line(&text)?;
        // The array stays the data; the notices go beside it.
        for notice in &notices {
            note(notice);
        }
    } else {
        let mut text = String::new();
        for notice in &notices {
            text.push_str(notice);
            text.push('\n');
        }
        let mut rows = list_rows(&states, now_ms, &place_of);
        rows.extend(pruned.iter().map(|tombstone| pruned_row(tombstone, now_ms)));
        for line in show::table_lines(&rows, &show::no_colour) {
            text.push_str(&line);
            text.push('\n');
        }
        for (name, (_, usage)) in &queues {
            text.push_str(&format!("queue {name}: {}\n", queue::usage_text(usage)));
        }
        print(&text)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `list` without `--json`: a header, then a row per run.
fn list_rows(
    states: &[RunState],
    now_ms: runjournal::event::UnixMs,
    place_of: &dyn Fn(&RunState) -> Option<(String, u64)>,
) -> Vec<Vec<Cell>> {
    let mut rows = vec![show::header(&[
        "RUN", "STATE", "MODE", "STEPS", "EXIT", "AGE", "NAME",
    ])];
    for state in states {
        let exit = state.terminal.as_ref().map_or_else(
            || "-".to_string(),
            |terminal| terminal.exit_code.to_string(),
        );
        let name = state.spec.name.clone().unwrap_or_else(|| {
            state
                .spec
                .steps
                .first()
                .map(|step| step.name.clone())
                .unwrap_or_default()
        });
        rows.push(vec![
            Cell::plain(state.run_id.to_string()),
            Cell::plain(match place_of(state) {
                Some((queue, place)) => format!("queued ({queue} #{place})"),
                None => state.status.as_str().to_string(),
            }),
            Cell::plain(state.spec.mode.as_str()),
            Cell::plain(format!("{}/{}", state.steps_done(), state.steps.len())),
            Cell::plain(exit),
            Cell::plain(show::age(now_ms, state.created_at_ms)),
            Cell::plain(name),
        ]);
    }
    rows
}

/// A pruned run's row of `list --all`: its final state, marked pruned.
fn pruned_row(tombstone: &Tombstone, now_ms: runjournal::event::UnixMs) -> Vec<Cell> {
    vec![
        Cell::plain(tombstone.run_id.to_string()),
        Cell::plain(format!(
            "{} (pruned {})",
            RunStatus::from(tombstone.state),
            show::time_or_dash(Some(tombstone.pruned_at_ms))
        )),
        Cell::plain("-"),
        Cell::plain("-"),
        Cell::plain(tombstone.exit_code.to_string()),
        Cell::plain(show::age(now_ms, tombstone.created_at_ms)),
        Cell::plain(tombstone.name.clone().unwrap_or_default()),
    ]
}

/// One run of `list --json`.
fn list_json(state: &RunState, queue_place: Option<u64>) -> serde_json::Value {
    serde_json::json!({
        "queue": state.queue.as_ref().map(|queue| queue.name.clone()),
        "queuePlace": queue_place,
        "runId": state.run_id.to_string(),
        "name": state.spec.name,
        "state": state.status.as_str(),
        "mode": state.spec.mode.as_str(),
        "steps": state.steps.len(),
        "stepsDone": state.steps_done(),
        "createdAt": state.created_at_ms,
        "endedAt": state.ended_at_ms(),
        "exitCode": state.terminal.as_ref().map(|terminal| terminal.exit_code),
        "error": state.terminal.as_ref().and_then(|terminal| terminal.error.clone()),
        "dismissed": state.dismissed_at_ms.is_some(),
        "sessionId": state.session_id,
        "toolCallId": state.tool_call_id,
    })
}

/// The capacity state as JSON, for `status --json`.
fn capacity_json(home: &Home) -> serde_json::Value {
    match runjournal::capacity::read_status(home) {
        Ok(status) => serde_json::json!({
            "blockedSinceMs": status.blocked_since_ms(),
            "blockedWriters": status.blocked.len(),
            "blocked": show::blocked_writers_json(&status),
            "hasReserve": status.has_reserve,
        }),
        Err(error) => serde_json::json!({ "error": error.to_string() }),
    }
}

/// `runjournal wait RUN [--timeout DURATION]`.
pub fn wait(home: Home, text: &str, timeout: Option<Duration>) -> CliResult {
    check_run_text(text)?;
    let store = open_store(home)?;
    let run = match resolve_named(&store, text)? {
        Named::Run(run) => run,
        // It ended long ago: the wait is over, with the run's own exit code.
        Named::Pruned(tombstone) => {
            print_line(&show::pruned_line(&tombstone))?;
            let code = tombstone.exit_code.rem_euclid(256);
            return Ok(ExitCode::from(
                u8::try_from(code).unwrap_or(crate::EXIT_ERROR),
            ));
        }
    };
    reconcile_before_reading(&store);
    let deadline = timeout.map(|timeout| Instant::now() + timeout);
    let waited = launch::wait_for_end(&store, run, deadline).context("following the run")?;
    if let Some(reconciled) = &waited.reconciled {
        report_reconciled(reconciled);
    }
    match waited.end {
        WaitEnd::Ended(state) => {
            print_line(&show::end_line(&state))?;
            Ok(exit_code_of(&state))
        }
        WaitEnd::TimedOut(state) => {
            note(&format!(
                "run {run} is still {} (wait timed out)",
                state.status
            ));
            Ok(ExitCode::from(EXIT_WAIT_TIMEOUT))
        }
        WaitEnd::RunnerGone(state) => {
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
    // Made before the first look, so output written between a look and the sleep after it
    // wakes the sleep; without one, the bounded poll alone does.
    let watch = if follow {
        runjournal::platform::watch_dir(&store.home().run_dir(run), &[]).ok()
    } else {
        None
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    loop {
        // Read the state first: output written before it ended is then surely drained below.
        let is_over = !follow || read_state(&store, run)?.is_terminal();
        for (slot, &index) in steps.iter().enumerate() {
            let path = store.home().output_log_path(run, index);
            let reading = |error| {
                Failure::Error(
                    anyhow::Error::new(error).context(format!("reading {}", path.display())),
                )
            };
            // Streamed: a log is never held in memory whole, whatever its size.
            let Some(new_bytes) =
                runjournal::logs::new_bytes(&path, offsets[slot]).map_err(reading)?
            else {
                continue;
            };
            if show_headers && last_shown != Some(index) {
                if last_shown.is_some() {
                    writeln!(out).map_err(stdout_failure)?;
                }
                writeln!(
                    out,
                    "==> step {index} ({}) <==",
                    state.spec.steps[index].name
                )
                .map_err(stdout_failure)?;
                last_shown = Some(index);
            }
            offsets[slot] += new_bytes.copy_to(&mut out).map_err(|error| match error {
                CopyError::Write(error) => stdout_failure(error),
                CopyError::Read(error) => reading(error),
                other => Failure::Error(other.into()),
            })?;
        }
        out.flush().map_err(stdout_failure)?;
        if is_over {
            return Ok(ExitCode::SUCCESS);
        }
        let is_watched = watch
            .as_ref()
            .is_some_and(|watch| watch.wait(LOGS_POLL_INTERVAL).is_ok());
        if !is_watched {
            std::thread::sleep(LOGS_POLL_INTERVAL);
        }
    }
}
