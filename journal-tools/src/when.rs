//! `--since` / `--until`: absolute times (RFC 3339, or `YYYY-MM-DD[ HH:MM[:SS]]` in UTC) and
//! relative ones (`30s`, `2h`, `1d`, `1h30m`: that long before now).

use std::str::FromStr;

use jiff::civil::{Date, DateTime};
use jiff::tz::TimeZone;
use jiff::{Span, SpanRelativeTo, Timestamp};

/// Parses a time argument into Unix milliseconds, relative ones counted back from `now`.
pub fn parse_time(text: &str, now: Timestamp) -> Result<u64, String> {
    let text = text.trim();
    let time = if let Ok(time) = Timestamp::from_str(text) {
        time
    } else if let Ok(datetime) = DateTime::from_str(text) {
        TimeZone::UTC
            .to_timestamp(datetime)
            .map_err(|error| format!("{text:?}: {error}"))?
    } else if let Ok(date) = Date::from_str(text) {
        TimeZone::UTC
            .to_timestamp(date.to_datetime(jiff::civil::Time::midnight()))
            .map_err(|error| format!("{text:?}: {error}"))?
    } else if let Ok(span) = Span::from_str(text) {
        let ago = span
            .to_duration(SpanRelativeTo::days_are_24_hours())
            .map_err(|error| format!("{text:?}: {error}"))?;
        now.checked_sub(ago.abs())
            .map_err(|error| format!("{text:?}: {error}"))?
    } else {
        return Err(format!(
            "{text:?} is not a time: give an RFC 3339 time (2025-01-31T12:00:00Z), a UTC date and time (2025-01-31 12:00), or a time before now (30s, 2h, 1d)"
        ));
    };
    u64::try_from(time.as_millisecond()).map_err(|_| format!("{text:?} is before 1970"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> Timestamp {
        Timestamp::from_str("2025-06-15T12:00:00Z").expect("valid")
    }

    fn ms(text: &str) -> u64 {
        u64::try_from(Timestamp::from_str(text).expect("valid").as_millisecond())
            .expect("after 1970")
    }

    #[test]
    fn absolute_times_are_utc() {
        assert_eq!(
            parse_time("2025-06-15T10:00:00Z", now()),
            Ok(ms("2025-06-15T10:00:00Z"))
        );
        assert_eq!(
            parse_time("2025-06-15T10:00:00+02:00", now()),
            Ok(ms("2025-06-15T08:00:00Z"))
        );
        assert_eq!(
            parse_time("2025-06-15 10:00", now()),
            Ok(ms("2025-06-15T10:00:00Z"))
        );
        assert_eq!(
            parse_time("2025-06-15 10:00:30", now()),
            Ok(ms("2025-06-15T10:00:30Z"))
        );
        assert_eq!(
            parse_time("2025-06-15", now()),
            Ok(ms("2025-06-15T00:00:00Z"))
        );
        // What the human output prints reads back.
        assert_eq!(
            parse_time("2025-06-15 10:00:30Z", now()),
            Ok(ms("2025-06-15T10:00:30Z"))
        );
    }

    #[test]
    fn relative_times_count_back_from_now() {
        assert_eq!(parse_time("30s", now()), Ok(ms("2025-06-15T11:59:30Z")));
        assert_eq!(parse_time("2h", now()), Ok(ms("2025-06-15T10:00:00Z")));
        assert_eq!(parse_time("1d", now()), Ok(ms("2025-06-14T12:00:00Z")));
        assert_eq!(parse_time("1h30m", now()), Ok(ms("2025-06-15T10:30:00Z")));
    }

    #[test]
    fn nonsense_is_refused_with_the_accepted_forms() {
        let error = parse_time("yesterday-ish", now()).expect_err("not a time");
        assert!(error.contains("RFC 3339"), "{error}");
    }
}
