//! Node IPAM: every Node without `spec.podCIDR` gets the next free block of the cluster CIDR
//! (`--cluster-cidr` cut into `/--node-cidr-mask-size` blocks) in `spec.podCIDR` and
//! `spec.podCIDRs` — kube-controller-manager's `nodeipam` controller with its range allocator,
//! through the API only, on when `--allocate-node-cidrs` is.
//!
//! One task owns the [`CidrSet`]; it reads a watch of all Nodes and does one thing at a time, so
//! nodes registering at once can never get the same block. The blocks taken are learnt from the
//! Nodes themselves at every (re)list before anything is handed out: the API is the only record,
//! and a restarted controller (or a new leader) starts from it. A Node's block is freed when the
//! Node is deleted. Each assignment is a patch conditional on the resourceVersion the decision
//! was made on, and podCIDRs cannot change once set, so a stale view loses the race instead of
//! overwriting; the block goes back and the node is retried. When every block is taken the node
//! gets a `CIDRNotAvailable` event and waits for a block to be freed (or the next retry).

pub mod cidr_set;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use berth_events::{Event, Type};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;

pub use cidr_set::{CidrError, CidrSet, Ipv4Net};

use crate::Context;

/// How often nodes still without a block are tried again.
const RETRY: Duration = Duration::from_secs(5);
/// The event reason of a node that found no free block, as kube-controller-manager records it.
pub const CIDR_NOT_AVAILABLE: &str = "CIDRNotAvailable";

/// The IPv4 CIDRs of a node's `spec.podCIDRs` (or `spec.podCIDR` when that is all it has);
/// what does not parse (IPv6, garbage) is left out.
pub fn node_cidrs(node: &Node) -> Vec<Ipv4Net> {
    let spec = node.spec.as_ref();
    let listed = spec.and_then(|s| s.pod_cidrs.clone()).unwrap_or_default();
    let single = spec.and_then(|s| s.pod_cidr.clone()).into_iter().filter(|c| !c.is_empty());
    let all: Vec<String> = if listed.is_empty() { single.collect() } else { listed };
    all.iter().filter_map(|c| c.parse().ok()).collect()
}

/// Whether the node has any pod CIDR at all (even one this controller cannot read).
fn has_cidr(node: &Node) -> bool {
    let spec = node.spec.as_ref();
    spec.and_then(|s| s.pod_cidr.as_deref()).is_some_and(|c| !c.is_empty())
        || spec.and_then(|s| s.pod_cidrs.as_ref()).is_some_and(|c| !c.is_empty())
}

/// What the allocator knows: the blocks, which node holds which, and the nodes waiting for one
/// (as last seen, for the resourceVersion of the conditional patch).
pub struct Ipam {
    set: CidrSet,
    held: BTreeMap<String, Vec<Ipv4Net>>,
    waiting: BTreeMap<String, Node>,
    /// Nodes told `CIDRNotAvailable` since they last got nothing: one event per stretch.
    reported: std::collections::BTreeSet<String>,
}

impl Ipam {
    pub fn new(set: CidrSet) -> Ipam {
        Ipam { set, held: BTreeMap::new(), waiting: BTreeMap::new(), reported: Default::default() }
    }

    /// Starts over from a full list of the Nodes: every block one of them holds is taken.
    pub fn resync(&mut self, nodes: &[Node]) {
        self.held.clear();
        self.waiting.clear();
        // Every block freed, the cursor kept: a relist must not bring recently freed blocks first.
        let cluster = self.set.cluster();
        let _ = self.set.release(&cluster);
        for node in nodes {
            self.observe(node);
        }
    }

    /// A node as it is now: its blocks are taken, or it waits for one.
    pub fn observe(&mut self, node: &Node) {
        let Some(name) = node.metadata.name.clone() else { return };
        if node.metadata.deletion_timestamp.is_some() && !has_cidr(node) {
            self.waiting.remove(&name);
            return;
        }
        if has_cidr(node) {
            self.waiting.remove(&name);
            self.reported.remove(&name);
            let cidrs = node_cidrs(node);
            for c in &cidrs {
                if let Err(e) = self.set.occupy(c) {
                    tracing::debug!(node = %name, error = %e, "pod CIDR not from the cluster CIDR");
                }
            }
            self.held.insert(name, cidrs);
        } else if !self.held.contains_key(&name) {
            // A node this task has just patched may still show up without its block once.
            self.waiting.insert(name, node.clone());
        }
    }

    /// A node is gone: its blocks are free again, unless another node claims them too.
    pub fn forget(&mut self, name: &str) {
        self.waiting.remove(name);
        self.reported.remove(name);
        let Some(cidrs) = self.held.remove(name) else { return };
        for c in &cidrs {
            let _ = self.set.release(c);
        }
        for other in self.held.values().flatten().filter(|o| cidrs.iter().any(|c| c.overlaps(o))) {
            let _ = self.set.occupy(other);
        }
    }

    /// The nodes waiting for a block, by name.
    pub fn waiting(&self) -> Vec<String> {
        self.waiting.keys().cloned().collect()
    }

    pub fn taken(&self) -> usize {
        self.set.taken()
    }
}

/// Runs the allocator until the future is dropped.
pub async fn run(ctx: Arc<Context>) {
    let (cluster, mask) = (ctx.config.cluster_cidr, ctx.config.node_cidr_mask_size);
    let set = match CidrSet::new(cluster, mask) {
        Ok(set) => set,
        Err(e) => {
            tracing::error!(error = %e, controller = "nodeipam", "invalid pod network settings; controller not started");
            return;
        }
    };
    tracing::info!(cluster_cidr = %cluster, node_cidr_mask_size = mask, blocks = set.capacity(), "allocating node pod CIDRs");
    let mut ipam = Ipam::new(set);
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let mut events = watcher(nodes.clone(), watcher::Config::default()).default_backoff().boxed();
    let mut listing: Option<Vec<Node>> = None;
    let mut synced = false;
    let mut retry = tokio::time::interval(RETRY);
    retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            event = events.next() => {
                let Some(event) = event else { return };
                match event {
                    Ok(watcher::Event::Init) => listing = Some(Vec::new()),
                    Ok(watcher::Event::InitApply(node)) => listing.get_or_insert_default().push(node),
                    Ok(watcher::Event::InitDone) => {
                        let nodes = listing.take().unwrap_or_default();
                        ipam.resync(&nodes);
                        synced = true;
                        tracing::info!(nodes = nodes.len(), blocks_taken = ipam.taken(), "node pod CIDRs learnt");
                    }
                    Ok(watcher::Event::Apply(node)) => ipam.observe(&node),
                    Ok(watcher::Event::Delete(node)) => {
                        if let Some(name) = &node.metadata.name {
                            ipam.forget(name);
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, controller = "nodeipam", "watch failed"),
                }
            }
            _ = retry.tick() => {}
        }
        // Nothing is handed out before every taken block is known.
        if synced && listing.is_none() {
            assign_waiting(&ctx, &nodes, &mut ipam).await;
        }
    }
}

/// Gives each waiting node a block, until the blocks run out.
async fn assign_waiting(ctx: &Context, nodes: &Api<Node>, ipam: &mut Ipam) {
    for name in ipam.waiting() {
        let Some(node) = ipam.waiting.get(&name).cloned() else { continue };
        let Some(cidr) = ipam.set.allocate() else {
            if ipam.reported.insert(name.clone()) {
                tracing::warn!(node = %name, cluster_cidr = %ipam.set.cluster(), "no pod CIDR left for the node");
                let message = format!(
                    "Node {name} status is now: {CIDR_NOT_AVAILABLE} (every block of the cluster CIDR {} is taken)",
                    ipam.set.cluster()
                );
                ctx.recorder.emit(Event::about(&node, Type::Normal, CIDR_NOT_AVAILABLE, message));
            }
            return;
        };
        let patch = json!({
            "metadata": {"resourceVersion": node.metadata.resource_version},
            "spec": {"podCIDR": cidr.to_string(), "podCIDRs": [cidr.to_string()]},
        });
        match nodes.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => {
                tracing::info!(node = %name, pod_cidr = %cidr, "assigned pod CIDR");
                ipam.waiting.remove(&name);
                ipam.reported.remove(&name);
                ipam.held.insert(name, vec![cidr]);
            }
            Err(e) => {
                // The block goes back; the watch brings the node as it is now (with a block
                // someone else gave it, or gone), and a node still without one is tried again.
                let _ = ipam.set.release(&cidr);
                match &e {
                    kube::Error::Api(s) if s.code == 404 => {
                        ipam.waiting.remove(&name);
                    }
                    kube::Error::Api(s) if s.code == 409 => {
                        tracing::debug!(node = %name, "node changed meanwhile; pod CIDR assignment retried")
                    }
                    _ => tracing::warn!(node = %name, pod_cidr = %cidr, error = %e, "assigning a pod CIDR failed"),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, cidrs: &[&str]) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": name, "resourceVersion": "1"},
            "spec": if cidrs.is_empty() { json!({}) } else { json!({"podCIDR": cidrs[0], "podCIDRs": cidrs}) },
        }))
        .unwrap()
    }

    fn ipam() -> Ipam {
        Ipam::new(CidrSet::new("10.244.0.0/16".parse().unwrap(), 24).unwrap())
    }

    #[test]
    fn a_node_with_only_the_single_pod_cidr_field_counts_and_ipv6_is_left_out() {
        let mut n = node("a", &[]);
        n.spec =
            Some(k8s_openapi::api::core::v1::NodeSpec { pod_cidr: Some("10.244.3.0/24".into()), ..Default::default() });
        assert_eq!(node_cidrs(&n), vec!["10.244.3.0/24".parse().unwrap()]);
        assert_eq!(node_cidrs(&node("b", &["10.244.4.0/24", "fd00::/64"])), vec!["10.244.4.0/24".parse().unwrap()]);
    }

    #[test]
    fn a_resync_takes_the_blocks_nodes_hold_and_queues_the_rest() {
        let mut ipam = ipam();
        ipam.resync(&[node("a", &["10.244.0.0/24"]), node("b", &[]), node("c", &["10.244.2.0/24"])]);
        assert_eq!(ipam.taken(), 2);
        assert_eq!(ipam.waiting(), ["b"]);
        assert_eq!(ipam.set.allocate(), Some("10.244.1.0/24".parse().unwrap()));
    }

    #[test]
    fn a_resync_forgets_blocks_of_nodes_gone_meanwhile() {
        let mut ipam = ipam();
        ipam.resync(&[node("a", &["10.244.0.0/24"]), node("b", &["10.244.1.0/24"])]);
        ipam.resync(&[node("b", &["10.244.1.0/24"])]);
        assert_eq!(ipam.taken(), 1);
    }

    #[test]
    fn forgetting_a_node_frees_its_block_unless_another_node_claims_it() {
        let mut ipam = ipam();
        ipam.resync(&[node("a", &["10.244.0.0/24"]), node("b", &["10.244.0.0/24"]), node("c", &["10.244.1.0/24"])]);
        ipam.forget("a");
        assert_eq!(ipam.taken(), 2, "b still holds 10.244.0.0/24");
        ipam.forget("c");
        assert_eq!(ipam.taken(), 1);
    }

    #[test]
    fn a_node_that_got_its_block_is_not_queued_again_by_an_older_event() {
        let mut ipam = ipam();
        ipam.resync(&[]);
        ipam.held.insert("a".into(), vec!["10.244.0.0/24".parse().unwrap()]);
        ipam.observe(&node("a", &[]));
        assert!(ipam.waiting().is_empty());
    }
}
