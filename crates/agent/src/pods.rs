//! Pods bound to this node: one worker per pod drives its sandbox and containers through CRI.
//!
//! [`run`] watches the pods whose `spec.nodeName` is this node and RuntimeClasses (a watch
//! cache), and keeps one [`worker::Worker`] task per pod UID, fed the newest pod through a
//! `watch` channel. Before the first pod it recovers: every endpoint's sandboxes and containers
//! (found by kubelet's standard labels) fill the runtime manager's pod cache, so each worker adopts
//! what already runs instead of starting it again; pods the API no longer has (deleted while the
//! agent was down) get an orphan worker that tears them down. Runtime container events wake the
//! pod's worker; garbage collection runs alongside (see [`gc`]).

mod actions;
mod backoff;
mod cgroups;
mod clock;
mod cri;
mod dns;
mod env;
#[cfg(test)]
mod fake_cri;
mod gc;
mod hosts;
mod images;
pub mod labels;
mod mount;
mod plan;
mod probe;
mod resources;
mod spec;
mod status;
mod status_writer;
mod tokens;
mod volumes;
mod wake;
mod worker;

pub use mount::unmount_all_under;

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::node::v1::RuntimeClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::Api;
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, reflector};
use tokio::sync::{mpsc, watch};

use crate::runtimes::RuntimeManager;
use worker::{Context, Worker};

/// What the pod workers need from the agent.
pub struct Settings {
    pub client: kube::Client,
    pub node_name: String,
    pub runtimes: Arc<RuntimeManager>,
    /// Pod volumes live under `<root_dir>/pods/<uid>/volumes/...`.
    pub root_dir: PathBuf,
    /// Container logs live under `<pod_log_dir>/<namespace>_<name>_<uid>/` (kubelet: /var/log/pods).
    pub pod_log_dir: PathBuf,
    /// `(high, low)` image GC thresholds in percent as configured now (they follow config reloads).
    pub image_gc_thresholds: Box<dyn Fn() -> (u8, u8) + Send + Sync>,
    /// `--cluster-dns`: the cluster DNS servers of `ClusterFirst` pods (empty: none).
    pub cluster_dns: Vec<IpAddr>,
    /// `--cluster-domain`.
    pub cluster_domain: String,
}

/// Why the pod workers stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the pod watch ended")]
    WatchEnded,
}

/// How long the first runtime status may take before pods are started anyway.
const FIRST_STATUS_WAIT: Duration = Duration::from_secs(10);

/// Aborts its tasks when dropped, so that dropping [`run`] stops everything it started.
#[derive(Default)]
struct Tasks(Vec<tokio::task::JoinHandle<()>>);

impl Tasks {
    fn spawn(&mut self, f: impl std::future::Future<Output = ()> + Send + 'static) {
        self.0.push(tokio::spawn(f));
    }

    /// A cache of `api`'s objects, kept by a watch that retries on its own.
    fn reflect<K>(&mut self, api: Api<K>, kind: &'static str) -> reflector::Store<K>
    where
        K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
        K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
    {
        let (store, writer) = reflector::store::<K>();
        let events = watcher::watcher(api, watcher::Config::default()).default_backoff().reflect(writer);
        self.spawn(async move {
            futures::pin_mut!(events);
            while let Some(event) = events.next().await {
                if let Err(e) = event {
                    tracing::warn!(error = %e, kind, "watch failed; retrying");
                }
            }
        });
        store
    }
}

impl Drop for Tasks {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}

struct Handle {
    pods: watch::Sender<Option<Arc<core::Pod>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The workers by pod UID.
struct Supervisor {
    ctx: Arc<Context>,
    workers: HashMap<String, Handle>,
}

impl Supervisor {
    fn apply(&mut self, mut pod: core::Pod) {
        let Some(uid) = pod.metadata.uid.clone() else { return };
        // Server-side apply's bookkeeping: nothing here reads it, and it is a large part of
        // each pod kept in memory.
        pod.metadata.managed_fields = None;
        tracing::trace!(pod = ?pod.metadata.name, uid, rv = ?pod.metadata.resource_version, deleting = pod.metadata.deletion_timestamp.is_some(), "pod event");
        let pod = Arc::new(pod);
        self.workers.retain(|_, h| !h.task.is_finished());
        match self.workers.get(&uid) {
            Some(h) => {
                // The worker's own status writes come back through the watch. They are dropped:
                // the worker keeps its own status, and the pod it holds stays the one copy.
                h.pods.send_if_modified(|current| {
                    let changed = current.as_deref().is_none_or(|old| changed_for_worker(old, &pod));
                    if changed {
                        *current = Some(pod);
                    }
                    changed
                });
            }
            None => self.start(uid, pod, true),
        }
    }

    fn start(&mut self, uid: String, pod: Arc<core::Pod>, in_api: bool) {
        let (tx, rx) = watch::channel(in_api.then(|| pod.clone()));
        let worker = Worker::new(self.ctx.clone(), pod, in_api, rx);
        let task = tokio::spawn(worker.run());
        self.workers.insert(uid, Handle { pods: tx, task });
    }

    fn delete(&mut self, uid: &str) {
        if let Some(h) = self.workers.get(uid) {
            h.pods.send_replace(None);
        }
    }

    /// Tears down pods found in a runtime that have no worker (and so are not in the API).
    fn adopt_orphans(&mut self, found: Vec<gc::Found>) {
        self.workers.retain(|_, h| !h.task.is_finished());
        for f in found {
            if self.workers.contains_key(&f.uid) {
                continue;
            }
            tracing::info!(pod = %f.name, namespace = %f.namespace, uid = %f.uid, endpoint = %f.endpoint, "tearing down a pod the API no longer has");
            self.ctx.runtimes.remember(&f.uid, &f.endpoint);
            let pod = core::Pod {
                metadata: ObjectMeta {
                    name: Some(f.name.clone()),
                    namespace: Some(f.namespace.clone()),
                    uid: Some(f.uid.clone()),
                    ..Default::default()
                },
                ..Default::default()
            };
            self.start(f.uid.clone(), Arc::new(pod), false);
        }
    }
}

/// Whether an update changes what a worker acts on: its spec, labels and annotations (the
/// downward API), or its deletion. Status and bookkeeping changes do not.
fn changed_for_worker(old: &core::Pod, new: &core::Pod) -> bool {
    let (o, n) = (&old.metadata, &new.metadata);
    o.deletion_timestamp != n.deletion_timestamp
        || o.deletion_grace_period_seconds != n.deletion_grace_period_seconds
        || o.labels != n.labels
        || o.annotations != n.annotations
        || old.spec != new.spec
}

/// Runs the pod workers until dropped.
pub async fn run(settings: Settings) -> Result<(), Error> {
    let Settings {
        client,
        node_name,
        runtimes,
        root_dir,
        pod_log_dir,
        image_gc_thresholds,
        cluster_dns,
        cluster_domain,
    } = settings;
    let mut tasks = Tasks::default();

    let runtime_classes = tasks.reflect(Api::<RuntimeClass>::all(client.clone()), "RuntimeClass");
    // Containers get the Services' variables; kubelet reads them from a cache too.
    let services = tasks.reflect(Api::<core::Service>::all(client.clone()), "Service");

    let ctx = Arc::new(Context {
        client: client.clone(),
        node_name: node_name.clone(),
        runtimes: runtimes.clone(),
        runtime_classes: runtime_classes.clone(),
        services: services.clone(),
        root_dir,
        pod_log_dir,
        dns: dns::NodeDns {
            host: dns::HostDns::from_host(),
            cluster_servers: cluster_dns.iter().map(ToString::to_string).collect(),
            cluster_domain,
        },
        host_ips: RwLock::new(local_ips()),
        events: berth_events::Recorder::spawn(
            client.clone(),
            berth_events::Source { component: worker::EVENT_COMPONENT.into(), host: Some(node_name.clone()) },
            worker::EVENT_QUEUE,
        ),
        mounter: Arc::new(mount::HostMounter),
        cgroups: Arc::new(cgroups::CgroupFs::new("/sys/fs/cgroup")),
        memory_capacity: resources::node_memory_capacity(),
        cpu_millis: std::thread::available_parallelism().map_or(1000, |n| n.get() as i64 * 1000),
        wakers: Mutex::new(HashMap::new()),
        api_writes: Arc::new(tokio::sync::Semaphore::new(worker::API_WRITES)),
        clock: clock::Clock::system(),
    });
    tasks.spawn(refresh_host_ips(ctx.clone()));
    tasks.spawn(listen_for_container_events(ctx.clone()));
    tasks.spawn(gc::collect_images(ctx.clone(), image_gc_thresholds));

    wait_for_runtime_status(&runtimes).await;
    // A handler resolved against an empty cache would fail pods whose class exists.
    let _ = tokio::time::timeout(FIRST_STATUS_WAIT, runtime_classes.wait_until_ready()).await;
    let _ = tokio::time::timeout(FIRST_STATUS_WAIT, services.wait_until_ready()).await;
    let recovered = gc::pods_in_runtimes(&ctx).await;
    for f in recovered.values() {
        runtimes.remember(&f.uid, &f.endpoint);
    }
    tracing::info!(pods = recovered.len(), "recovered the pods the runtimes hold");
    let mut recovered = Some(recovered);

    let (orphans_tx, mut orphans_rx) = mpsc::channel(1);
    let mut supervisor = Supervisor { ctx: ctx.clone(), workers: HashMap::new() };
    let pods = watcher::watcher(
        Api::<core::Pod>::all(client.clone()),
        watcher::Config::default().fields(&format!("spec.nodeName={node_name}")),
    )
    .default_backoff();
    futures::pin_mut!(pods);
    let mut listed: Option<HashSet<String>> = None;
    loop {
        let event = tokio::select! {
            event = pods.next() => match event {
                Some(e) => e,
                None => return Err(Error::WatchEnded),
            },
            Some(found) = orphans_rx.recv() => {
                supervisor.adopt_orphans(found);
                continue;
            }
        };
        match event {
            Ok(Event::Init) => listed = Some(HashSet::new()),
            Ok(Event::InitApply(pod)) => {
                if let (Some(l), Some(uid)) = (listed.as_mut(), pod.metadata.uid.as_ref()) {
                    l.insert(uid.clone());
                }
                supervisor.apply(pod);
            }
            Ok(Event::InitDone) => {
                let listed = listed.take().unwrap_or_default();
                // Pods gone while the watch was down.
                let gone: Vec<String> = supervisor.workers.keys().filter(|u| !listed.contains(*u)).cloned().collect();
                for uid in gone {
                    supervisor.delete(&uid);
                }
                if let Some(found) = recovered.take() {
                    supervisor.adopt_orphans(found.into_values().collect());
                    tasks.spawn(gc::find_orphans(ctx.clone(), orphans_tx.clone()));
                    tasks.spawn(gc::inventory_late(ctx.clone(), orphans_tx.clone()));
                }
            }
            Ok(Event::Apply(pod)) => supervisor.apply(pod),
            Ok(Event::Delete(pod)) => {
                if let Some(uid) = pod.metadata.uid.as_deref() {
                    supervisor.delete(uid);
                }
            }
            Err(e) => tracing::warn!(error = %e, "pod watch failed; retrying"),
        }
    }
}

/// Waits (a bounded while) until every endpoint has answered once, so that pods are not told
/// "no runtime serves your handler" by an agent that has not asked yet.
async fn wait_for_runtime_status(runtimes: &RuntimeManager) {
    let mut changes = runtimes.changes();
    let deadline = tokio::time::Instant::now() + FIRST_STATUS_WAIT;
    loop {
        let endpoints = runtimes.endpoints();
        let answered = endpoints.iter().all(|(_, s)| *s != crate::runtimes::EndpointStatus::default());
        if answered && !endpoints.is_empty() {
            return;
        }
        if tokio::time::timeout_at(deadline, changes.changed()).await.is_err() {
            tracing::warn!("not every runtime answered in time; starting pods anyway");
            return;
        }
    }
}

/// The node's addresses as its Node object lists them (InternalIP first), refreshed now and then;
/// until the Node says, the address the default route leaves from.
async fn refresh_host_ips(ctx: Arc<Context>) {
    let api: Api<core::Node> = Api::all(ctx.client.clone());
    loop {
        let mut known = false;
        if let Ok(Some(node)) = api.get_opt(&ctx.node_name).await {
            let addresses = node.status.and_then(|s| s.addresses).unwrap_or_default();
            let ips: Vec<String> =
                addresses.iter().filter(|a| a.type_ == "InternalIP").map(|a| a.address.clone()).collect();
            if !ips.is_empty() {
                *ctx.host_ips.write().unwrap_or_else(|e| e.into_inner()) = ips;
                known = true;
            }
        }
        tokio::time::sleep(if known { Duration::from_secs(60) } else { Duration::from_secs(2) }).await;
    }
}

/// The local address of the default route (no packet is sent), else loopback.
fn local_ips() -> Vec<String> {
    let probe = std::net::UdpSocket::bind("0.0.0.0:0").and_then(|s| s.connect("192.0.2.1:9").map(|_| s));
    match probe.and_then(|s| s.local_addr()) {
        Ok(addr) => vec![addr.ip().to_string()],
        Err(_) => vec!["127.0.0.1".to_string()],
    }
}

/// Follows every endpoint's CRI container events and wakes the worker of the pod concerned.
/// Endpoints come and go with the configuration; each gets its own listener.
async fn listen_for_container_events(ctx: Arc<Context>) {
    let mut changes = ctx.runtimes.changes();
    let mut listeners: HashMap<(String, String), tokio::task::JoinHandle<()>> = HashMap::new();
    loop {
        let current: Vec<_> = ctx.runtimes.endpoints().into_iter().map(|(e, _)| e).collect();
        let keys: HashSet<(String, String)> = current.iter().map(|e| (e.name.clone(), e.address.clone())).collect();
        listeners.retain(|k, t| {
            let keep = keys.contains(k);
            if !keep {
                t.abort();
            }
            keep
        });
        for ep in current {
            let key = (ep.name.clone(), ep.address.clone());
            listeners.entry(key).or_insert_with(|| tokio::spawn(follow_events(ctx.clone(), ep)));
        }
        if changes.changed().await.is_err() {
            break;
        }
    }
    for t in listeners.values() {
        t.abort();
    }
}

fn wake_all(ctx: &Context) {
    for w in ctx.wakers.lock().unwrap_or_else(|e| e.into_inner()).values() {
        w.look();
    }
}

async fn follow_events(ctx: Arc<Context>, ep: Arc<crate::endpoint::Endpoint>) {
    let mut retry = Duration::from_secs(1);
    loop {
        match ep.runtime.clone().get_container_events(k8s_cri::v1::GetEventsRequest {}).await {
            Ok(stream) => {
                let mut stream = stream.into_inner();
                // Events missed while the stream was down: every worker looks once.
                ep.events_live.store(true, Ordering::Relaxed);
                wake_all(&ctx);
                while let Some(Ok(event)) = stream.next().await {
                    retry = Duration::from_secs(1);
                    let uid = event
                        .pod_sandbox_status
                        .as_ref()
                        .and_then(|s| {
                            s.metadata
                                .as_ref()
                                .map(|m| m.uid.clone())
                                .or_else(|| labels::pod_uid(&s.labels).map(String::from))
                        })
                        .unwrap_or_default();
                    let waker = ctx.wakers.lock().unwrap_or_else(|e| e.into_inner()).get(&uid).cloned();
                    if let Some(w) = waker {
                        w.container_event(event.container_id, event.container_event_type);
                    }
                }
                // Polling again until the stream is back.
                ep.events_live.store(false, Ordering::Relaxed);
                wake_all(&ctx);
            }
            Err(status) if status.code() == tonic::Code::Unimplemented => {
                tracing::debug!(endpoint = %ep.name, "runtime has no container events; polling only");
                return;
            }
            Err(status) => tracing::debug!(endpoint = %ep.name, error = %status, "container events unavailable"),
        }
        tokio::time::sleep(retry).await;
        retry = (retry * 2).min(Duration::from_secs(30));
    }
}
