//! Hollow nodes: many simulated agents in this process, each registering its Node, renewing its
//! Lease, watching its own pods and reporting each bound pod Running without running anything.
//!
//! A hollow node does what `berth agent` does towards the API and nothing else:
//!
//! - registers its Node (allocatable, labels, `status.runtimeHandlers`, Ready — the scheduler
//!   bench's [`objects::node`]) and creates its Lease `kube-node-lease/<node>`;
//! - renews that Lease every [`LEASE_RENEW_INTERVAL`] with a PUT of the Lease it holds, as the
//!   agent does, and every [`STATUS_REPORT_INTERVAL`] patches its Ready condition's heartbeat on
//!   `nodes/<node>/status`; the nodes' phases are spread evenly over the period, so the renewals
//!   of 5,000 nodes come as a steady 500 per second rather than in bursts;
//! - watches the pods with `fieldSelector=spec.nodeName=<node>` — one watch per node, as many as
//!   real agents would hold open, their timeouts spread as client-go spreads them — and
//!   merge-patches `pods/<pod>/status` of each newly bound pod to Running (conditions, `podIP`,
//!   `startTime`, a running status per container), as the agent's status writer does. The
//!   patches of all nodes share a pool of `status_workers` permits, as the agent's writers
//!   share theirs.
//!
//! All nodes share one `kube::Client` (one connection pool; kube speaks HTTP/1.1, so each open
//! watch holds a connection of its own). Every call is timed into [`ApiCalls`].

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use tokio::sync::Semaphore;

use super::calls::{ApiCalls, Call};
use crate::scheduler::objects;

/// The agent's Lease renew interval, and the Lease's duration.
pub const LEASE_RENEW_INTERVAL: Duration = Duration::from_secs(10);
const LEASE_DURATION_SECONDS: i32 = 40;
const LEASE_NAMESPACE: &str = "kube-node-lease";
/// How often an unchanged node status is still reported: the agent's interval, and kubelet's
/// default `nodeStatusReportFrequency`.
pub const STATUS_REPORT_INTERVAL: Duration = Duration::from_secs(300);
/// Tries of one pod status patch before the pod is given up (and counted).
const PATCH_TRIES: u32 = 5;

/// What all hollow nodes share.
pub struct Fleet {
    pub client: kube::Client,
    pub calls: Arc<ApiCalls>,
    /// Permits of the pod status patches in flight.
    pub patch_slots: Arc<Semaphore>,
    /// Permits of the Lease renewals and node status reports in flight: they bound the
    /// connections the bench opens besides the watches when the server slows down.
    pub heartbeat_slots: Semaphore,
    /// Nodes whose watch has delivered its initial list.
    pub watching: AtomicUsize,
    /// Errors the per-node watches returned (each followed by a retry after back-off).
    pub watch_errors: AtomicU64,
    /// Pods given up after [`PATCH_TRIES`] failed status patches.
    pub patches_given_up: AtomicU64,
    /// Pods reported Running.
    pub reported: AtomicU64,
    pub nodes: usize,
}

impl Fleet {
    pub fn new(client: kube::Client, calls: Arc<ApiCalls>, nodes: usize, workers: Workers) -> Arc<Self> {
        Arc::new(Self {
            client,
            calls,
            patch_slots: Arc::new(Semaphore::new(workers.status)),
            heartbeat_slots: Semaphore::new(workers.heartbeat),
            watching: AtomicUsize::new(0),
            watch_errors: AtomicU64::new(0),
            patches_given_up: AtomicU64::new(0),
            reported: AtomicU64::new(0),
            nodes,
        })
    }
}

/// How many calls of each kind the hollow nodes have in flight at most.
#[derive(Clone, Copy, Debug)]
pub struct Workers {
    pub status: usize,
    pub heartbeat: usize,
}

/// Where node `i` of `nodes` renews within each period: evenly spread.
pub fn phase(i: usize, nodes: usize, period: Duration) -> Duration {
    period.mul_f64(i as f64 / nodes.max(1) as f64)
}

/// The server-side timeout of node `i`'s watch requests, in seconds: spread over 150–290 s, as
/// client-go randomises its watches' timeouts, so that the nodes' watches do not all end and
/// start again at the same moment (kube's watcher would give every one 290 s).
pub fn watch_timeout(i: usize, nodes: usize) -> u32 {
    150 + u32::try_from(i * 140 / nodes.max(1)).unwrap_or(140)
}

/// The address of pod number `k` on node `i`: a /24 per node under 10.128.0.0/9.
pub fn pod_ip(i: usize, k: usize) -> String {
    format!("10.{}.{}.{}", 128 + (i / 256) % 128, i % 256, 2 + k % 250)
}

fn node_ip(i: usize) -> String {
    format!("172.{}.{}.{}", 16 + (i / 65536) % 16, (i / 256) % 256, i % 256)
}

/// Registers node `i`: its Node (with status, as the agent's create carries it) and its Lease.
pub async fn register(fleet: &Fleet, i: usize) -> anyhow::Result<Lease> {
    let nodes: Api<Node> = Api::all(fleet.client.clone());
    let mut node = objects::node(i);
    if let Some(status) = node.status.as_mut() {
        status.addresses = Some(vec![
            serde_json::from_value(json!({"type": "InternalIP", "address": node_ip(i)}))?,
            serde_json::from_value(json!({"type": "Hostname", "address": objects::node_name(i)}))?,
        ]);
    }
    let t0 = Instant::now();
    let created = nodes.create(&PostParams::default(), &node).await;
    fleet.calls.record(Call::CreateNode, t0.elapsed(), created.as_ref().err());
    let created = created?;
    let name = objects::node_name(i);
    let now = MicroTime(jiff::Timestamp::now());
    let lease: Lease = serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "namespace": LEASE_NAMESPACE,
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": name, "uid": created.metadata.uid}],
        },
        "spec": {
            "holderIdentity": name,
            "leaseDurationSeconds": LEASE_DURATION_SECONDS,
            "acquireTime": now,
            "renewTime": now,
        },
    }))?;
    let leases: Api<Lease> = Api::namespaced(fleet.client.clone(), LEASE_NAMESPACE);
    let t0 = Instant::now();
    let created = leases.create(&PostParams::default(), &lease).await;
    fleet.calls.record(Call::CreateLease, t0.elapsed(), created.as_ref().err());
    Ok(created?)
}

/// Node `i` from its registration on: Lease and status heartbeats, and its pods' watch. Runs
/// until aborted.
pub async fn live(fleet: Arc<Fleet>, i: usize, lease: Lease) {
    let heartbeats = heartbeats(&fleet, i, lease);
    let pods = watch_pods(fleet.clone(), i);
    futures::future::join(Box::pin(heartbeats), Box::pin(pods)).await;
}

async fn heartbeats(fleet: &Fleet, i: usize, mut lease: Lease) {
    let name = objects::node_name(i);
    let leases: Api<Lease> = Api::namespaced(fleet.client.clone(), LEASE_NAMESPACE);
    let nodes: Api<Node> = Api::all(fleet.client.clone());
    let first = tokio::time::Instant::now() + phase(i, fleet.nodes, LEASE_RENEW_INTERVAL);
    let mut tick = tokio::time::interval_at(first, LEASE_RENEW_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let status_every = (STATUS_REPORT_INTERVAL.as_secs() / LEASE_RENEW_INTERVAL.as_secs()).max(1);
    // The status reports are spread over their own (longer) period too.
    let mut ticks = (i as u64 * status_every) / fleet.nodes.max(1) as u64;
    let mut stale = false;
    loop {
        tick.tick().await;
        ticks += 1;
        let Ok(_permit) = fleet.heartbeat_slots.acquire().await else { return };
        if stale {
            let t0 = Instant::now();
            let got = leases.get(&name).await;
            fleet.calls.record(Call::GetLease, t0.elapsed(), got.as_ref().err());
            match got {
                Ok(l) => (lease, stale) = (l, false),
                Err(_) => continue,
            }
        }
        if let Some(spec) = lease.spec.as_mut() {
            spec.renew_time = Some(MicroTime(jiff::Timestamp::now()));
        }
        let t0 = Instant::now();
        let renewed = leases.replace(&name, &PostParams::default(), &lease).await;
        fleet.calls.record(Call::RenewLease, t0.elapsed(), renewed.as_ref().err());
        match renewed {
            Ok(l) => lease = l,
            // Read afresh next time (a conflict means it changed).
            Err(_) => stale = true,
        }
        if ticks.is_multiple_of(status_every) {
            let now = jiff::Timestamp::now();
            let patch = json!({"status": {"conditions": [{
                "type": "Ready", "status": "True", "reason": "KubeletReady", "message": "berth-bench hollow node",
                "lastHeartbeatTime": now,
            }]}});
            let t0 = Instant::now();
            let patched = nodes.patch_status(&name, &PatchParams::default(), &Patch::Strategic(&patch)).await;
            fleet.calls.record(Call::PatchNodeStatus, t0.elapsed(), patched.as_ref().err());
        }
    }
}

/// Watches the pods bound to node `i` and reports each new one Running.
async fn watch_pods(fleet: Arc<Fleet>, i: usize) {
    let name = objects::node_name(i);
    let api: Api<Pod> = Api::all(fleet.client.clone());
    let config =
        watcher::Config::default().fields(&format!("spec.nodeName={name}")).timeout(watch_timeout(i, fleet.nodes));
    let events = watcher(api, config).default_backoff();
    futures::pin_mut!(events);
    let mut reported: HashSet<String> = HashSet::new();
    let mut initialised = false;
    while let Some(event) = events.next().await {
        let pod = match event {
            Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => pod,
            Ok(watcher::Event::InitDone) => {
                if !initialised {
                    initialised = true;
                    fleet.watching.fetch_add(1, Ordering::SeqCst);
                }
                continue;
            }
            Ok(watcher::Event::Init | watcher::Event::Delete(_)) => continue,
            Err(_) => {
                fleet.watch_errors.fetch_add(1, Ordering::Relaxed);
                continue;
            }
        };
        let Some(uid) = pod.metadata.uid.clone() else { continue };
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        if pod.metadata.deletion_timestamp.is_some() || matches!(phase, Some("Running" | "Succeeded" | "Failed")) {
            continue;
        }
        if !reported.insert(uid) {
            continue;
        }
        let (fleet, ip) = (fleet.clone(), pod_ip(i, reported.len()));
        tokio::spawn(async move {
            if report_running(&fleet, &pod, &ip, &node_ip(i)).await {
                fleet.reported.fetch_add(1, Ordering::Relaxed);
            } else {
                fleet.patches_given_up.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
}

/// Merge-patches the pod's status to Running, as the agent reports a started pod; retried a few
/// times. Returns whether it was written.
async fn report_running(fleet: &Fleet, pod: &Pod, ip: &str, host_ip: &str) -> bool {
    let (Some(ns), Some(name)) = (pod.metadata.namespace.as_deref(), pod.metadata.name.as_deref()) else {
        return false;
    };
    let api: Api<Pod> = Api::namespaced(fleet.client.clone(), ns);
    let patch = running_status(pod, ip, host_ip);
    let mut retry = Duration::from_millis(200);
    for _ in 0..PATCH_TRIES {
        let Ok(permit) = fleet.patch_slots.acquire().await else { return false };
        let t0 = Instant::now();
        let patched = api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch)).await;
        fleet.calls.record(Call::PatchPodStatus, t0.elapsed(), patched.as_ref().err());
        drop(permit);
        match patched {
            Ok(_) => return true,
            Err(kube::Error::Api(s)) if s.code == 404 => return false,
            Err(_) => {}
        }
        tokio::time::sleep(retry).await;
        retry *= 2;
    }
    false
}

/// The status of a pod whose containers all run: what the agent writes once they started.
pub fn running_status(pod: &Pod, ip: &str, host_ip: &str) -> serde_json::Value {
    let now = jiff::Timestamp::now();
    let containers = pod.spec.as_ref().map(|s| s.containers.as_slice()).unwrap_or_default();
    let statuses: Vec<_> = containers
        .iter()
        .enumerate()
        .map(|(n, c)| {
            json!({
                "name": c.name,
                "image": c.image.clone().unwrap_or_default(),
                "imageID": "",
                "containerID": format!("berth://hollow-{}-{n}", pod.metadata.uid.as_deref().unwrap_or_default()),
                "ready": true,
                "started": true,
                "restartCount": 0,
                "state": {"running": {"startedAt": now}},
            })
        })
        .collect();
    let conditions = ["PodScheduled", "PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready"]
        .map(|t| json!({"type": t, "status": "True", "lastTransitionTime": now}));
    json!({"status": {
        "phase": "Running",
        "conditions": conditions,
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "startTime": now,
        "containerStatuses": statuses,
    }})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewals_are_spread_evenly_over_the_period() {
        let p = Duration::from_secs(10);
        assert_eq!(phase(0, 5000, p), Duration::ZERO);
        assert_eq!(phase(2500, 5000, p), Duration::from_secs(5));
        assert!(phase(4999, 5000, p) < p);
    }

    #[test]
    fn watch_timeouts_are_spread_and_within_the_watchers_default() {
        assert_eq!(watch_timeout(0, 5000), 150);
        assert_eq!(watch_timeout(2500, 5000), 220);
        assert!(watch_timeout(4999, 5000) < 290);
    }

    #[test]
    fn pod_addresses_of_different_nodes_differ() {
        assert_ne!(pod_ip(0, 1), pod_ip(256, 1));
        assert_ne!(pod_ip(4999, 1), pod_ip(4998, 1));
        assert_eq!(pod_ip(257, 0), "10.129.1.2");
    }

    #[test]
    fn the_running_status_has_one_running_container_per_container_and_ready() {
        let pod = objects::basic_pod(0, None);
        let s = running_status(&pod, "10.128.0.2", "172.16.0.0");
        let status: k8s_openapi::api::core::v1::PodStatus = serde_json::from_value(s["status"].clone()).unwrap();
        assert_eq!(status.phase.as_deref(), Some("Running"));
        let cs = status.container_statuses.unwrap();
        assert_eq!(cs.len(), 1);
        assert!(cs[0].state.as_ref().unwrap().running.is_some());
        assert!(status.conditions.unwrap().iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    }
}
