//! Zones and the rate at which their nodes get NoExecute taints: each zone's state from its
//! nodes' Ready conditions, a token bucket per zone, and the queue of nodes waiting to be
//! tainted — upstream's `handleDisruption`, `ComputeZoneState` and `RateLimitedTimedQueue`.
//!
//! A zone whose nodes are all not ready is fully disrupted; one with at least
//! [`Rates::unhealthy_zone_threshold`] of them (and more than two) not ready is partially
//! disrupted and tainted at the secondary rate if it is large, not at all otherwise. When every
//! zone is fully disrupted the controller assumes the trouble is its own (or the network's):
//! it stops tainting and lifts the NoExecute taints everywhere, until some node is ready again.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use tokio::time::Instant;

/// Nodes carrying this label are left out of zone states.
pub const EXCLUDE_DISRUPTION: &str = "node.kubernetes.io/exclude-disruption";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ZoneState {
    Initial,
    Normal,
    PartialDisruption,
    FullDisruption,
}

/// The eviction rates (kube-controller-manager's `--node-eviction-rate`,
/// `--secondary-node-eviction-rate`, `--large-cluster-size-threshold`,
/// `--unhealthy-zone-threshold`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rates {
    pub primary: f64,
    pub secondary: f64,
    pub large_cluster_threshold: usize,
    pub unhealthy_zone_threshold: f64,
}

impl Rates {
    fn for_state(&self, state: ZoneState, zone_size: usize) -> f64 {
        match state {
            ZoneState::Initial | ZoneState::Normal | ZoneState::FullDisruption => self.primary,
            ZoneState::PartialDisruption if zone_size > self.large_cluster_threshold => self.secondary,
            ZoneState::PartialDisruption => 0.0,
        }
    }
}

/// The zone of a node: `region:\0:zone` from the topology labels, empty without them.
pub fn zone_key(node: &Node) -> String {
    let labels = node.metadata.labels.as_ref();
    let label = |stable: &str, beta: &str| {
        labels.and_then(|l| l.get(stable).or_else(|| l.get(beta))).cloned().unwrap_or_default()
    };
    let region = label("topology.kubernetes.io/region", "failure-domain.beta.kubernetes.io/region");
    let zone = label("topology.kubernetes.io/zone", "failure-domain.beta.kubernetes.io/zone");
    if region.is_empty() && zone.is_empty() { String::new() } else { format!("{region}:\x00:{zone}") }
}

pub fn excluded(node: &Node) -> bool {
    node.metadata.labels.as_ref().is_some_and(|l| l.contains_key(EXCLUDE_DISRUPTION))
}

/// A zone's state from whether each of its nodes is ready.
pub fn zone_state(ready: &[bool], unhealthy_threshold: f64) -> ZoneState {
    let ready_nodes = ready.iter().filter(|r| **r).count();
    let not_ready = ready.len() - ready_nodes;
    if ready_nodes == 0 && not_ready > 0 {
        ZoneState::FullDisruption
    } else if not_ready > 2 && not_ready as f64 / ready.len() as f64 >= unhealthy_threshold {
        ZoneState::PartialDisruption
    } else {
        ZoneState::Normal
    }
}

/// A token bucket holding one token (client-go's token-bucket limiter with burst 1); a rate of
/// zero never gives one.
#[derive(Clone, Debug)]
pub struct TokenBucket {
    qps: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    pub fn new(qps: f64, now: Instant) -> TokenBucket {
        TokenBucket { qps, tokens: 1.0, last: now }
    }

    fn refill(&mut self, now: Instant) {
        if self.qps > 0.0 {
            let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
            self.tokens = (self.tokens + elapsed * self.qps).min(1.0);
        }
        self.last = now;
    }

    pub fn try_accept(&mut self, now: Instant) -> bool {
        self.refill(now);
        if self.qps > 0.0 && self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// When the next token will be there (`None` at rate zero).
    pub fn next_token(&self, now: Instant) -> Option<Instant> {
        if self.qps <= 0.0 {
            return None;
        }
        let mut b = self.clone();
        b.refill(now);
        let missing = (1.0 - b.tokens).max(0.0);
        Some(now + Duration::from_secs_f64(missing / self.qps))
    }

    /// Changes the rate; a bucket that is empty now stays empty (upstream's `SwapLimiter`).
    pub fn set_rate(&mut self, qps: f64, now: Instant) {
        if qps == self.qps {
            return;
        }
        self.refill(now);
        let empty = self.tokens < 1.0;
        *self = TokenBucket::new(qps, now);
        if empty {
            self.tokens = 0.0;
        }
    }
}

/// One zone's nodes waiting for their NoExecute taint, in order, each once.
#[derive(Clone, Debug)]
pub struct TaintQueue {
    pub limiter: TokenBucket,
    queue: VecDeque<(String, Instant)>,
}

impl TaintQueue {
    pub fn new(qps: f64, now: Instant) -> TaintQueue {
        TaintQueue { limiter: TokenBucket::new(qps, now), queue: VecDeque::new() }
    }

    /// Queues `node`; false if it is already queued.
    pub fn add(&mut self, node: &str, now: Instant) -> bool {
        if self.contains(node) {
            return false;
        }
        self.queue.push_back((node.to_string(), now));
        true
    }

    pub fn remove(&mut self, node: &str) -> bool {
        let before = self.queue.len();
        self.queue.retain(|(n, _)| n != node);
        self.queue.len() != before
    }

    pub fn contains(&self, node: &str) -> bool {
        self.queue.iter().any(|(n, _)| n == node)
    }

    /// The next node to taint, if its time has come and the rate allows it now.
    pub fn pop(&mut self, now: Instant) -> Option<String> {
        let (_, at) = self.queue.front()?;
        if *at > now || !self.limiter.try_accept(now) {
            return None;
        }
        self.queue.pop_front().map(|(n, _)| n)
    }

    /// Puts `node` back to be tried at `at` (it could not be tainted yet).
    pub fn retry(&mut self, node: String, at: Instant) {
        self.remove(&node);
        self.queue.push_back((node, at));
    }

    /// When this queue could next give a node.
    pub fn next_due(&self, now: Instant) -> Option<Instant> {
        let (_, at) = self.queue.front()?;
        Some((*at).max(self.limiter.next_token(now)?))
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}

/// What the caller has to do after [`Zones::update`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Transition {
    None,
    /// Every zone is fully disrupted now: lift every node's NoExecute taints.
    EnterFullDisruption,
    /// Some node is ready again after full disruption: every node's grace period starts again.
    LeaveFullDisruption,
}

/// The zones, their states and their taint queues.
#[derive(Debug)]
pub struct Zones {
    pub rates: Rates,
    states: HashMap<String, ZoneState>,
    pub queues: HashMap<String, TaintQueue>,
}

impl Zones {
    pub fn new(rates: Rates) -> Zones {
        Zones { rates, states: HashMap::new(), queues: HashMap::new() }
    }

    /// Makes a new zone known (state Initial, primary rate).
    pub fn ensure(&mut self, zone: &str, now: Instant) {
        if !self.states.contains_key(zone) {
            self.states.insert(zone.to_string(), ZoneState::Initial);
            self.queues.insert(zone.to_string(), TaintQueue::new(self.rates.primary, now));
        }
    }

    pub fn queue(&mut self, zone: &str, now: Instant) -> &mut TaintQueue {
        self.ensure(zone, now);
        self.queues.get_mut(zone).expect("ensured above")
    }

    pub fn state(&self, zone: &str) -> Option<ZoneState> {
        self.states.get(zone).copied()
    }

    /// Takes this pass's readiness of the nodes per zone; updates states and rates.
    pub fn update(&mut self, ready_by_zone: &HashMap<String, Vec<bool>>, now: Instant) -> Transition {
        let mut new_states = HashMap::new();
        let mut all_fully_disrupted = true;
        for (zone, ready) in ready_by_zone {
            let state = zone_state(ready, self.rates.unhealthy_zone_threshold);
            all_fully_disrupted &= state == ZoneState::FullDisruption;
            new_states.insert(zone.clone(), state);
            self.ensure(zone, now);
        }
        // Zones without nodes are forgotten (their queues stay, as upstream's do).
        self.states.retain(|zone, _| ready_by_zone.contains_key(zone));
        let all_were_fully_disrupted = self.states.values().all(|s| *s == ZoneState::FullDisruption);
        if all_fully_disrupted && all_were_fully_disrupted {
            return Transition::None;
        }
        if all_fully_disrupted {
            for q in self.queues.values_mut() {
                q.limiter.set_rate(0.0, now);
            }
            for s in self.states.values_mut() {
                *s = ZoneState::FullDisruption;
            }
            return Transition::EnterFullDisruption;
        }
        let mut transition = Transition::None;
        if all_were_fully_disrupted {
            transition = Transition::LeaveFullDisruption;
        }
        for (zone, state) in new_states {
            let changed = self.states.get(&zone) != Some(&state);
            if changed || transition == Transition::LeaveFullDisruption {
                let size = ready_by_zone.get(&zone).map_or(0, Vec::len);
                let rate = self.rates.for_state(state, size);
                if let Some(q) = self.queues.get_mut(&zone) {
                    q.limiter.set_rate(rate, now);
                }
                self.states.insert(zone, state);
            }
        }
        transition
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RATES: Rates =
        Rates { primary: 0.1, secondary: 0.01, large_cluster_threshold: 50, unhealthy_zone_threshold: 0.55 };

    fn zones(pairs: &[(&str, &[bool])]) -> HashMap<String, Vec<bool>> {
        pairs.iter().map(|(z, r)| (z.to_string(), r.to_vec())).collect()
    }

    #[test]
    fn zone_states_follow_the_share_of_nodes_not_ready() {
        assert_eq!(zone_state(&[false], 0.55), ZoneState::FullDisruption);
        assert_eq!(zone_state(&[true, false], 0.55), ZoneState::Normal);
        assert_eq!(zone_state(&[true, false, false], 0.55), ZoneState::Normal, "two not ready are never partial");
        assert_eq!(zone_state(&[true, false, false, false], 0.55), ZoneState::PartialDisruption);
        assert_eq!(zone_state(&[], 0.55), ZoneState::Normal);
    }

    #[tokio::test(start_paused = true)]
    async fn the_bucket_gives_one_token_then_one_per_interval() {
        let mut b = TokenBucket::new(0.5, Instant::now());
        assert!(b.try_accept(Instant::now()));
        assert!(!b.try_accept(Instant::now()));
        assert_eq!(b.next_token(Instant::now()), Some(Instant::now() + Duration::from_secs(2)));
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(b.try_accept(Instant::now()));
        b.set_rate(0.0, Instant::now());
        tokio::time::advance(Duration::from_secs(60)).await;
        assert!(!b.try_accept(Instant::now()));
        assert_eq!(b.next_token(Instant::now()), None);
        // Back to a rate: the bucket was empty, so it starts empty.
        b.set_rate(1.0, Instant::now());
        assert!(!b.try_accept(Instant::now()));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(b.try_accept(Instant::now()));
    }

    #[tokio::test(start_paused = true)]
    async fn the_taint_queue_hands_out_nodes_at_the_zone_rate() {
        let mut q = TaintQueue::new(0.1, Instant::now());
        assert!(q.add("a", Instant::now()));
        assert!(!q.add("a", Instant::now()));
        q.add("b", Instant::now());
        assert_eq!(q.pop(Instant::now()).as_deref(), Some("a"));
        assert_eq!(q.pop(Instant::now()), None);
        assert_eq!(q.next_due(Instant::now()), Some(Instant::now() + Duration::from_secs(10)));
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(q.pop(Instant::now()).as_deref(), Some("b"));
        assert!(q.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn all_zones_fully_disrupted_stops_tainting_until_a_node_is_ready_again() {
        let now = Instant::now();
        let mut z = Zones::new(RATES);
        assert_eq!(z.update(&zones(&[("a", &[true, true]), ("b", &[true])]), now), Transition::None);
        assert_eq!(z.state("a"), Some(ZoneState::Normal));
        // One zone down: it keeps the primary rate.
        assert_eq!(z.update(&zones(&[("a", &[true, true]), ("b", &[false])]), now), Transition::None);
        assert_eq!(z.state("b"), Some(ZoneState::FullDisruption));
        assert!(z.queue("b", now).limiter.try_accept(now));
        // All down: no more tainting anywhere.
        let all_down = zones(&[("a", &[false, false]), ("b", &[false])]);
        assert_eq!(z.update(&all_down, now), Transition::EnterFullDisruption);
        assert_eq!(z.update(&all_down, now), Transition::None);
        tokio::time::advance(Duration::from_secs(100)).await;
        assert!(!z.queue("a", Instant::now()).limiter.try_accept(Instant::now()));
        // One node back.
        let back = zones(&[("a", &[true, false]), ("b", &[false])]);
        assert_eq!(z.update(&back, Instant::now()), Transition::LeaveFullDisruption);
        assert_eq!(z.state("a"), Some(ZoneState::Normal));
        tokio::time::advance(Duration::from_secs(10)).await;
        assert!(z.queue("a", Instant::now()).limiter.try_accept(Instant::now()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_single_node_cluster_going_down_is_full_disruption() {
        let mut z = Zones::new(RATES);
        z.update(&zones(&[("", &[true])]), Instant::now());
        assert_eq!(z.update(&zones(&[("", &[false])]), Instant::now()), Transition::EnterFullDisruption);
    }

    #[tokio::test(start_paused = true)]
    async fn a_partially_disrupted_small_zone_is_not_tainted_and_a_large_one_slowly() {
        let mut z = Zones::new(RATES);
        let small: Vec<bool> = [vec![true], vec![false; 3]].concat();
        z.update(&zones(&[("s", &small), ("ok", &[true])]), Instant::now());
        assert_eq!(z.state("s"), Some(ZoneState::PartialDisruption));
        assert!(!z.queue("s", Instant::now()).limiter.try_accept(Instant::now()));
        let large: Vec<bool> = [vec![true; 20], vec![false; 40]].concat();
        z.update(&zones(&[("l", &large), ("ok", &[true])]), Instant::now());
        assert_eq!(z.state("l"), Some(ZoneState::PartialDisruption));
        let next = z.queue("l", Instant::now()).limiter.next_token(Instant::now());
        assert!(next.is_some());
    }

    #[test]
    fn zones_come_from_the_topology_labels() {
        let n: Node = serde_json::from_value(serde_json::json!({"metadata": {"labels": {
            "topology.kubernetes.io/region": "eu", "topology.kubernetes.io/zone": "eu-1"}}}))
        .unwrap();
        assert_eq!(zone_key(&n), "eu:\u{0}:eu-1");
        assert_eq!(zone_key(&Node::default()), "");
    }
}
