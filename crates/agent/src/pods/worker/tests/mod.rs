//! Unit tests of the pod worker: [`Worker::step`] driven against a [`FakeRuntime`] that records
//! the CRI calls, with the in-process API server as the client and Tokio's clock paused. No
//! root, no runtime, no socket.

mod lifecycle;
mod resolve;
mod termination;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use berth_apiserver::{ApiState, lifecycle as api_lifecycle, router};
use berth_store::sqlite::SqliteStore;
use jiff::Timestamp;
use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1 as core;
use kube::api::{Api, PostParams};
use kube::runtime::reflector;
use tokio::sync::{Semaphore, watch};

use super::{API_WRITES, Context, Next, State, Worker, WorkerError};
use crate::endpoint::Endpoint;
use crate::pods::cgroups::Cgroups;
use crate::pods::clock::Clock;
use crate::pods::dns::{HostDns, NodeDns};
use crate::pods::fake_cri::FakeRuntime;
use crate::pods::gc;
use crate::pods::mount::RecordingMounter;
use crate::runtimes::{EndpointStatus, RuntimeManager};

const NODE: &str = "node-1";
/// The fake endpoint's name in the runtime manager.
const ENDPOINT: &str = "fake";

/// Cgroups that are made and removed without a cgroupfs.
#[derive(Debug, Default)]
struct NoCgroups;

impl Cgroups for NoCgroups {
    fn create(&self, _: &str, _: &cri::LinuxContainerResources) -> std::io::Result<()> {
        Ok(())
    }
    fn remove(&self, _: &str) -> std::io::Result<()> {
        Ok(())
    }
}

/// `router` as a service during whose requests the paused clock stands still: the store writes
/// on a thread of its own, and Tokio would otherwise advance the clock while a request waits
/// for it (a blocking task in flight keeps it from doing so).
fn held_still(
    router: axum::Router,
) -> impl tower::Service<
    http::Request<kube::client::Body>,
    Response = http::Response<axum::body::Body>,
    Error = std::convert::Infallible,
    Future = impl Send,
> + Clone
+ Send
+ 'static {
    tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let router = router.clone();
        async move {
            let (done, until_done) = std::sync::mpsc::channel::<()>();
            let hold = tokio::task::spawn_blocking(move || until_done.recv());
            let response = tower::ServiceExt::oneshot(router, req).await;
            drop(done);
            let _ = hold.await;
            response
        }
    })
}

/// An API server, a fake runtime, and what a worker needs around them.
struct Harness {
    client: kube::Client,
    runtime: Arc<FakeRuntime>,
    clock: Clock,
    dir: tempfile::TempDir,
    _api: Arc<ApiState>,
}

/// A worker of one pod, with the channel that feeds it the pod's updates.
struct Pod {
    name: String,
    worker: Worker,
    updates: watch::Sender<Option<Arc<core::Pod>>>,
}

impl Harness {
    async fn new() -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("state.db")).unwrap();
        let api = ApiState::new(Arc::new(store), None);
        api_lifecycle::bootstrap(&api).await.unwrap();
        let client = kube::Client::new(held_still(router(api.clone())), "default");
        // Pods are admitted only with their ServiceAccount; no token volume keeps them simple.
        let sa: core::ServiceAccount = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "default"}, "automountServiceAccountToken": false
        }))
        .unwrap();
        Api::<core::ServiceAccount>::default_namespaced(client.clone())
            .create(&PostParams::default(), &sa)
            .await
            .unwrap();
        let clock = Clock::following_tokio(Timestamp::now());
        Harness { client, runtime: Arc::new(FakeRuntime::new(clock)), clock, dir, _api: api }
    }

    /// A context as the agent makes at start: its runtime manager has the fake endpoint, ready,
    /// serving the default handler and `runc`, with its pods listed.
    fn context(&self) -> Arc<Context> {
        let runtimes = Arc::new(RuntimeManager::new(NODE));
        let endpoint =
            Endpoint::with_cri("container", ENDPOINT, "unix:///nonexistent/fake.sock", self.runtime.clone()).unwrap();
        runtimes.set_endpoints(vec![endpoint]);
        runtimes.update_status(
            ENDPOINT,
            EndpointStatus {
                ready: true,
                handlers: vec![String::new(), "runc".into()],
                runtime_name: "fake".into(),
                ..Default::default()
            },
        );
        runtimes.mark_inventoried(&runtimes.endpoint(ENDPOINT).unwrap());
        Arc::new(Context {
            client: self.client.clone(),
            node_name: NODE.into(),
            runtimes,
            runtime_classes: reflector::store().0,
            services: reflector::store().0,
            root_dir: self.dir.path().join("root"),
            pod_log_dir: self.dir.path().join("logs"),
            dns: NodeDns {
                host: HostDns::parse("nameserver 192.0.2.53\n"),
                cluster_servers: Vec::new(),
                cluster_domain: "cluster.local".into(),
            },
            host_ips: RwLock::new(vec!["192.0.2.10".into()]),
            events: berth_events::Recorder::spawn(
                self.client.clone(),
                berth_events::Source { component: super::EVENT_COMPONENT.into(), host: Some(NODE.into()) },
                super::EVENT_QUEUE,
            ),
            mounter: Arc::new(RecordingMounter::default()),
            cgroups: Arc::new(NoCgroups),
            memory_capacity: 8 << 30,
            cpu_millis: 4000,
            wakers: Mutex::new(HashMap::new()),
            api_writes: Arc::new(Semaphore::new(API_WRITES)),
            clock: self.clock,
        })
    }

    fn pods(&self) -> Api<core::Pod> {
        Api::default_namespaced(self.client.clone())
    }

    /// Creates the pod `name` with `spec` on this node, and its worker.
    async fn pod(&self, ctx: &Arc<Context>, name: &str, mut spec: serde_json::Value) -> Pod {
        spec["nodeName"] = NODE.into();
        let pod: core::Pod =
            serde_json::from_value(serde_json::json!({"metadata": {"name": name}, "spec": spec})).unwrap();
        let pod = self.pods().create(&PostParams::default(), &pod).await.unwrap();
        self.worker(ctx, pod)
    }

    /// A worker for `pod` as the API has it, as the supervisor starts one.
    fn worker(&self, ctx: &Arc<Context>, pod: core::Pod) -> Pod {
        let name = pod.metadata.name.clone().unwrap();
        let pod = Arc::new(pod);
        let (updates, rx) = watch::channel(Some(pod.clone()));
        Pod { name, worker: Worker::new(ctx.clone(), pod, true, rx), updates }
    }

    /// The pod's status as the API has it.
    async fn status(&self, pod: &mut Pod) -> core::PodStatus {
        pod.worker.flush_status().await;
        self.pods().get(&pod.name).await.unwrap().status.unwrap_or_default()
    }

    /// Hands the worker the pod as the API has it now.
    async fn refresh(&self, pod: &mut Pod) {
        let now = Arc::new(self.pods().get(&pod.name).await.unwrap());
        pod.updates.send_replace(Some(now.clone()));
        pod.worker.update(Some(now));
    }
}

impl Pod {
    async fn step(&mut self) -> Next {
        match self.worker.step().await {
            Ok(next) => next,
            Err(e) => panic!("step of {} failed: {}", self.name, berth_common::error::error_chain(&e)),
        }
    }

    async fn try_step(&mut self) -> Result<Next, WorkerError> {
        self.worker.step().await
    }

    /// Steps until the worker rests (any answer but [`Next::Now`]); returns that answer.
    async fn settle(&mut self) -> Next {
        for _ in 0..20 {
            let next = self.step().await;
            if next != Next::Now {
                return next;
            }
        }
        panic!("{} kept stepping: {:?}", self.name, self.worker.state());
    }

    fn state(&self) -> &State {
        self.worker.state()
    }
}

fn container_status<'a>(statuses: &'a Option<Vec<core::ContainerStatus>>, name: &str) -> &'a core::ContainerStatus {
    statuses.iter().flatten().find(|c| c.name == name).unwrap_or_else(|| panic!("no status of container {name}"))
}

fn condition<'a>(status: &'a core::PodStatus, type_: &str) -> &'a core::PodCondition {
    status.conditions.iter().flatten().find(|c| c.type_ == type_).unwrap_or_else(|| panic!("no condition {type_}"))
}

/// A pod with one container `app` of an image the runtime holds.
fn one_container() -> serde_json::Value {
    serde_json::json!({"containers": [{"name": "app", "image": "busybox:1.36"}]})
}

/// What the agent does at start before its first worker: the pods the runtimes hold go into the
/// runtime manager's pod cache.
async fn recover(ctx: &Context) {
    for found in gc::pods_in_runtimes(ctx).await.values() {
        ctx.runtimes.remember(&found.uid, &found.endpoint);
    }
}

const POLL_WAIT: Next = Next::After(super::POLL);
