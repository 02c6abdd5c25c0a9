//! One scheduling decision: filter the nodes (in parallel, stopping once enough fit, from a
//! start point that rotates between pods as Kubernetes' `percentageOfNodesToScore` sampling
//! does), score the ones that fit with the default profile's weights, and pick the best, ties
//! broken at random.
//!
//! Filters run in kube-scheduler's order, with berth's RuntimeClass filter after NodeName: a
//! node is rejected by the first plugin that says no, and that plugin's reasons are what the
//! failure message counts.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use rayon::prelude::*;

use crate::framework::{FilterResult, FitError, Rejection, Snapshot};
use crate::node_info::NodeInfo;
use crate::plugins::{
    image_locality, inter_pod_affinity, node_affinity, node_name, node_ports, node_resources, node_unschedulable,
    pod_topology_spread, runtime_class, taint_toleration,
};
use crate::pod_info::PodInfo;

/// Below this many nodes to look at, filtering runs on the calling thread.
const PARALLEL_THRESHOLD: usize = 256;
/// Nodes looked at per step of the search.
const SEARCH_CHUNK: usize = 1024;
/// Kubernetes' `minFeasibleNodesToFind` and `minFeasibleNodesPercentageToFind`.
const MIN_FEASIBLE_NODES: usize = 100;
const MIN_FEASIBLE_PERCENTAGE: usize = 5;

/// Score weights of Kubernetes' default profile.
const WEIGHT_TAINT_TOLERATION: i64 = 3;
const WEIGHT_NODE_AFFINITY: i64 = 2;
const WEIGHT_LEAST_ALLOCATED: i64 = 1;
const WEIGHT_BALANCED_ALLOCATION: i64 = 1;
const WEIGHT_IMAGE_LOCALITY: i64 = 1;
const WEIGHT_INTER_POD_AFFINITY: i64 = 2;
const WEIGHT_TOPOLOGY_SPREAD: i64 = 2;

/// The node chosen for a pod, with how many nodes were looked at and how many fit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    pub node: String,
    pub evaluated: usize,
    pub feasible: usize,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The pod names a RuntimeClass that does not exist (deleted after admission).
    RuntimeClassNotFound(String),
    Unfit(FitError),
}

impl Failure {
    /// The plugins to wait on before trying again.
    pub fn plugins(&self) -> Vec<&'static str> {
        match self {
            Failure::RuntimeClassNotFound(_) => vec![runtime_class::NAME],
            Failure::Unfit(e) => e.plugins.clone(),
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::RuntimeClassNotFound(class) => f.write_str(&runtime_class::not_found_message(class)),
            Failure::Unfit(e) => e.fmt(f),
        }
    }
}

/// How many feasible nodes to find before scoring: all of a small cluster, else an adaptive
/// share (50% minus 1% per 125 nodes, at least 5%) and at least 100, as Kubernetes computes it
/// for `percentageOfNodesToScore: 0`; a set percentage overrides the adaptive one.
pub fn num_feasible_nodes_to_find(num_all_nodes: usize, percentage: u32) -> usize {
    if num_all_nodes < MIN_FEASIBLE_NODES || percentage >= 100 {
        return num_all_nodes;
    }
    let mut pct = percentage as usize;
    if pct == 0 {
        pct = 50usize.saturating_sub(num_all_nodes / 125).max(MIN_FEASIBLE_PERCENTAGE);
    }
    (num_all_nodes * pct / 100).max(MIN_FEASIBLE_NODES)
}

/// The per-pod state of the plugins that look across nodes, prepared once per decision.
struct Prepared<'a> {
    class: Option<runtime_class::Wanted<'a>>,
    affinity: Option<inter_pod_affinity::Filter>,
    spread: Option<pod_topology_spread::Filter>,
}

impl Prepared<'_> {
    fn filter(&self, pod: &PodInfo, node: &NodeInfo) -> FilterResult {
        node_unschedulable::filter(pod, node)?;
        node_name::filter(pod, node)?;
        runtime_class::filter(self.class, node)?;
        taint_toleration::filter(pod, node)?;
        node_affinity::filter(pod, node)?;
        node_ports::filter(pod, node)?;
        node_resources::filter(pod, node)?;
        if let Some(spread) = &self.spread {
            spread.filter(pod, node)?;
        }
        if let Some(affinity) = &self.affinity {
            affinity.filter(pod, node)?;
        }
        Ok(())
    }
}

enum Verdict {
    Skipped,
    Feasible,
    Rejected(Rejection),
}

/// Decides where pods go; keeps the rotating start point and the tie-breaking randomness.
pub struct Algorithm {
    next_start: usize,
    rng: fastrand::Rng,
    /// 0: adaptive.
    pub percentage_of_nodes_to_score: u32,
}

impl Default for Algorithm {
    fn default() -> Self {
        Algorithm::new(fastrand::Rng::new())
    }
}

impl Algorithm {
    pub fn new(rng: fastrand::Rng) -> Algorithm {
        Algorithm { next_start: 0, rng, percentage_of_nodes_to_score: 0 }
    }

    /// Picks a node for `pod`; `handlers` maps each RuntimeClass to its handler.
    pub fn schedule(
        &mut self,
        pod: &PodInfo,
        snapshot: &Snapshot,
        handlers: &HashMap<String, String>,
    ) -> Result<Placement, Failure> {
        let class = match &pod.runtime_class {
            Some(class) => match handlers.get(class) {
                Some(handler) => Some(runtime_class::Wanted {
                    class: class.as_str(),
                    handler: handler.as_str(),
                    bit: snapshot.handler_bits.get(handler).copied(),
                }),
                None => return Err(Failure::RuntimeClassNotFound(class.clone())),
            },
            None => None,
        };
        let nodes = snapshot.nodes;
        let all = nodes.len();
        if all == 0 {
            return Err(Failure::Unfit(FitError::default()));
        }
        let prepared = Prepared {
            class,
            affinity: inter_pod_affinity::Filter::pre_filter(pod, snapshot),
            spread: pod_topology_spread::Filter::pre_filter(pod, snapshot),
        };
        let to_find = num_feasible_nodes_to_find(all, self.percentage_of_nodes_to_score);
        let start = self.next_start % all;
        let found = AtomicUsize::new(0);
        let check = |i: usize| -> Verdict {
            if found.load(Ordering::Relaxed) >= to_find {
                return Verdict::Skipped;
            }
            match prepared.filter(pod, &nodes[(start + i) % all]) {
                Ok(()) => {
                    if found.fetch_add(1, Ordering::Relaxed) >= to_find {
                        found.fetch_sub(1, Ordering::Relaxed);
                        Verdict::Skipped
                    } else {
                        Verdict::Feasible
                    }
                }
                Err(rejection) => Verdict::Rejected(rejection),
            }
        };
        // Chunks in order: a search that has found enough stops after the chunk it is in,
        // instead of going past every node of a large cluster.
        let mut feasible: Vec<&NodeInfo> = Vec::with_capacity(to_find.min(all));
        let mut error = FitError { num_all_nodes: all, ..Default::default() };
        let mut processed = 0;
        let mut offset = 0;
        while offset < all && feasible.len() < to_find {
            let end = (offset + SEARCH_CHUNK).min(all);
            let verdicts: Vec<Verdict> = if end - offset < PARALLEL_THRESHOLD {
                (offset..end).map(check).collect()
            } else {
                (offset..end).into_par_iter().with_min_len(PARALLEL_THRESHOLD / 2).map(check).collect()
            };
            for (i, verdict) in (offset..end).zip(verdicts) {
                match verdict {
                    Verdict::Skipped => {}
                    Verdict::Feasible => {
                        processed += 1;
                        feasible.push(&nodes[(start + i) % all]);
                    }
                    Verdict::Rejected(rejection) => {
                        processed += 1;
                        error.record(rejection);
                    }
                }
            }
            offset = end;
        }
        self.next_start = (start + processed) % all;
        if feasible.is_empty() {
            return Err(Failure::Unfit(error));
        }
        let evaluated = processed;
        let feasible_count = feasible.len();
        let node = if feasible.len() == 1 {
            feasible[0].name().to_string()
        } else {
            let totals = score(pod, snapshot, &feasible);
            self.select(&feasible, &totals)
        };
        Ok(Placement { node, evaluated, feasible: feasible_count })
    }

    /// The node with the highest total; among equals each is equally likely (reservoir sampling).
    fn select(&mut self, nodes: &[&NodeInfo], totals: &[i64]) -> String {
        let mut best = 0;
        let mut ties = 1;
        for i in 1..nodes.len() {
            if totals[i] > totals[best] {
                best = i;
                ties = 1;
            } else if totals[i] == totals[best] {
                ties += 1;
                if self.rng.usize(0..ties) == 0 {
                    best = i;
                }
            }
        }
        nodes[best].name().to_string()
    }
}

/// Weighted sum of every score plugin, each normalised to 0..=100 first.
pub fn score(pod: &PodInfo, snapshot: &Snapshot, feasible: &[&NodeInfo]) -> Vec<i64> {
    let n = feasible.len();
    let mut totals = vec![0i64; n];
    let mut add = |scores: &[i64], weight: i64| {
        for (t, s) in totals.iter_mut().zip(scores) {
            *t += s * weight;
        }
    };
    let per_node = |f: &dyn Fn(&NodeInfo) -> i64| -> Vec<i64> { feasible.iter().map(|node| f(node)).collect() };

    let mut taints = per_node(&|node| taint_toleration::score(pod, node));
    taint_toleration::normalize(&mut taints);
    add(&taints, WEIGHT_TAINT_TOLERATION);

    if !pod.preferred_node_affinity.is_empty() {
        let mut affinity = per_node(&|node| node_affinity::score(pod, node));
        node_affinity::normalize(&mut affinity);
        add(&affinity, WEIGHT_NODE_AFFINITY);
    }

    add(&per_node(&|node| node_resources::least_allocated_score(pod, node)), WEIGHT_LEAST_ALLOCATED);
    add(&per_node(&|node| node_resources::balanced_allocation_score(pod, node)), WEIGHT_BALANCED_ALLOCATION);

    if !pod.images.is_empty() {
        add(&per_node(&|node| image_locality::score(pod, node, snapshot)), WEIGHT_IMAGE_LOCALITY);
    }

    if let Some(state) = inter_pod_affinity::Score::pre_score(pod, snapshot, feasible) {
        let mut scores = per_node(&|node| state.score(node));
        inter_pod_affinity::Score::normalize(&mut scores);
        add(&scores, WEIGHT_INTER_POD_AFFINITY);
    }

    if let Some(state) = pod_topology_spread::Score::pre_score(pod, snapshot, feasible) {
        let mut scores = per_node(&|node| state.score(node));
        state.normalize(&mut scores);
        add(&scores, WEIGHT_TOPOLOGY_SPREAD);
    }
    totals
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::cache::Cache;
    use crate::node_info::NodeSpec;
    use crate::resources::Resources;
    use crate::taints::{Effect, Taint};

    fn node(name: &str, cpu: i64, handlers: Option<&[&str]>) -> NodeSpec {
        NodeSpec {
            name: name.into(),
            allocatable: Resources { milli_cpu: cpu, memory: 8 << 30, ephemeral_storage: 0 },
            allowed_pods: 110,
            runtime_handlers: handlers.map(|hs| hs.iter().map(|h| h.to_string()).collect()),
            ..Default::default()
        }
    }

    fn pod(json: serde_json::Value) -> PodInfo {
        PodInfo::from_pod(&serde_json::from_value(json).unwrap())
    }

    fn classes() -> HashMap<String, String> {
        [("gvisor".to_string(), "runsc".to_string()), ("runc".to_string(), "runc".to_string())].into()
    }

    #[test]
    fn the_sample_size_follows_kubernetes_adaptive_formula() {
        assert_eq!(num_feasible_nodes_to_find(50, 0), 50);
        assert_eq!(num_feasible_nodes_to_find(100, 0), 100);
        assert_eq!(num_feasible_nodes_to_find(1000, 0), 420);
        assert_eq!(num_feasible_nodes_to_find(5000, 0), 500);
        assert_eq!(num_feasible_nodes_to_find(10_000, 0), 500);
        assert_eq!(num_feasible_nodes_to_find(1000, 30), 300);
    }

    #[test]
    fn a_pod_lands_only_where_its_handler_runs_and_the_message_counts_the_others() {
        let mut cache = Cache::new();
        cache.set_node(node("runc-only", 4000, Some(&["runc"])));
        cache.set_node(node("both", 4000, Some(&["runc", "runsc"])));
        cache.set_node(node("old-kubelet", 100, None));
        let mut algo = Algorithm::new(fastrand::Rng::with_seed(1));
        let sandboxed = pod(serde_json::json!({
            "metadata": {"name": "p", "uid": "p"},
            "spec": {"runtimeClassName": "gvisor", "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}
        }));
        for _ in 0..10 {
            let placed = algo.schedule(&sandboxed, &cache.snapshot(), &classes()).unwrap();
            assert_eq!(placed.node, "both");
            assert_eq!(placed.feasible, 1);
        }
        cache.remove_node("both");
        let err = algo.schedule(&sandboxed, &cache.snapshot(), &classes()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "0/2 nodes are available: 1 Insufficient cpu, 1 node(s) didn't support RuntimeClass \"gvisor\"."
        );
        assert_eq!(err.plugins(), vec![runtime_class::NAME, node_resources::NAME]);
    }

    #[test]
    fn a_handler_no_node_reports_fits_only_nodes_that_report_none_at_all() {
        let mut cache = Cache::new();
        cache.set_node(node("listed", 4000, Some(&["runc"])));
        cache.set_node(node("silent", 4000, None));
        let p = pod(
            serde_json::json!({"metadata": {"name": "p"}, "spec": {"runtimeClassName": "gvisor", "containers": []}}),
        );
        let mut algo = Algorithm::default();
        for _ in 0..5 {
            assert_eq!(algo.schedule(&p, &cache.snapshot(), &classes()).unwrap().node, "silent");
        }
        // Once a node reports the handler, it gets a bit and the mask decides.
        cache.set_node(node("listed", 4000, Some(&["runc", "runsc"])));
        cache.remove_node("silent");
        assert!(cache.snapshot().handler_bits.contains_key("runsc"));
        assert_eq!(algo.schedule(&p, &cache.snapshot(), &classes()).unwrap().node, "listed");
    }

    #[test]
    fn a_missing_runtime_class_fails_before_any_node_is_looked_at() {
        let mut cache = Cache::new();
        cache.set_node(node("n", 1000, None));
        let p =
            pod(serde_json::json!({"metadata": {"name": "p"}, "spec": {"runtimeClassName": "kata", "containers": []}}));
        let err = Algorithm::default().schedule(&p, &cache.snapshot(), &classes()).unwrap_err();
        assert_eq!(err, Failure::RuntimeClassNotFound("kata".into()));
        assert_eq!(err.to_string(), "RuntimeClass \"kata\" not found");
    }

    #[test]
    fn taints_selectors_and_cordons_each_give_their_reason() {
        let mut cache = Cache::new();
        let mut tainted = node("tainted", 1000, None);
        tainted.taints.push(Taint { key: "dedicated".into(), value: "gpu".into(), effect: Effect::NoSchedule });
        cache.set_node(tainted);
        let mut cordoned = node("cordoned", 1000, None);
        cordoned.unschedulable = true;
        cache.set_node(cordoned);
        let mut labelled = node("other-zone", 1000, None);
        labelled.labels = BTreeMap::from([("zone".to_string(), "b".to_string())]);
        cache.set_node(labelled);
        let p = pod(
            serde_json::json!({"metadata": {"name": "p"}, "spec": {"nodeSelector": {"zone": "a"}, "containers": []}}),
        );
        let err = Algorithm::default().schedule(&p, &cache.snapshot(), &classes()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "0/3 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, \
             1 node(s) had untolerated taint {dedicated: gpu}, 1 node(s) were unschedulable."
        );
    }

    #[test]
    fn host_ports_and_pod_counts_keep_pods_apart() {
        let mut cache = Cache::new();
        let mut small = node("n", 4000, None);
        small.allowed_pods = 1;
        cache.set_node(small);
        cache.set_node(node("m", 4000, None));
        let web = |uid: &str| {
            pod(serde_json::json!({"metadata": {"name": uid, "uid": uid},
                "spec": {"containers": [{"name": "c", "ports": [{"containerPort": 80, "hostPort": 80}]}]}}))
        };
        let mut algo = Algorithm::default();
        let first = algo.schedule(&web("a"), &cache.snapshot(), &classes()).unwrap();
        cache.assume(PodInfo { node_name: first.node.clone(), ..web("a") });
        let second = algo.schedule(&web("b"), &cache.snapshot(), &classes()).unwrap();
        assert_ne!(first.node, second.node);
        cache.assume(PodInfo { node_name: second.node.clone(), ..web("b") });
        let err = algo.schedule(&web("c"), &cache.snapshot(), &classes()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "0/2 nodes are available: 2 node(s) didn't have free ports for the requested pod ports."
        );
        // Without ports, the full node still refuses a second pod.
        let plain = pod(serde_json::json!({"metadata": {"name": "d", "uid": "d"}, "spec": {"containers": []}}));
        for _ in 0..5 {
            assert_eq!(algo.schedule(&plain, &cache.snapshot(), &classes()).unwrap().node, "m");
        }
    }

    #[test]
    fn the_least_allocated_node_wins() {
        let mut cache = Cache::new();
        cache.set_node(node("busy", 4000, None));
        cache.set_node(node("idle", 4000, None));
        cache.add_pod(PodInfo {
            uid: "x".into(),
            node_name: "busy".into(),
            requests: Resources { milli_cpu: 3000, memory: 0, ephemeral_storage: 0 },
            non_zero_requests: Resources { milli_cpu: 3000, memory: 0, ephemeral_storage: 0 },
            ..Default::default()
        });
        let p = pod(serde_json::json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}}));
        let mut algo = Algorithm::default();
        for _ in 0..5 {
            assert_eq!(algo.schedule(&p, &cache.snapshot(), &classes()).unwrap().node, "idle");
        }
    }

    #[test]
    fn prefer_no_schedule_taints_and_preferred_affinity_steer_the_choice() {
        let mut cache = Cache::new();
        let mut soft = node("soft-tainted", 4000, None);
        soft.taints.push(Taint { key: "k".into(), value: String::new(), effect: Effect::PreferNoSchedule });
        cache.set_node(soft);
        cache.set_node(node("clean", 4000, None));
        let mut preferred = node("preferred", 4000, None);
        preferred.labels.insert("disk".into(), "ssd".into());
        preferred.taints.push(Taint { key: "k".into(), value: String::new(), effect: Effect::PreferNoSchedule });
        cache.set_node(preferred);
        let plain = pod(serde_json::json!({"metadata": {"name": "p"}, "spec": {"containers": []}}));
        let mut algo = Algorithm::default();
        for _ in 0..5 {
            assert_eq!(algo.schedule(&plain, &cache.snapshot(), &classes()).unwrap().node, "clean");
        }
        let wants_ssd = pod(
            serde_json::json!({"metadata": {"name": "p"}, "spec": {"containers": [], "affinity": {"nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "preference": {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}}]}}}}),
        );
        // Affinity (2 × 100) outweighs one untolerated soft taint (3 × 100) only together
        // with equal resources: both differ by the same margin, so check the sum directly.
        let feasible: Vec<&NodeInfo> = cache.snapshot().nodes.iter().collect();
        let totals = score(&wants_ssd, &cache.snapshot(), &feasible);
        let by_name: HashMap<&str, i64> = feasible.iter().map(|n| n.name()).zip(totals).collect();
        assert_eq!(by_name["preferred"] - by_name["soft-tainted"], 2 * 100);
        assert_eq!(by_name["clean"] - by_name["soft-tainted"], 3 * 100);
    }

    #[test]
    fn the_start_node_rotates_so_large_clusters_spread_the_search() {
        let mut cache = Cache::new();
        for i in 0..1000 {
            cache.set_node(node(&format!("n{i}"), 4000, None));
        }
        let p = pod(serde_json::json!({"metadata": {"name": "p"}, "spec": {"containers": []}}));
        let mut algo = Algorithm::default();
        let placed = algo.schedule(&p, &cache.snapshot(), &classes()).unwrap();
        assert_eq!(placed.feasible, 420);
        assert_eq!(placed.evaluated, 420);
        assert_eq!(algo.next_start, 420);
        algo.schedule(&p, &cache.snapshot(), &classes()).unwrap();
        assert_eq!(algo.next_start, 840);
    }
}
