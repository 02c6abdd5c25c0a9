//! RuntimeClass (berth's own): a pod fits only on nodes whose `status.runtimeHandlers` list its
//! class's handler, so a node whose gVisor is down still takes runc pods but no gVisor pods.
//! A node that reports no handlers at all counts as supporting every handler.

use crate::framework::{FilterResult, Rejection};
use crate::node_info::NodeInfo;

pub const NAME: &str = "RuntimeClass";

/// The reason a node gives for a class it cannot run.
pub fn reason(class: &str) -> String {
    format!("node(s) didn't support RuntimeClass \"{class}\"")
}

/// The message of a pod whose class does not exist (deleted after admission).
pub fn not_found_message(class: &str) -> String {
    format!("RuntimeClass \"{class}\" not found")
}

/// `class` and `handler` are the pod's RuntimeClass and the handler it names; pods without a
/// class run on the default handler, which every node has.
pub fn filter(class_and_handler: Option<(&str, &str)>, node: &NodeInfo) -> FilterResult {
    match class_and_handler {
        Some((class, handler)) if !node.node.supports_handler(handler) => Err(Rejection::new(NAME, reason(class))),
        _ => Ok(()),
    }
}
