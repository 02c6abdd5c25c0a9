//! NodeName: a pod that names a node in `spec.nodeName` fits only there.

use crate::framework::{FilterResult, Rejection};
use crate::node_info::NodeInfo;
use crate::pod_info::PodInfo;

pub const NAME: &str = "NodeName";
pub const ERR_REASON: &str = "node(s) didn't match the requested node name";

pub fn filter(pod: &PodInfo, node: &NodeInfo) -> FilterResult {
    if pod.node_name.is_empty() || pod.node_name == node.name() {
        Ok(())
    } else {
        Err(Rejection::new(NAME, ERR_REASON))
    }
}
