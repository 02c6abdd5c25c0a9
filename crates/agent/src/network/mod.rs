//! The node's part of the pod network, as kubelet and a host-gw network plugin do it:
//!
//! - [`pod_cidr`]: when this node's `spec.podCIDR` is set or changes, every CRI endpoint is told
//!   with `UpdateRuntimeConfig` (berth's runtime then moves its default network to that range);
//!   an endpoint that could not be told is tried again every [`RESYNC`].
//! - [`routes`]: for every other node with a pod CIDR and an InternalIP on a directly connected
//!   network, a route `podCIDR via InternalIP` (host-gw), tagged with berth's routing protocol
//!   so berth's routes are told from everyone else's; replaced when the IP changes, removed when
//!   the node goes.
//!
//! One watch of all Nodes feeds both; they act after each change and every [`RESYNC`] (which
//! also repairs routes someone removed). Nothing acts in the middle of a relist, so a
//! half-listed cluster never removes routes.

pub mod pod_cidr;
pub mod routes;

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};

use crate::agent::Context;

/// How often the runtimes and routes are brought in line without a Node change.
pub const RESYNC: Duration = Duration::from_secs(30);

/// Runs the pod CIDR and route sync until the future is dropped.
pub async fn run(ctx: Context) {
    let mut router = match routes::Netlink::connect() {
        Ok(table) => Some(routes::Router::new(table)),
        Err(e) => {
            tracing::warn!(error = %berth_common::error::error_chain(&e), "routes to other nodes' pods are not managed");
            None
        }
    };
    let mut runtimes = pod_cidr::PodCidrSync::default();
    let api: Api<Node> = Api::all(ctx.client.clone());
    let mut events = watcher(api, watcher::Config::default()).default_backoff().boxed();
    let mut nodes: BTreeMap<String, Node> = BTreeMap::new();
    let mut listing: Option<BTreeMap<String, Node>> = None;
    let mut synced = false;
    let mut tick = tokio::time::interval(RESYNC);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let forced = tokio::select! {
            event = events.next() => {
                match event {
                    None => return,
                    Some(Ok(watcher::Event::Init)) => listing = Some(BTreeMap::new()),
                    Some(Ok(watcher::Event::InitApply(node))) => {
                        if let Some(name) = node.metadata.name.clone() {
                            listing.get_or_insert_default().insert(name, node);
                        }
                    }
                    Some(Ok(watcher::Event::InitDone)) => {
                        nodes = listing.take().unwrap_or_default();
                        synced = true;
                    }
                    Some(Ok(watcher::Event::Apply(node))) => {
                        if let Some(name) = node.metadata.name.clone() {
                            nodes.insert(name, node);
                        }
                    }
                    Some(Ok(watcher::Event::Delete(node))) => {
                        if let Some(name) = &node.metadata.name {
                            nodes.remove(name);
                        }
                    }
                    Some(Err(e)) => tracing::warn!(error = %e, "watching nodes for the pod network failed"),
                }
                false
            }
            _ = tick.tick() => true,
        };
        if !synced || listing.is_some() {
            continue;
        }
        let own = nodes.get(&ctx.node_name).and_then(pod_cidr::pod_cidr_of);
        runtimes.sync(own.as_deref(), &ctx.runtimes).await;
        if let Some(router) = &mut router {
            router.sync(nodes.values(), &ctx.node_name, forced).await;
        }
    }
}
