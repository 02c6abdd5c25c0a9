//! The core/v1 ReplicationController and PodTemplate kinds through the `kube` crate, in-process:
//! defaulting, validation, the verbs, the scale subresource, watches and kubectl tables.

use std::sync::Arc;

use berth_apiserver::{ApiState, lifecycle, router};
use berth_store::sqlite::SqliteStore;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{PodTemplate, ReplicationController};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde_json::{Value, json};

async fn setup() -> (kube::Client, Arc<ApiState>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("state.db")).unwrap();
    let state = ApiState::new(Arc::new(store), None);
    lifecycle::bootstrap(&state).await.unwrap();
    let client = kube::Client::new(router(state.clone()), "default");
    (client, state, dir)
}

fn rc(name: &str, selector: Option<Value>) -> ReplicationController {
    let mut spec = json!({
        "replicas": 2,
        "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "web", "image": "nginx:1.27"}]}}
    });
    if let Some(s) = selector {
        spec["selector"] = s;
    }
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap()
}

fn pod_template(name: &str) -> PodTemplate {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
    }))
    .unwrap()
}

fn message(e: kube::Error) -> (u16, String) {
    match e {
        kube::Error::Api(s) => (s.code, s.message),
        other => panic!("expected an API error, got {other}"),
    }
}

async fn table(client: &kube::Client, path: &str) -> Value {
    let req = http::Request::get(path)
        .header("accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
        .body(Vec::new())
        .unwrap();
    client.request(req).await.unwrap()
}

fn column_names(table: &Value) -> Vec<&str> {
    table["columnDefinitions"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect()
}

#[tokio::test]
async fn replication_controllers_in_kube_system_list_empty() {
    let (client, _s, _d) = setup().await;
    let rcs: Api<ReplicationController> = Api::namespaced(client, "kube-system");
    let list = rcs.list(&ListParams::default()).await.unwrap();
    assert!(list.items.is_empty());
    assert!(list.metadata.resource_version.is_some());
}

#[tokio::test]
async fn a_replication_controller_is_created_with_defaults_and_read_listed_updated_and_deleted() {
    let (client, _s, _d) = setup().await;
    let rcs: Api<ReplicationController> = Api::default_namespaced(client);
    let created = rcs.create(&PostParams::default(), &rc("web", None)).await.unwrap();
    let spec = created.spec.clone().unwrap();
    assert_eq!(spec.selector, Some([("app".to_string(), "web".to_string())].into()));
    assert_eq!(created.metadata.labels, spec.selector, "the object's labels come from the template");
    assert_eq!(spec.template.unwrap().spec.unwrap().restart_policy.as_deref(), Some("Always"));
    assert_eq!(created.metadata.generation, Some(1));
    assert_eq!(created.status.as_ref().map(|s| s.replicas), Some(0));

    let got = rcs.get("web").await.unwrap();
    assert_eq!(got.metadata.uid, created.metadata.uid);
    let names: Vec<_> =
        rcs.list(&ListParams::default()).await.unwrap().items.into_iter().map(|r| r.metadata.name).collect();
    assert_eq!(names, [Some("web".to_string())]);

    let mut more = got.clone();
    more.spec.as_mut().unwrap().replicas = Some(5);
    let updated = rcs.replace("web", &PostParams::default(), &more).await.unwrap();
    assert_eq!(updated.spec.unwrap().replicas, Some(5));
    assert_eq!(updated.metadata.generation, Some(2));

    rcs.delete("web", &DeleteParams::default()).await.unwrap();
    let (code, _) = message(rcs.get("web").await.unwrap_err());
    assert_eq!(code, 404);
}

#[tokio::test]
async fn a_replication_controller_whose_selector_misses_its_template_labels_is_refused() {
    let (client, _s, _d) = setup().await;
    let rcs: Api<ReplicationController> = Api::default_namespaced(client);
    let err = rcs.create(&PostParams::default(), &rc("web", Some(json!({"app": "db"})))).await.unwrap_err();
    let (code, msg) = message(err);
    assert_eq!(code, 422);
    assert!(
        msg.contains("spec.template.metadata.labels: Invalid value: {\"app\":\"web\"}: `selector` does not match template `labels`"),
        "{msg}"
    );
    let mut negative = rc("neg", None);
    negative.spec.as_mut().unwrap().replicas = Some(-1);
    let (code, msg) = message(rcs.create(&PostParams::default(), &negative).await.unwrap_err());
    assert_eq!(code, 422);
    assert!(msg.contains("spec.replicas: Invalid value: -1: must be greater than or equal to 0"), "{msg}");
}

#[tokio::test]
async fn a_replication_controller_scales_through_its_scale_subresource() {
    let (client, _s, _d) = setup().await;
    let rcs: Api<ReplicationController> = Api::default_namespaced(client);
    rcs.create(&PostParams::default(), &rc("web", None)).await.unwrap();
    let scale = rcs.get_scale("web").await.unwrap();
    assert_eq!(scale.spec.unwrap().replicas, Some(2));
    assert_eq!(scale.status.unwrap().selector.as_deref(), Some("app=web"));
    rcs.patch_scale("web", &PatchParams::default(), &Patch::Merge(&json!({"spec": {"replicas": 4}}))).await.unwrap();
    assert_eq!(rcs.get("web").await.unwrap().spec.unwrap().replicas, Some(4));
}

#[tokio::test]
async fn replication_controllers_print_the_kubectl_table() {
    let (client, _s, _d) = setup().await;
    let rcs: Api<ReplicationController> = Api::default_namespaced(client.clone());
    rcs.create(&PostParams::default(), &rc("web", None)).await.unwrap();
    let t = table(&client, "/api/v1/namespaces/default/replicationcontrollers").await;
    assert_eq!(column_names(&t), ["Name", "Desired", "Current", "Ready", "Age", "Containers", "Images", "Selector"]);
    let cells = &t["rows"][0]["cells"];
    assert_eq!(cells[0], "web");
    assert_eq!(cells[1], 2);
    assert_eq!(cells[2], 0);
    assert_eq!(cells[3], 0);
    assert_eq!(cells[5], "web");
    assert_eq!(cells[6], "nginx:1.27");
    assert_eq!(cells[7], "app=web");
}

#[tokio::test]
async fn a_pod_template_is_created_read_listed_watched_updated_and_deleted() {
    let (client, _s, _d) = setup().await;
    let templates: Api<PodTemplate> = Api::default_namespaced(client);
    let created = templates.create(&PostParams::default(), &pod_template("t")).await.unwrap();
    let spec = created.template.clone().unwrap().spec.unwrap();
    assert_eq!(spec.restart_policy.as_deref(), Some("Always"));
    assert_eq!(templates.get("t").await.unwrap().metadata.uid, created.metadata.uid);
    assert_eq!(templates.list(&ListParams::default()).await.unwrap().items.len(), 1);

    let rv = created.metadata.resource_version.clone().unwrap();
    let mut events = templates.watch(&WatchParams::default().timeout(5), &rv).await.unwrap().boxed();

    let mut changed = created.clone();
    changed.template.as_mut().unwrap().metadata.as_mut().unwrap().labels =
        Some([("app".to_string(), "other".to_string())].into());
    let updated = templates.replace("t", &PostParams::default(), &changed).await.unwrap();
    assert_eq!(updated.template.unwrap().metadata.unwrap().labels.unwrap()["app"], "other");

    match events.try_next().await.unwrap() {
        Some(WatchEvent::Modified(t)) => assert_eq!(t.metadata.name.as_deref(), Some("t")),
        other => panic!("expected the update, got {other:?}"),
    }

    templates.delete("t", &DeleteParams::default()).await.unwrap();
    match events.try_next().await.unwrap() {
        Some(WatchEvent::Deleted(t)) => assert_eq!(t.metadata.name.as_deref(), Some("t")),
        other => panic!("expected the delete, got {other:?}"),
    }
    assert_eq!(message(templates.get("t").await.unwrap_err()).0, 404);
}

#[tokio::test]
async fn a_pod_template_without_containers_is_refused() {
    let (client, _s, _d) = setup().await;
    let templates: Api<PodTemplate> = Api::default_namespaced(client);
    let bad: PodTemplate =
        serde_json::from_value(json!({"metadata": {"name": "t"}, "template": {"spec": {"containers": []}}})).unwrap();
    let (code, msg) = message(templates.create(&PostParams::default(), &bad).await.unwrap_err());
    assert_eq!(code, 422);
    assert!(msg.contains("template.spec.containers: Required value"), "{msg}");
}

#[tokio::test]
async fn pod_templates_print_the_kubectl_table() {
    let (client, _s, _d) = setup().await;
    let templates: Api<PodTemplate> = Api::default_namespaced(client.clone());
    templates.create(&PostParams::default(), &pod_template("t")).await.unwrap();
    let t = table(&client, "/api/v1/namespaces/default/podtemplates").await;
    assert_eq!(column_names(&t), ["Name", "Containers", "Images", "Pod Labels"]);
    assert_eq!(t["rows"][0]["cells"], json!(["t", "c", "busybox", "app=t"]));
}
