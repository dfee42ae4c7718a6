//! Timestamps on the wire (docs/api.md §1.4): RFC 3339 in, UTC `Z` with trimmed microseconds out.

use chrono::{DateTime, Datelike, SecondsFormat, Timelike, Utc};

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
    match Stamp::of(t) {
        Some(stamp) => stamp.as_str().to_string(),
        None => strftime_format(t),
    }
}

/// A timestamp as [`format`] writes it, serialised without allocating. Pull pages write three per
/// record; chrono's `strftime` interpreter and the strings it built were the largest item of the
/// pull handler's own profile.
#[derive(Clone, Copy)]
pub struct WireTime(pub DateTime<Utc>);

impl serde::Serialize for WireTime {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match Stamp::of(self.0) {
            Some(stamp) => serializer.serialize_str(stamp.as_str()),
            None => serializer.serialize_str(&strftime_format(self.0)),
        }
    }
}

/// A timestamp as the database sends it, in microseconds since 1970-01-01T00:00:00Z, within the
/// range of `DateTime<Utc>`. Pull pages write three per record straight from these, without the
/// calendar arithmetic of building a `DateTime` first; the rare year outside 0–9999 keeps its
/// `DateTime` for chrono to write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnixMicros {
    /// A year from 0 to 9999.
    Common(i64),
    Other(DateTime<Utc>),
}

/// 0000-01-01T00:00:00Z and 10000-01-01T00:00:00Z, in microseconds since 1970.
const COMMON_YEARS: std::ops::Range<i64> = -62_167_219_200_000_000..253_402_300_800_000_000;

impl UnixMicros {
    /// `None` outside the range of `DateTime<Utc>`, which is what could be decoded before.
    pub fn new(micros: i64) -> Option<Self> {
        if COMMON_YEARS.contains(&micros) {
            Some(UnixMicros::Common(micros))
        } else {
            DateTime::<Utc>::from_timestamp_micros(micros).map(UnixMicros::Other)
        }
    }

    pub fn of(t: DateTime<Utc>) -> Self {
        let micros = t.timestamp_micros();
        if COMMON_YEARS.contains(&micros) {
            UnixMicros::Common(micros)
        } else {
            UnixMicros::Other(t)
        }
    }

    /// The timestamp as [`format`] writes it, as a JSON string.
    pub fn write_json(self, out: &mut Vec<u8>) {
        match self {
            UnixMicros::Common(micros) => {
                let days = micros.div_euclid(MICROS_PER_DAY);
                let in_day = micros.rem_euclid(MICROS_PER_DAY);
                let (year, month, day) = civil_from_days(days);
                let (secs, micros) = ((in_day / 1_000_000) as u32, (in_day % 1_000_000) as u32);
                // The range holds years 0 to 9999 only.
                let stamp = Stamp::from_parts(
                    year as u32,
                    month,
                    day,
                    secs / 3600,
                    secs / 60 % 60,
                    secs % 60,
                    micros,
                );
                out.push(b'"');
                out.extend_from_slice(stamp.as_str().as_bytes());
                out.push(b'"');
            }
            UnixMicros::Other(t) => {
                // Into a Vec, serialising a string cannot fail.
                let _ = serde_json::to_writer(out, &strftime_format(t));
            }
        }
    }
}

const MICROS_PER_DAY: i64 = 86_400_000_000;

/// The proleptic Gregorian (year, month, day) of a day counted from 1970-01-01 (H. Hinnant's
/// `civil_from_days`: whole 400-year eras, then the year within the era from March on).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * month_from_march + 2) / 5 + 1) as u32;
    let month = if month_from_march < 10 { month_from_march + 3 } else { month_from_march - 9 } as u32;
    (year_of_era + era * 400 + i64::from(month <= 2), month, day)
}

/// The common case (years 0–9999, no leap second) written digit by digit.
struct Stamp {
    buf: [u8; 27],
    len: usize,
}

impl Stamp {
    fn of(t: DateTime<Utc>) -> Option<Stamp> {
        let (date, time) = (t.date_naive(), t.time());
        let (year, nanos) = (date.year(), time.nanosecond());
        if !(0..=9999).contains(&year) || nanos >= 1_000_000_000 {
            return None;
        }
        let (hour, minute, second) = (time.hour(), time.minute(), time.second());
        Some(Stamp::from_parts(
            year.unsigned_abs(),
            date.month(),
            date.day(),
            hour,
            minute,
            second,
            nanos / 1000,
        ))
    }

    fn from_parts(
        year: u32,
        month: u32,
        day: u32,
        hour: u32,
        minute: u32,
        second: u32,
        micros: u32,
    ) -> Stamp {
        let mut buf = *b"0000-00-00T00:00:00.000000Z";
        let mut put = |at: usize, width: usize, mut value: u32| {
            for i in (at..at + width).rev() {
                buf[i] = b'0' + (value % 10) as u8;
                value /= 10;
            }
        };
        put(0, 4, year);
        put(5, 2, month);
        put(8, 2, day);
        put(11, 2, hour);
        put(14, 2, minute);
        put(17, 2, second);
        put(20, 6, micros);
        let mut end = 26;
        while end > 20 && buf[end - 1] == b'0' {
            end -= 1;
        }
        if end == 20 {
            end = 19; // no fraction: no dot either
        }
        buf[end] = b'Z';
        Stamp { buf, len: end + 1 }
    }

    fn as_str(&self) -> &str {
        // Only ASCII digits and punctuation were written.
        std::str::from_utf8(&self.buf[..self.len]).unwrap_or_default()
    }
}

/// Appends `t` as chrono's `Serialize` writes it (RFC 3339 with `Z` and a fraction of 0, 3, 6 or
/// 9 digits), the form the push fingerprint hashes, without chrono's formatter.
pub fn write_serde_form(out: &mut String, t: DateTime<Utc>) {
    let Some(stamp) = Stamp::of(t) else {
        out.push_str(&t.to_rfc3339_opts(SecondsFormat::AutoSi, true));
        return;
    };
    let text = stamp.as_str();
    let nanos = t.nanosecond();
    // The stamp's fraction is to microseconds, trailing zeros trimmed; chrono writes 3 digits for
    // whole milliseconds, else 6, else 9.
    let digits = match nanos {
        0 => 0,
        n if n % 1_000_000 == 0 => 3,
        n if n % 1_000 == 0 => 6,
        _ => {
            out.push_str(&t.to_rfc3339_opts(SecondsFormat::AutoSi, true));
            return;
        }
    };
    let seconds = &text[..19];
    out.push_str(seconds);
    if digits > 0 {
        let fraction = text.get(20..text.len() - 1).unwrap_or_default();
        out.push('.');
        out.push_str(fraction);
        for _ in fraction.len()..digits {
            out.push('0');
        }
    }
    out.push('Z');
}

fn strftime_format(t: DateTime<Utc>) -> String {
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

    /// A fixed pseudo-random sequence (xorshift64), so a failure names inputs that reproduce.
    fn xorshift(mut seed: u64) -> impl FnMut() -> u64 {
        move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        }
    }

    #[test]
    fn round_trips_as_documented() {
        for s in ["2025-06-27T10:55:58Z", "2025-06-27T10:55:58.123Z", "2025-06-27T10:55:58.000001Z"] {
            assert_eq!(format(parse_rfc3339(s).unwrap()), s);
        }
        assert_eq!(format(parse_rfc3339("2025-06-27T12:55:58+02:00").unwrap()), "2025-06-27T10:55:58Z");
        assert_eq!(format(parse_rfc3339("2025-06-27T10:55:58.120000Z").unwrap()), "2025-06-27T10:55:58.12Z");
        assert!(parse_rfc3339("2025-06-27T10:55:58").is_none());
    }

    #[test]
    fn the_serde_form_is_chronos() {
        use chrono::TimeZone;
        let mut next = xorshift(0x9e37_79b9_7f4a_7c15_u64);
        let edges = [0i64, 1, -1, 253_402_300_799, 253_402_300_800, -62_167_219_200, -62_167_219_201];
        let spread: Vec<i64> =
            (0..20_000).map(|_| (next() % 600_000_000_000) as i64 - 200_000_000_000).collect();
        for secs in edges.into_iter().chain(spread) {
            for nanos in [
                0u32,
                1,
                1_000,
                10_000,
                120_000_000,
                999_999_000,
                999_999_999,
                (next() % 1_000_000_000) as u32,
            ] {
                let Some(t) = Utc.timestamp_opt(secs, nanos).single() else { continue };
                let mut out = String::new();
                write_serde_form(&mut out, t);
                assert_eq!(format!("\"{out}\""), serde_json::to_string(&t).unwrap(), "{secs} {nanos}");
            }
        }
        // A leap second.
        let leap = chrono::NaiveDate::from_ymd_opt(2016, 12, 31).unwrap().and_hms_nano_opt(
            23,
            59,
            59,
            1_500_000_000,
        );
        let t = leap.unwrap().and_utc();
        let mut out = String::new();
        write_serde_form(&mut out, t);
        assert_eq!(format!("\"{out}\""), serde_json::to_string(&t).unwrap());
    }

    #[test]
    fn digit_by_digit_equals_strftime() {
        use chrono::TimeZone;
        let mut next = xorshift(0x2545_f491_4f6c_dd1d_u64);
        let edges = [0i64, 1, -1, 253_402_300_799, -62_167_219_200, 951_782_400, 1_719_316_800];
        let spread: Vec<i64> =
            (0..20_000).map(|_| (next() % 400_000_000_000) as i64 - 70_000_000_000).collect();
        for secs in edges.into_iter().chain(spread) {
            for micros in [0u32, 1, 10, 120_000, 999_999, (next() % 1_000_000) as u32] {
                let t = Utc.timestamp_opt(secs, micros * 1000).unwrap();
                assert_eq!(format(t), strftime_format(t), "{secs} {micros}");
            }
        }
    }

    #[test]
    fn unix_micros_are_written_as_the_wire_time_of_the_same_instant() {
        let mut next = xorshift(0x9e37_79b9_7f4a_7c15_u64);
        let (min, max) =
            (DateTime::<Utc>::MIN_UTC.timestamp_micros(), DateTime::<Utc>::MAX_UTC.timestamp_micros());
        let year_0 = -62_167_219_200_000_000_i64;
        let year_10000 = 253_402_300_800_000_000_i64;
        let edges = [min, max, 0, -1, 1, year_0, year_0 - 1, year_10000, year_10000 - 1, 951_782_400_000_000];
        let span = (i128::from(max) - i128::from(min)) as u64;
        let mut instants = edges.to_vec();
        for _ in 0..100_000 {
            instants.push((next() % 4_000_000_000_000_000) as i64 - 1_000_000_000_000_000);
            instants.push((i128::from(min) + i128::from(next() % span)) as i64);
            instants.push(((next() % 400_000_000_000) as i64 - 70_000_000_000) * 1_000_000);
        }
        for micros in instants {
            let t = DateTime::<Utc>::from_timestamp_micros(micros).unwrap();
            let mut written = Vec::new();
            UnixMicros::new(micros).unwrap().write_json(&mut written);
            assert_eq!(
                String::from_utf8(written).unwrap(),
                serde_json::to_string(&WireTime(t)).unwrap(),
                "{micros}"
            );
        }
        assert_eq!(UnixMicros::new(min - 1), None);
        assert_eq!(UnixMicros::new(max + 1), None);
    }
}
