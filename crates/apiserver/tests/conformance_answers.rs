//! Answers Kubernetes' conformance suite and its official clients check to the letter: discovery
//! roots, namespace status patches, duplicate fields, event field selectors and delete answers.

use std::sync::Arc;

use axum::body::Body;
use berth_apiserver::{ApiState, lifecycle, router};
use berth_store::sqlite::SqliteStore;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

struct Api {
    state: Arc<ApiState>,
    _dir: tempfile::TempDir,
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Value,
}

impl Api {
    async fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("state.db")).unwrap();
        let state = ApiState::new(Arc::new(store), None);
        lifecycle::bootstrap(&state).await.unwrap();
        Api { state, _dir: dir }
    }

    async fn send(&self, method: &str, path: &str, content_type: &str, body: impl Into<Body>) -> Answer {
        let req = Request::builder().method(method).uri(path).header("content-type", content_type);
        let resp = router(self.state.clone()).oneshot(req.body(body.into()).unwrap()).await.unwrap();
        let status = resp.status();
        let headers = resp.headers().clone();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        Answer { status, headers, body: serde_json::from_slice(&bytes).unwrap_or(Value::Null) }
    }

    async fn json(&self, method: &str, path: &str, body: &Value) -> Answer {
        self.send(method, path, "application/json", body.to_string()).await
    }

    async fn get(&self, path: &str) -> Answer {
        self.send("GET", path, "application/json", Body::empty()).await
    }

    async fn delete(&self, path: &str) -> Answer {
        self.send("DELETE", path, "application/json", Body::empty()).await
    }
}

fn warnings(headers: &HeaderMap) -> Vec<String> {
    headers.get_all("warning").iter().map(|v| v.to_str().unwrap().to_string()).collect()
}

#[tokio::test]
async fn discovery_roots_answer_alike_with_a_trailing_slash() {
    let api = Api::new().await;
    for (path, kind) in
        [("/api", "APIVersions"), ("/api/", "APIVersions"), ("/apis", "APIGroupList"), ("/apis/", "APIGroupList")]
    {
        let got = api.get(path).await;
        assert_eq!(got.status, StatusCode::OK, "{path}: {}", got.body);
        assert_eq!(got.body["kind"], kind, "{path}");
    }
    assert_eq!(api.get("/api/").await.body, api.get("/api").await.body);
    assert_eq!(api.get("/apis/").await.body, api.get("/apis").await.body);
    let group = api.get("/apis/events.k8s.io/").await;
    assert_eq!(group.status, StatusCode::OK, "a group with a trailing slash: {}", group.body);
    assert_eq!(group.body, api.get("/apis/events.k8s.io").await.body);
}

#[tokio::test]
async fn a_merge_patch_on_namespace_status_applies_metadata_but_not_the_spec() {
    let api = Api::new().await;
    let created = api.json("POST", "/api/v1/namespaces", &json!({"metadata": {"name": "team"}})).await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    let patch = json!({
        "metadata": {"annotations": {"e2e-patched-ns-status": "true"}, "labels": {"tier": "gold"}},
        "spec": {"finalizers": []},
        "status": {"conditions": [{"type": "StatusPatch", "status": "True", "reason": "E2E", "message": "patched"}]},
    });
    let got =
        api.send("PATCH", "/api/v1/namespaces/team/status", "application/merge-patch+json", patch.to_string()).await;
    assert_eq!(got.status, StatusCode::OK, "{}", got.body);
    let stored = api.get("/api/v1/namespaces/team").await.body;
    assert_eq!(stored["metadata"]["annotations"]["e2e-patched-ns-status"], "true", "{stored}");
    assert_eq!(stored["metadata"]["labels"]["tier"], "gold");
    assert_eq!(stored["metadata"]["labels"]["kubernetes.io/metadata.name"], "team");
    assert_eq!(stored["status"]["conditions"][0]["type"], "StatusPatch");
    assert_eq!(stored["spec"]["finalizers"], json!(["kubernetes"]), "the spec changes only on the main resource");
    assert_eq!(stored["metadata"]["uid"], created.body["metadata"]["uid"]);
}

#[tokio::test]
async fn a_pod_status_patch_still_changes_only_the_status() {
    let api = Api::new().await;
    let pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}});
    api.json("POST", "/api/v1/namespaces/default/pods", &pod).await;
    let patch = json!({"metadata": {"annotations": {"a": "b"}}, "status": {"message": "hello"}});
    let got = api
        .send("PATCH", "/api/v1/namespaces/default/pods/p/status", "application/merge-patch+json", patch.to_string())
        .await;
    assert_eq!(got.status, StatusCode::OK, "{}", got.body);
    assert_eq!(got.body["status"]["message"], "hello");
    assert!(got.body["metadata"].get("annotations").is_none(), "{}", got.body);
}

const DEPLOYMENT_WITH_DUPLICATES: &str = r#"{
    "apiVersion": "apps/v1", "kind": "Deployment",
    "metadata": {"name": "my-dep", "labels": {"app": "nginx"}},
    "spec": {
        "unknownField": "foo",
        "replicas": 2,
        "replicas": 3,
        "selector": {"matchLabels": {"app": "nginx"}},
        "template": {
            "metadata": {"labels": {"app": "nginx"}},
            "spec": {"containers": [{"name": "nginx", "image": "nginx:latest"}]}
        }
    }
}"#;

#[tokio::test]
async fn strict_field_validation_rejects_unknown_and_duplicate_fields_together() {
    let api = Api::new().await;
    let path = "/apis/apps/v1/namespaces/default/deployments?fieldValidation=Strict";
    let got = api.send("POST", path, "application/json", DEPLOYMENT_WITH_DUPLICATES).await;
    assert_eq!(got.status, StatusCode::BAD_REQUEST, "{}", got.body);
    assert_eq!(got.body["reason"], "BadRequest");
    let message = got.body["message"].as_str().unwrap();
    assert!(
        message
            .contains(r#"strict decoding error: unknown field "spec.unknownField", duplicate field "spec.replicas""#),
        "{message}"
    );
    assert_eq!(api.get("/apis/apps/v1/namespaces/default/deployments/my-dep").await.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn duplicate_fields_are_warned_about_and_the_last_value_wins() {
    let api = Api::new().await;
    let got = api
        .send("POST", "/apis/apps/v1/namespaces/default/deployments", "application/json", DEPLOYMENT_WITH_DUPLICATES)
        .await;
    assert_eq!(got.status, StatusCode::CREATED, "{}", got.body);
    assert_eq!(got.body["spec"]["replicas"], 3);
    let w = warnings(&got.headers);
    assert!(w.contains(&r#"299 - "duplicate field \"spec.replicas\"""#.to_string()), "{w:?}");
    assert!(w.contains(&r#"299 - "unknown field \"spec.unknownField\"""#.to_string()), "{w:?}");
    // Ignore says nothing, and an update is checked like a create.
    let mut update: Value = got.body.clone();
    update["spec"]["replicas"] = json!(1);
    let body = update.to_string().replacen(r#""replicas":1"#, r#""replicas":4,"replicas":1"#, 1);
    let path = "/apis/apps/v1/namespaces/default/deployments/my-dep";
    let ignored = api.send("PUT", &format!("{path}?fieldValidation=Ignore"), "application/json", body.clone()).await;
    assert_eq!(ignored.status, StatusCode::OK, "{}", ignored.body);
    assert!(warnings(&ignored.headers).is_empty());
    let strict = api.send("PUT", &format!("{path}?fieldValidation=Strict"), "application/json", body).await;
    assert_eq!(strict.status, StatusCode::BAD_REQUEST, "{}", strict.body);
    assert!(strict.body["message"].as_str().unwrap().contains(r#"duplicate field "spec.replicas""#));
}

#[tokio::test]
async fn events_are_selected_by_source_or_else_by_their_reporting_controller() {
    let api = Api::new().await;
    let core = json!({"metadata": {"name": "pulled"}, "involvedObject": {"kind": "Pod", "name": "web", "namespace": "default"},
        "reason": "Pulled", "type": "Normal", "message": "pulled", "source": {"component": "kubelet", "host": "n1"}});
    let got = api.json("POST", "/api/v1/namespaces/default/events", &core).await;
    assert_eq!(got.status, StatusCode::CREATED, "{}", got.body);
    let v1 = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "scheduled"},
        "regarding": {"kind": "Pod", "name": "web", "namespace": "default"}, "reason": "Scheduled", "type": "Normal",
        "note": "bound", "action": "Binding", "eventTime": "2026-01-01T00:00:00.000000Z",
        "reportingController": "default-scheduler", "reportingInstance": "s1"});
    let got = api.json("POST", "/apis/events.k8s.io/v1/namespaces/default/events", &v1).await;
    assert_eq!(got.status, StatusCode::CREATED, "{}", got.body);
    let names = |body: &Value| -> Vec<String> {
        body["items"].as_array().unwrap().iter().map(|e| e["metadata"]["name"].as_str().unwrap().to_string()).collect()
    };
    let core_list = "/api/v1/namespaces/default/events?fieldSelector=";
    assert_eq!(names(&api.get(&format!("{core_list}source%3Dkubelet")).await.body), ["pulled"]);
    assert_eq!(names(&api.get(&format!("{core_list}source%3Ddefault-scheduler")).await.body), ["scheduled"]);
    assert_eq!(
        names(&api.get(&format!("{core_list}reportingComponent%3Ddefault-scheduler")).await.body),
        ["scheduled"]
    );
    let v1_list = "/apis/events.k8s.io/v1/namespaces/default/events?fieldSelector=";
    assert_eq!(names(&api.get(&format!("{v1_list}regarding.name%3Dweb,reason%3DScheduled")).await.body), ["scheduled"]);
    assert_eq!(names(&api.get(&format!("{v1_list}reportingController%3Ddefault-scheduler")).await.body), ["scheduled"]);
    // Each view takes only its own field labels.
    let wrong = api.get(&format!("{v1_list}involvedObject.name%3Dweb")).await;
    assert_eq!(wrong.status, StatusCode::BAD_REQUEST, "{}", wrong.body);
    assert_eq!(wrong.body["message"], "field label not supported: involvedObject.name");
}

#[tokio::test]
async fn a_pod_removed_at_once_is_answered_with_the_pod() {
    let api = Api::new().await;
    let pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}});
    let created = api.json("POST", "/api/v1/namespaces/default/pods", &pod).await.body;
    let got = api.delete("/api/v1/namespaces/default/pods/p").await;
    assert_eq!(got.status, StatusCode::OK, "{}", got.body);
    assert_eq!(got.body["kind"], "Pod", "{}", got.body);
    assert_eq!(got.body["metadata"]["uid"], created["metadata"]["uid"]);
    assert_eq!(api.get("/api/v1/namespaces/default/pods/p").await.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_pod_deleted_gracefully_is_answered_with_the_pod_as_it_now_is() {
    let api = Api::new().await;
    let pod = json!({"metadata": {"name": "p"}, "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "busybox"}]}});
    api.json("POST", "/api/v1/namespaces/default/pods", &pod).await;
    let got = api.delete("/api/v1/namespaces/default/pods/p").await;
    assert_eq!(got.status, StatusCode::OK, "{}", got.body);
    assert_eq!(got.body["kind"], "Pod");
    assert_eq!(got.body["metadata"]["deletionGracePeriodSeconds"], 30);
    assert!(got.body["metadata"]["deletionTimestamp"].is_string());
}

#[tokio::test]
async fn services_service_accounts_and_namespaces_are_answered_with_the_object() {
    let api = Api::new().await;
    let service = json!({"metadata": {"name": "s"}, "spec": {"ports": [{"port": 80}], "selector": {"app": "x"}}});
    let got = api.json("POST", "/api/v1/namespaces/default/services", &service).await;
    assert_eq!(got.status, StatusCode::CREATED, "{}", got.body);
    api.json("POST", "/api/v1/namespaces/default/serviceaccounts", &json!({"metadata": {"name": "robot"}})).await;
    api.json("POST", "/api/v1/namespaces", &json!({"metadata": {"name": "team"}})).await;
    for (path, kind) in [
        ("/api/v1/namespaces/default/services/s", "Service"),
        ("/api/v1/namespaces/default/serviceaccounts/robot", "ServiceAccount"),
        ("/api/v1/namespaces/team", "Namespace"),
    ] {
        let got = api.delete(path).await;
        assert_eq!(got.status, StatusCode::OK, "{path}: {}", got.body);
        assert_eq!(got.body["kind"], kind, "{path}: {}", got.body);
    }
}

#[tokio::test]
async fn other_kinds_removed_at_once_are_answered_with_a_success_status() {
    let api = Api::new().await;
    let created =
        api.json("POST", "/api/v1/namespaces/default/configmaps", &json!({"metadata": {"name": "c"}})).await.body;
    let got = api.delete("/api/v1/namespaces/default/configmaps/c").await;
    assert_eq!(got.status, StatusCode::OK, "{}", got.body);
    assert_eq!(
        got.body,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
            "details": {"name": "c", "kind": "configmaps", "uid": created["metadata"]["uid"]}})
    );
    // A finalizer keeps the object: the answer is the object, marked.
    let held = json!({"metadata": {"name": "h", "finalizers": ["example.com/hold"]}});
    api.json("POST", "/api/v1/namespaces/default/configmaps", &held).await;
    let got = api.delete("/api/v1/namespaces/default/configmaps/h").await;
    assert_eq!(got.status, StatusCode::OK, "{}", got.body);
    assert_eq!(got.body["kind"], "ConfigMap");
    assert!(got.body["metadata"]["deletionTimestamp"].is_string());
}
