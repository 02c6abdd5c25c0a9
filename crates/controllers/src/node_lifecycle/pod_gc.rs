//! Pod garbage collection (upstream's PodGC controller, without its terminated-pods threshold):
//! pods bound to a node that has been missing for the quarantine time — and that a live GET
//! confirms missing — are marked Failed with `DisruptionTarget` (`DeletionByPodGC`) and deleted
//! at once; so are terminating pods on a not-ready node tainted `out-of-service`, and
//! terminating pods never bound to a node.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::Api;
use tokio::time::Instant;

use super::taints::{self, OUT_OF_SERVICE};
use super::{Stores, Tuning, health};
use crate::Context;

/// Nodes pods are bound to but the node store lacks, and since when.
#[derive(Debug, Default)]
pub struct Quarantine {
    missing_since: HashMap<String, Instant>,
}

impl Quarantine {
    /// Takes the nodes pods are bound to that are `missing` now; returns those missing for at
    /// least `quarantine`, to be confirmed by a live GET (each then starts over).
    pub fn due(&mut self, missing: &HashSet<&str>, now: Instant, quarantine: Duration) -> Vec<String> {
        self.missing_since.retain(|n, _| missing.contains(n.as_str()));
        let mut due = Vec::new();
        for n in missing {
            let since = *self.missing_since.entry(n.to_string()).or_insert(now);
            if now.duration_since(since) >= quarantine {
                due.push(n.to_string());
                self.missing_since.remove(*n);
            }
        }
        due.sort();
        due
    }
}

fn node_of(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.node_name.as_deref().filter(|n| !n.is_empty())
}

/// Bound nodes the store does not have.
pub fn missing_nodes<'a>(pods: &'a [Arc<Pod>], nodes: &[Arc<Node>]) -> HashSet<&'a str> {
    let known: HashSet<&str> = nodes.iter().filter_map(|n| n.metadata.name.as_deref()).collect();
    pods.iter().filter_map(|p| node_of(p)).filter(|n| !known.contains(n)).collect()
}

/// Terminating pods to force-delete: on a not-ready node tainted out-of-service, or never bound.
pub fn terminating_to_collect<'a>(pods: &'a [Arc<Pod>], nodes: &[Arc<Node>]) -> Vec<&'a Arc<Pod>> {
    let out_of_service: HashSet<&str> = nodes
        .iter()
        .filter(|n| {
            health::ready_status(n) != Some("True") && taints::taints(n).iter().any(|t| t.key == OUT_OF_SERVICE)
        })
        .filter_map(|n| n.metadata.name.as_deref())
        .collect();
    pods.iter()
        .filter(|p| p.metadata.deletion_timestamp.is_some())
        .filter(|p| node_of(p).is_none_or(|n| out_of_service.contains(n)))
        .collect()
}

pub async fn run(ctx: Arc<Context>, stores: Stores, tuning: &Tuning) {
    let mut quarantine = Quarantine::default();
    let mut tick = tokio::time::interval(tuning.pod_gc_period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let pods = stores.pods.state();
        let nodes = stores.nodes.state();
        for pod in terminating_to_collect(&pods, &nodes) {
            tracing::info!(pod = ?pod.metadata.name, namespace = ?pod.metadata.namespace, "pod gc: force-deleting a terminating pod no node will finish");
            if let Err(e) = super::mark_and_delete_pod(&ctx.client, pod, None, true, Some(0)).await {
                tracing::warn!(error = %e, "pod gc: cannot delete the pod");
            }
        }
        let missing = missing_nodes(&pods, &nodes);
        let api: Api<Node> = Api::all(ctx.client.clone());
        for node in quarantine.due(&missing, Instant::now(), tuning.pod_gc_quarantine) {
            match api.get_opt(&node).await {
                Ok(None) => {}
                Ok(Some(_)) => continue,
                Err(e) => {
                    tracing::warn!(node, error = %e, "pod gc: cannot check whether the node exists");
                    continue;
                }
            }
            for pod in pods.iter().filter(|p| node_of(p) == Some(node.as_str())) {
                tracing::info!(pod = ?pod.metadata.name, namespace = ?pod.metadata.namespace, node, "pod gc: deleting a pod whose node no longer exists");
                let condition = super::disruption_condition("DeletionByPodGC", "PodGC: node no longer exists");
                if let Err(e) = super::mark_and_delete_pod(&ctx.client, pod, Some(condition), true, Some(0)).await {
                    tracing::warn!(error = %e, "pod gc: cannot delete the pod");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, node: &str, deleting: bool) -> Arc<Pod> {
        let mut v = json!({"metadata": {"name": name}, "spec": {"containers": [], "nodeName": node}});
        if deleting {
            v["metadata"]["deletionTimestamp"] = json!("2025-01-01T00:00:00Z");
        }
        Arc::new(serde_json::from_value(v).unwrap())
    }

    fn node(name: &str, ready: &str, out_of_service: bool) -> Arc<Node> {
        let taints = if out_of_service { json!([{"key": OUT_OF_SERVICE, "effect": "NoExecute"}]) } else { json!([]) };
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name},
                "spec": {"taints": taints},
                "status": {"conditions": [{"type": "Ready", "status": ready}]},
            }))
            .unwrap(),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn a_missing_node_is_due_after_the_quarantine_and_forgotten_when_it_returns() {
        let q_time = Duration::from_secs(40);
        let mut q = Quarantine::default();
        let gone: HashSet<&str> = ["ghost"].into();
        assert!(q.due(&gone, Instant::now(), q_time).is_empty());
        tokio::time::advance(Duration::from_secs(39)).await;
        assert!(q.due(&gone, Instant::now(), q_time).is_empty());
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(q.due(&gone, Instant::now(), q_time), vec!["ghost".to_string()]);
        // Checked: the quarantine starts over.
        assert!(q.due(&gone, Instant::now(), q_time).is_empty());
        // Back in the store: forgotten.
        assert!(q.due(&HashSet::new(), Instant::now(), q_time).is_empty());
        tokio::time::advance(Duration::from_secs(40)).await;
        assert!(q.due(&gone, Instant::now(), q_time).is_empty());
    }

    #[test]
    fn pods_on_nodes_not_in_the_store_are_noticed() {
        let pods = vec![pod("a", "n1", false), pod("b", "ghost", false), pod("c", "", false)];
        let nodes = vec![node("n1", "True", false)];
        assert_eq!(missing_nodes(&pods, &nodes), ["ghost"].into());
    }

    #[test]
    fn terminating_pods_never_bound_or_on_out_of_service_nodes_are_collected() {
        let pods = vec![
            pod("unbound", "", true),
            pod("oos", "down", true),
            pod("oos-running", "down", false),
            pod("ready-node", "up", true),
            pod("down-no-taint", "down2", true),
        ];
        let nodes = vec![node("down", "Unknown", true), node("up", "True", true), node("down2", "False", false)];
        let names: Vec<_> =
            terminating_to_collect(&pods, &nodes).iter().map(|p| p.metadata.name.clone().unwrap()).collect();
        assert_eq!(names, vec!["unbound", "oos"]);
    }
}
