//! The controllers that read pods share one cache of them: however many run on one context, the
//! API server sees one list and one watch of every pod.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use berth_apiserver::{ApiState, lifecycle, router};
use berth_controllers::{Config, Context, deployment, endpoints, node_lifecycle, replicaset, replication};
use berth_store::sqlite::SqliteStore;
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};

#[tokio::test]
async fn every_controller_that_reads_pods_shares_one_list_and_one_watch_of_them() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("state.db")).unwrap();
    let state = ApiState::new(Arc::new(store), None);
    lifecycle::bootstrap(&state).await.unwrap();
    // The query of every request for all pods (not one namespace's).
    let requests: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen = requests.clone();
    let service = tower::ServiceBuilder::new()
        .map_request(move |req: http::Request<kube::client::Body>| {
            if req.uri().path() == "/api/v1/pods" {
                seen.lock().unwrap().push(req.uri().query().unwrap_or("").to_string());
            }
            req
        })
        .service(router(state));
    let client = kube::Client::new(service, "default");

    let ctx = Context::new(client.clone(), Config::default());
    let tasks = [
        tokio::spawn(replicaset::run(ctx.clone())),
        tokio::spawn(replication::run(ctx.clone())),
        tokio::spawn(deployment::run(ctx.clone())),
        tokio::spawn(node_lifecycle::run(ctx.clone())),
        tokio::spawn(endpoints::run_endpoint_slices(ctx.clone())),
        tokio::spawn(endpoints::run_endpoints(ctx)),
    ];

    let rs: ReplicaSet = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web"},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]}}},
    }))
    .unwrap();
    Api::<ReplicaSet>::default_namespaced(client.clone()).create(&PostParams::default(), &rs).await.unwrap();
    let pods: Api<Pod> = Api::default_namespaced(client);
    let deadline = Instant::now() + Duration::from_secs(30);
    while pods.list(&ListParams::default().labels("app=web")).await.unwrap().items.len() < 3 {
        assert!(Instant::now() < deadline, "the ReplicaSet controller made no pods");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }

    let requests = requests.lock().unwrap().clone();
    let watches = requests.iter().filter(|q| q.contains("watch=true")).count();
    assert_eq!((requests.len() - watches, watches), (1, 1), "requests for every pod: {requests:?}");
    for t in tasks {
        t.abort();
    }
}
