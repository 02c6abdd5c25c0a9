//! `pods/log`, `pods/exec`, `pods/attach` and `pods/portforward`: the API server's checks and
//! messages (Kubernetes' own), and what it sends to the pod's node agent.
//!
//! The end-to-end path with the real agent, a real runtime and kubectl is tested in
//! `crates/agent/tests/http.rs`. Here a recording agent (an HTTPS server with a self-signed
//! certificate, like an agent's) stands in for it, to see exactly what goes over the wire: the
//! kubelet path and query, the admin token, relayed refusals, spliced upgrades, and SPDY unwrapped
//! from kubectl's WebSocket tunnel.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::extract::Request;
use axum::response::Response;
use berth_apiserver::authn::TokenAuthenticator;
use berth_apiserver::{ApiState, lifecycle, router};
use berth_store::sqlite::SqliteStore;
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use http::StatusCode;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::Role;

const TOKEN: &str = "test-admin-token-proxy";

/// The API server on a plain TCP port (upgrades need a real connection).
struct Api {
    addr: SocketAddr,
    _dir: tempfile::TempDir,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Api {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Api {
    async fn start() -> Api {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("state.db")).unwrap();
        let state = ApiState::new(Arc::new(store), Some(TokenAuthenticator::new(TOKEN.to_string())));
        lifecycle::bootstrap(&state).await.unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            axum::serve(listener, router(state).into_make_service()).await.unwrap();
        });
        Api { addr, _dir: dir, task }
    }

    /// Sends one request as admin; the connection allows upgrades.
    async fn call(&self, method: &str, path: &str, headers: &[(&str, &str)]) -> http::Response<hyper::body::Incoming> {
        call(self.addr, method, path, headers, Empty::<Bytes>::new()).await
    }

    async fn json(&self, method: &str, path: &str, body: Value, content_type: &str) -> (StatusCode, Value) {
        let text = body.to_string();
        let response = call(
            self.addr,
            method,
            path,
            &[("content-type", content_type)],
            http_body_util::Full::new(Bytes::from(text)),
        )
        .await;
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }

    async fn text(&self, method: &str, path: &str) -> (StatusCode, String) {
        let response = self.call(method, path, &[]).await;
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&bytes).into_owned())
    }

    async fn status(&self, method: &str, path: &str) -> (u16, String) {
        let (code, text) = self.text(method, path).await;
        let status: Value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("not a Status: {text}"));
        assert_eq!(status["kind"], "Status", "{text}");
        assert_eq!(status["code"].as_u64(), Some(u64::from(code.as_u16())), "{text}");
        (code.as_u16(), status["message"].as_str().unwrap_or_default().to_string())
    }

    async fn pod(&self, name: &str, node: Option<&str>, containers: &[&str]) {
        let containers: Vec<Value> = containers.iter().map(|c| json!({"name": c, "image": "busybox"})).collect();
        let mut spec = json!({"containers": containers});
        if let Some(node) = node {
            spec["nodeName"] = json!(node);
        }
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec});
        let (code, body) = self.json("POST", "/api/v1/namespaces/default/pods", pod, "application/json").await;
        assert_eq!(code, StatusCode::CREATED, "{body}");
    }

    async fn node(&self, name: &str, port: u16) {
        let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}});
        let (code, body) = self.json("POST", "/api/v1/nodes", node, "application/json").await;
        assert_eq!(code, StatusCode::CREATED, "{body}");
        let status = json!({"status": {
            "addresses": [{"type": "Hostname", "address": name}, {"type": "InternalIP", "address": "127.0.0.1"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": port}},
        }});
        let path = format!("/api/v1/nodes/{name}/status");
        let (code, body) = self.json("PATCH", &path, status, "application/merge-patch+json").await;
        assert_eq!(code, StatusCode::OK, "{body}");
    }
}

async fn call<B>(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: B,
) -> http::Response<hyper::body::Incoming>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await.unwrap();
    tokio::spawn(connection.with_upgrades());
    let mut request = http::Request::builder().method(method).uri(path).header("host", addr.to_string());
    request = request.header("authorization", format!("Bearer {TOKEN}"));
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    sender.send_request(request.body(body).unwrap()).await.unwrap()
}

// ---------------------------------------------------------------------------------------------
// The recording agent

/// What the recording agent saw of one request.
#[derive(Clone, Debug)]
struct Seen {
    method: String,
    path_and_query: String,
    headers: http::HeaderMap,
}

/// An HTTPS server standing in for a node agent: records requests, answers logs with a line (or
/// the status a pod named `fail-<code>` asks for), and for upgrades answers 101 and echoes bytes.
struct RecordingAgent {
    port: u16,
    seen: Arc<Mutex<Vec<Seen>>>,
    handle: axum_server::Handle<SocketAddr>,
}

impl Drop for RecordingAgent {
    fn drop(&mut self) {
        self.handle.shutdown();
    }
}

impl RecordingAgent {
    async fn start() -> RecordingAgent {
        let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
        let chain = vec![cert.cert.der().clone()];
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(cert.signing_key.serialize_der().into());
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let recorded = seen.clone();
        let app = axum::Router::new().fallback(move |req: Request| {
            let recorded = recorded.clone();
            async move { answer(req, recorded) }
        });
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let handle = axum_server::Handle::new();
        let tls = axum_server::tls_rustls::RustlsConfig::from_config(Arc::new(config));
        let server = axum_server::from_tcp_rustls(listener, tls).unwrap().handle(handle.clone());
        tokio::spawn(server.serve(app.into_make_service()));
        RecordingAgent { port, seen, handle }
    }

    fn last(&self) -> Seen {
        self.seen.lock().unwrap().last().cloned().expect("the agent saw a request")
    }
}

fn answer(mut req: Request, recorded: Arc<Mutex<Vec<Seen>>>) -> Response {
    let path_and_query = req.uri().path_and_query().map(|p| p.to_string()).unwrap_or_default();
    recorded.lock().unwrap().push(Seen {
        method: req.method().to_string(),
        path_and_query: path_and_query.clone(),
        headers: req.headers().clone(),
    });
    if let Some(code) = path_and_query.split('/').nth(3).and_then(|pod| pod.strip_prefix("fail-")) {
        let mut r = Response::new(axum::body::Body::from(format!("the agent says {code}\n")));
        *r.status_mut() = StatusCode::from_u16(code.parse().unwrap()).unwrap();
        return r;
    }
    let upgrade = req.headers().get("upgrade").and_then(|v| v.to_str().ok()).map(str::to_string);
    let Some(upgrade) = upgrade else {
        return Response::new(axum::body::Body::from("a log line\n"));
    };
    let protocol = req.headers().get("x-stream-protocol-version").cloned();
    let on_upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        let mut io = TokioIo::new(on_upgrade.await.unwrap());
        let mut buf = [0u8; 1024];
        loop {
            match io.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => io.write_all(&buf[..n]).await.unwrap(),
            }
        }
    });
    let mut r = Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header("connection", "Upgrade")
        .header("upgrade", upgrade);
    if let Some(p) = protocol {
        r = r.header("x-stream-protocol-version", p);
    }
    r.body(axum::body::Body::empty()).unwrap()
}

// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn pod_subresources_are_in_discovery() {
    let api = Api::start().await;
    let (_, list) = api.json("GET", "/api/v1", Value::Null, "application/json").await;
    let find = |name: &str| list["resources"].as_array().unwrap().iter().find(|r| r["name"] == name).cloned();
    assert_eq!(find("pods/log").unwrap()["verbs"], json!(["get"]));
    let exec = find("pods/exec").unwrap();
    assert_eq!((exec["kind"].as_str(), &exec["verbs"]), (Some("PodExecOptions"), &json!(["create", "get"])));
    assert!(find("pods/attach").is_some() && find("pods/portforward").is_some());
}

#[tokio::test]
async fn a_pod_without_a_node_has_empty_logs_and_no_host_for_streams() {
    let api = Api::start().await;
    api.pod("web", None, &["app"]).await;
    assert_eq!(api.text("GET", "/api/v1/namespaces/default/pods/web/log").await, (StatusCode::OK, String::new()));
    for sub in ["exec?command=ls&stdout=true", "attach?stdout=true", "portforward?ports=80"] {
        let path = format!("/api/v1/namespaces/default/pods/web/{sub}");
        assert_eq!(api.status("POST", &path).await, (400, "pod web does not have a host assigned".into()), "{sub}");
    }
}

#[tokio::test]
async fn the_container_must_be_named_when_the_pod_has_several_and_must_exist() {
    let api = Api::start().await;
    api.pod("two", Some("node-x"), &["a", "b"]).await;
    let message = "a container name must be specified for pod two, choose one of: [a b]".to_string();
    assert_eq!(api.status("GET", "/api/v1/namespaces/default/pods/two/log").await, (400, message.clone()));
    assert_eq!(api.status("POST", "/api/v1/namespaces/default/pods/two/exec?command=ls").await, (400, message));
    assert_eq!(
        api.status("GET", "/api/v1/namespaces/default/pods/two/log?container=c").await,
        (400, "container c is not valid for pod two".into())
    );
}

#[tokio::test]
async fn a_missing_pod_or_node_is_not_found_and_bad_log_options_are_invalid() {
    let api = Api::start().await;
    assert_eq!(
        api.status("GET", "/api/v1/namespaces/default/pods/ghost/log").await,
        (404, "pods \"ghost\" not found".into())
    );
    api.pod("lost", Some("gone-node"), &["app"]).await;
    assert_eq!(
        api.status("POST", "/api/v1/namespaces/default/pods/lost/exec?command=ls&stdout=true").await,
        (404, "nodes \"gone-node\" not found".into())
    );
    let (code, message) = api.status("GET", "/api/v1/namespaces/default/pods/lost/log?tailLines=-1").await;
    assert_eq!(code, 422);
    assert_eq!(
        message,
        "PodLogOptions \"lost\" is invalid: tailLines: Invalid value: -1: must be greater than or equal to 0"
    );
}

#[tokio::test]
async fn an_unreachable_agent_is_an_error_naming_where_it_was_looked_for() {
    let api = Api::start().await;
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    api.node("dead", closed).await;
    api.pod("web", Some("dead"), &["app"]).await;
    let (code, message) = api.status("GET", "/api/v1/namespaces/default/pods/web/log").await;
    assert_eq!(code, 500);
    assert!(
        message.starts_with(&format!("Get \"https://127.0.0.1:{closed}/containerLogs/default/web/app\": dial tcp")),
        "{message}"
    );
    let (code, message) = api.status("POST", "/api/v1/namespaces/default/pods/web/exec?command=ls&stdout=true").await;
    assert_eq!(code, 500);
    assert!(message.starts_with("error dialing backend: dial tcp"), "{message}");
}

#[tokio::test]
async fn logs_go_to_the_kubelet_path_with_its_query_and_the_admin_token() {
    let api = Api::start().await;
    let agent = RecordingAgent::start().await;
    api.node("node-a", agent.port).await;
    api.pod("web", Some("node-a"), &["app"]).await;
    let path = "/api/v1/namespaces/default/pods/web/log?follow=true&tailLines=10&timestamps=true&sinceSeconds=60&limitBytes=100";
    let response = api.call("GET", path, &[]).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-type"], "text/plain");
    assert_eq!(response.into_body().collect().await.unwrap().to_bytes(), "a log line\n");
    let seen = agent.last();
    assert_eq!(seen.method, "GET");
    assert_eq!(
        seen.path_and_query,
        "/containerLogs/default/web/app?follow=true&timestamps=true&sinceSeconds=60&tailLines=10&limitBytes=100"
    );
    assert_eq!(seen.headers["authorization"], format!("Bearer {TOKEN}"));

    // The agent's refusals become Statuses as kube-apiserver makes them.
    for (code, message) in [
        (400, "the agent says 400".to_string()),
        (500, "Internal error occurred: the agent says 500".to_string()),
        (404, "the server could not find the requested resource ( pods/log fail-404)".to_string()),
    ] {
        let name = format!("fail-{code}");
        api.pod(&name, Some("node-a"), &["app"]).await;
        let path = format!("/api/v1/namespaces/default/pods/{name}/log");
        assert_eq!(api.status("GET", &path).await, (code, message));
    }
}

#[tokio::test]
async fn exec_upgrades_are_spliced_to_the_agent_and_refusals_are_relayed() {
    let api = Api::start().await;
    let agent = RecordingAgent::start().await;
    api.node("node-a", agent.port).await;
    api.pod("web", Some("node-a"), &["app"]).await;
    let path = "/api/v1/namespaces/default/pods/web/exec?command=sh&command=-c&command=echo%20hi&stdin=true&stdout=true&tty=true&container=app";
    let headers =
        [("connection", "Upgrade"), ("upgrade", "SPDY/3.1"), ("x-stream-protocol-version", "v4.channel.k8s.io")];
    let mut response = api.call("POST", path, &headers).await;
    assert_eq!(response.status(), StatusCode::SWITCHING_PROTOCOLS);
    assert_eq!(response.headers()["x-stream-protocol-version"], "v4.channel.k8s.io");
    let seen = agent.last();
    assert_eq!(
        seen.path_and_query,
        "/exec/default/web/app?command=sh&command=-c&command=echo+hi&input=1&output=1&tty=1"
    );
    assert_eq!(seen.method, "POST");
    assert_eq!(seen.headers["upgrade"], "SPDY/3.1");
    assert_eq!(seen.headers["authorization"], format!("Bearer {TOKEN}"));
    let mut io = TokioIo::new(hyper::upgrade::on(&mut response).await.unwrap());
    io.write_all(b"spliced bytes").await.unwrap();
    let mut buf = [0u8; 13];
    io.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"spliced bytes");

    api.pod("fail-403", Some("node-a"), &["app"]).await;
    let path = "/api/v1/namespaces/default/pods/fail-403/attach?stdout=true";
    let response = api.call("GET", path, &[("connection", "Upgrade"), ("upgrade", "websocket")]).await;
    assert_eq!(response.status(), StatusCode::FORBIDDEN, "a refusal is not turned into anything else");
    assert_eq!(response.into_body().collect().await.unwrap().to_bytes(), "the agent says 403\n");
}

#[tokio::test]
async fn port_forward_spdy_tunnelled_in_a_websocket_reaches_the_agent_as_spdy() {
    let api = Api::start().await;
    let agent = RecordingAgent::start().await;
    api.node("node-a", agent.port).await;
    api.pod("web", Some("node-a"), &["app"]).await;
    let headers = [
        ("connection", "Upgrade"),
        ("upgrade", "websocket"),
        ("sec-websocket-version", "13"),
        ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
        ("sec-websocket-protocol", "SPDY/3.1+portforward.k8s.io"),
    ];
    let mut response = api.call("GET", "/api/v1/namespaces/default/pods/web/portforward?ports=8080", &headers).await;
    assert_eq!(response.status(), StatusCode::SWITCHING_PROTOCOLS);
    assert_eq!(response.headers()["sec-websocket-accept"], "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
    assert_eq!(response.headers()["sec-websocket-protocol"], "SPDY/3.1+portforward.k8s.io");
    let seen = agent.last();
    assert_eq!(seen.path_and_query, "/portForward/default/web?port=8080");
    assert_eq!(seen.headers["upgrade"], "SPDY/3.1");
    assert_eq!(seen.headers["x-stream-protocol-version"], "portforward.k8s.io");
    assert!(!seen.headers.contains_key("sec-websocket-key"), "the agent sees plain SPDY");

    let io = TokioIo::new(hyper::upgrade::on(&mut response).await.unwrap());
    let mut ws = tokio_tungstenite::WebSocketStream::from_raw_socket(io, Role::Client, None).await;
    ws.send(Message::Binary(Bytes::from_static(b"spdy frame bytes"))).await.unwrap();
    let echoed = ws.next().await.unwrap().unwrap();
    assert_eq!(echoed, Message::Binary(Bytes::from_static(b"spdy frame bytes")));
    ws.close(None).await.unwrap();
}
