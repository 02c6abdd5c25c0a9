//! NodeResourcesFit and NodeResourcesBalancedAllocation: a pod's requests (with overhead) must
//! fit in the node's allocatable minus what its pods request; nodes with more left score higher
//! (least allocated), and so do nodes whose cpu and memory stay in balance.

use std::borrow::Cow;

use crate::framework::{FilterResult, MAX_NODE_SCORE, Rejection};
use crate::node_info::NodeInfo;
use crate::pod_info::PodInfo;

pub const NAME: &str = "NodeResourcesFit";
pub const BALANCED_ALLOCATION: &str = "NodeResourcesBalancedAllocation";
pub const ERR_TOO_MANY_PODS: &str = "Too many pods";

pub fn filter(pod: &PodInfo, node: &NodeInfo) -> FilterResult {
    let mut reasons: Vec<Cow<'static, str>> = Vec::new();
    if node.pods.len() as i64 + 1 > node.node.allowed_pods {
        reasons.push(ERR_TOO_MANY_PODS.into());
    }
    let want = &pod.requests;
    let free = |alloc: i64, used: i64| alloc.saturating_sub(used);
    let alloc = &node.node.allocatable;
    let used = &node.requested;
    if want.milli_cpu > 0 && free(alloc.milli_cpu, used.milli_cpu) < want.milli_cpu {
        reasons.push("Insufficient cpu".into());
    }
    if want.memory > 0 && free(alloc.memory, used.memory) < want.memory {
        reasons.push("Insufficient memory".into());
    }
    if want.ephemeral_storage > 0 && free(alloc.ephemeral_storage, used.ephemeral_storage) < want.ephemeral_storage {
        reasons.push("Insufficient ephemeral-storage".into());
    }
    if reasons.is_empty() { Ok(()) } else { Err(Rejection { plugin: NAME, reasons }) }
}

/// (requested, allocatable) of cpu and memory after placing the pod; resources the node has
/// none of are left out, as Kubernetes skips them.
fn after_placing(node: &NodeInfo, pod_cpu: i64, pod_mem: i64, non_zero: bool) -> [(i64, i64); 2] {
    let used = if non_zero { &node.non_zero_requested } else { &node.requested };
    let alloc = &node.node.allocatable;
    [(used.milli_cpu + pod_cpu, alloc.milli_cpu), (used.memory + pod_mem, alloc.memory)]
}

/// Least allocated: the mean over cpu and memory of the share left free, 0..=100.
pub fn least_allocated_score(pod: &PodInfo, node: &NodeInfo) -> i64 {
    let r = &pod.non_zero_requests;
    let (mut sum, mut weights) = (0, 0);
    for (requested, allocatable) in after_placing(node, r.milli_cpu, r.memory, true) {
        if allocatable == 0 {
            continue;
        }
        sum += if requested > allocatable { 0 } else { (allocatable - requested) * MAX_NODE_SCORE / allocatable };
        weights += 1;
    }
    if weights == 0 { 0 } else { sum / weights }
}

/// Balanced allocation: 100 × (1 − the standard deviation of the cpu and memory fractions).
pub fn balanced_allocation_score(pod: &PodInfo, node: &NodeInfo) -> i64 {
    let r = &pod.requests;
    let fractions: Vec<f64> = after_placing(node, r.milli_cpu, r.memory, false)
        .into_iter()
        .filter(|(_, allocatable)| *allocatable != 0)
        .map(|(requested, allocatable)| (requested as f64 / allocatable as f64).min(1.0))
        .collect();
    let std = match fractions.len() {
        2 => ((fractions[0] - fractions[1]) / 2.0).abs(),
        n if n > 2 => {
            let mean = fractions.iter().sum::<f64>() / n as f64;
            (fractions.iter().map(|f| (f - mean).powi(2)).sum::<f64>() / n as f64).sqrt()
        }
        _ => 0.0,
    };
    ((1.0 - std) * MAX_NODE_SCORE as f64) as i64
}
