//! Paces the syncs of one object by what they cost: a sync that reads every pod of a large
//! ReplicaSet (claiming them, counting the ready and available ones) costs in proportion to its
//! pods, and every change of any of them asks for another. Back to back, the syncs of a
//! ReplicaSet of 50,000 pods would take a core of their own. After a sync whose pass over the
//! pods took `t`, the next sync of that object waits until `SHARE` × `t` has gone by since it
//! ended, so that the passes over one object take at most 1 / (1 + `SHARE`) of a core. Changes
//! that arrive meanwhile are served by that next sync, as kube's controller runtime holds the
//! requests of an object while its reconcile runs; a small ReplicaSet's pass takes microseconds,
//! and its syncs are not held back in any way that matters.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The rest of a core left to other work for each unit of time a pass over one object's pods took.
const SHARE: u32 = 9;
/// The longest a sync is held back, whatever the last pass cost.
const MAX_WAIT: Duration = Duration::from_secs(1);

#[derive(Debug, Default)]
pub struct Pacing {
    /// Per object key: when its last sync ended, and how long its pass over the pods took.
    last: Mutex<HashMap<String, (Instant, Duration)>>,
}

impl Pacing {
    /// How long the sync of `key` about to start at `now` waits first.
    pub fn wait_before(&self, key: &str, now: Instant) -> Option<Duration> {
        let last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let &(ended, cost) = last.get(key)?;
        let ready_at = ended + cost.saturating_mul(SHARE).min(MAX_WAIT);
        ready_at.checked_duration_since(now).filter(|d| !d.is_zero())
    }

    /// The sync of `key` ended at `now`; its pass over the pods took `cost`.
    pub fn ended(&self, key: &str, cost: Duration, now: Instant) {
        self.last.lock().unwrap_or_else(|e| e.into_inner()).insert(key.to_string(), (now, cost));
    }

    /// `key` is gone.
    pub fn forget(&self, key: &str) {
        self.last.lock().unwrap_or_else(|e| e.into_inner()).remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sync_waits_in_proportion_to_what_the_last_pass_over_its_pods_cost() {
        let p = Pacing::default();
        let t0 = Instant::now();
        assert_eq!(p.wait_before("a", t0), None, "a first sync does not wait");
        p.ended("a", Duration::from_millis(20), t0);
        assert_eq!(p.wait_before("a", t0), Some(Duration::from_millis(180)));
        assert_eq!(p.wait_before("a", t0 + Duration::from_millis(50)), Some(Duration::from_millis(130)));
        assert_eq!(p.wait_before("a", t0 + Duration::from_millis(180)), None, "the time has gone by");
        assert_eq!(p.wait_before("b", t0), None, "other objects are paced by their own passes");
    }

    #[test]
    fn no_sync_waits_longer_than_the_maximum_and_a_forgotten_object_not_at_all() {
        let p = Pacing::default();
        let t0 = Instant::now();
        p.ended("big", Duration::from_secs(3), t0);
        assert_eq!(p.wait_before("big", t0), Some(MAX_WAIT));
        p.forget("big");
        assert_eq!(p.wait_before("big", t0), None);
    }
}
