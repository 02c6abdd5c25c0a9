//! RFC 3339 timestamps as Kubernetes writes them in objects and query parameters.

/// Kubernetes' timestamp format (`metav1.Time`): RFC 3339 with whole seconds, in UTC, e.g.
/// `2024-01-02T03:04:05Z`; a fraction of a second is dropped, not rounded.
pub fn rfc3339(ts: jiff::Timestamp) -> String {
    ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// [`rfc3339`] of now.
pub fn now_rfc3339() -> String {
    rfc3339(jiff::Timestamp::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> String {
        rfc3339(jiff::Timestamp::from_second(secs).unwrap())
    }

    #[test]
    fn dates_are_whole_seconds_in_utc_across_leap_days() {
        assert_eq!(at(0), "1970-01-01T00:00:00Z");
        assert_eq!(at(1_704_067_200), "2024-01-01T00:00:00Z");
        assert_eq!(at(951_782_400 + 3661), "2000-02-29T01:01:01Z");
    }

    #[test]
    fn a_fraction_of_a_second_is_dropped() {
        let ts = jiff::Timestamp::new(1_704_067_200, 999_999_999).unwrap();
        assert_eq!(rfc3339(ts), "2024-01-01T00:00:00Z");
    }
}
