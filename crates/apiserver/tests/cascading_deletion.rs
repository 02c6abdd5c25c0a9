//! Cascading deletion options through the `kube` crate, in-process: `propagationPolicy` (body
//! and query) and the legacy `orphanDependents` set the garbage collector's finalizers, objects
//! held by them leave when the last one is removed, and invalid options are refused with
//! Kubernetes' messages.

use std::sync::Arc;

use axum::body::Body;
use berth_apiserver::{ApiState, lifecycle, router};
use berth_store::sqlite::SqliteStore;
use http::StatusCode;
use http_body_util::BodyExt;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{Binding, ConfigMap, Namespace, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tower::ServiceExt;

async fn setup() -> (kube::Client, Arc<ApiState>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("state.db")).unwrap();
    let state = ApiState::new(Arc::new(store), None);
    lifecycle::bootstrap(&state).await.unwrap();
    let client = kube::Client::new(router(state.clone()), "default");
    (client, state, dir)
}

/// Sends one raw request to the router; the status code and the body.
async fn send(state: &Arc<ApiState>, method: &str, path: &str, body: Option<Value>) -> (StatusCode, Value) {
    let req = http::Request::builder().method(method).uri(path).header("content-type", "application/json");
    let body = body.map(|b| Body::from(b.to_string())).unwrap_or_else(Body::empty);
    let resp = router(state.clone()).oneshot(req.body(body).unwrap()).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

fn deployment(name: &str) -> Deployment {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": "web"}},
        "spec": {"selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}
    }))
    .unwrap()
}

fn replica_set(name: &str) -> ReplicaSet {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"tier": "back"}},
        "spec": {"selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}
    }))
    .unwrap()
}

fn finalizers<K: kube::Resource>(obj: &K) -> Vec<String> {
    obj.meta().finalizers.clone().unwrap_or_default()
}

#[tokio::test]
async fn orphan_deletion_keeps_the_deployment_with_the_orphan_finalizer_until_it_is_removed() {
    let (client, _s, _d) = setup().await;
    let deps: Api<Deployment> = Api::default_namespaced(client);
    let created = deps.create(&PostParams::default(), &deployment("web")).await.unwrap();
    let answer = deps.delete("web", &DeleteParams::orphan()).await.unwrap();
    let terminating = answer.left().expect("a held object is answered as the object");
    assert!(terminating.metadata.deletion_timestamp.is_some());
    assert_eq!(terminating.metadata.deletion_grace_period_seconds, Some(0));
    assert_eq!(finalizers(&terminating), ["orphan"]);
    // A first deletion moves the generation, as Kubernetes' markAsDeleting.
    assert_eq!(terminating.metadata.generation, Some(created.metadata.generation.unwrap() + 1));
    let stored = deps.get("web").await.unwrap();
    assert_eq!(finalizers(&stored), ["orphan"]);
    // The garbage collector's last step: the finalizer goes, and with it the object.
    deps.patch("web", &PatchParams::default(), &Patch::Merge(&json!({"metadata": {"finalizers": null}})))
        .await
        .unwrap();
    assert!(deps.get_opt("web").await.unwrap().is_none());
}

#[tokio::test]
async fn foreground_deletion_holds_the_object_until_an_update_removes_the_finalizer() {
    let (client, _s, _d) = setup().await;
    let sets: Api<ReplicaSet> = Api::default_namespaced(client);
    sets.create(&PostParams::default(), &replica_set("rs")).await.unwrap();
    sets.delete("rs", &DeleteParams::foreground()).await.unwrap();
    let mut held = sets.get("rs").await.unwrap();
    assert_eq!(finalizers(&held), ["foregroundDeletion"]);
    // A PUT without the finalizer (keeping everything else) finishes the deletion.
    held.metadata.finalizers = None;
    sets.replace("rs", &PostParams::default(), &held).await.unwrap();
    assert!(sets.get_opt("rs").await.unwrap().is_none());
}

#[tokio::test]
async fn a_second_delete_switches_the_policy_and_background_removes_the_object() {
    let (client, _s, _d) = setup().await;
    let deps: Api<Deployment> = Api::default_namespaced(client);
    deps.create(&PostParams::default(), &deployment("web")).await.unwrap();
    deps.delete("web", &DeleteParams::foreground()).await.unwrap();
    let first = deps.get("web").await.unwrap();
    deps.delete("web", &DeleteParams::orphan()).await.unwrap();
    let switched = deps.get("web").await.unwrap();
    assert_eq!(finalizers(&switched), ["orphan"]);
    assert_eq!(switched.metadata.deletion_timestamp, first.metadata.deletion_timestamp);
    // Without a choice the object stays as it is.
    deps.delete("web", &DeleteParams::default()).await.unwrap();
    assert_eq!(finalizers(&deps.get("web").await.unwrap()), ["orphan"]);
    let answer = deps.delete("web", &DeleteParams::background()).await.unwrap();
    assert!(answer.is_right(), "a removed object is answered with a Status");
    assert!(deps.get_opt("web").await.unwrap().is_none());
}

#[tokio::test]
async fn background_and_unset_policies_remove_a_deployment_at_once() {
    let (client, _s, _d) = setup().await;
    let deps: Api<Deployment> = Api::default_namespaced(client);
    for (name, params) in [("a", DeleteParams::background()), ("b", DeleteParams::default())] {
        deps.create(&PostParams::default(), &deployment(name)).await.unwrap();
        deps.delete(name, &params).await.unwrap();
        assert!(deps.get_opt(name).await.unwrap().is_none(), "{name}");
    }
}

#[tokio::test]
async fn the_policy_may_come_from_the_query_and_the_legacy_option_answers_accepted() {
    let (client, state, _d) = setup().await;
    let deps: Api<Deployment> = Api::default_namespaced(client.clone());
    deps.create(&PostParams::default(), &deployment("q")).await.unwrap();
    let base = "/apis/apps/v1/namespaces/default/deployments";
    let (status, out) = send(&state, "DELETE", &format!("{base}/q?propagationPolicy=Orphan"), None).await;
    assert_eq!(status, StatusCode::OK, "{out}");
    assert_eq!(out["metadata"]["finalizers"], json!(["orphan"]));

    // orphanDependents=true is orphaning; false is background, and a held object is 202.
    deps.create(&PostParams::default(), &deployment("legacy")).await.unwrap();
    let (status, out) =
        send(&state, "DELETE", &format!("{base}/legacy"), Some(json!({"orphanDependents": true}))).await;
    assert_eq!(status, StatusCode::OK, "{out}");
    assert_eq!(out["metadata"]["finalizers"], json!(["orphan"]));
    let cms: Api<ConfigMap> = Api::default_namespaced(client);
    let held: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "held", "finalizers": ["example.com/hold"]}})).unwrap();
    cms.create(&PostParams::default(), &held).await.unwrap();
    let path = "/api/v1/namespaces/default/configmaps/held";
    let (status, out) = send(&state, "DELETE", path, Some(json!({"orphanDependents": false}))).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{out}");
    assert_eq!(out["metadata"]["finalizers"], json!(["example.com/hold"]));
}

#[tokio::test]
async fn conflicting_or_unknown_options_are_invalid_and_change_nothing() {
    let (client, state, _d) = setup().await;
    let deps: Api<Deployment> = Api::default_namespaced(client);
    deps.create(&PostParams::default(), &deployment("web")).await.unwrap();
    let before = state.store.current_revision().await.unwrap();
    let path = "/apis/apps/v1/namespaces/default/deployments/web";
    let both = json!({"kind": "DeleteOptions", "apiVersion": "v1", "orphanDependents": true, "propagationPolicy": "Foreground"});
    let (status, out) = send(&state, "DELETE", path, Some(both)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(out["reason"], "Invalid");
    assert_eq!(
        out["message"],
        "DeleteOptions.meta.k8s.io \"\" is invalid: propagationPolicy: Invalid value: \"Foreground\": orphanDependents and deletionPropagation cannot be both set"
    );
    assert_eq!(out["details"]["kind"], "DeleteOptions");
    assert_eq!(out["details"]["group"], "meta.k8s.io");
    assert_eq!(out["details"]["causes"][0]["field"], "propagationPolicy");
    let (status, out) = send(&state, "DELETE", &format!("{path}?propagationPolicy=Sideways"), None).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        out["message"],
        "DeleteOptions.meta.k8s.io \"\" is invalid: propagationPolicy: Unsupported value: \"Sideways\": supported values: \"Foreground\", \"Background\", \"Orphan\", \"nil\""
    );
    // Checked before anything is read: a missing object is invalid options too.
    let (status, _) = send(&state, "DELETE", &format!("{path}-missing?propagationPolicy=Sideways"), None).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let collection = "/apis/apps/v1/namespaces/default/deployments";
    let (status, _) = send(&state, "DELETE", collection, Some(json!({"propagationPolicy": "Later"}))).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(state.store.current_revision().await.unwrap(), before, "an invalid delete wrote");
    assert!(deps.get("web").await.unwrap().metadata.deletion_timestamp.is_none());
}

#[tokio::test]
async fn delete_collection_applies_the_policy_to_every_selected_object() {
    let (client, _s, _d) = setup().await;
    let sets: Api<ReplicaSet> = Api::default_namespaced(client);
    for name in ["a", "b"] {
        sets.create(&PostParams::default(), &replica_set(name)).await.unwrap();
    }
    let deleted =
        sets.delete_collection(&DeleteParams::orphan(), &ListParams::default().labels("tier=back")).await.unwrap();
    assert!(deleted.is_left());
    for name in ["a", "b"] {
        assert_eq!(finalizers(&sets.get(name).await.unwrap()), ["orphan"], "{name}");
    }
    sets.delete_collection(&DeleteParams::background(), &ListParams::default()).await.unwrap();
    assert!(sets.list(&ListParams::default()).await.unwrap().items.is_empty());
}

#[tokio::test]
async fn a_bound_pod_deleted_in_the_foreground_keeps_its_grace_period_and_the_finalizer() {
    let (client, _s, _d) = setup().await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}], "terminationGracePeriodSeconds": 20}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let binding: Binding =
        serde_json::from_value(json!({"metadata": {"name": "p"}, "target": {"kind": "Node", "name": "n1"}})).unwrap();
    let bound: Result<Value, _> = pods.create_subresource("binding", "p", &PostParams::default(), &binding).await;
    bound.unwrap();
    pods.delete("p", &DeleteParams::foreground()).await.unwrap();
    let terminating = pods.get("p").await.unwrap();
    assert_eq!(terminating.metadata.deletion_grace_period_seconds, Some(20));
    assert_eq!(finalizers(&terminating), ["foregroundDeletion"]);
    // The node confirms: grace 0, but the finalizer still holds the pod.
    pods.delete("p", &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await.unwrap();
    let confirmed = pods.get("p").await.unwrap();
    assert_eq!(confirmed.metadata.deletion_grace_period_seconds, Some(0));
    assert_eq!(finalizers(&confirmed), ["foregroundDeletion"]);
    pods.patch("p", &PatchParams::default(), &Patch::Merge(&json!({"metadata": {"finalizers": null}}))).await.unwrap();
    assert!(pods.get_opt("p").await.unwrap().is_none());
}

#[tokio::test]
async fn the_system_namespaces_may_not_be_deleted() {
    let (client, _s, _d) = setup().await;
    let nss: Api<Namespace> = Api::all(client);
    for ns in ["default", "kube-system", "kube-public"] {
        let err = nss.delete(ns, &DeleteParams::default()).await.unwrap_err();
        let kube::Error::Api(status) = err else { panic!("{err:?}") };
        assert_eq!(status.code, 403);
        assert_eq!(status.message, format!("namespaces \"{ns}\" is forbidden: this namespace may not be deleted"));
        assert!(nss.get(ns).await.unwrap().metadata.deletion_timestamp.is_none());
    }
    // Another namespace is deleted with the finalizer its policy asks for.
    let team: Namespace = serde_json::from_value(json!({"metadata": {"name": "team"}})).unwrap();
    nss.create(&PostParams::default(), &team).await.unwrap();
    nss.delete("team", &DeleteParams::orphan()).await.unwrap();
    let terminating = nss.get("team").await.unwrap();
    assert_eq!(terminating.status.as_ref().unwrap().phase.as_deref(), Some("Terminating"));
    assert_eq!(finalizers(&terminating), ["orphan"]);
}
