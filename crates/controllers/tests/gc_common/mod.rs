//! Test harness for the garbage collector, node lifecycle and namespace controllers: the real
//! API server in-process (SQLite in a temp dir, `apiserver::router` as the `kube::Client`, no
//! socket), the controllers on tasks the test starts, object builders, and polling waits that
//! say what they last saw when they give up.
#![allow(dead_code)]

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use berth_apiserver::{ApiState, lifecycle, router};
use berth_controllers::{Config, Context};
use berth_store::sqlite::SqliteStore;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

/// How long a wait gives the controllers: a debug build on a busy two-core machine.
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

/// An API server with its store, and the controllers the test started.
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

/// Short node timings for tests: a 2 s grace period looked at every 100 ms.
pub fn fast_config() -> Config {
    Config {
        node_monitor_grace_period: Duration::from_secs(2),
        node_monitor_period: Duration::from_millis(100),
        node_eviction_rate: 10.0,
        ..Config::default()
    }
}

impl Cluster {
    pub async fn new() -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("state.db")).unwrap();
        let state = ApiState::new(Arc::new(store), None);
        lifecycle::bootstrap(&state).await.unwrap();
        let client = kube::Client::new(router(state.clone()), "default");
        Cluster { client, state, tasks: Vec::new(), _dir: dir }
    }

    pub fn context(&self, config: Config) -> Arc<Context> {
        Context::new(self.client.clone(), config)
    }

    pub fn spawn(&mut self, f: impl Future<Output = ()> + Send + 'static) {
        self.tasks.push(tokio::spawn(f));
    }

    pub fn start_gc(&mut self) {
        let ctx = self.context(Config::default());
        self.spawn(berth_controllers::garbage_collector::run(ctx));
    }

    pub fn start_namespace(&mut self) {
        let ctx = self.context(Config::default());
        self.spawn(berth_controllers::namespace::run(ctx));
    }

    pub fn start_node_lifecycle(&mut self, config: Config, tuning: berth_controllers::node_lifecycle::Tuning) {
        let ctx = self.context(config);
        self.spawn(berth_controllers::node_lifecycle::run_with(ctx, tuning));
    }

    pub fn cms(&self) -> Api<ConfigMap> {
        Api::default_namespaced(self.client.clone())
    }

    pub fn pods(&self) -> Api<Pod> {
        Api::default_namespaced(self.client.clone())
    }

    pub fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    pub fn leases(&self) -> Api<Lease> {
        Api::namespaced(self.client.clone(), "kube-node-lease")
    }

    /// Creates a ConfigMap with these owners and finalizers; returns it.
    pub async fn cm(&self, name: &str, owners: &[OwnerReference], finalizers: &[&str]) -> ConfigMap {
        let cm: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": name, "ownerReferences": owners, "finalizers": finalizers},
        }))
        .unwrap();
        self.cms().create(&PostParams::default(), &cm).await.unwrap()
    }

    /// A Node whose agent last reported `ready` with a heartbeat and Lease renewal `age` ago.
    pub async fn node(&self, name: &str, ready: &str, age: Duration) {
        let node: Node = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
        self.nodes().create(&PostParams::default(), &node).await.unwrap();
        let at = jiff::Timestamp::now() - jiff::SignedDuration::try_from(age).unwrap();
        self.report(name, ready, at).await;
        let lease: Lease = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": micro(at)},
        }))
        .unwrap();
        self.leases().create(&PostParams::default(), &lease).await.unwrap();
    }

    /// The agent posts Ready = `ready` with a heartbeat at `at`.
    pub async fn report(&self, name: &str, ready: &str, at: jiff::Timestamp) {
        let t = at.to_string();
        let status = json!({"status": {"conditions": [
            {"type": "Ready", "status": ready, "reason": "KubeletReady", "message": "agent is posting ready status",
             "lastHeartbeatTime": t, "lastTransitionTime": t},
            {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory",
             "lastHeartbeatTime": t, "lastTransitionTime": t},
        ]}});
        self.nodes().patch_status(name, &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
    }

    /// The agent renews the node's Lease now.
    pub async fn renew(&self, name: &str) {
        let patch = json!({"spec": {"renewTime": micro(jiff::Timestamp::now())}});
        self.leases().patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    }

    /// Keeps renewing the node's Lease every 200 ms, as a live agent would (faster).
    pub fn keep_alive(&mut self, name: &str) {
        let leases = self.leases();
        let name = name.to_string();
        self.spawn(async move {
            loop {
                let patch = json!({"spec": {"renewTime": micro(jiff::Timestamp::now())}});
                let _ = leases.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
    }

    /// A pod bound to `node` with these tolerations and a 30 s grace period.
    pub async fn bound_pod(&self, name: &str, node: &str, tolerations: Value) -> Pod {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}],
                     "tolerations": tolerations, "terminationGracePeriodSeconds": 30},
        }))
        .unwrap();
        self.pods().create(&PostParams::default(), &pod).await.unwrap()
    }
}

/// RFC 3339 with microseconds, as a Lease's `renewTime`.
pub fn micro(t: jiff::Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

/// A reference to `owner` (a ConfigMap unless said otherwise).
pub fn owned_by(api_version: &str, kind: &str, name: &str, uid: &str, block: bool) -> OwnerReference {
    OwnerReference {
        api_version: api_version.into(),
        kind: kind.into(),
        name: name.into(),
        uid: uid.into(),
        block_owner_deletion: Some(block),
        controller: Some(true),
    }
}

pub fn cm_ref(cm: &ConfigMap, block: bool) -> OwnerReference {
    owned_by("v1", "ConfigMap", cm.metadata.name.as_deref().unwrap(), cm.metadata.uid.as_deref().unwrap(), block)
}

/// Waits until `get` finds nothing.
pub async fn gone<K, F, Fut>(what: &str, mut get: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<K>, kube::Error>>,
    K: std::fmt::Debug,
{
    eventually(what, PATIENCE, || {
        let f = get();
        async move {
            match f.await {
                Ok(None) => Ok(()),
                Ok(Some(k)) => Err(format!("{k:?}")),
                Err(e) => Err(e.to_string()),
            }
        }
    })
    .await
}
