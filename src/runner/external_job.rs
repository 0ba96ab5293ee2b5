//! External-job steps: the provider's stdout, one JSON status per line, turned into
//! [`ExternalJobStatus`] values.
//!
//! A provider line looks like
//! `{"state": "running", "id": "job-7", "progress": 0.4, "message": "compiling", "url": "https://..."}`;
//! only `state` is required, and fields we do not know are ignored. Invariant: the parser is
//! pure and total — any bytes give a status or a [`ProviderLineError`], never a panic — so a
//! fuzz target can call it directly.
//!
//! A status that only moves `progress` or `message` is a *sample*, not a transition (docs/design.md,
//! "Samples"): [`SampleCoalescer`] holds samples back for up to [`SAMPLE_COALESCE`] after the
//! last status journaled, so a provider printing progress as fast as it can costs a commit
//! every 100 ms, not one per line. Invariant: the latest status always lands — a held sample
//! is journaled when its window ends, before a state change (in the same batch), or when the
//! provider's report ends.

use std::str::FromStr;
use std::time::{Duration, Instant};

use serde::Deserialize;

use crate::event::{ExternalJobStatus, JobState, MAX_TEXT_BYTES, truncate_text};

/// Longest provider line accepted, newline excluded.
pub const MAX_PROVIDER_LINE_BYTES: usize = 64 * 1024;

/// How much of an offending line an error quotes.
pub const QUOTED_LINE_BYTES: usize = 200;

/// Why a provider line is not a job status. Each variant quotes the line, cut to
/// [`QUOTED_LINE_BYTES`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProviderLineError {
    #[error(
        "provider line is {bytes} bytes, over the limit of {MAX_PROVIDER_LINE_BYTES}: {quoted}"
    )]
    TooLong { bytes: usize, quoted: String },
    #[error("provider line is not a JSON job status ({reason}): {quoted}")]
    Malformed { reason: String, quoted: String },
    #[error(
        "provider line has unknown state {state:?} (expected queued, running, blocked, succeeded or completed, failed, cancelled or stopped): {quoted}"
    )]
    UnknownState { state: String, quoted: String },
    #[error("provider line has progress {progress}, which is not a finite number: {quoted}")]
    NonFiniteProgress { progress: String, quoted: String },
    #[error(
        "provider line's {field} is {bytes} bytes, over the limit of {MAX_TEXT_BYTES}: {quoted}"
    )]
    FieldTooLong {
        field: &'static str,
        bytes: usize,
        quoted: String,
    },
}

/// The wire shape of a provider line; `state` is read as text so an unknown state gets its
/// own error. pi-subagents' names of the same fields are read too (`providerJobId`,
/// `handleUrl`, `failureMessage`); ours win where a line has both.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ProviderLine {
    state: String,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    provider_job_id: Option<String>,
    #[serde(default)]
    progress: Option<f64>,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    failure_message: Option<String>,
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    handle_url: Option<String>,
}

/// The start of `line`, lossily decoded and cut to [`QUOTED_LINE_BYTES`], for error messages.
pub fn quote_line(line: &[u8]) -> String {
    let head = &line[..line.len().min(QUOTED_LINE_BYTES + 4)];
    let text = String::from_utf8_lossy(head);
    let text = if line.len() > head.len() {
        format!("{text}…")
    } else {
        text.into_owned()
    };
    truncate_text(&text, QUOTED_LINE_BYTES)
}

/// Parses one provider line (without or with its trailing newline).
pub fn parse_provider_line(line: &[u8]) -> Result<ExternalJobStatus, ProviderLineError> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let quoted = || quote_line(line);
    if line.len() > MAX_PROVIDER_LINE_BYTES {
        return Err(ProviderLineError::TooLong {
            bytes: line.len(),
            quoted: quoted(),
        });
    }
    // serde_json's message may quote a whole value of the wrong type: cut it like the line.
    let parsed: ProviderLine =
        serde_json::from_slice(line).map_err(|error| ProviderLineError::Malformed {
            reason: truncate_text(&error.to_string(), QUOTED_LINE_BYTES),
            quoted: quoted(),
        })?;
    let ProviderLine {
        state,
        id,
        provider_job_id,
        progress,
        message,
        failure_message,
        url,
        handle_url,
    } = parsed;
    let (id, message, url) = (
        id.or(provider_job_id),
        message.or(failure_message),
        url.or(handle_url),
    );
    let state = JobState::from_str(&state).map_err(|_| ProviderLineError::UnknownState {
        state: truncate_text(&state, 64),
        quoted: quoted(),
    })?;
    // serde_json does not produce NaN or infinities from JSON text, but a huge exponent
    // overflows to infinity on some inputs; refuse anything the reducer would refuse.
    if let Some(progress) = progress.filter(|progress| !progress.is_finite()) {
        return Err(ProviderLineError::NonFiniteProgress {
            progress: progress.to_string(),
            quoted: quoted(),
        });
    }
    for (field, value) in [("id", &id), ("url", &url)] {
        if let Some(value) = value.as_ref().filter(|value| value.len() > MAX_TEXT_BYTES) {
            return Err(ProviderLineError::FieldTooLong {
                field,
                bytes: value.len(),
                quoted: quoted(),
            });
        }
    }
    Ok(ExternalJobStatus {
        state,
        id,
        progress,
        // A message is prose: cut rather than fail the job over it.
        message: message.map(|message| truncate_text(&message, MAX_TEXT_BYTES)),
        url,
    })
}

/// `next`, a provider's latest line, over `last`, the status it reported before: a field the
/// line leaves out keeps what it was (a job id sent once stays the job's), as pi-subagents
/// merges a provider's partial statuses. Pure.
pub fn merged(last: Option<&ExternalJobStatus>, next: ExternalJobStatus) -> ExternalJobStatus {
    let Some(last) = last else {
        return next;
    };
    ExternalJobStatus {
        state: next.state,
        id: next.id.or_else(|| last.id.clone()),
        progress: next.progress.or(last.progress),
        message: next.message.or_else(|| last.message.clone()),
        url: next.url.or_else(|| last.url.clone()),
    }
}

/// How long after the last journaled status a provider's sample may be held back.
pub const SAMPLE_COALESCE: Duration = Duration::from_millis(100);

/// Whether `next` only moves the progress or the message of `last`: a sample (docs/design.md,
/// "Samples"). A change of state, job id or URL is a transition.
pub fn is_sample(last: &ExternalJobStatus, next: &ExternalJobStatus) -> bool {
    last.state == next.state && last.id == next.id && last.url == next.url
}

/// The statuses a provider prints, on their way to the journal: samples within
/// [`SAMPLE_COALESCE`] of the last journaled status are held back, the latest replacing an
/// older one; everything else is journaled at once. Pure: the caller says what time it is.
#[derive(Debug, Default)]
pub struct SampleCoalescer {
    /// The last status journaled, and when.
    journaled: Option<(ExternalJobStatus, Instant)>,
    /// The latest sample not journaled yet.
    held: Option<ExternalJobStatus>,
}

impl SampleCoalescer {
    /// A status the provider printed at `now`: the statuses to journal now, in order (none
    /// when it is held back, or repeats the latest one). A state change carries the held
    /// sample before it, so the progress it had reached is journaled too.
    pub fn offer(&mut self, status: ExternalJobStatus, now: Instant) -> Vec<ExternalJobStatus> {
        let latest = self
            .held
            .as_ref()
            .or(self.journaled.as_ref().map(|(journaled, _)| journaled));
        if latest == Some(&status) {
            return Vec::new();
        }
        match &self.journaled {
            Some((journaled, at)) if is_sample(journaled, &status) => {
                if now < *at + SAMPLE_COALESCE {
                    self.held = Some(status);
                    Vec::new()
                } else {
                    // A newer sample than the held one: that one need not land.
                    self.held = None;
                    vec![status]
                }
            }
            _ => self.held.take().into_iter().chain([status]).collect(),
        }
    }

    /// When the held sample is due to be journaled; `None` when nothing is held.
    pub fn due(&self) -> Option<Instant> {
        self.held.as_ref()?;
        Some(
            self.journaled
                .as_ref()
                .map_or_else(Instant::now, |(_, at)| *at + SAMPLE_COALESCE),
        )
    }

    /// The held sample, to journal now (its window ended, or the report did).
    pub fn take_held(&mut self) -> Option<ExternalJobStatus> {
        self.held.take()
    }

    /// `last` (the last of what [`SampleCoalescer::offer`] or
    /// [`SampleCoalescer::take_held`] gave) is durable, as of `now`.
    pub fn journaled(&mut self, last: ExternalJobStatus, now: Instant) {
        self.journaled = Some((last, now));
    }
}

/// How an external-job step ends once its job reached a terminal state.
pub fn job_succeeded(state: JobState) -> bool {
    state == JobState::Succeeded
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_line_parses() {
        let status = parse_provider_line(
            br#"{"state":"running","id":"j","progress":0.5,"message":"m","url":"u","extra":1}
"#,
        )
        .expect("parses");
        assert_eq!(
            status,
            ExternalJobStatus {
                state: JobState::Running,
                id: Some("j".to_string()),
                progress: Some(0.5),
                message: Some("m".to_string()),
                url: Some("u".to_string()),
            }
        );
    }

    /// pi-subagents' words: `completed` and `stopped` end a job as `succeeded` and
    /// `cancelled` do, `blocked` does not end it, and its field names are read; ours win.
    #[test]
    fn pi_subagents_states_and_fields_are_read() {
        let status = parse_provider_line(
            br#"{"state":"blocked","providerJobId":"p","handleUrl":"h","failureMessage":"f","blockingJobId":"j0"}"#,
        )
        .expect("parses");
        assert_eq!(
            (status.state, status.id.as_deref(), status.url.as_deref()),
            (JobState::Blocked, Some("p"), Some("h"))
        );
        assert_eq!(status.message.as_deref(), Some("f"));
        assert!(!status.state.is_terminal());
        let ours = parse_provider_line(br#"{"state":"running","id":"i","providerJobId":"p"}"#)
            .expect("parses");
        assert_eq!(ours.id.as_deref(), Some("i"));
        for (text, state) in [
            ("completed", JobState::Succeeded),
            ("stopped", JobState::Cancelled),
        ] {
            let line = format!(r#"{{"state":"{text}"}}"#);
            let status = parse_provider_line(line.as_bytes()).expect("parses");
            assert_eq!(status.state, state, "{text}");
            assert!(status.state.is_terminal());
        }
    }

    /// A line that leaves a field out keeps what the job had: the id sent once stays.
    #[test]
    fn a_partial_line_is_merged_into_the_status_so_far() {
        let first =
            parse_provider_line(br#"{"state":"running","id":"j1","url":"u","progress":0.5}"#)
                .expect("parses");
        let next =
            parse_provider_line(br#"{"state":"succeeded","message":"done"}"#).expect("parses");
        assert_eq!(
            merged(Some(&first), next.clone()),
            ExternalJobStatus {
                state: JobState::Succeeded,
                id: Some("j1".to_string()),
                progress: Some(0.5),
                message: Some("done".to_string()),
                url: Some("u".to_string()),
            }
        );
        assert_eq!(merged(None, next.clone()), next);
    }

    #[test]
    fn only_state_is_required() {
        let status = parse_provider_line(b"{\"state\":\"queued\"}\r\n").expect("parses");
        assert_eq!(status.state, JobState::Queued);
        assert_eq!(status.id, None);
    }

    #[test]
    fn bad_lines_are_refused_with_the_line_quoted() {
        let error = parse_provider_line(b"not json").expect_err("malformed");
        assert!(matches!(error, ProviderLineError::Malformed { .. }));
        assert!(error.to_string().contains("not json"), "{error}");

        let error = parse_provider_line(br#"{"state":"done"}"#).expect_err("unknown state");
        assert!(matches!(error, ProviderLineError::UnknownState { .. }));
        assert!(error.to_string().contains(r#"{"state":"done"}"#), "{error}");

        let error = parse_provider_line(br#"{"id":"x"}"#).expect_err("no state");
        assert!(matches!(error, ProviderLineError::Malformed { .. }));

        let error = parse_provider_line(br#"{"state":"running","progress":"half"}"#)
            .expect_err("progress is not a number");
        assert!(matches!(error, ProviderLineError::Malformed { .. }));

        let error = parse_provider_line(br#"{"state":"running","progress":1e999}"#)
            .expect_err("progress overflows");
        assert!(matches!(
            error,
            ProviderLineError::Malformed { .. } | ProviderLineError::NonFiniteProgress { .. }
        ));
    }

    #[test]
    fn an_over_long_line_is_refused_and_quoted_short() {
        let mut line = br#"{"state":"running","message":""#.to_vec();
        line.extend(std::iter::repeat_n(b'x', MAX_PROVIDER_LINE_BYTES));
        line.extend(br#""}"#);
        let error = parse_provider_line(&line).expect_err("too long");
        assert!(matches!(error, ProviderLineError::TooLong { .. }));
        assert!(error.to_string().len() < 600, "{error}");
    }

    /// Regression (found with the `provider_line` fuzz target's bound): a value of the wrong
    /// type was quoted whole in the error, so one long field made an error of any size.
    #[test]
    fn a_long_value_of_the_wrong_type_gives_a_short_error() {
        let line = format!(r#"{{"state":"running","progress":"{}"}}"#, "x".repeat(3000));
        let error = parse_provider_line(line.as_bytes()).expect_err("progress is not a number");
        assert!(matches!(error, ProviderLineError::Malformed { .. }));
        assert!(error.to_string().len() < 600, "{error}");
    }

    fn status(state: JobState, progress: f64) -> ExternalJobStatus {
        ExternalJobStatus {
            state,
            id: Some("job-1".to_string()),
            progress: Some(progress),
            message: None,
            url: None,
        }
    }

    #[test]
    fn samples_within_the_window_are_held_and_the_latest_lands_when_it_ends() {
        let start = Instant::now();
        let at = |ms| start + Duration::from_millis(ms);
        let mut coalescer = SampleCoalescer::default();
        let first = status(JobState::Running, 0.0);
        assert_eq!(coalescer.offer(first.clone(), at(0)), vec![first.clone()]);
        coalescer.journaled(first, at(0));
        for (ms, progress) in [(10, 0.1), (20, 0.2), (30, 0.3)] {
            assert_eq!(
                coalescer.offer(status(JobState::Running, progress), at(ms)),
                vec![]
            );
        }
        assert_eq!(coalescer.due(), Some(at(100)));
        assert_eq!(
            coalescer.take_held(),
            Some(status(JobState::Running, 0.3)),
            "the latest sample, not an older one"
        );
        coalescer.journaled(status(JobState::Running, 0.3), at(100));
        assert_eq!(coalescer.due(), None);
        // Past the window, a sample goes at once.
        let late = status(JobState::Running, 0.4);
        assert_eq!(coalescer.offer(late.clone(), at(250)), vec![late]);
    }

    #[test]
    fn a_state_change_goes_at_once_with_the_held_sample_before_it() {
        let start = Instant::now();
        let mut coalescer = SampleCoalescer::default();
        let first = status(JobState::Running, 0.0);
        coalescer.offer(first.clone(), start);
        coalescer.journaled(first.clone(), start);
        let sample = status(JobState::Running, 0.9);
        assert_eq!(coalescer.offer(sample.clone(), start), vec![]);
        let done = status(JobState::Succeeded, 1.0);
        assert_eq!(coalescer.offer(done.clone(), start), vec![sample, done]);
        assert_eq!(coalescer.due(), None);
        // A repeat of what is latest is not journaled again; a new id or URL is no sample.
        coalescer.journaled(first.clone(), start);
        assert_eq!(coalescer.offer(first.clone(), start), vec![]);
        let moved = ExternalJobStatus {
            url: Some("https://jobs.example/1".to_string()),
            ..first
        };
        assert_eq!(coalescer.offer(moved.clone(), start), vec![moved]);
    }

    #[test]
    fn invalid_utf8_is_an_error_not_a_panic() {
        let error = parse_provider_line(b"{\"state\":\"\xff\"}").expect_err("bad utf-8");
        assert!(matches!(error, ProviderLineError::Malformed { .. }));
    }
}
