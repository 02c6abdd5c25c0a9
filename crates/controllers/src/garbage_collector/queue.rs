//! The collector's work queue, client-go's rate-limiting workqueue in miniature: an item is
//! queued once however often it is added, is never handed to two workers at once (added while
//! it is processed, it comes back when the worker is done), and items that fail come back after
//! a per-item exponential back-off. Time is passed in, so the queue is a plain value.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::hash::Hash;
use std::time::Duration;

use tokio::time::Instant;

/// client-go's default controller rate limiter: 5 ms doubling to 1000 s per item.
const BASE_DELAY: Duration = Duration::from_millis(5);
const MAX_DELAY: Duration = Duration::from_secs(1000);

#[derive(Debug)]
pub struct WorkQueue<K> {
    ready: VecDeque<K>,
    /// In `ready`, or waiting to be re-added once its worker is done.
    queued: HashSet<K>,
    processing: HashSet<K>,
    /// Items due later, by time (the sequence number keeps equal times apart).
    delayed: BTreeMap<(Instant, u64), K>,
    seq: u64,
    failures: HashMap<K, u32>,
}

impl<K: Clone + Eq + Hash> Default for WorkQueue<K> {
    fn default() -> Self {
        WorkQueue {
            ready: VecDeque::new(),
            queued: HashSet::new(),
            processing: HashSet::new(),
            delayed: BTreeMap::new(),
            seq: 0,
            failures: HashMap::new(),
        }
    }
}

impl<K: Clone + Eq + Hash> WorkQueue<K> {
    /// Queues `k` now (no-op if it is already queued).
    pub fn add(&mut self, k: K) {
        if !self.queued.insert(k.clone()) {
            return;
        }
        if !self.processing.contains(&k) {
            self.ready.push_back(k);
        }
    }

    /// Queues `k` at `at` (an earlier or immediate add wins).
    pub fn add_at(&mut self, k: K, at: Instant) {
        self.seq += 1;
        self.delayed.insert((at, self.seq), k);
    }

    /// Queues `k` again after its back-off, which doubles with each failure.
    pub fn add_rate_limited(&mut self, k: K, now: Instant) {
        let n = self.failures.entry(k.clone()).or_insert(0);
        let delay = BASE_DELAY.saturating_mul(2u32.saturating_pow(*n)).min(MAX_DELAY);
        *n = n.saturating_add(1);
        self.add_at(k, now + delay);
    }

    /// Clears `k`'s back-off (it succeeded).
    pub fn forget(&mut self, k: &K) {
        self.failures.remove(k);
    }

    /// The next item to work on, if one is due; it stays `processing` until [`Self::done`].
    pub fn pop(&mut self, now: Instant) -> Option<K> {
        self.promote(now);
        let k = self.ready.pop_front()?;
        self.queued.remove(&k);
        self.processing.insert(k.clone());
        Some(k)
    }

    /// The worker on `k` finished; `k` is queued again if it was added meanwhile.
    pub fn done(&mut self, k: &K) {
        self.processing.remove(k);
        if self.queued.contains(k) {
            self.ready.push_back(k.clone());
        }
    }

    /// When the next delayed item falls due.
    pub fn next_due(&self) -> Option<Instant> {
        self.delayed.keys().next().map(|(at, _)| *at)
    }

    pub fn has_ready(&self) -> bool {
        !self.ready.is_empty()
    }

    pub fn len(&self) -> usize {
        self.queued.len() + self.delayed.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn promote(&mut self, now: Instant) {
        while let Some(entry) = self.delayed.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let k = entry.remove();
            self.add(k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_item_is_queued_once_and_never_handed_out_twice_at_the_same_time() {
        let now = Instant::now();
        let mut q = WorkQueue::default();
        q.add("a");
        q.add("a");
        assert_eq!(q.pop(now), Some("a"));
        assert_eq!(q.pop(now), None);
        // Added while processing: held back until done.
        q.add("a");
        assert_eq!(q.pop(now), None);
        q.done(&"a");
        assert_eq!(q.pop(now), Some("a"));
        q.done(&"a");
        assert!(q.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn failures_back_off_exponentially_until_forgotten() {
        let mut q = WorkQueue::default();
        let start = Instant::now();
        q.add_rate_limited("a", start);
        assert_eq!(q.pop(start), None);
        assert_eq!(q.next_due(), Some(start + Duration::from_millis(5)));
        tokio::time::advance(Duration::from_millis(5)).await;
        assert_eq!(q.pop(Instant::now()), Some("a"));
        q.done(&"a");
        q.add_rate_limited("a", Instant::now());
        assert_eq!(q.next_due(), Some(Instant::now() + Duration::from_millis(10)));
        q.forget(&"a");
        q.add_rate_limited("b", Instant::now());
        q.add_rate_limited("a", Instant::now());
        let due: Vec<_> = q.delayed.keys().map(|(at, _)| *at - Instant::now()).collect();
        assert_eq!(due, vec![Duration::from_millis(5), Duration::from_millis(5), Duration::from_millis(10)]);
    }

    #[test]
    fn a_delayed_item_already_queued_stays_queued_once() {
        let now = Instant::now();
        let mut q = WorkQueue::default();
        q.add("a");
        q.add_at("a", now);
        assert_eq!(q.pop(now), Some("a"));
        assert_eq!(q.pop(now), None);
    }
}
