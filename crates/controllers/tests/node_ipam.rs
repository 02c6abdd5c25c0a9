//! The node IPAM controller against the real API server in-process: nodes registering at once
//! get distinct blocks, a deleted node's block is freed, a restarted controller learns the taken
//! blocks from the Nodes, and an exhausted range is reported on the node.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use berth_apiserver::{ApiState, lifecycle, router};
use berth_controllers::{Config, Context, node_ipam};
use berth_store::sqlite::SqliteStore;
use k8s_openapi::api::core::v1::{Event, Node};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;
use tokio::task::JoinHandle;

const PATIENCE: Duration = Duration::from_secs(30);

struct Cluster {
    client: kube::Client,
    controller: Option<JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Cluster {
    async fn start(cluster_cidr: &str, mask: u8) -> Cluster {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_env("BERTH_LOG"))
            .with_test_writer()
            .try_init();
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("state.db")).unwrap();
        let state = ApiState::new(Arc::new(store), None);
        lifecycle::bootstrap(&state).await.unwrap();
        let client = kube::Client::new(router(state), "default");
        let mut c = Cluster { client, controller: None, _dir: dir };
        c.run_controller(cluster_cidr, mask);
        c
    }

    fn run_controller(&mut self, cluster_cidr: &str, mask: u8) {
        let config = Config {
            allocate_node_cidrs: true,
            cluster_cidr: cluster_cidr.parse().unwrap(),
            node_cidr_mask_size: mask,
            ..Config::default()
        };
        let ctx = Context::new(self.client.clone(), config);
        self.controller = Some(tokio::spawn(node_ipam::run(ctx)));
    }

    fn stop(&mut self) {
        if let Some(t) = self.controller.take() {
            t.abort();
        }
    }

    fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    async fn register(&self, name: &str) {
        let node: Node = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
        self.nodes().create(&PostParams::default(), &node).await.unwrap();
    }

    /// The node's podCIDR once it has one; panics if it has none within `PATIENCE`.
    async fn cidr_of(&self, name: &str) -> String {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let node = self.nodes().get(name).await.unwrap();
            let spec = node.spec.unwrap_or_default();
            if let Some(cidr) = spec.pod_cidr.filter(|c| !c.is_empty()) {
                assert_eq!(spec.pod_cidrs, Some(vec![cidr.clone()]), "podCIDRs agrees with podCIDR");
                return cidr;
            }
            assert!(tokio::time::Instant::now() < deadline, "node {name} got no pod CIDR within {PATIENCE:?}");
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
}

#[tokio::test]
async fn nodes_registering_at_once_get_distinct_blocks_of_the_cluster_cidr() {
    let c = Cluster::start("10.244.0.0/16", 24).await;
    futures::future::join_all(["n1", "n2", "n3"].map(|n| c.register(n))).await;
    let mut cidrs = BTreeSet::new();
    for n in ["n1", "n2", "n3"] {
        cidrs.insert(c.cidr_of(n).await);
    }
    let expected: BTreeSet<String> = ["10.244.0.0/24", "10.244.1.0/24", "10.244.2.0/24"].map(String::from).into();
    assert_eq!(cidrs, expected);
}

#[tokio::test]
async fn a_deleted_nodes_block_is_handed_out_again() {
    // Two blocks only, so the freed one is the only one left.
    let c = Cluster::start("10.244.0.0/23", 24).await;
    c.register("n1").await;
    c.register("n2").await;
    let freed = c.cidr_of("n1").await;
    c.cidr_of("n2").await;
    c.nodes().delete("n1", &DeleteParams::default()).await.unwrap();
    c.register("n3").await;
    assert_eq!(c.cidr_of("n3").await, freed);
}

#[tokio::test]
async fn a_restarted_controller_does_not_reuse_a_taken_block() {
    let mut c = Cluster::start("10.244.0.0/16", 24).await;
    c.register("n1").await;
    c.register("n2").await;
    let (a, b) = (c.cidr_of("n1").await, c.cidr_of("n2").await);
    c.stop();
    // A node given a block by hand while no controller ran is taken too.
    let manual: Node = serde_json::from_value(json!({"metadata": {"name": "manual"},
        "spec": {"podCIDR": "10.244.2.0/24", "podCIDRs": ["10.244.2.0/24"]}}))
    .unwrap();
    c.nodes().create(&PostParams::default(), &manual).await.unwrap();
    c.register("n3").await;
    c.run_controller("10.244.0.0/16", 24);
    let fresh = c.cidr_of("n3").await;
    assert!(![a.as_str(), b.as_str(), "10.244.2.0/24"].contains(&fresh.as_str()), "{fresh} was already taken");
    assert_eq!(fresh, "10.244.3.0/24");
}

#[tokio::test]
async fn a_node_finding_the_range_exhausted_gets_an_event_and_its_block_once_one_is_freed() {
    let c = Cluster::start("10.244.0.0/24", 24).await;
    c.register("n1").await;
    let only = c.cidr_of("n1").await;
    c.register("n2").await;
    let events: Api<Event> = Api::namespaced(c.client.clone(), "default");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let list = events.list(&ListParams::default()).await.unwrap();
        let seen = list.items.iter().any(|e| {
            e.reason.as_deref() == Some(node_ipam::CIDR_NOT_AVAILABLE)
                && e.involved_object.name.as_deref() == Some("n2")
        });
        if seen {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "no CIDRNotAvailable event for n2");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let n2 = c.nodes().get("n2").await.unwrap();
    assert_eq!(n2.spec.and_then(|s| s.pod_cidr), None);
    c.nodes().delete("n1", &DeleteParams::default()).await.unwrap();
    assert_eq!(c.cidr_of("n2").await, only);
}
