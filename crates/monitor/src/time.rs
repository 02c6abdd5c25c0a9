//! RFC 3339 timestamps with nanoseconds, in UTC, as the CRI log format and `exit.json` use them.
//!
//! Formatted by hand (a few lines of calendar arithmetic) to keep a date library out of the monitor.

use std::time::{SystemTime, UNIX_EPOCH};

/// Formats `t` as `YYYY-MM-DDTHH:MM:SS.nnnnnnnnnZ` (always nine fraction digits, which Go's
/// `time.RFC3339Nano` parser, the kubelet's, accepts). Times before 1970 are clamped to the epoch.
pub fn rfc3339_nano(t: SystemTime) -> String {
    let mut out = String::with_capacity(30);
    push_rfc3339_nano(&mut out, t);
    out
}

/// Appends the timestamp of [`rfc3339_nano`] to `out` without allocating anything else.
pub fn push_rfc3339_nano(out: &mut String, t: SystemTime) {
    use std::fmt::Write;
    let since = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days as i64);
    let _ = write!(
        out,
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:09}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        since.subsec_nanos()
    );
}

/// Days since 1970-01-01 to a proleptic Gregorian (year, month, day); the well-known era-based
/// algorithm (eras of 400 years, years starting in March so leap days fall last).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097); // day of era, 0..=146096
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // year of era, 0..=399
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // day of year from March 1st, 0..=365
    let mp = (5 * doy + 2) / 153; // month from March, 0..=11
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_epoch_is_formatted_with_nine_fraction_digits() {
        assert_eq!(rfc3339_nano(UNIX_EPOCH), "1970-01-01T00:00:00.000000000Z");
    }

    #[test]
    fn formatted_times_agree_with_jiff_across_leap_days_and_centuries() {
        // 2000-02-29, 2100-03-01, 2024-12-31 23:59:59 and a few arbitrary instants.
        for secs in [951_782_400u64, 4_107_542_400, 1_735_689_599, 1_700_000_000, 86_399, 1_234_567_890] {
            let t = UNIX_EPOCH + Duration::new(secs, 123_456_789);
            let ours = rfc3339_nano(t);
            let parsed: jiff::Timestamp = ours.parse().unwrap();
            assert_eq!(parsed.as_second(), secs as i64, "{ours}");
            assert_eq!(parsed.subsec_nanosecond(), 123_456_789, "{ours}");
        }
    }

    #[test]
    fn now_is_formatted_like_jiff_formats_it() {
        let now = SystemTime::now();
        let jiff_now = jiff::Timestamp::try_from(now).unwrap();
        assert_eq!(rfc3339_nano(now), format!("{jiff_now:.9}"));
    }
}
