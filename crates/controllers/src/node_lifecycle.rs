//! Node lifecycle: marks nodes that stopped reporting as Unknown, taints not-ready and
//! unreachable nodes, evicts the pods that do not tolerate those taints, and deletes pods bound
//! to nodes that no longer exist — kube-controller-manager's node lifecycle, taint-eviction and
//! pod GC (orphaned pods) controllers, through the API only.
//!
//! One watch per kind (nodes, Leases in `kube-node-lease`) and the controllers' shared pod
//! cache fill the stores all parts read; three tasks act:
//!
//! - [`monitor`] every `node_monitor_period`: a node whose Ready heartbeat and Lease have not
//!   moved for `node_monitor_grace_period` (timed on this controller's clock from when it last
//!   saw them change, or first saw the node) gets its conditions Unknown; not-ready and
//!   unreachable nodes are queued per zone for their NoExecute taint, handed out at
//!   `node_eviction_rate` nodes per second (and slower or not at all when a zone is largely or
//!   wholly down, see [`disruption`]); ready nodes lose it.
//! - [`eviction`] reconciles each node (kube's applier, on node and pod changes): its NoSchedule
//!   taints follow its conditions, and each pod on it that does not tolerate its NoExecute
//!   taints is deleted — at once, or when its `tolerationSeconds` counted from the taint's
//!   `timeAdded` run out.
//! - [`pod_gc`] every `pod_gc_period`: pods bound to a node missing for `pod_gc_quarantine`
//!   (and confirmed missing by a live GET) are marked Failed and deleted at once, as are
//!   terminating pods on out-of-service nodes and terminating pods never bound.

pub mod disruption;
pub mod eviction;
pub mod health;
pub mod monitor;
pub mod pod_gc;
pub mod taints;

use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod, PodCondition, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;

use crate::Context;
use crate::pod_cache::PodEvent;

/// The namespace of node Leases.
pub const LEASE_NAMESPACE: &str = "kube-node-lease";
/// Attempts of a read-modify-write of a node's taints that keeps meeting conflicts.
const CONFLICT_RETRIES: usize = 5;

/// Settings kube-controller-manager has beyond [`crate::Config`], with its defaults.
#[derive(Clone, Debug)]
pub struct Tuning {
    /// The grace period of a node that never posted a Ready condition
    /// (`--node-startup-grace-period`).
    pub node_startup_grace_period: Duration,
    /// Nodes tainted per second in a large, partially disrupted zone
    /// (`--secondary-node-eviction-rate`).
    pub secondary_node_eviction_rate: f64,
    /// A zone with more nodes than this is large (`--large-cluster-size-threshold`).
    pub large_cluster_size_threshold: usize,
    /// The share of not-ready nodes (more than two) that makes a zone partially disrupted
    /// (`--unhealthy-zone-threshold`).
    pub unhealthy_zone_threshold: f64,
    /// How often pods are checked for missing nodes (PodGC's `gcCheckPeriod`).
    pub pod_gc_period: Duration,
    /// How long a pod's node must be missing before the pod is deleted (PodGC's
    /// `quarantineTime`).
    pub pod_gc_quarantine: Duration,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            node_startup_grace_period: Duration::from_secs(60),
            secondary_node_eviction_rate: 0.01,
            large_cluster_size_threshold: 50,
            unhealthy_zone_threshold: 0.55,
            pod_gc_period: Duration::from_secs(20),
            pod_gc_quarantine: Duration::from_secs(40),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot {step} {object}")]
    Api {
        step: &'static str,
        object: String,
        #[source]
        source: kube::Error,
    },
    #[error("{object} kept changing while its taints were updated")]
    Conflict { object: String },
}

fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

/// The stores the parts read, each filled by one watch.
#[derive(Clone)]
pub struct Stores {
    pub nodes: Store<Node>,
    pub pods: Store<Pod>,
    pub leases: Store<Lease>,
}

impl Stores {
    pub fn lease(&self, node: &str) -> Option<Arc<Lease>> {
        self.leases.get(&ObjectRef::new(node).within(LEASE_NAMESPACE))
    }

    pub fn pods_on(&self, node: &str) -> Vec<Arc<Pod>> {
        self.pods.state_filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
    }

    async fn ready(&self) {
        let _ = self.nodes.wait_until_ready().await;
        let _ = self.pods.wait_until_ready().await;
        let _ = self.leases.wait_until_ready().await;
    }
}

/// The node the pod is bound to.
fn node_of(pod: &Pod) -> Option<String> {
    pod.spec.as_ref().and_then(|s| s.node_name.clone()).filter(|n| !n.is_empty())
}

/// Runs the node lifecycle controllers until the future is dropped.
pub async fn run(ctx: Arc<Context>) {
    run_with(ctx, Tuning::default()).await
}

/// [`run`] with settings other than kube-controller-manager's defaults.
pub async fn run_with(ctx: Arc<Context>, tuning: Tuning) {
    let client = ctx.client.clone();
    let (nodes, node_writer) = reflector::store::<Node>();
    let (leases, lease_writer) = reflector::store::<Lease>();
    let pod_cache = ctx.pods();
    let stores = Stores { nodes, pods: pod_cache.store(), leases };

    let node_events = watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .reflect(node_writer)
        .touched_objects()
        .map_ok(|n| ObjectRef::from_obj(&n));
    let pod_events = pod_cache.subscribe().filter_map(|ev| {
        let node = match ev {
            PodEvent::Applied { new: pod, .. } | PodEvent::Deleted(pod) => node_of(&pod),
            PodEvent::Synced => None,
        };
        std::future::ready(node.map(|n| Ok::<_, watcher::Error>(ObjectRef::new(&n))))
    });
    let lease_events = watcher(Api::<Lease>::namespaced(client.clone(), LEASE_NAMESPACE), watcher::Config::default())
        .default_backoff()
        .reflect(lease_writer)
        .for_each(|_| futures::future::ready(()));
    let triggers = futures::stream::select(node_events, pod_events);

    tokio::join!(lease_events, eviction::run(ctx.clone(), stores.clone(), triggers), async {
        stores.ready().await;
        tokio::join!(
            monitor::run(ctx.clone(), stores.clone(), &tuning),
            pod_gc::run(ctx.clone(), stores.clone(), &tuning),
        )
    },);
}

/// Rewrites the live node's taints with `change` (given its current taints; `None` for no
/// change), re-reading it on conflicts. True if the taints were changed.
pub async fn update_taints(
    client: &kube::Client,
    node: &str,
    change: impl Fn(&Node) -> Option<Vec<Taint>>,
) -> Result<bool, Error> {
    let api: Api<Node> = Api::all(client.clone());
    let err = |step| move |source| Error::Api { step, object: format!("node {node}"), source };
    for _ in 0..CONFLICT_RETRIES {
        let Some(live) = api.get_opt(node).await.map_err(err("read"))? else { return Ok(false) };
        let Some(taints) = change(&live) else { return Ok(false) };
        let patch = json!({
            "metadata": {"resourceVersion": live.metadata.resource_version},
            "spec": {"taints": taints},
        });
        match api.patch(node, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => return Ok(true),
            Err(e) if is_status(&e, 409) => continue,
            Err(e) if is_status(&e, 404) => return Ok(false),
            Err(e) => return Err(err("update the taints of")(e)),
        }
    }
    Err(Error::Conflict { object: format!("node {node}") })
}

/// `conditions` with `new` in place of the condition of its type; its `lastTransitionTime`
/// moves only when its status changes (upstream's `UpdatePodCondition`). `None` if unchanged.
pub fn with_pod_condition(conditions: &[PodCondition], mut new: PodCondition, now: Time) -> Option<Vec<PodCondition>> {
    let mut out = conditions.to_vec();
    match out.iter_mut().find(|c| c.type_ == new.type_) {
        Some(old) => {
            new.last_transition_time =
                if old.status == new.status { old.last_transition_time.clone() } else { Some(now) };
            new.last_probe_time = old.last_probe_time.clone();
            if *old == new {
                return None;
            }
            *old = new;
        }
        None => {
            new.last_transition_time = Some(now);
            out.push(new);
        }
    }
    Some(out)
}

/// Writes the pod's status conditions (and phase, if given) at its resourceVersion.
async fn patch_pod_status(
    api: &Api<Pod>,
    pod: &Pod,
    conditions: Vec<PodCondition>,
    phase: Option<&str>,
) -> Result<(), kube::Error> {
    let mut status = json!({"conditions": conditions});
    if let Some(phase) = phase {
        status["phase"] = json!(phase);
    }
    let patch = json!({"metadata": {"resourceVersion": pod.metadata.resource_version}, "status": status});
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch)).await.map(|_| ())
}

/// The `DisruptionTarget` pod condition (True) with its reason and message.
pub fn disruption_condition(reason: &str, message: &str) -> PodCondition {
    PodCondition {
        type_: "DisruptionTarget".into(),
        status: "True".into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        ..PodCondition::default()
    }
}

/// Marks the pod with `condition` (and Failed, when `fail`), then deletes it — with `grace`
/// seconds, or the pod's own grace period when `None` — unless it was replaced meanwhile.
pub async fn mark_and_delete_pod(
    client: &kube::Client,
    pod: &Pod,
    condition: Option<PodCondition>,
    fail: bool,
    grace: Option<u32>,
) -> Result<(), Error> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let object = format!("pod {ns}/{name}");
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let status = pod.status.clone().unwrap_or_default();
    let finished = matches!(status.phase.as_deref(), Some("Succeeded" | "Failed"));
    let now = Time(jiff::Timestamp::now());
    let conditions = condition.and_then(|c| with_pod_condition(status.conditions.as_deref().unwrap_or(&[]), c, now));
    let phase = (fail && !finished).then_some("Failed");
    if conditions.is_some() || phase.is_some() {
        let conditions = conditions.unwrap_or_else(|| status.conditions.clone().unwrap_or_default());
        match patch_pod_status(&api, pod, conditions, phase).await {
            Ok(()) => {}
            Err(e) if is_status(&e, 404) => return Ok(()),
            Err(source) => return Err(Error::Api { step: "update the status of", object, source }),
        }
    }
    let params = DeleteParams {
        grace_period_seconds: grace,
        preconditions: Some(Preconditions { uid: pod.metadata.uid.clone(), resource_version: None }),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(()),
        Err(e) if is_status(&e, 404) || is_status(&e, 409) => Ok(()),
        Err(source) => Err(Error::Api { step: "delete", object, source }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cond(type_: &str, status: &str, at: &str) -> PodCondition {
        PodCondition {
            type_: type_.into(),
            status: status.into(),
            last_transition_time: Some(Time(at.parse().unwrap())),
            ..PodCondition::default()
        }
    }

    #[test]
    fn a_pod_condition_moves_its_transition_time_only_when_its_status_flips() {
        let now = Time("2025-01-01T00:01:00Z".parse().unwrap());
        let old = vec![cond("Ready", "True", "2025-01-01T00:00:00Z")];
        let ready_false = PodCondition { type_: "Ready".into(), status: "False".into(), ..PodCondition::default() };
        let out = with_pod_condition(&old, ready_false.clone(), now.clone()).unwrap();
        assert_eq!(out, vec![cond("Ready", "False", "2025-01-01T00:01:00Z")]);
        assert_eq!(with_pod_condition(&out, ready_false, now.clone()), None);
        let added = with_pod_condition(&old, disruption_condition("R", "m"), now).unwrap();
        assert_eq!(added.len(), 2);
        assert_eq!(added[1].reason.as_deref(), Some("R"));
    }
}
