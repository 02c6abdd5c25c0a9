//! One pod on this node, driven through CRI by a state machine (kube-runtime's watcher shape):
//! [`Worker::step`] advances [`State`] by one step and says when to step again; errors go to the
//! run loop's retry policy, and nothing panics the loop. Each state carries what it holds; what
//! outlives states (the pod, its status, caches, back-offs) is the [`Shell`].
//!
//! ```text
//! Resolve ──► Running ──► Finished ──┐        (any state) ──► Terminating ──► Done
//!   │  ▲         (phase Succeeded/   │         deletionTimestamp set,
//!   ▼  │          Failed: sandbox    │         or the pod left the API
//! NoRuntime       stopped, logs kept)┘
//! ```
//!
//! - **Resolve** ([`resolve`]): RuntimeClass → handler (a missing class fails the pod,
//!   `RuntimeClassNotFound`) → the endpoint holding the pod already (recovered), or the one the
//!   runtime manager selects.
//! - **NoRuntime**: no endpoint serves the handler (`RuntimeHandlerNotFound`); retried with
//!   back-off and whenever the runtimes change.
//! - **Running** ([`running`]): level-triggered like kubelet's `SyncPod`: volumes ([`sources`]),
//!   the sandbox ([`sandbox`]: found again after a restart, re-created when it died; for a pod new
//!   to the node, made while its volumes are set up), then the [`plan`](super::plan) for the
//!   containers ([`containers`]), the status patched when it changed.
//! - **Terminating** ([`terminate`]): preStop hooks and `StopContainer` within the grace period,
//!   final status, sandboxes and volumes removed, then the API object deleted with grace 0 and a
//!   UID precondition.
//!
//! Recovery needs no special state: a worker always looks for the pod's sandbox and containers
//! (by the standard labels) before creating anything, so an agent restart adopts what runs.

mod containers;
mod probes;
mod report;
mod resolve;
mod running;
mod sandbox;
mod sources;
mod state;
mod terminate;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::node::v1::RuntimeClass;
use kube::runtime::reflector::Store;
use tokio::sync::{Notify, Semaphore, watch};

use super::backoff::Backoff;
use super::cgroups::Cgroups;
use super::clock::Clock;
use super::cri::CriError;
use super::dns::NodeDns;
use super::mount::Mounter;
use super::spec;
use super::status::{Instance, Waiting};
use super::status_writer::StatusWriter;
use super::tokens::{Token, TokenKey};
use super::wake::{Expected, Wake};
use crate::endpoint::Endpoint;
use crate::runtimes::RuntimeManager;
use berth_events::{self as events, PodEvent, Recorder};
use probes::ProbeTask;
pub use state::State;
use state::{Finished, OnNode, PodRuntime, PodSandbox, Running, Sandbox, Selecting, Shown, Stepped};

/// How often a running pod is looked at without being woken, on a runtime without a connected
/// container event stream (containerd 1.6 has none).
pub const POLL: Duration = Duration::from_secs(10);
/// The same on a runtime whose events wake the pod: kubelet's default sync frequency.
pub const RESYNC: Duration = Duration::from_secs(60);
/// How often a pod that may be on a runtime not listed yet looks again (the listing also wakes it).
const INVENTORY_WAIT: Duration = Duration::from_secs(5);
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
    /// The wall clock of statuses, back-offs and deadlines.
    pub clock: Clock,
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

/// One pod's worker.
pub struct Worker {
    state: State,
    shell: Shell,
}

/// What a worker keeps across states: the pod, what it last wrote, and what it learned.
struct Shell {
    ctx: Arc<Context>,
    uid: String,
    pod: Arc<core::Pod>,
    /// False once the pod left the API (deleted, or never there: an orphan found at start).
    in_api: bool,
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
    /// The service account tokens of the pod's projected volumes, kept until due for refresh.
    tokens: HashMap<TokenKey, Token>,
    /// Waiting for unlisted runtimes was logged.
    reported_unlisted: bool,
    wake: Arc<Wake>,
    /// Container events this worker caused, which need not wake it.
    expected: Expected,
    /// Wakes the worker when a probe's results change.
    probe_changed: Arc<Notify>,
    /// The supervisor's channel of pod updates.
    pods: watch::Receiver<Option<Arc<core::Pod>>>,
    /// Writes the status to the API, from the first write on.
    status_writer: Option<StatusWriter>,
}

fn field_path(name: &str, init: bool) -> String {
    if init { format!("spec.initContainers{{{name}}}") } else { format!("spec.containers{{{name}}}") }
}

impl Worker {
    /// A worker for a pod of the API (`in_api`) or for an orphan found in a runtime, fed the
    /// pod's updates by `pods`.
    pub fn new(
        ctx: Arc<Context>,
        pod: Arc<core::Pod>,
        in_api: bool,
        pods: watch::Receiver<Option<Arc<core::Pod>>>,
    ) -> Worker {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let wake = Arc::new(Wake::default());
        ctx.wakers.lock().unwrap_or_else(|e| e.into_inner()).insert(uid.clone(), wake.clone());
        let shell = Shell {
            status: pod.status.clone(),
            ctx,
            uid,
            pod,
            in_api,
            restarts: Backoff::default(),
            pulls: Backoff::default(),
            pull_failures: HashMap::new(),
            waiting: HashMap::new(),
            exited: HashMap::new(),
            probes: HashMap::new(),
            tokens: HashMap::new(),
            reported_unlisted: false,
            wake,
            expected: Expected::default(),
            probe_changed: Arc::new(Notify::new()),
            pods,
            status_writer: None,
        };
        let state = if in_api { State::Resolve(Selecting::default()) } else { State::Terminating(None) };
        Worker { state, shell }
    }

    /// The newest pod from the API; `None` when it left the API.
    pub fn update(&mut self, pod: Option<Arc<core::Pod>>) {
        match pod {
            Some(p) => self.shell.pod = p,
            None => self.shell.in_api = false,
        }
    }

    /// Runs the worker until its pod is gone from the node: steps, and sleeps between steps
    /// until woken by a pod update, a runtime change, a probe or a container event.
    pub async fn run(mut self) {
        let mut runtime_changes = self.shell.ctx.runtimes.changes();
        let mut pods = self.shell.pods.clone();
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
                    tracing::warn!(pod = %self.shell.pod_ref(), state = self.state.name(), error = %berth_common::error::error_chain(&e), retry_in = ?retry, "pod step failed");
                    let next = Next::After(retry);
                    retry = (retry * 2).min(Duration::from_secs(30));
                    next
                }
            };
            tracing::trace!(pod = %self.shell.pod_ref(), state = self.state.name(), ?next, "pod step done");
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
                    _ = self.shell.probe_changed.notified() => break false,
                    _ = self.shell.wake.notified() => {
                        if self.shell.expected.needs_sync(&self.shell.wake) {
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
        self.shell.ctx.wakers.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.shell.uid);
    }

    /// Advances the state machine by one step.
    pub async fn step(&mut self) -> Result<Next, WorkerError> {
        let Worker { state, shell } = self;
        if shell.deleting() && !matches!(state, State::Terminating(_) | State::Done) {
            tracing::info!(pod = %shell.pod_ref(), "terminating pod");
            *state = State::Terminating(state.on_node());
        }
        let stepped = match state {
            State::Resolve(selecting) => shell.resolve(selecting).await?,
            State::NoRuntime(error, selecting) => {
                tracing::debug!(pod = %shell.pod_ref(), %error, "looking for a runtime again");
                Stepped::to(State::Resolve(selecting.clone()), Next::Now)
            }
            State::Running(running) => shell.sync(running).await?,
            State::Finished(Finished::Stopping(node)) => shell.finish(node).await?,
            State::Finished(Finished::Stopped(_)) => Stepped::stay(Next::Idle),
            State::Terminating(node) => shell.terminate(node.as_ref()).await?,
            State::Done => Stepped::stay(Next::Exit),
        };
        if let Some(to) = stepped.to {
            *state = to;
        }
        Ok(stepped.next)
    }

    #[cfg(test)]
    fn state(&self) -> &State {
        &self.state
    }

    /// Waits until the statuses handed to the writer are written.
    #[cfg(test)]
    async fn flush_status(&mut self) {
        if let Some(w) = &mut self.shell.status_writer {
            assert!(w.flush(Duration::from_secs(10)).await, "the status was not written");
        }
    }
}

impl Shell {
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

    fn now(&self) -> Timestamp {
        self.ctx.clock.now()
    }

    fn deleting(&self) -> bool {
        !self.in_api || self.pod.metadata.deletion_timestamp.is_some()
    }

    fn is_init(&self, name: &str) -> bool {
        self.spec().init_containers.iter().flatten().any(|c| c.name == name)
    }

    fn container_spec(&self, name: &str) -> Option<&core::Container> {
        let spec = self.spec();
        spec.containers.iter().chain(spec.init_containers.iter().flatten()).find(|c| c.name == name)
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
}
