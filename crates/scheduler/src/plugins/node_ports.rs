//! NodePorts: a pod's `hostPort`s must be free on the node (same protocol and port, on the same
//! address or on 0.0.0.0).

use crate::framework::{FilterResult, Rejection};
use crate::node_info::NodeInfo;
use crate::pod_info::PodInfo;

pub const NAME: &str = "NodePorts";
pub const ERR_REASON: &str = "node(s) didn't have free ports for the requested pod ports";

pub fn filter(pod: &PodInfo, node: &NodeInfo) -> FilterResult {
    let conflict = pod.host_ports.iter().any(|want| node.used_ports.iter().any(|used| used.conflicts(want)));
    if conflict { Err(Rejection::new(NAME, ERR_REASON)) } else { Ok(()) }
}
