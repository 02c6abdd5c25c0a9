//! The one cache of every pod that the controllers share, as kube-controller-manager's shared pod
//! informer: one watch feeds one store of trimmed pods, and each change, with the pod before and
//! after it, goes to every controller that subscribed, which maps it to its own keys.
//!
//! The watch starts when a controller first asks for the cache and stops when the [`Context`]
//! that holds it is dropped. A change is applied to the store before it is sent, so a controller
//! never acts on a change its store does not show yet. As client-go's informer gives each handler
//! its own growing buffer, each subscriber has an unbounded queue: the events are `Arc`s shared
//! with the store, so a queue costs little per change, and no subscriber ever misses one. A
//! relist of the watch is sent as the changes it made (added, changed, gone), and a subscriber
//! that joins once the store is filled first gets every cached pod as added; so no controller
//! keeps a copy of what it has seen.
//!
//! [`Context`]: crate::Context

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use futures::channel::mpsc;
use k8s_openapi::api::core::v1::{Container, ContainerStatus, Pod, PodSpec, PodStatus};
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};

use crate::workloads::controller_of;

/// A change of the cache, as a subscriber sees it (an informer's `OnAdd`, `OnUpdate`, `OnDelete`).
#[derive(Clone, Debug)]
pub enum PodEvent {
    /// The pod was added (no `old`) or changed; the store holds `new` (or a later version).
    Applied { old: Option<Arc<Pod>>, new: Arc<Pod> },
    /// The pod was deleted (its last state); the store no longer holds it.
    Deleted(Arc<Pod>),
    /// Every pod of the first complete list (or of the store when the subscriber joined) has
    /// been sent as added before this: client-go's handler `HasSynced`. A controller whose
    /// expectations count pod additions syncs only after it, or the additions of pods that
    /// already existed would be taken for its own creations.
    Synced,
}

/// The shared pod cache; reach it through `Context::pods`.
pub struct PodCache {
    store: Store<Pod>,
    index: Arc<Mutex<PodIndex>>,
    fanout: Arc<Mutex<Fanout>>,
    watch: tokio::task::AbortHandle,
}

/// The cached pods by controlling owner, and those without one by namespace: what a workload
/// controller claims from, so that its sync reads its own pods and its namespace's orphans
/// instead of every pod of the namespace (with 50,000 pods of other ReplicaSets beside its own,
/// that pass was most of the controllers' time).
#[derive(Default)]
struct PodIndex {
    /// Controller UID → pod UID → pod.
    by_controller: HashMap<String, HashMap<String, Arc<Pod>>>,
    /// Namespace → pod UID → pod, for pods no controller owns.
    orphans: HashMap<String, HashMap<String, Arc<Pod>>>,
}

impl PodIndex {
    /// The group a pod is filed under: its controller's, or its namespace's orphans.
    fn group_of<'a>(&mut self, pod: &'a Pod) -> (&mut HashMap<String, HashMap<String, Arc<Pod>>>, &'a str) {
        match controller_of(&pod.metadata) {
            Some(c) => (&mut self.by_controller, c.uid.as_str()),
            None => (&mut self.orphans, pod.metadata.namespace.as_deref().unwrap_or_default()),
        }
    }

    fn insert(&mut self, pod: Arc<Pod>) {
        let Some(uid) = pod.metadata.uid.clone() else { return };
        let (groups, key) = self.group_of(&pod);
        match groups.get_mut(key) {
            Some(group) => group.insert(uid, pod.clone()),
            None => groups.entry(key.to_owned()).or_default().insert(uid, pod.clone()),
        };
    }

    fn remove(&mut self, pod: &Pod) {
        let Some(uid) = pod.metadata.uid.as_deref() else { return };
        let (groups, key) = self.group_of(pod);
        if let Some(group) = groups.get_mut(key) {
            group.remove(uid);
            if group.is_empty() {
                groups.remove(key);
            }
        }
    }

    fn rebuild(&mut self, pods: Vec<Arc<Pod>>) {
        *self = PodIndex::default();
        for pod in pods {
            self.insert(pod);
        }
    }

    fn of_controller(&self, controller: &str) -> impl Iterator<Item = &Arc<Pod>> {
        self.by_controller.get(controller).into_iter().flat_map(HashMap::values)
    }

    fn orphans_of(&self, namespace: &str) -> impl Iterator<Item = &Arc<Pod>> {
        self.orphans.get(namespace).into_iter().flat_map(HashMap::values)
    }
}

impl PodCache {
    /// Starts the watch of every pod; it runs until the cache is dropped.
    pub(crate) fn start(client: kube::Client) -> PodCache {
        let (store, writer) = reflector::store::<Pod>();
        let index = Arc::new(Mutex::new(PodIndex::default()));
        let fanout = Arc::new(Mutex::new(Fanout::new(writer, index.clone())));
        let feed = fanout.clone();
        let watch = tokio::spawn(async move {
            let mut events = std::pin::pin!(
                watcher(Api::<Pod>::all(client), watcher::Config::default()).default_backoff().modify(trim)
            );
            while let Some(event) = events.next().await {
                match event {
                    Ok(event) => lock(&feed).apply(event),
                    Err(e) => tracing::warn!(error = %e, "pod cache: watch failed"),
                }
            }
        })
        .abort_handle();
        PodCache { store, index, fanout, watch }
    }

    /// The cached pods, trimmed by [`trim`].
    pub fn store(&self) -> Store<Pod> {
        self.store.clone()
    }

    /// The pods the controller with UID `controller` owns, and the pods of `namespace` that no
    /// controller owns: every pod a workload controller of that namespace may claim.
    pub fn claimable(&self, namespace: &str, controller: &str) -> Vec<Arc<Pod>> {
        let index = lock(&self.index);
        index.of_controller(controller).chain(index.orphans_of(namespace)).cloned().collect()
    }

    /// The pods the controller with UID `controller` owns.
    pub fn of_controller(&self, controller: &str) -> Vec<Arc<Pod>> {
        lock(&self.index).of_controller(controller).cloned().collect()
    }

    /// Every change from now on; if the store is filled, its pods first, as added.
    pub fn subscribe(&self) -> mpsc::UnboundedReceiver<PodEvent> {
        lock(&self.fanout).subscribe()
    }
}

impl Drop for PodCache {
    fn drop(&mut self) {
        self.watch.abort();
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// The store's writer and the subscribers, behind one lock, so that a subscriber joins between
/// two changes: it sees the store as of one change and is sent every later one.
struct Fanout {
    writer: Writer<Pod>,
    store: Store<Pod>,
    /// Kept with the store: changed in the same step.
    index: Arc<Mutex<PodIndex>>,
    /// Whether the first list has been applied.
    filled: bool,
    subscribers: Vec<mpsc::UnboundedSender<PodEvent>>,
}

impl Fanout {
    fn new(writer: Writer<Pod>, index: Arc<Mutex<PodIndex>>) -> Fanout {
        Fanout { store: writer.as_reader(), writer, index, filled: false, subscribers: Vec::new() }
    }

    fn subscribe(&mut self) -> mpsc::UnboundedReceiver<PodEvent> {
        let (tx, rx) = mpsc::unbounded();
        if self.filled {
            for new in self.store.state() {
                let _ = tx.unbounded_send(PodEvent::Applied { old: None, new });
            }
            let _ = tx.unbounded_send(PodEvent::Synced);
        }
        self.subscribers.push(tx);
        rx
    }

    /// Applies one watch event to the store, then sends the changes it made.
    fn apply(&mut self, event: watcher::Event<Pod>) {
        let old = match &event {
            watcher::Event::Apply(pod) | watcher::Event::Delete(pod) => self.store.get(&ObjectRef::from_obj(pod)),
            _ => None,
        };
        let mut before: HashMap<ObjectRef<Pod>, Arc<Pod>> = match &event {
            watcher::Event::InitDone => {
                self.store.state().into_iter().map(|p| (ObjectRef::from_obj(p.as_ref()), p)).collect()
            }
            _ => HashMap::new(),
        };
        self.writer.apply_watcher_event(&event);
        let changes = match event {
            watcher::Event::Apply(pod) => {
                let new = self.store.get(&ObjectRef::from_obj(&pod)).unwrap_or_else(|| Arc::new(pod));
                let mut index = lock(&self.index);
                if let Some(old) = &old {
                    index.remove(old);
                }
                index.insert(new.clone());
                vec![PodEvent::Applied { old, new }]
            }
            watcher::Event::Delete(pod) => {
                lock(&self.index).remove(old.as_deref().unwrap_or(&pod));
                vec![PodEvent::Deleted(Arc::new(pod))]
            }
            // A relist shows in the store only when it is complete.
            watcher::Event::Init | watcher::Event::InitApply(_) => Vec::new(),
            watcher::Event::InitDone => {
                lock(&self.index).rebuild(self.store.state());
                let first = !self.filled;
                self.filled = true;
                let mut changes = Vec::new();
                for new in self.store.state() {
                    match before.remove(&ObjectRef::from_obj(new.as_ref())) {
                        Some(old) if old.metadata.resource_version == new.metadata.resource_version => {}
                        old => changes.push(PodEvent::Applied { old, new }),
                    }
                }
                // What the relist no longer lists was deleted while the watch was down.
                changes.extend(before.into_values().map(PodEvent::Deleted));
                if first {
                    changes.push(PodEvent::Synced);
                }
                changes
            }
        };
        for change in changes {
            // A subscriber that is gone is dropped.
            self.subscribers.retain(|tx| tx.unbounded_send(change.clone()).is_ok());
        }
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

    fn pod(name: &str, rv: &str) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.name = Some(name.into());
        pod.metadata.namespace = Some("ns".into());
        pod.metadata.resource_version = Some(rv.into());
        pod
    }

    /// What a subscriber has been sent so far, in words.
    fn sent(rx: &mut mpsc::UnboundedReceiver<PodEvent>) -> Vec<String> {
        let name = |p: &Pod| {
            format!(
                "{}@{}",
                p.metadata.name.as_deref().unwrap_or(""),
                p.metadata.resource_version.as_deref().unwrap_or("")
            )
        };
        let mut out = Vec::new();
        while let Ok(ev) = rx.try_recv() {
            out.push(match ev {
                PodEvent::Applied { old: None, new } => format!("added {}", name(&new)),
                PodEvent::Applied { old: Some(old), new } => format!("changed {} to {}", name(&old), name(&new)),
                PodEvent::Deleted(p) => format!("deleted {}", name(&p)),
                PodEvent::Synced => "synced".to_string(),
            });
        }
        out.sort();
        out
    }

    fn fanout() -> Fanout {
        Fanout::new(reflector::store::<Pod>().1, Arc::default())
    }

    fn relist(f: &mut Fanout, pods: &[Pod]) {
        f.apply(watcher::Event::Init);
        for p in pods {
            f.apply(watcher::Event::InitApply(p.clone()));
        }
        f.apply(watcher::Event::InitDone);
    }

    #[test]
    fn changes_are_sent_with_the_pod_before_and_after_once_the_store_holds_them() {
        let mut f = fanout();
        let mut early = f.subscribe();
        relist(&mut f, &[pod("a", "1")]);
        assert_eq!(sent(&mut early), ["added a@1", "synced"]);
        f.apply(watcher::Event::Apply(pod("a", "2")));
        f.apply(watcher::Event::Apply(pod("b", "3")));
        f.apply(watcher::Event::Delete(pod("a", "4")));
        assert_eq!(sent(&mut early), ["added b@3", "changed a@1 to a@2", "deleted a@4"]);
        assert_eq!(f.store.state().len(), 1);
    }

    #[test]
    fn a_subscriber_that_joins_late_gets_every_cached_pod_first() {
        let mut f = fanout();
        relist(&mut f, &[pod("a", "1"), pod("b", "1")]);
        let mut late = f.subscribe();
        assert_eq!(sent(&mut late), ["added a@1", "added b@1", "synced"]);
        f.apply(watcher::Event::Apply(pod("a", "2")));
        assert_eq!(sent(&mut late), ["changed a@1 to a@2"]);
    }

    #[test]
    fn a_relist_is_sent_as_what_changed_appeared_and_vanished_meanwhile() {
        let mut f = fanout();
        relist(&mut f, &[pod("kept", "1"), pod("changed", "1"), pod("gone", "1")]);
        let mut rx = f.subscribe();
        sent(&mut rx);
        f.apply(watcher::Event::Init);
        f.apply(watcher::Event::InitApply(pod("kept", "1")));
        assert!(sent(&mut rx).is_empty(), "nothing is sent before the relist is complete");
        f.apply(watcher::Event::InitApply(pod("changed", "5")));
        f.apply(watcher::Event::InitApply(pod("new", "6")));
        f.apply(watcher::Event::InitDone);
        assert_eq!(sent(&mut rx), ["added new@6", "changed changed@1 to changed@5", "deleted gone@1"]);
    }

    /// A pod with a UID in namespace `ns`, controlled by `owner` if given.
    fn owned(name: &str, rv: &str, ns: &str, owner: Option<&str>) -> Pod {
        let mut p = pod(name, rv);
        p.metadata.uid = Some(format!("uid-{name}"));
        p.metadata.namespace = Some(ns.into());
        p.metadata.owner_references = owner.map(|uid| {
            vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                api_version: "apps/v1".into(),
                kind: "ReplicaSet".into(),
                name: "rs".into(),
                uid: uid.into(),
                controller: Some(true),
                ..Default::default()
            }]
        });
        p
    }

    fn names(pods: Vec<Arc<Pod>>) -> Vec<String> {
        let mut v: Vec<String> = pods.iter().map(|p| p.metadata.name.clone().unwrap_or_default()).collect();
        v.sort();
        v
    }

    #[test]
    fn the_index_holds_each_controllers_pods_and_each_namespaces_orphans_as_they_change() {
        let mut f = fanout();
        relist(
            &mut f,
            &[
                owned("a", "1", "ns", Some("rs1")),
                owned("b", "1", "ns", Some("rs2")),
                owned("o", "1", "ns", None),
                owned("elsewhere", "1", "other", None),
            ],
        );
        let claimable = |f: &Fanout, ns: &str, rs: &str| {
            let index = lock(&f.index);
            names(index.of_controller(rs).chain(index.orphans_of(ns)).cloned().collect())
        };
        assert_eq!(claimable(&f, "ns", "rs1"), ["a", "o"]);
        // Adopted, then released, then deleted.
        f.apply(watcher::Event::Apply(owned("o", "2", "ns", Some("rs1"))));
        assert_eq!(claimable(&f, "ns", "rs1"), ["a", "o"]);
        assert_eq!(claimable(&f, "ns", "rs2"), ["b"], "an adopted pod is no longer an orphan");
        f.apply(watcher::Event::Apply(owned("a", "3", "ns", None)));
        assert_eq!(claimable(&f, "ns", "rs2"), ["a", "b"]);
        f.apply(watcher::Event::Delete(owned("a", "4", "ns", None)));
        f.apply(watcher::Event::Delete(owned("o", "4", "ns", Some("rs1"))));
        assert_eq!(claimable(&f, "ns", "rs1"), Vec::<String>::new());
        assert_eq!(claimable(&f, "other", "rs9"), ["elsewhere"]);
        // A relist replaces the index with what it listed.
        relist(&mut f, &[owned("c", "5", "ns", Some("rs1"))]);
        assert_eq!(claimable(&f, "ns", "rs1"), ["c"]);
        assert_eq!(claimable(&f, "other", "rs9"), Vec::<String>::new());
        let index = lock(&f.index);
        assert_eq!((index.by_controller.len(), index.orphans.len()), (1, 0), "no empty groups are kept");
    }

    #[test]
    fn a_subscriber_that_is_gone_is_dropped() {
        let mut f = fanout();
        drop(f.subscribe());
        let mut kept = f.subscribe();
        f.apply(watcher::Event::Apply(pod("a", "1")));
        assert_eq!(f.subscribers.len(), 1);
        assert_eq!(sent(&mut kept), ["added a@1"]);
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
