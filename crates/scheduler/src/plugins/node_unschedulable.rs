//! NodeUnschedulable: a cordoned node (`spec.unschedulable`) takes only pods that tolerate the
//! `node.kubernetes.io/unschedulable:NoSchedule` taint.

use crate::framework::{FilterResult, Rejection};
use crate::node_info::NodeInfo;
use crate::pod_info::PodInfo;
use crate::taints::{Effect, Taint};

pub const NAME: &str = "NodeUnschedulable";
pub const ERR_REASON: &str = "node(s) were unschedulable";
pub const TAINT_KEY: &str = "node.kubernetes.io/unschedulable";

pub fn filter(pod: &PodInfo, node: &NodeInfo) -> FilterResult {
    if !node.node.unschedulable {
        return Ok(());
    }
    let taint = Taint { key: TAINT_KEY.into(), value: String::new(), effect: Effect::NoSchedule };
    if pod.tolerations.iter().any(|t| t.tolerates(&taint)) { Ok(()) } else { Err(Rejection::new(NAME, ERR_REASON)) }
}
