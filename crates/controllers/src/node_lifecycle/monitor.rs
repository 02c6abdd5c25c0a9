//! The node health monitor (upstream's `monitorNodeHealth` and `doNoExecuteTaintingPass`):
//! every `node_monitor_period` it sees each node and its Lease, posts Unknown conditions for
//! nodes silent past their grace period, queues not-ready and unreachable nodes for their
//! NoExecute taint and lifts it from ready ones; the queues hand nodes out at their zone's rate.
//!
//! Taint decisions use the Ready condition as the node store held it at the start of the pass,
//! as upstream does: a node marked Unknown in one pass is queued for its taint in the next.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use berth_events::{Event, Type};
use k8s_openapi::api::core::v1::{Node, NodeCondition, PodCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tokio::time::Instant;

use super::disruption::{self, Rates, Transition, Zones};
use super::health::{self, Health};
use super::taints::{self, NO_EXECUTE, NOT_READY, UNREACHABLE};
use super::{Error, Stores, Tuning};
use crate::Context;

/// How soon a node without a Ready condition is tried again for its taint.
const NO_CONDITION_RETRY: Duration = Duration::from_millis(50);

pub async fn run(ctx: Arc<Context>, stores: Stores, tuning: &Tuning) {
    let rates = Rates {
        primary: ctx.config.node_eviction_rate,
        secondary: tuning.secondary_node_eviction_rate,
        large_cluster_threshold: tuning.large_cluster_size_threshold,
        unhealthy_zone_threshold: tuning.unhealthy_zone_threshold,
    };
    let mut monitor = Monitor {
        ctx: ctx.clone(),
        stores,
        startup_grace: tuning.node_startup_grace_period,
        health: HashMap::new(),
        known: HashMap::new(),
        zones: Zones::new(rates),
    };
    let mut tick = tokio::time::interval(ctx.config.node_monitor_period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let next_taint = monitor.next_taint_due();
        tokio::select! {
            _ = tick.tick() => monitor.pass().await,
            _ = tokio::time::sleep_until(next_taint.unwrap_or_else(Instant::now)), if next_taint.is_some() => {
                monitor.taint_pass().await
            }
        }
    }
}

struct Monitor {
    ctx: Arc<Context>,
    stores: Stores,
    startup_grace: Duration,
    health: HashMap<String, Health>,
    /// Nodes seen so far, by name, with their UID.
    known: HashMap<String, String>,
    zones: Zones,
}

fn name(node: &Node) -> &str {
    node.metadata.name.as_deref().unwrap_or_default()
}

impl Monitor {
    fn node_event(&self, node: &Node, type_: Type, reason: &str, message: String) {
        self.ctx.recorder.emit(Event::about(node, type_, reason, message));
    }

    /// One pass over every node.
    async fn pass(&mut self) {
        let nodes = self.stores.nodes.state();
        let now = Instant::now();
        let wall = jiff::Timestamp::now();
        for node in &nodes {
            let n = name(node);
            if !self.known.contains_key(n) {
                tracing::info!(node = n, "node lifecycle: new node");
                let message = format!("Node {n} event: Registered Node {n} in Controller");
                self.node_event(node, Type::Normal, "RegisteredNode", message);
                self.known.insert(n.to_string(), node.metadata.uid.clone().unwrap_or_default());
                self.zones.ensure(&disruption::zone_key(node), now);
                self.mark_reachable(node).await;
            }
        }
        let present: HashSet<&str> = nodes.iter().map(|n| name(n)).collect();
        let gone: Vec<String> = self.known.keys().filter(|k| !present.contains(k.as_str())).cloned().collect();
        for n in gone {
            tracing::info!(node = n, "node lifecycle: node deleted");
            let uid = self.known.remove(&n).unwrap_or_default();
            self.health.remove(&n);
            let mut node = Node::default();
            node.metadata.name = Some(n.clone());
            node.metadata.uid = Some(uid);
            self.node_event(
                &node,
                Type::Normal,
                "RemovingNode",
                format!("Node {n} event: Removing Node {n} from Controller"),
            );
        }

        let mut ready_by_zone: HashMap<String, Vec<bool>> = HashMap::new();
        for node in &nodes {
            let n = name(node).to_string();
            let lease = self.stores.lease(&n);
            let h = health::observe(self.health.get(&n), node, lease.as_deref(), now, wall);
            let grace = health::grace_period(node, self.ctx.config.node_monitor_grace_period, self.startup_grace);
            // Without a Ready condition the node counts as Unknown, as upstream fakes one.
            let observed = health::ready_status(node).unwrap_or("Unknown").to_string();
            let mut current = health::ready_status(node).map(str::to_string);
            if health::is_silent(&h, now, grace)
                && let Some(conditions) = health::silent_conditions(node, wall)
            {
                tracing::info!(node = n, silent_for = ?now.duration_since(h.probe), "node lifecycle: node stopped reporting; marking it Unknown");
                if let Err(e) = self.write_conditions(node, conditions).await {
                    tracing::warn!(node = n, error = %e, error_source = ?std::error::Error::source(&e), "node lifecycle: cannot mark the node Unknown; no pods are evicted from it this pass");
                    self.health.insert(n, h);
                    continue;
                }
                current = Some("Unknown".into());
            }
            self.health.insert(n.clone(), h);
            if !disruption::excluded(node) {
                ready_by_zone.entry(disruption::zone_key(node)).or_default().push(current.as_deref() == Some("True"));
            }
            let Some(current) = current else { continue };
            self.taint_based_eviction(node, &observed, now).await;
            if current != "True" && observed == "True" {
                let message = format!("Node {n} status is now: NodeNotReady");
                self.node_event(node, Type::Normal, "NodeNotReady", message);
                self.mark_pods_not_ready(&n).await;
            }
        }

        match self.zones.update(&ready_by_zone, now) {
            Transition::None => {}
            Transition::EnterFullDisruption => {
                tracing::warn!("node lifecycle: no node is ready; stopping evictions until one is");
                for node in &nodes {
                    self.mark_reachable(node).await;
                }
            }
            Transition::LeaveFullDisruption => {
                tracing::info!("node lifecycle: a node is ready again; every node's grace period starts anew");
                for h in self.health.values_mut() {
                    h.reset(now);
                }
            }
        }
    }

    /// Posts the conditions of a node that stopped reporting, at the resourceVersion seen.
    async fn write_conditions(&self, node: &Node, conditions: Vec<NodeCondition>) -> Result<(), Error> {
        let n = name(node);
        let api: Api<Node> = Api::all(self.ctx.client.clone());
        let patch = json!({
            "metadata": {"resourceVersion": node.metadata.resource_version},
            "status": {"conditions": conditions},
        });
        api.patch_status(n, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|_| ())
            .map_err(|source| Error::Api { step: "update the status of", object: format!("node {n}"), source })
    }

    /// Upstream's `processTaintBaseEviction`, on the Ready status seen at the pass's start.
    async fn taint_based_eviction(&mut self, node: &Node, observed: &str, now: Instant) {
        let current = taints::taints(node);
        let (key, opposite) = match observed {
            "False" => (NOT_READY, UNREACHABLE),
            "Unknown" => (UNREACHABLE, NOT_READY),
            "True" => {
                self.mark_reachable(node).await;
                return;
            }
            _ => return,
        };
        if taints::has(current, opposite, NO_EXECUTE) {
            // The other NoExecute taint is there: swap it at once, no need to wait for the rate.
            self.swap(name(node), key, opposite).await;
            return;
        }
        let q = self.zones.queue(&disruption::zone_key(node), now);
        if !taints::has(current, key, NO_EXECUTE) {
            q.remove(name(node));
        }
        if q.add(name(node), now) {
            tracing::debug!(node = name(node), taint = key, "node lifecycle: node queued for its NoExecute taint");
        }
    }

    /// Lifts both NoExecute taints (when there) and takes the node off its taint queue.
    async fn mark_reachable(&mut self, node: &Node) {
        let n = name(node);
        self.zones.queue(&disruption::zone_key(node), Instant::now()).remove(n);
        let current = taints::taints(node);
        if !taints::has(current, UNREACHABLE, NO_EXECUTE) && !taints::has(current, NOT_READY, NO_EXECUTE) {
            return;
        }
        let remove = [(UNREACHABLE, NO_EXECUTE), (NOT_READY, NO_EXECUTE)];
        match super::update_taints(&self.ctx.client, n, |live| taints::swapped(taints::taints(live), &[], &remove))
            .await
        {
            Ok(true) => tracing::info!(node = n, "node lifecycle: node is reachable; NoExecute taints removed"),
            Ok(false) => {}
            Err(e) => tracing::warn!(node = n, error = %e, "node lifecycle: cannot remove the NoExecute taints"),
        }
    }

    /// Adds the NoExecute taint `key` (added now) and removes `opposite`.
    async fn swap(&self, node: &str, key: &str, opposite: &str) -> bool {
        let add = [taints::taint(key, NO_EXECUTE, Some(jiff::Timestamp::now()))];
        let remove = [(opposite, NO_EXECUTE)];
        match super::update_taints(&self.ctx.client, node, |live| taints::swapped(taints::taints(live), &add, &remove))
            .await
        {
            Ok(changed) => {
                if changed {
                    tracing::info!(node, taint = key, "node lifecycle: NoExecute taint added");
                }
                true
            }
            Err(e) => {
                tracing::warn!(node, taint = key, error = %e, "node lifecycle: cannot taint the node");
                false
            }
        }
    }

    fn next_taint_due(&self) -> Option<Instant> {
        let now = Instant::now();
        self.zones.queues.values().filter_map(|q| q.next_due(now)).min()
    }

    /// Taints the queued nodes whose turn has come (upstream's `doNoExecuteTaintingPass`).
    async fn taint_pass(&mut self) {
        let zones: Vec<String> = self.zones.queues.keys().cloned().collect();
        for zone in zones {
            loop {
                let now = Instant::now();
                let Some(n) = self.zones.queue(&zone, now).pop(now) else { break };
                let Some(node) = self.stores.nodes.get(&kube::runtime::reflector::ObjectRef::new(&n)) else {
                    continue;
                };
                let (key, opposite) = match health::ready_status(&node) {
                    None => {
                        self.zones.queue(&zone, now).retry(n, now + NO_CONDITION_RETRY);
                        continue;
                    }
                    Some("False") => (NOT_READY, UNREACHABLE),
                    Some("Unknown") => (UNREACHABLE, NOT_READY),
                    // Ready again meanwhile.
                    Some(_) => continue,
                };
                if !self.swap(&n, key, opposite).await {
                    self.zones.queue(&zone, now).retry(n, Instant::now());
                }
            }
        }
    }

    /// Upstream's `MarkPodsNotReady`: the pods on a node that just stopped being ready are not
    /// ready either.
    async fn mark_pods_not_ready(&self, node: &str) {
        let now = Time(jiff::Timestamp::now());
        for pod in self.stores.pods_on(node) {
            let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_deref()).unwrap_or(&[]);
            if !conditions.iter().any(|c| c.type_ == "Ready") {
                continue;
            }
            let not_ready = PodCondition { type_: "Ready".into(), status: "False".into(), ..PodCondition::default() };
            let Some(conditions) = super::with_pod_condition(conditions, not_ready, now.clone()) else { continue };
            let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
            let api: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(self.ctx.client.clone(), ns);
            match super::patch_pod_status(&api, &pod, conditions, None).await {
                Ok(()) => self.ctx.recorder.emit(Event::about(
                    &*pod,
                    Type::Warning,
                    "NodeNotReady",
                    "Node is not ready".into(),
                )),
                Err(e) => {
                    tracing::warn!(pod = ?pod.metadata.name, namespace = ns, error = %e, "node lifecycle: cannot mark the pod not ready")
                }
            }
        }
    }
}
