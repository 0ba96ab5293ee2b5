//! Durations and times as people write them: one grammar for `run --timeout`, `wait
//! --timeout`, a spec file's `timeout`, `journal-tools --since/--until`, `runjournal ship
//! --poll-interval/--heartbeat-interval` and `journal-tools --silent-after`.
//!
//! A duration is jiff's "friendly" format in whole units: `500ms`, `30s`, `5m`, `2h`, `1d`,
//! `1w`, and combinations such as `1h30m` or `1h 30m` (jiff also reads `90 seconds` and ISO
//! 8601's `PT90S`); a day is 24 hours. Refused, each with what to write instead: a bare number
//! (seconds or milliseconds? write the unit), a fraction (`1.5s`: write `1s500ms`), a
//! negative or zero duration, a part finer than a millisecond (`500us`, `1ns`: durations are
//! kept as whole milliseconds, and would be cut to less than was written, even to none), and
//! months or years (their length varies).
//!
//! Invariant: pure; nothing here reads a clock (a relative time is counted back from a `now`
//! the caller passes).

use std::str::FromStr;
use std::time::Duration;

use jiff::civil::{Date, DateTime, Time};
use jiff::tz::{AmbiguousOffset, TimeZone};
use jiff::{Span, SpanRelativeTo, Timestamp};

use crate::event::UnixMs;

/// The examples every refusal shows.
const EXAMPLES: &str = "500ms, 30s, 5m, 2h, 1d, 1h30m";

/// Longest part of a refused text repeated in its error.
const QUOTED_TEXT_CHARS: usize = 64;

/// Why a duration text is refused. Each message says what to write instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DurationError {
    #[error("{text:?} is not a duration (examples: {EXAMPLES})")]
    Malformed { text: String },
    #[error(
        "{text:?} has no unit: write {text}s for seconds (or {text}ms, {text}m, {text}h, {text}d)"
    )]
    NoUnit { text: String },
    #[error("{text:?} has a fraction: write whole units, such as 1s500ms for 1.5s")]
    Fraction { text: String },
    #[error("{text:?} is negative; a duration must be positive (examples: {EXAMPLES})")]
    Negative { text: String },
    #[error("{text:?} is zero; a duration must be positive (examples: {EXAMPLES})")]
    Zero { text: String },
    #[error("{text:?} uses months or years, whose length varies: write days, such as 30d")]
    CalendarUnit { text: String },
    #[error("{text:?} is too long a duration")]
    Overflow { text: String },
    #[error(
        "{text:?} is finer than a millisecond; durations are whole milliseconds: write at least 1ms (such as 250ms or 1s500ms)"
    )]
    SubMillisecond { text: String },
}

fn quoted(text: &str) -> String {
    text.chars().take(QUOTED_TEXT_CHARS).collect()
}

/// Parses a duration ([module docs](self)). Zero and negative durations are refused.
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let trimmed = text.trim();
    let text = quoted(trimmed);
    if trimmed.is_empty() {
        return Err(DurationError::Malformed { text });
    }
    if trimmed.bytes().all(|byte| byte.is_ascii_digit()) {
        return Err(DurationError::NoUnit { text });
    }
    // jiff reads fractions of a unit (`1.5s`, `0,5h`); whole units only are accepted here, so
    // that what is written is exactly what is meant, to the millisecond.
    if trimmed.contains(['.', ',']) && trimmed.bytes().any(|byte| byte.is_ascii_digit()) {
        return Err(DurationError::Fraction { text });
    }
    let span =
        Span::from_str(trimmed).map_err(|_| DurationError::Malformed { text: text.clone() })?;
    if span.is_negative() {
        return Err(DurationError::Negative { text });
    }
    if span.get_years() != 0 || span.get_months() != 0 {
        return Err(DurationError::CalendarUnit { text });
    }
    let signed = span
        .to_duration(SpanRelativeTo::days_are_24_hours())
        .map_err(|_| DurationError::Overflow { text: text.clone() })?;
    let duration =
        Duration::try_from(signed).map_err(|_| DurationError::Negative { text: text.clone() })?;
    if duration.is_zero() {
        return Err(DurationError::Zero { text });
    }
    // Kept as milliseconds: a finer part would be cut off, `1ns` to nothing at all.
    if duration.subsec_nanos() % 1_000_000 != 0 {
        return Err(DurationError::SubMillisecond { text });
    }
    // Durations are kept as milliseconds (a spec's `timeoutMs`): refuse what does not fit.
    if u64::try_from(duration.as_millis()).is_err() {
        return Err(DurationError::Overflow { text });
    }
    Ok(duration)
}

/// Renders milliseconds the way [`parse_duration`] reads them: `1s`, `1m30s`, `250ms`.
pub fn format_duration_ms(total_ms: u64) -> String {
    if total_ms == 0 {
        return "0s".to_string();
    }
    let mut out = String::new();
    let mut rest = total_ms;
    for (unit, unit_ms) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
        ("ms", 1),
    ] {
        if rest >= unit_ms {
            out.push_str(&format!("{}{unit}", rest / unit_ms));
            rest %= unit_ms;
        }
    }
    out
}

/// [`format_duration_ms`] of a [`Duration`], saturating at `u64::MAX` milliseconds.
pub fn format_duration(duration: Duration) -> String {
    format_duration_ms(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX))
}

/// Why a time text is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TimeError {
    #[error(
        "{text:?} is not a time: give an RFC 3339 time (2025-01-31T12:00:00Z), a UTC date and time (2025-01-31 12:00), or a time before now ({EXAMPLES})"
    )]
    Malformed { text: String },
    #[error("{text:?} as a time before now: {source}")]
    Duration {
        text: String,
        #[source]
        source: DurationError,
    },
    #[error("{text:?} is before 1970 or after 9999")]
    OutOfRange { text: String },
}

/// Parses a point in time into Unix milliseconds: an RFC 3339 time (`2025-01-31T12:00:00Z`,
/// any offset), a date and time or a date taken as UTC (`2025-01-31 12:00[:30]`,
/// `2025-01-31`), or a duration ([`parse_duration`]) meaning that long before `now_ms`.
pub fn parse_time(text: &str, now_ms: UnixMs) -> Result<UnixMs, TimeError> {
    let trimmed = text.trim();
    let out_of_range = || TimeError::OutOfRange {
        text: quoted(trimmed),
    };
    let time = if let Ok(time) = Timestamp::from_str(trimmed) {
        time
    } else if let Ok(datetime) = DateTime::from_str(trimmed) {
        TimeZone::UTC
            .to_timestamp(datetime)
            .map_err(|_| out_of_range())?
    } else if let Ok(date) = Date::from_str(trimmed) {
        TimeZone::UTC
            .to_timestamp(date.to_datetime(Time::midnight()))
            .map_err(|_| out_of_range())?
    } else {
        return match parse_duration(trimmed) {
            Ok(ago) => {
                let ago_ms = u64::try_from(ago.as_millis()).map_err(|_| out_of_range())?;
                now_ms.checked_sub(ago_ms).ok_or_else(out_of_range)
            }
            // Something that reads as no duration at all is named as no time at all.
            Err(DurationError::Malformed { .. }) => Err(TimeError::Malformed {
                text: quoted(trimmed),
            }),
            Err(source) => Err(TimeError::Duration {
                text: quoted(trimmed),
                source,
            }),
        };
    };
    u64::try_from(time.as_millisecond()).map_err(|_| out_of_range())
}

/// Why a start time (`run --at`) is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StartTimeError {
    #[error(
        "{text:?} is not a start time: give an RFC 3339 time (2025-01-31T14:30:00+01:00) or a local time today (14:30, 14:30:15)"
    )]
    Malformed { text: String },
    #[error("{text:?} is already past; give a later time (a local time means today), or --delay")]
    Past { text: String },
    #[error(
        "{text:?} is out of range: a start time is from 1970-01-01T00:00:00Z to {}",
        Timestamp::MAX.strftime("%Y-%m-%dT%H:%M:%SZ")
    )]
    OutOfRange { text: String },
    /// A local time, and no time zone to read it in: `TZ` names none this system knows.
    #[error(
        "{text:?} is a local time, but this system's time zone is unknown ({reason}): set TZ to a zone this system knows (TZ=Europe/Paris), or give an RFC 3339 time with its offset"
    )]
    UnknownTimeZone { text: String, reason: String },
    /// A local time the clocks skip today (the start of daylight saving time).
    #[error(
        "{text:?} does not exist today ({date}) in {zone}: the clocks skip it, going from UTC{before} to UTC{after}; give an RFC 3339 time with its offset"
    )]
    SkippedLocalTime {
        text: String,
        date: String,
        zone: String,
        before: String,
        after: String,
    },
    /// A local time the clocks show twice today (the end of daylight saving time).
    #[error(
        "{text:?} happens twice today ({date}) in {zone}, the clocks going back: give an RFC 3339 time with its offset, {first} or {second}"
    )]
    AmbiguousLocalTime {
        text: String,
        date: String,
        zone: String,
        first: String,
        second: String,
    },
}

/// Parses when a run may start (`run --at`) into Unix milliseconds: an RFC 3339 time (any
/// offset), or a local time of today in this system's time zone (`14:30`, `14:30:15`). A time
/// at or before `now_ms` is refused: a run does not start in the past. So is a local time when
/// the system's time zone is unknown (`TZ` naming no zone), and one the clocks skip or show
/// twice today: the run would start an hour off what its launcher meant.
pub fn parse_start_time(text: &str, now_ms: UnixMs) -> Result<UnixMs, StartTimeError> {
    parse_start_time_in(text, now_ms, TimeZone::try_system)
}

/// [`parse_start_time`] with `zone` as the system's time zone, asked only for a local time.
fn parse_start_time_in(
    text: &str,
    now_ms: UnixMs,
    zone: impl FnOnce() -> Result<TimeZone, jiff::Error>,
) -> Result<UnixMs, StartTimeError> {
    let trimmed = text.trim();
    let out_of_range = || StartTimeError::OutOfRange {
        text: quoted(trimmed),
    };
    let time = if let Ok(time) = Timestamp::from_str(trimmed) {
        time
    } else if let Ok(pieces) = jiff::fmt::temporal::Pieces::parse(trimmed) {
        // A date (a civil time would read the time of day out of it): an RFC 3339 time past
        // what a timestamp holds (9999-12-31T23:59:59Z), or no time without its offset.
        return Err(if pieces.time().is_some() && pieces.offset().is_some() {
            out_of_range()
        } else {
            StartTimeError::Malformed {
                text: quoted(trimmed),
            }
        });
    } else if let Ok(time) = Time::from_str(trimmed) {
        let now = i64::try_from(now_ms)
            .ok()
            .and_then(|ms| Timestamp::from_millisecond(ms).ok())
            .ok_or_else(out_of_range)?;
        let zone = zone().map_err(|error| StartTimeError::UnknownTimeZone {
            text: quoted(trimmed),
            reason: error.to_string(),
        })?;
        local_today(trimmed, time, now, &zone)?
    } else {
        return Err(StartTimeError::Malformed {
            text: quoted(trimmed),
        });
    };
    let at_ms = u64::try_from(time.as_millisecond()).map_err(|_| out_of_range())?;
    if at_ms <= now_ms {
        return Err(StartTimeError::Past {
            text: quoted(trimmed),
        });
    }
    Ok(at_ms)
}

/// The instant `time` names today (the day of `now`) in `zone`, refusing a time the clocks
/// skip or show twice that day.
fn local_today(
    text: &str,
    time: Time,
    now: Timestamp,
    zone: &TimeZone,
) -> Result<Timestamp, StartTimeError> {
    let today = zone.to_datetime(now).date();
    let datetime = today.to_datetime(time);
    let zone_name = || {
        zone.iana_name()
            .map_or_else(|| "this system's time zone".to_string(), str::to_string)
    };
    let out_of_range = || StartTimeError::OutOfRange { text: quoted(text) };
    // The time with one of its two offsets, as RFC 3339 writes it.
    let with = |offset: jiff::tz::Offset| {
        offset.to_timestamp(datetime).map_or_else(
            |_| datetime.to_string(),
            |at| at.display_with_offset(offset).to_string(),
        )
    };
    match zone.to_ambiguous_timestamp(datetime).offset() {
        AmbiguousOffset::Unambiguous { offset } => {
            offset.to_timestamp(datetime).map_err(|_| out_of_range())
        }
        AmbiguousOffset::Gap { before, after } => Err(StartTimeError::SkippedLocalTime {
            text: quoted(text),
            date: today.to_string(),
            zone: zone_name(),
            before: before.to_string(),
            after: after.to_string(),
        }),
        AmbiguousOffset::Fold { before, after } => Err(StartTimeError::AmbiguousLocalTime {
            text: quoted(text),
            date: today.to_string(),
            zone: zone_name(),
            first: with(before),
            second: with(after),
        }),
    }
}

/// Unix milliseconds as `YYYY-MM-DD HH:MM:SSZ` (UTC); what [`parse_time`] reads back.
pub fn format_time_s(ms: UnixMs) -> String {
    format_time(ms, "%Y-%m-%d %H:%M:%SZ")
}

/// Unix milliseconds as `YYYY-MM-DD HH:MM:SS.mmmZ` (UTC), for timelines.
pub fn format_time_ms(ms: UnixMs) -> String {
    format_time(ms, "%Y-%m-%d %H:%M:%S%.3fZ")
}

/// Unix milliseconds as JavaScript's `toISOString` writes them: `YYYY-MM-DDTHH:MM:SS.mmmZ`.
pub fn format_time_iso(ms: UnixMs) -> String {
    format_time(ms, "%Y-%m-%dT%H:%M:%S%.3fZ")
}

fn format_time(ms: UnixMs, format: &str) -> String {
    i64::try_from(ms)
        .ok()
        .and_then(|ms| Timestamp::from_millisecond(ms).ok())
        .map_or_else(
            || format!("{ms} ms"),
            |time| time.strftime(format).to_string(),
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Central European time as a POSIX rule: 2025-03-30 skips 02:00 to 03:00, 2025-10-26
    /// shows 02:00 to 03:00 twice.
    fn central_europe() -> Result<TimeZone, jiff::Error> {
        TimeZone::posix("CET-1CEST,M3.5.0,M10.5.0/3")
    }

    #[test]
    fn a_local_start_time_the_clocks_skip_or_show_twice_is_refused_naming_why() {
        // 2025-03-30T00:00:00Z, 01:00 there.
        let spring_ms = 1_743_292_800_000;
        let skipped = parse_start_time_in("02:30", spring_ms, central_europe)
            .expect_err("02:30 does not exist that day");
        assert!(
            matches!(skipped, StartTimeError::SkippedLocalTime { .. }),
            "{skipped}"
        );
        let text = skipped.to_string();
        assert!(
            text.contains("2025-03-30") && text.contains("+01") && text.contains("+02"),
            "{text}"
        );
        // An hour later is a time like any other: 03:30 CEST is 01:30Z.
        assert_eq!(
            parse_start_time_in("03:30", spring_ms, central_europe),
            Ok(1_743_298_200_000)
        );
        // 2025-10-26T00:00:00Z, 02:00 there.
        let autumn_ms = 1_761_436_800_000;
        let twice = parse_start_time_in("02:30", autumn_ms, central_europe)
            .expect_err("02:30 happens twice that day");
        assert!(
            matches!(twice, StartTimeError::AmbiguousLocalTime { .. }),
            "{twice}"
        );
        let text = twice.to_string();
        assert!(
            text.contains("2025-10-26T02:30:00+02:00")
                && text.contains("2025-10-26T02:30:00+01:00"),
            "both readings are offered: {text}"
        );
    }

    #[test]
    fn a_local_start_time_without_a_known_time_zone_is_refused_and_an_rfc_3339_one_is_not() {
        let now_ms = 1_738_324_800_000;
        let unknown = || TimeZone::get("Nowhere/Bogus");
        let error = parse_start_time_in("14:30", now_ms, unknown).expect_err("no zone");
        assert!(
            matches!(error, StartTimeError::UnknownTimeZone { .. }),
            "{error}"
        );
        assert!(error.to_string().contains("TZ="), "{error}");
        assert_eq!(
            parse_start_time_in("2025-01-31T12:00:05Z", now_ms, unknown),
            Ok(now_ms + 5_000)
        );
    }

    #[test]
    fn a_start_time_past_what_a_timestamp_holds_is_out_of_range_and_says_the_range() {
        let now_ms = 1_738_324_800_000;
        for text in ["9999-12-31T23:59:59Z", "9999-12-31T23:59:59+01:00"] {
            let error = parse_start_time(text, now_ms).expect_err("out of range");
            assert!(
                matches!(error, StartTimeError::OutOfRange { .. }),
                "{text}: {error}"
            );
            assert!(
                error
                    .to_string()
                    .contains("from 1970-01-01T00:00:00Z to 9999-12-30T22:00:00Z"),
                "{error}"
            );
        }
        // The last instant in range is a start time.
        assert!(parse_start_time("9999-12-30T22:00:00Z", now_ms).is_ok());
        // A date without a time or an offset is no start time, nor is its time of day.
        for text in ["9999-12-31", "2025-02-01T10:00:00"] {
            assert!(
                matches!(
                    parse_start_time(text, now_ms),
                    Err(StartTimeError::Malformed { .. })
                ),
                "{text}"
            );
        }
    }

    #[test]
    fn a_start_time_is_an_rfc_3339_time_or_a_local_time_today_and_never_past() {
        // 2025-01-31T12:00:00Z.
        let now_ms = 1_738_324_800_000;
        assert_eq!(
            parse_start_time("2025-01-31T12:00:05Z", now_ms),
            Ok(now_ms + 5_000)
        );
        assert_eq!(
            parse_start_time("2025-01-31T13:00:05+01:00", now_ms),
            Ok(now_ms + 5_000)
        );
        assert!(matches!(
            parse_start_time("2025-01-31T11:59:59Z", now_ms),
            Err(StartTimeError::Past { .. })
        ));
        assert!(matches!(
            parse_start_time("2025-01-31T12:00:00Z", now_ms),
            Err(StartTimeError::Past { .. })
        ));
        assert!(matches!(
            parse_start_time("soon", now_ms),
            Err(StartTimeError::Malformed { .. })
        ));
        // A local time names today in the system's zone: one second before the end of today
        // is later than now, the start of today is not.
        let zone = TimeZone::system();
        let now = Timestamp::from_millisecond(now_ms as i64).expect("in range");
        let today = zone.to_datetime(now).date();
        let last_second = zone
            .to_timestamp(today.to_datetime(Time::constant(23, 59, 59, 0)))
            .expect("in range");
        assert_eq!(
            parse_start_time("23:59:59", now_ms),
            Ok(last_second.as_millisecond() as u64)
        );
        assert!(matches!(
            parse_start_time("00:00", now_ms),
            Err(StartTimeError::Past { .. })
        ));
    }

    #[test]
    fn every_documented_form_parses() {
        let cases = [
            ("500ms", 500),
            ("30s", 30_000),
            ("5m", 300_000),
            ("2h", 7_200_000),
            ("1d", 86_400_000),
            ("1w", 7 * 86_400_000),
            ("1h30m", 5_400_000),
            ("1h 30m", 5_400_000),
            ("1d2h3m4s5ms", 93_784_005),
            (" 45s ", 45_000),
            ("90 seconds", 90_000),
            ("2 hours", 7_200_000),
            ("PT90S", 90_000),
        ];
        for (text, ms) in cases {
            assert_eq!(
                parse_duration(text),
                Ok(Duration::from_millis(ms)),
                "{text}"
            );
        }
    }

    #[test]
    fn a_bare_number_is_refused_saying_to_write_the_unit() {
        let error = parse_duration("45").expect_err("no unit");
        assert_eq!(
            error,
            DurationError::NoUnit {
                text: "45".to_string()
            }
        );
        assert!(error.to_string().contains("write 45s"), "{error}");
    }

    #[test]
    fn fractions_are_refused_saying_what_to_write() {
        for text in ["1.5s", "0,5h", ".5s"] {
            let error = parse_duration(text).expect_err("a fraction");
            assert!(
                matches!(error, DurationError::Fraction { .. }),
                "{text}: {error:?}"
            );
            assert!(error.to_string().contains("1s500ms"), "{error}");
        }
    }

    #[test]
    fn negative_zero_and_calendar_durations_are_refused() {
        for text in ["-1s", "1s ago"] {
            assert!(
                matches!(parse_duration(text), Err(DurationError::Negative { .. })),
                "{text}"
            );
        }
        for text in ["0s", "0ms", "0d"] {
            assert!(
                matches!(parse_duration(text), Err(DurationError::Zero { .. })),
                "{text}"
            );
        }
        for text in ["1mo", "1y", "1y2d"] {
            assert!(
                matches!(
                    parse_duration(text),
                    Err(DurationError::CalendarUnit { .. })
                ),
                "{text}"
            );
        }
    }

    /// Regression: `--timeout 1ns` was read as 1 ns and kept as 0 ms, and `--heartbeat 500us`
    /// as a heartbeat of 0 ms its runner refused; each is refused where it is parsed.
    #[test]
    fn a_duration_finer_than_a_millisecond_is_refused() {
        for text in ["1ns", "500us", "999us", "1s500us", "1ms1ns", "PT0.0001S"] {
            let error = parse_duration(text).expect_err("finer than a millisecond");
            assert!(
                matches!(
                    error,
                    DurationError::SubMillisecond { .. } | DurationError::Fraction { .. }
                ),
                "{text}: {error:?}"
            );
        }
        let error = parse_duration("500us").expect_err("refused");
        assert!(error.to_string().contains("at least 1ms"), "{error}");
        assert_eq!(parse_duration("1000us"), Ok(Duration::from_millis(1)));
        assert_eq!(parse_duration("1ms"), Ok(Duration::from_millis(1)));
    }

    #[test]
    fn nonsense_is_refused_with_examples() {
        for text in ["", " ", "s", "10x", "soon", "ms10", "1h30", "30 s s"] {
            let error = parse_duration(text).expect_err("not a duration");
            assert!(
                matches!(error, DurationError::Malformed { .. }),
                "{text:?}: {error:?}"
            );
            assert!(error.to_string().contains("1h30m"), "{error}");
        }
        assert!(parse_duration("99999999999999999999d").is_err());
    }

    #[test]
    fn a_refused_text_is_quoted_short() {
        let long = "x".repeat(10_000);
        let message = parse_duration(&long).expect_err("nonsense").to_string();
        assert!(message.len() < 300, "{} bytes", message.len());
    }

    #[test]
    fn durations_format_as_they_parse() {
        for ms in [1, 999, 1_000, 61_000, 5_400_000, 90_061_001] {
            let text = format_duration_ms(ms);
            assert_eq!(
                parse_duration(&text),
                Ok(Duration::from_millis(ms)),
                "{text}"
            );
        }
        assert_eq!(format_duration(Duration::from_millis(1_500)), "1s500ms");
    }

    fn now() -> UnixMs {
        ms("2025-06-15T12:00:00Z")
    }

    fn ms(text: &str) -> UnixMs {
        u64::try_from(Timestamp::from_str(text).expect("valid").as_millisecond())
            .expect("after 1970")
    }

    #[test]
    fn absolute_times_are_utc() {
        for (text, expected) in [
            ("2025-06-15T10:00:00Z", "2025-06-15T10:00:00Z"),
            ("2025-06-15T10:00:00+02:00", "2025-06-15T08:00:00Z"),
            ("2025-06-15 10:00", "2025-06-15T10:00:00Z"),
            ("2025-06-15 10:00:30", "2025-06-15T10:00:30Z"),
            ("2025-06-15", "2025-06-15T00:00:00Z"),
            // What the human output prints reads back.
            ("2025-06-15 10:00:30Z", "2025-06-15T10:00:30Z"),
        ] {
            assert_eq!(parse_time(text, now()), Ok(ms(expected)), "{text}");
        }
        assert_eq!(
            parse_time(&format_time_s(ms("2025-06-15T10:00:30Z")), now()),
            Ok(ms("2025-06-15T10:00:30Z"))
        );
    }

    #[test]
    fn relative_times_count_back_from_now_with_the_duration_grammar() {
        assert_eq!(parse_time("30s", now()), Ok(ms("2025-06-15T11:59:30Z")));
        assert_eq!(parse_time("2h", now()), Ok(ms("2025-06-15T10:00:00Z")));
        assert_eq!(parse_time("1d", now()), Ok(ms("2025-06-14T12:00:00Z")));
        assert_eq!(parse_time("1h30m", now()), Ok(ms("2025-06-15T10:30:00Z")));
        assert_eq!(parse_time("500ms", now()), Ok(now() - 500));
        // The same refusals as a timeout, said as such.
        let error = parse_time("30", now()).expect_err("no unit");
        assert!(error.to_string().contains("write 30s"), "{error}");
        assert!(parse_time("1.5h", now()).is_err());
        // 30000 days before 2025 is before 1970.
        assert!(matches!(
            parse_time("30000d", now()),
            Err(TimeError::OutOfRange { .. })
        ));
    }

    #[test]
    fn nonsense_times_are_refused_with_the_accepted_forms() {
        let error = parse_time("yesterday-ish", now()).expect_err("not a time");
        assert!(error.to_string().contains("RFC 3339"), "{error}");
        assert!(error.to_string().contains("1h30m"), "{error}");
    }

    #[test]
    fn times_format_as_known_dates() {
        assert_eq!(format_time_s(0), "1970-01-01 00:00:00Z");
        // 2000-02-29 12:34:56 UTC, a leap day.
        assert_eq!(format_time_s(951_827_696_000), "2000-02-29 12:34:56Z");
        assert_eq!(format_time_s(1_796_010_145_718), "2026-11-30 03:42:25Z");
        assert_eq!(format_time_s(4_102_444_800_000), "2100-01-01 00:00:00Z");
    }

    #[test]
    fn times_format_in_utc() {
        assert_eq!(
            format_time_s(ms("2025-06-15T10:00:30Z")),
            "2025-06-15 10:00:30Z"
        );
        assert_eq!(
            format_time_ms(ms("2025-06-15T10:00:30Z") + 7),
            "2025-06-15 10:00:30.007Z"
        );
    }
}
