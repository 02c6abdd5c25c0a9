//! The queue of pods waiting for a node, as kube-scheduler's: an active queue ordered by
//! priority then age, a back-off queue (1 s doubling to 10 s per failed attempt), the
//! unschedulable pods waiting for a cluster event that could make them fit, and gated pods.
//!
//! It is a state machine over explicit instants: every call takes `now`, so the shell feeds it
//! the clock and tests run it on a paused one. A pod moves:
//! - added → `Active` (or `Gated` while it has scheduling gates);
//! - `pop` → in flight; then `done` (bound), `unschedulable` or `error`;
//! - unschedulable → `Unschedulable`, or `Backoff` if a cluster event arrived while it was in
//!   flight (the event may already have made it fit, as Kubernetes' move-request cycle);
//! - error → `Backoff`;
//! - a cluster event moves `Unschedulable` pods rejected by a plugin the event concerns to
//!   `Backoff` if their back-off has not expired, else to `Active`; so does an update of the pod
//!   that could change where it fits; after 5 minutes an unschedulable pod is tried again anyway.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::pod_info::PodInfo;

pub const INITIAL_BACKOFF: Duration = Duration::from_secs(1);
pub const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// Kubernetes' `podMaxInUnschedulablePodsDuration`.
pub const MAX_UNSCHEDULABLE: Duration = Duration::from_secs(300);

/// What happened in the cluster; each concerns the plugins whose verdict it could change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClusterEvent {
    /// A node was added or its labels, taints, allocatable, runtime handlers or
    /// schedulability changed.
    NodeChanged,
    /// A pod bound to a node was deleted or finished: resources and ports were freed.
    AssignedPodDeleted,
    /// A pod was bound to a node or its labels changed: affinity and spreading may now hold.
    AssignedPodAdded,
    /// A RuntimeClass was created or changed.
    RuntimeClassChanged,
    /// A namespace's labels changed (affinity namespace selectors).
    NamespaceChanged,
}

impl ClusterEvent {
    fn concerns(self, plugin: &str) -> bool {
        use crate::plugins::*;
        match self {
            ClusterEvent::NodeChanged => true,
            ClusterEvent::AssignedPodDeleted => {
                [node_resources::NAME, node_ports::NAME, inter_pod_affinity::NAME, pod_topology_spread::NAME]
                    .contains(&plugin)
            }
            ClusterEvent::AssignedPodAdded => [inter_pod_affinity::NAME, pod_topology_spread::NAME].contains(&plugin),
            ClusterEvent::RuntimeClassChanged => plugin == runtime_class::NAME,
            ClusterEvent::NamespaceChanged => plugin == inter_pod_affinity::NAME,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Location {
    Active,
    Backoff,
    Unschedulable,
    Gated,
    InFlight,
}

/// A pod in the queue with its scheduling history.
#[derive(Clone, Debug)]
pub struct QueuedPod {
    pub pod: Arc<PodInfo>,
    /// Attempts so far, counting the one in flight.
    pub attempts: u32,
    /// When it was first popped: the start of its end-to-end scheduling latency.
    pub initial_attempt: Option<Instant>,
    /// When it was added, or last failed.
    pub timestamp: Instant,
    /// The plugins that rejected it last time.
    pub unschedulable_plugins: Vec<&'static str>,
    /// The PodScheduled message last reported for it, to write a condition only when it changes.
    pub reported_message: Option<String>,
}

struct Entry {
    queued: QueuedPod,
    at: Location,
    /// Bumped on every move, so stale heap keys are recognised and skipped.
    generation: u64,
    /// The scheduling cycle that popped it.
    cycle: u64,
    /// Changed while in flight: a failure sends it to back-off, not to wait for an event.
    updated_in_flight: bool,
}

#[derive(PartialEq, Eq)]
struct ActiveKey {
    priority: i32,
    timestamp: Instant,
    generation: u64,
    uid: Arc<str>,
}

impl Ord for ActiveKey {
    fn cmp(&self, other: &Self) -> Ordering {
        // Higher priority first, then the older pod (the max of the heap is popped).
        self.priority
            .cmp(&other.priority)
            .then_with(|| other.timestamp.cmp(&self.timestamp))
            .then_with(|| other.generation.cmp(&self.generation))
    }
}

impl PartialOrd for ActiveKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Pods waiting in each part of the queue, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub active: usize,
    pub backoff: usize,
    pub unschedulable: usize,
    pub gated: usize,
}

#[derive(Default)]
pub struct SchedulingQueue {
    entries: HashMap<Arc<str>, Entry>,
    active: BinaryHeap<ActiveKey>,
    backoff: BinaryHeap<Reverse<(Instant, u64, Arc<str>)>>,
    /// UIDs of the entries in `Unschedulable`, so events and flushes do not scan every pod.
    unschedulable: HashSet<Arc<str>>,
    /// Unschedulable pods are checked for their timeout once a second, not on every flush.
    next_timeout_scan: Option<Instant>,
    next_generation: u64,
    cycle: u64,
    move_request_cycle: u64,
}

/// Back-off after `attempts` failed attempts: 1 s, 2 s, 4 s, 8 s, then 10 s.
pub fn backoff_duration(attempts: u32) -> Duration {
    let mut d = INITIAL_BACKOFF;
    for _ in 1..attempts {
        if d > MAX_BACKOFF - d {
            return MAX_BACKOFF;
        }
        d += d;
    }
    d.min(MAX_BACKOFF)
}

impl SchedulingQueue {
    pub fn new() -> SchedulingQueue {
        SchedulingQueue::default()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn location(&self, uid: &str) -> Option<Location> {
        self.entries.get(uid).map(|e| e.at)
    }

    pub fn get(&self, uid: &str) -> Option<&QueuedPod> {
        self.entries.get(uid).map(|e| &e.queued)
    }

    pub fn counts(&self) -> Counts {
        let mut c = Counts::default();
        for e in self.entries.values() {
            match e.at {
                Location::Active => c.active += 1,
                Location::Backoff => c.backoff += 1,
                Location::Unschedulable => c.unschedulable += 1,
                Location::Gated => c.gated += 1,
                Location::InFlight => {}
            }
        }
        c
    }

    /// A pending pod was added or changed.
    pub fn add(&mut self, pod: Arc<PodInfo>, now: Instant) {
        let uid: Arc<str> = pod.uid.as_str().into();
        let Some(entry) = self.entries.get_mut(&uid) else {
            // What an earlier run of the scheduler reported is not reported again.
            let reported_message = pod.reported_unschedulable.clone();
            let queued = QueuedPod {
                pod,
                attempts: 0,
                initial_attempt: None,
                timestamp: now,
                unschedulable_plugins: Vec::new(),
                reported_message,
            };
            let gated = !queued.pod.scheduling_gates.is_empty();
            self.entries.insert(
                uid.clone(),
                Entry { queued, at: Location::Gated, generation: 0, cycle: 0, updated_in_flight: false },
            );
            if !gated {
                self.move_to(&uid, Location::Active, now);
            }
            return;
        };
        let changed = pod.scheduling_changed(&entry.queued.pod);
        let old_priority = entry.queued.pod.priority;
        entry.queued.pod = pod;
        match entry.at {
            Location::InFlight => entry.updated_in_flight |= changed,
            Location::Gated if entry.queued.pod.scheduling_gates.is_empty() => {
                self.move_to(&uid, Location::Active, now)
            }
            Location::Unschedulable if changed => self.requeue(&uid, now),
            Location::Active if entry.queued.pod.priority != old_priority => self.move_to(&uid, Location::Active, now),
            _ => {}
        }
    }

    pub fn delete(&mut self, uid: &str) {
        self.entries.remove(uid);
        self.unschedulable.remove(uid);
    }

    /// UIDs of every pod in the queue, in any part.
    pub fn uids(&self) -> Vec<String> {
        self.entries.keys().map(|k| k.to_string()).collect()
    }

    /// The next pod to try, now in flight.
    pub fn pop(&mut self, now: Instant) -> Option<QueuedPod> {
        while let Some(key) = self.active.pop() {
            let Some(entry) = self.entries.get_mut(&key.uid) else { continue };
            if entry.at != Location::Active || entry.generation != key.generation {
                continue;
            }
            self.cycle += 1;
            entry.at = Location::InFlight;
            entry.cycle = self.cycle;
            entry.updated_in_flight = false;
            entry.queued.attempts += 1;
            entry.queued.initial_attempt.get_or_insert(now);
            return Some(entry.queued.clone());
        }
        None
    }

    /// The pod was bound: it leaves the queue.
    pub fn done(&mut self, uid: &str) {
        if self.entries.get(uid).is_some_and(|e| e.at == Location::InFlight) {
            self.entries.remove(uid);
        }
    }

    /// No node fits the pod; `plugins` rejected it. `message` is what was reported for it.
    pub fn unschedulable(&mut self, uid: &str, plugins: Vec<&'static str>, message: Option<String>, now: Instant) {
        let move_request_cycle = self.move_request_cycle;
        let Some(entry) = self.entries.get_mut(uid) else { return };
        if entry.at != Location::InFlight {
            return;
        }
        entry.queued.unschedulable_plugins = plugins;
        entry.queued.timestamp = now;
        if message.is_some() {
            entry.queued.reported_message = message;
        }
        let to = if move_request_cycle >= entry.cycle || entry.updated_in_flight {
            Location::Backoff
        } else {
            Location::Unschedulable
        };
        self.move_to(uid, to, now);
    }

    /// Scheduling or binding failed for another reason: try again after back-off.
    pub fn error(&mut self, uid: &str, now: Instant) {
        let Some(entry) = self.entries.get_mut(uid) else { return };
        if entry.at != Location::InFlight {
            return;
        }
        entry.queued.timestamp = now;
        entry.queued.unschedulable_plugins.clear();
        self.move_to(uid, Location::Backoff, now);
    }

    /// An event that could make unschedulable pods fit: those rejected by a plugin it
    /// concerns go back to be tried. Returns how many moved.
    pub fn on_event(&mut self, event: ClusterEvent, now: Instant) -> usize {
        self.move_request_cycle = self.cycle;
        let uids: Vec<Arc<str>> = self
            .unschedulable
            .iter()
            .filter(|uid| {
                self.entries.get(*uid).is_some_and(|e| {
                    e.queued.unschedulable_plugins.is_empty()
                        || e.queued.unschedulable_plugins.iter().any(|p| event.concerns(p))
                })
            })
            .cloned()
            .collect();
        for uid in &uids {
            self.requeue(uid, now);
        }
        uids.len()
    }

    /// Moves pods whose back-off expired to the active queue, and pods unschedulable for
    /// [`MAX_UNSCHEDULABLE`] back to be tried.
    pub fn flush(&mut self, now: Instant) {
        while let Some(Reverse((until, generation, uid))) = self.backoff.peek().cloned() {
            if until > now {
                break;
            }
            self.backoff.pop();
            if self.entries.get(&uid).is_some_and(|e| e.at == Location::Backoff && e.generation == generation) {
                self.move_to(&uid, Location::Active, now);
            }
        }
        if self.next_timeout_scan.is_some_and(|t| now < t) {
            return;
        }
        self.next_timeout_scan = Some(now + Duration::from_secs(1));
        let stale: Vec<Arc<str>> = self
            .unschedulable
            .iter()
            .filter(|uid| self.entries.get(*uid).is_some_and(|e| now >= e.queued.timestamp + MAX_UNSCHEDULABLE))
            .cloned()
            .collect();
        for uid in &stale {
            self.requeue(uid, now);
        }
    }

    /// When `flush` next has work: the earliest back-off expiry or unschedulable timeout.
    pub fn next_wakeup(&self) -> Option<Instant> {
        let backoff = self.backoff.peek().map(|Reverse((t, _, _))| *t);
        let unschedulable = self
            .unschedulable
            .iter()
            .filter_map(|uid| self.entries.get(uid))
            .map(|e| e.queued.timestamp + MAX_UNSCHEDULABLE)
            .min();
        [backoff, unschedulable].into_iter().flatten().min()
    }

    fn backoff_expiry(queued: &QueuedPod) -> Instant {
        queued.timestamp + backoff_duration(queued.attempts)
    }

    /// An unschedulable pod that may fit now: back-off first if it has not served it.
    fn requeue(&mut self, uid: &str, now: Instant) {
        let Some(entry) = self.entries.get(uid) else { return };
        let to = if Self::backoff_expiry(&entry.queued) > now { Location::Backoff } else { Location::Active };
        self.move_to(uid, to, now);
    }

    fn move_to(&mut self, uid: &str, to: Location, now: Instant) {
        self.next_generation += 1;
        let generation = self.next_generation;
        let Some(key) = self.entries.get_key_value(uid).map(|(k, _)| k.clone()) else { return };
        let entry = self.entries.get_mut(&key).expect("entry just found");
        if to == Location::Unschedulable {
            self.unschedulable.insert(key.clone());
        } else if entry.at == Location::Unschedulable {
            self.unschedulable.remove(&key);
        }
        entry.at = to;
        entry.generation = generation;
        match to {
            Location::Active => {
                if entry.queued.attempts == 0 {
                    entry.queued.timestamp = now;
                }
                self.active.push(ActiveKey {
                    priority: entry.queued.pod.priority,
                    timestamp: entry.queued.timestamp,
                    generation,
                    uid: key,
                });
            }
            Location::Backoff => {
                let until = Self::backoff_expiry(&entry.queued);
                self.backoff.push(Reverse((until, generation, key)));
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str, priority: i32) -> Arc<PodInfo> {
        Arc::new(PodInfo { uid: uid.into(), name: uid.into(), priority, ..Default::default() })
    }

    fn popped(q: &mut SchedulingQueue, now: Instant) -> Option<String> {
        q.pop(now).map(|p| p.pod.uid.clone())
    }

    #[test]
    fn back_off_doubles_from_one_second_to_ten() {
        let secs: Vec<u64> = (1..=6).map(|a| backoff_duration(a).as_secs()).collect();
        assert_eq!(secs, vec![1, 2, 4, 8, 10, 10]);
    }

    #[tokio::test(start_paused = true)]
    async fn higher_priority_pods_pop_first_then_older_ones() {
        let mut q = SchedulingQueue::new();
        q.add(pod("low", 0), Instant::now());
        tokio::time::advance(Duration::from_millis(1)).await;
        q.add(pod("high", 10), Instant::now());
        tokio::time::advance(Duration::from_millis(1)).await;
        q.add(pod("low-newer", 0), Instant::now());
        let now = Instant::now();
        assert_eq!(popped(&mut q, now).as_deref(), Some("high"));
        assert_eq!(popped(&mut q, now).as_deref(), Some("low"));
        assert_eq!(popped(&mut q, now).as_deref(), Some("low-newer"));
        assert_eq!(popped(&mut q, now), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_pod_waits_out_its_back_off_before_it_is_tried_again() {
        let mut q = SchedulingQueue::new();
        q.add(pod("a", 0), Instant::now());
        q.pop(Instant::now()).unwrap();
        q.error("a", Instant::now());
        assert_eq!(q.location("a"), Some(Location::Backoff));
        tokio::time::advance(Duration::from_millis(900)).await;
        q.flush(Instant::now());
        assert_eq!(popped(&mut q, Instant::now()), None);
        tokio::time::advance(Duration::from_millis(100)).await;
        q.flush(Instant::now());
        assert_eq!(popped(&mut q, Instant::now()).as_deref(), Some("a"));
        // Second failure: two seconds.
        q.error("a", Instant::now());
        assert_eq!(q.next_wakeup(), Some(Instant::now() + Duration::from_secs(2)));
    }

    #[tokio::test(start_paused = true)]
    async fn unschedulable_pods_wait_for_an_event_that_concerns_their_plugins() {
        let mut q = SchedulingQueue::new();
        q.add(pod("a", 0), Instant::now());
        q.pop(Instant::now()).unwrap();
        q.unschedulable("a", vec![crate::plugins::runtime_class::NAME], Some("m".into()), Instant::now());
        assert_eq!(q.location("a"), Some(Location::Unschedulable));
        assert_eq!(q.get("a").unwrap().reported_message.as_deref(), Some("m"));
        assert_eq!(q.on_event(ClusterEvent::AssignedPodDeleted, Instant::now()), 0);
        assert_eq!(q.location("a"), Some(Location::Unschedulable));
        // The event comes while still inside the back-off: the pod serves it first.
        assert_eq!(q.on_event(ClusterEvent::RuntimeClassChanged, Instant::now()), 1);
        assert_eq!(q.location("a"), Some(Location::Backoff));
        tokio::time::advance(Duration::from_secs(1)).await;
        q.flush(Instant::now());
        assert_eq!(popped(&mut q, Instant::now()).as_deref(), Some("a"));
    }

    #[test]
    fn a_pod_keeps_the_message_an_earlier_scheduler_reported_so_it_is_not_written_again() {
        let mut q = SchedulingQueue::new();
        let reported = PodInfo { reported_unschedulable: Some("m".into()), ..(*pod("a", 0)).clone() };
        q.add(Arc::new(reported), Instant::now());
        q.add(pod("b", 0), Instant::now());
        assert_eq!(q.get("a").unwrap().reported_message.as_deref(), Some("m"));
        assert_eq!(q.get("b").unwrap().reported_message, None);
    }

    #[tokio::test(start_paused = true)]
    async fn an_event_after_back_off_moves_the_pod_straight_to_active() {
        let mut q = SchedulingQueue::new();
        q.add(pod("a", 0), Instant::now());
        q.pop(Instant::now()).unwrap();
        q.unschedulable("a", vec![crate::plugins::node_resources::NAME], None, Instant::now());
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(q.on_event(ClusterEvent::NodeChanged, Instant::now()), 1);
        assert_eq!(q.location("a"), Some(Location::Active));
    }

    #[tokio::test(start_paused = true)]
    async fn an_event_while_the_pod_is_in_flight_sends_a_failure_to_back_off() {
        let mut q = SchedulingQueue::new();
        q.add(pod("a", 0), Instant::now());
        q.pop(Instant::now()).unwrap();
        q.on_event(ClusterEvent::NodeChanged, Instant::now());
        q.unschedulable("a", vec![crate::plugins::node_resources::NAME], None, Instant::now());
        assert_eq!(q.location("a"), Some(Location::Backoff));
    }

    #[tokio::test(start_paused = true)]
    async fn unschedulable_pods_are_tried_again_after_five_minutes() {
        let mut q = SchedulingQueue::new();
        q.add(pod("a", 0), Instant::now());
        q.pop(Instant::now()).unwrap();
        q.unschedulable("a", vec![crate::plugins::node_affinity::NAME], None, Instant::now());
        tokio::time::advance(MAX_UNSCHEDULABLE - Duration::from_secs(1)).await;
        q.flush(Instant::now());
        assert_eq!(q.location("a"), Some(Location::Unschedulable));
        tokio::time::advance(Duration::from_secs(1)).await;
        q.flush(Instant::now());
        assert_eq!(q.location("a"), Some(Location::Active));
    }

    #[tokio::test(start_paused = true)]
    async fn gated_pods_are_not_tried_until_their_gates_are_removed() {
        let mut q = SchedulingQueue::new();
        let mut gated = PodInfo { uid: "g".into(), scheduling_gates: vec!["wait".into()], ..Default::default() };
        q.add(Arc::new(gated.clone()), Instant::now());
        assert_eq!(q.location("g"), Some(Location::Gated));
        assert_eq!(popped(&mut q, Instant::now()), None);
        assert_eq!(q.counts().gated, 1);
        gated.scheduling_gates.clear();
        q.add(Arc::new(gated), Instant::now());
        assert_eq!(popped(&mut q, Instant::now()).as_deref(), Some("g"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_changed_unschedulable_pod_is_tried_again_and_a_deleted_one_never() {
        let mut q = SchedulingQueue::new();
        q.add(pod("a", 0), Instant::now());
        q.add(pod("b", 0), Instant::now());
        q.delete("b");
        q.pop(Instant::now()).unwrap();
        q.unschedulable("a", vec![crate::plugins::node_affinity::NAME], None, Instant::now());
        tokio::time::advance(Duration::from_secs(2)).await;
        let mut changed = (*pod("a", 0)).clone();
        changed.node_selector.insert("zone".into(), "b".into());
        q.add(Arc::new(changed), Instant::now());
        assert_eq!(q.location("a"), Some(Location::Active));
        assert_eq!(popped(&mut q, Instant::now()).as_deref(), Some("a"));
        assert_eq!(popped(&mut q, Instant::now()), None);
        q.done("a");
        assert!(q.is_empty());
    }
}
