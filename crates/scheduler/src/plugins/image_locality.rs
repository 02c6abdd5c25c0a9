//! ImageLocality: nodes that already hold the pod's images score higher, scaled by how widely
//! each image is spread (an image on every node says little), between 23 MiB and 1000 MiB per
//! container as Kubernetes bounds it.

use crate::framework::{MAX_NODE_SCORE, Snapshot};
use crate::node_info::NodeInfo;
use crate::pod_info::PodInfo;

pub const NAME: &str = "ImageLocality";
const MB: i64 = 1024 * 1024;
const MIN_THRESHOLD: i64 = 23 * MB;
const MAX_CONTAINER_THRESHOLD: i64 = 1000 * MB;

pub fn score(pod: &PodInfo, node: &NodeInfo, snapshot: &Snapshot) -> i64 {
    if pod.images.is_empty() {
        return 0;
    }
    let total = snapshot.nodes.len().max(1) as f64;
    let sum: i64 = pod
        .images
        .iter()
        .filter_map(|image| {
            let size = node.node.images.get(image)?;
            let spread = snapshot.image_nodes.get(image).copied().unwrap_or(1) as f64 / total;
            Some((*size as f64 * spread) as i64)
        })
        .sum();
    let max = MAX_CONTAINER_THRESHOLD * pod.images.len() as i64;
    let clamped = sum.clamp(MIN_THRESHOLD, max);
    MAX_NODE_SCORE * (clamped - MIN_THRESHOLD) / (max - MIN_THRESHOLD)
}
