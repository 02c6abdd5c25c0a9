//! PodTopologySpread: a pod's `DoNotSchedule` spread constraints filter nodes by skew, and its
//! `ScheduleAnyway` constraints (or the system default ones) score them, as kube-scheduler's
//! plugin does.
//!
//! Counts are of pods in the incoming pod's namespace that match a constraint's selector and are
//! not terminating, summed per topology domain (the value a node carries for the constraint's
//! key). Which nodes make domains follows the constraint's node inclusion policies: node
//! affinity honoured, taints ignored, unless the constraint says otherwise.

use std::collections::{HashMap, HashSet};

use rustc_hash::FxHashMap;

use crate::framework::{FilterResult, MAX_NODE_SCORE, Rejection, Snapshot};
use crate::node_info::{LABEL_HOSTNAME, LABEL_ZONE, NodeInfo, NodeSpec};
use crate::plugins::node_affinity;
use crate::pod_info::{PodInfo, PodMatcher, SpreadConstraint};
use crate::taints::{Effect, first_untolerated};

pub const NAME: &str = "PodTopologySpread";
pub const ERR_CONSTRAINTS_NOT_MATCH: &str = "node(s) didn't match pod topology spread constraints";
pub const ERR_MISSING_LABEL: &str = "node(s) didn't match pod topology spread constraints (missing required label)";

/// Topology value → matching pods. Looked up for each of hundreds of nodes per pod, with short
/// keys: a fast hash rather than a DoS-resistant one.
type Domains = FxHashMap<String, i64>;

/// Kubernetes' default system constraints, used when the pod has no constraints of its own and
/// has a controlling owner: `kubernetes.io/hostname` maxSkew 3 and `topology.kubernetes.io/zone`
/// maxSkew 5, ScheduleAnyway, counting pods of the same controller.
pub fn default_constraints(pod: &PodInfo) -> Vec<SpreadConstraint> {
    let Some(uid) = &pod.controller_uid else { return Vec::new() };
    [(LABEL_HOSTNAME, 3), (LABEL_ZONE, 5)]
        .into_iter()
        .map(|(key, max_skew)| SpreadConstraint {
            max_skew,
            topology_key: key.to_string(),
            hard: false,
            selector: PodMatcher::Controller(uid.clone()),
            min_domains: None,
            honor_node_affinity: true,
            honor_node_taints: false,
        })
        .collect()
}

/// Kubernetes' `countPodsMatchSelector`: pods of `namespace`, not terminating, that the selector
/// matches. An empty label selector counts no pod there (it selects everything elsewhere).
/// A controller's pods share its namespace, so those are counted by the node without a pass over
/// its pods.
fn count_matching(selector: &PodMatcher, node: &NodeInfo, namespace: &str) -> i64 {
    match selector {
        PodMatcher::Labels(s) if s.is_empty() => 0,
        PodMatcher::Controller(owner) => i64::from(node.pods_of_controller(owner)),
        _ => node.pods.iter().filter(|p| !p.terminating && p.namespace == namespace && selector.matches(p)).count()
            as i64,
    }
}

/// The zone counts the cache keeps for constraint `c`, when they are what a pass over the
/// nodes would sum: the default zone spreading of a controller's pod that every node is
/// eligible for. `Some(None)`: the controller has no pod anywhere.
fn kept_zone_counts<'s>(
    pod: &PodInfo,
    c: &SpreadConstraint,
    require_all: bool,
    snapshot: &Snapshot<'s>,
) -> Option<Option<&'s HashMap<String, i64>>> {
    let zone_pods = snapshot.zone_pods?;
    let PodMatcher::Controller(owner) = &c.selector else { return None };
    let every_node = !c.honor_node_taints
        && (!c.honor_node_affinity || (pod.node_selector.is_empty() && pod.required_node_affinity.is_none()));
    (c.topology_key == LABEL_ZONE && !require_all && every_node).then(|| zone_pods.get(owner))
}

fn has_all_keys(node: &NodeInfo, constraints: &[SpreadConstraint]) -> bool {
    constraints.iter().all(|c| node.topology_value(&c.topology_key).is_some())
}

/// Whether a node makes a domain for this constraint: its node inclusion policies. Node affinity
/// is evaluated lazily, once per node.
struct Inclusion<'a> {
    pod: &'a PodInfo,
    node: &'a NodeSpec,
    affinity: Option<bool>,
}

impl<'a> Inclusion<'a> {
    fn new(pod: &'a PodInfo, node: &'a NodeSpec) -> Self {
        Inclusion { pod, node, affinity: None }
    }

    fn includes(&mut self, c: &SpreadConstraint) -> bool {
        if c.honor_node_affinity
            && !*self.affinity.get_or_insert_with(|| node_affinity::required_matches(self.pod, self.node))
        {
            return false;
        }
        !c.honor_node_taints
            || first_untolerated(&self.node.taints, &self.pod.tolerations, |t| t.effect != Effect::PreferNoSchedule)
                .is_none()
    }
}

/// The filter half: matching pods per domain of each `DoNotSchedule` constraint.
#[derive(Debug)]
pub struct Filter {
    constraints: Vec<SpreadConstraint>,
    /// Per constraint: topology value → matching pods, for every eligible domain.
    domains: Vec<Domains>,
    /// Per constraint: the global minimum the skew is taken against (0 below minDomains).
    min_match: Vec<i64>,
}

impl Filter {
    /// None when the pod has no DoNotSchedule constraint.
    pub fn pre_filter(pod: &PodInfo, snapshot: &Snapshot) -> Option<Filter> {
        let constraints: Vec<SpreadConstraint> = pod.spread_constraints.iter().filter(|c| c.hard).cloned().collect();
        if constraints.is_empty() {
            return None;
        }
        let mut domains = vec![Domains::default(); constraints.len()];
        for node in snapshot.nodes {
            if !has_all_keys(node, &constraints) {
                continue;
            }
            let mut inclusion = Inclusion::new(pod, &node.node);
            for (c, counts) in constraints.iter().zip(domains.iter_mut()) {
                if !inclusion.includes(c) {
                    continue;
                }
                let value = node.topology_value(&c.topology_key).unwrap_or_default();
                let n = count_matching(&c.selector, node, &pod.namespace);
                match counts.get_mut(value) {
                    Some(count) => *count += n,
                    None => {
                        counts.insert(value.to_string(), n);
                    }
                }
            }
        }
        let min_match = constraints
            .iter()
            .zip(&domains)
            .map(|(c, counts)| {
                // minDomains defaults to 1; with no domain at all the minimum is 0 as well.
                if counts.len() < usize::try_from(c.min_domains.unwrap_or(1)).unwrap_or(0) {
                    0
                } else {
                    counts.values().copied().min().unwrap_or(i64::from(i32::MAX))
                }
            })
            .collect();
        Some(Filter { constraints, domains, min_match })
    }

    /// Each constraint in turn: the node must carry its key, and placing the pod there must
    /// keep `count(domain) + self − global minimum` within maxSkew.
    pub fn filter(&self, pod: &PodInfo, node: &NodeInfo) -> FilterResult {
        for ((c, counts), min) in self.constraints.iter().zip(&self.domains).zip(&self.min_match) {
            let Some(value) = node.topology_value(&c.topology_key) else {
                return Err(Rejection::new(NAME, ERR_MISSING_LABEL));
            };
            let self_match = i64::from(c.selector.matches(pod));
            let skew = counts.get(value).copied().unwrap_or(0) + self_match - min;
            if skew > i64::from(c.max_skew) {
                return Err(Rejection::new(NAME, ERR_CONSTRAINTS_NOT_MATCH));
            }
        }
        Ok(())
    }
}

/// The score half: matching pods per domain of each `ScheduleAnyway` constraint and each
/// constraint's weight.
#[derive(Debug)]
pub struct Score {
    constraints: Vec<SpreadConstraint>,
    namespace: String,
    /// Per constraint: topology value → matching pods, for the domains of feasible nodes (empty
    /// for the hostname key, counted per node in `score`).
    counts: Vec<Domains>,
    /// Per constraint: ln(number of domains among the feasible nodes + 2).
    weights: Vec<f64>,
    /// Feasible nodes without all the keys of the pod's own constraints: scored 0.
    ignored_names: HashSet<String>,
    /// The same, by position in the feasible nodes given to `pre_score`.
    ignored: Vec<bool>,
}

impl Score {
    /// None when there is nothing to score: no feasible node, or no ScheduleAnyway constraint
    /// (the pod's own, or the default ones when it has none at all).
    pub fn pre_score(pod: &PodInfo, snapshot: &Snapshot, feasible: &[&NodeInfo]) -> Option<Score> {
        if feasible.is_empty() || snapshot.nodes.is_empty() {
            return None;
        }
        let own = !pod.spread_constraints.is_empty();
        let constraints: Vec<SpreadConstraint> = if own {
            pod.spread_constraints.iter().filter(|c| !c.hard).cloned().collect()
        } else {
            default_constraints(pod)
        };
        if constraints.is_empty() {
            return None;
        }
        // Only the pod's own constraints need every key on a node: with the default ones a node
        // without a zone label still spreads by hostname.
        let require_all = own;

        let mut counts = vec![Domains::default(); constraints.len()];
        let mut ignored = Vec::with_capacity(feasible.len());
        let mut ignored_names = HashSet::new();
        for node in feasible {
            let skip = require_all && !has_all_keys(node, &constraints);
            ignored.push(skip);
            if skip {
                ignored_names.insert(node.name().to_string());
                continue;
            }
            for (c, domain) in constraints.iter().zip(counts.iter_mut()) {
                let value = node.topology_value(&c.topology_key).unwrap_or_default();
                if c.topology_key != LABEL_HOSTNAME && !domain.contains_key(value) {
                    domain.insert(value.to_string(), 0);
                }
            }
        }
        let scored_nodes = feasible.len() - ignored_names.len();
        let weights = constraints
            .iter()
            .zip(&counts)
            .map(|(c, domain)| {
                let size = if c.topology_key == LABEL_HOSTNAME { scored_nodes } else { domain.len() };
                ((size + 2) as f64).ln()
            })
            .collect();

        // Pods on every node of the cluster count, in the domains the feasible nodes have: from
        // the cache's zone counts where they are the same sums, else node by node (hostname
        // counts are taken per node in `score`).
        let mut scan = Vec::with_capacity(constraints.len());
        for (c, domain) in constraints.iter().zip(counts.iter_mut()) {
            let kept =
                if c.topology_key == LABEL_HOSTNAME { None } else { kept_zone_counts(pod, c, require_all, snapshot) };
            if let Some(zones) = kept {
                for (value, n) in domain.iter_mut() {
                    *n = zones.and_then(|z| z.get(value)).copied().unwrap_or(0);
                }
            }
            scan.push(c.topology_key != LABEL_HOSTNAME && kept.is_none());
        }
        let scanned: &[NodeInfo] = if scan.contains(&true) { snapshot.nodes } else { &[] };
        for node in scanned {
            if require_all && !has_all_keys(node, &constraints) {
                continue;
            }
            let mut inclusion = Inclusion::new(pod, &node.node);
            for ((c, domain), scan) in constraints.iter().zip(counts.iter_mut()).zip(&scan) {
                if !*scan || !inclusion.includes(c) {
                    continue;
                }
                let value = node.topology_value(&c.topology_key).unwrap_or_default();
                if let Some(n) = domain.get_mut(value) {
                    *n += count_matching(&c.selector, node, &pod.namespace);
                }
            }
        }
        Some(Score { constraints, namespace: pod.namespace.clone(), counts, weights, ignored_names, ignored })
    }

    /// The weighted count of matching pods in the node's domains (more is worse):
    /// Σ count × weight + (maxSkew − 1), rounded.
    pub fn score(&self, node: &NodeInfo) -> i64 {
        // Empty but for a pod's own constraints: no name to hash for each node then.
        if !self.ignored_names.is_empty() && self.ignored_names.contains(node.name()) {
            return 0;
        }
        let mut score = 0.0;
        for ((c, domain), weight) in self.constraints.iter().zip(&self.counts).zip(&self.weights) {
            let Some(value) = node.topology_value(&c.topology_key) else { continue };
            let count = if c.topology_key == LABEL_HOSTNAME {
                count_matching(&c.selector, node, &self.namespace)
            } else {
                domain.get(value).copied().unwrap_or(0)
            };
            score += count as f64 * weight + f64::from(c.max_skew - 1);
        }
        score.round() as i64
    }

    /// Reverses the scale so that fewer matching pods score higher:
    /// 100 × (max + min − score) / max, 100 for all when the highest is 0. `scores` are in the
    /// order of the feasible nodes given to `pre_score`; ignored nodes get 0 and count for
    /// neither the minimum nor the maximum.
    pub fn normalize(&self, scores: &mut [i64]) {
        let ignored = |i: usize| self.ignored.get(i).copied().unwrap_or(false);
        let counted = || scores.iter().enumerate().filter(|(i, _)| !ignored(*i)).map(|(_, s)| *s);
        let min = counted().min().unwrap_or(i64::MAX);
        let max = counted().max().unwrap_or(0).max(0);
        for (i, s) in scores.iter_mut().enumerate() {
            *s = if ignored(i) {
                0
            } else if max == 0 {
                MAX_NODE_SCORE
            } else {
                MAX_NODE_SCORE * (max + min - *s) / max
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use std::collections::BTreeMap;

    use super::*;
    use crate::taints::Taint;
    use std::sync::Arc;

    const HOST: &str = LABEL_HOSTNAME;
    const ZONE: &str = LABEL_ZONE;

    /// A pod of `namespace` with these labels and spec fields (containers added).
    fn pod_in(namespace: &str, name: &str, labels: Value, spec: Value) -> PodInfo {
        let mut spec = spec;
        if spec.is_null() {
            spec = json!({});
        }
        spec["containers"] = json!([{"name": "c", "image": "app"}]);
        PodInfo::from_pod(
            &serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": namespace, "uid": name, "labels": labels},
                "spec": spec
            }))
            .unwrap(),
        )
    }

    fn pod(name: &str, labels: Value, spec: Value) -> PodInfo {
        pod_in("default", name, labels, spec)
    }

    fn web(name: &str) -> PodInfo {
        pod(name, json!({"app": "web"}), Value::Null)
    }

    /// A pod owned by the ReplicaSet with this UID.
    fn replica(name: &str, rs: &str) -> PodInfo {
        let mut p = pod(name, json!({"app": rs}), Value::Null);
        p.controller_uid = Some(rs.to_string());
        p
    }

    fn constraint(key: &str, max_skew: i32, when: &str, extra: Value) -> Value {
        let mut c = json!({
            "maxSkew": max_skew, "topologyKey": key, "whenUnsatisfiable": when,
            "labelSelector": {"matchLabels": {"app": "web"}}
        });
        for (k, v) in extra.as_object().into_iter().flatten() {
            c[k] = v.clone();
        }
        c
    }

    fn spread(constraints: Vec<Value>) -> Value {
        json!({"topologySpreadConstraints": constraints})
    }

    fn node(name: &str, zone: Option<&str>, pods: Vec<PodInfo>) -> NodeInfo {
        let mut labels = BTreeMap::from([(HOST.to_string(), name.to_string())]);
        if let Some(z) = zone {
            labels.insert(ZONE.to_string(), z.to_string());
        }
        let mut n = NodeInfo::new(NodeSpec { name: name.into(), labels, ..Default::default() });
        for p in pods {
            n.add_pod(Arc::new(p));
        }
        n
    }

    #[derive(Default)]
    struct Cluster {
        nodes: Vec<NodeInfo>,
        namespaces: HashMap<String, BTreeMap<String, String>>,
        images: HashMap<String, usize>,
        handler_bits: HashMap<String, u64>,
    }

    impl Cluster {
        fn new(nodes: Vec<NodeInfo>) -> Cluster {
            Cluster { nodes, ..Default::default() }
        }

        fn snapshot(&self) -> Snapshot<'_> {
            Snapshot {
                nodes: &self.nodes,
                namespace_labels: &self.namespaces,
                image_nodes: &self.images,
                handler_bits: &self.handler_bits,
                zone_pods: None,
            }
        }

        fn filter(&self, pod: &PodInfo) -> Vec<Result<(), String>> {
            let Some(f) = Filter::pre_filter(pod, &self.snapshot()) else {
                return vec![Ok(()); self.nodes.len()];
            };
            self.nodes.iter().map(|n| f.filter(pod, n).map_err(|r| r.reasons.concat())).collect()
        }

        fn fitting(&self, pod: &PodInfo) -> Vec<&str> {
            self.nodes.iter().zip(self.filter(pod)).filter(|(_, r)| r.is_ok()).map(|(n, _)| n.name()).collect()
        }

        /// Raw and normalised scores with every node feasible.
        fn scores(&self, pod: &PodInfo) -> Option<(Vec<i64>, Vec<i64>)> {
            let feasible: Vec<&NodeInfo> = self.nodes.iter().collect();
            let s = Score::pre_score(pod, &self.snapshot(), &feasible)?;
            let raw: Vec<i64> = feasible.iter().map(|n| s.score(n)).collect();
            let mut normalized = raw.clone();
            s.normalize(&mut normalized);
            Some((raw, normalized))
        }
    }

    fn not_match() -> Result<(), String> {
        Err(ERR_CONSTRAINTS_NOT_MATCH.to_string())
    }

    #[test]
    fn max_skew_one_over_two_zones_sends_the_pod_to_the_emptier_zone() {
        let c = Cluster::new(vec![
            node("a1", Some("a"), vec![web("w1")]),
            node("a2", Some("a"), vec![web("w2")]),
            node("b1", Some("b"), vec![web("w3")]),
            node("b2", Some("b"), vec![]),
        ]);
        let p = pod("new", json!({"app": "web"}), spread(vec![constraint(ZONE, 1, "DoNotSchedule", json!({}))]));
        // Zone a: 2 + 1 − 1 = 2 > 1; zone b: 1 + 1 − 1 = 1.
        assert_eq!(c.filter(&p), vec![not_match(), not_match(), Ok(()), Ok(())]);
        let lenient = pod("new", json!({"app": "web"}), spread(vec![constraint(ZONE, 2, "DoNotSchedule", json!({}))]));
        assert_eq!(c.fitting(&lenient), vec!["a1", "a2", "b1", "b2"]);
    }

    #[test]
    fn a_pod_outside_its_own_selector_does_not_add_to_the_skew() {
        let c = Cluster::new(vec![node("a1", Some("a"), vec![web("w1")]), node("b1", Some("b"), vec![])]);
        let p = pod("other", json!({"app": "other"}), spread(vec![constraint(ZONE, 1, "DoNotSchedule", json!({}))]));
        // Zone a: 1 + 0 − 0 = 1.
        assert_eq!(c.fitting(&p), vec!["a1", "b1"]);
    }

    #[test]
    fn only_live_pods_of_the_same_namespace_count() {
        let mut terminating = web("w2");
        terminating.terminating = true;
        let c = Cluster::new(vec![
            node("a1", Some("a"), vec![terminating, pod_in("other", "w3", json!({"app": "web"}), Value::Null)]),
            node("b1", Some("b"), vec![]),
        ]);
        let p = pod("new", json!({"app": "web"}), spread(vec![constraint(ZONE, 1, "DoNotSchedule", json!({}))]));
        let f = Filter::pre_filter(&p, &c.snapshot()).unwrap();
        assert_eq!(f.domains[0], Domains::from_iter([("a".to_string(), 0), ("b".to_string(), 0)]));
    }

    #[test]
    fn min_domains_above_the_eligible_domains_makes_the_global_minimum_zero() {
        let c = Cluster::new(vec![node("a1", Some("a"), vec![web("w1")]), node("b1", Some("b"), vec![web("w2")])]);
        let plain = pod("new", json!({"app": "web"}), spread(vec![constraint(ZONE, 1, "DoNotSchedule", json!({}))]));
        assert_eq!(c.fitting(&plain), vec!["a1", "b1"], "1 + 1 − 1 is within maxSkew");
        let three = pod(
            "new",
            json!({"app": "web"}),
            spread(vec![constraint(ZONE, 1, "DoNotSchedule", json!({"minDomains": 3}))]),
        );
        // Two domains < 3: 1 + 1 − 0 = 2 > 1 everywhere.
        assert_eq!(c.filter(&three), vec![not_match(), not_match()]);
        let two = pod(
            "new",
            json!({"app": "web"}),
            spread(vec![constraint(ZONE, 1, "DoNotSchedule", json!({"minDomains": 2}))]),
        );
        assert_eq!(c.fitting(&two), vec!["a1", "b1"]);
    }

    #[test]
    fn a_node_without_the_topology_key_is_rejected_with_its_own_reason() {
        let c = Cluster::new(vec![node("a1", Some("a"), vec![]), node("x", None, vec![])]);
        let p = pod("new", json!({"app": "web"}), spread(vec![constraint(ZONE, 1, "DoNotSchedule", json!({}))]));
        assert_eq!(c.filter(&p), vec![Ok(()), Err(ERR_MISSING_LABEL.to_string())]);
    }

    #[test]
    fn nodes_the_pods_node_affinity_excludes_make_no_domain_unless_the_policy_ignores_it() {
        let mut a1 = node("a1", Some("a"), vec![web("w1")]);
        a1.node.labels.insert("disk".into(), "ssd".into());
        let c = Cluster::new(vec![a1, node("b1", Some("b"), vec![])]);
        let honor = pod(
            "new",
            json!({"app": "web"}),
            json!({"nodeSelector": {"disk": "ssd"}, "topologySpreadConstraints": [constraint(ZONE, 1, "DoNotSchedule", json!({}))]}),
        );
        // Zone b is not eligible: the only domain is a with 1 pod, so 1 + 1 − 1 = 1.
        assert_eq!(c.filter(&honor)[0], Ok(()));
        let ignore = pod(
            "new",
            json!({"app": "web"}),
            json!({"nodeSelector": {"disk": "ssd"}, "topologySpreadConstraints": [
                constraint(ZONE, 1, "DoNotSchedule", json!({"nodeAffinityPolicy": "Ignore"}))]}),
        );
        // Zone b counts with 0 pods: 1 + 1 − 0 = 2.
        assert_eq!(c.filter(&ignore)[0], not_match());
    }

    #[test]
    fn tainted_nodes_make_domains_unless_the_taints_policy_is_honor() {
        let mut b1 = node("b1", Some("b"), vec![]);
        b1.node.taints.push(Taint { key: "dedicated".into(), value: "x".into(), effect: Effect::NoSchedule });
        let c = Cluster::new(vec![node("a1", Some("a"), vec![web("w1")]), b1]);
        let ignore = pod("new", json!({"app": "web"}), spread(vec![constraint(ZONE, 1, "DoNotSchedule", json!({}))]));
        assert_eq!(c.filter(&ignore)[0], not_match());
        let honor = pod(
            "new",
            json!({"app": "web"}),
            spread(vec![constraint(ZONE, 1, "DoNotSchedule", json!({"nodeTaintsPolicy": "Honor"}))]),
        );
        assert_eq!(c.filter(&honor)[0], Ok(()));
    }

    #[test]
    fn every_constraint_must_hold() {
        let c = Cluster::new(vec![
            node("a1", Some("a"), vec![web("w1")]),
            node("a2", Some("a"), vec![]),
            node("b1", Some("b"), vec![web("w2"), web("w3")]),
        ]);
        let p = pod(
            "new",
            json!({"app": "web"}),
            spread(vec![
                constraint(ZONE, 1, "DoNotSchedule", json!({})),
                constraint(HOST, 1, "DoNotSchedule", json!({})),
            ]),
        );
        // Zones a: 1, b: 2 → only zone a; hosts a1: 1, a2: 0, b1: 2 → a1 has 1 + 1 − 0 = 2.
        assert_eq!(c.fitting(&p), vec!["a2"]);
    }

    #[test]
    fn only_do_not_schedule_constraints_filter() {
        let c = Cluster::new(vec![node("a1", Some("a"), vec![web("w1"), web("w2")]), node("b1", Some("b"), vec![])]);
        let soft = pod("new", json!({"app": "web"}), spread(vec![constraint(ZONE, 1, "ScheduleAnyway", json!({}))]));
        assert!(Filter::pre_filter(&soft, &c.snapshot()).is_none());
        assert!(Filter::pre_filter(&replica("r", "rs-1"), &c.snapshot()).is_none(), "default constraints never filter");
    }

    #[test]
    fn an_empty_selector_counts_no_pods_as_kubernetes_does() {
        let c = Cluster::new(vec![node("a1", Some("a"), vec![web("w1"), web("w2")]), node("b1", Some("b"), vec![])]);
        let mut c0 = constraint(ZONE, 1, "DoNotSchedule", json!({}));
        c0["labelSelector"] = json!({});
        let p = pod("new", json!({"app": "web"}), spread(vec![c0]));
        assert_eq!(c.fitting(&p), vec!["a1", "b1"]);
    }

    #[test]
    fn scoring_prefers_the_emptier_domain() {
        let c = Cluster::new(vec![
            node("a1", Some("a"), vec![web("w1"), web("w2")]),
            node("b1", Some("b"), vec![]),
            node("c1", Some("c"), vec![web("w3")]),
        ]);
        let p = pod("new", json!({"app": "web"}), spread(vec![constraint(ZONE, 1, "ScheduleAnyway", json!({}))]));
        let (raw, normalized) = c.scores(&p).unwrap();
        // Three domains weigh ln(5) = 1.609 each: 2 → 3.2 → 3, 0 → 0, 1 → 1.6 → 2.
        assert_eq!(raw, vec![3, 0, 2]);
        // 100 × (3 + 0 − s) / 3
        assert_eq!(normalized, vec![0, 100, 33]);
    }

    #[test]
    fn max_skew_raises_every_score_to_soften_the_differences() {
        let c = Cluster::new(vec![node("a1", Some("a"), vec![web("w1"), web("w2")]), node("b1", Some("b"), vec![])]);
        let p = pod("new", json!({"app": "web"}), spread(vec![constraint(ZONE, 5, "ScheduleAnyway", json!({}))]));
        let (raw, normalized) = c.scores(&p).unwrap();
        // Two domains weigh ln(4) = 1.386: 2 × 1.386 + 4 = 6.77 → 7, 0 + 4 = 4.
        assert_eq!(raw, vec![7, 4]);
        // 100 × (7 + 4 − s) / 7
        assert_eq!(normalized, vec![57, 100]);
    }

    #[test]
    fn pods_on_infeasible_nodes_count_for_their_domain() {
        let c = Cluster::new(vec![
            node("a1", Some("a"), vec![]),
            node("a2", Some("a"), vec![web("w1"), web("w2")]),
            node("b1", Some("b"), vec![web("w3")]),
        ]);
        let p = pod("new", json!({"app": "web"}), spread(vec![constraint(ZONE, 1, "ScheduleAnyway", json!({}))]));
        let feasible = vec![&c.nodes[0], &c.nodes[2]];
        let s = Score::pre_score(&p, &c.snapshot(), &feasible).unwrap();
        // Zone a holds 2 pods (on a2), zone b 1; ln(4) each.
        assert_eq!((s.score(&c.nodes[0]), s.score(&c.nodes[2])), (3, 1));
    }

    #[test]
    fn nodes_missing_a_key_of_the_pods_own_constraints_score_zero() {
        let c = Cluster::new(vec![
            node("a1", Some("a"), vec![web("w1")]),
            node("b1", Some("b"), vec![web("w2"), web("w3"), web("w4")]),
            node("x", None, vec![]),
        ]);
        let p = pod("new", json!({"app": "web"}), spread(vec![constraint(ZONE, 1, "ScheduleAnyway", json!({}))]));
        let (raw, normalized) = c.scores(&p).unwrap();
        // ln(4): 1.39 → 1, 4.16 → 4; x is ignored and neither lowers the minimum nor wins.
        assert_eq!(raw, vec![1, 4, 0]);
        assert_eq!(normalized, vec![100, 25, 0]);
    }

    #[test]
    fn all_zero_scores_normalise_to_the_maximum() {
        let c = Cluster::new(vec![node("a1", Some("a"), vec![]), node("b1", Some("b"), vec![])]);
        let p = pod("new", json!({"app": "web"}), spread(vec![constraint(ZONE, 1, "ScheduleAnyway", json!({}))]));
        assert_eq!(c.scores(&p), Some((vec![0, 0], vec![100, 100])));
    }

    #[test]
    fn default_constraints_apply_only_to_controlled_pods_without_their_own() {
        assert!(default_constraints(&web("w")).is_empty());
        let r = replica("r", "rs-1");
        let d = default_constraints(&r);
        let keys: Vec<(&str, i32, bool)> = d.iter().map(|c| (c.topology_key.as_str(), c.max_skew, c.hard)).collect();
        assert_eq!(keys, vec![(HOST, 3, false), (ZONE, 5, false)]);
        assert!(d.iter().all(|c| c.selector == PodMatcher::Controller("rs-1".into())));

        let c = Cluster::new(vec![node("a1", Some("a"), vec![])]);
        let mut own = pod("new", json!({"app": "web"}), spread(vec![constraint(ZONE, 1, "DoNotSchedule", json!({}))]));
        own.controller_uid = Some("rs-1".into());
        assert!(
            Score::pre_score(&own, &c.snapshot(), &[&c.nodes[0]]).is_none(),
            "own hard constraints replace the defaults"
        );
        assert!(Score::pre_score(&web("w"), &c.snapshot(), &[&c.nodes[0]]).is_none());
    }

    #[test]
    fn default_constraints_spread_replicas_of_one_replica_set() {
        let c = Cluster::new(vec![
            node("n1", Some("a"), vec![replica("r1", "rs-1"), replica("r2", "rs-1")]),
            node("n2", Some("a"), vec![replica("r3", "rs-1")]),
            node("n3", Some("b"), vec![replica("o1", "rs-2"), replica("o2", "rs-2")]),
            node("n4", None, vec![]),
        ]);
        let (raw, normalized) = c.scores(&replica("r4", "rs-1")).unwrap();
        // hostname: 4 nodes → ln(6) = 1.79, + 2; zone: domains a, b and "" (n4) → ln(5) = 1.61, + 4.
        // n1: 2×1.79+2 + 3×1.61+4 = 14.41; n2: 1.79+2 + 8.83 = 12.62; n3: 2 + 4 = 6; n4 (no zone): 2.
        assert_eq!(raw, vec![14, 13, 6, 2]);
        assert!(normalized[3] > normalized[2] && normalized[2] > normalized[1] && normalized[1] > normalized[0]);
        assert_eq!(normalized, vec![14, 21, 71, 100]);
    }

    #[test]
    fn the_caches_zone_counts_score_as_the_pass_over_every_node_does() {
        let c = Cluster::new(vec![
            node("n1", Some("a"), vec![replica("r1", "rs-1"), replica("r2", "rs-1")]),
            node("n2", Some("a"), vec![replica("r3", "rs-1"), replica("o3", "rs-2")]),
            node("n3", Some("b"), vec![replica("o1", "rs-2"), replica("o2", "rs-2")]),
            node("n4", None, vec![replica("r5", "rs-1")]),
            node("n5", Some("c"), vec![]),
        ]);
        let mut cache = crate::cache::Cache::new();
        for n in &c.nodes {
            cache.set_node(n.node.clone());
            for p in &n.pods {
                let mut bound = (**p).clone();
                bound.node_name = n.name().to_string();
                cache.add_pod(bound);
            }
        }
        let mut pinned = replica("r7", "rs-1");
        pinned.node_selector.insert(HOST.into(), "n2".into());
        for p in [replica("r4", "rs-1"), replica("o4", "rs-2"), replica("x1", "rs-new"), pinned] {
            let snapshot = cache.snapshot();
            assert!(snapshot.zone_pods.is_some());
            let feasible: Vec<&NodeInfo> = snapshot.nodes.iter().collect();
            let kept = Score::pre_score(&p, &snapshot, &feasible).unwrap();
            let by_name = |name: &str| c.nodes.iter().position(|n| n.name() == name).unwrap();
            let (passed, _) = c.scores(&p).unwrap();
            let from_cache: Vec<i64> = feasible.iter().map(|n| kept.score(n)).collect();
            let from_pass: Vec<i64> = feasible.iter().map(|n| passed[by_name(n.name())]).collect();
            assert_eq!(from_cache, from_pass, "{}", p.name);
        }
    }

    #[test]
    fn the_states_can_be_shared_between_threads() {
        fn shared<T: Send + Sync>() {}
        shared::<Filter>();
        shared::<Score>();
    }
}
