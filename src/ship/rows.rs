//! Records and runs as rows of the PostgreSQL tables, and back (pure).
//!
//! A record's `event` column is its events.jsonl line (`projection::documents::event_line`), so
//! a record has one JSON form wherever it is read; [`record_from_event_line`] is its inverse,
//! used to fold a shipped run and to compare shipped records with local ones. A run's `status`
//! column is its status.json document.

use serde_json::Value;

use crate::event::{Event, FORMAT_VERSION, Record, RecordEnvelope, RunId, UnixMs, WriterId};
use crate::home::Home;
use crate::journal::ResumeLinks;
use crate::projection::documents;
use crate::state::RunState;

/// The envelope's keys in an event line; every other key is a field of the event.
const ENVELOPE_KEYS: [&str; 6] = ["seq", "ts", "runId", "type", "writer", "writerSeq"];

/// One row of `runjournal_records` (without the journal id, which is the batch's).
#[derive(Debug, Clone, PartialEq)]
pub struct RecordRow {
    pub global_seq: i64,
    pub run_id: String,
    pub seq: i64,
    pub time_ms: i64,
    pub event_type: String,
    pub event: Value,
}

/// Column `index` of a row the server sent, read with checked access: a column missing from
/// the answer, of a type this build does not read (someone altered the table), or NULL where a
/// value is needed is an error naming the table and column, never a panic. `T` is an `Option`
/// where NULL is allowed.
pub fn column<'a, T: tokio_postgres::types::FromSql<'a>>(
    row: &'a tokio_postgres::Row,
    index: usize,
    table: &str,
    column: &str,
) -> Result<T, String> {
    let Some(found) = row.columns().get(index) else {
        return Err(format!(
            "column {column} of {table} is missing from the server's answer"
        ));
    };
    if !T::accepts(found.type_()) {
        return Err(format!(
            "column {column} of {table} has type {}, which this build does not read (was the table altered?)",
            found.type_()
        ));
    }
    row.try_get(index).map_err(|error| {
        let is_null = std::error::Error::source(&error)
            .is_some_and(|cause| cause.is::<tokio_postgres::types::WasNull>());
        if is_null {
            format!("column {column} of {table} is NULL where a value is required")
        } else {
            format!("column {column} of {table}: {error}")
        }
    })
}

/// The most bytes of a text value read back from the server (a run id, a name, a host name, a
/// home's path): far above what a shipper writes (names and paths are a few KiB at most).
pub const MAX_TEXT_VALUE_BYTES: usize = 64 * 1024;

/// The most bytes of a JSON value read back from the server (a record's event line, a run's
/// status.json): above the largest a shipper writes (a record is at most
/// [`crate::event::MAX_RECORD_BYTES`] and a snapshot [`crate::event::MAX_SNAPSHOT_BYTES`] in
/// postcard; as JSON, with every character escaped, six times that), so that a value put
/// there by hand cannot make a reader hold hundreds of megabytes.
pub const MAX_JSON_VALUE_BYTES: usize = 32 << 20;

/// SQL for `expr` (a text or jsonb column) read back only when its text is at most `max`
/// bytes — else NULL, so the server never sends it — followed by its size: two columns, read
/// with [`Columns::capped`].
pub fn capped(expr: &str, max: usize) -> String {
    format!(
        "CASE WHEN octet_length(({expr})::text) <= {max} THEN {expr} END, octet_length(({expr})::text)"
    )
}

/// SQL for a record's columns after its global seq (run id, seq, time, type, event), each
/// text capped, from the table named `alias` (empty: unqualified); read with
/// [`Columns::record_row`].
pub fn record_value_columns(alias: &str) -> String {
    let column = |name: &str| {
        if alias.is_empty() {
            name.to_string()
        } else {
            format!("{alias}.{name}")
        }
    };
    format!(
        "{}, {}, {}, {}, {}",
        capped(&column("run_id"), MAX_TEXT_VALUE_BYTES),
        column("seq"),
        column("time_ms"),
        capped(&column("event_type"), MAX_TEXT_VALUE_BYTES),
        capped(&column("event"), MAX_JSON_VALUE_BYTES),
    )
}

/// The columns of a row read in order, each with checked access ([`column`](fn@column)); a capped one
/// ([`capped`]) takes two.
pub struct Columns<'r> {
    row: &'r tokio_postgres::Row,
    table: &'static str,
    next: usize,
}

impl<'r> Columns<'r> {
    /// Reads `row` from its first column, naming `table` in errors.
    pub fn new(row: &'r tokio_postgres::Row, table: &'static str) -> Columns<'r> {
        Columns {
            row,
            table,
            next: 0,
        }
    }

    /// The columns from now on are of `table` (a join's other side).
    pub fn of(&mut self, table: &'static str) -> &mut Columns<'r> {
        self.table = table;
        self
    }

    /// The next column.
    pub fn value<T: tokio_postgres::types::FromSql<'r>>(
        &mut self,
        name: &str,
    ) -> Result<T, String> {
        let value = column(self.row, self.next, self.table, name);
        self.next += 1;
        value
    }

    /// The next column selected with [`capped`] at `max`, and its size: a value over `max` is
    /// refused, naming the column and its size.
    pub fn capped<T: tokio_postgres::types::FromSql<'r>>(
        &mut self,
        name: &str,
        max: usize,
    ) -> Result<T, String> {
        let bytes: Option<i32> = column(self.row, self.next + 1, self.table, name)?;
        if let Some(bytes) =
            bytes.filter(|bytes| usize::try_from(*bytes).is_ok_and(|bytes| bytes > max))
        {
            return Err(format!(
                "column {name} of {} holds a value of {bytes} bytes, more than the {max} runjournal reads back (no shipper writes one so large: was it written by hand?)",
                self.table
            ));
        }
        let value = column(self.row, self.next, self.table, name);
        self.next += 2;
        value
    }

    /// The record row whose columns [`record_value_columns`] selected, at `global_seq`.
    pub fn record_row(&mut self, global_seq: i64) -> Result<RecordRow, String> {
        Ok(RecordRow {
            global_seq,
            run_id: self.capped("run_id", MAX_TEXT_VALUE_BYTES)?,
            seq: self.value("seq")?,
            time_ms: self.value("time_ms")?,
            event_type: self.capped("event_type", MAX_TEXT_VALUE_BYTES)?,
            event: self.capped("event", MAX_JSON_VALUE_BYTES)?,
        })
    }
}

/// A value for a PostgreSQL `bigint`.
pub fn bigint(value: u64, what: &str) -> Result<i64, String> {
    i64::try_from(value).map_err(|_| format!("{what} {value} does not fit a PostgreSQL bigint"))
}

/// A `bigint` read back; a negative one was not written by a shipper.
pub fn unsigned(value: i64, what: &str) -> Result<u64, String> {
    u64::try_from(value).map_err(|_| format!("{what} is negative ({value})"))
}

/// The row of a record committed at global seq `global_seq`.
pub fn record_row(global_seq: u64, record: &Record) -> Result<RecordRow, String> {
    Ok(RecordRow {
        global_seq: bigint(global_seq, "global seq")?,
        run_id: record.run_id.to_string(),
        seq: bigint(record.seq, "seq")?,
        time_ms: bigint(record.time_ms, "time")?,
        event_type: record.event.name().to_string(),
        event: documents::event_line(record),
    })
}

/// The record an event line describes: the inverse of `documents::event_line`.
pub fn record_from_event_line(line: &Value) -> Result<Record, String> {
    let object = line
        .as_object()
        .ok_or_else(|| "the event is not a JSON object".to_string())?;
    let text = |key: &str| {
        object
            .get(key)
            .and_then(Value::as_str)
            .ok_or_else(|| format!("the event has no text {key:?}"))
    };
    let number = |key: &str| {
        object
            .get(key)
            .and_then(Value::as_u64)
            .ok_or_else(|| format!("the event has no number {key:?}"))
    };
    let run_id: RunId = text("runId")?
        .parse()
        .map_err(|error| format!("runId: {error}"))?;
    let writer_text = text("writer")?;
    let writer = (writer_text.len() == 16)
        .then(|| u64::from_str_radix(writer_text, 16).ok())
        .flatten()
        .ok_or_else(|| format!("writer {writer_text:?} is not 16 hex digits"))?;
    let event_type = text("type")?;
    let fields: serde_json::Map<String, Value> = object
        .iter()
        .filter(|(key, _)| !ENVELOPE_KEYS.contains(&key.as_str()))
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect();
    let mut tagged = serde_json::Map::new();
    tagged.insert(event_type.to_string(), Value::Object(fields));
    let event: Event = serde_json::from_value(Value::Object(tagged))
        .map_err(|error| format!("a {event_type} event that does not decode: {error}"))?;
    Ok(RecordEnvelope {
        format_version: FORMAT_VERSION,
        run_id,
        seq: number("seq")?,
        time_ms: number("ts")?,
        writer: WriterId(writer),
        writer_seq: number("writerSeq")?,
        event,
    })
}

/// One row of `runjournal_runs` (without the journal id).
#[derive(Debug, Clone, PartialEq)]
pub struct RunRow {
    pub run_id: String,
    pub name: Option<String>,
    pub state: String,
    pub is_closed: bool,
    pub is_stale: bool,
    pub is_dismissed: bool,
    pub steps_done: i32,
    pub steps_total: i32,
    pub runner_pid: Option<i64>,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    pub ended_at_ms: Option<i64>,
    pub head_seq: i64,
    pub status: Value,
}

/// The row of a run's state.
pub fn run_row(home: &Home, state: &RunState, links: &ResumeLinks) -> Result<RunRow, String> {
    let count = |value: usize| i32::try_from(value).map_err(|_| format!("{value} steps"));
    let status = serde_json::to_value(documents::status_doc(home, state, links))
        .map_err(|error| format!("the status of run {}: {error}", state.run_id))?;
    Ok(RunRow {
        run_id: state.run_id.to_string(),
        name: state.spec.name.clone(),
        state: state.status.as_str().to_string(),
        is_closed: state.is_closed(),
        is_stale: state.is_stale(),
        is_dismissed: state.dismissed_at_ms.is_some(),
        steps_done: count(state.steps_done())?,
        steps_total: count(state.steps.len())?,
        runner_pid: state
            .runner
            .as_ref()
            .map(|runner| i64::from(runner.identity.pid)),
        created_at_ms: bigint(state.created_at_ms, "creation time")?,
        updated_at_ms: bigint(state.updated_at_ms, "update time")?,
        ended_at_ms: state
            .ended_at_ms()
            .map(|at: UnixMs| bigint(at, "end time"))
            .transpose()?,
        head_seq: bigint(state.head_seq, "head seq")?,
        status,
    })
}

/// The runs a batch of records touches, each once in order of first appearance, with the
/// highest seq of theirs in the batch: the state each run's row must show.
pub fn runs_in_batch(records: &[(u64, Record)]) -> Vec<(RunId, u64)> {
    let mut out: Vec<(RunId, u64)> = Vec::new();
    for (_, record) in records {
        match out.iter_mut().find(|(run, _)| *run == record.run_id) {
            Some((_, seq)) => *seq = (*seq).max(record.seq),
            None => out.push((record.run_id, record.seq)),
        }
    }
    out
}

/// How a shipped record differs from the local one; empty when they are the same. JSON
/// objects compare without regard to key order (the server's `jsonb` reorders keys).
pub fn record_differences(local: &RecordRow, shipped: &RecordRow) -> Vec<String> {
    let mut changes = Vec::new();
    if local.run_id != shipped.run_id {
        changes.push(format!(
            "run: {:?} on the server, {:?} expected",
            shipped.run_id, local.run_id
        ));
    }
    if local.seq != shipped.seq {
        changes.push(format!(
            "seq: {} on the server, {} expected",
            shipped.seq, local.seq
        ));
    }
    if local.time_ms != shipped.time_ms {
        changes.push(format!(
            "time: {} on the server, {} expected",
            shipped.time_ms, local.time_ms
        ));
    }
    if local.event_type != shipped.event_type {
        changes.push(format!(
            "type: {:?} on the server, {:?} expected",
            shipped.event_type, local.event_type
        ));
    }
    match (local.event.as_object(), shipped.event.as_object()) {
        (Some(expected), Some(found)) => {
            let mut keys: Vec<&String> = expected.keys().chain(found.keys()).collect();
            keys.sort();
            keys.dedup();
            for key in keys {
                let (want, got) = (expected.get(key), found.get(key));
                if want != got {
                    let show = |value: Option<&Value>| {
                        value.map_or_else(|| "absent".to_string(), Value::to_string)
                    };
                    changes.push(format!(
                        "event.{key}: {} on the server, {} expected",
                        show(got),
                        show(want)
                    ));
                }
            }
        }
        _ if local.event != shipped.event => changes.push(format!(
            "event: {} on the server, {} expected",
            shipped.event, local.event
        )),
        _ => {}
    }
    changes
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::event::{
        ControlAction, ExternalJobStatus, JobState, Mode, Observer, ProcessExit, ProcessIdentity,
        Proof, Repairer, RunSpec, StepAction, StepEnd, StepOutcome, StepSpec, TerminalState,
    };

    fn every_event() -> Vec<Event> {
        let identity = ProcessIdentity {
            pid: 4242,
            start_time: 77,
            boot_id: "boot".to_string(),
            pid_namespace: None,
        };
        vec![
            Event::RunCreated {
                spec: Arc::new(RunSpec {
                    name: Some("nightly".to_string()),
                    mode: Mode::Chain,
                    concurrency: 1,
                    timeout_ms: Some(60_000),
                    cwd: Some("/srv".to_string()),
                    steps: vec![
                        StepSpec {
                            name: "build".to_string(),
                            action: StepAction::Shell {
                                script: "make".to_string(),
                            },
                        },
                        StepSpec {
                            name: "deploy".to_string(),
                            action: StepAction::ExternalJob {
                                provider: "./deploy".to_string(),
                            },
                        },
                    ],
                }),
                created_at_ms: 1_000,
                session_id: Some("session".to_string()),
                completion_owner_id: None,
                tool_call_id: Some("call".to_string()),
            },
            Event::RunnerStarted {
                runner: identity.clone(),
                instance_id: "instance".to_string(),
            },
            Event::StepRunning {
                step: 0,
                process: Some(identity.clone()),
            },
            Event::ExternalJobUpdated {
                step: 1,
                job: ExternalJobStatus {
                    state: JobState::Running,
                    id: Some("job-7".to_string()),
                    progress: Some(0.25),
                    message: Some("a \"quoted\" message".to_string()),
                    url: None,
                },
            },
            Event::StepFinished {
                step: 0,
                outcome: StepOutcome {
                    end: StepEnd::Failed,
                    exit_code: Some(3),
                    error: Some("exited with code 3".to_string()),
                },
            },
            Event::ControlRequested {
                action: ControlAction::Stop,
                by: "cli".to_string(),
                reason: "enough".to_string(),
            },
            Event::Terminal {
                state: TerminalState::Failed,
                error: Some("step 0 failed".to_string()),
                summary: "0 of 2 steps complete".to_string(),
                exit_code: 3,
                repaired_by: Some(Repairer::Reconciler),
            },
            Event::ProcessTerminalObserved {
                instance_id: "instance".to_string(),
                exit: Some(ProcessExit {
                    code: None,
                    signal: Some(9),
                }),
                proof: Proof::Unknown,
                observer: Observer::Reconciler,
            },
            Event::Dismissed { at_ms: 9_000 },
            Event::Resumed {
                from: RunId::from_bytes([3; 16]),
            },
            Event::QueueJoined {
                queue: "gpu".to_string(),
                idle_timeout_ms: Some(60_000),
                heartbeat_ms: None,
            },
            Event::QueueAdmitted {
                by: "reconciler (pid 7)".to_string(),
            },
        ]
    }

    #[test]
    fn every_event_line_reads_back_as_its_record() {
        let run = RunId::generate();
        for (index, event) in every_event().into_iter().enumerate() {
            let record = RecordEnvelope {
                format_version: FORMAT_VERSION,
                run_id: run,
                seq: index as u64 + 1,
                time_ms: 1_700_000_000_000 + index as u64,
                writer: WriterId(0x0123_4567_89ab_cdef),
                writer_seq: 40 + index as u64,
                event,
            };
            let row = record_row(1000 + index as u64, &record).unwrap();
            assert_eq!(row.event_type, record.event.name());
            assert_eq!(record_from_event_line(&row.event).unwrap(), record);
        }
    }

    #[test]
    fn an_event_line_with_a_wrong_field_is_refused() {
        let record = RecordEnvelope {
            format_version: FORMAT_VERSION,
            run_id: RunId::generate(),
            seq: 1,
            time_ms: 5,
            writer: WriterId(1),
            writer_seq: 1,
            event: Event::Dismissed { at_ms: 5 },
        };
        let mut line = documents::event_line(&record);
        line["atMs"] = Value::from("soon");
        assert!(record_from_event_line(&line).is_err());
        let mut line = documents::event_line(&record);
        line["writer"] = Value::from("xyz");
        assert!(record_from_event_line(&line).is_err());
    }

    #[test]
    fn differences_ignore_key_order_and_name_each_field() {
        let record = RecordEnvelope {
            format_version: FORMAT_VERSION,
            run_id: RunId::generate(),
            seq: 2,
            time_ms: 5,
            writer: WriterId(1),
            writer_seq: 1,
            event: Event::Dismissed { at_ms: 5 },
        };
        let local = record_row(9, &record).unwrap();
        let mut reordered = local.clone();
        let mut map: Vec<(String, Value)> = local
            .event
            .as_object()
            .unwrap()
            .iter()
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect();
        map.reverse();
        reordered.event = Value::Object(map.into_iter().collect());
        assert!(record_differences(&local, &reordered).is_empty());
        let mut altered = local.clone();
        altered.event["atMs"] = Value::from(6);
        altered.seq = 3;
        assert_eq!(
            record_differences(&local, &altered),
            vec![
                "seq: 3 on the server, 2 expected".to_string(),
                "event.atMs: 6 on the server, 5 expected".to_string(),
            ]
        );
    }

    #[test]
    fn runs_in_a_batch_are_listed_once_with_their_last_seq() {
        let (a, b) = (RunId::generate(), RunId::generate());
        let record = |run, seq| {
            (
                0,
                RecordEnvelope {
                    format_version: FORMAT_VERSION,
                    run_id: run,
                    seq,
                    time_ms: 1,
                    writer: WriterId(1),
                    writer_seq: 1,
                    event: Event::Dismissed { at_ms: 1 },
                },
            )
        };
        let batch = vec![record(a, 3), record(b, 1), record(a, 4), record(b, 2)];
        assert_eq!(runs_in_batch(&batch), vec![(a, 4), (b, 2)]);
    }
}
