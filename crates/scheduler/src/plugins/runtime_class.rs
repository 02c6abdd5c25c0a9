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

/// The pod's class, the handler it names and that handler's bit in the snapshot's numbering
/// (`None` when no node reports it, or it has none).
#[derive(Clone, Copy, Debug)]
pub struct Wanted<'a> {
    pub class: &'a str,
    pub handler: &'a str,
    pub bit: Option<u64>,
}

/// Pods without a class (`None`) run on the default handler, which every node has.
pub fn filter(wanted: Option<Wanted>, node: &NodeInfo) -> FilterResult {
    let Some(w) = wanted else { return Ok(()) };
    let supported = match (node.handler_mask, w.bit) {
        (Some(mask), Some(bit)) => mask & bit != 0,
        // No bits to compare: the node's own list decides.
        _ => node.node.supports_handler(w.handler),
    };
    if supported { Ok(()) } else { Err(Rejection::new(NAME, reason(w.class))) }
}
