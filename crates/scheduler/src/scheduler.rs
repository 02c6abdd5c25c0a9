//! The shell around the pure core: watches pods, nodes, RuntimeClasses and namespaces through
//! the Kubernetes API, runs decisions on a thread of its own, binds through `pods/binding`
//! concurrently, and reports failures as Kubernetes does (a `PodScheduled=False` condition and a
//! `FailedScheduling` event).
//!
//! The decision thread owns the cache and the queue outright: watches and binding results reach
//! it as [`Change`] messages, which it applies between two decisions, so neither side ever waits
//! for the other (parsing objects happens on the async side, in parallel with decisions).
//! Decisions wait for the first full list of pods, nodes, RuntimeClasses and namespaces, so a
//! new scheduler (say, after taking over the lease) never places a pod on a node whose pods it
//! has not seen. [`run`] holds every task it starts: dropping its future stops them all, and the
//! decision thread with them.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc as std_mpsc;
use std::time::Duration;

use berth_events::{PodEvent, Recorder, Source, Type};
use futures::StreamExt;
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
    #[error("the decision thread could not start")]
    Thread(#[source] std::io::Error),
}

/// The kinds the scheduler lists and watches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Pods,
    Nodes,
    Classes,
    Namespaces,
}

/// What the async side tells the decision thread.
enum Change {
    Pod(Box<PodInfo>),
    PodGone(String),
    Node(Box<NodeSpec>),
    NodeGone(String),
    Class {
        name: String,
        handler: String,
    },
    ClassGone(String),
    Namespace {
        name: String,
        labels: std::collections::BTreeMap<String, String>,
    },
    NamespaceGone(String),
    /// A full list of a kind came in, with the keys it held (UIDs of pods, names of the rest):
    /// whatever the thread holds beyond them vanished while the watch was down.
    Listed(Kind, HashSet<String>),
    /// The binding of this pod was written.
    Bound(String),
    /// The binding was refused because the pod is gone or bound elsewhere.
    BindRefused(String),
    /// The binding failed otherwise: try again after back-off.
    BindFailed(String),
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

/// Everything the decision thread owns.
struct Core {
    cache: Cache,
    queue: SchedulingQueue,
    /// RuntimeClass name → handler.
    handlers: HashMap<String, String>,
    algorithm: Algorithm,
    synced: Synced,
    scheduler_name: String,
}

impl Core {
    fn apply(&mut self, change: Change, now: Instant) {
        match change {
            Change::Pod(pod) => self.on_pod(*pod, now),
            Change::PodGone(uid) => self.on_pod_gone(&uid, now),
            Change::Node(spec) => {
                if self.cache.set_node(*spec) {
                    self.queue.on_event(ClusterEvent::NodeChanged, now);
                }
            }
            Change::NodeGone(name) => {
                self.cache.remove_node(&name);
            }
            Change::Class { name, handler } => {
                if self.handlers.get(&name) != Some(&handler) {
                    self.handlers.insert(name, handler);
                    self.queue.on_event(ClusterEvent::RuntimeClassChanged, now);
                }
            }
            Change::ClassGone(name) => {
                self.handlers.remove(&name);
            }
            Change::Namespace { name, labels } => {
                if self.cache.set_namespace(&name, labels) {
                    self.queue.on_event(ClusterEvent::NamespaceChanged, now);
                }
            }
            Change::NamespaceGone(name) => self.cache.remove_namespace(&name),
            Change::Listed(kind, seen) => self.listed(kind, &seen, now),
            Change::Bound(uid) => {
                self.cache.finish_binding(&uid, now);
                self.queue.done(&uid);
            }
            Change::BindRefused(uid) => {
                self.cache.forget(&uid);
                self.queue.delete(&uid);
            }
            Change::BindFailed(uid) => {
                self.cache.forget(&uid);
                self.queue.error(&uid, now);
            }
        }
    }

    fn listed(&mut self, kind: Kind, seen: &HashSet<String>, now: Instant) {
        match kind {
            Kind::Pods => {
                let known: Vec<String> = self.cache.confirmed_pods().into_iter().chain(self.queue.uids()).collect();
                for uid in known.iter().filter(|u| !seen.contains(*u)) {
                    self.on_pod_gone(uid, now);
                }
                self.synced.pods = true;
            }
            Kind::Nodes => {
                let gone: Vec<String> =
                    self.cache.node_names().filter(|n| !seen.contains(*n)).map(String::from).collect();
                for name in gone {
                    self.cache.remove_node(&name);
                }
                self.synced.nodes = true;
            }
            Kind::Classes => {
                self.handlers.retain(|name, _| seen.contains(name));
                self.synced.classes = true;
            }
            Kind::Namespaces => self.synced.namespaces = true,
        }
    }

    fn on_pod(&mut self, pod: PodInfo, now: Instant) {
        if !pod.node_name.is_empty() {
            self.queue.delete(&pod.uid);
            if pod.finished {
                self.on_pod_gone(&pod.uid, now);
            } else if self.cache.add_pod(pod) {
                self.queue.on_event(ClusterEvent::AssignedPodAdded, now);
            }
        } else if self.cache.is_assumed(&pod.uid) {
            // Our binding is on its way; this is the pod as it was before.
        } else if pod.scheduler_name == self.scheduler_name && !pod.terminating && !pod.finished {
            self.queue.add(Arc::new(pod), now);
        } else {
            self.queue.delete(&pod.uid);
        }
    }

    fn on_pod_gone(&mut self, uid: &str, now: Instant) {
        self.queue.delete(uid);
        if self.cache.remove_pod(uid) {
            self.queue.on_event(ClusterEvent::AssignedPodDeleted, now);
        }
    }
}

/// What the decision thread hands to the async side.
enum Outcome {
    Bind { queued: QueuedPod, node: String },
    Unschedulable { pod: Arc<PodInfo>, message: String, report_condition: bool },
}

/// Stops the decision thread when the future of [`run`] is dropped.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Schedules until the returned future is dropped.
pub async fn run(client: kube::Client, config: Config, metrics: Metrics) -> Result<(), Error> {
    let mut algorithm = Algorithm::default();
    algorithm.percentage_of_nodes_to_score = config.percentage_of_nodes_to_score;
    let core = Core {
        cache: Cache::new(),
        queue: SchedulingQueue::new(),
        handlers: HashMap::new(),
        algorithm,
        synced: Synced::default(),
        scheduler_name: config.scheduler_name.clone(),
    };
    let stop = Arc::new(AtomicBool::new(false));
    let _stop = StopOnDrop(stop.clone());
    let recorder =
        Recorder::spawn(client.clone(), Source { component: config.scheduler_name.clone(), host: None }, EVENT_QUEUE);
    let (outcomes_tx, outcomes_rx) = mpsc::unbounded_channel();
    let (changes_tx, changes_rx) = std_mpsc::channel();

    let thread_metrics = metrics.clone();
    std::thread::Builder::new()
        .name("berth-scheduler".into())
        .spawn(move || decide(core, &changes_rx, &stop, &thread_metrics, &outcomes_tx))
        .map_err(Error::Thread)?;

    let mut tasks = JoinSet::new();
    tasks.spawn(watch_pods(client.clone(), changes_tx.clone()));
    tasks.spawn(watch_nodes(client.clone(), changes_tx.clone()));
    tasks.spawn(watch_runtime_classes(client.clone(), changes_tx.clone()));
    tasks.spawn(watch_namespaces(client.clone(), changes_tx.clone()));
    tasks.spawn(act(client, changes_tx, metrics, recorder, outcomes_rx));
    tracing::info!(scheduler = %config.scheduler_name, "scheduling");
    while let Some(done) = tasks.join_next().await {
        if let Err(e) = done
            && e.is_panic()
        {
            std::panic::resume_unwind(e.into_panic());
        }
    }
    Ok(())
}

/// The decision thread: applies what changed, then pops a pod and decides for it; sleeps on the
/// channel when there is nothing to do. Ends when `stop` is set or every sender is gone.
fn decide(
    mut core: Core,
    changes: &std_mpsc::Receiver<Change>,
    stop: &AtomicBool,
    metrics: &Metrics,
    outcomes: &mpsc::UnboundedSender<Outcome>,
) {
    let mut next_expiry = Instant::now();
    let mut next_gauges = Instant::now();
    while !stop.load(Ordering::SeqCst) {
        let now = Instant::now();
        loop {
            match changes.try_recv() {
                Ok(change) => core.apply(change, now),
                Err(std_mpsc::TryRecvError::Empty) => break,
                Err(std_mpsc::TryRecvError::Disconnected) => return,
            }
        }
        let queued = if core.synced.all() {
            core.queue.flush(now);
            if now >= next_expiry {
                for uid in core.cache.expire(now) {
                    tracing::warn!(%uid, "binding not confirmed in time; the pod's place is free again");
                }
                next_expiry = now + Duration::from_secs(1);
            }
            if now >= next_gauges {
                metrics.pending(core.queue.counts());
                next_gauges = now + Duration::from_secs(1);
            }
            core.queue.pop(now)
        } else {
            None
        };
        let Some(queued) = queued else {
            let wait = match core.synced.all() {
                true => core.queue.next_wakeup().map_or(IDLE_WAIT, |t| t.saturating_duration_since(now)),
                false => IDLE_WAIT,
            };
            match changes.recv_timeout(wait.min(IDLE_WAIT)) {
                Ok(change) => core.apply(change, Instant::now()),
                Err(std_mpsc::RecvTimeoutError::Timeout) => {}
                Err(std_mpsc::RecvTimeoutError::Disconnected) => return,
            }
            continue;
        };
        let started = std::time::Instant::now();
        let Core { cache, queue, handlers, algorithm, .. } = &mut core;
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
    changes: std_mpsc::Sender<Change>,
    metrics: Metrics,
    recorder: Recorder,
    mut outcomes: mpsc::UnboundedReceiver<Outcome>,
) {
    let binds = Arc::new(Semaphore::new(PARALLEL_BINDS));
    let mut running = JoinSet::new();
    while let Some(outcome) = outcomes.recv().await {
        while running.try_join_next().is_some() {}
        match outcome {
            Outcome::Bind { queued, node } => {
                let permit = binds.clone().acquire_owned().await.expect("the semaphore is never closed");
                let (client, changes, metrics, recorder) =
                    (client.clone(), changes.clone(), metrics.clone(), recorder.clone());
                running.spawn(async move {
                    let change = bind(&client, &metrics, &recorder, &queued, &node).await;
                    let _ = changes.send(change);
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

/// Writes the binding; returns what the decision thread should make of the result.
async fn bind(client: &kube::Client, metrics: &Metrics, recorder: &Recorder, queued: &QueuedPod, node: &str) -> Change {
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
            if let Some(first) = queued.initial_attempt {
                metrics.bound(first.elapsed());
            }
            let message = format!("Successfully assigned {} to {node}", pod.key());
            recorder.emit(event(pod, Type::Normal, "Scheduled", &message));
            Change::Bound(pod.uid.clone())
        }
        Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => {
            // Gone, being deleted, or bound by someone else: the watch says what became of it.
            tracing::debug!(pod = %pod.key(), %node, reason = %status.message, "binding refused");
            Change::BindRefused(pod.uid.clone())
        }
        Err(e) => {
            metrics.attempt(AttemptResult::Error, std::time::Duration::ZERO);
            tracing::warn!(pod = %pod.key(), %node, error = %e, "binding failed; retrying after back-off");
            recorder.emit(event(pod, Type::Warning, "FailedScheduling", &format!("Binding rejected: {e}")));
            Change::BindFailed(pod.uid.clone())
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

/// Drives a watcher of `K`, turning each event into a [`Change`] for the decision thread, and
/// each complete list into [`Change::Listed`] with the keys it held.
async fn watch<K>(
    api: Api<K>,
    kind: Kind,
    changes: std_mpsc::Sender<Change>,
    key: impl Fn(&K) -> String,
    applied: impl Fn(K) -> Change,
    deleted: impl Fn(K) -> Change,
) where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    let stream = watcher::watcher(api, watcher::Config::default()).default_backoff();
    forward(stream, kind, &changes, key, applied, deleted).await;
}

/// Forwards a watcher's events until the stream or the decision thread ends.
async fn forward<K>(
    stream: impl futures::Stream<Item = Result<Event<K>, watcher::Error>>,
    kind: Kind,
    changes: &std_mpsc::Sender<Change>,
    key: impl Fn(&K) -> String,
    applied: impl Fn(K) -> Change,
    deleted: impl Fn(K) -> Change,
) {
    let what = match kind {
        Kind::Pods => "pods",
        Kind::Nodes => "nodes",
        Kind::Classes => "runtimeclasses",
        Kind::Namespaces => "namespaces",
    };
    let mut listing: Option<HashSet<String>> = None;
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = stream.next().await {
        // The watcher relists by itself after an error (a 410 once the store compacted past
        // the watch's revision, a dropped connection); the cache stays as it is meanwhile.
        let event = match event {
            Ok(event) => event,
            Err(error) => {
                tracing::warn!(kind = what, %error, "watch failed; the watcher lists again after back-off");
                continue;
            }
        };
        let change = match event {
            Event::Init => {
                listing = Some(HashSet::new());
                continue;
            }
            Event::InitApply(obj) => {
                if let Some(seen) = listing.as_mut() {
                    seen.insert(key(&obj));
                }
                applied(obj)
            }
            Event::InitDone => Change::Listed(kind, listing.take().unwrap_or_default()),
            Event::Apply(obj) => applied(obj),
            Event::Delete(obj) => deleted(obj),
        };
        if changes.send(change).is_err() {
            // The decision thread has stopped.
            return;
        }
    }
}

async fn watch_pods(client: kube::Client, changes: std_mpsc::Sender<Change>) {
    watch(
        Api::<Pod>::all(client),
        Kind::Pods,
        changes,
        |pod| pod.metadata.uid.clone().unwrap_or_default(),
        |pod| Change::Pod(Box::new(PodInfo::from_pod(&pod))),
        |pod| Change::PodGone(pod.metadata.uid.unwrap_or_default()),
    )
    .await
}

async fn watch_nodes(client: kube::Client, changes: std_mpsc::Sender<Change>) {
    watch(
        Api::<Node>::all(client),
        Kind::Nodes,
        changes,
        |node| node.metadata.name.clone().unwrap_or_default(),
        |node| Change::Node(Box::new(NodeSpec::from_node(&node))),
        |node| Change::NodeGone(node.metadata.name.unwrap_or_default()),
    )
    .await
}

async fn watch_runtime_classes(client: kube::Client, changes: std_mpsc::Sender<Change>) {
    watch(
        Api::<RuntimeClass>::all(client),
        Kind::Classes,
        changes,
        |class| class.metadata.name.clone().unwrap_or_default(),
        |class| Change::Class { name: class.metadata.name.unwrap_or_default(), handler: class.handler },
        |class| Change::ClassGone(class.metadata.name.unwrap_or_default()),
    )
    .await
}

async fn watch_namespaces(client: kube::Client, changes: std_mpsc::Sender<Change>) {
    watch(
        Api::<Namespace>::all(client),
        Kind::Namespaces,
        changes,
        |ns| ns.metadata.name.clone().unwrap_or_default(),
        |ns| Change::Namespace {
            name: ns.metadata.name.unwrap_or_default(),
            labels: ns.metadata.labels.unwrap_or_default(),
        },
        |ns| Change::NamespaceGone(ns.metadata.name.unwrap_or_default()),
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn namespace(name: &str) -> Namespace {
        Namespace { metadata: ObjectMeta { name: Some(name.into()), ..Default::default() }, ..Default::default() }
    }

    fn gone() -> watcher::Error {
        let mut status = kube::core::Status::failure("too old resource version: 5 (9)", "Expired");
        status.code = 410;
        watcher::Error::WatchError(Box::new(status))
    }

    #[tokio::test]
    async fn a_failed_watch_is_listed_again_instead_of_ending_the_scheduler() {
        let events = vec![
            Ok(Event::Init),
            Ok(Event::InitApply(namespace("old"))),
            Ok(Event::InitDone),
            Err(gone()),
            Ok(Event::Init),
            Ok(Event::InitApply(namespace("kept"))),
            Ok(Event::InitDone),
            Ok(Event::Apply(namespace("after"))),
        ];
        let (tx, rx) = std_mpsc::channel();
        forward(
            futures::stream::iter(events),
            Kind::Namespaces,
            &tx,
            |ns: &Namespace| ns.metadata.name.clone().unwrap_or_default(),
            |ns| Change::Namespace { name: ns.metadata.name.unwrap_or_default(), labels: Default::default() },
            |ns| Change::NamespaceGone(ns.metadata.name.unwrap_or_default()),
        )
        .await;
        drop(tx);
        let seen: Vec<String> = rx
            .iter()
            .map(|change| match change {
                Change::Namespace { name, .. } => format!("apply {name}"),
                Change::Listed(_, keys) => format!("listed {keys:?}"),
                _ => "other".into(),
            })
            .collect();
        assert_eq!(
            seen,
            [r#"apply old"#, r#"listed {"old"}"#, "apply kept", r#"listed {"kept"}"#, "apply after"],
            "the second list replaces the first, and events after it still arrive"
        );
    }
}
