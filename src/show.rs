//! What people read about runs, shared by both binaries: one table printer, one view of a
//! run's state (`runjournal status`, `journal-tools inspect run`, local or of the fleet), one
//! runs table and one log line (a local journal's, or the fleet's with host and journal
//! columns), one line per journaled transition (`runjournal run --wait`), an event's fields as
//! text, and what to say about a full disk and about shipping. Text is returned, never
//! printed: the binaries write it (and handle a closed pipe), and decide whether a [`Tone`]
//! becomes a colour.
//!
//! Text that came from a run, a provider or a file (a run's name, a step's command, a
//! provider's message, an error, a log's tail) reaches a terminal only through
//! [`escape_control`]: the table printer escapes every cell, and the lines made here are escaped
//! before they are returned. JSON is left to serde, which escapes control characters its own
//! way.
//!
//! Invariant: pure, apart from [`look_at_runner`], [`capacity_notice`] and
//! [`shipping_lag`], which say so; the same state renders the same lines.
//! Invariant: no line returned here holds a control character of the run's, a provider's or a
//! file's text (a colour a binary paints around a span is its own).

use std::fmt::Write as _;

use serde_json::Value;

use crate::capacity::BlockCause;
use crate::duration::{format_duration_ms, format_time_ms, format_time_s};
use crate::event::RunId;
use crate::event::{Event, Mode, Record, RunSpec, StepEnd, UnixMs};
use crate::exit::describe_exit;
use crate::home::Home;
use crate::journal::View;
use crate::liveness::{self, Liveness};
#[cfg(feature = "ship")]
use crate::ship::fleet::FleetRun;
use crate::ship::state::{Lag, ShipState};
use crate::state::{RunState, RunStatus};
use crate::verify::Severity;

pub use crate::text::escape_control;

/// What a piece of text means, for a binary that colours it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tone {
    /// Going on (a running run).
    Active,
    Good,
    Bad,
    Warning,
    /// Worth less attention (a note).
    Quiet,
}

impl Tone {
    pub fn of_status(status: RunStatus) -> Option<Tone> {
        match status {
            RunStatus::Queued => None,
            RunStatus::Running => Some(Tone::Active),
            RunStatus::Complete => Some(Tone::Good),
            RunStatus::Failed => Some(Tone::Bad),
            RunStatus::Stopped | RunStatus::Paused => Some(Tone::Warning),
        }
    }

    pub fn of_severity(severity: Severity) -> Tone {
        match severity {
            Severity::Damaged | Severity::Unchecked => Tone::Bad,
            Severity::Inconsistent => Tone::Warning,
            Severity::Note => Tone::Quiet,
        }
    }
}

/// Text in one tone (or none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Span {
    pub text: String,
    pub tone: Option<Tone>,
}

/// One cell of a table: spans, so that part of a cell may be coloured.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cell {
    pub spans: Vec<Span>,
}

impl Cell {
    /// A cell without tone.
    pub fn plain(text: impl Into<String>) -> Cell {
        Cell {
            spans: vec![Span {
                text: text.into(),
                tone: None,
            }],
        }
    }

    /// A cell in a tone (none for `None`).
    pub fn toned(text: impl Into<String>, tone: Option<Tone>) -> Cell {
        Cell {
            spans: vec![Span {
                text: text.into(),
                tone,
            }],
        }
    }

    /// This cell followed by untoned text.
    pub fn then(mut self, text: impl Into<String>) -> Cell {
        self.spans.push(Span {
            text: text.into(),
            tone: None,
        });
        self
    }

    /// The text without tones.
    pub fn text(&self) -> String {
        self.spans.iter().map(|span| span.text.as_str()).collect()
    }

    /// The width of the cell as printed: of its text escaped.
    fn width(&self) -> usize {
        self.spans
            .iter()
            .map(|span| escape_control(&span.text).chars().count())
            .sum()
    }

    /// The cell as printed: each span's text escaped ([`escape_control`]), then painted.
    fn render(&self, paint: &impl Fn(&str, Tone) -> String) -> String {
        self.spans
            .iter()
            .map(|span| {
                let text = escape_control(&span.text);
                match span.tone {
                    Some(tone) => paint(&text, tone),
                    None => text.into_owned(),
                }
            })
            .collect()
    }
}

impl From<&str> for Cell {
    fn from(text: &str) -> Cell {
        Cell::plain(text)
    }
}

impl From<String> for Cell {
    fn from(text: String) -> Cell {
        Cell::plain(text)
    }
}

/// A header row of plain cells.
pub fn header(labels: &[&str]) -> Vec<Cell> {
    labels.iter().map(|label| Cell::plain(*label)).collect()
}

/// The one table printer: left-aligned columns, each padded to its widest cell plus two
/// spaces (the last cell of a row is not padded), trailing spaces trimmed. Every cell's text is
/// escaped ([`escape_control`]) before `paint` colours it. Widths count the escaped text, not
/// what `paint` adds around a toned span (colour codes).
pub fn table_lines(rows: &[Vec<Cell>], paint: &impl Fn(&str, Tone) -> String) -> Vec<String> {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|column| {
            rows.iter()
                .filter_map(|row| row.get(column))
                .map(Cell::width)
                .max()
                .unwrap_or(0)
        })
        .collect();
    rows.iter()
        .map(|row| {
            let mut line = String::new();
            for (column, cell) in row.iter().enumerate() {
                line.push_str(&cell.render(paint));
                if column + 1 < row.len() {
                    let pad = widths[column].saturating_sub(cell.width()) + 2;
                    line.push_str(&" ".repeat(pad));
                }
            }
            line.truncate(line.trim_end().len());
            line
        })
        .collect()
}

/// A `paint` that ignores tones: plain text.
pub fn no_colour(text: &str, _tone: Tone) -> String {
    text.to_string()
}

/// `1 run`, `2 runs`.
pub fn plural(count: u64, noun: &str) -> String {
    if count == 1 {
        format!("{count} {noun}")
    } else {
        format!("{count} {noun}s")
    }
}

/// The counts that are not zero, as "2 missing, 1 extra"; `none` when all are zero.
pub fn counted<T: std::fmt::Display>(
    counts: impl IntoIterator<Item = (usize, T)>,
    none: &str,
) -> String {
    let found: Vec<String> = counts
        .into_iter()
        .filter(|(count, _)| *count > 0)
        .map(|(count, what)| format!("{count} {what}"))
        .collect();
    if found.is_empty() {
        none.to_string()
    } else {
        found.join(", ")
    }
}

/// The name serde gives a value (an enum's wire name, say), without quotes.
pub fn wire_name<T: serde::Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(Value::String(name)) => name,
        Ok(other) => other.to_string(),
        Err(_) => "?".to_string(),
    }
}

/// `value` with every object key in camelCase (`head_seq` becomes `headSeq`; keys already in
/// camelCase stay), so that JSON made from a domain type reads like the projections.
pub fn camel_case_keys(value: Value) -> Value {
    match value {
        Value::Object(object) => Value::Object(
            object
                .into_iter()
                .map(|(key, value)| (camel_case(&key), camel_case_keys(value)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(camel_case_keys).collect()),
        other => other,
    }
}

fn camel_case(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    let mut is_word_start = false;
    for c in key.chars() {
        if c == '_' && !out.is_empty() {
            is_word_start = true;
        } else if is_word_start {
            out.extend(c.to_uppercase());
            is_word_start = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// What is known of a run's runner process now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunnerSeen {
    Alive,
    Dead,
    /// Recorded in an earlier boot: gone.
    OtherBoot,
    /// Recorded in another PID namespace: neither seen alive nor gone from here.
    OtherNamespace,
    /// It could not be looked at.
    Unknown,
    /// A run of another host (read from the fleet): its pid means nothing here, so it is
    /// not looked at.
    OnItsHost,
    /// A run of another host that has sent no heartbeat since `since_ms`. Only that host's
    /// own reconciler closes the run.
    HostSilent {
        since_ms: UnixMs,
    },
}

impl RunnerSeen {
    pub fn as_str(self) -> &'static str {
        match self {
            RunnerSeen::Alive => "alive",
            RunnerSeen::Dead => "dead",
            RunnerSeen::OtherBoot => "dead (other boot)",
            RunnerSeen::OtherNamespace => "unknown (other PID namespace)",
            RunnerSeen::Unknown => "unknown",
            RunnerSeen::OnItsHost => "on its host",
            RunnerSeen::HostSilent { .. } => "host silent",
        }
    }

    /// [`as_str`](Self::as_str), with since when a host is silent.
    pub fn text(self) -> String {
        match self {
            RunnerSeen::HostSilent { since_ms } => {
                format!("host silent since {}", format_time_s(since_ms))
            }
            other => other.as_str().to_string(),
        }
    }
}

/// Looks at the run's recorded runner by its full identity (reads the process table); `None`
/// when no runner took the run.
pub fn look_at_runner(state: &RunState) -> Option<RunnerSeen> {
    let runner = state.runner.as_ref()?;
    Some(match liveness::check(&runner.identity) {
        Ok(Liveness::Alive) => RunnerSeen::Alive,
        Ok(Liveness::Dead) => RunnerSeen::Dead,
        Ok(Liveness::OtherBoot) => RunnerSeen::OtherBoot,
        Ok(Liveness::OtherNamespace) => RunnerSeen::OtherNamespace,
        Err(_) => RunnerSeen::Unknown,
    })
}

/// What one running step's processes use now: its process group and their descendants.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StepResources {
    pub step: usize,
    /// The step's process group (its leader's pid).
    pub process_group: u32,
    #[serde(flatten)]
    pub usage: crate::platform::resources::Usage,
}

/// Looks at every running step of a live run whose leader is alive by its recorded identity
/// (reads the process table, blocking about 200 ms to measure CPU); empty for a run with no
/// running step. Nothing is journaled.
pub fn look_at_resources(state: &RunState) -> std::io::Result<Vec<StepResources>> {
    let leaders: Vec<(usize, u32)> = state
        .steps
        .iter()
        .enumerate()
        .filter(|(_, step)| step.status == crate::state::StepStatus::Running)
        .filter_map(|(index, step)| {
            let process = step.process.as_ref()?;
            // A pid recycled by a stranger is not the step's.
            matches!(liveness::check(process), Ok(Liveness::Alive)).then_some((index, process.pid))
        })
        .collect();
    if leaders.is_empty() {
        return Ok(Vec::new());
    }
    let table = crate::platform::resources::ProcessTable::look()?;
    let mut out = Vec::with_capacity(leaders.len());
    for (step, leader) in leaders {
        let members: Vec<u32> = crate::platform::group_members(leader)?
            .into_iter()
            .filter(crate::platform::ProcessInfo::is_alive)
            .map(|member| member.pid)
            .collect();
        out.push(StepResources {
            step,
            process_group: leader,
            usage: table.usage_of(&members),
        });
    }
    Ok(out)
}

pub use crate::text::format_bytes;

/// `yes`, `stale` or `no`: whether the run is closed.
pub fn closed_text(state: &RunState) -> &'static str {
    closed_word(state.is_closed(), state.is_stale())
}

fn closed_word(is_closed: bool, is_stale: bool) -> &'static str {
    if is_closed {
        "yes"
    } else if is_stale {
        "stale"
    } else {
        "no"
    }
}

/// Where a run of the fleet comes from: its host and its journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub host_name: String,
    /// 32 hex digits.
    pub journal_id: String,
}

impl Origin {
    /// The first characters of the journal id: enough to tell a fleet's journals apart in a
    /// table (JSON carries the whole id).
    pub fn short_journal(&self) -> &str {
        self.journal_id.get(..8).unwrap_or(&self.journal_id)
    }
}

/// One run as a row of the runs table (`journal-tools inspect runs`), from a local journal or
/// from the fleet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunRow {
    /// `Some` for a run of the fleet: the table then has HOST and JOURNAL columns.
    pub origin: Option<Origin>,
    pub run_id: RunId,
    pub name: Option<String>,
    pub status: RunStatus,
    pub is_closed: bool,
    pub is_stale: bool,
    pub steps_done: u64,
    pub steps_total: u64,
    pub created_at_ms: UnixMs,
    pub ended_at_ms: Option<UnixMs>,
    pub head_seq: u64,
    pub runner_pid: Option<u32>,
    pub runner: Option<RunnerSeen>,
}

impl RunRow {
    /// A run of the local journal; `runner` is what [`look_at_runner`] saw.
    pub fn of(state: &RunState, runner: Option<RunnerSeen>) -> RunRow {
        RunRow {
            origin: None,
            run_id: state.run_id,
            name: state.spec.name.clone(),
            status: state.status,
            is_closed: state.is_closed(),
            is_stale: state.is_stale(),
            steps_done: state.steps_done() as u64,
            steps_total: state.steps.len() as u64,
            created_at_ms: state.created_at_ms,
            ended_at_ms: state.ended_at_ms(),
            head_seq: state.head_seq,
            runner_pid: state.runner.as_ref().map(|runner| runner.identity.pid),
            runner,
        }
    }

    /// A run of the fleet; `silent_since_ms` is [`FleetRun::host_silent_since`].
    #[cfg(feature = "ship")]
    pub fn of_shipped(run: &FleetRun, silent_since_ms: Option<UnixMs>) -> RunRow {
        RunRow {
            origin: Some(Origin {
                host_name: run.host_name.clone(),
                journal_id: run.journal_id.clone(),
            }),
            run_id: run.run_id,
            name: run.name.clone(),
            status: run.state,
            is_closed: run.is_closed,
            is_stale: run.is_stale,
            steps_done: u64::from(run.steps_done),
            steps_total: u64::from(run.steps_total),
            created_at_ms: run.created_at_ms,
            ended_at_ms: run.ended_at_ms,
            head_seq: run.head_seq,
            runner_pid: run.runner_pid,
            runner: Some(shipped_runner(silent_since_ms)),
        }
    }

    fn runner_text(&self) -> String {
        match (self.runner_pid, self.runner) {
            (Some(pid), Some(seen)) => format!("{pid} {}", seen.text()),
            // A silent host is said even of a run no runner has taken yet.
            (None, Some(seen @ RunnerSeen::HostSilent { .. })) => seen.text(),
            (Some(pid), None) => pid.to_string(),
            (None, _) => "-".to_string(),
        }
    }
}

/// What is known of the runner of a run of another host.
fn shipped_runner(silent_since_ms: Option<UnixMs>) -> RunnerSeen {
    match silent_since_ms {
        Some(since_ms) => RunnerSeen::HostSilent { since_ms },
        None => RunnerSeen::OnItsHost,
    }
}

/// The runs table, its header first; HOST and JOURNAL columns come first when the rows are
/// the fleet's.
pub fn runs_table(runs: &[RunRow]) -> Vec<Vec<Cell>> {
    let has_origin = runs.iter().any(|run| run.origin.is_some());
    let mut labels = Vec::new();
    if has_origin {
        labels.extend(["HOST", "JOURNAL"]);
    }
    labels.extend([
        "RUN", "NAME", "STATE", "CLOSED", "STEPS", "STARTED", "ENDED", "HEAD", "RUNNER",
    ]);
    let mut rows = vec![header(&labels)];
    for run in runs {
        let mut row = Vec::new();
        if has_origin {
            let (host, journal) = run.origin.as_ref().map_or(("-", "-"), |origin| {
                (origin.host_name.as_str(), origin.short_journal())
            });
            row.extend([Cell::plain(host), Cell::plain(journal)]);
        }
        row.extend([
            Cell::plain(run.run_id.to_string()),
            Cell::plain(run.name.clone().unwrap_or_else(|| "-".to_string())),
            Cell::toned(run.status.as_str(), Tone::of_status(run.status)),
            Cell::plain(closed_word(run.is_closed, run.is_stale)),
            Cell::plain(format!("{}/{}", run.steps_done, run.steps_total)),
            Cell::plain(format_time_s(run.created_at_ms)),
            Cell::plain(time_or_dash(run.ended_at_ms)),
            Cell::plain(run.head_seq.to_string()),
            Cell::toned(
                run.runner_text(),
                matches!(run.runner, Some(RunnerSeen::HostSilent { .. })).then_some(Tone::Warning),
            ),
        ]);
        rows.push(row);
    }
    rows
}

/// A run's state for people: labelled fields, then its steps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunView {
    /// `(label, value)`, in the order shown.
    pub fields: Vec<(String, Cell)>,
    /// The steps table, its header first.
    pub steps: Vec<Vec<Cell>>,
}

impl RunView {
    /// The view of `state`; `runner` is what [`look_at_runner`] saw.
    pub fn of(state: &RunState, runner: Option<RunnerSeen>) -> RunView {
        RunView {
            fields: state_fields(state, runner),
            steps: step_rows(state),
        }
    }

    /// The view of `state` as shipped by another host (`journal-tools --from`): its host and
    /// journal first, and its runner not looked at here; `silent_since_ms` is
    /// `FleetRun::host_silent_since`.
    pub fn of_shipped(
        state: &RunState,
        origin: &Origin,
        silent_since_ms: Option<UnixMs>,
    ) -> RunView {
        let mut view = RunView::of(state, Some(shipped_runner(silent_since_ms)));
        let mut fields = vec![
            ("host".to_string(), Cell::plain(origin.host_name.clone())),
            (
                "journal".to_string(),
                Cell::plain(origin.journal_id.clone()),
            ),
        ];
        if let Some(since_ms) = silent_since_ms {
            fields.push((
                "silent".to_string(),
                Cell::toned(
                    format!(
                        "host silent since {} (only its own reconciler closes this run)",
                        format_time_s(since_ms)
                    ),
                    Some(Tone::Warning),
                ),
            ));
        }
        fields.append(&mut view.fields);
        view.fields = fields;
        view
    }

    /// The fields, a blank line, `steps`, and the steps table indented by two spaces.
    pub fn lines(&self, paint: &impl Fn(&str, Tone) -> String) -> Vec<String> {
        let fields: Vec<Vec<Cell>> = self
            .fields
            .iter()
            .map(|(label, value)| vec![Cell::plain(label.as_str()), value.clone()])
            .collect();
        let mut lines = table_lines(&fields, paint);
        lines.push(String::new());
        lines.push("steps".to_string());
        lines.extend(
            table_lines(&self.steps, paint)
                .into_iter()
                .map(|line| format!("  {line}")),
        );
        lines
    }
}

/// A retried run's attempt (`2 of 3`) and how each attempt before it ended: `None` for a run
/// without retries.
pub fn attempts_text(state: &RunState) -> Option<String> {
    let retry = state.retry.as_ref()?;
    let mut text = format!(
        "{} of {}",
        retry.current_attempt(),
        retry.retries.saturating_add(1)
    );
    for attempt in &retry.attempts {
        let _ = write!(
            text,
            "; attempt {} failed ({}, exit {}) at {}",
            attempt.attempt,
            attempt.cause.as_str(),
            attempt.exit_code,
            format_time_ms(attempt.ended_at_ms)
        );
    }
    Some(text)
}

/// A delayed run's due time, and whether its delay ended: `None` for a run not delayed.
fn due_text(state: &RunState) -> Option<String> {
    let delay = state.delay.as_ref()?;
    let started = match &delay.ended {
        Some(ended) => format!(", started {} by {}", format_time_ms(ended.at_ms), ended.by),
        None if state.is_terminal() => ", never started".to_string(),
        None => ", waiting".to_string(),
    };
    Some(format!("{}{started}", format_time_ms(delay.due_at_ms)))
}

fn state_fields(state: &RunState, runner: Option<RunnerSeen>) -> Vec<(String, Cell)> {
    let mut fields: Vec<(String, Cell)> = Vec::new();
    let mut field = |label: &str, value: Cell| fields.push((label.to_string(), value));
    field("run", Cell::plain(state.run_id.to_string()));
    if let Some(name) = &state.spec.name {
        field("name", Cell::plain(name.clone()));
    }
    field("mode", Cell::plain(mode_text(&state.spec)));
    let closed = if state.is_closed() {
        " (closed)"
    } else if state.is_stale() {
        " (stale: its runner is gone, no outcome recorded)"
    } else {
        ""
    };
    let mut status = Cell::toned(state.status.as_str(), Tone::of_status(state.status)).then(closed);
    if state.dismissed_at_ms.is_some() {
        status = status.then(", dismissed");
    }
    field("state", status);
    field("created", Cell::plain(format_time_ms(state.created_at_ms)));
    for (label, value) in [
        ("due", due_text(state)),
        ("attempt", attempts_text(state)),
        ("session", state.session_id.clone()),
        ("owner", state.completion_owner_id.clone()),
        ("tool call", state.tool_call_id.clone()),
    ] {
        if let Some(value) = value {
            field(label, Cell::plain(value));
        }
    }
    if let Some(info) = &state.runner {
        let seen = runner.unwrap_or(RunnerSeen::Unknown).text();
        field(
            "runner",
            Cell::plain(format!(
                "pid {}, {seen}, instance {}, started {}",
                info.identity.pid,
                info.instance_id,
                format_time_ms(info.started_at_ms)
            )),
        );
    }
    for control in &state.controls {
        field(
            "control",
            Cell::plain(format!(
                "{} by {} at {}: {}",
                control.action.as_str(),
                control.by,
                format_time_ms(control.at_ms),
                control.reason
            )),
        );
    }
    if let Some(terminal) = &state.terminal {
        let mut text = format!(
            "{} (exit {}) at {}, summary {:?}",
            terminal.state.as_str(),
            terminal.exit_code,
            format_time_ms(terminal.at_ms),
            terminal.summary
        );
        if let Some(error) = &terminal.error {
            let _ = write!(text, ", error {error:?}");
        }
        if let Some(repairer) = terminal.repaired_by {
            let _ = write!(text, ", repaired by {}", wire_name(&repairer));
        }
        field("ended", Cell::plain(text));
    }
    if let Some(observed) = &state.process_terminal {
        let exit = observed
            .exit
            .map(|exit| format!(", {}", describe_exit(exit)))
            .unwrap_or_default();
        field(
            "process",
            Cell::plain(format!(
                "{} by {} at {}{exit}",
                observed.proof.as_str(),
                wire_name(&observed.observer),
                format_time_ms(observed.at_ms)
            )),
        );
    }
    if let Some(at) = state.dismissed_at_ms {
        field("dismissed", Cell::plain(format_time_ms(at)));
    }
    field(
        "head",
        Cell::plain(format!(
            "seq {}, updated {}",
            state.head_seq,
            format_time_ms(state.updated_at_ms)
        )),
    );
    fields
}

/// `chain, 3 steps`, with the concurrency of a parallel run and the timeout when there is one.
fn mode_text(spec: &RunSpec) -> String {
    let mut text = format!(
        "{}, {}",
        spec.mode.as_str(),
        plural(spec.steps.len() as u64, "step")
    );
    if spec.mode == Mode::Parallel {
        let _ = write!(text, ", concurrency {}", spec.concurrency);
    }
    if let Some(timeout_ms) = spec.timeout_ms {
        let _ = write!(text, ", timeout {}", format_duration_ms(timeout_ms));
    }
    text
}

fn step_rows(state: &RunState) -> Vec<Vec<Cell>> {
    let mut rows = vec![header(&[
        "#", "NAME", "STATUS", "STARTED", "ENDED", "EXIT", "DETAIL",
    ])];
    for (index, (spec, step)) in state.spec.steps.iter().zip(&state.steps).enumerate() {
        let mut detail = Vec::new();
        if let Some(job) = &step.job {
            detail.push(format!("job {}", job.state.as_str()));
            if let Some(id) = &job.id {
                detail.push(format!("id {id}"));
            }
            if let Some(progress) = job.progress {
                detail.push(format!("progress {progress}"));
            }
            if let Some(message) = &job.message {
                detail.push(format!("{message:?}"));
            }
        }
        if let Some(error) = &step.error {
            detail.push(format!("error {error:?}"));
        }
        let time = |ms: Option<UnixMs>| ms.map_or_else(|| "-".to_string(), format_time_ms);
        rows.push(vec![
            Cell::plain(index.to_string()),
            Cell::plain(spec.name.clone()),
            Cell::plain(step.status.as_str()),
            Cell::plain(time(step.started_at_ms)),
            Cell::plain(time(step.ended_at_ms)),
            Cell::plain(
                step.exit_code
                    .map_or_else(|| "-".to_string(), |code| code.to_string()),
            ),
            Cell::plain(detail.join(", ")),
        ]);
    }
    rows
}

/// A record's event fields, as JSON (camelCase, as in events.jsonl).
pub fn event_fields(event: &Event) -> serde_json::Map<String, Value> {
    match serde_json::to_value(event) {
        Ok(Value::Object(mut tagged)) => match tagged.remove(event.name()) {
            Some(Value::Object(fields)) => fields,
            _ => serde_json::Map::new(),
        },
        _ => serde_json::Map::new(),
    }
}

/// `key=value ...` of an event's fields that are set.
pub fn event_fields_text(event: &Event) -> String {
    let text = event_fields(event)
        .iter()
        .filter(|(_, value)| !value.is_null())
        .map(|(key, value)| format!("{key}={value}"))
        .collect::<Vec<_>>()
        .join(" ");
    escape_control(&text).into_owned()
}

/// A run's records as a table: seq, time, writer, event and its fields.
pub fn timeline_rows(records: &[Record]) -> Vec<Vec<Cell>> {
    let mut rows = vec![header(&["SEQ", "TIME", "WRITER", "EVENT"])];
    for record in records {
        rows.push(vec![
            Cell::plain(record.seq.to_string()),
            Cell::plain(format_time_ms(record.time_ms)),
            Cell::plain(format!("{}/{}", record.writer, record.writer_seq)),
            Cell::plain(
                format!(
                    "{} {}",
                    record.event.name(),
                    event_fields_text(&record.event)
                )
                .trim_end()
                .to_string(),
            ),
        ]);
    }
    rows
}

/// One line of the global log (`journal-tools inspect events`), a local journal's or the
/// fleet's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEntry<'a> {
    /// `Some` for the fleet: the line starts with host and journal.
    pub origin: Option<&'a Origin>,
    /// The record's place in its journal's log: the cursor to resume after.
    pub global_seq: u64,
    pub time_ms: UnixMs,
    pub run: String,
    pub seq: u64,
    pub event: &'a str,
    /// The event's fields ([`event_fields_text`]), or why there are none to show.
    pub fields: String,
}

impl<'a> LogEntry<'a> {
    /// The entry of a record at `global_seq`.
    pub fn of(origin: Option<&'a Origin>, global_seq: u64, record: &'a Record) -> LogEntry<'a> {
        LogEntry {
            origin,
            global_seq,
            time_ms: record.time_ms,
            run: record.run_id.to_string(),
            seq: record.seq,
            event: record.event.name(),
            fields: event_fields_text(&record.event),
        }
    }

    /// `[host  journal  ]global  time  run  seq  event fields`.
    pub fn line(&self) -> String {
        let origin = self.origin.map_or_else(String::new, |origin| {
            format!("{}  {}  ", origin.host_name, origin.short_journal())
        });
        let line = format!(
            "{origin}{:>6}  {}  {}  {:>4}  {} {}",
            self.global_seq,
            format_time_ms(self.time_ms),
            self.run,
            self.seq,
            self.event,
            self.fields
        );
        // Fields, a host's name: text of a run or of another machine.
        escape_control(line.trim_end()).into_owned()
    }
}

fn step_label(spec: &RunSpec, step: u32) -> String {
    match spec.steps.get(step as usize) {
        Some(step_spec) => format!("step {step} ({})", step_spec.name),
        None => format!("step {step}"),
    }
}

/// `status`'s line on a run's kept environment: its size and umask, and how to see it.
pub fn environment_summary(variables: usize, umask: Option<&str>, is_shown: bool) -> String {
    let mut text = plural(variables as u64, "variable");
    if let Some(umask) = umask {
        let _ = write!(text, ", umask {umask}");
    }
    if !is_shown {
        text.push_str(" (shown with --show-env)");
    }
    text
}

/// `status`'s line on a run's hooks: how many are in each state (`2 delivered, 1 pending`).
pub fn hooks_summary<'a>(statuses: impl Iterator<Item = &'a str>) -> String {
    let mut counts: Vec<(&str, u64)> = Vec::new();
    for status in statuses {
        match counts.iter_mut().find(|(known, _)| *known == status) {
            Some((_, count)) => *count += 1,
            None => counts.push((status, 1)),
        }
    }
    counts
        .iter()
        .map(|(status, count)| format!("{count} {status}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What a hook's record says, for [`record_line`].
fn hook_record_text(event: &Event) -> String {
    match event {
        Event::HookAttempted {
            hook, attempt, by, ..
        } => format!("hook {hook}: attempt {attempt} by {by}"),
        Event::HookEnded {
            hook,
            attempt,
            outcome,
            retry_at_ms,
        } => {
            let next = match (outcome.is_delivered(), retry_at_ms) {
                (true, _) => String::new(),
                (false, Some(_)) => ", tried again later".to_string(),
                (false, None) => ", given up".to_string(),
            };
            format!(
                "hook {hook}: attempt {attempt} {}{next}",
                crate::exit::describe_hook_outcome(outcome)
            )
        }
        other => other.name().to_string(),
    }
}
/// What [`record_line`] says of the events a host's requests and repairs bring.
fn host_request_detail(event: &Event, spec: &RunSpec) -> String {
    match event {
        Event::SteerRequested {
            id,
            steps,
            mode,
            source,
            ..
        } => {
            let targets: Vec<String> = steps.iter().map(|step| step_label(spec, *step)).collect();
            format!(
                "{} {id} from {source} for {}",
                mode.as_str(),
                targets.join(", ")
            )
        }
        Event::SteerDelivered { id, step } => {
            format!("{} took steer request {id}", step_label(spec, *step))
        }
        Event::ControlRefused { file, reason } => {
            format!("control file {file} refused: {reason}")
        }
        Event::HostEnded { state, message, .. } => {
            format!("run {} by its host's repair: {message}", state.as_str())
        }
        Event::StepStopRequested { step, by, reason } => {
            format!(
                "stop of {} requested by {by}: {reason}",
                step_label(spec, *step)
            )
        }
        other => other.name().to_string(),
    }
}

/// One line per journaled transition, as `runjournal run --wait` prints them as they land.
pub fn record_line(record: &Record, spec: &RunSpec) -> String {
    let detail = match &record.event {
        Event::RunCreated { spec, .. } => format!(
            "created: {}, {}{}",
            spec.mode.as_str(),
            plural(spec.steps.len() as u64, "step"),
            spec.name
                .as_ref()
                .map(|name| format!(", name {name}"))
                .unwrap_or_default()
        ),
        Event::RunnerStarted { runner, .. } => format!("runner started (pid {})", runner.pid),
        Event::StepRunning { step, process } => format!(
            "{} running{}",
            step_label(spec, *step),
            process
                .as_ref()
                .map(|process| format!(" (pid {})", process.pid))
                .unwrap_or_default()
        ),
        Event::ExternalJobUpdated { step, job } => {
            let mut text = format!("{} job {}", step_label(spec, *step), job.state.as_str());
            if let Some(progress) = job.progress {
                let _ = write!(text, " {progress}");
            }
            if let Some(message) = &job.message {
                let _ = write!(text, ": {message}");
            }
            if let Some(url) = &job.url {
                let _ = write!(text, " <{url}>");
            }
            text
        }
        Event::StepFinished { step, outcome } => {
            let end = match outcome.end {
                StepEnd::Complete => "complete",
                StepEnd::Failed => "failed",
                StepEnd::Stopped => "stopped",
                StepEnd::Skipped => "skipped",
            };
            let mut text = format!("{} {end}", step_label(spec, *step));
            if let Some(code) = outcome.exit_code {
                let _ = write!(text, " (exit {code})");
            }
            if let Some(error) = &outcome.error {
                let _ = write!(text, ": {error}");
            }
            text
        }
        Event::ControlRequested { action, by, reason } => {
            format!("{} requested by {by}: {reason}", action.as_str())
        }
        Event::Terminal {
            state,
            error,
            exit_code,
            ..
        } => {
            let mut text = format!("run {} (exit {exit_code})", state.as_str());
            if let Some(error) = error {
                let _ = write!(text, ": {error}");
            }
            text
        }
        Event::ProcessTerminalObserved {
            exit,
            proof,
            observer,
            ..
        } => {
            let exit = crate::exit::describe_observed_exit(*exit);
            format!(
                "runner gone ({exit}; proof {}, seen by {})",
                proof.as_str(),
                wire_name(observer)
            )
        }
        Event::Dismissed { .. } => "dismissed".to_string(),
        Event::Resumed { from } => format!("resumes paused run {from}"),
        Event::UniqueKey { key, hold_ms } => unique_text(key, *hold_ms),
        Event::RetryPolicy { .. } | Event::AttemptEnded { .. } => retry_record_text(record),
        Event::QueueJoined { .. }
        | Event::QueueAdmitted { .. }
        | Event::DependsOn { .. }
        | Event::DependenciesMet { .. }
        | Event::StartDelayed { .. }
        | Event::DelayEnded { .. } => waiting_record_text(&record.event),
        Event::HookAttempted { .. } | Event::HookEnded { .. } => hook_record_text(&record.event),
        Event::SteerRequested { .. }
        | Event::SteerDelivered { .. }
        | Event::ControlRefused { .. }
        | Event::HostEnded { .. }
        | Event::StepStopRequested { .. } => host_request_detail(&record.event, spec),
    };
    format!(
        "#{} {}",
        record.seq,
        escape_control(&detail.replace('\n', " "))
    )
}

/// The words of a run's `RetryPolicy` and `AttemptEnded`.
fn retry_record_text(record: &Record) -> String {
    match &record.event {
        Event::RetryPolicy {
            retries,
            backoff_ms,
            backoff_max_ms,
            on,
            ..
        } => format!(
            "tried again up to {} on {} (backoff {}, at most {})",
            plural(u64::from(*retries), "time"),
            on.text(),
            crate::duration::format_duration_ms(*backoff_ms),
            crate::duration::format_duration_ms(*backoff_max_ms)
        ),
        Event::AttemptEnded {
            attempt,
            cause,
            exit_code,
            error,
            retry_at_ms,
            ..
        } => {
            let mut text = format!(
                "attempt {attempt} failed ({}, exit {exit_code})",
                cause.as_str()
            );
            if let Some(error) = error {
                let _ = write!(text, ": {error}");
            }
            let _ = write!(
                text,
                "; tried again in {}",
                crate::duration::format_duration_ms(retry_at_ms.saturating_sub(record.time_ms))
            );
            text
        }
        other => other.name().to_string(),
    }
}

/// The words of a run's `UniqueKey`.
fn unique_text(key: &str, hold_ms: Option<u64>) -> String {
    match hold_ms {
        Some(hold_ms) => format!(
            "holds the key {key:?} until it ends, and for {} after its creation",
            crate::duration::format_duration_ms(hold_ms)
        ),
        None => format!("holds the key {key:?} until it ends"),
    }
}

/// The words of a record about a run waiting to start: for a queue's slot, for other runs, for
/// its due time (empty for any other record).
fn waiting_record_text(event: &Event) -> String {
    match event {
        Event::QueueJoined { queue, .. } => format!("queued in {queue}"),
        Event::QueueAdmitted { by } => format!("admitted by its queue ({by})"),
        Event::DependsOn {
            after, after_any, ..
        } => dependencies_text(after, after_any),
        Event::DependenciesMet { by } => format!("dependencies met ({by})"),
        Event::StartDelayed { due_at_ms, .. } => format!(
            "delayed until {}",
            crate::duration::format_time_s(*due_at_ms)
        ),
        Event::DelayEnded { by } => format!("due: started ({by})"),
        _ => String::new(),
    }
}

/// A run id cut to its first [`RunId::MIN_PREFIX_LEN`] characters plus two, for a table
/// cell: a prefix `status` and the other commands accept while it is unique.
pub fn short_id(run: RunId) -> String {
    run.to_string()
        .chars()
        .take(RunId::MIN_PREFIX_LEN + 2)
        .collect()
}

/// `status`'s line on a run's dependencies: what it needs, and what it still waits for.
pub fn dependencies_line(after: &[String], after_any: &[String], waiting_for: &[String]) -> String {
    let mut parts = Vec::new();
    if !after.is_empty() {
        parts.push(format!("{} (complete)", after.join(", ")));
    }
    if !after_any.is_empty() {
        parts.push(format!("{} (any end)", after_any.join(", ")));
    }
    let mut text = parts.join("; ");
    if !waiting_for.is_empty() {
        text.push_str(&format!("; waits for {}", waiting_for.join(", ")));
    }
    text
}

/// The words of a run's dependencies: `waits for A, B (complete) and C (any end)`.
pub fn dependencies_text(after: &[RunId], after_any: &[RunId]) -> String {
    let list = |runs: &[RunId]| {
        runs.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    match (after.is_empty(), after_any.is_empty()) {
        (false, true) => format!("waits for {} to complete", list(after)),
        (true, false) => format!("waits for {} to end", list(after_any)),
        _ => format!(
            "waits for {} to complete and {} to end",
            list(after),
            list(after_any)
        ),
    }
}

/// The line `runjournal wait` prints when a run has ended.
pub fn end_line(state: &RunState) -> String {
    match &state.terminal {
        Some(terminal) => {
            let mut text = format!(
                "run {} {} (exit {})",
                state.run_id, state.status, terminal.exit_code
            );
            if let Some(error) = &terminal.error {
                let _ = write!(text, ": {error}");
            }
            escape_control(&text.replace('\n', " ")).into_owned()
        }
        None => format!("run {} {}", state.run_id, state.status),
    }
}

/// A short age: 5s, 3m, 2h, 4d.
pub fn age(now_ms: UnixMs, then_ms: UnixMs) -> String {
    let seconds = now_ms.saturating_sub(then_ms) / 1000;
    match seconds {
        0..60 => format!("{seconds}s"),
        60..3600 => format!("{}m", seconds / 60),
        3600..86_400 => format!("{}h", seconds / 3600),
        _ => format!("{}d", seconds / 86_400),
    }
}

/// A time to the second (`2025-01-31 12:00:00Z`), or `-`.
pub fn time_or_dash(ms: Option<UnixMs>) -> String {
    ms.map_or_else(|| "-".to_string(), format_time_s)
}

/// What to say about a blocked journal, from the home's capacity state (read from disk): a
/// line when journal writers are blocked waiting for space, one when they are retrying
/// through storage errors, or one when the space reserve has been released. `None` when all
/// is well or nothing can be read.
pub fn capacity_notice(home: &Home, now_ms: UnixMs) -> Option<String> {
    let status = crate::capacity::read_status(home).ok()?;
    let mut lines = Vec::new();
    let full = status.blocked_by(BlockCause::Capacity);
    if let Some(since_ms) = full.iter().map(|blocked| blocked.since_ms).min() {
        lines.push(format!(
            "journal: blocked on a full disk for {} ({} writer(s) waiting; transitions land once space returns)",
            age(now_ms, since_ms),
            full.len()
        ));
    }
    let flaky = status.blocked_by(BlockCause::Io { errno: 0 });
    if let Some(first) = flaky.iter().min_by_key(|blocked| blocked.since_ms) {
        lines.push(format!(
            "journal: blocked on {} for {} ({} writer(s) retrying until their retry window ends; steps keep running, transitions land once the storage works)",
            first.cause.describe(),
            age(now_ms, first.since_ms),
            flaky.len()
        ));
    }
    let held = status.blocked_by(BlockCause::WriteLock);
    if let Some(first) = held.iter().min_by_key(|blocked| blocked.since_ms) {
        lines.push(format!(
            "journal: blocked on {} for {} ({} writer(s) waiting; a process stopped inside a commit holds it; transitions land once it goes on or ends)",
            first.cause.describe(),
            age(now_ms, first.since_ms),
            held.len()
        ));
    }
    if !lines.is_empty() {
        return Some(lines.join("\n"));
    }
    let is_reserve_expected =
        crate::capacity::reserve_bytes_from_env().is_ok_and(|bytes| bytes > 0);
    (is_reserve_expected && !status.has_reserve && home.journal_path().exists()).then(|| {
        "journal: the space reserve is released (the disk was full); it is made again once space allows"
            .to_string()
    })
}

/// How far behind shipping to PostgreSQL (`runjournal ship`) is, from the home's shipping
/// state file and the journal's log (reads both), when it is worth a line ([`Lag::line`]:
/// `shipping N records behind since T: why`): shipping fails, or records wait and no shipper
/// runs. `None` when the home does not ship, shipping keeps up, or nothing can be read (it is
/// a report: a command does not fail for it).
pub fn shipping_lag(home: &Home, view: &View) -> Option<Lag> {
    crate::ship::state::lag(home, view).ok().flatten()
}

/// The `shipping` row of `inspect stats`: where the home ships and how far its records are
/// proven shipped (the journal's mark, `through`; `None`: it does not ship), or how far behind
/// and why.
pub fn shipping_text(
    report: Option<&ShipState>,
    through: Option<u64>,
    lag: Option<&Lag>,
    global_head: u64,
) -> String {
    match (through, lag, report) {
        (None, _, _) => "not shipped (no runjournal ship from this home)".to_string(),
        (Some(_), Some(lag), _) => lag.summary(),
        // The target is read from a file of the home.
        (Some(through), None, Some(report)) => escape_control(&format!(
            "to {}, proven shipped through global seq {through} of {global_head}",
            report.target
        ))
        .into_owned(),
        (Some(through), None, None) => format!(
            "proven shipped through global seq {through} of {global_head} (no report from a shipper)"
        ),
    }
}

/// Most run ids [`repairs_line`] names.
const REPAIRS_NAMED: usize = 3;

/// The one line that tells a reader what a pass repaired ([`crate::reconcile::Outcome::is_repair`]);
/// `None` when it repaired nothing.
pub fn repairs_line(report: &crate::reconcile::Report) -> Option<String> {
    let repairs: Vec<&crate::reconcile::Outcome> = report
        .outcomes
        .iter()
        .filter(|outcome| outcome.is_repair())
        .collect();
    let repaired: Vec<String> = repairs
        .iter()
        .map(|outcome| outcome.run.to_string())
        .collect();
    let retried = repairs
        .iter()
        .filter(|outcome| outcome.appended.contains(&"AttemptEnded"))
        .count();
    let count = repaired.len();
    if count == 0 {
        return None;
    }
    let mut named = repaired
        .iter()
        .take(REPAIRS_NAMED)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if count > REPAIRS_NAMED {
        let _ = write!(named, " and {} more", count - REPAIRS_NAMED);
    }
    let runs = if count == 1 { "run" } else { "runs" };
    let recorded = match (count - retried, retried) {
        (_, 0) => "recorded failed".to_string(),
        (0, _) => "each tried again by its retries".to_string(),
        (failed, retried) => format!("{failed} recorded failed, {retried} tried again"),
    };
    Some(format!(
        "repaired {count} stale {runs} whose runner was gone, {recorded}: {named}; \
         `runjournal reconcile` repairs and reports run by run"
    ))
}

/// What is left to say of a pruned run: `run X was pruned on T; it ended complete (exit 0) at
/// T'`.
pub fn pruned_line(tombstone: &crate::journal::Tombstone) -> String {
    let state = RunStatus::from(tombstone.state);
    format!(
        "run {} was pruned on {}; it ended {state} (exit {}) at {}",
        tombstone.run_id,
        time_or_dash(Some(tombstone.pruned_at_ms)),
        tombstone.exit_code,
        time_or_dash(Some(tombstone.ended_at_ms)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::borrow::Cow;

    fn paint_brackets(text: &str, _tone: Tone) -> String {
        format!("[{text}]")
    }

    #[test]
    fn control_characters_are_shown_visibly_and_nothing_else_changes() {
        for (text, shown) in [
            ("plain text, é✓ and \\ stay", "plain text, é✓ and \\ stay"),
            ("\u{1b}]2;pwned\u{7}", "\\x1b]2;pwned\\x07"),
            ("\u{1b}[2J", "\\x1b[2J"),
            ("a\tb\nc\rd", "a\\tb\\nc\\rd"),
            ("\u{0}\u{7f}", "\\x00\\x7f"),
            ("\u{9b}31m", "\\u{9b}31m"),
            ("abc\u{202e}fed", "abc\\u{202e}fed"),
            ("\u{2066}x\u{2069}", "\\u{2066}x\\u{2069}"),
        ] {
            assert_eq!(escape_control(text), shown, "{text:?}");
            assert_eq!(
                escape_control(shown),
                shown,
                "escaping twice changes nothing"
            );
        }
        assert!(matches!(escape_control("plain"), Cow::Borrowed(_)));
    }

    #[test]
    fn a_table_escapes_its_cells_and_pads_by_what_is_printed() {
        let rows = vec![
            vec![Cell::plain("\u{1b}[2J"), Cell::plain("x")],
            vec![Cell::toned("a\nb", Some(Tone::Bad)), Cell::plain("y")],
        ];
        assert_eq!(
            table_lines(&rows, &paint_brackets),
            vec!["\\x1b[2J  x", "[a\\nb]     y"]
        );
    }

    #[test]
    fn columns_are_padded_by_text_not_colour() {
        let rows = vec![
            header(&["A", "B", "C"]),
            vec![
                Cell::toned("long", Some(Tone::Bad)),
                Cell::plain("x"),
                Cell::plain("end"),
            ],
        ];
        assert_eq!(
            table_lines(&rows, &paint_brackets),
            ["A     B  C", "[long]  x  end"]
        );
        assert_eq!(
            table_lines(&rows, &no_colour),
            ["A     B  C", "long  x  end"]
        );
    }

    #[test]
    fn an_empty_last_cell_leaves_no_trailing_spaces() {
        let rows = vec![header(&["A", "B"]), vec![Cell::plain("x"), Cell::plain("")]];
        assert_eq!(table_lines(&rows, &no_colour), ["A  B", "x"]);
    }

    #[test]
    fn json_keys_become_camel_case_at_every_depth() {
        let value = serde_json::json!({
            "run_id": 1,
            "steps": [{"started_at_ms": 2, "exitCode": 3}],
            "process_terminal": {"instance_id": "x"},
        });
        assert_eq!(
            camel_case_keys(value),
            serde_json::json!({
                "runId": 1,
                "steps": [{"startedAtMs": 2, "exitCode": 3}],
                "processTerminal": {"instanceId": "x"},
            })
        );
    }

    #[cfg(feature = "ship")]
    fn fleet_run(is_closed: bool) -> FleetRun {
        FleetRun {
            journal_id: "0123456789abcdef0123456789abcdef".into(),
            host_name: "build-7".into(),
            heartbeat_at_ms: 951_827_696_000,
            run_id: RunId::generate(),
            name: Some("nightly".into()),
            state: RunStatus::Running,
            is_closed,
            is_stale: false,
            is_dismissed: false,
            steps_done: 1,
            steps_total: 2,
            runner_pid: Some(100),
            created_at_ms: 951_827_000_000,
            updated_at_ms: 951_827_000_000,
            ended_at_ms: None,
            head_seq: 4,
            status: Value::Null,
        }
    }

    #[cfg(feature = "ship")]
    #[test]
    fn the_fleet_runs_table_has_host_and_journal_columns_and_says_a_host_is_silent() {
        let run = fleet_run(false);
        let rows = runs_table(&[
            RunRow::of_shipped(&run, None),
            RunRow::of_shipped(&run, Some(951_827_696_000)),
        ]);
        let lines = table_lines(&rows, &no_colour);
        let words = |line: &str| {
            line.split_whitespace()
                .map(str::to_string)
                .collect::<Vec<_>>()
        };
        assert_eq!(words(&lines[0])[..3], ["HOST", "JOURNAL", "RUN"]);
        assert_eq!(words(&lines[1])[..2], ["build-7", "01234567"]);
        assert!(lines[1].ends_with("100 on its host"), "{}", lines[1]);
        assert!(
            lines[2].ends_with("100 host silent since 2000-02-29 12:34:56Z"),
            "{}",
            lines[2]
        );
    }

    #[test]
    fn a_fleet_log_line_starts_with_host_and_journal() {
        let origin = Origin {
            host_name: "build-7".into(),
            journal_id: "0123456789abcdef0123456789abcdef".into(),
        };
        let entry = LogEntry {
            origin: Some(&origin),
            global_seq: 12,
            time_ms: 951_827_696_000,
            run: "RUN".into(),
            seq: 3,
            event: "Dismissed",
            fields: String::new(),
        };
        assert_eq!(
            entry.line(),
            "build-7  01234567      12  2000-02-29 12:34:56.000Z  RUN     3  Dismissed"
        );
        let local = LogEntry {
            origin: None,
            ..entry
        };
        assert!(
            local.line().starts_with("    12  2000-02-29"),
            "{}",
            local.line()
        );
    }

    #[test]
    fn part_of_a_cell_may_carry_a_tone() {
        let cell = Cell::toned("failed", Some(Tone::Bad)).then(" (closed)");
        assert_eq!(cell.text(), "failed (closed)");
        assert_eq!(
            table_lines(&[vec![Cell::plain("state"), cell]], &paint_brackets),
            ["state  [failed] (closed)"]
        );
    }
}
