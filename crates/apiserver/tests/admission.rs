//! The admission chain through the `kube` crate, in-process: DefaultTolerationSeconds (with the
//! server's settings), its place before RuntimeClass, mutation before the kind's validation on
//! updates, and NamespaceLifecycle on subresource creates.

use std::sync::Arc;

use berth_api::admission::DefaultTolerationSeconds;
use berth_apiserver::admission::Admission;
use berth_apiserver::{ApiState, lifecycle, router};
use berth_store::sqlite::SqliteStore;
use k8s_openapi::api::core::v1::{Binding, Namespace, Pod, Toleration};
use k8s_openapi::api::node::v1::RuntimeClass;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};

async fn setup(admission: Admission) -> (kube::Client, Arc<ApiState>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("state.db")).unwrap();
    let state = ApiState::with_admission(Arc::new(store), None, admission);
    lifecycle::bootstrap(&state).await.unwrap();
    let client = kube::Client::new(router(state.clone()), "default");
    (client, state, dir)
}

fn pod(name: &str, extra: Value) -> Pod {
    let mut p = json!({"metadata": {"name": name}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}});
    if let (Some(spec), Some(extra)) = (p["spec"].as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    serde_json::from_value(p).unwrap()
}

fn default_toleration(key: &str, seconds: i64) -> Toleration {
    serde_json::from_value(
        json!({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": seconds}),
    )
    .unwrap()
}

fn tolerations(p: &Pod) -> Vec<Toleration> {
    p.spec.as_ref().unwrap().tolerations.clone().unwrap_or_default()
}

#[tokio::test]
async fn created_pods_tolerate_not_ready_and_unreachable_nodes_for_five_minutes() {
    let (client, _s, _d) = setup(Admission::default()).await;
    let pods: Api<Pod> = Api::default_namespaced(client);
    let created = pods.create(&PostParams::default(), &pod("web", json!({}))).await.unwrap();
    assert_eq!(
        tolerations(&created),
        [
            default_toleration("node.kubernetes.io/not-ready", 300),
            default_toleration("node.kubernetes.io/unreachable", 300)
        ]
    );
    assert_eq!(tolerations(&pods.get("web").await.unwrap()), tolerations(&created));
}

#[tokio::test]
async fn the_servers_seconds_apply_and_a_pods_own_toleration_is_kept() {
    let config = DefaultTolerationSeconds { not_ready: 60, unreachable: 120 };
    let (client, _s, _d) = setup(Admission { default_toleration_seconds: config, ..Default::default() }).await;
    let pods: Api<Pod> = Api::default_namespaced(client);
    let own = json!({"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 10});
    let created = pods.create(&PostParams::default(), &pod("web", json!({"tolerations": [own]}))).await.unwrap();
    assert_eq!(
        tolerations(&created),
        [
            default_toleration("node.kubernetes.io/not-ready", 10),
            default_toleration("node.kubernetes.io/unreachable", 120)
        ]
    );
    // A pod tolerating every taint gets nothing.
    let all = pods.create(&PostParams::default(), &pod("all", json!({"tolerations": [{"operator": "Exists"}]}))).await;
    assert_eq!(tolerations(&all.unwrap()).len(), 1);
}

#[tokio::test]
async fn default_tolerations_come_before_those_of_the_runtime_class() {
    let (client, _s, _d) = setup(Admission::default()).await;
    let classes: Api<RuntimeClass> = Api::all(client.clone());
    let class: RuntimeClass = serde_json::from_value(json!({
        "metadata": {"name": "gvisor"}, "handler": "runsc",
        "scheduling": {"tolerations": [{"key": "sandbox", "operator": "Exists", "effect": "NoSchedule"}]}
    }))
    .unwrap();
    classes.create(&PostParams::default(), &class).await.unwrap();
    let pods: Api<Pod> = Api::default_namespaced(client);
    let created =
        pods.create(&PostParams::default(), &pod("sandboxed", json!({"runtimeClassName": "gvisor"}))).await.unwrap();
    let keys: Vec<String> = tolerations(&created).into_iter().map(|t| t.key.unwrap_or_default()).collect();
    assert_eq!(keys, ["node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable", "sandbox"]);
}

#[tokio::test]
async fn an_update_leaving_out_the_default_tolerations_gets_them_back_before_validation() {
    let (client, _s, _d) = setup(Admission::default()).await;
    let pods: Api<Pod> = Api::default_namespaced(client);
    pods.create(&PostParams::default(), &pod("web", json!({}))).await.unwrap();
    let mut changed = pods.get("web").await.unwrap();
    // Removing a toleration would be refused by the pod's update validation; the plugin puts
    // them back first, as in Kubernetes.
    changed.spec.as_mut().unwrap().tolerations = None;
    changed.metadata.labels = Some([("tier".to_string(), "front".to_string())].into());
    let updated = pods.replace("web", &PostParams::default(), &changed).await.unwrap();
    assert_eq!(tolerations(&updated).len(), 2);
    assert_eq!(updated.metadata.labels.unwrap()["tier"], "front");
}

#[tokio::test]
async fn a_pod_in_a_terminating_namespace_cannot_be_bound() {
    let (client, _s, _d) = setup(Admission::default()).await;
    let nss: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "going"}})).unwrap();
    nss.create(&PostParams::default(), &ns).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "going");
    pods.create(&PostParams::default(), &pod("late", json!({}))).await.unwrap();
    // No lifecycle loop runs here: the namespace stays Terminating with its pod.
    nss.delete("going", &DeleteParams::default()).await.unwrap();
    let binding: Binding =
        serde_json::from_value(json!({"metadata": {"name": "late"}, "target": {"kind": "Node", "name": "n1"}}))
            .unwrap();
    let bound: Result<Value, kube::Error> =
        pods.create_subresource("binding", "late", &PostParams::default(), &binding).await;
    let Err(kube::Error::Api(status)) = bound else { panic!("{bound:?}") };
    assert_eq!(status.code, 403);
    assert_eq!(
        status.message,
        "pods \"late\" is forbidden: unable to create new content in namespace going because it is being terminated"
    );
    assert!(pods.get("late").await.unwrap().spec.unwrap().node_name.is_none());
}
