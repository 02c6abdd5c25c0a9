//! Back-off between restarts of a crashing container (CrashLoopBackOff) and between pulls of an
//! image that failed (ImagePullBackOff), as kubelet counts it: 10 s doubling to 5 min, and
//! forgotten once the thing ran (or waited) for twice the maximum, 10 min, since the last restart.
//!
//! Pure: every call takes the time, so tests drive it with made-up timestamps.

use std::collections::HashMap;
use std::time::Duration;

use jiff::Timestamp;

/// Back-off per key (a pod's container name, or an image and its handler).
#[derive(Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    entries: HashMap<String, Entry>,
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    delay: Duration,
    /// When the last attempt was allowed (the restart or the pull).
    last_attempt: Timestamp,
}

/// kubelet's `backOffPeriod` and `MaxContainerBackOff`.
pub const INITIAL: Duration = Duration::from_secs(10);
pub const MAX: Duration = Duration::from_secs(300);

impl Default for Backoff {
    fn default() -> Self {
        Self::new(INITIAL, MAX)
    }
}

impl Backoff {
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self { initial, max, entries: HashMap::new() }
    }

    /// The delay still holding `key` back at `now`, counted from `failed_at` (when the container
    /// finished, or the pull failed); `None` when another attempt may go ahead.
    pub fn remaining(&self, key: &str, failed_at: Timestamp, now: Timestamp) -> Option<Remaining> {
        let entry = self.entries.get(key)?;
        if self.expired(entry, failed_at) {
            return None;
        }
        let until = failed_at.checked_add(entry.delay).unwrap_or(failed_at);
        (now < until).then_some(Remaining { delay: entry.delay, until })
    }

    /// Records an attempt at `now` after a failure at `failed_at`: the first one (or the first
    /// after a long enough run) starts the delay at the initial value, later ones double it.
    pub fn attempt(&mut self, key: &str, failed_at: Timestamp, now: Timestamp) {
        let delay = match self.entries.get(key) {
            Some(entry) if !self.expired(entry, failed_at) => (entry.delay * 2).min(self.max),
            _ => self.initial,
        };
        self.entries.insert(key.to_string(), Entry { delay, last_attempt: now });
    }

    /// The delay a key is at (0 if it has none).
    #[cfg(test)]
    fn delay(&self, key: &str) -> Duration {
        self.entries.get(key).map_or(Duration::ZERO, |e| e.delay)
    }

    pub fn forget(&mut self, key: &str) {
        self.entries.remove(key);
    }

    /// A failure more than twice the maximum after the last attempt means it ran stably meanwhile.
    fn expired(&self, entry: &Entry, failed_at: Timestamp) -> bool {
        failed_at.duration_since(entry.last_attempt) > jiff::SignedDuration::try_from(self.max * 2).unwrap_or_default()
    }
}

/// A back-off in force: its current delay and when it ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Remaining {
    pub delay: Duration,
    pub until: Timestamp,
}

/// `10s`, `2m40s`, `5m0s`: Go's `time.Duration` formatting of whole seconds, as in kubelet's messages.
pub fn go_duration(d: Duration) -> String {
    let secs = d.as_secs();
    let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    if h > 0 {
        format!("{h}h{m}m{s}s")
    } else if m > 0 {
        format!("{m}m{s}s")
    } else {
        format!("{s}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).unwrap()
    }

    /// One crash loop: the container runs for `ran` seconds each time and is restarted as soon as
    /// the back-off allows. Returns the delays it waited before each restart.
    fn crash_loop(crashes: usize, ran: i64) -> Vec<u64> {
        let mut b = Backoff::default();
        let mut now = at(0);
        let mut waits = Vec::new();
        for _ in 0..crashes {
            now = now.checked_add(jiff::SignedDuration::from_secs(ran)).unwrap();
            let finished = now;
            let wait = b.remaining("app", finished, now).map_or(0, |r| r.until.duration_since(now).as_secs() as u64);
            waits.push(wait);
            now = now.checked_add(jiff::SignedDuration::from_secs(wait as i64)).unwrap();
            assert!(b.remaining("app", finished, now).is_none(), "the back-off is over at its end");
            b.attempt("app", finished, now);
        }
        waits
    }

    #[test]
    fn a_crashing_container_restarts_at_once_then_after_10s_doubling_to_5_minutes() {
        assert_eq!(crash_loop(8, 1), vec![0, 10, 20, 40, 80, 160, 300, 300]);
    }

    #[test]
    fn a_container_that_ran_for_more_than_10_minutes_starts_its_back_off_over() {
        let mut b = Backoff::default();
        b.attempt("app", at(0), at(0));
        b.attempt("app", at(5), at(15));
        assert_eq!(b.delay("app"), Duration::from_secs(20));
        // Finished 601 s after the last restart: the back-off is forgotten and starts at 10 s.
        assert!(b.remaining("app", at(616), at(616)).is_none());
        b.attempt("app", at(616), at(616));
        assert_eq!(b.delay("app"), INITIAL);
        // Exactly 10 minutes is not yet stable.
        b.attempt("app", at(1216), at(1216));
        assert_eq!(b.delay("app"), Duration::from_secs(20));
    }

    #[test]
    fn the_remaining_back_off_counts_from_the_failure() {
        let mut b = Backoff::default();
        b.attempt("img", at(0), at(0));
        let r = b.remaining("img", at(3), at(7)).unwrap();
        assert_eq!(r, Remaining { delay: INITIAL, until: at(13) });
        assert!(b.remaining("img", at(3), at(13)).is_none());
        assert!(b.remaining("other", at(3), at(4)).is_none(), "keys are separate");
        b.forget("img");
        assert!(b.remaining("img", at(3), at(4)).is_none());
    }

    #[test]
    fn durations_print_like_go() {
        assert_eq!(go_duration(Duration::from_secs(10)), "10s");
        assert_eq!(go_duration(Duration::from_secs(160)), "2m40s");
        assert_eq!(go_duration(Duration::from_secs(300)), "5m0s");
        assert_eq!(go_duration(Duration::from_secs(3661)), "1h1m1s");
    }
}
