//! The wall clock the pod workers read: the system's, or in tests one that moves with Tokio's
//! (pausable) clock, so that back-offs and grace periods can be driven by `tokio::time::advance`.

use jiff::Timestamp;

/// Where "now" comes from.
#[derive(Clone, Copy, Debug, Default)]
pub struct Clock {
    /// A wall time and the Tokio instant it was taken at; `None` reads the system clock.
    follows_tokio: Option<(Timestamp, tokio::time::Instant)>,
}

impl Clock {
    /// The system clock.
    pub fn system() -> Clock {
        Clock::default()
    }

    /// A clock at `at` now that moves on with Tokio's clock.
    #[cfg(test)]
    pub fn following_tokio(at: Timestamp) -> Clock {
        Clock { follows_tokio: Some((at, tokio::time::Instant::now())) }
    }

    pub fn now(&self) -> Timestamp {
        match self.follows_tokio {
            None => Timestamp::now(),
            Some((at, origin)) => {
                let since = jiff::SignedDuration::try_from(origin.elapsed()).unwrap_or_default();
                at.checked_add(since).unwrap_or(at)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn a_clock_following_tokio_moves_exactly_as_far_as_tokio_is_advanced() {
        let at: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let clock = Clock::following_tokio(at);
        assert_eq!(clock.now(), at);
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(clock.now(), "2026-01-01T00:00:10Z".parse::<Timestamp>().unwrap());
    }
}
