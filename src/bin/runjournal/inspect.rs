//! Looking at runs: `status`, `list`, `wait`, `logs`.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;

use runjournal::launch::{self, WaitEnd, queue};
use runjournal::projection::documents;
use runjournal::resolve::ListOptions;
use runjournal::show::{self, Cell, RunView};
use runjournal::store::ReadHome;
use runjournal::{Home, RunId, RunState, RunStatus};

use crate::launch::exit_code_of;
use crate::{
    CliResult, EXIT_WAIT_TIMEOUT, Failure, ForReading, Named, bad_input, check_run_text, note,
    open_for_reading, print, print_line, reconcile_before_reading, report_reconciled, resolve,
    resolve_named,
};
use runjournal::journal::Tombstone;
use runjournal::json::{
    CapacityDoc, DependenciesDoc, EnvironmentDoc, ListedDoc, ListedRunDoc, PrunedRunDoc,
    QueueUseDoc, StatusCommandDoc,
};

/// The longest `logs --follow` sleeps between two looks for new output; a watch of the run's
/// directory wakes it sooner when a file there is written.
const LOGS_POLL_INTERVAL: Duration = Duration::from_millis(200);

fn read_state(store: &dyn ReadHome, run: RunId) -> Result<RunState, Failure> {
    store
        .view()
        .and_then(|view| view.snapshot(run))
        .context("reading the run")?
        .ok_or_else(|| bad_input(format!("run {run} is not in the journal")))
}

/// The run's tombstone when this command's own retention pass (or another process's) pruned it
/// after it was named: an ended run may go at any pass.
fn pruned_since(store: &dyn ReadHome, run: RunId) -> Result<Option<Tombstone>, Failure> {
    let view = store.view().context("reading the journal")?;
    if view.snapshot(run).context("reading the run")?.is_some() {
        return Ok(None);
    }
    Ok(view.tombstone(run).context("reading the run")?)
}

/// `wait` of a pruned run: it ended long ago, so the wait is over, with the run's own exit code.
fn wait_pruned(tombstone: &Tombstone) -> CliResult {
    print_line(&show::pruned_line(tombstone))?;
    let code = tombstone.exit_code.rem_euclid(256);
    Ok(ExitCode::from(
        u8::try_from(code).unwrap_or(crate::EXIT_ERROR),
    ))
}

/// What `status` shows of a run beside its state, read in one view of the journal.
struct Beside {
    shipping_lag: Option<runjournal::ship::state::Lag>,
    links: runjournal::journal::ResumeLinks,
    environment: Option<EnvironmentDoc>,
    hooks: Vec<runjournal::hooks::HookReport>,
    dependencies: Option<DependenciesDoc>,
}

fn beside(store: &ForReading, state: &RunState, show_env: bool) -> anyhow::Result<Beside> {
    let home = store.home();
    let run = state.run_id;
    let view = store.view().context("reading the journal")?;
    let waiting_for = view
        .waiting_for(state)
        .context("reading the run's dependencies")?;
    let environment = view
        .run_env(run)
        .context("reading the run's environment")?
        .map(|environment| EnvironmentDoc::of(&environment, show_env));
    Ok(Beside {
        shipping_lag: show::shipping_lag(home, &view),
        links: view.resume_links(run).context("reading the run's links")?,
        environment,
        hooks: runjournal::hooks::hooks_of(home, &view, run).context("reading the run's hooks")?,
        dependencies: DependenciesDoc::of(state, &waiting_for),
    })
}

/// `runjournal status RUN [--json] [--show-env]`.
pub fn status(home: Home, text: &str, json: bool, show_env: bool) -> CliResult {
    check_run_text(text)?;
    let store = open_for_reading(home)?;
    let run = match resolve_named(&store, text)? {
        Named::Run(run) => run,
        Named::Pruned(tombstone) => return pruned_status(&tombstone, json),
    };
    reconcile_before_reading(&store);
    let state = match pruned_since(&store, run)? {
        Some(tombstone) => return pruned_status(&tombstone, json),
        None => read_state(&store, run)?,
    };
    let home = store.home();
    let Beside {
        shipping_lag,
        links,
        environment,
        hooks,
        dependencies,
    } = beside(&store, &state, show_env)?;
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
    let queue_use = QueueUseDoc::of(&store, &state).context("reading the run's queue")?;
    if json {
        let mut document = documents::status_doc(home, &state, &links);
        document.runner_heard_at = heard_at;
        let value = StatusCommandDoc {
            status: document,
            journal_capacity: CapacityDoc::of(home),
            resources,
            shipping: shipping_lag,
            queue_use: queue_use.clone(),
            environment,
            hooks,
            dependencies,
            delay: runjournal::json::DelayDoc::of(&state),
        };
        let text = serde_json::to_string_pretty(&value).context("rendering the status")?;
        return print_line(&text).map(|()| ExitCode::SUCCESS);
    }
    let mut view = RunView::of(&state, show::look_at_runner(&state));
    add_live_fields(
        &mut view,
        queue_use.as_ref(),
        &links,
        heard_at,
        resources.as_deref(),
    );
    for (label, path) in [
        ("status", home.status_path(run)),
        ("result", home.result_path(run)),
        ("output", home.run_dir(run)),
    ] {
        view.fields
            .push((label.to_string(), Cell::plain(path.display().to_string())));
    }
    add_kept_fields(
        &mut view,
        environment.as_ref(),
        &hooks,
        dependencies.as_ref(),
    );
    let mut text = view.lines(&show::no_colour).join("\n");
    text.push('\n');
    if let Some(values) = environment.as_ref().and_then(|doc| doc.values.as_ref()) {
        for variable in values {
            text.push_str(&format!(
                "  {}={}\n",
                show::escape_control(&variable.name),
                show::escape_control(&variable.value)
            ));
        }
    }
    let notices = show::capacity_notice(home, runjournal::event::now_ms())
        .into_iter()
        .chain(runjournal::retention::space_notices(&store))
        .chain(shipping_lag.map(|lag| lag.line()));
    for notice in notices {
        text.push_str(&notice);
        text.push('\n');
    }
    print(&text)?;
    Ok(ExitCode::SUCCESS)
}

/// The fields of `status` on what the run keeps in the home only: its environment (its size;
/// the values are printed apart, and only when asked) and its hooks' deliveries; and the runs
/// it waits for.
fn add_kept_fields(
    view: &mut RunView,
    environment: Option<&EnvironmentDoc>,
    hooks: &[runjournal::hooks::HookReport],
    dependencies: Option<&DependenciesDoc>,
) {
    if let Some(dependencies) = dependencies {
        view.fields.push((
            "after".to_string(),
            Cell::plain(show::dependencies_line(
                &dependencies.after,
                &dependencies.after_any,
                &dependencies.waiting_for,
            )),
        ));
    }
    if let Some(environment) = environment {
        view.fields.push((
            "env".to_string(),
            Cell::plain(show::environment_summary(
                environment.variables,
                environment.umask.as_deref(),
                environment.values.is_some(),
            )),
        ));
    }
    if !hooks.is_empty() {
        view.fields.push((
            "hooks".to_string(),
            Cell::plain(show::hooks_summary(
                hooks.iter().map(|hook| hook.status.as_str()),
            )),
        ));
    }
}

/// The fields of `status` beyond the run's own state: its queue's use, its resume links, the
/// runner's last heartbeat and what its steps' processes use now.
fn add_live_fields(
    view: &mut RunView,
    queue_use: Option<&QueueUseDoc>,
    links: &runjournal::journal::ResumeLinks,
    heard_at: Option<runjournal::event::UnixMs>,
    resources: Option<&[show::StepResources]>,
) {
    if let Some(queue) = queue_use {
        view.fields
            .push(("queue".to_string(), Cell::plain(queue.line())));
    }
    for (label, link) in [
        ("resumed from", links.resumed_from),
        ("resumed by", links.resumed_by),
    ] {
        if let Some(link) = link {
            view.fields
                .push((label.to_string(), Cell::plain(link.to_string())));
        }
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
    for step in resources.into_iter().flatten() {
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
}

/// `status` of a pruned run: what its tombstone says.
fn pruned_status(tombstone: &Tombstone, json: bool) -> CliResult {
    if json {
        let text = serde_json::to_string_pretty(&PrunedRunDoc::of(tombstone))
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
    let store = open_for_reading(home)?;
    reconcile_before_reading(&store);
    let view = store.view().context("reading the journal")?;
    let listed = runjournal::resolve::listed(
        &view,
        ListOptions {
            all,
            state: state_filter,
        },
    )
    .context("listing runs")?;
    let place_of = |state: &RunState| listed.place_of(state);
    let (states, pruned, queues) = (&listed.runs, &listed.pruned, &listed.queues);
    let notices: Vec<String> = show::capacity_notice(store.home(), runjournal::event::now_ms())
        .into_iter()
        .chain(runjournal::retention::space_notices(&store))
        .chain(show::shipping_lag(store.home(), &view).map(|lag| lag.line()))
        .collect();
    drop(view);
    let now_ms = runjournal::event::now_ms();
    if json {
        let rows: Vec<ListedDoc> = states
            .iter()
            .map(|state| {
                ListedDoc::Run(ListedRunDoc::of(
                    state,
                    place_of(state).map(|(_, place)| place),
                    listed.waiting_for(state),
                ))
            })
            .chain(
                pruned
                    .iter()
                    .map(|tombstone| ListedDoc::Pruned(PrunedRunDoc::of(tombstone))),
            )
            .collect();
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
        let waiting_for = |state: &RunState| listed.waiting_for(state).to_vec();
        let mut rows = list_rows(states, now_ms, &place_of, &waiting_for);
        rows.extend(pruned.iter().map(|tombstone| pruned_row(tombstone, now_ms)));
        for line in show::table_lines(&rows, &show::no_colour) {
            text.push_str(&line);
            text.push('\n');
        }
        for (name, (_, usage)) in queues {
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
    waiting_for: &dyn Fn(&RunState) -> Vec<runjournal::event::RunId>,
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
            Cell::plain(match (place_of(state), waiting_for(state), &state.delay) {
                (Some((queue, place)), _, _) => format!("queued ({queue} #{place})"),
                (None, pending, _) if !pending.is_empty() => format!(
                    "queued (after {})",
                    pending
                        .iter()
                        .map(|run| show::short_id(*run))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                (None, _, Some(delay)) if state.is_waiting_for_due() => format!(
                    "queued (due {})",
                    runjournal::duration::format_time_s(delay.due_at_ms)
                ),
                _ => state.status.as_str().to_string(),
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

/// `runjournal wait RUN [--timeout DURATION]`.
pub fn wait(home: Home, text: &str, timeout: Option<Duration>) -> CliResult {
    check_run_text(text)?;
    let store = open_for_reading(home)?;
    let run = match resolve_named(&store, text)? {
        Named::Run(run) => run,
        Named::Pruned(tombstone) => return wait_pruned(&tombstone),
    };
    reconcile_before_reading(&store);
    if let Some(tombstone) = pruned_since(&store, run)? {
        return wait_pruned(&tombstone);
    }
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
    // It makes no pass before it reads: read-only from the start, as the store only when the
    // journal cannot be opened so (a journal that needs the repair a writer's open makes).
    let store: Box<dyn ReadHome> = match runjournal::store::ReadOnlyHome::open(home.clone()) {
        Ok(reader) => Box::new(reader),
        Err(_) => Box::new(open_for_reading(home)?),
    };
    let store = store.as_ref();
    let run = resolve(store, text)?;
    let state = read_state(store, run)?;
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
    let mut output = crate::output::StepOutput::new(&state, steps);
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
        let is_over = !follow || read_state(store, run)?.is_terminal();
        output.show_new(store.home(), &mut out)?;
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
