//! One pod on this node, driven through CRI by a state machine (kube-runtime's watcher shape):
//! [`Worker::step`] advances [`State`] by one step and says when to step again; errors go to the
//! run loop's retry policy, and nothing panics the loop.
//!
//! ```text
//! Resolve ──► Running ──► Finished ──┐        (any state) ──► Terminating ──► Done
//!   │  ▲         (phase Succeeded/   │         deletionTimestamp set,
//!   ▼  │          Failed: sandbox    │         or the pod left the API
//! NoRuntime       stopped, logs kept)┘
//! ```
//!
//! - **Resolve**: RuntimeClass → handler (a missing class fails the pod, `RuntimeClassNotFound`)
//!   → the endpoint holding the pod already (recovered), or the one the runtime manager selects.
//! - **NoRuntime**: no endpoint serves the handler (`RuntimeHandlerNotFound`); retried with
//!   back-off and whenever the runtimes change.
//! - **Running**: level-triggered like kubelet's `SyncPod`: volumes, the sandbox (found again
//!   after a restart, re-created when it died), then the [`plan`](super::plan) for the
//!   containers, the status patched when it changed.
//! - **Terminating**: preStop hooks and `StopContainer` within the grace period, final status,
//!   sandboxes and volumes removed, then the API object deleted with grace 0 and a UID
//!   precondition.
//!
//! Recovery needs no special state: a worker always looks for the pod's sandbox and containers
//! (by the standard labels) before creating anything, so an agent restart adopts what runs.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use jiff::Timestamp;
use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::node::v1::RuntimeClass;
use kube::api::{Api, DeleteParams, Preconditions};
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::{Notify, Semaphore, watch};

use super::actions::{self, Action, Outcome, Target};
use super::backoff::{self, Backoff};
use super::cgroups::{self, Cgroups};
use super::cri::{self as cricalls, CriError};
use super::dns::NodeDns;
use super::env::{self, PodContext, Sources};
use super::hosts;
use super::images::{self, PullPolicy};
use super::labels;
use super::mount::Mounter;
use super::plan::{self, Step};
use super::probe::{self, Prober, Sink};
use super::spec;
use super::status::{self, ContainerView, Instance, InstanceState, Observed, Waiting};
use super::status_writer::StatusWriter;
use super::tokens::{self, Token, TokenKey};
use super::volumes::{self, Prepared};
use super::wake::{Expected, Wake};
use crate::endpoint::Endpoint;
use crate::runtimes::{RuntimeManager, SERVICE_ANNOTATION, SelectError};
use berth_events::{self as events, PodEvent, Recorder};

/// How often a running pod is looked at without being woken, on a runtime without a connected
/// container event stream (containerd 1.6 has none).
pub const POLL: Duration = Duration::from_secs(10);
/// The same on a runtime whose events wake the pod: kubelet's default sync frequency.
pub const RESYNC: Duration = Duration::from_secs(60);
/// How often configMap, secret and downwardAPI volumes are rewritten from the API.
const VOLUME_REFRESH: Duration = Duration::from_secs(60);
/// How soon a container that could not start for want of something (a ConfigMap, a Secret, a
/// volume) is tried again.
const BLOCKED_RETRY: Duration = Duration::from_secs(5);
/// How often a pod that may be on a runtime not listed yet looks again (the listing also wakes it).
const INVENTORY_WAIT: Duration = Duration::from_secs(5);
/// How long the final status may take to be written before the pod object is deleted anyway.
const FINAL_STATUS_WAIT: Duration = Duration::from_secs(10);
/// kubelet's floor for a container's stop timeout.
const MIN_GRACE_SECONDS: i64 = 2;
/// The component pod events are reported as (kubelet's, so that tools filtering on it find them).
pub const EVENT_COMPONENT: &str = "kubelet";
/// Events waiting to be written beyond this many are dropped (kubelet's broadcaster keeps 1000).
pub const EVENT_QUEUE: usize = 1000;

/// What every worker shares.
pub struct Context {
    pub client: kube::Client,
    pub node_name: String,
    pub runtimes: Arc<RuntimeManager>,
    pub runtime_classes: Store<RuntimeClass>,
    /// Every Service, for the containers' Service variables.
    pub services: Store<core::Service>,
    pub root_dir: PathBuf,
    pub pod_log_dir: PathBuf,
    pub dns: NodeDns,
    /// The node's addresses (InternalIP first), for `hostIP(s)` and host-network pods.
    pub host_ips: RwLock<Vec<String>>,
    pub events: Recorder,
    pub mounter: Arc<dyn Mounter>,
    pub cgroups: Arc<dyn Cgroups>,
    pub memory_capacity: i64,
    pub cpu_millis: i64,
    /// Wakes a pod's worker when its runtime reports a container event, by pod UID.
    pub wakers: Mutex<HashMap<String, Arc<Wake>>>,
    /// Bounds the pods' concurrent status writes and deletions: the client speaks HTTP/1.1, so
    /// each concurrent request is a connection of its own, kept idle in its pool afterwards.
    pub api_writes: Arc<Semaphore>,
}

/// How many status writes and deletions of pods may be in flight at once (see `api_writes`).
pub const API_WRITES: usize = 4;

impl Context {
    fn host_ips(&self) -> Vec<String> {
        self.host_ips.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn runtime_name(&self, endpoint: &Endpoint) -> String {
        let name = self
            .runtimes
            .endpoints()
            .into_iter()
            .find(|(e, _)| e.name == endpoint.name)
            .map(|(_, s)| s.runtime_name)
            .unwrap_or_default();
        if name.is_empty() { endpoint.name.clone() } else { name }
    }
}

/// What to do after a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    Now,
    After(Duration),
    /// Only a change (to the pod, the runtimes, a probe) wakes the worker.
    Idle,
    Exit,
}

/// Why a step failed; the run loop retries with back-off.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error(transparent)]
    Cri(#[from] CriError),
    #[error("{action} of pod {pod}")]
    Api {
        action: &'static str,
        pod: String,
        #[source]
        source: kube::Error,
    },
    #[error("cleaning up the directory of pod {pod}")]
    Cleanup {
        pod: String,
        #[source]
        source: std::io::Error,
    },
}

/// Where the pod is in its life on this node.
#[derive(Clone, Debug, PartialEq)]
pub enum State {
    Resolve,
    NoRuntime(SelectError),
    Running,
    Finished { stopped: bool },
    Terminating,
    Done,
}

/// The endpoint and sandbox of a pod that has one.
#[derive(Clone, Debug)]
struct PodRuntime {
    endpoint: Arc<Endpoint>,
    handler: String,
    runtime_name: String,
    sandbox: Option<Sandbox>,
}

#[derive(Clone, Debug)]
struct Sandbox {
    id: String,
    config: cri::PodSandboxConfig,
    ips: Vec<String>,
    ready: bool,
}

struct ProbeTask {
    task: tokio::task::JoinHandle<()>,
    sink: Arc<Sink>,
}

impl Drop for ProbeTask {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One pod's worker.
pub struct Worker {
    ctx: Arc<Context>,
    uid: String,
    pod: Arc<core::Pod>,
    /// False once the pod left the API (deleted, or never there: an orphan found at start).
    in_api: bool,
    state: State,
    rt: Option<PodRuntime>,
    /// The status last written (or read from the API at start).
    status: Option<core::PodStatus>,
    restarts: Backoff,
    pulls: Backoff,
    /// Last pull failure per image key: when and why.
    pull_failures: HashMap<String, (Timestamp, String)>,
    /// Why each container waits, when known (kubelet's reason cache).
    waiting: HashMap<String, Waiting>,
    /// Exited instances don't change: their status is read once.
    exited: HashMap<String, Instance>,
    probes: HashMap<String, ProbeTask>,
    volumes: Option<(HashMap<String, Prepared>, tokio::time::Instant)>,
    /// The service account tokens of the pod's projected volumes, kept until due for refresh.
    tokens: HashMap<TokenKey, Token>,
    /// The last RuntimeHandlerNotFound message reported, so it is reported once.
    reported_select: Option<String>,
    select_retry: Duration,
    /// Waiting for unlisted runtimes was logged.
    reported_unlisted: bool,
    wake: Arc<Wake>,
    /// Container events this worker caused, which need not wake it.
    expected: Expected,
    /// Wakes the worker when a probe's results change.
    probe_changed: Arc<Notify>,
    /// A container could not be created because the sandbox is going away.
    sandbox_suspect: bool,
    /// The sandbox was found or created by the step before: the next need not ask about it.
    sandbox_just_seen: bool,
    /// Every runtime's pods were listed and none was this pod's, and no sandbox was asked for
    /// since: listing the pod's sandboxes and containers would find nothing (a pod new here).
    nothing_on_node: bool,
    /// Images of the containers the pod starts first, looked up while its sandbox was created:
    /// image → its ID, `None` when not present. For the starts of the same step only.
    images_looked_up: HashMap<String, Option<String>>,
    /// The supervisor's channel of pod updates, once running.
    pods: Option<watch::Receiver<Option<Arc<core::Pod>>>>,
    /// Writes the status to the API, from the first write on.
    status_writer: Option<StatusWriter>,
}

fn field_path(name: &str, init: bool) -> String {
    if init { format!("spec.initContainers{{{name}}}") } else { format!("spec.containers{{{name}}}") }
}

impl Worker {
    /// A worker for a pod of the API (`in_api`) or for an orphan found in a runtime.
    pub fn new(ctx: Arc<Context>, pod: Arc<core::Pod>, in_api: bool) -> Worker {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let wake = Arc::new(Wake::default());
        ctx.wakers.lock().unwrap_or_else(|e| e.into_inner()).insert(uid.clone(), wake.clone());
        Worker {
            status: pod.status.clone(),
            ctx,
            uid,
            pod,
            in_api,
            state: if in_api { State::Resolve } else { State::Terminating },
            rt: None,
            restarts: Backoff::default(),
            pulls: Backoff::default(),
            pull_failures: HashMap::new(),
            waiting: HashMap::new(),
            exited: HashMap::new(),
            probes: HashMap::new(),
            volumes: None,
            tokens: HashMap::new(),
            reported_select: None,
            select_retry: Duration::from_secs(1),
            reported_unlisted: false,
            wake,
            expected: Expected::default(),
            probe_changed: Arc::new(Notify::new()),
            sandbox_suspect: false,
            sandbox_just_seen: false,
            nothing_on_node: false,
            images_looked_up: HashMap::new(),
            pods: None,
            status_writer: None,
        }
    }

    /// The newest pod from the API; `None` when it left the API.
    pub fn update(&mut self, pod: Option<Arc<core::Pod>>) {
        match pod {
            Some(p) => self.pod = p,
            None => self.in_api = false,
        }
    }

    fn spec(&self) -> &core::PodSpec {
        static EMPTY: std::sync::OnceLock<core::PodSpec> = std::sync::OnceLock::new();
        self.pod.spec.as_ref().unwrap_or_else(|| EMPTY.get_or_init(core::PodSpec::default))
    }

    fn names(&self) -> (String, String) {
        let (name, ns, _) = spec::metadata(&self.pod);
        (name.to_string(), ns.to_string())
    }

    /// `name_namespace(uid)`, as kubelet names pods in messages.
    fn pod_ref(&self) -> String {
        let (name, ns) = self.names();
        format!("{name}_{ns}({})", self.uid)
    }

    fn deleting(&self) -> bool {
        !self.in_api || self.pod.metadata.deletion_timestamp.is_some()
    }

    fn event(&self, type_: events::Type, field_path: &str, reason: &str, message: impl Into<String>) {
        let (name, ns) = self.names();
        self.ctx.events.emit(PodEvent {
            namespace: ns,
            pod_name: name,
            pod_uid: self.uid.clone(),
            field_path: field_path.to_string(),
            type_,
            reason: reason.to_string(),
            message: message.into(),
        });
    }

    /// Runs the worker until its pod is gone from the node: steps, and sleeps between steps
    /// until woken by a pod update, a runtime change, a probe or a container event.
    pub async fn run(mut self, mut pods: watch::Receiver<Option<Arc<core::Pod>>>) {
        let mut runtime_changes = self.ctx.runtimes.changes();
        self.pods = Some(pods.clone());
        let mut retry = Duration::from_millis(500);
        loop {
            // `changed()` below marks the value seen: always take the newest here.
            let pod = pods.borrow_and_update().clone();
            self.update(pod);
            // Boxed: a step's future is large (tens of KiB), and a worker rests most of the time.
            let next = match Box::pin(self.step()).await {
                Ok(next) => {
                    retry = Duration::from_millis(500);
                    next
                }
                Err(e) => {
                    tracing::warn!(pod = %self.pod_ref(), state = ?self.state, error = %berth_common::error::error_chain(&e), retry_in = ?retry, "pod step failed");
                    let next = Next::After(retry);
                    retry = (retry * 2).min(Duration::from_secs(30));
                    next
                }
            };
            tracing::trace!(pod = %self.pod_ref(), state = ?self.state, ?next, "pod step done");
            let wait = match next {
                Next::Now => continue,
                Next::Exit => break,
                Next::After(d) => d,
                Next::Idle => Duration::from_secs(3600),
            };
            let deadline = tokio::time::Instant::now() + wait;
            // Waits for something the worker did not cause itself.
            let stopping = loop {
                tokio::select! {
                    // The supervisor is gone when this fails: the agent is stopping; containers
                    // keep running.
                    changed = pods.changed() => break changed.is_err(),
                    _ = runtime_changes.changed() => break false,
                    _ = self.probe_changed.notified() => break false,
                    _ = self.wake.notified() => {
                        if self.expected.needs_sync(&self.wake) {
                            break false;
                        }
                    }
                    _ = tokio::time::sleep_until(deadline) => break false,
                }
            };
            if stopping {
                break;
            }
        }
        self.ctx.wakers.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.uid);
    }

    /// Advances the state machine by one step.
    pub async fn step(&mut self) -> Result<Next, WorkerError> {
        if self.deleting() && !matches!(self.state, State::Terminating | State::Done) {
            tracing::info!(pod = %self.pod_ref(), "terminating pod");
            self.state = State::Terminating;
        }
        match self.state.clone() {
            State::Resolve => self.resolve().await,
            State::NoRuntime(_) => {
                self.state = State::Resolve;
                Ok(Next::Now)
            }
            State::Running => self.sync().await,
            State::Finished { stopped } => self.finish(stopped).await,
            State::Terminating => self.terminate().await,
            State::Done => Ok(Next::Exit),
        }
    }

    // ---- Resolve ----------------------------------------------------------------------------

    /// The handler of the pod's RuntimeClass (`""` without one); `Err(name)` if the class is missing.
    async fn handler(&self) -> Result<Result<String, String>, WorkerError> {
        let Some(class) = self.spec().runtime_class_name.clone().filter(|c| !c.is_empty()) else {
            return Ok(Ok(String::new()));
        };
        if let Some(rc) = self.ctx.runtime_classes.get(&ObjectRef::new(&class)) {
            return Ok(Ok(rc.handler.clone()));
        }
        // The cache may lag behind a class created a moment ago: the API decides.
        let api: Api<RuntimeClass> = Api::all(self.ctx.client.clone());
        match api.get_opt(&class).await {
            Ok(Some(rc)) => Ok(Ok(rc.handler)),
            Ok(None) => Ok(Err(class)),
            Err(source) => Err(WorkerError::Api { action: "reading the RuntimeClass", pod: self.pod_ref(), source }),
        }
    }

    /// Whether an agent took this pod up before (it has a `startTime`) while a runtime whose pods
    /// were never listed (unreachable since this agent started) may hold its sandbox.
    fn may_run_on_an_unlisted_runtime(&mut self) -> bool {
        let started = self.status.as_ref().is_some_and(|s| s.start_time.is_some());
        let unlisted: Vec<String> = self.ctx.runtimes.uninventoried().iter().map(|e| e.name.clone()).collect();
        if !started || unlisted.is_empty() {
            return false;
        }
        if !self.reported_unlisted {
            self.reported_unlisted = true;
            tracing::info!(pod = %self.pod_ref(), runtimes = ?unlisted, "waiting for runtimes that may hold the pod to answer before starting it");
        }
        true
    }

    async fn resolve(&mut self) -> Result<Next, WorkerError> {
        let finished = matches!(self.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"));
        if finished && self.ctx.runtimes.endpoint_of(&self.uid).is_none() {
            // Finished before this agent started and nothing of it on the node: nothing to do.
            self.state = State::Finished { stopped: true };
            return Ok(Next::Idle);
        }
        let handler = match self.handler().await? {
            Ok(h) => h,
            Err(class) => {
                // The seed's choice over today's kubelet (which retries forever): fail the pod.
                let message = format!("RuntimeClass {class:?} not found");
                self.event(events::Type::Warning, "", "RuntimeClassNotFound", &message);
                let mut status =
                    status::pod_status(&self.pod, &self.observed(&[], false), self.status.as_ref(), Timestamp::now());
                status.phase = Some("Failed".into());
                status.reason = Some("RuntimeClassNotFound".into());
                status.message = Some(message);
                self.write_status(status, false).await?;
                self.state = State::Finished { stopped: true };
                return Ok(Next::Idle);
            }
        };
        let pinned = self.pod.metadata.annotations.as_ref().and_then(|a| a.get(SERVICE_ANNOTATION)).cloned();
        self.nothing_on_node =
            self.ctx.runtimes.endpoint_name_of(&self.uid).is_none() && self.ctx.runtimes.uninventoried().is_empty();
        let endpoint = match self.ctx.runtimes.endpoint_of(&self.uid) {
            Some(ep) => ep,
            None if self.may_run_on_an_unlisted_runtime() => {
                // Starting it elsewhere could run it twice: wait until those runtimes answer.
                return Ok(Next::After(INVENTORY_WAIT));
            }
            None => match self.ctx.runtimes.select(&handler, pinned.as_deref()) {
                Ok(ep) => ep,
                Err(e) => return self.no_runtime(e).await,
            },
        };
        self.ctx.runtimes.remember(&self.uid, &endpoint.name);
        tracing::debug!(pod = %self.pod_ref(), endpoint = %endpoint.name, handler, "pod resolved");
        let runtime_name = self.ctx.runtime_name(&endpoint);
        self.rt = Some(PodRuntime { endpoint, handler, runtime_name, sandbox: None });
        self.reported_select = None;
        self.select_retry = Duration::from_secs(1);
        self.state = if finished { State::Finished { stopped: false } } else { State::Running };
        Ok(Next::Now)
    }

    async fn no_runtime(&mut self, error: SelectError) -> Result<Next, WorkerError> {
        let message = error.to_string();
        if self.reported_select.as_deref() != Some(message.as_str()) {
            tracing::info!(pod = %self.pod_ref(), %message, "no runtime for the pod's handler");
            self.event(events::Type::Warning, "", error.reason(), &message);
            self.reported_select = Some(message);
        }
        self.state = State::NoRuntime(error);
        self.report(&[], false).await?;
        let wait = self.select_retry;
        self.select_retry = (self.select_retry * 2).min(Duration::from_secs(60));
        Ok(Next::After(wait))
    }

    // ---- Running ----------------------------------------------------------------------------

    async fn sync(&mut self) -> Result<Next, WorkerError> {
        let Some(rt) = self.rt.clone() else {
            self.state = State::Resolve;
            return Ok(Next::Now);
        };
        // Images looked up in an earlier step may have been removed since.
        self.images_looked_up.clear();
        if let Some(next) = self.ensure_volumes(&rt).await? {
            self.report(&[], false).await?;
            return Ok(next);
        }
        let mut instances = if self.nothing_on_node { Vec::new() } else { self.observe(&rt).await? };
        let sandbox_ok = rt.sandbox.as_ref().is_some_and(|s| s.ready);
        let sandbox_ok = sandbox_ok && (std::mem::take(&mut self.sandbox_just_seen) || self.check_sandbox(&rt).await?);
        if !sandbox_ok {
            match self.ensure_sandbox(&instances).await? {
                // Nothing ran in the pod yet: what was observed still holds, go on with it.
                SandboxOutcome::Ready if instances.is_empty() => self.sandbox_just_seen = false,
                SandboxOutcome::Ready => return Ok(Next::Now),
                SandboxOutcome::Retry(next) => {
                    self.report(&instances, false).await?;
                    return Ok(next);
                }
                SandboxOutcome::NotRecreated => {}
            }
        }
        let rt = self.rt.clone().unwrap_or(rt);
        loop {
            match self.act(&rt, &mut instances).await? {
                Acted::Next(next) => return Ok(next),
                // Only starts: one ContainerStatus per started container instead of observing the
                // whole pod again (the status that shows them running is written sooner).
                Acted::Started(ids) => self.refresh(&rt, &mut instances, &ids).await?,
            }
        }
    }

    /// Looks again at just the containers `ids`, in `instances`.
    async fn refresh(
        &mut self,
        rt: &PodRuntime,
        instances: &mut Vec<Instance>,
        ids: &[String],
    ) -> Result<(), WorkerError> {
        let sandbox_id = rt.sandbox.as_ref().map(|s| s.id.clone()).unwrap_or_default();
        for id in ids {
            let Some(s) = cricalls::container_status(&rt.endpoint, id).await? else {
                instances.retain(|i| &i.id != id);
                continue;
            };
            let inst = self.instance(&s, sandbox_id.clone());
            match instances.iter_mut().find(|i| &i.id == id) {
                Some(slot) => *slot = inst,
                None => instances.push(inst),
            }
        }
        sort_instances(instances);
        Ok(())
    }

    /// Plans from `instances`, reports the status, and takes the plan's steps.
    async fn act(&mut self, rt: &PodRuntime, instances: &mut Vec<Instance>) -> Result<Acted, WorkerError> {
        let sandbox_id = rt.sandbox.as_ref().map(|s| s.id.clone()).unwrap_or_default();
        self.sync_probes(rt, instances);
        let mut probes = plan::ProbeView::default();
        for (id, task) in &self.probes {
            let r = task.sink.results.lock().unwrap_or_else(|e| e.into_inner());
            if r.failed.is_some() {
                probes.failed.insert(id.clone());
            }
            if !r.started {
                probes.unstarted.insert(id.clone());
            }
        }
        let now = Timestamp::now();
        let plan = if rt.sandbox.is_some() {
            plan::plan(self.spec(), instances, &sandbox_id, &probes, &self.restarts, now)
        } else {
            plan::Plan::default()
        };
        let mut wake_at: Option<Timestamp> = None;
        for (name, remaining) in &plan.backing_off {
            let message = format!(
                "back-off {} restarting failed container={name} pod={}",
                backoff::go_duration(remaining.delay),
                self.pod_ref()
            );
            if self.waiting.get(name).is_none_or(|w| w.message != message) {
                let init = self.is_init(name);
                self.event(
                    events::Type::Warning,
                    &field_path(name, init),
                    "BackOff",
                    format!("Back-off restarting failed container {name} in pod {}", self.pod_ref()),
                );
            }
            self.waiting.insert(name.clone(), Waiting::new("CrashLoopBackOff", message));
            wake_at = Some(wake_at.map_or(remaining.until, |w| w.min(remaining.until)));
        }
        // With containers to start, what this shows is about to change.
        let only_starts = plan.steps.iter().all(|s| matches!(s, Step::Start { .. } | Step::StartCreated { .. }));
        let deferred = !plan.steps.is_empty() && only_starts;
        let status = self.report_with(instances, false, deferred).await?;
        if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
            if status.reason.as_deref() == Some(status::DEADLINE_EXCEEDED) {
                self.event(events::Type::Normal, "", status::DEADLINE_EXCEEDED, status::DEADLINE_EXCEEDED_MESSAGE);
            }
            tracing::info!(pod = %self.pod_ref(), phase = ?status.phase, "pod finished");
            self.state = State::Finished { stopped: false };
            return Ok(Acted::Next(Next::Now));
        }
        self.collect_old_instances(rt, instances).await?;
        if plan.steps.is_empty() {
            let wake_at = match (wake_at, self.deadline()) {
                (Some(w), Some(d)) => Some(w.min(d)),
                (w, d) => w.or(d),
            };
            let until_wake = wake_at
                .map(|w| Duration::try_from(w.duration_since(Timestamp::now())).unwrap_or_default())
                .map(|d| d + Duration::from_millis(50));
            let poll = if rt.endpoint.events_live.load(Ordering::Relaxed) { RESYNC } else { POLL };
            return Ok(Acted::Next(Next::After(until_wake.map_or(poll, |d| d.min(poll)))));
        }
        let mut progressed = false;
        let mut started = Vec::new();
        for step in plan.steps {
            match step {
                Step::Kill { id, name } => {
                    let (kind, _) = self
                        .probes
                        .get(&id)
                        .and_then(|p| p.sink.results.lock().unwrap_or_else(|e| e.into_inner()).failed.clone())
                        .unwrap_or((probe::Kind::Liveness, String::new()));
                    let init = self.is_init(&name);
                    self.event(
                        events::Type::Normal,
                        &field_path(&name, init),
                        "Killing",
                        format!("Container {name} failed {} probe, will be restarted", kind.name().to_lowercase()),
                    );
                    self.probes.remove(&id);
                    let grace = self.spec().termination_grace_period_seconds.unwrap_or(30);
                    let c = self.container_spec(&name).cloned();
                    stop_with_hook(rt, &id, c.as_ref(), self.target(rt, &id, c.as_ref()), grace, None).await?;
                    progressed = true;
                }
                Step::Replace { id, name, restart_count } => {
                    let init = self.is_init(&name);
                    self.event(
                        events::Type::Normal,
                        &field_path(&name, init),
                        "Killing",
                        format!("Container {name} definition changed, will be restarted"),
                    );
                    self.probes.remove(&id);
                    let grace = self.spec().termination_grace_period_seconds.unwrap_or(30);
                    let c = self.container_spec(&name).cloned();
                    stop_with_hook(rt, &id, c.as_ref(), self.target(rt, &id, c.as_ref()), grace, None).await?;
                    self.restarts.forget(&name);
                    self.start_container(rt, &name, init, restart_count).await?;
                    progressed = true;
                }
                Step::StartCreated { id, name } => {
                    cricalls::start_container(&rt.endpoint, &id).await?;
                    self.expected.started(&id);
                    tracing::info!(pod = %self.pod_ref(), container = %name, "started a container created before a restart");
                    progressed = true;
                    started.push(id);
                }
                Step::Start { name, init, restart_count } => {
                    if restart_count > 0 {
                        let finished = instances.iter().find(|i| i.name == name).and_then(|i| i.finished_at);
                        self.restarts.attempt(&name, finished.unwrap_or(now), Timestamp::now());
                    }
                    // A container that cannot start now (pull, config) does not hold the others up;
                    // an init container does, by being the only step.
                    if let Some(id) = self.start_container(rt, &name, init, restart_count).await? {
                        progressed = true;
                        started.push(id);
                    }
                }
            }
        }
        if progressed {
            // After anything but starts, the whole pod is observed again.
            return Ok(if only_starts { Acted::Started(started) } else { Acted::Next(Next::Now) });
        }
        if std::mem::take(&mut self.sandbox_suspect) {
            return Ok(Acted::Next(Next::After(Duration::from_millis(200))));
        }
        // Nothing could start: show why, and come back when a back-off ends (or soon, for
        // errors without one, such as a ConfigMap still missing).
        self.report(instances, false).await?;
        let now = Timestamp::now();
        let pull_retry = self
            .pull_failures
            .iter()
            .filter_map(|(key, (at, _))| self.pulls.remaining(key, *at, now))
            .map(|r| Duration::try_from(r.until.duration_since(now)).unwrap_or_default() + Duration::from_millis(50))
            .min();
        // Within a pull back-off, a step shows ImagePullBackOff; at its end, the pull is retried.
        Ok(Acted::Next(Next::After(pull_retry.map_or(BLOCKED_RETRY, |d| d.min(BLOCKED_RETRY)))))
    }

    fn is_init(&self, name: &str) -> bool {
        self.spec().init_containers.iter().flatten().any(|c| c.name == name)
    }

    fn container_spec(&self, name: &str) -> Option<&core::Container> {
        let spec = self.spec();
        spec.containers.iter().chain(spec.init_containers.iter().flatten()).find(|c| c.name == name)
    }

    fn pod_context(&self, rt: Option<&PodRuntime>) -> PodContext {
        let host_ips = self.ctx.host_ips();
        let pod_ips = if self.spec().host_network == Some(true) {
            host_ips.clone()
        } else {
            rt.and_then(|r| r.sandbox.as_ref()).map(|s| s.ips.clone()).unwrap_or_default()
        };
        PodContext {
            host_ips,
            pod_ips,
            node_cpu_millis: self.ctx.cpu_millis,
            node_memory_bytes: self.ctx.memory_capacity,
        }
    }

    async fn fetch_sources(&self) -> Result<Sources, WorkerError> {
        let (mut cms, mut secrets) = env::referenced(self.spec());
        let (vcms, vsecrets) = volumes::referenced(self.spec());
        cms.extend(vcms);
        secrets.extend(vsecrets);
        cms.sort();
        cms.dedup();
        secrets.sort();
        secrets.dedup();
        let (_, ns) = self.names();
        let mut sources = Sources::default();
        let cm_api: Api<core::ConfigMap> = Api::namespaced(self.ctx.client.clone(), &ns);
        for name in cms {
            let cm = cm_api.get_opt(&name).await.map_err(|source| WorkerError::Api {
                action: "reading a ConfigMap",
                pod: self.pod_ref(),
                source,
            })?;
            sources.config_maps.insert(name, cm.as_ref().map(env::config_map_data));
        }
        let secret_api: Api<core::Secret> = Api::namespaced(self.ctx.client.clone(), &ns);
        for name in secrets {
            let s = secret_api.get_opt(&name).await.map_err(|source| WorkerError::Api {
                action: "reading a Secret",
                pod: self.pod_ref(),
                source,
            })?;
            sources.secrets.insert(name, s.as_ref().map(env::secret_data));
        }
        sources.services = self.linked_services(&ns);
        Ok(sources)
    }

    /// The Services whose variables the containers get (kubelet's service links).
    fn linked_services(&self, ns: &str) -> Vec<core::Service> {
        let candidates = self.ctx.services.state().into_iter().filter(|s| {
            let svc_ns = s.metadata.namespace.as_deref();
            svc_ns == Some(ns) || (svc_ns == Some("default") && s.metadata.name.as_deref() == Some("kubernetes"))
        });
        env::service_links(self.spec(), ns, candidates.map(|s| s.as_ref().clone()).collect())
    }

    /// Whether a token held is due for refresh.
    fn token_due(&self) -> bool {
        let (now, jitter) = (Timestamp::now(), tokens::jitter(&self.uid));
        self.tokens.values().any(|t| t.needs_refresh(now, jitter))
    }

    /// The tokens of the pod's projected volumes: those held while not due, else new ones from
    /// TokenRequest (as the node; bound to the pod). A token that cannot be renewed is used until
    /// it expires, as kubelet's token manager does.
    async fn fetch_tokens(&mut self) -> HashMap<TokenKey, Result<String, String>> {
        let keys = tokens::referenced(self.spec());
        self.tokens.retain(|k, _| keys.contains(k));
        let (_, ns) = self.names();
        let sa = tokens::service_account(&self.pod);
        let api: Api<core::ServiceAccount> = Api::namespaced(self.ctx.client.clone(), &ns);
        let (now, jitter) = (Timestamp::now(), tokens::jitter(&self.uid));
        let mut out = HashMap::new();
        for key in keys {
            if let Some(held) = self.tokens.get(&key).filter(|t| !t.needs_refresh(now, jitter)) {
                out.insert(key, Ok(held.token.clone()));
                continue;
            }
            let asked = api.create_token_request(&sa, &Default::default(), &tokens::request(&self.pod, &key)).await;
            let fetched = match asked {
                Ok(tr) => {
                    Token::from_response(&tr, &key).ok_or_else(|| "the TokenRequest returned no token".to_string())
                }
                Err(kube::Error::Api(status)) => Err(status.message.clone()),
                Err(e) => Err(berth_common::error::error_chain(&e)),
            };
            let result = match fetched {
                Ok(token) => {
                    tracing::debug!(pod = %self.pod_ref(), service_account = %sa, audience = %key.audience, expires = %token.expires_at, "service account token issued");
                    let value = token.token.clone();
                    self.tokens.insert(key.clone(), token);
                    Ok(value)
                }
                Err(why) => match self.tokens.get(&key).filter(|t| !t.is_expired(now)) {
                    Some(held) => {
                        tracing::warn!(pod = %self.pod_ref(), service_account = %sa, error = %why, "service account token refresh failed; the current one is kept until it expires");
                        Ok(held.token.clone())
                    }
                    None => Err(why),
                },
            };
            out.insert(key, result);
        }
        out
    }

    /// Sets up (or refreshes) the volumes; `Some(next)` when they are not ready.
    async fn ensure_volumes(&mut self, rt: &PodRuntime) -> Result<Option<Next>, WorkerError> {
        if self.spec().volumes.as_ref().is_none_or(|v| v.is_empty()) {
            return Ok(None);
        }
        if self.volumes.as_ref().is_some_and(|(_, at)| at.elapsed() < VOLUME_REFRESH) && !self.token_due() {
            return Ok(None);
        }
        let mut sources = self.fetch_sources().await?;
        sources.tokens = self.fetch_tokens().await;
        let ctx = self.pod_context(Some(rt));
        let (root, pod, mounter) = (self.ctx.root_dir.clone(), self.pod.clone(), self.ctx.mounter.clone());
        let result =
            tokio::task::spawn_blocking(move || volumes::prepare(&root, &pod, &sources, &ctx, mounter.as_ref()))
                .await
                .unwrap_or_else(|e| {
                    Err((
                        "(all)".into(),
                        volumes::VolumeError::Io {
                            action: "preparing",
                            path: PathBuf::new(),
                            source: std::io::Error::other(e),
                        },
                    ))
                });
        match result {
            Ok(prepared) => {
                self.volumes = Some((prepared, tokio::time::Instant::now()));
                Ok(None)
            }
            Err((name, e)) if self.volumes.is_some() => {
                // A refresh that fails keeps the volumes as they are.
                tracing::warn!(pod = %self.pod_ref(), volume = %name, error = %berth_common::error::error_chain(&e), "volume refresh failed");
                if let Some((_, at)) = self.volumes.as_mut() {
                    *at = tokio::time::Instant::now();
                }
                Ok(None)
            }
            Err((name, e)) => {
                self.event(
                    events::Type::Warning,
                    "",
                    "FailedMount",
                    format!("MountVolume.SetUp failed for volume {name:?} : {}", berth_common::error::error_chain(&e)),
                );
                Ok(Some(Next::After(Duration::from_secs(2))))
            }
        }
    }

    /// Whether the sandbox we hold is still ready.
    async fn check_sandbox(&mut self, rt: &PodRuntime) -> Result<bool, WorkerError> {
        let Some(sb) = &rt.sandbox else { return Ok(false) };
        let status = cricalls::sandbox_status(&rt.endpoint, &sb.id).await?;
        let ready = status.as_ref().is_some_and(|s| s.state == cri::PodSandboxState::SandboxReady as i32);
        if !ready && let Some(s) = self.rt.as_mut().and_then(|r| r.sandbox.as_mut()) {
            s.ready = false;
        }
        Ok(ready)
    }

    /// Finds the pod's ready sandbox, or creates one (`attempt` after the newest).
    async fn ensure_sandbox(&mut self, instances: &[Instance]) -> Result<SandboxOutcome, WorkerError> {
        let Some(rt) = self.rt.clone() else { return Ok(SandboxOutcome::Retry(Next::Now)) };
        let ep = &rt.endpoint;
        let mut sandboxes =
            if self.nothing_on_node { Vec::new() } else { cricalls::list_sandboxes(ep, Some(&self.uid)).await? };
        sandboxes.sort_by_key(|s| std::cmp::Reverse((s.metadata.as_ref().map_or(0, |m| m.attempt), s.created_at)));
        let ready = sandboxes.iter().find(|s| s.state == cri::PodSandboxState::SandboxReady as i32);
        if let Some(found) = ready {
            let attempt = found.metadata.as_ref().map_or(0, |m| m.attempt);
            let config =
                spec::sandbox_config(&self.pod, attempt, &self.ctx.pod_log_dir, &self.ctx.dns, &self.cgroup_path());
            let ips = sandbox_ips(cricalls::sandbox_status(ep, &found.id).await?.as_ref());
            tracing::info!(pod = %self.pod_ref(), sandbox = %found.id, "found the pod's sandbox");
            self.set_sandbox(Sandbox { id: found.id.clone(), config, ips, ready: true });
            return Ok(SandboxOutcome::Ready);
        }
        let policy = self.spec().restart_policy.as_deref().unwrap_or("Always");
        if !sandboxes.is_empty() && policy == "Never" && !instances.is_empty() {
            // Its containers ran and must not run again: the pod ends with what they did.
            if let Some(r) = self.rt.as_mut() {
                r.sandbox = None;
            }
            return Ok(SandboxOutcome::NotRecreated);
        }
        if !sandboxes.is_empty() {
            self.event(
                events::Type::Normal,
                "",
                "SandboxChanged",
                "Pod sandbox changed, it will be killed and re-created.",
            );
            for i in instances.iter().filter(|i| i.state == InstanceState::Running) {
                cricalls::stop_container(ep, &i.id, MIN_GRACE_SECONDS).await?;
            }
            for s in &sandboxes {
                cricalls::stop_sandbox(ep, &s.id).await?;
            }
        }
        let attempt = sandboxes.first().map_or(0, |s| s.metadata.as_ref().map_or(0, |m| m.attempt) + 1);
        let cgroup = self.create_cgroup();
        let config = spec::sandbox_config(&self.pod, attempt, &self.ctx.pod_log_dir, &self.ctx.dns, &cgroup);
        // From here on, a sandbox may exist: later steps list what there is.
        self.nothing_on_node = false;
        let started = std::time::Instant::now();
        let create = async {
            let id = cricalls::run_sandbox(ep, config.clone(), &rt.handler).await?;
            let status = cricalls::sandbox_status(ep, &id).await;
            Ok::<_, CriError>((id, status))
        };
        // The sandbox takes tens of milliseconds: the first containers' images are looked up
        // meanwhile instead of after it.
        let (created, looked_up) = tokio::join!(create, look_up_images(ep, self.first_images(), &rt.handler));
        self.images_looked_up = looked_up;
        match created {
            Ok((id, status)) => {
                let ips = sandbox_ips(status?.as_ref());
                tracing::info!(pod = %self.pod_ref(), sandbox = %id, handler = %rt.handler, endpoint = %ep.name, took = ?started.elapsed(), "sandbox created");
                self.set_sandbox(Sandbox { id, config, ips, ready: true });
                Ok(SandboxOutcome::Ready)
            }
            Err(e) if e.status.code() == tonic::Code::Unavailable => Err(e.into()),
            Err(e) => {
                self.event(
                    events::Type::Warning,
                    "",
                    "FailedCreatePodSandBox",
                    format!("Failed to create pod sandbox: {}", e.rpc()),
                );
                Ok(SandboxOutcome::Retry(Next::After(Duration::from_secs(5))))
            }
        }
    }

    /// The images of the containers a new sandbox starts first (the first init container, or
    /// else every container) that are looked up before a pull; each once.
    fn first_images(&self) -> Vec<String> {
        let spec = self.spec();
        let first = match spec.init_containers.as_deref() {
            Some([init, ..]) => std::slice::from_ref(init),
            _ => spec.containers.as_slice(),
        };
        let mut out: Vec<String> = Vec::new();
        for c in first.iter().filter(|c| images::pull_policy(c) != PullPolicy::Always) {
            let image = c.image.clone().unwrap_or_default();
            if !out.contains(&image) {
                out.push(image);
            }
        }
        out
    }

    /// The pod's cgroup (kubelet's cgroupfs layout by QoS class).
    fn cgroup_path(&self) -> String {
        cgroups::pod_path(berth_api::kinds::pod_qos_class(self.spec()), &self.uid)
    }

    /// Creates the pod's cgroup with its summed resources and overhead; on failure (no cgroupfs
    /// to write), the runtime's own cgroup is used instead: `""`.
    fn create_cgroup(&self) -> String {
        let path = self.cgroup_path();
        // A pod asking for nothing still gets kubelet's minimum shares.
        let limits = super::resources::pod_resources(self.spec())
            .unwrap_or(cri::LinuxContainerResources { cpu_shares: 2, ..Default::default() });
        match self.ctx.cgroups.create(&path, &limits) {
            Ok(()) => path,
            Err(e) => {
                tracing::warn!(pod = %self.pod_ref(), cgroup = %path, error = %e, "no pod cgroup; the runtime's is used");
                String::new()
            }
        }
    }

    fn set_sandbox(&mut self, sandbox: Sandbox) {
        self.sandbox_just_seen = true;
        if let Some(r) = self.rt.as_mut() {
            r.sandbox = Some(sandbox);
        }
    }

    /// Every instance of the pod's containers on its endpoint, newest first within each name.
    async fn observe(&mut self, rt: &PodRuntime) -> Result<Vec<Instance>, WorkerError> {
        let listed = cricalls::list_containers(&rt.endpoint, Some(&self.uid)).await?;
        let mut out = Vec::with_capacity(listed.len());
        for c in &listed {
            if let Some(cached) = self.exited.get(&c.id) {
                out.push(cached.clone());
                continue;
            }
            let Some(s) = cricalls::container_status(&rt.endpoint, &c.id).await? else { continue };
            out.push(self.instance(&s, c.pod_sandbox_id.clone()));
        }
        self.exited.retain(|id, _| listed.iter().any(|c| &c.id == id));
        sort_instances(&mut out);
        Ok(out)
    }

    /// The instance a ContainerStatus shows; an exited one is remembered with its message.
    fn instance(&mut self, s: &cri::ContainerStatus, sandbox_id: String) -> Instance {
        let mut inst = Instance::from_cri(s);
        inst.sandbox_id = sandbox_id;
        if inst.state == InstanceState::Exited {
            if inst.message.is_empty() {
                inst.message = termination_message(&inst, &s.log_path);
            }
            self.exited.insert(inst.id.clone(), inst.clone());
        }
        inst
    }

    /// Removes exited instances beyond the newest two of each container (current and previous).
    async fn collect_old_instances(
        &mut self,
        rt: &PodRuntime,
        instances: &mut Vec<Instance>,
    ) -> Result<(), WorkerError> {
        let mut seen: HashMap<&str, usize> = HashMap::new();
        let mut doomed = Vec::new();
        for i in instances.iter() {
            let n = seen.entry(i.name.as_str()).or_default();
            *n += 1;
            if *n > 2 && i.state == InstanceState::Exited {
                doomed.push(i.id.clone());
            }
        }
        for id in &doomed {
            cricalls::remove_container(&rt.endpoint, id).await?;
            self.exited.remove(id);
        }
        instances.retain(|i| !doomed.contains(&i.id));
        Ok(())
    }

    fn target(&self, rt: &PodRuntime, container_id: &str, c: Option<&core::Container>) -> Target {
        let ctx = self.pod_context(Some(rt));
        Target {
            endpoint: rt.endpoint.clone(),
            container_id: container_id.to_string(),
            pod_ip: ctx.pod_ips.first().cloned().unwrap_or_else(|| "127.0.0.1".into()),
            ports: c.and_then(|c| c.ports.clone()).unwrap_or_default(),
        }
    }

    /// Keeps one probe task per running container of the current sandbox that has probes.
    fn sync_probes(&mut self, rt: &PodRuntime, instances: &[Instance]) {
        let sandbox = rt.sandbox.as_ref().map(|s| s.id.as_str()).unwrap_or("");
        let mut running = HashSet::new();
        for i in instances.iter().filter(|i| i.state == InstanceState::Running && i.sandbox_id == sandbox) {
            let Some(c) = self.container_spec(&i.name).cloned() else { continue };
            if c.liveness_probe.is_none() && c.readiness_probe.is_none() && c.startup_probe.is_none() {
                continue;
            }
            running.insert(i.id.clone());
            if self.probes.contains_key(&i.id) {
                continue;
            }
            let started_at = i.started_at.map_or(tokio::time::Instant::now(), |t| {
                let ago = Duration::try_from(Timestamp::now().duration_since(t)).unwrap_or_default();
                tokio::time::Instant::now().checked_sub(ago).unwrap_or_else(tokio::time::Instant::now)
            });
            let (events, (name, ns)) = (self.ctx.events.clone(), self.names());
            let (uid, path) = (self.uid.clone(), field_path(&c.name, self.is_init(&c.name)));
            let sink = Arc::new(Sink {
                results: Mutex::new(probe::Results::default()),
                changed: self.probe_changed.clone(),
                on_failure: Box::new(move |kind, msg| {
                    events.emit(PodEvent {
                        namespace: ns.clone(),
                        pod_name: name.clone(),
                        pod_uid: uid.clone(),
                        field_path: path.clone(),
                        type_: events::Type::Warning,
                        reason: "Unhealthy".into(),
                        message: format!("{} probe failed: {msg}", kind.name()),
                    })
                }),
            });
            let prober: Arc<dyn Prober> = Arc::new(CriProber { target: self.target(rt, &i.id, Some(&c)) });
            let task = tokio::spawn(probe::run(c, started_at, prober, sink.clone()));
            self.probes.insert(i.id.clone(), ProbeTask { task, sink });
        }
        self.probes.retain(|id, _| running.contains(id));
    }

    /// Pulls (or finds) the container's image per its pull policy; `None` when it cannot be had
    /// now (the reason is recorded).
    async fn ensure_image(
        &mut self,
        rt: &PodRuntime,
        c: &core::Container,
        path: &str,
    ) -> Result<Option<String>, WorkerError> {
        let image = c.image.clone().unwrap_or_default();
        let ep = &rt.endpoint;
        let policy = images::pull_policy(c);
        if policy != PullPolicy::Always {
            let found = match self.images_looked_up.remove(&image) {
                Some(found) => found,
                None => cricalls::image_status(ep, &image, &rt.handler).await?.map(|i| i.id),
            };
            if let Some(found) = found {
                self.event(
                    events::Type::Normal,
                    path,
                    "Pulled",
                    format!("Container image {image:?} already present on machine"),
                );
                return Ok(Some(found));
            }
            if policy == PullPolicy::Never {
                let message = format!("Container image {image:?} is not present with pull policy of Never");
                self.event(events::Type::Warning, path, "ErrImageNeverPull", &message);
                self.waiting.insert(c.name.clone(), Waiting::new("ErrImageNeverPull", message));
                return Ok(None);
            }
        }
        let key = images::pull_key(&image, &rt.handler);
        let now = Timestamp::now();
        if let Some((failed_at, message)) = self.pull_failures.get(&key).cloned()
            && self.pulls.remaining(&key, failed_at, now).is_some()
        {
            self.event(events::Type::Normal, path, "BackOff", format!("Back-off pulling image {image:?}"));
            self.event(events::Type::Warning, path, "Failed", "Error: ImagePullBackOff");
            let waiting = format!("Back-off pulling image {image:?}: ErrImagePull: {message}");
            self.waiting.insert(c.name.clone(), Waiting::new("ImagePullBackOff", waiting));
            return Ok(None);
        }
        self.event(events::Type::Normal, path, "Pulling", format!("Pulling image {image:?}"));
        let secrets = self.pull_secrets(path).await?;
        let auth = images::credentials(&image, &secrets);
        let sandbox_config = rt.sandbox.as_ref().map(|s| s.config.clone()).unwrap_or_default();
        let started = std::time::Instant::now();
        let pull = cricalls::pull_image(ep, &image, &rt.handler, auth, &sandbox_config);
        let result = tokio::select! {
            r = pull => r,
            // A pod deleted during a long pull stops waiting for it.
            _ = deletion(self.pods.clone()) => return Ok(None),
        };
        match result {
            Ok(image_ref) => {
                self.pull_failures.remove(&key);
                self.pulls.forget(&key);
                let took = started.elapsed().as_secs_f64();
                let size =
                    cricalls::image_status(ep, &image_ref, &rt.handler).await.ok().flatten().map_or(0, |i| i.size);
                self.event(
                    events::Type::Normal,
                    path,
                    "Pulled",
                    format!("Successfully pulled image {image:?} in {took:.3}s ({took:.3}s including waiting). Image size: {size} bytes."),
                );
                Ok(Some(image_ref))
            }
            Err(e) if e.status.code() == tonic::Code::Unavailable => Err(e.into()),
            Err(e) => {
                let message = e.rpc();
                self.event(events::Type::Warning, path, "Failed", format!("Failed to pull image {image:?}: {message}"));
                self.event(events::Type::Warning, path, "Failed", "Error: ErrImagePull");
                let at = Timestamp::now();
                self.pulls.attempt(&key, at, at);
                self.pull_failures.insert(key, (at, message.clone()));
                self.waiting.insert(c.name.clone(), Waiting::new("ErrImagePull", message));
                Ok(None)
            }
        }
    }

    async fn pull_secrets(&self, path: &str) -> Result<Vec<core::Secret>, WorkerError> {
        let names: Vec<String> =
            self.spec().image_pull_secrets.iter().flatten().map(|r| r.name.clone()).filter(|n| !n.is_empty()).collect();
        if names.is_empty() {
            return Ok(Vec::new());
        }
        let (_, ns) = self.names();
        let api: Api<core::Secret> = Api::namespaced(self.ctx.client.clone(), &ns);
        let (mut found, mut missing) = (Vec::new(), Vec::new());
        for name in names {
            match api.get_opt(&name).await {
                Ok(Some(s)) => found.push(s),
                Ok(None) => missing.push(name),
                Err(source) => {
                    return Err(WorkerError::Api {
                        action: "reading an image pull secret",
                        pod: self.pod_ref(),
                        source,
                    });
                }
            }
        }
        if !missing.is_empty() {
            self.event(
                events::Type::Warning,
                path,
                "FailedToRetrieveImagePullSecret",
                format!(
                    "Unable to retrieve some image pull secrets ({}); attempting to pull the image may not succeed.",
                    missing.join(", ")
                ),
            );
        }
        Ok(found)
    }

    /// Pulls, creates and starts one container, then runs its postStart hook. Returns the
    /// container's ID, or `None` when it could not be started for a reason the pod shows (recorded
    /// as its waiting reason).
    async fn start_container(
        &mut self,
        rt: &PodRuntime,
        name: &str,
        init: bool,
        restart_count: i32,
    ) -> Result<Option<String>, WorkerError> {
        let Some(c) = self.container_spec(name).cloned() else { return Ok(None) };
        let Some(sandbox) = rt.sandbox.clone() else { return Ok(None) };
        let path = field_path(name, init);
        let Some(image_ref) = self.ensure_image(rt, &c, &path).await? else { return Ok(None) };
        let sources = self.fetch_sources().await?;
        let ctx = self.pod_context(Some(rt));
        let config_error = |w: &mut Worker, message: String| {
            w.event(events::Type::Warning, &path, "Failed", format!("Error: {message}"));
            w.waiting.insert(name.to_string(), Waiting::new("CreateContainerConfigError", message));
        };
        let env = match env::environment(&self.pod, &c, &ctx, &sources) {
            Ok(env) => env,
            Err(e) => {
                config_error(self, e.to_string());
                return Ok(None);
            }
        };
        let prepared = self.volumes.as_ref().map(|(v, _)| v.clone()).unwrap_or_default();
        let mut mounts = match volumes::container_mounts(&c, &prepared, &env) {
            Ok(m) => m,
            Err(e) => {
                config_error(self, berth_common::error::error_chain(&e));
                return Ok(None);
            }
        };
        if hosts::mounted_for(&c, &ctx.pod_ips) {
            match self.hosts_file(&ctx.pod_ips) {
                Ok(file) => mounts.push(cri::Mount {
                    container_path: hosts::ETC_HOSTS.into(),
                    host_path: file.display().to_string(),
                    ..Default::default()
                }),
                Err(e) => {
                    config_error(self, format!("writing the pod's hosts file: {e}"));
                    return Ok(None);
                }
            }
        }
        let termination_file = self.termination_message_file(&c, restart_count);
        let qos = berth_api::kinds::pod_qos_class(self.spec());
        let config = spec::container_config(spec::ContainerInputs {
            pod: &self.pod,
            container: &c,
            init,
            restart_count,
            image_ref: &image_ref,
            handler: &rt.handler,
            env,
            mounts,
            termination_message_file: termination_file,
            qos,
            memory_capacity: self.ctx.memory_capacity,
        });
        let id = match cricalls::create_container(&rt.endpoint, &sandbox.id, config, &sandbox.config).await {
            Ok(id) => id,
            Err(e) if e.status.code() == tonic::Code::Unavailable => return Err(e.into()),
            Err(e) if matches!(e.status.code(), tonic::Code::Aborted | tonic::Code::NotFound) => {
                // The sandbox is going away under us: look at it again shortly.
                tracing::info!(pod = %self.pod_ref(), container = %name, error = %e.rpc(), "sandbox gone while creating a container");
                self.sandbox_suspect = true;
                return Ok(None);
            }
            Err(e) => {
                let message = e.rpc();
                self.event(events::Type::Warning, &path, "Failed", format!("Error: {message}"));
                self.waiting.insert(name.to_string(), Waiting::new("CreateContainerError", message));
                return Ok(None);
            }
        };
        self.expected.created(&id);
        self.event(events::Type::Normal, &path, "Created", format!("Created container: {name}"));
        if let Err(e) = cricalls::start_container(&rt.endpoint, &id).await {
            if e.status.code() == tonic::Code::Unavailable {
                return Err(e.into());
            }
            let message = e.rpc();
            self.event(events::Type::Warning, &path, "Failed", format!("Error: {message}"));
            self.waiting.insert(name.to_string(), Waiting::new("RunContainerError", message));
            return Ok(None);
        }
        self.expected.started(&id);
        self.event(events::Type::Normal, &path, "Started", format!("Started container {name}"));
        self.waiting.remove(name);
        tracing::debug!(pod = %self.pod_ref(), container = %name, id, restart_count, "container started");
        if let Some(hook) = c.lifecycle.as_ref().and_then(|l| l.post_start.as_ref()) {
            let action = Action::of_handler(hook);
            let grace = self.spec().termination_grace_period_seconds.unwrap_or(30);
            let target = self.target(rt, &id, Some(&c));
            let timeout = Duration::from_secs(u64::try_from(grace.max(MIN_GRACE_SECONDS)).unwrap_or(30));
            if let Outcome::Failure(message) = actions::run(&action, &target, timeout).await {
                let text = hook_failure(&action, name, &self.pod_ref(), &message);
                self.event(events::Type::Warning, &path, "FailedPostStartHook", text);
                self.event(events::Type::Normal, &path, "Killing", "FailedPostStartHook");
                cricalls::stop_container(&rt.endpoint, &id, grace.max(MIN_GRACE_SECONDS)).await?;
            }
        }
        Ok(Some(id))
    }

    /// The pod's `/etc/hosts` on the node, written once (as kubelet does) and shared by its
    /// containers.
    fn hosts_file(&self, pod_ips: &[String]) -> std::io::Result<PathBuf> {
        let file = volumes::pod_dir(&self.ctx.root_dir, &self.uid).join("etc-hosts");
        if !file.exists() {
            let node_hosts = std::fs::read_to_string(hosts::ETC_HOSTS).unwrap_or_default();
            let tmp = file.with_extension("tmp");
            std::fs::create_dir_all(file.parent().unwrap_or(&self.ctx.root_dir))?;
            std::fs::write(&tmp, hosts::content(&self.pod, pod_ips, &node_hosts, &self.ctx.dns.cluster_domain))?;
            std::fs::rename(&tmp, &file)?;
        }
        Ok(file)
    }

    /// Creates the host file for the container's termination message; `None` when it has none.
    fn termination_message_file(&self, c: &core::Container, restart_count: i32) -> Option<PathBuf> {
        if c.termination_message_path.as_deref() == Some("") {
            return None;
        }
        let dir = volumes::pod_dir(&self.ctx.root_dir, &self.uid).join("containers").join(&c.name);
        let file = dir.join(restart_count.to_string());
        let made = std::fs::create_dir_all(&dir).and_then(|_| std::fs::File::create(&file)).and_then(|_| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666))
        });
        match made {
            Ok(()) => Some(file),
            Err(e) => {
                tracing::warn!(pod = %self.pod_ref(), container = %c.name, error = %e, "no termination message file");
                None
            }
        }
    }

    // ---- Status -------------------------------------------------------------------------------

    fn observed(&self, instances: &[Instance], terminal: bool) -> Observed {
        let rt = self.rt.as_ref();
        let ctx = self.pod_context(rt);
        let mut containers = HashMap::new();
        let spec = self.spec();
        for c in spec.containers.iter().chain(spec.init_containers.iter().flatten()) {
            let mut of_name = instances.iter().filter(|i| i.name == c.name);
            let current = of_name.next().cloned();
            let previous = of_name.next().cloned();
            let results = current
                .as_ref()
                .and_then(|i| self.probes.get(&i.id))
                .map(|p| p.sink.results.lock().unwrap_or_else(|e| e.into_inner()).clone());
            let (started, ready) = match results {
                Some(r) => (r.started, r.ready),
                // No probe task: probes not configured (or not yet started) decide.
                None => (c.startup_probe.is_none(), c.readiness_probe.is_none() && c.startup_probe.is_none()),
            };
            let waiting = self.waiting.get(&c.name).cloned();
            containers.insert(c.name.clone(), ContainerView { current, previous, waiting, ready, started });
        }
        Observed {
            sandbox_ready: rt.and_then(|r| r.sandbox.as_ref()).is_some_and(|s| s.ready),
            pod_ips: ctx.pod_ips,
            host_ips: ctx.host_ips,
            containers,
            runtime_name: rt.map(|r| r.runtime_name.clone()).unwrap_or_default(),
            sandbox_blocked: match &self.state {
                State::NoRuntime(e) => Some(Waiting::new(e.reason(), e.to_string())),
                _ => None,
            },
            terminal,
            deadline_exceeded: self.deadline().is_some_and(|d| d <= Timestamp::now()),
        }
    }

    /// When the pod's `activeDeadlineSeconds` runs out: from the start time it reported.
    fn deadline(&self) -> Option<Timestamp> {
        let started = self.status.as_ref().or(self.pod.status.as_ref()).and_then(|s| s.start_time.as_ref());
        status::active_deadline(self.spec(), started.map(|t| t.0))
    }

    /// Computes the status from `instances` and writes it if it changed.
    async fn report(&mut self, instances: &[Instance], terminal: bool) -> Result<core::PodStatus, WorkerError> {
        self.report_with(instances, terminal, false).await
    }

    /// [`Self::report`], possibly `deferred` (see [`StatusWriter::write`]).
    async fn report_with(
        &mut self,
        instances: &[Instance],
        terminal: bool,
        deferred: bool,
    ) -> Result<core::PodStatus, WorkerError> {
        let observed = self.observed(instances, terminal);
        let status = status::pod_status(&self.pod, &observed, self.status.as_ref(), Timestamp::now());
        self.write_status(status.clone(), deferred).await?;
        Ok(status)
    }

    /// Records `status` as the pod's and hands it to the pod's status writer when it changed;
    /// does not wait for the API (see [`StatusWriter`]).
    async fn write_status(&mut self, status: core::PodStatus, deferred: bool) -> Result<(), WorkerError> {
        if self.status.as_ref() == Some(&status) || !self.in_api {
            self.status = Some(status);
            return Ok(());
        }
        let writer = match &mut self.status_writer {
            Some(w) => w,
            None => {
                let (name, ns) = self.names();
                self.status_writer.insert(StatusWriter::spawn(
                    self.ctx.client.clone(),
                    self.ctx.api_writes.clone(),
                    &ns,
                    &name,
                    self.pod_ref(),
                ))
            }
        };
        writer.write(status.clone(), deferred);
        self.status = Some(status);
        Ok(())
    }

    // ---- Finished ---------------------------------------------------------------------------

    async fn finish(&mut self, stopped: bool) -> Result<Next, WorkerError> {
        if stopped {
            return Ok(Next::Idle);
        }
        self.probes.clear();
        if let Some(rt) = self.rt.clone() {
            let instances = self.observe(&rt).await?;
            let grace = self.spec().termination_grace_period_seconds.unwrap_or(30);
            for i in instances.iter().filter(|i| i.state == InstanceState::Running) {
                let c = self.container_spec(&i.name).cloned();
                stop_with_hook(&rt, &i.id, c.as_ref(), self.target(&rt, &i.id, c.as_ref()), grace, None).await?;
            }
            // Containers stay (for their logs) until the pod is deleted; the sandbox stops.
            for s in cricalls::list_sandboxes(&rt.endpoint, Some(&self.uid)).await? {
                cricalls::stop_sandbox(&rt.endpoint, &s.id).await?;
            }
            if let Some(s) = self.rt.as_mut().and_then(|r| r.sandbox.as_mut()) {
                s.ready = false;
            }
            let instances = self.observe(&rt).await?;
            self.report(&instances, true).await?;
        }
        self.state = State::Finished { stopped: true };
        Ok(Next::Idle)
    }

    // ---- Terminating --------------------------------------------------------------------------

    fn grace_seconds(&self) -> i64 {
        if !self.in_api {
            return MIN_GRACE_SECONDS;
        }
        self.pod.metadata.deletion_grace_period_seconds.or(self.spec().termination_grace_period_seconds).unwrap_or(30)
    }

    async fn terminate(&mut self) -> Result<Next, WorkerError> {
        let rt = match self.rt.clone() {
            Some(rt) => Some(rt),
            None => self.ctx.runtimes.endpoint_of(&self.uid).map(|endpoint| PodRuntime {
                runtime_name: self.ctx.runtime_name(&endpoint),
                endpoint,
                handler: String::new(),
                sandbox: None,
            }),
        };
        if rt.is_none() && self.may_run_on_an_unlisted_runtime() {
            // Its containers may run there: the API object goes only once they are stopped.
            return Ok(Next::After(INVENTORY_WAIT));
        }
        if let Some(rt) = &rt {
            let instances = self.observe(rt).await?;
            let grace = self.grace_seconds();
            let deadline = tokio::time::Instant::now() + Duration::from_secs(u64::try_from(grace).unwrap_or(0));
            let mut stops = Vec::new();
            for i in instances.iter().filter(|i| matches!(i.state, InstanceState::Running | InstanceState::Created)) {
                let c = self.container_spec(&i.name).cloned();
                let init = self.is_init(&i.name);
                self.event(
                    events::Type::Normal,
                    &field_path(&i.name, init),
                    "Killing",
                    format!("Stopping container {}", i.name),
                );
                let target = self.target(rt, &i.id, c.as_ref());
                let (rt, id) = (rt.clone(), i.id.clone());
                stops.push(async move { stop_with_hook(&rt, &id, c.as_ref(), target, grace, Some(deadline)).await });
            }
            for r in futures::future::join_all(stops).await {
                r?;
            }
            self.probes.clear();
            if self.in_api {
                let instances = self.observe(rt).await?;
                self.report(&instances, true).await?;
            }
            for s in cricalls::list_sandboxes(&rt.endpoint, Some(&self.uid)).await? {
                cricalls::stop_sandbox(&rt.endpoint, &s.id).await?;
                cricalls::remove_sandbox(&rt.endpoint, &s.id).await?;
            }
            for c in cricalls::list_containers(&rt.endpoint, Some(&self.uid)).await? {
                cricalls::remove_container(&rt.endpoint, &c.id).await?;
            }
            // Every QoS class's path: an orphan's class is not known any more.
            for qos in ["Guaranteed", "Burstable", "BestEffort"] {
                if let Err(e) = self.ctx.cgroups.remove(&cgroups::pod_path(qos, &self.uid)) {
                    tracing::debug!(pod = %self.pod_ref(), error = %e, "pod cgroup not removed");
                }
            }
        }
        let (root, uid, mounter) = (self.ctx.root_dir.clone(), self.uid.clone(), self.ctx.mounter.clone());
        tokio::task::spawn_blocking(move || volumes::clean_up(&root, &uid, mounter.as_ref()))
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e)))
            .map_err(|source| WorkerError::Cleanup { pod: self.pod_ref(), source })?;
        self.ctx.runtimes.forget(&self.uid);
        if self.in_api {
            // The final status goes before the object (kubelet's order).
            if let Some(writer) = &mut self.status_writer
                && !writer.flush(FINAL_STATUS_WAIT).await
            {
                tracing::warn!(pod = %self.pod_ref(), "the final status was not written in time; deleting anyway");
            }
            let (name, ns) = self.names();
            let api: Api<core::Pod> = Api::namespaced(self.ctx.client.clone(), &ns);
            let params = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: Some(Preconditions { uid: Some(self.uid.clone()), resource_version: None }),
                ..Default::default()
            };
            let permit = self.ctx.api_writes.acquire().await;
            let deleted = api.delete(&name, &params).await;
            drop(permit);
            match deleted {
                Ok(_) => {}
                // Already gone, or a new pod of the same name.
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                Err(source) => return Err(WorkerError::Api { action: "deleting", pod: self.pod_ref(), source }),
            }
        }
        tracing::info!(pod = %self.pod_ref(), "pod removed from the node");
        self.state = State::Done;
        Ok(Next::Exit)
    }
}

/// What [`Worker::act`] did.
enum Acted {
    /// Started these containers and did nothing else.
    Started(Vec<String>),
    Next(Next),
}

/// Asks `ep` about each image at once: image → its ID (`None`: not present). An image whose
/// lookup failed is left out, to be asked again when needed.
async fn look_up_images(ep: &Endpoint, images: Vec<String>, handler: &str) -> HashMap<String, Option<String>> {
    let lookups = images.into_iter().map(|image| async move {
        let found = cricalls::image_status(ep, &image, handler).await;
        (image, found)
    });
    let mut out = HashMap::new();
    for (image, found) in futures::future::join_all(lookups).await {
        if let Ok(found) = found {
            out.insert(image, found.map(|i| i.id));
        }
    }
    out
}

/// Newest first within each container name.
fn sort_instances(instances: &mut [Instance]) {
    instances.sort_by(|a, b| {
        a.name.cmp(&b.name).then(b.restart_count.cmp(&a.restart_count)).then(b.created_at.cmp(&a.created_at))
    });
}

enum SandboxOutcome {
    Ready,
    /// Could not be created: try again then.
    Retry(Next),
    /// Its containers ran under `restartPolicy: Never`: not created again.
    NotRecreated,
}

/// The sandbox's IPs, primary first.
fn sandbox_ips(status: Option<&cri::PodSandboxStatus>) -> Vec<String> {
    let Some(net) = status.and_then(|s| s.network.as_ref()) else { return Vec::new() };
    let mut ips: Vec<String> = Some(net.ip.clone()).filter(|ip| !ip.is_empty()).into_iter().collect();
    ips.extend(net.additional_ips.iter().map(|ip| ip.ip.clone()).filter(|ip| !ip.is_empty()));
    ips
}

/// Resolves once the pod is being deleted or left the API (or the supervisor is gone).
async fn deletion(pods: Option<watch::Receiver<Option<Arc<core::Pod>>>>) {
    match pods {
        Some(mut rx) => {
            let _ = rx.wait_for(|p| p.as_ref().is_none_or(|p| p.metadata.deletion_timestamp.is_some())).await;
        }
        None => std::future::pending().await,
    }
}

/// The message of an exited instance: its termination message file, or (policy
/// `FallbackToLogsOnError`, failed, no file content) the tail of its log.
fn termination_message(inst: &Instance, log_path: &str) -> String {
    const MAX_BYTES: usize = 4096;
    let file = inst.annotations.get(labels::CONTAINER_TERMINATION_MESSAGE_FILE);
    let text = file.and_then(|f| std::fs::read(f).ok()).unwrap_or_default();
    if !text.is_empty() {
        let n = text.len().min(MAX_BYTES);
        return String::from_utf8_lossy(&text[..n]).into_owned();
    }
    let fallback = inst
        .annotations
        .get(labels::CONTAINER_TERMINATION_MESSAGE_POLICY)
        .is_some_and(|p| p == "FallbackToLogsOnError");
    if !fallback || inst.exit_code == 0 || log_path.is_empty() {
        return String::new();
    }
    let log = std::fs::read_to_string(log_path).unwrap_or_default();
    // CRI log lines: `<time> <stream> <P|F> <text>`; the last 80 lines, at most 2048 bytes.
    let lines: Vec<&str> = log.lines().filter_map(|l| l.splitn(4, ' ').nth(3)).collect();
    let tail = lines[lines.len().saturating_sub(80)..].join("\n");
    let start = tail.len().saturating_sub(2048);
    let start = (start..=tail.len()).find(|i| tail.is_char_boundary(*i)).unwrap_or(tail.len());
    tail[start..].to_string()
}

/// kubelet's message for a failed lifecycle hook.
fn hook_failure(action: &Action, container: &str, pod: &str, message: &str) -> String {
    match action {
        Action::Exec(cmd) => format!(
            "Exec lifecycle hook ({cmd:?}) for Container {container:?} in Pod {pod:?} failed - error: {message}"
        ),
        Action::HttpGet(h) | Action::HttpHook(h) => format!(
            "HTTP lifecycle hook ({}) for Container {container:?} in Pod {pod:?} failed - error: {message}",
            h.path.clone().unwrap_or_default()
        ),
        _ => format!("Lifecycle hook for Container {container:?} in Pod {pod:?} failed - error: {message}"),
    }
}

/// Stops one container: its preStop hook (bounded by the grace period or `deadline`), then
/// `StopContainer` with what is left of the grace (at least kubelet's 2 s).
async fn stop_with_hook(
    rt: &PodRuntime,
    id: &str,
    c: Option<&core::Container>,
    target: Target,
    grace: i64,
    deadline: Option<tokio::time::Instant>,
) -> Result<(), WorkerError> {
    let deadline = deadline
        .unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(u64::try_from(grace).unwrap_or(0)));
    if let Some(hook) = c.and_then(|c| c.lifecycle.as_ref()).and_then(|l| l.pre_stop.as_ref()) {
        let action = Action::of_handler(hook);
        let budget = deadline.saturating_duration_since(tokio::time::Instant::now());
        if !budget.is_zero()
            && let Outcome::Failure(message) = actions::run(&action, &target, budget).await
        {
            tracing::info!(container = id, %message, "preStop hook failed");
        }
    }
    let left = deadline.saturating_duration_since(tokio::time::Instant::now()).as_secs();
    let timeout = i64::try_from(left).unwrap_or(0).max(MIN_GRACE_SECONDS.min(grace.max(0)));
    cricalls::stop_container(&rt.endpoint, id, timeout).await?;
    Ok(())
}

/// Probes through CRI and the network.
struct CriProber {
    target: Target,
}

impl Prober for CriProber {
    fn probe<'a>(
        &'a self,
        action: &'a Action,
        timeout: Duration,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Outcome> + Send + 'a>> {
        Box::pin(actions::run(action, &self.target, timeout))
    }
}
