//! TaintToleration: a node's NoSchedule and NoExecute taints keep off pods that do not tolerate
//! them; untolerated PreferNoSchedule taints lower its score.

use crate::framework::{FilterResult, Rejection, default_normalize};
use crate::node_info::NodeInfo;
use crate::pod_info::PodInfo;
use crate::taints::{Effect, first_untolerated};

pub const NAME: &str = "TaintToleration";

pub fn filter(pod: &PodInfo, node: &NodeInfo) -> FilterResult {
    match first_untolerated(&node.node.taints, &pod.tolerations, |t| t.effect != Effect::PreferNoSchedule) {
        None => Ok(()),
        Some(t) => Err(Rejection::new(NAME, format!("node(s) had untolerated taint {{{}: {}}}", t.key, t.value))),
    }
}

/// The number of PreferNoSchedule taints the pod does not tolerate (fewer is better).
pub fn score(pod: &PodInfo, node: &NodeInfo) -> i64 {
    let prefer: Vec<_> =
        pod.tolerations.iter().filter(|t| t.effect.is_none_or(|e| e == Effect::PreferNoSchedule)).collect();
    node.node
        .taints
        .iter()
        .filter(|t| t.effect == Effect::PreferNoSchedule && !prefer.iter().any(|tol| tol.tolerates(t)))
        .count() as i64
}

pub fn normalize(scores: &mut [i64]) {
    default_normalize(scores, true);
}
