//! Per-object retry back-off for the error policies, as client-go's default controller rate
//! limiter's per-item part: 5 ms doubling with each consecutive failure, at most 1000 s, reset
//! by a success.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

const BASE: Duration = Duration::from_millis(5);
const MAX: Duration = Duration::from_secs(1000);

#[derive(Debug, Default)]
pub struct Retry {
    failures: Mutex<HashMap<String, u32>>,
}

impl Retry {
    /// Counts a failure of `key` and returns how long to wait before trying again.
    pub fn failed(&self, key: &str) -> Duration {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let n = failures.entry(key.to_string()).or_default();
        let delay = BASE.saturating_mul(2u32.saturating_pow((*n).min(30))).min(MAX);
        *n = n.saturating_add(1);
        delay
    }

    /// `key` succeeded: its next failure starts over.
    pub fn succeeded(&self, key: &str) {
        self.failures.lock().unwrap_or_else(|e| e.into_inner()).remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_per_failure_up_to_the_maximum_and_reset_on_success() {
        let r = Retry::default();
        let delays: Vec<Duration> = (0..4).map(|_| r.failed("a")).collect();
        assert_eq!(delays, [5, 10, 20, 40].map(Duration::from_millis));
        assert_eq!(r.failed("b"), Duration::from_millis(5), "keys are independent");
        for _ in 0..40 {
            r.failed("a");
        }
        assert_eq!(r.failed("a"), MAX);
        r.succeeded("a");
        assert_eq!(r.failed("a"), Duration::from_millis(5));
    }
}
