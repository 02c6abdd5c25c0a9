//! A real in-process server speaking client-go's protobuf both ways: bodies in, objects, lists,
//! watch frames and Status errors out.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use berth_apiserver::{ApiState, lifecycle, protobuf, router};
use berth_store::sqlite::SqliteStore;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

const PB: &str = "application/vnd.kubernetes.protobuf";

struct Api {
    state: Arc<ApiState>,
    _dir: tempfile::TempDir,
}

struct Reply {
    status: StatusCode,
    content_type: String,
    body: Vec<u8>,
}

impl Reply {
    fn object(&self) -> Value {
        assert_eq!(self.content_type, PB, "status {}: {}", self.status, String::from_utf8_lossy(&self.body));
        protobuf::decode(&self.body).unwrap()
    }
}

impl Api {
    async fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("state.db")).unwrap();
        let state = ApiState::new(Arc::new(store), None);
        lifecycle::bootstrap(&state).await.unwrap();
        Api { state, _dir: dir }
    }

    fn request(method: &str, path: &str, accept: &str, body: Option<Vec<u8>>) -> Request<Body> {
        let mut req = Request::builder().method(method).uri(path).header("accept", accept);
        if body.is_some() {
            req = req.header("content-type", PB);
        }
        req.body(body.map_or_else(Body::empty, Body::from)).unwrap()
    }

    async fn send(&self, method: &str, path: &str, accept: &str, body: Option<Vec<u8>>) -> Reply {
        let resp = router(self.state.clone()).oneshot(Self::request(method, path, accept, body)).await.unwrap();
        let status = resp.status();
        let content_type =
            resp.headers().get("content-type").map(|v| v.to_str().unwrap().to_string()).unwrap_or_default();
        let body = resp.into_body().collect().await.unwrap().to_bytes().to_vec();
        Reply { status, content_type, body }
    }

    async fn get_json(&self, path: &str) -> (StatusCode, Value) {
        let r = self.send("GET", path, "application/json", None).await;
        (r.status, serde_json::from_slice(&r.body).unwrap_or(Value::Null))
    }
}

/// Reads the fields of one protobuf message: (number, bytes) for length-delimited ones.
fn fields(mut buf: &[u8]) -> Vec<(u64, Vec<u8>)> {
    fn varint(buf: &mut &[u8]) -> u64 {
        let mut v = 0;
        for i in 0.. {
            let b = buf[0];
            *buf = &buf[1..];
            v |= u64::from(b & 0x7f) << (7 * i);
            if b < 0x80 {
                break;
            }
        }
        v
    }
    let mut out = Vec::new();
    while !buf.is_empty() {
        let key = varint(&mut buf);
        assert_eq!(key & 7, 2, "only length-delimited fields expected");
        let n = varint(&mut buf) as usize;
        out.push((key >> 3, buf[..n].to_vec()));
        buf = &buf[n..];
    }
    out
}

/// One protobuf watch frame: (type, object).
fn watch_event(frame: &[u8]) -> (String, Value) {
    let f = fields(frame);
    assert_eq!(f[0].0, 1);
    assert_eq!(f[1].0, 2);
    let raw = fields(&f[1].1);
    assert_eq!(raw[0].0, 1);
    (String::from_utf8(f[0].1.clone()).unwrap(), protobuf::decode(&raw[0].1).unwrap())
}

/// Reads whole frames from a protobuf watch body until `want` are buffered.
async fn next_frames(body: &mut Body, buf: &mut Vec<u8>, want: usize) -> Vec<Vec<u8>> {
    let mut frames = Vec::new();
    loop {
        while buf.len() >= 4 {
            let n = u32::from_be_bytes(buf[..4].try_into().unwrap()) as usize;
            if buf.len() < 4 + n {
                break;
            }
            frames.push(buf[4..4 + n].to_vec());
            buf.drain(..4 + n);
        }
        if frames.len() >= want {
            return frames;
        }
        let frame = tokio::time::timeout(Duration::from_secs(10), body.frame()).await.unwrap().unwrap().unwrap();
        if let Ok(data) = frame.into_data() {
            buf.extend_from_slice(&data);
        }
    }
}

fn config_map() -> Value {
    json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "settings", "labels": {"app": "web"}},
        "data": {"mode": "fast"},
        "binaryData": {"blob": "AAEC/w=="},
    })
}

#[tokio::test]
async fn a_config_map_lives_its_whole_life_in_protobuf() {
    let api = Api::new().await;
    let base = "/api/v1/namespaces/default/configmaps";

    let created = api.send("POST", base, PB, Some(protobuf::encode(&config_map()).unwrap())).await;
    assert_eq!(created.status, StatusCode::CREATED);
    let created = created.object();
    assert_eq!(created["kind"], "ConfigMap");
    assert_eq!(created["data"], json!({"mode": "fast"}));
    assert_eq!(created["binaryData"], json!({"blob": "AAEC/w=="}));
    assert!(created["metadata"]["uid"].as_str().is_some_and(|u| !u.is_empty()));

    let got = api.send("GET", &format!("{base}/settings"), &format!("{PB}, */*"), None).await;
    assert_eq!(got.status, StatusCode::OK);
    assert_eq!(got.object(), created);

    let list = api.send("GET", base, PB, None).await.object();
    assert_eq!(list["kind"], "ConfigMapList");
    assert_eq!(list["items"].as_array().unwrap().len(), 1);
    assert_eq!(list["items"][0]["metadata"]["name"], "settings");
    assert!(list["metadata"]["resourceVersion"].as_str().is_some_and(|rv| !rv.is_empty()));

    let watch =
        Api::request("GET", &format!("{base}?watch=true&resourceVersion=0"), &format!("{PB};stream=watch"), None);
    let resp = router(api.state.clone()).oneshot(watch).await.unwrap();
    assert_eq!(resp.headers()["content-type"], "application/vnd.kubernetes.protobuf;stream=watch");
    let mut body = resp.into_body();
    let mut buf = Vec::new();
    let frames = next_frames(&mut body, &mut buf, 1).await;
    let (kind, obj) = watch_event(&frames[0]);
    assert_eq!(kind, "ADDED");
    assert_eq!(obj["metadata"]["name"], "settings");

    let options = json!({"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"});
    let deleted = api.send("DELETE", &format!("{base}/settings"), PB, Some(protobuf::encode(&options).unwrap())).await;
    assert_eq!(deleted.status, StatusCode::OK, "{}", String::from_utf8_lossy(&deleted.body));
    let frames = next_frames(&mut body, &mut buf, 1).await;
    let (kind, obj) = watch_event(&frames[0]);
    assert_eq!(kind, "DELETED");
    assert_eq!(obj["metadata"]["name"], "settings");

    let missing = api.send("GET", &format!("{base}/settings"), PB, None).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    let status = missing.object();
    assert_eq!(status["kind"], "Status");
    assert_eq!(status["code"], 404);
    assert_eq!(status["reason"], "NotFound");
    assert_eq!(status["details"]["name"], "settings");
}

#[tokio::test]
async fn a_protobuf_delete_with_zero_grace_removes_a_bound_pod_at_once() {
    let api = Api::new().await;
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web"},
        "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "busybox"}]},
    });
    let created = api.send("POST", "/api/v1/namespaces/default/pods", PB, Some(protobuf::encode(&pod).unwrap())).await;
    assert_eq!(created.status, StatusCode::CREATED);
    let options = json!({"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0});
    let path = "/api/v1/namespaces/default/pods/web";
    let deleted = api.send("DELETE", path, PB, Some(protobuf::encode(&options).unwrap())).await;
    assert_eq!(deleted.status, StatusCode::OK, "{}", String::from_utf8_lossy(&deleted.body));
    assert_eq!(api.get_json(path).await.0, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_zero_replica_deployment_sent_in_protobuf_keeps_zero_replicas() {
    let api = Api::new().await;
    let deployment = json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "idle"},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": "idle"}},
            "template": {"metadata": {"labels": {"app": "idle"}}, "spec": {"containers": [{"name": "c", "image": "nginx"}]}},
        },
    });
    let path = "/apis/apps/v1/namespaces/default/deployments";
    let created = api.send("POST", path, PB, Some(protobuf::encode(&deployment).unwrap())).await;
    assert_eq!(created.status, StatusCode::CREATED);
    assert_eq!(created.object()["spec"]["replicas"], 0);
    let (_, stored) = api.get_json(&format!("{path}/idle")).await;
    assert_eq!(stored["spec"]["replicas"], 0);
}

#[tokio::test]
async fn tables_stay_json_when_json_is_accepted_and_are_refused_otherwise() {
    let api = Api::new().await;
    let table = "application/json;as=Table;v=v1;g=meta.k8s.io";
    let r = api.send("GET", "/api/v1/namespaces", &format!("{PB};as=Table;v=v1;g=meta.k8s.io, {table}"), None).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.content_type, "application/json");
    let r = api.send("GET", "/api/v1/namespaces?watch=1&timeoutSeconds=1", &format!("{PB}, {table}"), None).await;
    assert_eq!(r.content_type, "application/json");

    // Only protobuf, and a Table: nothing the client accepts.
    let r = api.send("GET", "/api/v1/namespaces?watch=1&timeoutSeconds=1", &format!("{PB}, {table};q=0"), None).await;
    assert_eq!(r.status, StatusCode::NOT_ACCEPTABLE);
    assert_eq!(r.object()["reason"], "NotAcceptable");
}

#[tokio::test]
async fn json_stays_the_answer_for_json_clients() {
    let api = Api::new().await;
    let r = api
        .send("GET", "/api/v1/namespaces/default", "application/json, application/vnd.kubernetes.protobuf", None)
        .await;
    assert_eq!(r.content_type, "application/json");
    let r = api.send("GET", "/api/v1/namespaces/default", "", None).await;
    assert_eq!(r.content_type, "application/json");
    let ns = api.send("GET", "/api/v1/namespaces/default", PB, None).await.object();
    assert_eq!(ns["metadata"]["name"], "default");
}

#[tokio::test]
async fn discovery_documents_are_answered_in_protobuf() {
    let api = Api::new().await;
    for (path, kind) in [("/api", "APIVersions"), ("/apis", "APIGroupList"), ("/api/v1", "APIResourceList")] {
        let r = api.send("GET", path, PB, None).await;
        assert_eq!(r.status, StatusCode::OK, "{path}");
        assert_eq!(r.object()["kind"], kind, "{path}");
    }
    let resources = api.send("GET", "/api/v1", PB, None).await.object();
    let pods = resources["resources"].as_array().unwrap().iter().find(|r| r["name"] == "pods").unwrap();
    assert!(pods["verbs"].as_array().unwrap().contains(&json!("watch")));
}
