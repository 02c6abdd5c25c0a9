//! Bad input gets the status code and message Kubernetes gives, and changes nothing.

use std::sync::Arc;

use axum::body::Body;
use berth_apiserver::authn::TokenAuthenticator;
use berth_apiserver::{ApiState, lifecycle, router};
use berth_store::sqlite::SqliteStore;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

const TOKEN: &str = "test-admin-token-0123456789";

struct Api {
    state: Arc<ApiState>,
    _dir: tempfile::TempDir,
}

impl Api {
    async fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("state.db")).unwrap();
        let state = ApiState::new(Arc::new(store), Some(TokenAuthenticator::new(TOKEN.to_string())));
        lifecycle::bootstrap(&state).await.unwrap();
        Api { state, _dir: dir }
    }

    async fn send(
        &self,
        method: &str,
        path: &str,
        content_type: &str,
        body: impl Into<Body>,
        token: Option<&str>,
    ) -> (StatusCode, Value) {
        let mut req = Request::builder().method(method).uri(path).header("content-type", content_type);
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let resp = router(self.state.clone()).oneshot(req.body(body.into()).unwrap()).await.unwrap();
        let status = resp.status();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }

    async fn json(&self, method: &str, path: &str, body: &Value) -> (StatusCode, Value) {
        self.send(method, path, "application/json", body.to_string(), Some(TOKEN)).await
    }

    async fn revision(&self) -> i64 {
        self.state.store.current_revision().await.unwrap()
    }
}

fn pod(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
}

const PODS: &str = "/api/v1/namespaces/default/pods";

fn assert_status(got: &(StatusCode, Value), code: u16, reason: &str, message_part: &str) {
    assert_eq!(got.0.as_u16(), code, "{}", got.1);
    assert_eq!(got.1["kind"], "Status", "{}", got.1);
    assert_eq!(got.1["code"], code, "{}", got.1);
    assert_eq!(got.1["reason"], reason, "{}", got.1);
    let msg = got.1["message"].as_str().unwrap_or("");
    assert!(msg.contains(message_part), "message {msg:?} lacks {message_part:?}");
}

#[tokio::test]
async fn malformed_json_is_a_bad_request_and_stores_nothing() {
    let api = Api::new().await;
    let before = api.revision().await;
    let got = api.send("POST", PODS, "application/json", "{\"apiVersion\": \"v1\", \"kind\": ", Some(TOKEN)).await;
    assert_status(&got, 400, "BadRequest", "json parse error");
    assert_eq!(api.revision().await, before);
}

#[tokio::test]
async fn malformed_yaml_is_a_bad_request_and_stores_nothing() {
    let api = Api::new().await;
    let before = api.revision().await;
    let got = api.send("POST", PODS, "application/yaml", "kind: Pod\n  metadata: [unclosed\n", Some(TOKEN)).await;
    assert_status(&got, 400, "BadRequest", "YAML");
    assert_eq!(api.revision().await, before);
}

#[tokio::test]
async fn wrong_api_version_or_kind_is_a_bad_request() {
    let api = Api::new().await;
    let before = api.revision().await;
    let mut p = pod("a");
    p["apiVersion"] = json!("v2");
    let got = api.json("POST", PODS, &p).await;
    assert_status(
        &got,
        400,
        "BadRequest",
        "the API version in the data (v2) does not match the expected API version (v1)",
    );
    let mut p = pod("a");
    p["kind"] = json!("ConfigMap");
    let got = api.json("POST", PODS, &p).await;
    assert_status(&got, 400, "BadRequest", "must be of type Pod");
    assert_eq!(api.revision().await, before);
}

#[tokio::test]
async fn invalid_names_are_unprocessable_with_field_causes() {
    let api = Api::new().await;
    let before = api.revision().await;
    let got = api.json("POST", PODS, &pod("Bad_Name")).await;
    assert_status(&got, 422, "Invalid", "Pod \"Bad_Name\" is invalid: metadata.name: Invalid value: \"Bad_Name\"");
    assert_eq!(got.1["details"]["causes"][0]["field"], "metadata.name");
    assert_eq!(api.revision().await, before);
}

#[tokio::test]
async fn unknown_fields_under_strict_validation_are_rejected() {
    let api = Api::new().await;
    let before = api.revision().await;
    let mut p = pod("a");
    p["spec"]["bogus"] = json!(true);
    let got = api.json("POST", &format!("{PODS}?fieldValidation=Strict"), &p).await;
    assert_status(&got, 400, "BadRequest", "strict decoding error: unknown field \"spec.bogus\"");
    assert_eq!(api.revision().await, before);
    // Without Strict the field is dropped and the pod is created.
    let got = api.json("POST", PODS, &p).await;
    assert_eq!(got.0, StatusCode::CREATED);
    assert!(got.1["spec"].get("bogus").is_none());
}

#[tokio::test]
async fn a_four_mebibyte_body_is_too_large() {
    let api = Api::new().await;
    let before = api.revision().await;
    let mut cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "big"}, "data": {}});
    cm["data"]["blob"] = json!("x".repeat(4 * 1024 * 1024));
    let got = api.json("POST", "/api/v1/namespaces/default/configmaps", &cm).await;
    assert_status(&got, 413, "RequestEntityTooLarge", "Request entity too large");
    assert_eq!(api.revision().await, before);
}

#[tokio::test]
async fn a_stale_resource_version_on_update_is_a_conflict() {
    let api = Api::new().await;
    let created = api.json("POST", PODS, &pod("a")).await.1;
    let stale = created.clone();
    let mut fresh = created.clone();
    fresh["metadata"]["labels"] = json!({"v": "1"});
    assert_eq!(api.json("PUT", &format!("{PODS}/a"), &fresh).await.0, StatusCode::OK);
    let before = api.revision().await;
    let mut stale = stale;
    stale["metadata"]["labels"] = json!({"v": "2"});
    let got = api.json("PUT", &format!("{PODS}/a"), &stale).await;
    assert_status(&got, 409, "Conflict", "Operation cannot be fulfilled on pods \"a\": the object has been modified");
    assert_eq!(api.revision().await, before);
    let now = api.send("GET", &format!("{PODS}/a"), "", Body::empty(), Some(TOKEN)).await.1;
    assert_eq!(now["metadata"]["labels"]["v"], "1");
}

#[tokio::test]
async fn requests_without_a_valid_token_are_unauthorized() {
    let api = Api::new().await;
    let before = api.revision().await;
    let got = api.send("POST", PODS, "application/json", pod("a").to_string(), None).await;
    assert_status(&got, 401, "Unauthorized", "Unauthorized");
    let got = api.send("POST", PODS, "application/json", pod("a").to_string(), Some("wrong")).await;
    assert_status(&got, 401, "Unauthorized", "Unauthorized");
    let got = api.send("GET", PODS, "", Body::empty(), Some("wrong")).await;
    assert_eq!(got.0, StatusCode::UNAUTHORIZED);
    assert_eq!(api.revision().await, before);
}

#[tokio::test]
async fn a_watch_from_a_compacted_revision_gets_410_gone() {
    let api = Api::new().await;
    let first = api.json("POST", PODS, &pod("a")).await.1;
    let old_rv = first["metadata"]["resourceVersion"].as_str().unwrap().to_string();
    api.json("POST", PODS, &pod("b")).await;
    let now = api.revision().await;
    api.state.store.compact(now).await.unwrap();
    let (status, _) = api
        .send(
            "GET",
            &format!("{PODS}?watch=true&resourceVersion={}", old_rv.parse::<i64>().unwrap() - 1),
            "",
            Body::empty(),
            Some(TOKEN),
        )
        .await;
    // The watch answers 200 and then a single ERROR event carrying the 410 Status.
    assert_eq!(status, StatusCode::OK);
    let req = Request::builder()
        .uri(format!("{PODS}?watch=true&resourceVersion={}", old_rv.parse::<i64>().unwrap() - 1))
        .header("authorization", format!("Bearer {TOKEN}"))
        .body(Body::empty())
        .unwrap();
    let resp = router(api.state.clone()).oneshot(req).await.unwrap();
    let text = String::from_utf8(resp.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap();
    let ev: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(ev["type"], "ERROR");
    assert_eq!(ev["object"]["code"], 410);
    assert_eq!(ev["object"]["reason"], "Expired");
}
