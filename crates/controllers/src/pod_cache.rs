//! The one cache of every pod that the controllers share, as kube-controller-manager's shared pod
//! informer: one watch feeds one store of trimmed pods, and its changes fan out to each
//! controller, which maps them to its own keys.
//!
//! The watch starts when a controller first asks for the cache and stops when the [`Context`]
//! that holds it is dropped. Every change is applied to the store before it is sent, so a
//! controller never acts on a change its store does not show yet. Changes go through a bounded
//! broadcast of `Arc`s shared with the store; a subscriber that falls behind is told to
//! [`PodEvent::Resync`] from the store rather than losing changes silently, as it is after the
//! watch relists.
//!
//! [`Context`]: crate::Context

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Container, ContainerStatus, Pod, PodSpec, PodStatus};
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::broadcast;

/// Changes kept for subscribers that have not read them yet; one falling further behind resyncs.
const BACKLOG: usize = 4096;

/// A change of the cache, as a subscriber sees it.
#[derive(Clone, Debug)]
pub enum PodEvent {
    /// The pod was added or changed; the store holds this version (or a later one).
    Applied(Arc<Pod>),
    /// The pod was deleted; the store no longer holds it.
    Deleted(Arc<Pod>),
    /// Anything may have changed (the watch relisted, or this subscriber fell behind): the store
    /// holds the truth.
    Resync,
}

/// The shared pod cache; reach it through `Context::pods`.
pub struct PodCache {
    store: Store<Pod>,
    changes: broadcast::Sender<PodEvent>,
    filled: Arc<AtomicBool>,
    watch: tokio::task::AbortHandle,
}

impl PodCache {
    /// Starts the watch of every pod; it runs until the cache is dropped.
    pub(crate) fn start(client: kube::Client) -> PodCache {
        let (store, mut writer) = reflector::store::<Pod>();
        let (changes, _) = broadcast::channel(BACKLOG);
        let filled = Arc::new(AtomicBool::new(false));
        let (tx, done) = (changes.clone(), filled.clone());
        let reader = store.clone();
        let watch = tokio::spawn(async move {
            let mut events = std::pin::pin!(
                watcher(Api::<Pod>::all(client), watcher::Config::default()).default_backoff().modify(trim)
            );
            while let Some(event) = events.next().await {
                let event = match event {
                    Ok(event) => event,
                    Err(e) => {
                        tracing::warn!(error = %e, "pod cache: watch failed");
                        continue;
                    }
                };
                writer.apply_watcher_event(&event);
                // Sending fails only when nobody subscribes, which is fine.
                let _ = match event {
                    watcher::Event::Apply(pod) => match reader.get(&ObjectRef::from_obj(&pod)) {
                        Some(stored) => tx.send(PodEvent::Applied(stored)),
                        None => tx.send(PodEvent::Applied(Arc::new(pod))),
                    },
                    watcher::Event::Delete(pod) => tx.send(PodEvent::Deleted(Arc::new(pod))),
                    watcher::Event::InitDone => {
                        done.store(true, Ordering::SeqCst);
                        tx.send(PodEvent::Resync)
                    }
                    // A relist shows in the store only at its end.
                    watcher::Event::Init | watcher::Event::InitApply(_) => Ok(0),
                };
            }
        })
        .abort_handle();
        PodCache { store, changes, filled, watch }
    }

    /// The cached pods, trimmed by [`trim`].
    pub fn store(&self) -> Store<Pod> {
        self.store.clone()
    }

    /// The cache's changes from now on, starting with a [`PodEvent::Resync`] once the store is
    /// filled (at once if it already is).
    pub fn subscribe(&self) -> impl Stream<Item = PodEvent> + Send + 'static {
        let rx = self.changes.subscribe();
        // Read after subscribing: if the store fills meanwhile, its Resync is received too.
        follow(rx, self.filled.load(Ordering::SeqCst))
    }
}

/// The changes `rx` receives, after a Resync if the store is `filled`; falling behind is a Resync.
fn follow(rx: broadcast::Receiver<PodEvent>, filled: bool) -> impl Stream<Item = PodEvent> + Send + 'static {
    let first = filled.then_some(PodEvent::Resync);
    futures::stream::iter(first).chain(futures::stream::unfold(rx, |mut rx| async move {
        match rx.recv().await {
            Ok(event) => Some((event, rx)),
            Err(broadcast::error::RecvError::Lagged(missed)) => {
                tracing::warn!(missed, "pod cache: a controller fell behind; it resyncs from the cache");
                // Changes sent from here on are received; earlier ones are in the store.
                Some((PodEvent::Resync, rx.resubscribe()))
            }
            Err(broadcast::error::RecvError::Closed) => None,
        }
    }))
}

impl Drop for PodCache {
    fn drop(&mut self) {
        self.watch.abort();
    }
}

/// Drops what no controller reads from a cached pod, as kube-controller-manager's informers drop
/// managed fields. Kept, for these readers:
///
/// - metadata, but for `managedFields`: every controller (keys, labels, owners, deletion,
///   `pod-deletion-cost` annotation, resourceVersion preconditions, events about the pod);
/// - `spec.nodeName`: node lifecycle, ReplicaSet ranking, endpoints;
/// - `spec.tolerations`: node lifecycle's taint eviction;
/// - `spec.hostname`, `spec.subdomain`, and the name and `ports` of containers that declare
///   ports: endpoints (hostnames, named target ports);
/// - name and `restartPolicy` of sidecar init containers: ReplicaSet ranking;
/// - `status.phase` and `status.conditions` (whole: node lifecycle writes them back), `podIP`,
///   `podIPs`: every reader;
/// - name, `ready` and `restartCount` of container and init container statuses: ReplicaSet
///   ranking.
///
/// Everything else goes: containers' images, commands, env, resources, probes, volumes, the
/// rest of the spec, containers' states and images in the status, and so on.
pub fn trim(pod: &mut Pod) {
    pod.metadata.managed_fields = None;
    if let Some(spec) = pod.spec.take() {
        let containers = spec
            .containers
            .into_iter()
            .filter(|c| c.ports.as_ref().is_some_and(|p| !p.is_empty()))
            .map(|c| Container { name: c.name, ports: c.ports, ..Default::default() })
            .collect();
        let sidecars: Vec<Container> = spec
            .init_containers
            .into_iter()
            .flatten()
            .filter(|c| c.restart_policy.is_some())
            .map(|c| Container { name: c.name, restart_policy: c.restart_policy, ..Default::default() })
            .collect();
        pod.spec = Some(PodSpec {
            node_name: spec.node_name,
            tolerations: spec.tolerations,
            hostname: spec.hostname,
            subdomain: spec.subdomain,
            containers,
            init_containers: Some(sidecars).filter(|s| !s.is_empty()),
            ..Default::default()
        });
    }
    if let Some(status) = pod.status.take() {
        let counts = |statuses: Option<Vec<ContainerStatus>>| {
            statuses.map(|s| {
                s.into_iter()
                    .map(|c| ContainerStatus {
                        name: c.name,
                        ready: c.ready,
                        restart_count: c.restart_count,
                        ..Default::default()
                    })
                    .collect()
            })
        };
        pod.status = Some(PodStatus {
            phase: status.phase,
            conditions: status.conditions,
            pod_ip: status.pod_ip,
            pod_ips: status.pod_ips,
            container_statuses: counts(status.container_statuses),
            init_container_statuses: counts(status.init_container_statuses),
            ..Default::default()
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(name: &str) -> Arc<Pod> {
        let mut pod = Pod::default();
        pod.metadata.name = Some(name.into());
        Arc::new(pod)
    }

    fn describe(ev: &PodEvent) -> String {
        match ev {
            PodEvent::Applied(p) => format!("applied {}", p.metadata.name.as_deref().unwrap_or("")),
            PodEvent::Deleted(p) => format!("deleted {}", p.metadata.name.as_deref().unwrap_or("")),
            PodEvent::Resync => "resync".into(),
        }
    }

    #[tokio::test]
    async fn a_subscriber_that_falls_behind_is_told_to_resync_then_follows_again() {
        let (tx, rx) = broadcast::channel(2);
        let mut events = std::pin::pin!(follow(rx, false));
        for name in ["a", "b", "c", "d"] {
            tx.send(PodEvent::Applied(named(name))).unwrap();
        }
        assert_eq!(describe(&events.next().await.unwrap()), "resync");
        tx.send(PodEvent::Deleted(named("a"))).unwrap();
        drop(tx);
        let rest: Vec<String> = events.map(|e| describe(&e)).collect().await;
        assert_eq!(rest, ["deleted a"]);
    }

    #[tokio::test]
    async fn a_subscriber_starts_with_a_resync_only_once_the_cache_is_filled() {
        let (tx, rx) = broadcast::channel(4);
        let filled = follow(rx, true);
        let filling = follow(tx.subscribe(), false);
        tx.send(PodEvent::Applied(named("a"))).unwrap();
        drop(tx);
        let seen: Vec<String> = filled.map(|e| describe(&e)).collect().await;
        assert_eq!(seen, ["resync", "applied a"]);
        let seen: Vec<String> = filling.map(|e| describe(&e)).collect().await;
        assert_eq!(seen, ["applied a"]);
    }

    fn full_pod() -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "p", "namespace": "ns", "uid": "u", "resourceVersion": "7",
                "labels": {"app": "a"},
                "annotations": {"controller.kubernetes.io/pod-deletion-cost": "5"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "r", "controller": true}],
                "managedFields": [{"manager": "kubectl", "operation": "Update", "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}],
            },
            "spec": {
                "nodeName": "n1",
                "hostname": "h", "subdomain": "s",
                "tolerations": [{"key": "k", "operator": "Exists", "effect": "NoExecute"}],
                "initContainers": [
                    {"name": "side", "image": "busybox", "restartPolicy": "Always"},
                    {"name": "init", "image": "busybox"},
                ],
                "containers": [
                    {"name": "web", "image": "nginx", "env": [{"name": "A", "value": "1"}],
                     "ports": [{"name": "http", "containerPort": 80}]},
                    {"name": "log", "image": "busybox", "command": ["tail"]},
                ],
                "volumes": [{"name": "v", "emptyDir": {}}],
            },
            "status": {
                "phase": "Running", "podIP": "10.0.0.1", "podIPs": [{"ip": "10.0.0.1"}],
                "hostIP": "192.168.0.1", "qosClass": "BestEffort",
                "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
                "containerStatuses": [{"name": "web", "image": "nginx", "imageID": "sha256:x", "ready": true,
                    "restartCount": 3, "containerID": "c://1", "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}],
                "initContainerStatuses": [{"name": "side", "image": "busybox", "imageID": "", "ready": true, "restartCount": 1}],
            },
        }))
        .unwrap()
    }

    #[test]
    fn trimming_drops_managed_fields_and_what_no_controller_reads() {
        let mut pod = full_pod();
        trim(&mut pod);
        assert_eq!(pod.metadata.managed_fields, None);
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.volumes, None);
        assert_eq!(spec.containers.len(), 1, "only containers with ports stay");
        assert_eq!(spec.containers[0].image, None);
        assert_eq!(spec.containers[0].env, None);
        let init: Vec<&str> = spec.init_containers.iter().flatten().map(|c| c.name.as_str()).collect();
        assert_eq!(init, ["side"], "only sidecars stay");
        let status = pod.status.as_ref().unwrap();
        assert_eq!(status.host_ip, None);
        assert_eq!(status.qos_class, None);
        let web = &status.container_statuses.as_ref().unwrap()[0];
        assert_eq!((web.image.as_str(), web.container_id.as_deref(), web.state.is_some()), ("", None, false));
    }

    #[test]
    fn trimming_keeps_every_field_a_controller_reads() {
        let full = full_pod();
        let mut pod = full.clone();
        trim(&mut pod);
        let mut meta = full.metadata.clone();
        meta.managed_fields = None;
        assert_eq!(pod.metadata, meta);
        let (spec, was) = (pod.spec.as_ref().unwrap(), full.spec.as_ref().unwrap());
        assert_eq!(spec.node_name, was.node_name);
        assert_eq!(spec.tolerations, was.tolerations);
        assert_eq!((&spec.hostname, &spec.subdomain), (&was.hostname, &was.subdomain));
        assert_eq!(spec.containers[0].name, "web");
        assert_eq!(spec.containers[0].ports, was.containers[0].ports);
        assert_eq!(spec.init_containers.as_ref().unwrap()[0].restart_policy.as_deref(), Some("Always"));
        let (status, was) = (pod.status.as_ref().unwrap(), full.status.as_ref().unwrap());
        assert_eq!(status.phase, was.phase);
        assert_eq!(status.conditions, was.conditions);
        assert_eq!((&status.pod_ip, &status.pod_ips), (&was.pod_ip, &was.pod_ips));
        let web = &status.container_statuses.as_ref().unwrap()[0];
        assert_eq!((web.name.as_str(), web.ready, web.restart_count), ("web", true, 3));
        let side = &status.init_container_statuses.as_ref().unwrap()[0];
        assert_eq!((side.name.as_str(), side.restart_count), ("side", 1));
    }
}
