//! NodeAffinity: `spec.nodeSelector` and required node affinity filter nodes; preferred terms
//! add their weights to a node's score.

use crate::framework::{FilterResult, Rejection, default_normalize};
use crate::node_info::{NodeInfo, NodeSpec};
use crate::pod_info::PodInfo;

pub const NAME: &str = "NodeAffinity";
pub const ERR_REASON: &str = "node(s) didn't match Pod's node affinity/selector";

/// Whether the node satisfies the pod's nodeSelector and required node affinity.
pub fn required_matches(pod: &PodInfo, node: &NodeSpec) -> bool {
    pod.node_selector.iter().all(|(k, v)| node.labels.get(k) == Some(v))
        && pod.required_node_affinity.as_ref().is_none_or(|a| a.matches(&node.name, &node.labels))
}

pub fn filter(pod: &PodInfo, node: &NodeInfo) -> FilterResult {
    if required_matches(pod, &node.node) { Ok(()) } else { Err(Rejection::new(NAME, ERR_REASON)) }
}

/// The sum of the weights of the preferred terms the node matches.
pub fn score(pod: &PodInfo, node: &NodeInfo) -> i64 {
    pod.preferred_node_affinity
        .iter()
        .filter(|(_, term)| term.matches(&node.node.name, &node.node.labels))
        .map(|(w, _)| i64::from(*w))
        .sum()
}

pub fn normalize(scores: &mut [i64]) {
    default_normalize(scores, false);
}
