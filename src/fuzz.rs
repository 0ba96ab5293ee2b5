//! Fuzz-target bodies, shared by the cargo-fuzz targets in `fuzz/` and by the test that
//! replays their corpora (`tests/it/fuzz_corpus.rs`), so the corpus is a regression suite even
//! without the fuzzer. Each function panics exactly when a property is broken.

use std::sync::Arc;

mod damaged_journal;

pub use damaged_journal::{damaged_journal, damaged_journal_seeds};

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::event::{
    AttemptCause, ControlAction, Event, ExternalJobStatus, FORMAT_VERSION, JobState,
    MAX_TEXT_BYTES, Mode, Observer, ProcessExit, ProcessIdentity, Proof, RecordEnvelope, Repairer,
    RetryOn, RunId, RunSpec, SteerMode, StepAction, StepEnd, StepOutcome, StepSpec, TerminalState,
    UnixMs, WriterId,
};
use crate::home::Home;
use crate::projection::documents::{self, ResultDoc, StatusDoc};
use crate::runner::external_job::{self, ProviderLineError};
use crate::spec::SpecFile;
use crate::state::{self, RunState, TransitionError};

/// Arbitrary bytes as a stored record: decoding never panics, and whatever decodes encodes
/// back to the same bytes (one encoding per record, so a checksum match means an exact match).
pub fn decode_record(data: &[u8]) {
    if let Ok(record) = RecordEnvelope::decode(data) {
        let encoded = record
            .encode()
            .expect("a record that decoded re-encodes within the limits");
        assert_eq!(
            encoded, data,
            "decode then encode gives back the same bytes"
        );
        assert_eq!(
            RecordEnvelope::decode(&encoded).as_ref(),
            Ok(&record),
            "the re-encoded record decodes to the same record"
        );
    }
}

/// Arbitrary bytes as a stored snapshot (a forged or damaged entry of the `runs` table): decoding
/// never panics, and what decodes is a state the runner, the reconciler and the projector may
/// act on — it has the shape of a reducer's state ([`RunState::check_shape`]: its spec passes
/// `RunSpec::check`), round-trips through its encoding, and renders as a view and as a
/// projection. The bytes are read as they are and, so that the fuzzer gets past the checksum,
/// as a payload with a CRC-32C made to match.
pub fn decode_snapshot(data: &[u8]) {
    use crate::journal::format::snapshot::{decode_snapshot, encode_snapshot};
    for bytes in [data.to_vec(), crate::event::with_checksum(data)] {
        let Ok(state) = decode_snapshot(FUZZ_RUN, &bytes) else {
            continue;
        };
        state
            .check_shape()
            .expect("a decoded snapshot has the shape of a reducer's state");
        let encoded = encode_snapshot(&state).expect("a decoded state re-encodes");
        assert_eq!(
            decode_snapshot(FUZZ_RUN, &encoded).as_ref(),
            Ok(&state),
            "a decoded state round-trips"
        );
        let lines = crate::show::RunView::of(&state, None).lines(&crate::show::no_colour);
        assert!(!lines.is_empty(), "a state renders");
        let plan = crate::projection::plan(
            &Home::at("/fuzz-home"),
            &state,
            &[],
            &crate::journal::ResumeLinks::default(),
        );
        assert!(!plan.files.is_empty(), "a projection has files");
    }
}

/// Reads fuzz bytes as a sequence of small choices; past the end every choice is 0./// Reads fuzz bytes as a sequence of small choices; past the end every choice is 0.
struct Choices<'a> {
    bytes: &'a [u8],
    /// Whether an event may be a hook's (one more choice per event); off for the inputs made
    /// before hooks existed, which keep their meaning.
    has_hooks: bool,
}

impl Choices<'_> {
    fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    fn byte(&mut self) -> u8 {
        match self.bytes.split_first() {
            Some((&first, rest)) => {
                self.bytes = rest;
                first
            }
            None => 0,
        }
    }

    /// A number below `count`.
    fn below(&mut self, count: u8) -> u8 {
        self.byte() % count
    }

    fn flag(&mut self) -> bool {
        self.byte() & 1 == 1
    }

    fn pick<T: Clone>(&mut self, options: &[T]) -> T {
        let index = usize::from(self.byte()) % options.len();
        options[index].clone()
    }

    fn text(&mut self) -> String {
        match self.below(8) {
            0 => String::new(),
            1 => "a".to_string(),
            2 => "runner-a".to_string(),
            3 => "runner-b".to_string(),
            4 => "é✓ multi-byte".to_string(),
            5 => "x".repeat(MAX_TEXT_BYTES),
            6 => "x".repeat(MAX_TEXT_BYTES + 1),
            _ => {
                // Up to 32 raw bytes, read as text.
                let len = usize::from(self.below(33)).min(self.bytes.len());
                let (raw, rest) = self.bytes.split_at(len);
                self.bytes = rest;
                String::from_utf8_lossy(raw).into_owned()
            }
        }
    }

    fn optional<T>(&mut self, make: impl FnOnce(&mut Self) -> T) -> Option<T> {
        self.flag().then(|| make(self))
    }

    fn number(&mut self) -> u64 {
        self.pick(&[0, 1, 2, 7, 1_700_000_000_000, u64::MAX - 1, u64::MAX])
    }

    fn identity(&mut self) -> ProcessIdentity {
        ProcessIdentity {
            pid: u32::from(self.byte()),
            start_time: self.number(),
            boot_id: self.text(),
            pid_namespace: self.optional(Self::number),
        }
    }

    fn spec(&mut self) -> RunSpec {
        let mode = self.pick(&[Mode::Single, Mode::Chain, Mode::Parallel]);
        let step_count = self.below(6);
        let steps = (0..step_count)
            .map(|index| {
                let action = match self.below(3) {
                    0 => StepAction::Command {
                        argv: (0..self.below(3)).map(|_| self.text()).collect(),
                    },
                    1 => StepAction::Shell {
                        script: self.text(),
                    },
                    _ => StepAction::ExternalJob {
                        provider: self.text(),
                    },
                };
                let name = if self.flag() {
                    self.text()
                } else {
                    format!("step-{index}")
                };
                StepSpec { name, action }
            })
            .collect();
        RunSpec {
            name: self.optional(Self::text),
            mode,
            concurrency: u32::from(self.below(4)),
            timeout_ms: self.optional(Self::number),
            cwd: self.optional(Self::text),
            steps,
        }
    }

    fn event(&mut self) -> Event {
        if self.has_hooks && self.flag() {
            return self.hook_event();
        }
        self.lifecycle_event()
    }

    /// A hook's event: a small hook number and attempt, so lives reach each rule; sometimes
    /// one out of range.
    fn hook_event(&mut self) -> Event {
        let hook = u32::from(self.pick(&[0u8, 0, 1, 17]));
        let attempt = u32::from(self.below(7));
        if self.flag() {
            return Event::HookAttempted {
                hook,
                attempt,
                claimant: self.identity(),
                by: self.text(),
                lease_ms: self.number(),
            };
        }
        let outcome = match self.below(5) {
            0 => crate::event::HookOutcome::Delivered,
            1 => crate::event::HookOutcome::Failed {
                exit: ProcessExit {
                    code: self.optional(|choices| i32::from(choices.byte())),
                    signal: None,
                },
            },
            2 => crate::event::HookOutcome::TimedOut,
            3 => crate::event::HookOutcome::NotStarted { error: self.text() },
            _ => crate::event::HookOutcome::Abandoned {
                reason: self.text(),
            },
        };
        Event::HookEnded {
            hook,
            attempt,
            outcome,
            retry_at_ms: self.optional(Self::number),
        }
    }

    /// Dependencies from a small pool that holds the run itself, so that a run named twice or
    /// itself happens.
    fn depends_on(&mut self) -> Event {
        let mut pool = || {
            (0..self.below(3))
                .map(|_| match self.below(3) {
                    0 => FUZZ_RUN,
                    which => crate::event::RunId::from_bytes([which; 16]),
                })
                .collect::<Vec<_>>()
        };
        let after = pool();
        let after_any = pool();
        Event::DependsOn {
            after,
            after_any,
            idle_timeout_ms: self.optional(Self::number),
            heartbeat_ms: self.optional(Self::number),
        }
    }

    fn lifecycle_event(&mut self) -> Event {
        match self.below(18) {
            0 => Event::RunCreated {
                spec: Arc::new(self.spec()),
                created_at_ms: self.number(),
                session_id: self.optional(Self::text),
                completion_owner_id: self.optional(Self::text),
                tool_call_id: self.optional(Self::text),
            },
            1 => Event::RunnerStarted {
                runner: self.identity(),
                instance_id: self.text(),
            },
            2 => Event::StepRunning {
                step: u32::from(self.below(6)),
                process: self.optional(Self::identity),
            },
            3 => Event::ExternalJobUpdated {
                step: u32::from(self.below(6)),
                job: self.job_status(),
            },
            4 => Event::StepFinished {
                step: u32::from(self.below(6)),
                outcome: self.step_outcome(),
            },
            5 => Event::ControlRequested {
                action: self.pick(&[
                    ControlAction::Stop,
                    ControlAction::Timeout,
                    ControlAction::Interrupt,
                ]),
                by: self.text(),
                reason: self.text(),
            },
            6 => self.terminal(),
            7 => Event::ProcessTerminalObserved {
                instance_id: self.text(),
                exit: self.optional(|choices| ProcessExit {
                    code: choices.optional(|choices| i32::from(choices.byte())),
                    signal: choices.optional(|choices| i32::from(choices.byte())),
                }),
                proof: self.pick(&[Proof::Observed, Proof::Unknown, Proof::NotStarted]),
                observer: self.pick(&[
                    Observer::RunnerParent,
                    Observer::Launcher,
                    Observer::Reconciler,
                ]),
            },
            8 => Event::Dismissed {
                at_ms: self.number(),
            },
            // Itself or another run: the reducer refuses the first.
            9 => Event::Resumed {
                from: if self.below(2) == 0 {
                    FUZZ_RUN
                } else {
                    crate::event::RunId::from_bytes([self.byte(); 16])
                },
            },
            10 => Event::QueueJoined {
                queue: self.pick(&["q", "", "a b", "batch-1"]).to_string(),
                idle_timeout_ms: self.optional(Self::number),
                heartbeat_ms: self.optional(Self::number),
            },
            11 => Event::QueueAdmitted { by: self.text() },
            // A small pool of ids, so that repeats and deliveries of known requests happen.
            12 => Event::SteerRequested {
                id: self.pick(&["s1", "s2", "", "a b"]).to_string(),
                steps: (0..self.below(4))
                    .map(|_| u32::from(self.below(6)))
                    .collect(),
                mode: self.pick(&[SteerMode::Steer, SteerMode::FollowUp]),
                message: self.text(),
                source: self.text(),
            },
            13 => Event::SteerDelivered {
                id: self.pick(&["s1", "s2", "s3"]).to_string(),
                step: u32::from(self.below(6)),
            },
            14 => Event::ControlRefused {
                file: self.text(),
                reason: self.text(),
            },
            16 => self.depends_on(),
            17 => Event::DependenciesMet { by: self.text() },
            // The last arm splits, so the events added later leave the others' inputs alone.
            _ => self.later_event(),
        }
    }

    /// The events of the lifecycle's last arm: a host's end, and those added after it.
    fn later_event(&mut self) -> Event {
        match self.below(3) {
            0 => Event::HostEnded {
                state: self.pick(&[
                    TerminalState::Complete,
                    TerminalState::Failed,
                    TerminalState::Stopped,
                    TerminalState::Paused,
                ]),
                exit_code: i32::from(self.byte() as i8),
                message: self.text(),
                ended_at_ms: self.number(),
                result_path: self.optional(Self::text),
            },
            1 => Event::StartDelayed {
                due_at_ms: self.number(),
                idle_timeout_ms: self.optional(Self::number),
                heartbeat_ms: self.optional(Self::number),
            },
            // The last arm splits again for the events added after it.
            _ => match self.below(2) {
                0 => Event::DelayEnded { by: self.text() },
                // And again.
                _ => match self.below(3) {
                    0 => Event::UniqueKey {
                        key: self.text(),
                        hold_ms: self.optional(Self::number),
                    },
                    1 => Event::RetryPolicy {
                        retries: u32::from(self.byte() % 4),
                        backoff_ms: self.number(),
                        backoff_max_ms: self.number(),
                        on: RetryOn {
                            exit: self.byte().is_multiple_of(2),
                            crash: self.byte().is_multiple_of(2),
                            timeout: self.byte().is_multiple_of(2),
                            exit_codes: (0..self.byte() % 3)
                                .map(|_| i32::from(self.byte()))
                                .collect(),
                        },
                        idle_timeout_ms: self.optional(Self::number),
                        heartbeat_ms: self.optional(Self::number),
                    },
                    // The last arm splits once more for a step's stop.
                    _ => match self.below(2) {
                        0 => Event::AttemptEnded {
                            attempt: u32::from(self.byte() % 4),
                            cause: self.pick(&[
                                AttemptCause::Exit,
                                AttemptCause::Crash,
                                AttemptCause::Timeout,
                            ]),
                            error: self.optional(Self::text),
                            summary: self.text(),
                            exit_code: i32::from(self.byte() as i8),
                            retry_at_ms: self.number(),
                        },
                        _ => Event::StepStopRequested {
                            step: u32::from(self.byte() % 4),
                            by: self.text(),
                            reason: self.text(),
                        },
                    },
                },
            },
        }
    }

    fn job_status(&mut self) -> ExternalJobStatus {
        ExternalJobStatus {
            state: self.pick(&[
                JobState::Queued,
                JobState::Running,
                JobState::Succeeded,
                JobState::Failed,
                JobState::Cancelled,
                JobState::Blocked,
            ]),
            id: self.optional(Self::text),
            progress: self.pick(&[
                None,
                Some(0.5),
                Some(-1.0),
                Some(1e308),
                Some(f64::INFINITY),
                Some(f64::NAN),
            ]),
            message: self.optional(Self::text),
            url: self.optional(Self::text),
        }
    }

    fn step_outcome(&mut self) -> StepOutcome {
        StepOutcome {
            end: self.pick(&[
                StepEnd::Complete,
                StepEnd::Failed,
                StepEnd::Stopped,
                StepEnd::Skipped,
            ]),
            exit_code: self.optional(|choices| i32::from(choices.byte() as i8)),
            error: self.optional(Self::text),
        }
    }

    fn terminal(&mut self) -> Event {
        Event::Terminal {
            state: self.pick(&[
                TerminalState::Complete,
                TerminalState::Failed,
                TerminalState::Stopped,
                TerminalState::Paused,
            ]),
            error: self.optional(Self::text),
            summary: self.text(),
            exit_code: i32::from(self.byte() as i8),
            repaired_by: self.optional(|choices| {
                choices.pick(&[Repairer::Reconciler, Repairer::Launcher, Repairer::Host])
            }),
        }
    }
}

const FUZZ_RUN: RunId = RunId::from_bytes([0x42; 16]);
const OTHER_RUN: RunId = RunId::from_bytes([0x43; 16]);

/// The events of a fuzzed run's life, with each one's run, seq skew and time: from small
/// choices when `mode` is even (hooks' events among them when its bit 1 is set too), else
/// decoded as raw postcard `Event`s.
fn fuzzed_events(mode: u8, rest: &[u8]) -> Vec<(RunId, u64, UnixMs, Event)> {
    let mut events: Vec<(RunId, u64, UnixMs, Event)> = Vec::new();
    if mode & 1 == 0 {
        let mut choices = Choices {
            bytes: rest,
            has_hooks: mode & 2 == 2,
        };
        let mut time_ms: UnixMs = 1_700_000_000_000;
        let mut seq_offset = 0u64;
        while !choices.is_empty() && events.len() < 512 {
            // Mostly the next seq of the run at the next time; sometimes not.
            let (run, skew) = match choices.below(16) {
                0 => (OTHER_RUN, 0),
                1 => (FUZZ_RUN, 1),
                2 => (FUZZ_RUN, u64::MAX),
                _ => (FUZZ_RUN, 0),
            };
            time_ms = match choices.below(8) {
                0 => 0,
                1 => u64::MAX,
                2 => time_ms,
                _ => time_ms.saturating_add(1000),
            };
            seq_offset = seq_offset.wrapping_add(skew);
            events.push((run, seq_offset, time_ms, choices.event()));
        }
    } else {
        let mut bytes = rest;
        let mut time_ms: UnixMs = 1_700_000_000_000;
        while let Ok((event, tail)) = postcard::take_from_bytes::<Event>(bytes) {
            bytes = tail;
            time_ms += 1000;
            events.push((FUZZ_RUN, 0, time_ms, event));
            if events.len() >= 512 {
                break;
            }
        }
    }
    events
}

/// The properties of a record `apply` accepted: `next` follows `before` (whose head was
/// `head`) by one record, has a snapshot's shape, agrees with the in-place fold, and its
/// snapshot and the record round-trip.
fn check_accepted(before: Option<&RunState>, head: u64, record: &RecordEnvelope, next: &RunState) {
    assert_eq!(next.head_seq, record.seq, "the head is the record's seq");
    assert_eq!(
        next.head_seq,
        head + 1,
        "an accepted record follows the head"
    );
    assert_eq!(next.run_id, record.run_id);
    assert_eq!(
        next.steps.len(),
        next.spec.steps.len(),
        "one step state per step"
    );
    next.check_shape()
        .expect("every state the reducer makes has the shape a snapshot is checked for");
    if let Some(before) = before {
        let mut in_place = before.clone();
        in_place
            .apply_mut(record)
            .expect("apply_mut accepts what apply accepts");
        assert_eq!(&in_place, next, "apply_mut and apply agree");
    }
    let snapshot = crate::journal::format::snapshot::encode_snapshot(next)
        .expect("the snapshot of a legal state encodes");
    let decoded = crate::journal::format::snapshot::decode_snapshot(next.run_id, &snapshot)
        .expect("a snapshot decodes");
    assert_eq!(&decoded, next, "a snapshot round-trips");
    if let Ok(bytes) = record.encode() {
        assert_eq!(
            RecordEnvelope::decode(&bytes).as_ref(),
            Ok(record),
            "an accepted record round-trips"
        );
    }
}

/// Arbitrary bytes as a run's life: a sequence of records folded one by one with
/// [`state::apply`], as the journal folds them.
///
/// The first byte picks how events are made: from small choices (mostly legal, so runs get
/// deep into their lives, with the odd wrong seq, wrong run or odd time), or decoded as raw
/// postcard `Event`s (any field values at all). Properties: nothing panics; an accepted record
/// advances the head by one and the in-place fold agrees; a refused record leaves the state
/// exactly as it was; the accepted records replay to the same state; every state's snapshot
/// encoding and every accepted record's encoding round-trip; and the run's projection renders,
/// its status.json and result file reading back as what was rendered.
pub fn fold_events(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let events = fuzzed_events(mode, rest);

    let mut state: Option<RunState> = None;
    let mut accepted: Vec<RecordEnvelope> = Vec::new();
    for (index, (run, seq_skew, time_ms, event)) in events.into_iter().enumerate() {
        let head = state.as_ref().map_or(0, |state| state.head_seq);
        let record = RecordEnvelope {
            format_version: FORMAT_VERSION,
            run_id: run,
            seq: head.wrapping_add(1).wrapping_add(seq_skew),
            time_ms,
            writer: WriterId(7),
            writer_seq: index as u64,
            event,
        };
        match state::apply(state.as_ref(), &record) {
            Ok(next) => {
                check_accepted(state.as_ref(), head, &record, &next);
                accepted.push(record);
                state = Some(next);
            }
            Err(_) => {
                if let Some(before) = &state {
                    let mut in_place = before.clone();
                    assert!(
                        in_place.apply_mut(&record).is_err(),
                        "apply_mut refuses what apply refuses"
                    );
                    assert_eq!(&in_place, before, "a refused record changes nothing");
                }
            }
        }
    }
    let replayed = state::replay(&accepted).expect("the accepted records replay");
    assert_eq!(
        replayed, state,
        "the accepted records replay to the same state"
    );
    if let Some(state) = &state {
        render(state, &accepted);
    }
}

/// Renders a run's projection and reads its documents back.
fn render(state: &RunState, records: &[RecordEnvelope]) {
    let home = Home::at("/fuzz-home");
    let links = crate::journal::ResumeLinks {
        resumed_from: crate::journal::ResumeLinks::resumed_from_records(records),
        resumed_by: None,
    };
    let plan = crate::projection::plan(&home, state, records, &links);
    assert!(!plan.files.is_empty(), "a projection has files");
    let status = documents::status_doc(&home, state, &links);
    round_trip(&status, "status.json");
    if let Some(result) = documents::result_doc(&home, state, records) {
        round_trip(&result, "the result file");
    }
}

/// A document as the projection writes it reads back as the same document.
fn round_trip<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(
    document: &T,
    what: &str,
) {
    let bytes = documents::to_json_bytes(document);
    let read: T = serde_json::from_slice(&bytes)
        .unwrap_or_else(|error| panic!("{what} as written does not parse: {error}"));
    assert_eq!(&read, document, "{what} reads back as written");
}

/// What parses as a document re-serializes to bytes that parse to the same document, and
/// serializing is stable from then on.
fn reparse<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(data: &[u8]) {
    let Ok(document) = serde_json::from_slice::<T>(data) else {
        return;
    };
    let bytes = documents::to_json_bytes(&document);
    let again: T = serde_json::from_slice(&bytes).expect("a serialized document parses");
    assert_eq!(again, document, "a parsed document survives a round trip");
    assert_eq!(
        documents::to_json_bytes(&again),
        bytes,
        "serializing is stable"
    );
}

/// Arbitrary bytes as a status.json written by someone else (another version, a host, a
/// damaged disk).
pub fn parse_status_json(data: &[u8]) {
    reparse::<StatusDoc>(data);
}

/// Arbitrary bytes as a result file written by someone else.
pub fn parse_result_json(data: &[u8]) {
    reparse::<ResultDoc>(data);
}

/// Arbitrary bytes as a `--spec` file: parsing and finishing never panic, and a spec that
/// finishes is one the reducer creates a run from (only host ids over the text limit may
/// still be refused, as they are at append) and that fits a record.
pub fn parse_spec(data: &[u8]) {
    let Ok(file) = SpecFile::parse(data) else {
        return;
    };
    let Ok(draft) = file.into_draft() else {
        return;
    };
    let Ok(request) = draft.finish() else {
        return;
    };
    request
        .spec
        .check()
        .expect("a finished spec passed RunSpec::check");
    let record = RecordEnvelope {
        format_version: FORMAT_VERSION,
        run_id: FUZZ_RUN,
        seq: 1,
        time_ms: 1,
        writer: WriterId(7),
        writer_seq: 1,
        event: Event::RunCreated {
            spec: Arc::new(request.spec),
            created_at_ms: 1,
            session_id: request.hosts.session_id,
            completion_owner_id: request.hosts.completion_owner_id,
            tool_call_id: request.hosts.tool_call_id,
        },
    };
    match state::apply(None, &record) {
        Ok(created) => assert_eq!(created.head_seq, 1),
        Err(TransitionError::TextTooLong { .. }) => {}
        Err(other) => panic!("a finished spec is refused by the reducer: {other}"),
    }
    record.encode().expect("a checked spec fits a record");
}

/// Longest error message a provider line may produce: the fixed text, a short reason and the
/// quoted line. It goes into the step's error, which holds at most `MAX_TEXT_BYTES`.
pub const MAX_PROVIDER_ERROR_BYTES: usize = 1024;

/// Arbitrary bytes as one line of an external-job provider: never a panic; a status the
/// reducer accepts, or an error of bounded size.
pub fn provider_line(data: &[u8]) {
    match external_job::parse_provider_line(data) {
        Ok(status) => {
            assert!(
                status.progress.is_none_or(f64::is_finite),
                "progress is finite"
            );
            Event::ExternalJobUpdated {
                step: 0,
                job: status,
            }
            .check_text_limits()
            .expect("a parsed status is within the text limits");
        }
        Err(error) => {
            let message = error.to_string();
            assert!(
                message.len() <= MAX_PROVIDER_ERROR_BYTES,
                "an error of {} bytes: {}",
                message.len(),
                external_job::quote_line(message.as_bytes())
            );
            if let ProviderLineError::TooLong { bytes, .. } = error {
                assert!(bytes > external_job::MAX_PROVIDER_LINE_BYTES);
            }
        }
    }
}
