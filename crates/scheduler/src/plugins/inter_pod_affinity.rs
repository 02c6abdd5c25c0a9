//! InterPodAffinity: required pod affinity and anti-affinity (the incoming pod's, and existing
//! pods' anti-affinity against it) filter nodes; preferred terms of both sides and existing pods'
//! required affinity score them, per topology domain, as kube-scheduler's plugin does.
//!
//! Both halves count once per decision over the whole snapshot, keyed by topology pair (a label
//! key and the value a node carries for it); a node is then judged by the pairs of its own labels.
//! The incoming pod is in no `NodeInfo` yet, so it never counts against itself.

use std::collections::{BTreeMap, HashMap};

use crate::framework::{FilterResult, MAX_NODE_SCORE, Rejection, Snapshot};
use crate::node_info::{NodeInfo, NodeSpec};
use crate::pod_info::{AffinityTerm, PodInfo, WeightedAffinityTerm};

pub const NAME: &str = "InterPodAffinity";
pub const ERR_AFFINITY: &str = "node(s) didn't match pod affinity rules";
pub const ERR_ANTI_AFFINITY: &str = "node(s) didn't match pod anti-affinity rules";
pub const ERR_EXISTING_ANTI_AFFINITY: &str = "node(s) didn't satisfy existing pods anti-affinity rules";

/// What an existing pod's required affinity term adds to a domain the incoming pod matches
/// (kube-scheduler's `hardPodAffinityWeight`, default 1).
const HARD_POD_AFFINITY_WEIGHT: i64 = 1;

/// Sums per topology pair: label key → label value → sum.
#[derive(Clone, Debug, Default)]
struct PairCounts(HashMap<String, HashMap<String, i64>>);

impl PairCounts {
    /// Adds `n` to the pair the node has for `key`; a node without the label adds nothing.
    fn add(&mut self, node: &NodeSpec, key: &str, n: i64) {
        if let Some(value) = node.labels.get(key) {
            *self.0.entry(key.to_string()).or_default().entry(value.clone()).or_default() += n;
        }
    }

    fn get(&self, key: &str, value: &str) -> i64 {
        self.0.get(key).and_then(|values| values.get(value)).copied().unwrap_or(0)
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The sum over the pairs of these labels.
    fn sum_over(&self, labels: &BTreeMap<String, String>) -> i64 {
        self.0.iter().filter_map(|(key, values)| labels.get(key).and_then(|v| values.get(v))).sum()
    }

    /// Whether any pair of these labels has a positive count.
    fn any_positive(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().any(|(key, values)| labels.get(key).and_then(|v| values.get(v)).is_some_and(|n| *n > 0))
    }
}

/// Kubernetes' `podMatchesAllAffinityTerms`: false for no terms at all.
fn matches_all(terms: &[AffinityTerm], pod: &PodInfo, namespace_labels: Option<&BTreeMap<String, String>>) -> bool {
    !terms.is_empty() && terms.iter().all(|t| t.matches(pod, namespace_labels))
}

/// The filter half, computed once per pod in `pre_filter` and read by every node's `filter`.
#[derive(Debug)]
pub struct Filter {
    /// Existing pods' required anti-affinity terms the incoming pod matches, per pair of the
    /// existing pod's node.
    existing_anti_affinity: PairCounts,
    /// Existing pods matching all of the incoming pod's required affinity terms, one count per
    /// term, per pair of their node.
    affinity: PairCounts,
    /// Existing pods matching each of the incoming pod's required anti-affinity terms.
    anti_affinity: PairCounts,
    /// No existing pod matches the affinity terms, and the pod matches them all itself: the
    /// first pod of a group with affinity to itself may go to any node with the topology keys.
    first_of_group: bool,
}

impl Filter {
    /// None when the pod has no required (anti-)affinity and no existing pod has required
    /// anti-affinity that matches it (nothing to check).
    pub fn pre_filter(pod: &PodInfo, snapshot: &Snapshot) -> Option<Filter> {
        let own_namespace = snapshot.namespace_labels.get(&pod.namespace);

        let mut existing_anti_affinity = PairCounts::default();
        for node in snapshot.nodes.iter().filter(|n| n.pods_with_required_anti_affinity > 0) {
            for existing in &node.pods {
                for term in &existing.required_anti_affinity {
                    if term.matches(pod, own_namespace) {
                        existing_anti_affinity.add(&node.node, &term.topology_key, 1);
                    }
                }
            }
        }
        if existing_anti_affinity.is_empty()
            && pod.required_affinity.is_empty()
            && pod.required_anti_affinity.is_empty()
        {
            return None;
        }

        let mut affinity = PairCounts::default();
        let mut anti_affinity = PairCounts::default();
        if !pod.required_affinity.is_empty() || !pod.required_anti_affinity.is_empty() {
            for node in snapshot.nodes {
                for existing in &node.pods {
                    let namespace = snapshot.namespace_labels.get(&existing.namespace);
                    if matches_all(&pod.required_affinity, existing, namespace) {
                        for term in &pod.required_affinity {
                            affinity.add(&node.node, &term.topology_key, 1);
                        }
                    }
                    for term in &pod.required_anti_affinity {
                        if term.matches(existing, namespace) {
                            anti_affinity.add(&node.node, &term.topology_key, 1);
                        }
                    }
                }
            }
        }
        let first_of_group = affinity.is_empty() && matches_all(&pod.required_affinity, pod, own_namespace);
        Some(Filter { existing_anti_affinity, affinity, anti_affinity, first_of_group })
    }

    /// Checks the incoming pod's affinity, then its anti-affinity, then existing pods'
    /// anti-affinity, and reports the first that fails (Kubernetes' order).
    pub fn filter(&self, pod: &PodInfo, node: &NodeInfo) -> FilterResult {
        let labels = &node.node.labels;
        if !self.satisfies_affinity(pod, labels) {
            return Err(Rejection::new(NAME, ERR_AFFINITY));
        }
        if !self.satisfies_anti_affinity(pod, labels) {
            return Err(Rejection::new(NAME, ERR_ANTI_AFFINITY));
        }
        if self.existing_anti_affinity.any_positive(labels) {
            return Err(Rejection::new(NAME, ERR_EXISTING_ANTI_AFFINITY));
        }
        Ok(())
    }

    /// Every term needs a matching pod in the node's domain of its key (the node must carry the
    /// key), unless the pod is the first of its group.
    fn satisfies_affinity(&self, pod: &PodInfo, labels: &BTreeMap<String, String>) -> bool {
        let mut pods_exist = true;
        for term in &pod.required_affinity {
            let Some(value) = labels.get(&term.topology_key) else { return false };
            if self.affinity.get(&term.topology_key, value) <= 0 {
                pods_exist = false;
            }
        }
        pods_exist || self.first_of_group
    }

    /// No term may have a matching pod in the node's domain of its key; a node without the key
    /// is in no domain and passes.
    fn satisfies_anti_affinity(&self, pod: &PodInfo, labels: &BTreeMap<String, String>) -> bool {
        self.anti_affinity.is_empty()
            || pod.required_anti_affinity.iter().all(|term| {
                labels.get(&term.topology_key).is_none_or(|v| self.anti_affinity.get(&term.topology_key, v) <= 0)
            })
    }
}

/// The score half: the summed weights per topology pair, computed once in `pre_score`.
#[derive(Debug)]
pub struct Score {
    topology_score: PairCounts,
}

impl Score {
    /// None when there is nothing to score (all nodes 0): no term of the pod matches an
    /// existing pod, and no term of an existing pod matches the pod.
    ///
    /// Existing pods on every node of the snapshot count, not only on the feasible ones.
    pub fn pre_score(pod: &PodInfo, snapshot: &Snapshot, feasible: &[&NodeInfo]) -> Option<Score> {
        if feasible.is_empty() {
            return None;
        }
        // Without preferred terms of its own only pods with affinity can add to a domain.
        let has_preferred = !pod.preferred_affinity.is_empty() || !pod.preferred_anti_affinity.is_empty();
        let own_namespace = snapshot.namespace_labels.get(&pod.namespace);
        let mut scores = PairCounts::default();
        let mut any = false;
        for node in snapshot.nodes {
            if node.node.labels.is_empty() || (!has_preferred && node.pods_with_affinity == 0) {
                continue;
            }
            let mut add = |term: &AffinityTerm, weight: i64| {
                if node.node.labels.contains_key(&term.topology_key) {
                    scores.add(&node.node, &term.topology_key, weight);
                    any = true;
                }
            };
            for existing in &node.pods {
                if !has_preferred && !existing.has_affinity() {
                    continue;
                }
                let namespace = snapshot.namespace_labels.get(&existing.namespace);
                // The incoming pod's preferences about the existing pod.
                for_matching(&pod.preferred_affinity, existing, namespace, |t, w| add(t, w));
                for_matching(&pod.preferred_anti_affinity, existing, namespace, |t, w| add(t, -w));
                // The existing pod's rules about the incoming pod (symmetry).
                for term in &existing.required_affinity {
                    if term.matches(pod, own_namespace) {
                        add(term, HARD_POD_AFFINITY_WEIGHT);
                    }
                }
                for_matching(&existing.preferred_affinity, pod, own_namespace, |t, w| add(t, w));
                for_matching(&existing.preferred_anti_affinity, pod, own_namespace, |t, w| add(t, -w));
            }
        }
        any.then_some(Score { topology_score: scores })
    }

    /// The sum over the node's topology pairs.
    pub fn score(&self, node: &NodeInfo) -> i64 {
        self.topology_score.sum_over(&node.node.labels)
    }

    /// Min-max scaling to 0..=100; all equal scores become 0.
    pub fn normalize(scores: &mut [i64]) {
        let (Some(min), Some(max)) = (scores.iter().copied().min(), scores.iter().copied().max()) else { return };
        let diff = max - min;
        for s in scores.iter_mut() {
            *s = if diff > 0 { (MAX_NODE_SCORE as f64 * ((*s - min) as f64 / diff as f64)) as i64 } else { 0 };
        }
    }
}

/// Calls `f` with each weighted term that matches `pod`, and its weight.
fn for_matching(
    terms: &[WeightedAffinityTerm],
    pod: &PodInfo,
    namespace_labels: Option<&BTreeMap<String, String>>,
    mut f: impl FnMut(&AffinityTerm, i64),
) {
    for t in terms.iter().filter(|t| t.term.matches(pod, namespace_labels)) {
        f(&t.term, i64::from(t.weight));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::{Value, json};

    use super::*;

    const HOST: &str = "kubernetes.io/hostname";
    const ZONE: &str = "topology.kubernetes.io/zone";

    fn pod(name: &str, labels: Value, affinity: Value) -> PodInfo {
        pod_in("default", name, labels, affinity)
    }

    fn pod_in(namespace: &str, name: &str, labels: Value, affinity: Value) -> PodInfo {
        PodInfo::from_pod(
            &serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": namespace, "uid": name, "labels": labels},
                "spec": {"containers": [{"name": "c", "image": "app"}], "affinity": affinity}
            }))
            .unwrap(),
        )
    }

    fn term(selector: Value, key: &str) -> Value {
        json!({"labelSelector": {"matchLabels": selector}, "topologyKey": key})
    }

    fn required_anti(t: Value) -> Value {
        json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [t]}})
    }

    fn required_affinity(terms: Vec<Value>) -> Value {
        json!({"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": terms}})
    }

    fn node(name: &str, zone: Option<&str>) -> NodeInfo {
        let mut labels = BTreeMap::from([(HOST.to_string(), name.to_string())]);
        if let Some(z) = zone {
            labels.insert(ZONE.to_string(), z.to_string());
        }
        NodeInfo::new(NodeSpec { name: name.into(), labels, ..Default::default() })
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

        fn bind(&mut self, node: &str, pod: PodInfo) {
            self.nodes.iter_mut().find(|n| n.name() == node).unwrap().add_pod(Arc::new(pod));
        }

        /// Each node's verdict: `Ok` or the one reason.
        fn filter(&self, pod: &PodInfo) -> Vec<Result<(), String>> {
            let Some(f) = Filter::pre_filter(pod, &self.snapshot()) else {
                return vec![Ok(()); self.nodes.len()];
            };
            self.nodes.iter().map(|n| f.filter(pod, n).map_err(|r| r.reasons.concat())).collect()
        }

        fn fitting(&self, pod: &PodInfo) -> Vec<&str> {
            self.nodes.iter().zip(self.filter(pod)).filter(|(_, r)| r.is_ok()).map(|(n, _)| n.name()).collect()
        }

        /// Normalised scores of all nodes, all feasible.
        fn scores(&self, pod: &PodInfo) -> Vec<i64> {
            let feasible: Vec<&NodeInfo> = self.nodes.iter().collect();
            let Some(s) = Score::pre_score(pod, &self.snapshot(), &feasible) else {
                return vec![0; self.nodes.len()];
            };
            let mut scores: Vec<i64> = feasible.iter().map(|n| s.score(n)).collect();
            Score::normalize(&mut scores);
            scores
        }
    }

    fn web_replica(i: usize) -> PodInfo {
        pod(&format!("web-{i}"), json!({"app": "web"}), required_anti(term(json!({"app": "web"}), HOST)))
    }

    #[test]
    fn anti_affinity_spreads_three_replicas_over_three_nodes_by_hostname() {
        let mut c = Cluster::new(vec![node("n1", None), node("n2", None), node("n3", None)]);
        assert_eq!(c.fitting(&web_replica(1)), vec!["n1", "n2", "n3"]);
        c.bind("n1", web_replica(1));
        assert_eq!(c.fitting(&web_replica(2)), vec!["n2", "n3"]);
        c.bind("n2", web_replica(2));
        let verdicts = c.filter(&web_replica(3));
        assert_eq!(verdicts[2], Ok(()));
        // Its own anti-affinity is checked before the existing pods' anti-affinity.
        assert_eq!(verdicts[0], Err(ERR_ANTI_AFFINITY.to_string()));
        assert_eq!(verdicts[1], Err(ERR_ANTI_AFFINITY.to_string()));
        c.bind("n3", web_replica(3));
        assert!(c.fitting(&web_replica(4)).is_empty());
    }

    #[test]
    fn a_pod_requires_affinity_to_an_existing_pod_in_its_zone() {
        let mut c =
            Cluster::new(vec![node("a1", Some("a")), node("a2", Some("a")), node("b1", Some("b")), node("x", None)]);
        c.bind("a1", pod("cache", json!({"app": "cache"}), Value::Null));
        let web = pod("web", json!({"app": "web"}), required_affinity(vec![term(json!({"app": "cache"}), ZONE)]));
        let verdicts = c.filter(&web);
        assert_eq!(verdicts[0], Ok(()));
        assert_eq!(verdicts[1], Ok(()), "another node of the same zone is in the domain");
        assert_eq!(verdicts[2], Err(ERR_AFFINITY.to_string()));
        assert_eq!(verdicts[3], Err(ERR_AFFINITY.to_string()), "a node without the key is in no domain");
    }

    #[test]
    fn without_any_match_only_a_pod_matching_its_own_terms_may_start_the_group() {
        let mut c = Cluster::new(vec![node("a1", Some("a")), node("b1", Some("b")), node("x", None)]);
        let first = pod("web-1", json!({"app": "web"}), required_affinity(vec![term(json!({"app": "web"}), ZONE)]));
        assert_eq!(c.fitting(&first), vec!["a1", "b1"], "any node with the key takes the first pod");
        let stranger = pod("db", json!({"app": "db"}), required_affinity(vec![term(json!({"app": "web"}), ZONE)]));
        assert!(c.fitting(&stranger).is_empty(), "a pod that does not match its own terms waits for a match");

        c.bind("b1", first);
        let second = pod("web-2", json!({"app": "web"}), required_affinity(vec![term(json!({"app": "web"}), ZONE)]));
        assert_eq!(c.fitting(&second), vec!["b1"], "once one exists the group follows it");
        assert_eq!(c.fitting(&stranger), vec!["b1"]);
    }

    #[test]
    fn an_existing_pod_counts_for_affinity_only_when_it_matches_every_term() {
        let mut c = Cluster::new(vec![node("a1", Some("a")), node("b1", Some("b"))]);
        c.bind("a1", pod("half", json!({"app": "web", "tier": "back"}), Value::Null));
        let terms = vec![term(json!({"app": "web"}), ZONE), term(json!({"tier": "front"}), ZONE)];
        let matching_itself = pod("p", json!({"app": "web", "tier": "front"}), required_affinity(terms.clone()));
        // No pod matches both terms, so this pod counts as the first of its group.
        assert_eq!(c.fitting(&matching_itself), vec!["a1", "b1"]);
        let not_itself = pod("q", json!({"app": "web"}), required_affinity(terms));
        assert!(c.fitting(&not_itself).is_empty());
    }

    #[test]
    fn an_existing_pods_anti_affinity_rejects_a_newcomer_in_its_zone() {
        let mut c =
            Cluster::new(vec![node("a1", Some("a")), node("a2", Some("a")), node("b1", Some("b")), node("x", None)]);
        c.bind("a1", pod("loner", json!({"app": "loner"}), required_anti(term(json!({"app": "db"}), ZONE))));
        let db = pod("db", json!({"app": "db"}), Value::Null);
        let verdicts = c.filter(&db);
        assert_eq!(verdicts[0], Err(ERR_EXISTING_ANTI_AFFINITY.to_string()));
        assert_eq!(verdicts[1], Err(ERR_EXISTING_ANTI_AFFINITY.to_string()));
        assert_eq!(verdicts[2], Ok(()));
        assert_eq!(verdicts[3], Ok(()), "a node without the zone label is outside every zone");

        let other = pod("web", json!({"app": "web"}), Value::Null);
        assert!(Filter::pre_filter(&other, &c.snapshot()).is_none(), "nothing to check for a pod no rule names");
    }

    #[test]
    fn affinity_is_checked_before_anti_affinity() {
        let mut c = Cluster::new(vec![node("a1", Some("a")), node("b1", Some("b"))]);
        c.bind("a1", pod("db", json!({"app": "db"}), Value::Null));
        let affinity = json!({
            "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term(json!({"app": "cache"}), ZONE)]},
            "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term(json!({"app": "db"}), ZONE)]}
        });
        let p = pod("p", json!({"app": "p"}), affinity);
        assert_eq!(c.filter(&p), vec![Err(ERR_AFFINITY.to_string()), Err(ERR_AFFINITY.to_string())]);
    }

    #[test]
    fn a_namespace_selector_picks_pods_by_their_namespaces_labels() {
        let mut c = Cluster::new(vec![node("n1", None), node("n2", None), node("n3", None)]);
        c.namespaces.insert("team-a".into(), BTreeMap::from([("team".to_string(), "a".to_string())]));
        c.namespaces.insert("team-b".into(), BTreeMap::from([("team".to_string(), "b".to_string())]));
        c.namespaces.insert("default".into(), BTreeMap::new());
        c.bind("n1", pod_in("team-a", "w1", json!({"app": "web"}), Value::Null));
        c.bind("n2", pod_in("team-b", "w2", json!({"app": "web"}), Value::Null));
        c.bind("n3", pod_in("default", "w3", json!({"app": "web"}), Value::Null));
        let t = json!({"labelSelector": {"matchLabels": {"app": "web"}}, "namespaceSelector": {"matchLabels": {"team": "a"}}, "topologyKey": HOST});
        let p = pod("p", json!({}), required_anti(t));
        assert_eq!(c.fitting(&p), vec!["n2", "n3"]);

        let every =
            json!({"labelSelector": {"matchLabels": {"app": "web"}}, "namespaceSelector": {}, "topologyKey": HOST});
        assert!(
            c.fitting(&pod("q", json!({}), required_anti(every))).is_empty(),
            "an empty selector takes every namespace"
        );
    }

    #[test]
    fn an_existing_pods_namespace_selector_is_matched_against_the_newcomers_namespace() {
        let mut c = Cluster::new(vec![node("n1", None), node("n2", None)]);
        c.namespaces.insert("team-a".into(), BTreeMap::from([("team".to_string(), "a".to_string())]));
        c.namespaces.insert("team-b".into(), BTreeMap::from([("team".to_string(), "b".to_string())]));
        let t = json!({"labelSelector": {"matchLabels": {"app": "web"}}, "namespaceSelector": {"matchLabels": {"team": "a"}}, "topologyKey": HOST});
        c.bind("n1", pod_in("ops", "guard", json!({}), required_anti(t)));
        assert_eq!(c.fitting(&pod_in("team-a", "w", json!({"app": "web"}), Value::Null)), vec!["n2"]);
        assert_eq!(c.fitting(&pod_in("team-b", "w", json!({"app": "web"}), Value::Null)), vec!["n1", "n2"]);
    }

    #[test]
    fn pre_filter_is_skipped_only_when_nothing_could_reject() {
        let mut c = Cluster::new(vec![node("n1", None)]);
        let plain = pod("p", json!({"app": "web"}), Value::Null);
        assert!(Filter::pre_filter(&plain, &c.snapshot()).is_none());
        c.bind("n1", web_replica(1));
        assert!(Filter::pre_filter(&plain, &c.snapshot()).is_some(), "the replica's anti-affinity names it");
        assert!(Filter::pre_filter(&pod("q", json!({"app": "db"}), Value::Null), &c.snapshot()).is_none());
    }

    fn preferred(kind: &str, weight: i32, t: Value) -> Value {
        json!({kind: {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": weight, "podAffinityTerm": t}]}})
    }

    #[test]
    fn scoring_prefers_the_node_of_a_preferred_pod() {
        let mut c = Cluster::new(vec![node("n1", Some("a")), node("n2", Some("a")), node("n3", Some("b"))]);
        c.bind("n2", pod("cache", json!({"app": "cache"}), Value::Null));
        let by_host = pod("p", json!({}), preferred("podAffinity", 10, term(json!({"app": "cache"}), HOST)));
        assert_eq!(c.scores(&by_host), vec![0, 100, 0]);
        let by_zone = pod("p", json!({}), preferred("podAffinity", 10, term(json!({"app": "cache"}), ZONE)));
        assert_eq!(c.scores(&by_zone), vec![100, 100, 0]);
    }

    #[test]
    fn preferred_anti_affinity_lowers_the_node_of_a_matching_pod() {
        let mut c = Cluster::new(vec![node("n1", None), node("n2", None), node("n3", None)]);
        c.bind("n1", pod("web-1", json!({"app": "web"}), Value::Null));
        let p =
            pod("web-2", json!({"app": "web"}), preferred("podAntiAffinity", 50, term(json!({"app": "web"}), HOST)));
        assert_eq!(c.scores(&p), vec![0, 100, 100]);
    }

    #[test]
    fn existing_pods_rules_about_the_newcomer_count_too() {
        let mut c = Cluster::new(vec![node("n1", None), node("n2", None), node("n3", None)]);
        // A required affinity term of an existing pod weighs 1; preferred ones weigh their weight.
        c.bind("n1", pod("needs-db", json!({}), required_affinity(vec![term(json!({"app": "db"}), HOST)])));
        c.bind("n2", pod("likes-db", json!({}), preferred("podAffinity", 3, term(json!({"app": "db"}), HOST))));
        c.bind("n3", pod("hates-db", json!({}), preferred("podAntiAffinity", 4, term(json!({"app": "db"}), HOST))));
        let db = pod("db", json!({"app": "db"}), Value::Null);
        let snapshot = c.snapshot();
        let feasible: Vec<&NodeInfo> = c.nodes.iter().collect();
        let s = Score::pre_score(&db, &snapshot, &feasible).unwrap();
        assert_eq!(feasible.iter().map(|n| s.score(n)).collect::<Vec<_>>(), vec![1, 3, -4]);
        // -4..=3 scaled: (1 - -4) / 7 * 100 = 71.4
        assert_eq!(c.scores(&db), vec![71, 100, 0]);
        assert!(Score::pre_score(&pod("x", json!({"app": "x"}), Value::Null), &snapshot, &feasible).is_none());
    }

    #[test]
    fn pods_outside_the_terms_namespaces_do_not_score() {
        let mut c = Cluster::new(vec![node("n1", None), node("n2", None)]);
        c.bind("n1", pod_in("other", "cache", json!({"app": "cache"}), Value::Null));
        let p = pod("p", json!({}), preferred("podAffinity", 10, term(json!({"app": "cache"}), HOST)));
        assert!(Score::pre_score(&p, &c.snapshot(), &c.nodes.iter().collect::<Vec<_>>()).is_none());
    }

    #[test]
    fn normalisation_is_min_max_and_equal_scores_become_zero() {
        let mut s = vec![-5, 0, 5];
        Score::normalize(&mut s);
        assert_eq!(s, vec![0, 50, 100]);
        let mut s = vec![7, 7];
        Score::normalize(&mut s);
        assert_eq!(s, vec![0, 0]);
        let mut s = vec![0, 1, 3];
        Score::normalize(&mut s);
        assert_eq!(s, vec![0, 33, 100]);
    }

    #[test]
    fn the_states_can_be_shared_between_threads() {
        fn shared<T: Send + Sync>() {}
        shared::<Filter>();
        shared::<Score>();
    }
}
