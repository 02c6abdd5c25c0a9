//! The shell around the pure core: watches pods, nodes, RuntimeClasses and namespaces through
//! the Kubernetes API into the cache and the queue, runs decisions on a thread of its own, binds
//! through `pods/binding` concurrently, and reports failures as Kubernetes does (a
//! `PodScheduled=False` condition and a `FailedScheduling` event).
//!
//! Decisions wait for the first full list of pods, nodes and RuntimeClasses, so a new scheduler
//! (say, after taking over the lease) never places a pod on a node whose pods it has not seen.
//! [`run`] holds every task it starts: dropping its future stops them all, and the decision
//! thread with them.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use berth_events::{PodEvent, Recorder, Source, Type};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Binding, Namespace, Node, ObjectReference, Pod};
use k8s_openapi::api::node::v1::RuntimeClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::algorithm::{Algorithm, Failure};
use crate::cache::Cache;
use crate::metrics::{AttemptResult, Metrics};
use crate::node_info::NodeSpec;
use crate::pod_info::{DEFAULT_SCHEDULER_NAME, PodInfo};
use crate::queue::{ClusterEvent, QueuedPod, SchedulingQueue};

/// Bindings written at once.
const PARALLEL_BINDS: usize = 64;
/// Events waiting to be written beyond this many are dropped (client-go's broadcaster keeps 1000).
const EVENT_QUEUE: usize = 1000;
/// How long the decision thread sleeps at most when there is nothing to do.
const IDLE_WAIT: Duration = Duration::from_secs(1);

#[derive(Clone, Debug)]
pub struct Config {
    /// Pods whose `spec.schedulerName` is this are ours; others are left alone.
    pub scheduler_name: String,
    /// 0: Kubernetes' adaptive share of nodes to look at in large clusters.
    pub percentage_of_nodes_to_score: u32,
}

impl Default for Config {
    fn default() -> Self {
        Config { scheduler_name: DEFAULT_SCHEDULER_NAME.into(), percentage_of_nodes_to_score: 0 }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("watching {what} failed")]
    Watch {
        what: &'static str,
        #[source]
        source: watcher::Error,
    },
    #[error("the decision thread could not start")]
    Thread(#[source] std::io::Error),
}

/// Which kinds have been listed in full at least once.
#[derive(Default)]
struct Synced {
    pods: bool,
    nodes: bool,
    classes: bool,
    namespaces: bool,
}

impl Synced {
    fn all(&self) -> bool {
        self.pods && self.nodes && self.classes && self.namespaces
    }
}

struct Core {
    cache: Cache,
    queue: SchedulingQueue,
    /// RuntimeClass name → handler.
    handlers: HashMap<String, String>,
    algorithm: Algorithm,
    synced: Synced,
    next_expiry: Instant,
}

struct Shared {
    core: Mutex<Core>,
    wake: Condvar,
    stop: AtomicBool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Core> {
        // A panic while holding the lock leaves a consistent enough core to go on.
        self.core.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Changes the core and wakes the decision thread.
    fn update<T>(&self, f: impl FnOnce(&mut Core, Instant) -> T) -> T {
        let out = f(&mut self.lock(), Instant::now());
        self.wake.notify_one();
        out
    }
}

/// What the decision thread hands to the async side.
enum Outcome {
    Bind { queued: QueuedPod, node: String },
    Unschedulable { pod: Arc<PodInfo>, message: String, report_condition: bool },
}

/// Stops the decision thread when the future of [`run`] is dropped.
struct StopOnDrop(Arc<Shared>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.stop.store(true, Ordering::SeqCst);
        self.0.wake.notify_all();
    }
}

/// Schedules until the returned future is dropped or a watch fails for good.
pub async fn run(client: kube::Client, config: Config, metrics: Metrics) -> Result<(), Error> {
    let mut algorithm = Algorithm::default();
    algorithm.percentage_of_nodes_to_score = config.percentage_of_nodes_to_score;
    let shared = Arc::new(Shared {
        core: Mutex::new(Core {
            cache: Cache::new(),
            queue: SchedulingQueue::new(),
            handlers: HashMap::new(),
            algorithm,
            synced: Synced::default(),
            next_expiry: Instant::now(),
        }),
        wake: Condvar::new(),
        stop: AtomicBool::new(false),
    });
    let _stop = StopOnDrop(shared.clone());
    let recorder =
        Recorder::spawn(client.clone(), Source { component: config.scheduler_name.clone(), host: None }, EVENT_QUEUE);
    let (outcomes_tx, outcomes_rx) = mpsc::unbounded_channel();

    let thread_shared = shared.clone();
    let thread_metrics = metrics.clone();
    std::thread::Builder::new()
        .name("berth-scheduler".into())
        .spawn(move || decide(&thread_shared, &thread_metrics, &outcomes_tx))
        .map_err(Error::Thread)?;

    let mut tasks = JoinSet::new();
    tasks.spawn(watch_pods(client.clone(), shared.clone(), config.scheduler_name.clone()));
    tasks.spawn(watch_nodes(client.clone(), shared.clone()));
    tasks.spawn(watch_runtime_classes(client.clone(), shared.clone()));
    tasks.spawn(watch_namespaces(client.clone(), shared.clone()));
    tasks.spawn(act(client, shared, metrics, recorder, outcomes_rx));
    tracing::info!(scheduler = %config.scheduler_name, "scheduling");
    while let Some(done) = tasks.join_next().await {
        match done {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => {}
        }
    }
    Ok(())
}

/// The decision thread: pops pods and decides for each, while the cache is locked.
fn decide(shared: &Shared, metrics: &Metrics, outcomes: &mpsc::UnboundedSender<Outcome>) {
    let mut core = shared.lock();
    let mut next_gauges = Instant::now();
    while !shared.stop.load(Ordering::SeqCst) {
        let now = Instant::now();
        if !core.synced.all() {
            core = shared.wake.wait_timeout(core, IDLE_WAIT).unwrap_or_else(|e| e.into_inner()).0;
            continue;
        }
        core.queue.flush(now);
        if now >= core.next_expiry {
            for uid in core.cache.expire(now) {
                tracing::warn!(%uid, "binding not confirmed in time; the pod's place is free again");
            }
            core.next_expiry = now + Duration::from_secs(1);
        }
        if now >= next_gauges {
            metrics.pending(core.queue.counts());
            next_gauges = now + Duration::from_secs(1);
        }
        let Some(queued) = core.queue.pop(now) else {
            let wait = core.queue.next_wakeup().map_or(IDLE_WAIT, |t| t.saturating_duration_since(now)).min(IDLE_WAIT);
            core = shared.wake.wait_timeout(core, wait).unwrap_or_else(|e| e.into_inner()).0;
            continue;
        };
        let started = std::time::Instant::now();
        let Core { cache, queue, handlers, algorithm, .. } = &mut *core;
        match algorithm.schedule(&queued.pod, &cache.snapshot(), handlers) {
            Ok(placement) => {
                metrics.attempt(AttemptResult::Scheduled, started.elapsed());
                tracing::debug!(pod = %queued.pod.key(), node = %placement.node, evaluated = placement.evaluated, feasible = placement.feasible, "placed");
                cache.assume(PodInfo { node_name: placement.node.clone(), ..(*queued.pod).clone() });
                let _ = outcomes.send(Outcome::Bind { queued, node: placement.node });
            }
            Err(failure) => {
                metrics.attempt(AttemptResult::Unschedulable, started.elapsed());
                let message = failure.to_string();
                let report_condition = queued.reported_message.as_deref() != Some(message.as_str());
                tracing::debug!(pod = %queued.pod.key(), %message, "unschedulable");
                let plugins = match &failure {
                    Failure::Unfit(e) if e.num_all_nodes == 0 => Vec::new(),
                    f => f.plugins(),
                };
                queue.unschedulable(&queued.pod.uid, plugins, Some(message.clone()), now);
                let _ = outcomes.send(Outcome::Unschedulable { pod: queued.pod, message, report_condition });
            }
        }
    }
}

/// The async side of decisions: writes bindings, conditions and events.
async fn act(
    client: kube::Client,
    shared: Arc<Shared>,
    metrics: Metrics,
    recorder: Recorder,
    mut outcomes: mpsc::UnboundedReceiver<Outcome>,
) -> Result<(), Error> {
    let binds = Arc::new(Semaphore::new(PARALLEL_BINDS));
    let mut running = JoinSet::new();
    while let Some(outcome) = outcomes.recv().await {
        while running.try_join_next().is_some() {}
        match outcome {
            Outcome::Bind { queued, node } => {
                let permit = binds.clone().acquire_owned().await.expect("the semaphore is never closed");
                let (client, shared, metrics, recorder) =
                    (client.clone(), shared.clone(), metrics.clone(), recorder.clone());
                running.spawn(async move {
                    bind(&client, &shared, &metrics, &recorder, queued, &node).await;
                    drop(permit);
                });
            }
            Outcome::Unschedulable { pod, message, report_condition } => {
                recorder.emit(event(&pod, Type::Warning, "FailedScheduling", &message));
                if report_condition {
                    let client = client.clone();
                    running.spawn(async move { report_unschedulable(&client, &pod, &message).await });
                }
            }
        }
    }
    Ok(())
}

fn event(pod: &PodInfo, type_: Type, reason: &str, message: &str) -> PodEvent {
    PodEvent {
        namespace: pod.namespace.clone(),
        pod_name: pod.name.clone(),
        pod_uid: pod.uid.clone(),
        field_path: String::new(),
        type_,
        reason: reason.into(),
        message: message.into(),
    }
}

async fn bind(
    client: &kube::Client,
    shared: &Shared,
    metrics: &Metrics,
    recorder: &Recorder,
    queued: QueuedPod,
    node: &str,
) {
    let pod = &queued.pod;
    let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace);
    let binding = Binding {
        metadata: ObjectMeta {
            name: Some(pod.name.clone()),
            namespace: Some(pod.namespace.clone()),
            uid: Some(pod.uid.clone()),
            ..Default::default()
        },
        target: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(node.to_string()),
            ..Default::default()
        },
    };
    let result = api
        .create_subresource::<Binding, serde_json::Value>("binding", &pod.name, &PostParams::default(), &binding)
        .await;
    match result {
        Ok(_) => {
            shared.update(|core, now| {
                core.cache.finish_binding(&pod.uid, now);
                core.queue.done(&pod.uid);
            });
            if let Some(first) = queued.initial_attempt {
                metrics.bound(first.elapsed());
            }
            let message = format!("Successfully assigned {} to {node}", pod.key());
            recorder.emit(event(pod, Type::Normal, "Scheduled", &message));
        }
        Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => {
            // Gone, being deleted, or bound by someone else: the watch says what became of it.
            tracing::debug!(pod = %pod.key(), %node, reason = %status.message, "binding refused");
            shared.update(|core, _| {
                core.cache.forget(&pod.uid);
                core.queue.delete(&pod.uid);
            });
        }
        Err(e) => {
            metrics.attempt(AttemptResult::Error, std::time::Duration::ZERO);
            tracing::warn!(pod = %pod.key(), %node, error = %e, "binding failed; retrying after back-off");
            shared.update(|core, now| {
                core.cache.forget(&pod.uid);
                core.queue.error(&pod.uid, now);
            });
            recorder.emit(event(pod, Type::Warning, "FailedScheduling", &format!("Binding rejected: {e}")));
        }
    }
}

/// `PodScheduled=False`, reason `Unschedulable`, with the message that says why.
async fn report_unschedulable(client: &kube::Client, pod: &PodInfo, message: &str) {
    let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace);
    let patch = serde_json::json!({"status": {"conditions": [{
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": message,
        "lastProbeTime": null,
        "lastTransitionTime": jiff::Timestamp::now().to_string(),
    }]}});
    if let Err(e) = api.patch_status(&pod.name, &PatchParams::default(), &Patch::Strategic(&patch)).await {
        tracing::debug!(pod = %pod.key(), error = %e, "could not write the PodScheduled condition");
    }
}

/// Drives a watcher, calling `apply` for each object and `relisted` with the keys of a
/// complete list (to drop what vanished while the watch was down).
async fn watch<K, A, R>(api: Api<K>, what: &'static str, mut apply: A, mut relisted: R) -> Result<(), Error>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    A: FnMut(Event<K>),
    R: FnMut(HashSet<String>),
{
    let mut listing: Option<HashSet<String>> = None;
    let mut stream = watcher::watcher(api, watcher::Config::default()).default_backoff().boxed();
    while let Some(event) = stream.try_next().await.map_err(|source| Error::Watch { what, source })? {
        match &event {
            Event::Init => listing = Some(HashSet::new()),
            Event::InitApply(obj) => {
                if let (Some(seen), Some(uid)) = (listing.as_mut(), obj.meta().uid.clone()) {
                    seen.insert(uid);
                }
            }
            Event::InitDone => relisted(listing.take().unwrap_or_default()),
            _ => {}
        }
        apply(event);
    }
    Ok(())
}

async fn watch_pods(client: kube::Client, shared: Arc<Shared>, scheduler_name: String) -> Result<(), Error> {
    let apply_shared = shared.clone();
    watch(
        Api::<Pod>::all(client),
        "pods",
        move |event| match event {
            Event::Apply(pod) | Event::InitApply(pod) => {
                apply_shared.update(|core, now| on_pod(core, PodInfo::from_pod(&pod), &scheduler_name, now))
            }
            Event::Delete(pod) => {
                let uid = pod.metadata.uid.unwrap_or_default();
                apply_shared.update(|core, now| on_pod_gone(core, &uid, now))
            }
            Event::Init => {}
            Event::InitDone => apply_shared.update(|core, _| core.synced.pods = true),
        },
        |seen| {
            shared.update(|core, now| {
                let known = core.cache.confirmed_pods().into_iter().chain(core.queue.uids());
                for uid in known.filter(|u| !seen.contains(u)).collect::<Vec<_>>() {
                    on_pod_gone(core, &uid, now);
                }
            })
        },
    )
    .await
}

fn on_pod(core: &mut Core, pod: PodInfo, scheduler_name: &str, now: Instant) {
    if !pod.node_name.is_empty() {
        core.queue.delete(&pod.uid);
        if pod.finished {
            on_pod_gone(core, &pod.uid, now);
        } else if core.cache.add_pod(pod) {
            core.queue.on_event(ClusterEvent::AssignedPodAdded, now);
        }
    } else if core.cache.is_assumed(&pod.uid) {
        // Our binding is on its way; this is the pod as it was before.
    } else if pod.scheduler_name == scheduler_name && !pod.terminating && !pod.finished {
        core.queue.add(Arc::new(pod), now);
    } else {
        core.queue.delete(&pod.uid);
    }
}

fn on_pod_gone(core: &mut Core, uid: &str, now: Instant) {
    core.queue.delete(uid);
    if core.cache.remove_pod(uid) {
        core.queue.on_event(ClusterEvent::AssignedPodDeleted, now);
    }
}

async fn watch_nodes(client: kube::Client, shared: Arc<Shared>) -> Result<(), Error> {
    let apply_shared = shared.clone();
    // Nodes are keyed by name in the cache; the relist compares names.
    let names = Arc::new(Mutex::new(HashMap::<String, String>::new()));
    let names_for_relist = names.clone();
    watch(
        Api::<Node>::all(client),
        "nodes",
        move |event| match event {
            Event::Apply(node) | Event::InitApply(node) => {
                let spec = NodeSpec::from_node(&node);
                if let Some(uid) = node.metadata.uid.clone() {
                    names.lock().unwrap_or_else(|e| e.into_inner()).insert(uid, spec.name.clone());
                }
                apply_shared.update(|core, now| {
                    if core.cache.set_node(spec) {
                        core.queue.on_event(ClusterEvent::NodeChanged, now);
                    }
                })
            }
            Event::Delete(node) => {
                let name = node.metadata.name.unwrap_or_default();
                if let Some(uid) = node.metadata.uid {
                    names.lock().unwrap_or_else(|e| e.into_inner()).remove(&uid);
                }
                apply_shared.update(|core, _| core.cache.remove_node(&name));
            }
            Event::Init => {}
            Event::InitDone => apply_shared.update(|core, _| core.synced.nodes = true),
        },
        |seen| {
            let mut names = names_for_relist.lock().unwrap_or_else(|e| e.into_inner());
            let keep: HashSet<String> = seen.iter().filter_map(|uid| names.get(uid).cloned()).collect();
            names.retain(|uid, _| seen.contains(uid));
            shared.update(|core, _| {
                let gone: Vec<String> =
                    core.cache.node_names().filter(|n| !keep.contains(*n)).map(String::from).collect();
                for name in gone {
                    core.cache.remove_node(&name);
                }
            })
        },
    )
    .await
}

async fn watch_runtime_classes(client: kube::Client, shared: Arc<Shared>) -> Result<(), Error> {
    let apply_shared = shared.clone();
    let names = Arc::new(Mutex::new(HashMap::<String, String>::new()));
    let names_for_relist = names.clone();
    watch(
        Api::<RuntimeClass>::all(client),
        "runtimeclasses",
        move |event| match event {
            Event::Apply(class) | Event::InitApply(class) => {
                let name = class.metadata.name.clone().unwrap_or_default();
                if let Some(uid) = class.metadata.uid.clone() {
                    names.lock().unwrap_or_else(|e| e.into_inner()).insert(uid, name.clone());
                }
                apply_shared.update(|core, now| {
                    if core.handlers.insert(name, class.handler.clone()).as_ref() != Some(&class.handler) {
                        core.queue.on_event(ClusterEvent::RuntimeClassChanged, now);
                    }
                })
            }
            Event::Delete(class) => {
                let name = class.metadata.name.unwrap_or_default();
                apply_shared.update(|core, _| core.handlers.remove(&name));
            }
            Event::Init => {}
            Event::InitDone => apply_shared.update(|core, _| core.synced.classes = true),
        },
        |seen| {
            let names = names_for_relist.lock().unwrap_or_else(|e| e.into_inner());
            let keep: HashSet<&String> = seen.iter().filter_map(|uid| names.get(uid)).collect();
            shared.update(|core, _| core.handlers.retain(|name, _| keep.contains(name)));
        },
    )
    .await
}

async fn watch_namespaces(client: kube::Client, shared: Arc<Shared>) -> Result<(), Error> {
    let apply_shared = shared.clone();
    watch(
        Api::<Namespace>::all(client),
        "namespaces",
        move |event| match event {
            Event::Apply(ns) | Event::InitApply(ns) => {
                let name = ns.metadata.name.clone().unwrap_or_default();
                let labels = ns.metadata.labels.clone().unwrap_or_default();
                apply_shared.update(|core, now| {
                    if core.cache.set_namespace(&name, labels) {
                        core.queue.on_event(ClusterEvent::NamespaceChanged, now);
                    }
                })
            }
            Event::Delete(ns) => {
                let name = ns.metadata.name.unwrap_or_default();
                apply_shared.update(|core, _| core.cache.remove_namespace(&name));
            }
            Event::Init => {}
            Event::InitDone => apply_shared.update(|core, _| core.synced.namespaces = true),
        },
        |_| {},
    )
    .await
}
