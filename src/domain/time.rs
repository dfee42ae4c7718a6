//! Timestamps on the wire (docs/api.md §1.4): RFC 3339 in, UTC `Z` with trimmed microseconds out.

use chrono::{DateTime, SecondsFormat, Timelike, Utc};

/// Parses RFC 3339 with any offset; a timestamp without an offset is refused.
pub fn parse_rfc3339(raw: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(raw.trim()).ok().map(|t| {
        let utc = t.with_timezone(&Utc);
        // The database keeps microseconds; truncating here keeps fingerprints and round trips equal.
        utc.with_nanosecond(utc.nanosecond() / 1000 * 1000).unwrap_or(utc)
    })
}

/// UTC with `Z`, fraction to microseconds with trailing zeros trimmed, none when zero.
pub fn format(t: DateTime<Utc>) -> String {
    let micros = t.nanosecond() / 1000;
    if micros == 0 {
        return t.to_rfc3339_opts(SecondsFormat::Secs, true);
    }
    let base = t.format("%Y-%m-%dT%H:%M:%S").to_string();
    let frac = format!("{micros:06}");
    format!("{base}.{}Z", frac.trim_end_matches('0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_as_documented() {
        for s in ["2025-06-27T10:55:58Z", "2025-06-27T10:55:58.123Z", "2025-06-27T10:55:58.000001Z"] {
            assert_eq!(format(parse_rfc3339(s).unwrap()), s);
        }
        assert_eq!(format(parse_rfc3339("2025-06-27T12:55:58+02:00").unwrap()), "2025-06-27T10:55:58Z");
        assert_eq!(format(parse_rfc3339("2025-06-27T10:55:58.120000Z").unwrap()), "2025-06-27T10:55:58.12Z");
        assert!(parse_rfc3339("2025-06-27T10:55:58").is_none());
    }
}
