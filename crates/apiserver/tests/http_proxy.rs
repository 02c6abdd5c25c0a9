//! `pods/proxy` and `services/proxy`: requests reach a pod's (or a Service endpoint's) HTTP server
//! with their method, path, query, headers and body, and its answer comes back as it is; targets
//! that cannot be found or reached answer with kube-apiserver's Status.
//!
//! The "pod" is an HTTP server in the test on this host's own address (the default route's
//! source; the proxy refuses loopback), the address the pod reports.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use berth_apiserver::authn::TokenAuthenticator;
use berth_apiserver::{ApiState, lifecycle, router};
use berth_store::sqlite::SqliteStore;
use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

const TOKEN: &str = "test-admin-token-http-proxy";

struct Serving {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

/// This host's address that pods and endpoints report in the test.
fn host_ip() -> std::net::IpAddr {
    berth_apiserver::services::advertise_address(std::net::IpAddr::from([0, 0, 0, 0]))
}

impl Drop for Serving {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(app: axum::Router) -> Serving {
    let listener = tokio::net::TcpListener::bind((host_ip(), 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        axum::serve(listener, app.into_make_service()).await.unwrap();
    });
    Serving { addr, task }
}

/// The pod's server: answers every request with what it received, as JSON, under `201` and an
/// `x-echo` header; `/redirect` answers `302`.
async fn echo(req: Request) -> Response {
    let (parts, body) = req.into_parts();
    if parts.uri.path() == "/redirect" {
        return (StatusCode::FOUND, [("location", "/elsewhere")], "moved").into_response();
    }
    let body = body.collect().await.unwrap().to_bytes();
    let header = |name: &str| parts.headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
    let seen = json!({
        "method": parts.method.as_str(),
        "path": parts.uri.path(),
        "query": parts.uri.query(),
        "body": String::from_utf8_lossy(&body),
        "authorization": header("authorization"),
        "x-custom": header("x-custom"),
    });
    (StatusCode::CREATED, [("x-echo", "yes"), ("content-type", "application/json")], seen.to_string()).into_response()
}

struct Api {
    serving: Serving,
    _dir: tempfile::TempDir,
}

impl Api {
    async fn start() -> Api {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("state.db")).unwrap();
        let state = ApiState::new(Arc::new(store), Some(TokenAuthenticator::new(TOKEN.to_string())));
        lifecycle::bootstrap(&state).await.unwrap();
        Api { serving: serve(router(state)).await, _dir: dir }
    }

    async fn call(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> (StatusCode, HeaderMap, String) {
        let tcp = tokio::net::TcpStream::connect(self.serving.addr).await.unwrap();
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await.unwrap();
        tokio::spawn(connection);
        let mut request = http::Request::builder()
            .method(method)
            .uri(path)
            .header("host", self.serving.addr.to_string())
            .header("authorization", format!("Bearer {TOKEN}"));
        for (k, v) in headers {
            request = request.header(*k, *v);
        }
        let response =
            sender.send_request(request.body(Full::new(Bytes::from(body.to_string()))).unwrap()).await.unwrap();
        let (parts, body) = response.into_parts();
        let bytes = body.collect().await.unwrap().to_bytes();
        (parts.status, parts.headers, String::from_utf8_lossy(&bytes).into_owned())
    }

    async fn create(&self, path: &str, object: Value) {
        let (code, _, body) =
            self.call("POST", path, &[("content-type", "application/json")], &object.to_string()).await;
        assert_eq!(code, StatusCode::CREATED, "{body}");
    }

    /// A pod at this host's address whose container declares `port` as `http`.
    async fn pod(&self, name: &str, port: u16) {
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {"containers": [
            {"name": "app", "image": "busybox", "ports": [{"name": "http", "containerPort": port}]},
        ]}});
        self.create("/api/v1/namespaces/default/pods", pod).await;
        let ip = host_ip().to_string();
        let status = json!({"status": {"podIP": ip, "podIPs": [{"ip": ip}]}}).to_string();
        let path = format!("/api/v1/namespaces/default/pods/{name}/status");
        let (code, _, body) =
            self.call("PATCH", &path, &[("content-type", "application/merge-patch+json")], &status).await;
        assert_eq!(code, StatusCode::OK, "{body}");
    }

    /// A Service whose port `web` (80) has endpoints at this host's address:`endpoint_port` when given.
    async fn service(&self, name: &str, endpoint_port: Option<u16>) {
        let service = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
            "spec": {"ports": [{"name": "web", "port": 80, "targetPort": 8080}]}});
        self.create("/api/v1/namespaces/default/services", service).await;
        let Some(port) = endpoint_port else { return };
        let slice = json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": format!("{name}-1"), "labels": {"kubernetes.io/service-name": name}},
            "addressType": "IPv4",
            "ports": [{"name": "web", "port": port, "protocol": "TCP"}],
            "endpoints": [
                {"addresses": [host_ip().to_string()], "conditions": {"ready": true}},
                {"addresses": ["10.255.255.1"], "conditions": {"ready": false}},
            ],
        });
        self.create("/apis/discovery.k8s.io/v1/namespaces/default/endpointslices", slice).await;
    }

    async fn status(&self, path: &str) -> (u16, String, String) {
        let (code, _, text) = self.call("GET", path, &[], "").await;
        let status: Value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("not a Status: {text}"));
        assert_eq!(status["kind"], "Status", "{text}");
        assert_eq!(status["code"].as_u64(), Some(u64::from(code.as_u16())), "{text}");
        let field = |f: &str| status[f].as_str().unwrap_or_default().to_string();
        (code.as_u16(), field("reason"), field("message"))
    }
}

fn seen(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|_| panic!("not what the pod saw: {body}"))
}

#[tokio::test]
async fn requests_reach_the_pod_with_method_path_query_and_body_and_its_answer_comes_back() {
    let pod = serve(axum::Router::new().fallback(echo)).await;
    let api = Api::start().await;
    api.pod("web", pod.addr.port()).await;
    let base = format!("/api/v1/namespaces/default/pods/web:{}/proxy", pod.addr.port());

    let (code, headers, body) =
        api.call("GET", &format!("{base}/some/path?x=1&y=a%20b"), &[("x-custom", "kept")], "").await;
    assert_eq!(code, StatusCode::CREATED, "{body}");
    assert_eq!(headers["x-echo"], "yes");
    let got = seen(&body);
    assert_eq!((got["method"].as_str(), got["path"].as_str()), (Some("GET"), Some("/some/path")));
    assert_eq!(got["query"], "x=1&y=a%20b");
    assert_eq!(got["x-custom"], "kept");
    assert_eq!(got["authorization"], Value::Null, "the client's credentials are for the API server only");

    let (code, _, body) =
        api.call("POST", &format!("{base}/submit"), &[("content-type", "text/plain")], "hello pod").await;
    assert_eq!(code, StatusCode::CREATED);
    let got = seen(&body);
    assert_eq!(
        (got["method"].as_str(), got["path"].as_str(), got["body"].as_str()),
        (Some("POST"), Some("/submit"), Some("hello pod"))
    );

    for method in ["PUT", "PATCH", "DELETE", "OPTIONS"] {
        let (_, _, body) = api.call(method, &format!("{base}/m"), &[], "x").await;
        assert_eq!(seen(&body)["method"], method);
    }
    let (code, headers, _) = api.call("HEAD", &format!("{base}/"), &[], "").await;
    assert_eq!((code, &headers["x-echo"]), (StatusCode::CREATED, &"yes".parse().unwrap()));

    let (code, headers, _) = api.call("GET", &format!("{base}?q=1"), &[], "").await;
    let location = headers["location"].to_str().unwrap();
    assert_eq!(
        (code, location),
        (StatusCode::MOVED_PERMANENTLY, format!("{base}/?q=1").as_str()),
        "GET adds the slash"
    );
    let (_, _, body) = api.call("POST", &base, &[], "").await;
    assert_eq!(seen(&body)["path"], "/", "no path is the root");

    let (code, headers, body) = api.call("GET", &format!("{base}/redirect"), &[], "").await;
    assert_eq!(
        (code, headers["location"].to_str().unwrap(), body.as_str()),
        (StatusCode::FOUND, format!("{base}/elsewhere").as_str(), "moved"),
        "a redirect to the pod's own path stays behind the proxy"
    );
}

#[tokio::test]
async fn a_pod_is_reached_by_its_containers_port_name_or_first_port() {
    let pod = serve(axum::Router::new().fallback(echo)).await;
    let api = Api::start().await;
    api.pod("web", pod.addr.port()).await;
    for id in ["web:http", "http:web:http", "web"] {
        let (code, _, body) =
            api.call("GET", &format!("/api/v1/namespaces/default/pods/{id}/proxy/named"), &[], "").await;
        assert_eq!(code, StatusCode::CREATED, "{id}: {body}");
        assert_eq!(seen(&body)["path"], "/named");
    }
}

#[tokio::test]
async fn requests_reach_a_ready_endpoint_of_a_service_by_port_name_or_number() {
    let pod = serve(axum::Router::new().fallback(echo)).await;
    let api = Api::start().await;
    api.service("front", Some(pod.addr.port())).await;
    for id in ["front:web", "front:80", "http:front:web", "front"] {
        let path = format!("/api/v1/namespaces/default/services/{id}/proxy/api/items?page=2");
        let (code, headers, body) = api.call("POST", &path, &[], "payload").await;
        assert_eq!((code, &headers["x-echo"]), (StatusCode::CREATED, &"yes".parse().unwrap()), "{id}: {body}");
        let got = seen(&body);
        assert_eq!(
            (got["path"].as_str(), got["query"].as_str(), got["body"].as_str()),
            (Some("/api/items"), Some("page=2"), Some("payload"))
        );
    }
}

#[tokio::test]
async fn unknown_unready_and_unreachable_targets_answer_with_kubernetes_statuses() {
    let api = Api::start().await;
    api.service("lonely", None).await;
    let (code, reason, message) = api.status("/api/v1/namespaces/default/services/lonely:web/proxy/").await;
    assert_eq!(
        (code, reason.as_str(), message.as_str()),
        (503, "ServiceUnavailable", "no endpoints available for service \"lonely\"")
    );
    let (code, _, message) = api.status("/api/v1/namespaces/default/services/lonely:81/proxy/").await;
    assert_eq!((code, message.as_str()), (503, "no service port 81 found for service \"lonely\""));
    let (code, reason, message) = api.status("/api/v1/namespaces/default/services/absent/proxy/").await;
    assert_eq!((code, reason.as_str(), message.as_str()), (404, "NotFound", "services \"absent\" not found"));

    let (code, reason, message) = api.status("/api/v1/namespaces/default/pods/absent:80/proxy/x").await;
    assert_eq!((code, reason.as_str(), message.as_str()), (404, "NotFound", "pods \"absent\" not found"));
    let (code, _, message) = api.status("/api/v1/namespaces/default/pods/ftp:web:21/proxy/").await;
    assert_eq!((code, message.as_str()), (400, "invalid pod request \"ftp:web:21\""));

    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "pending"},
        "spec": {"containers": [{"name": "app", "image": "busybox"}]}});
    api.create("/api/v1/namespaces/default/pods", pod).await;
    let (code, reason, message) = api.status("/api/v1/namespaces/default/pods/pending:80/proxy/").await;
    assert_eq!((code, reason.as_str(), message.as_str()), (400, "BadRequest", "address not allowed"));

    // A port nothing listens on: bind one, then free it.
    let closed = tokio::net::TcpListener::bind((host_ip(), 0)).await.unwrap().local_addr().unwrap().port();
    api.pod("down", closed).await;
    let (code, reason, message) = api.status(&format!("/api/v1/namespaces/default/pods/down:{closed}/proxy/")).await;
    assert_eq!((code, reason.as_str()), (503, "ServiceUnavailable"));
    assert!(
        message.starts_with(&format!("error trying to reach service: dial tcp {}:{closed}: connect: ", host_ip())),
        "{message}"
    );
}
