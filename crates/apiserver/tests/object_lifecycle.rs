//! Object lifecycles through the `kube` crate, in-process: binding, status, graceful pod
//! deletion, finalizers, namespace termination, scale, dry runs and default namespaces.

use std::sync::Arc;

use berth_apiserver::{ApiState, lifecycle, router};
use berth_store::sqlite::SqliteStore;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Binding, ConfigMap, Namespace, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

async fn setup() -> (kube::Client, Arc<ApiState>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("state.db")).unwrap();
    let state = ApiState::new(Arc::new(store), None);
    lifecycle::bootstrap(&state).await.unwrap();
    let client = kube::Client::new(router(state.clone()), "default");
    (client, state, dir)
}

fn pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "busybox"}], "terminationGracePeriodSeconds": 20}
    }))
    .unwrap()
}

async fn bind(client: &kube::Client, name: &str, node: &str) -> Result<(), kube::Error> {
    let binding: Binding =
        serde_json::from_value(json!({"metadata": {"name": name}, "target": {"kind": "Node", "name": node}})).unwrap();
    let req = http::Request::post(format!("/api/v1/namespaces/default/pods/{name}/binding"))
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&binding).unwrap())
        .unwrap();
    client.request::<serde_json::Value>(req).await.map(|_| ())
}

#[tokio::test]
async fn created_pods_get_kubernetes_defaults_and_pending_status() {
    let (client, _s, _d) = setup().await;
    let pods: Api<Pod> = Api::default_namespaced(client);
    let p = pods.create(&PostParams::default(), &pod("a")).await.unwrap();
    let spec = p.spec.unwrap();
    assert_eq!(spec.restart_policy.as_deref(), Some("Always"));
    assert_eq!(spec.scheduler_name.as_deref(), Some("default-scheduler"));
    assert_eq!(spec.containers[0].image_pull_policy.as_deref(), Some("Always"));
    let status = p.status.unwrap();
    assert_eq!(status.phase.as_deref(), Some("Pending"));
    assert_eq!(status.qos_class.as_deref(), Some("BestEffort"));
    assert!(p.metadata.uid.is_some() && p.metadata.creation_timestamp.is_some());
}

#[tokio::test]
async fn binding_sets_the_node_once_and_status_updates_keep_the_spec() {
    let (client, _s, _d) = setup().await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    pods.create(&PostParams::default(), &pod("a")).await.unwrap();
    bind(&client, "a", "n1").await.unwrap();
    let err = bind(&client, "a", "n2").await.unwrap_err();
    assert!(matches!(&err, kube::Error::Api(s) if s.code == 409 && s.message.contains("already assigned")), "{err:?}");
    let got = pods.get("a").await.unwrap();
    assert_eq!(got.spec.as_ref().unwrap().node_name.as_deref(), Some("n1"));

    let patch = json!({"status": {"phase": "Running", "podIP": "10.0.0.5"}, "spec": {"nodeName": "evil"}});
    pods.patch_status("a", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    let got = pods.get("a").await.unwrap();
    assert_eq!(got.status.unwrap().phase.as_deref(), Some("Running"));
    assert_eq!(got.spec.unwrap().node_name.as_deref(), Some("n1"), "status updates must not change the spec");
}

#[tokio::test]
async fn bound_pods_are_deleted_gracefully_and_removed_when_the_node_confirms() {
    let (client, _s, _d) = setup().await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    pods.create(&PostParams::default(), &pod("a")).await.unwrap();
    bind(&client, "a", "n1").await.unwrap();
    pods.delete("a", &DeleteParams::default()).await.unwrap();
    let terminating = pods.get("a").await.unwrap();
    assert!(terminating.metadata.deletion_timestamp.is_some());
    assert_eq!(terminating.metadata.deletion_grace_period_seconds, Some(20));
    // The node agent confirms with a zero grace period.
    pods.delete("a", &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await.unwrap();
    assert!(pods.get_opt("a").await.unwrap().is_none());
    // An unbound pod goes at once.
    pods.create(&PostParams::default(), &pod("b")).await.unwrap();
    pods.delete("b", &DeleteParams::default()).await.unwrap();
    assert!(pods.get_opt("b").await.unwrap().is_none());
}

#[tokio::test]
async fn finalizers_hold_an_object_until_they_are_removed() {
    let (client, _s, _d) = setup().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(client);
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "held", "finalizers": ["example.com/hold"]}})).unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    cms.delete("held", &DeleteParams::default()).await.unwrap();
    let held = cms.get("held").await.unwrap();
    assert!(held.metadata.deletion_timestamp.is_some());
    let patch = json!({"metadata": {"finalizers": null}});
    cms.patch("held", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    assert!(cms.get_opt("held").await.unwrap().is_none());
}

/// The server's half of namespace deletion: the namespace terminates and refuses new content;
/// once its content is gone and the `kubernetes` finalizer is removed through `finalize`, it
/// disappears. (Emptying it is the namespace controller's half, tested in berth-controllers.)
#[tokio::test]
async fn a_deleted_namespace_terminates_and_disappears_once_finalized() {
    let (client, _s, _d) = setup().await;
    let nss: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "gone"}})).unwrap();
    let created = nss.create(&PostParams::default(), &ns).await.unwrap();
    assert_eq!(created.spec.unwrap().finalizers, Some(vec!["kubernetes".to_string()]));
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "gone");
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "c"}})).unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    nss.delete("gone", &DeleteParams::default()).await.unwrap();

    // Terminating, and nothing new may be created in it.
    let n = nss.get("gone").await.unwrap();
    assert!(n.metadata.deletion_timestamp.is_some());
    assert_eq!(n.status.clone().unwrap().phase.as_deref(), Some("Terminating"));
    let cm2: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "late"}})).unwrap();
    let Err(kube::Error::Api(s)) = cms.create(&PostParams::default(), &cm2).await else {
        panic!("created content in a terminating namespace")
    };
    assert_eq!(s.code, 403);
    assert!(s.message.contains("because it is being terminated"), "{}", s.message);

    // What the namespace controller does: empty it, then remove its finalizer.
    cms.delete("c", &DeleteParams::default()).await.unwrap();
    let mut finalized = n.clone();
    finalized.spec.as_mut().unwrap().finalizers = Some(vec![]);
    nss.replace_subresource::<Namespace>("finalize", "gone", &PostParams::default(), &finalized).await.unwrap();
    assert!(nss.get_opt("gone").await.unwrap().is_none());
}

#[tokio::test]
async fn scale_subresource_changes_replicas_and_bumps_generation() {
    let (client, _s, _d) = setup().await;
    let deps: Api<Deployment> = Api::default_namespaced(client);
    let d: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}
    }))
    .unwrap();
    let created = deps.create(&PostParams::default(), &d).await.unwrap();
    assert_eq!(created.spec.as_ref().unwrap().replicas, Some(1));
    assert_eq!(created.metadata.generation, Some(1));
    let scale = deps.get_scale("web").await.unwrap();
    assert_eq!(scale.spec.unwrap().replicas, Some(1));
    deps.patch_scale("web", &PatchParams::default(), &Patch::Merge(&json!({"spec": {"replicas": 3}}))).await.unwrap();
    let got = deps.get("web").await.unwrap();
    assert_eq!(got.spec.unwrap().replicas, Some(3));
    assert_eq!(got.metadata.generation, Some(2));
}

#[tokio::test]
async fn dry_run_creates_nothing() {
    let (client, state, _d) = setup().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(client);
    let before = state.store.current_revision().await.unwrap();
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "dry"}})).unwrap();
    let out = cms.create(&PostParams { dry_run: true, ..Default::default() }, &cm).await.unwrap();
    assert_eq!(out.metadata.name.as_deref(), Some("dry"));
    assert_eq!(state.store.current_revision().await.unwrap(), before);
    assert!(cms.get_opt("dry").await.unwrap().is_none());
}

#[tokio::test]
async fn the_system_namespaces_exist_from_the_start() {
    let (client, _s, _d) = setup().await;
    let nss: Api<Namespace> = Api::all(client);
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        let n = nss.get(ns).await.unwrap();
        assert_eq!(n.status.unwrap().phase.as_deref(), Some("Active"));
    }
}

/// `path`'s list as JSON: its `items`, and `metadata.continue` if there is more.
async fn list_json(client: &kube::Client, path: &str) -> (Vec<serde_json::Value>, Option<String>) {
    let req = http::Request::get(path).body(Vec::new()).unwrap();
    let list: serde_json::Value = client.request(req).await.unwrap();
    let next = list["metadata"]["continue"].as_str().map(str::to_string);
    (list["items"].as_array().cloned().unwrap_or_default(), next)
}

#[tokio::test]
async fn a_whole_list_copied_from_the_stored_objects_holds_what_pages_of_decoded_objects_hold() {
    let (client, _s, _d) = setup().await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    // More than one chunk of the store, some pods bound to each of two nodes.
    for i in 0..1100 {
        let name = format!("p{i:04}");
        pods.create(&PostParams::default(), &pod(&name)).await.unwrap();
        match i % 3 {
            0 => bind(&client, &name, "n1").await.unwrap(),
            1 => bind(&client, &name, "n2").await.unwrap(),
            _ => {}
        }
    }
    for (query, expected) in
        [("", 1100), ("fieldSelector=spec.nodeName%3Dn1", 367), ("fieldSelector=spec.nodeName%3D", 366)]
    {
        let (whole, next) = list_json(&client, &format!("/api/v1/pods?{query}")).await;
        assert!(next.is_none(), "{query}: a whole list has no continue");
        let mut paged = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let cont = token.as_deref().map(|t| format!("&continue={t}")).unwrap_or_default();
            let (items, next) = list_json(&client, &format!("/api/v1/pods?limit=400&{query}{cont}")).await;
            paged.extend(items);
            match next {
                Some(t) => token = Some(t),
                None => break,
            }
        }
        assert_eq!(whole.len(), expected, "{query}");
        assert_eq!(whole, paged, "{query}: the same objects, field for field");
        assert!(
            whole
                .iter()
                .all(|p| p["kind"] == "Pod" && p["apiVersion"] == "v1" && p["metadata"]["resourceVersion"].is_string()),
            "{query}: every item says what it is and its resourceVersion"
        );
        let first_keys: Vec<&str> = whole[0].as_object().unwrap().keys().take(2).map(String::as_str).collect();
        assert_eq!(first_keys, ["kind", "apiVersion"], "{query}: written as Kubernetes orders an object");
    }
}
