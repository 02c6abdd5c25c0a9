//! Test harness for the scheduler shell: the real API server in-process (SQLite in a temp dir,
//! `apiserver::router` as the `kube::Client`, no socket) with the real `scheduler::run` on a
//! task the test starts, stops and restarts; builders for Nodes, RuntimeClasses and Pods, and
//! polling waits that say what they last saw when they give up.
//!
//! ```no_run
//! # async fn demo() {
//! let mut cluster = common::Cluster::new().await;
//! common::NodeDef::new("n1").create(&cluster.client).await;
//! cluster.start_scheduler();
//! cluster.create_pod(common::PodDef::new("p")).await;
//! let node = cluster.wait_bound("p").await;
//! # }
//! ```
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use berth_apiserver::{ApiState, lifecycle, router};
use berth_scheduler::metrics::Metrics;
use berth_scheduler::scheduler::{self, Config};
use berth_store::sqlite::SqliteStore;
use k8s_openapi::api::core::v1::{Event, Node, Pod, PodCondition};
use k8s_openapi::api::node::v1::RuntimeClass;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

/// How long a wait gives the scheduler: a debug build on a busy machine, with back-off (1 s
/// doubling to 10 s) between attempts.
pub const PATIENCE: Duration = Duration::from_secs(20);
const POLL: Duration = Duration::from_millis(25);

/// Polls `f` until it returns `Ok`; after `limit`, panics with `what` and the last `Err`.
pub async fn eventually<T, F, Fut>(what: &str, limit: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match f().await {
            Ok(v) => return v,
            Err(last) if tokio::time::Instant::now() >= deadline => {
                panic!("gave up after {limit:?} waiting for {what}; last seen: {last}")
            }
            Err(_) => tokio::time::sleep(POLL).await,
        }
    }
}

/// An API server with its store, and the scheduler when started.
pub struct Cluster {
    pub client: kube::Client,
    pub state: Arc<ApiState>,
    scheduler: Option<JoinHandle<Result<(), scheduler::Error>>>,
    _dir: tempfile::TempDir,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(task) = self.scheduler.take() {
            task.abort();
        }
    }
}

impl Cluster {
    /// A fresh API server with its system namespaces; no scheduler yet.
    pub async fn new() -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("state.db")).unwrap();
        let state = ApiState::new(Arc::new(store), None);
        lifecycle::bootstrap(&state).await.unwrap();
        let client = kube::Client::new(router(state.clone()), "default");
        Cluster { client, state, scheduler: None, _dir: dir }
    }

    /// Starts `scheduler::run` with the default configuration on a task of its own.
    pub fn start_scheduler(&mut self) {
        assert!(self.scheduler.is_none(), "the scheduler is already running");
        let run = scheduler::run(self.client.clone(), Config::default(), Metrics::new("default-scheduler"));
        self.scheduler = Some(tokio::spawn(run));
    }

    /// Stops the scheduler (drops its future) and waits until its task is gone.
    pub async fn stop_scheduler(&mut self) {
        let task = self.scheduler.take().expect("the scheduler is running");
        task.abort();
        match task.await {
            Err(e) if e.is_cancelled() => {}
            other => panic!("the scheduler ended on its own before it was stopped: {other:?}"),
        }
    }

    pub fn pods(&self) -> Api<Pod> {
        Api::default_namespaced(self.client.clone())
    }

    pub fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    pub fn classes(&self) -> Api<RuntimeClass> {
        Api::all(self.client.clone())
    }

    pub async fn create_pod(&self, def: PodDef) -> Pod {
        let pod: Pod = serde_json::from_value(def.0).unwrap();
        self.pods().create(&PostParams::default(), &pod).await.unwrap()
    }

    /// Deletes a pod at once (grace period 0), as a node would confirm it gone.
    pub async fn delete_pod_now(&self, name: &str) {
        let params = DeleteParams { grace_period_seconds: Some(0), ..Default::default() };
        self.pods().delete(name, &params).await.unwrap();
        eventually(&format!("pod {name} to be gone"), PATIENCE, || async {
            match self.pods().get_opt(name).await.unwrap() {
                None => Ok(()),
                Some(p) => Err(format!("still there: {:?}", p.metadata.deletion_timestamp)),
            }
        })
        .await
    }

    /// Waits until the pod is bound; returns its node.
    pub async fn wait_bound(&self, name: &str) -> String {
        eventually(&format!("pod {name} to be bound"), PATIENCE, || async {
            let pod = self.pods().get(name).await.unwrap();
            node_name(&pod).map(str::to_string).ok_or_else(|| describe(&pod))
        })
        .await
    }

    /// Waits until every named pod is bound; returns pod → node.
    pub async fn wait_all_bound(&self, names: &[String]) -> BTreeMap<String, String> {
        let mut bound = BTreeMap::new();
        for name in names {
            bound.insert(name.clone(), self.wait_bound(name).await);
        }
        bound
    }

    /// Waits until the pod has `PodScheduled=False` (reason `Unschedulable`) with exactly
    /// `message`, and asserts it is not bound.
    pub async fn wait_unschedulable(&self, name: &str, message: &str) -> Pod {
        self.wait_unschedulable_where(name, |m| m == message).await
    }

    pub async fn wait_unschedulable_where(&self, name: &str, ok: impl Fn(&str) -> bool) -> Pod {
        eventually(&format!("pod {name} to be reported unschedulable"), PATIENCE, || async {
            let pod = self.pods().get(name).await.unwrap();
            match scheduled_condition(&pod) {
                Some(c)
                    if c.status == "False"
                        && c.reason.as_deref() == Some("Unschedulable")
                        && ok(c.message.as_deref().unwrap_or_default()) =>
                {
                    assert_eq!(node_name(&pod), None, "an unschedulable pod is not bound: {}", describe(&pod));
                    Ok(pod)
                }
                _ => Err(describe(&pod)),
            }
        })
        .await
    }

    /// Events about the pod, oldest first.
    pub async fn events(&self, pod: &str) -> Vec<Event> {
        let events: Api<Event> = Api::default_namespaced(self.client.clone());
        let mut list: Vec<Event> = events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.involved_object.name.as_deref() == Some(pod))
            .collect();
        list.sort_by_key(|e| e.first_timestamp.clone().map(|t| t.0));
        list
    }

    /// Waits for an event about the pod with this reason and exactly this message.
    pub async fn wait_event(&self, pod: &str, reason: &str, message: &str) -> Event {
        eventually(&format!("a {reason} event about {pod}: {message:?}"), PATIENCE, || async {
            let events = self.events(pod).await;
            events
                .iter()
                .find(|e| e.reason.as_deref() == Some(reason) && e.message.as_deref() == Some(message))
                .cloned()
                .ok_or_else(|| format!("{:?}", events.iter().map(|e| (&e.reason, &e.message)).collect::<Vec<_>>()))
        })
        .await
    }

    /// Asserts the pod stays unbound for `time`.
    pub async fn assert_stays_unbound(&self, name: &str, time: Duration) {
        let deadline = tokio::time::Instant::now() + time;
        while tokio::time::Instant::now() < deadline {
            let pod = self.pods().get(name).await.unwrap();
            assert_eq!(node_name(&pod), None, "pod {name} was bound: {}", describe(&pod));
            tokio::time::sleep(POLL * 4).await;
        }
    }

    /// Writes a node's `status.runtimeHandlers` through the status subresource.
    pub async fn set_runtime_handlers(&self, node: &str, handlers: &[&str]) {
        let handlers: Vec<Value> = handlers.iter().map(|h| json!({"name": h})).collect();
        let patch = json!({"status": {"runtimeHandlers": handlers}});
        self.nodes().patch_status(node, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    }
}

pub fn node_name(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).filter(|n| !n.is_empty())
}

pub fn scheduled_condition(pod: &Pod) -> Option<&PodCondition> {
    pod.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == "PodScheduled")
}

/// The pod's node and PodScheduled condition, for failure messages.
pub fn describe(pod: &Pod) -> String {
    let c = scheduled_condition(pod);
    format!(
        "nodeName {:?}, PodScheduled {:?}",
        node_name(pod),
        c.map(|c| (&c.status, c.reason.as_deref(), c.message.as_deref()))
    )
}

/// A Node as a kubelet would register it: `kubernetes.io/hostname` and
/// `topology.kubernetes.io/zone` labels, allocatable cpu, memory and pods, and by default
/// the runtime handlers `runc` and `runsc`.
pub struct NodeDef {
    name: String,
    labels: BTreeMap<String, String>,
    cpu: String,
    memory: String,
    pods: String,
    taints: Vec<Value>,
    handlers: Vec<String>,
}

impl NodeDef {
    pub fn new(name: &str) -> NodeDef {
        NodeDef {
            name: name.into(),
            labels: BTreeMap::from([
                ("kubernetes.io/hostname".to_string(), name.to_string()),
                ("topology.kubernetes.io/zone".to_string(), "zone-a".to_string()),
            ]),
            cpu: "4".into(),
            memory: "8Gi".into(),
            pods: "110".into(),
            taints: Vec::new(),
            handlers: vec!["runc".into(), "runsc".into()],
        }
    }

    pub fn zone(self, zone: &str) -> NodeDef {
        self.label("topology.kubernetes.io/zone", zone)
    }

    pub fn label(mut self, key: &str, value: &str) -> NodeDef {
        self.labels.insert(key.into(), value.into());
        self
    }

    pub fn cpu(mut self, cpu: &str) -> NodeDef {
        self.cpu = cpu.into();
        self
    }

    pub fn memory(mut self, memory: &str) -> NodeDef {
        self.memory = memory.into();
        self
    }

    pub fn taint(mut self, key: &str, value: &str, effect: &str) -> NodeDef {
        self.taints.push(json!({"key": key, "value": value, "effect": effect}));
        self
    }

    pub fn handlers(mut self, handlers: &[&str]) -> NodeDef {
        self.handlers = handlers.iter().map(|h| h.to_string()).collect();
        self
    }

    /// Creates the Node. The API server keeps the status a Node is created with (as
    /// Kubernetes does for a kubelet's registration), so the node appears complete in one write;
    /// this checks that it did.
    pub async fn create(self, client: &kube::Client) -> Node {
        let allocatable = json!({"cpu": self.cpu, "memory": self.memory, "pods": self.pods});
        let handlers: Vec<Value> = self.handlers.iter().map(|h| json!({"name": h})).collect();
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": self.name, "labels": self.labels},
            "spec": {"taints": self.taints},
            "status": {
                "capacity": allocatable,
                "allocatable": allocatable,
                "runtimeHandlers": handlers,
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }))
        .unwrap();
        let created = Api::<Node>::all(client.clone()).create(&PostParams::default(), &node).await.unwrap();
        let status = created.status.as_ref().expect("the node keeps its status on create");
        assert_eq!(status.allocatable, node.status.as_ref().unwrap().allocatable);
        assert_eq!(status.runtime_handlers.as_ref().map(Vec::len), Some(self.handlers.len()));
        created
    }
}

/// Creates a RuntimeClass from its JSON (`metadata`, `handler`, `overhead`, `scheduling`).
pub async fn create_class(client: &kube::Client, class: Value) -> RuntimeClass {
    let class: RuntimeClass = serde_json::from_value(class).unwrap();
    Api::<RuntimeClass>::all(client.clone()).create(&PostParams::default(), &class).await.unwrap()
}

/// The classes every test starts with: `runc` (handler runc) and `gvisor` (handler runsc).
pub async fn create_standard_classes(client: &kube::Client) {
    create_class(client, json!({"metadata": {"name": "runc"}, "handler": "runc"})).await;
    create_class(client, json!({"metadata": {"name": "gvisor"}, "handler": "runsc"})).await;
}

/// A pod in `default` with one container `c`; builder methods edit its JSON.
pub struct PodDef(pub Value);

impl PodDef {
    pub fn new(name: &str) -> PodDef {
        PodDef(json!({
            "metadata": {"name": name, "labels": {}},
            "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
        }))
    }

    pub fn class(mut self, class: &str) -> PodDef {
        self.0["spec"]["runtimeClassName"] = json!(class);
        self
    }

    pub fn label(mut self, key: &str, value: &str) -> PodDef {
        self.0["metadata"]["labels"][key] = json!(value);
        self
    }

    /// Requests of the container, e.g. `requests("500m", "1Gi")`.
    pub fn requests(mut self, cpu: &str, memory: &str) -> PodDef {
        self.0["spec"]["containers"][0]["resources"] = json!({"requests": {"cpu": cpu, "memory": memory}});
        self
    }

    pub fn host_port(mut self, port: i32) -> PodDef {
        self.0["spec"]["containers"][0]["ports"] = json!([{"containerPort": port, "hostPort": port}]);
        self
    }

    pub fn node_selector(mut self, key: &str, value: &str) -> PodDef {
        self.0["spec"]["nodeSelector"][key] = json!(value);
        self
    }

    /// Sets one field of the spec to `value`.
    pub fn spec(mut self, field: &str, value: Value) -> PodDef {
        self.0["spec"][field] = value;
        self
    }
}
