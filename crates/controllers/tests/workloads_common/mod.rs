//! Test harness for the ReplicaSet and Deployment controllers: the real API server in-process
//! (SQLite in a temp dir, `apiserver::router` as the `kube::Client`), both controllers on tasks
//! (and any other controller a test adds with [`Cluster::spawn`]),
//! a stand-in kubelet that marks pods Running and Ready, and a census of pods taken from a watch,
//! which records the most pods and the fewest ready ones the cluster ever showed.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use berth_apiserver::{ApiState, lifecycle, router};
use berth_controllers::{Config, Context, deployment, replicaset};
use berth_store::sqlite::SqliteStore;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::{Value, json};
use tokio::task::JoinHandle;

/// How long a wait gives the controllers: a debug build on a busy two-core machine.
pub const PATIENCE: Duration = Duration::from_secs(30);
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

/// An API server with both workload controllers running.
pub struct Cluster {
    pub client: kube::Client,
    pub state: Arc<ApiState>,
    tasks: Vec<JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Cluster {
    pub async fn start() -> Cluster {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_env("BERTH_LOG"))
            .with_test_writer()
            .try_init();
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("state.db")).unwrap();
        let state = ApiState::new(Arc::new(store), None);
        lifecycle::bootstrap(&state).await.unwrap();
        let client = kube::Client::new(router(state.clone()), "default");
        let ctx = Context::new(client.clone(), Config::default());
        let tasks = vec![tokio::spawn(replicaset::run(ctx.clone())), tokio::spawn(deployment::run(ctx))];
        Cluster { client, state, tasks, _dir: dir }
    }

    /// Runs another controller (or any task) until the cluster is dropped.
    pub fn spawn<F: Future<Output = ()> + Send + 'static>(&mut self, run: impl FnOnce(Arc<Context>) -> F) {
        let ctx = Context::new(self.client.clone(), Config::default());
        self.tasks.push(tokio::spawn(run(ctx)));
    }

    pub fn pods(&self) -> Api<Pod> {
        Api::default_namespaced(self.client.clone())
    }

    pub fn replica_sets(&self) -> Api<ReplicaSet> {
        Api::default_namespaced(self.client.clone())
    }

    pub fn deployments(&self) -> Api<Deployment> {
        Api::default_namespaced(self.client.clone())
    }

    /// Pods with these labels that are not being deleted, by name.
    pub async fn live_pods(&self, selector: &str) -> Vec<Pod> {
        let list = self.pods().list(&ListParams::default().labels(selector)).await.unwrap();
        let mut pods: Vec<Pod> = list.items.into_iter().filter(|p| p.metadata.deletion_timestamp.is_none()).collect();
        pods.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        pods
    }

    /// ReplicaSets with these labels, oldest revision first.
    pub async fn replica_sets_of(&self, selector: &str) -> Vec<ReplicaSet> {
        let mut rss = self.replica_sets().list(&ListParams::default().labels(selector)).await.unwrap().items;
        rss.sort_by_key(revision);
        rss
    }

    /// Marks a pod Running and Ready (since `since`, default now), as its kubelet would.
    pub async fn make_ready(&self, name: &str, since: Option<jiff::Timestamp>) {
        let since = since.unwrap_or_else(jiff::Timestamp::now);
        let status = json!({"status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(since)}],
        }});
        let _ = self.pods().patch_status(name, &PatchParams::default(), &Patch::Merge(&status)).await;
    }

    /// Events about the named object, as `reason: message`.
    pub async fn events_about(&self, name: &str) -> Vec<String> {
        let api: Api<Event> = Api::default_namespaced(self.client.clone());
        let mut events: Vec<Event> = api.list(&ListParams::default()).await.unwrap().items;
        events.retain(|e| e.involved_object.name.as_deref() == Some(name));
        events.sort_by(|a, b| a.first_timestamp.cmp(&b.first_timestamp));
        events
            .into_iter()
            .map(|e| format!("{}: {}", e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
            .collect()
    }

    /// Waits for an event about `name` that contains `text`.
    pub async fn expect_event(&self, name: &str, text: &str) {
        eventually(&format!("an event about {name} saying {text:?}"), PATIENCE, || async {
            let events = self.events_about(name).await;
            if events.iter().any(|e| e.contains(text)) { Ok(()) } else { Err(format!("{events:#?}")) }
        })
        .await
    }

    /// A stand-in kubelet on node `node-a`: every pod with these labels is bound to it and
    /// becomes Running and Ready `after` it appears; a pod being deleted is gone `after` that
    /// (its grace period cut short). Dropping the handle stops it.
    pub fn kubelet(&self, selector: &str, after: Duration) -> Task {
        let api = self.pods();
        let stream = watcher(api.clone(), watcher::Config::default().labels(selector));
        Task(tokio::spawn(async move {
            let mut started: HashSet<String> = HashSet::new();
            let mut stopped: HashSet<String> = HashSet::new();
            let mut stream = std::pin::pin!(stream);
            while let Some(ev) = stream.next().await {
                let pod = match ev {
                    Ok(watcher::Event::Apply(p)) | Ok(watcher::Event::InitApply(p)) => p,
                    _ => continue,
                };
                let uid = pod.metadata.uid.clone().unwrap_or_default();
                let name = pod.metadata.name.clone().unwrap_or_default();
                let api = api.clone();
                if pod.metadata.deletion_timestamp.is_some() {
                    if stopped.insert(uid) {
                        tokio::spawn(async move {
                            tokio::time::sleep(after).await;
                            let _ = api.delete(&name, &DeleteParams::default().grace_period(0)).await;
                        });
                    }
                    continue;
                }
                if is_ready(&pod) || !started.insert(uid) {
                    continue;
                }
                tokio::spawn(async move {
                    let binding = json!({
                        "apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
                        "target": {"apiVersion": "v1", "kind": "Node", "name": "node-a"},
                    });
                    let _: Result<Value, _> =
                        api.create_subresource("binding", &name, &PostParams::default(), &binding).await;
                    tokio::time::sleep(after).await;
                    let status = json!({"status": {
                        "phase": "Running",
                        "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now())}],
                    }});
                    let _ = api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status)).await;
                });
            }
        }))
    }

    /// Counts the pods with these labels at every change a watch shows.
    pub fn census(&self, selector: &str) -> (Arc<Mutex<Census>>, Task) {
        let census = Arc::new(Mutex::new(Census::default()));
        let stream = watcher(self.pods(), watcher::Config::default().labels(selector));
        let shared = census.clone();
        let task = tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(ev) = stream.next().await {
                let mut c = shared.lock().unwrap();
                match ev {
                    Ok(watcher::Event::Apply(p)) | Ok(watcher::Event::InitApply(p)) => c.apply(&p),
                    Ok(watcher::Event::Delete(p)) => c.delete(&p),
                    _ => continue,
                }
                c.record();
            }
        });
        (census, Task(task))
    }
}

/// A background task of a test, stopped when dropped.
pub struct Task(JoinHandle<()>);

impl Drop for Task {
    fn drop(&mut self) {
        self.0.abort();
    }
}

pub fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

pub fn revision(rs: &ReplicaSet) -> i64 {
    annotation(&rs.metadata.annotations, "deployment.kubernetes.io/revision").parse().unwrap_or(0)
}

pub fn annotation(a: &Option<BTreeMap<String, String>>, key: &str) -> String {
    a.as_ref().and_then(|a| a.get(key)).cloned().unwrap_or_default()
}

pub fn hash_of(pod: &Pod) -> String {
    pod.metadata.labels.as_ref().and_then(|l| l.get("pod-template-hash")).cloned().unwrap_or_default()
}

/// What a watch of pods showed, at every change once armed.
#[derive(Debug, Default)]
pub struct Census {
    /// Pods not being deleted: (ready, pod-template-hash).
    live: HashMap<String, (bool, String)>,
    /// Pods being deleted, with their pod-template-hash.
    terminating: HashMap<String, String>,
    armed: bool,
    pub max_live: usize,
    /// Most pods including those being deleted (not bounded by the rollout, as in Kubernetes).
    pub max_all: usize,
    pub min_ready: usize,
    /// Most distinct pod-template hashes among live pods at once.
    pub max_hashes: usize,
    /// The same, counting pods being deleted too.
    pub max_hashes_all: usize,
    /// Changes recorded while armed.
    pub changes: usize,
}

impl Census {
    fn apply(&mut self, p: &Pod) {
        let name = p.metadata.name.clone().unwrap_or_default();
        if p.metadata.deletion_timestamp.is_some() {
            self.live.remove(&name);
            self.terminating.insert(name, hash_of(p));
        } else {
            self.live.insert(name, (is_ready(p), hash_of(p)));
        }
    }

    fn delete(&mut self, p: &Pod) {
        let name = p.metadata.name.as_deref().unwrap_or("");
        self.live.remove(name);
        self.terminating.remove(name);
    }

    fn ready(&self) -> usize {
        self.live.values().filter(|(r, _)| *r).count()
    }

    fn record(&mut self) {
        if !self.armed {
            return;
        }
        self.changes += 1;
        self.max_live = self.max_live.max(self.live.len());
        self.max_all = self.max_all.max(self.live.len() + self.terminating.len());
        self.min_ready = self.min_ready.min(self.ready());
        let mut hashes: BTreeSet<&String> = self.live.values().map(|(_, h)| h).collect();
        self.max_hashes = self.max_hashes.max(hashes.len());
        hashes.extend(self.terminating.values());
        self.max_hashes_all = self.max_hashes_all.max(hashes.len());
    }

    /// Starts recording from the current state.
    pub fn arm(&mut self) {
        self.armed = true;
        self.max_live = self.live.len();
        self.max_all = self.live.len() + self.terminating.len();
        self.min_ready = self.ready();
        self.max_hashes = 0;
        self.max_hashes_all = 0;
        self.changes = 0;
        self.record();
    }

    pub fn live(&self) -> usize {
        self.live.len()
    }
}

/// A Deployment of `replicas` pods labelled `app: <name>` running `image`.
pub fn deployment(name: &str, replicas: i32, image: &str, extra_spec: Value) -> Deployment {
    let mut spec = json!({
        "replicas": replicas,
        "selector": {"matchLabels": {"app": name}},
        "template": {
            "metadata": {"labels": {"app": name}},
            "spec": {"containers": [{"name": "app", "image": image}]},
        },
    });
    merge(&mut spec, extra_spec);
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap()
}

/// A ReplicaSet of `replicas` pods labelled `app: <name>`.
pub fn replica_set(name: &str, replicas: i32, extra_spec: Value) -> ReplicaSet {
    let mut spec = json!({
        "replicas": replicas,
        "selector": {"matchLabels": {"app": name}},
        "template": {
            "metadata": {"labels": {"app": name}},
            "spec": {"containers": [{"name": "app", "image": "registry.example/app:1"}]},
        },
    });
    merge(&mut spec, extra_spec);
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap()
}

fn merge(base: &mut Value, extra: Value) {
    match (base, extra) {
        (Value::Object(b), Value::Object(e)) => {
            for (k, v) in e {
                merge(b.entry(k).or_insert(Value::Null), v);
            }
        }
        (b, e) => *b = e,
    }
}
