//! Expectations: the creates and deletes a controller has issued and not yet seen come back
//! through its watch, so that it never acts twice on a stale cache.
//!
//! As kube-controller-manager's `ControllerExpectations` and `UIDTrackingControllerExpectations`:
//! before creating N pods the controller expects N creations (a count, because generated names
//! are only known after the create returns, and the watch may deliver the pod before that);
//! before deleting pods it expects the deletion of exactly those pods (by `namespace/name`). Each
//! pod seen added lowers the count, each of those pods seen deleted (or marked for deletion) is
//! struck off, and a create or delete that failed is struck off by the controller itself. A
//! controller syncs its pods only when its expectations are fulfilled, absent, or older than
//! [`EXPECTATIONS_TIMEOUT`] (a lost watch event must not wedge it forever).
//!
//! The clock is tokio's, so tests run it paused.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use tokio::time::Instant;

/// Expectations older than this are considered satisfied (`ExpectationsTimeout`).
pub const EXPECTATIONS_TIMEOUT: Duration = Duration::from_secs(5 * 60);

#[derive(Debug)]
struct Expected {
    /// Creations still to be observed.
    add: i64,
    /// Pods whose deletion is still to be observed.
    deletions: HashSet<String>,
    /// When the expectations were set.
    at: Instant,
}

impl Expected {
    fn fulfilled(&self) -> bool {
        self.add <= 0 && self.deletions.is_empty()
    }
}

/// Expectations of every controller of one kind, keyed by the controller's `namespace/name`.
#[derive(Debug, Default)]
pub struct Expectations {
    by_controller: HashMap<String, Expected>,
}

impl Expectations {
    /// Whether the controller may act on its cache now (`SatisfiedExpectations`).
    pub fn satisfied(&self, key: &str, now: Instant) -> bool {
        match self.by_controller.get(key) {
            Some(e) => e.fulfilled() || now.duration_since(e.at) > EXPECTATIONS_TIMEOUT,
            None => true,
        }
    }

    /// How long until unfulfilled expectations expire, if there are any.
    pub fn expires_in(&self, key: &str, now: Instant) -> Option<Duration> {
        let e = self.by_controller.get(key).filter(|e| !e.fulfilled())?;
        Some(EXPECTATIONS_TIMEOUT.saturating_sub(now.duration_since(e.at)))
    }

    /// About to create `count` pods; replaces earlier expectations (`ExpectCreations`).
    pub fn expect_creations(&mut self, key: &str, count: usize, now: Instant) {
        let e = Expected { add: count as i64, deletions: HashSet::new(), at: now };
        self.by_controller.insert(key.to_string(), e);
    }

    /// About to delete these pods (`namespace/name`); replaces earlier expectations.
    pub fn expect_deletions(&mut self, key: &str, pods: impl IntoIterator<Item = String>, now: Instant) {
        let e = Expected { add: 0, deletions: pods.into_iter().collect(), at: now };
        self.by_controller.insert(key.to_string(), e);
    }

    /// A pod of the controller was seen created, or a create failed (`CreationObserved`).
    pub fn creation_observed(&mut self, key: &str) {
        if let Some(e) = self.by_controller.get_mut(key) {
            e.add -= 1;
        }
    }

    /// A pod was seen deleted (or marked for deletion), or its delete failed; only pods the
    /// controller is waiting for count (`DeletionObserved`).
    pub fn deletion_observed(&mut self, key: &str, pod: &str) {
        if let Some(e) = self.by_controller.get_mut(key) {
            e.deletions.remove(pod);
        }
    }

    /// The controller is gone (`DeleteExpectations`).
    pub fn forget(&mut self, key: &str) {
        self.by_controller.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_controller_without_expectations_may_sync() {
        let e = Expectations::default();
        assert!(e.satisfied("ns/rs", Instant::now()));
        assert_eq!(e.expires_in("ns/rs", Instant::now()), None);
    }

    #[tokio::test(start_paused = true)]
    async fn creations_are_satisfied_once_each_is_observed() {
        let mut e = Expectations::default();
        e.expect_creations("ns/rs", 3, Instant::now());
        e.creation_observed("ns/rs");
        e.creation_observed("ns/rs");
        assert!(!e.satisfied("ns/rs", Instant::now()));
        e.creation_observed("ns/rs");
        assert!(e.satisfied("ns/rs", Instant::now()));
        // Observing more than expected (a pod created by someone else) does no harm.
        e.creation_observed("ns/rs");
        assert!(e.satisfied("ns/rs", Instant::now()));
    }

    #[tokio::test(start_paused = true)]
    async fn only_the_expected_pods_satisfy_deletions() {
        let mut e = Expectations::default();
        e.expect_deletions("ns/rs", ["ns/a".to_string(), "ns/b".to_string()], Instant::now());
        e.deletion_observed("ns/rs", "ns/other");
        e.deletion_observed("ns/rs", "ns/a");
        e.deletion_observed("ns/rs", "ns/a");
        assert!(!e.satisfied("ns/rs", Instant::now()));
        e.deletion_observed("ns/rs", "ns/b");
        assert!(e.satisfied("ns/rs", Instant::now()));
    }

    #[tokio::test(start_paused = true)]
    async fn unobserved_expectations_expire_after_five_minutes() {
        let mut e = Expectations::default();
        e.expect_creations("ns/rs", 2, Instant::now());
        tokio::time::advance(Duration::from_secs(60)).await;
        assert!(!e.satisfied("ns/rs", Instant::now()));
        assert_eq!(e.expires_in("ns/rs", Instant::now()), Some(Duration::from_secs(240)));
        tokio::time::advance(Duration::from_secs(240)).await;
        assert!(!e.satisfied("ns/rs", Instant::now()), "exactly at the timeout they still hold");
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(e.satisfied("ns/rs", Instant::now()));
    }

    #[tokio::test(start_paused = true)]
    async fn new_expectations_replace_old_ones_and_forget_drops_them() {
        let mut e = Expectations::default();
        e.expect_creations("ns/rs", 2, Instant::now());
        e.expect_deletions("ns/rs", ["ns/a".to_string()], Instant::now());
        e.deletion_observed("ns/rs", "ns/a");
        assert!(e.satisfied("ns/rs", Instant::now()), "the creations were replaced");
        e.expect_creations("ns/rs", 1, Instant::now());
        e.forget("ns/rs");
        assert!(e.satisfied("ns/rs", Instant::now()));
        // Lowering expectations nobody holds is a no-op.
        e.creation_observed("ns/x");
        e.deletion_observed("ns/x", "ns/a");
        assert!(e.satisfied("ns/x", Instant::now()));
    }
}
