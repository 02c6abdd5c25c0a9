//! Pod subresources the pod's node agent serves: `pods/log`, `pods/exec`, `pods/attach` and
//! `pods/portforward` are proxied to the agent's kubelet API over HTTPS, as kube-apiserver does.
//!
//! The agent is found from the pod's `spec.nodeName`: the Node's InternalIP (else another of its
//! addresses) and `status.daemonEndpoints.kubeletEndpoint.Port` (10250 when unset). The server
//! calls it with the admin token as bearer, which the agent reviews with a TokenReview.
//!
//! Streams: the upgrade request goes on with its headers and a `101` splices the client's and the
//! agent's connections into one byte pipe; any other answer reaches the client as it is, so kubectl
//! falls back from WebSocket to SPDY when a runtime refuses a protocol. Port forwarding over
//! WebSocket-tunnelled SPDY (subprotocol `SPDY/3.1+portforward.k8s.io`, kubectl's first choice) is
//! unwrapped here into plain SPDY to the agent, as kube-apiserver's tunneling handler does, so any
//! runtime that speaks SPDY port forwarding serves it.

use std::net::IpAddr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::response::{IntoResponse, Response};
use berth_api::FieldError;
use berth_api::resources::{NODES, PODS};
use berth_common::tls::AnyServerCertificate;
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, frame::coding::CloseCode};

use crate::request::Target;
use crate::{ApiError, ApiResult, ApiState, handlers};

/// kubelet's default port, for nodes that do not report theirs.
const DEFAULT_KUBELET_PORT: u16 = 10250;
/// How long connecting to an agent (TCP and TLS) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The prefix kubectl puts before the SPDY protocols it tunnels through a WebSocket.
const SPDY_TUNNEL_PREFIX: &str = "SPDY/3.1+";
/// How much of an agent's error body is read into the Status message.
const MAX_ERROR_BODY: usize = 4096;

/// `GET pods/{name}/log`.
pub async fn log(
    State(state): State<Arc<ApiState>>,
    Path((namespace, name)): Path<(String, String)>,
    req: Request,
) -> Response {
    let started = Instant::now();
    let response = match serve_log(&state, &namespace, &name, req.uri().query()).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    };
    state.metrics.observe_request("get", "pods/log", response.status().as_u16(), started.elapsed());
    response
}

/// `GET`/`POST pods/{name}/exec`.
pub async fn exec(state: State<Arc<ApiState>>, path: Path<(String, String)>, req: Request) -> Response {
    connect(state, path, req, "exec").await
}

/// `GET`/`POST pods/{name}/attach`.
pub async fn attach(state: State<Arc<ApiState>>, path: Path<(String, String)>, req: Request) -> Response {
    connect(state, path, req, "attach").await
}

/// `GET`/`POST pods/{name}/portforward`.
pub async fn portforward(state: State<Arc<ApiState>>, path: Path<(String, String)>, req: Request) -> Response {
    connect(state, path, req, "portforward").await
}

async fn connect(
    State(state): State<Arc<ApiState>>,
    Path((namespace, name)): Path<(String, String)>,
    req: Request,
    subresource: &'static str,
) -> Response {
    let started = Instant::now();
    let response = match serve_connect(&state, &namespace, &name, req, subresource).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    };
    let resource = format!("pods/{subresource}");
    state.metrics.observe_request("connect", &resource, response.status().as_u16(), started.elapsed());
    response
}

// ---------------------------------------------------------------------------------------------
// Where the pod runs

/// The pod's node agent, as `host:port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Agent {
    pub host: String,
    pub port: u16,
}

impl Agent {
    fn authority(&self) -> String {
        match self.host.parse::<IpAddr>() {
            Ok(IpAddr::V6(ip)) => format!("[{ip}]:{}", self.port),
            _ => format!("{}:{}", self.host, self.port),
        }
    }
}

async fn load_pod(state: &ApiState, namespace: &str, name: &str) -> ApiResult<Value> {
    let t = Target { rt: &PODS, namespace: Some(namespace.into()), name: Some(name.into()), subresource: None };
    Ok(handlers::load(state, &t, name).await?.0)
}

/// The agent of `node`: its InternalIP (IPs need no resolver), else another address, and the
/// port it reports.
async fn agent_of(state: &ApiState, node: &str) -> ApiResult<Agent> {
    let t = Target { rt: &NODES, namespace: None, name: Some(node.into()), subresource: None };
    let (obj, _) = handlers::load(state, &t, node).await?;
    agent_address(&obj)
}

/// The address part of [`agent_of`], on a Node object.
pub fn agent_address(node: &Value) -> ApiResult<Agent> {
    let addresses: Vec<(&str, &str)> = node
        .pointer("/status/addresses")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|a| Some((a.get("type")?.as_str()?, a.get("address")?.as_str()?)))
        .collect();
    let host = ["InternalIP", "ExternalIP", "InternalDNS", "ExternalDNS", "Hostname"]
        .iter()
        .find_map(|kind| addresses.iter().find(|(t, a)| t == kind && !a.is_empty()).map(|(_, a)| a.to_string()))
        .ok_or_else(|| {
            let known: Vec<String> = addresses.iter().map(|(t, a)| format!("{{{t} {a}}}")).collect();
            ApiError::internal(format!("no preferred addresses found; known addresses: [{}]", known.join(" ")))
        })?;
    let port = node
        .pointer("/status/daemonEndpoints/kubeletEndpoint/Port")
        .and_then(Value::as_u64)
        .and_then(|p| u16::try_from(p).ok())
        .filter(|p| *p > 0)
        .unwrap_or(DEFAULT_KUBELET_PORT);
    Ok(Agent { host, port })
}

fn node_name(pod: &Value) -> Option<&str> {
    pod.pointer("/spec/nodeName").and_then(Value::as_str).filter(|n| !n.is_empty())
}

/// The container a request means, as kube-apiserver's `validateContainer`: the one given (which
/// must exist), else the pod's only container.
pub fn validate_container(pod: &Value, name: &str, given: Option<&str>) -> ApiResult<String> {
    let names = |field: &str| -> Vec<String> {
        pod.pointer(&format!("/spec/{field}"))
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|c| c.get("name").and_then(Value::as_str).map(str::to_string))
            .collect()
    };
    let containers = names("containers");
    let all: Vec<String> = names("initContainers")
        .into_iter()
        .chain(containers.iter().cloned())
        .chain(names("ephemeralContainers"))
        .collect();
    match given.filter(|c| !c.is_empty()) {
        Some(c) if all.iter().any(|n| n == c) => Ok(c.to_string()),
        Some(c) => Err(ApiError::bad_request(format!("container {c} is not valid for pod {name}"))),
        None => match containers.as_slice() {
            [only] => Ok(only.clone()),
            [] => Err(ApiError::bad_request(format!("a container name must be specified for pod {name}"))),
            _ => Err(ApiError::bad_request(format!(
                "a container name must be specified for pod {name}, choose one of: [{}]",
                all.join(" ")
            ))),
        },
    }
}

// ---------------------------------------------------------------------------------------------
// Query options

fn pairs(query: Option<&str>) -> Vec<(String, String)> {
    url::form_urlencoded::parse(query.unwrap_or("").as_bytes()).into_owned().collect()
}

fn first<'a>(pairs: &'a [(String, String)], name: &str) -> Option<&'a str> {
    pairs.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

/// Query booleans as Kubernetes converts them: present and neither `0` nor `false` is true.
fn flag(pairs: &[(String, String)], name: &str) -> bool {
    first(pairs, name).is_some_and(|v| !(v == "0" || v.eq_ignore_ascii_case("false")))
}

fn int(pairs: &[(String, String)], name: &str) -> ApiResult<Option<i64>> {
    first(pairs, name)
        .map(|v| v.parse::<i64>().map_err(|_| ApiError::bad_request(format!("{name}: invalid integer {v:?}"))))
        .transpose()
}

/// The kubelet query of a log request, validated as `ValidatePodLogOptions` does.
pub fn log_query(name: &str, pairs: &[(String, String)]) -> ApiResult<String> {
    let mut errors = Vec::new();
    let mut out = url::form_urlencoded::Serializer::new(String::new());
    for option in ["follow", "previous", "timestamps"] {
        if flag(pairs, option) {
            out.append_pair(option, "true");
        }
    }
    let since_seconds = int(pairs, "sinceSeconds")?;
    let since_time = first(pairs, "sinceTime");
    if since_seconds.is_some() && since_time.is_some() {
        errors.push(FieldError::forbidden("", "at most one of `sinceTime` or `sinceSeconds` may be specified"));
    }
    if let Some(s) = since_seconds {
        if s < 1 {
            errors.push(FieldError::invalid_raw("sinceSeconds", s.to_string(), "must be greater than 0"));
        }
        out.append_pair("sinceSeconds", &s.to_string());
    }
    if let Some(t) = since_time {
        let at = t
            .parse::<jiff::Timestamp>()
            .map_err(|_| ApiError::bad_request(format!("sinceTime: invalid time {t:?}: want RFC 3339")))?;
        // kube-apiserver passes whole seconds on.
        out.append_pair("sinceTime", &berth_common::time::rfc3339(at));
    }
    if let Some(n) = int(pairs, "tailLines")? {
        if n < 0 {
            errors.push(FieldError::invalid_raw("tailLines", n.to_string(), "must be greater than or equal to 0"));
        }
        out.append_pair("tailLines", &n.to_string());
    }
    if let Some(n) = int(pairs, "limitBytes")? {
        if n < 1 {
            errors.push(FieldError::invalid_raw("limitBytes", n.to_string(), "must be greater than 0"));
        }
        out.append_pair("limitBytes", &n.to_string());
    }
    if let Some(stream) = first(pairs, "stream") {
        out.append_pair("stream", stream);
    }
    if !errors.is_empty() {
        return Err(ApiError {
            code: 422,
            reason: "Invalid",
            message: berth_api::field_error::invalid_message("PodLogOptions", name, &errors),
            details: Some(serde_json::json!({"name": name, "kind": "PodLogOptions"})),
        });
    }
    Ok(out.finish())
}

/// The kubelet query of an exec or attach request: `command` as given, streams as `1` flags.
fn stream_query(pairs: &[(String, String)], with_command: bool) -> String {
    let mut out = url::form_urlencoded::Serializer::new(String::new());
    if with_command {
        for (_, c) in pairs.iter().filter(|(k, _)| k == "command") {
            out.append_pair("command", c);
        }
    }
    // kubelet's parameter names (`ExecStdinParam` …).
    for (option, kubelet) in [("stdin", "input"), ("stdout", "output"), ("stderr", "error"), ("tty", "tty")] {
        if flag(pairs, option) {
            out.append_pair(kubelet, "1");
        }
    }
    out.finish()
}

/// The kubelet query of a port-forward request: `ports` as one comma-separated `port`.
fn port_query(pairs: &[(String, String)]) -> ApiResult<String> {
    let mut ports = Vec::new();
    for (_, v) in pairs.iter().filter(|(k, _)| k == "ports") {
        for p in v.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let port: u16 = p
                .parse()
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| ApiError::bad_request(format!("invalid port {p:?}: must be between 1 and 65535")))?;
            ports.push(port.to_string());
        }
    }
    if ports.is_empty() {
        return Ok(String::new());
    }
    Ok(url::form_urlencoded::Serializer::new(String::new()).append_pair("port", &ports.join(",")).finish())
}

// ---------------------------------------------------------------------------------------------
// Serving

async fn serve_log(state: &ApiState, namespace: &str, name: &str, query: Option<&str>) -> ApiResult<Response> {
    let pairs = pairs(query);
    let pod = load_pod(state, namespace, name).await?;
    let container = validate_container(&pod, name, first(&pairs, "container"))?;
    let kubelet_query = log_query(name, &pairs)?;
    let Some(node) = node_name(&pod) else {
        // kube-apiserver streams nothing for a pod that has no node yet.
        return Ok(([(header::CONTENT_TYPE, "text/plain")], "").into_response());
    };
    let agent = agent_of(state, node).await?;
    let path = format!("/containerLogs/{}/{}/{}", enc(namespace), enc(name), enc(&container));
    let path = if kubelet_query.is_empty() { path } else { format!("{path}?{kubelet_query}") };
    let answer = send(&agent, admin_token(state), Method::GET, &path, &HeaderMap::new())
        .await
        .map_err(|e| ApiError::new(500, "", format!("Get {:?}: {}", e.url, e.cause)))?;
    let status = answer.status();
    if !status.is_success() {
        return Err(agent_failure(status, answer.into_body(), name).await);
    }
    let mut response = Response::new(Body::new(answer.into_body()));
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    Ok(response)
}

/// An agent's error answer to a log request, as kube-apiserver's `GenericHttpResponseChecker`
/// turns it into a Status.
async fn agent_failure(status: StatusCode, body: hyper::body::Incoming, name: &str) -> ApiError {
    let bytes = http_body_util::Limited::new(body, MAX_ERROR_BODY).collect().await.map(|b| b.to_bytes());
    let text = bytes.map(|b| String::from_utf8_lossy(&b).trim().to_string()).unwrap_or_default();
    // The agent answers refusals as Status objects and log errors as text.
    let message = serde_json::from_str::<Value>(&text)
        .ok()
        .and_then(|s| s.get("message").and_then(Value::as_str).map(str::to_string))
        .unwrap_or(text);
    let suffix = format!(" ( pods/log {name})");
    match status.as_u16() {
        400 => ApiError::bad_request(message),
        500 => ApiError::internal(format!("Internal error occurred: {message}")),
        401 => ApiError::new(
            401,
            "Unauthorized",
            format!("the server has asked for the client to provide credentials{suffix}"),
        ),
        403 => ApiError::new(403, "Forbidden", format!("{message}{suffix}")),
        404 => ApiError::new(404, "NotFound", format!("the server could not find the requested resource{suffix}")),
        code => ApiError::new(
            code,
            "",
            format!("the server responded with the status code {code} but did not return more information{suffix}"),
        ),
    }
}

async fn serve_connect(
    state: &ApiState,
    namespace: &str,
    name: &str,
    mut req: Request,
    subresource: &str,
) -> ApiResult<Response> {
    let pairs = pairs(req.uri().query());
    let pod = load_pod(state, namespace, name).await?;
    let (path, query) = match subresource {
        "portforward" => (format!("/portForward/{}/{}", enc(namespace), enc(name)), port_query(&pairs)?),
        kind => {
            let container = validate_container(&pod, name, first(&pairs, "container"))?;
            let path = format!("/{kind}/{}/{}/{}", enc(namespace), enc(name), enc(&container));
            (path, stream_query(&pairs, kind == "exec"))
        }
    };
    let Some(node) = node_name(&pod) else {
        return Err(ApiError::bad_request(format!("pod {name} does not have a host assigned")));
    };
    let agent = agent_of(state, node).await?;
    let path = if query.is_empty() { path } else { format!("{path}?{query}") };
    let token = admin_token(state);
    let client_upgrade = hyper::upgrade::on(&mut req);
    let (parts, _body) = req.into_parts();
    if let Some(tunnelled) = tunnelled_protocols(&parts.headers).filter(|_| subresource == "portforward") {
        return tunnel_port_forward(&agent, token, &path, &parts.headers, tunnelled, client_upgrade).await;
    }
    let upgrading = is_upgrade(&parts.headers);
    let mut headers = HeaderMap::new();
    for (k, v) in &parts.headers {
        if passes(k, upgrading) {
            headers.append(k, v.clone());
        }
    }
    let mut answer = send(&agent, token, parts.method.clone(), &path, &headers)
        .await
        .map_err(|e| ApiError::internal(format!("error dialing backend: {}", e.cause)))?;
    let switching = answer.status() == StatusCode::SWITCHING_PROTOCOLS;
    let mut response = Response::builder().status(answer.status());
    for (k, v) in answer.headers() {
        if passes(k, switching) {
            response = response.header(k, v);
        }
    }
    if !switching {
        // The agent or runtime refused (e.g. a protocol it does not speak): the client sees it and
        // may fall back.
        return response.body(Body::new(answer.into_body())).map_err(|e| ApiError::internal(e.to_string()));
    }
    let agent_upgrade = hyper::upgrade::on(&mut answer);
    tokio::spawn(async move {
        match tokio::try_join!(client_upgrade, agent_upgrade) {
            Ok((client, agent)) => {
                let (mut client, mut agent) = (TokioIo::new(client), TokioIo::new(agent));
                if let Err(error) = tokio::io::copy_bidirectional(&mut client, &mut agent).await {
                    tracing::debug!(%error, "a proxied stream ended with an error");
                }
            }
            Err(error) => tracing::debug!(%error, "a proxied upgrade did not complete"),
        }
    });
    response.body(Body::empty()).map_err(|e| ApiError::internal(e.to_string()))
}

/// Everything but RFC 3986's unreserved characters is escaped in a path segment.
const SEGMENT: &percent_encoding::AsciiSet =
    &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

fn enc(segment: &str) -> String {
    percent_encoding::utf8_percent_encode(segment, SEGMENT).to_string()
}

fn admin_token(state: &ApiState) -> Option<String> {
    state.authenticator.as_ref().map(|a| a.admin_token().to_string())
}

/// Headers that describe one hop and are not passed on (the upgrade headers are, for upgrades).
const HOP_BY_HOP: &[&str] = &[
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "authorization",
    "host",
    "content-length",
];

fn passes(name: &HeaderName, upgrading: bool) -> bool {
    if HOP_BY_HOP.contains(&name.as_str()) {
        return false;
    }
    upgrading || (name != header::CONNECTION && name != header::UPGRADE)
}

fn header_tokens<'a>(headers: &'a HeaderMap, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
    headers.get_all(name).iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(',')).map(str::trim)
}

fn is_upgrade(headers: &HeaderMap) -> bool {
    header_tokens(headers, "connection").any(|t| t.eq_ignore_ascii_case("upgrade"))
        && headers.contains_key(header::UPGRADE)
}

// ---------------------------------------------------------------------------------------------
// The connection to an agent

/// Why an agent could not be reached; `cause` is Go-like text for the client.
#[derive(Debug)]
struct SendError {
    url: String,
    cause: String,
}

/// Sends one request to the agent on a new connection (HTTP/1.1, upgrades allowed) with the
/// admin token, and returns its answer with the body still streaming.
async fn send(
    agent: &Agent,
    token: Option<String>,
    method: Method,
    path_and_query: &str,
    headers: &HeaderMap,
) -> Result<http::Response<hyper::body::Incoming>, SendError> {
    let url = format!("https://{}{path_and_query}", agent.authority());
    let fail = |cause: String| SendError { url: url.clone(), cause };
    let authority = agent.authority();
    let tcp = tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(&authority))
        .await
        .map_err(|_| fail(format!("dial tcp {authority}: i/o timeout")))?
        .map_err(|e| fail(format!("dial tcp {authority}: connect: {e}")))?;
    let _ = tcp.set_nodelay(true);
    let server_name = match agent.host.parse::<IpAddr>() {
        Ok(ip) => ServerName::IpAddress(ip.into()),
        Err(_) => ServerName::try_from(agent.host.clone()).map_err(|e| fail(format!("invalid host: {e}")))?,
    };
    let tls = tokio::time::timeout(CONNECT_TIMEOUT, tls_connector().connect(server_name, tcp))
        .await
        .map_err(|_| fail("net/http: TLS handshake timeout".into()))?
        .map_err(|e| fail(format!("tls: {e}")))?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(tls)).await.map_err(|e| fail(e.to_string()))?;
    tokio::spawn(async move {
        if let Err(error) = connection.with_upgrades().await {
            tracing::debug!(%error, "the connection to a node agent ended with an error");
        }
    });
    let mut request = http::Request::builder().method(method).uri(path_and_query);
    for (k, v) in headers {
        request = request.header(k, v);
    }
    request = request.header(header::HOST, authority.as_str());
    if let Some(token) = token {
        request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let request = request.body(Empty::<Bytes>::new()).map_err(|e| fail(e.to_string()))?;
    sender.send_request(request).await.map_err(|e| fail(e.to_string()))
}

/// A TLS connector that accepts any server certificate: agents and pods make their own.
pub(crate) fn tls_connector() -> tokio_rustls::TlsConnector {
    static CONFIG: OnceLock<Arc<rustls::ClientConfig>> = OnceLock::new();
    let config = CONFIG.get_or_init(|| {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .expect("ring supports the default protocol versions")
            .dangerous()
            // Agents make their own, self-signed, certificates: kube-apiserver without
            // `--kubelet-certificate-authority` accepts them too.
            .with_custom_certificate_verifier(Arc::new(AnyServerCertificate::new(provider)))
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Arc::new(config)
    });
    tokio_rustls::TlsConnector::from(config.clone())
}

// ---------------------------------------------------------------------------------------------
// SPDY tunnelled through a WebSocket (port forwarding)

/// The SPDY protocols a WebSocket upgrade tunnels (`SPDY/3.1+portforward.k8s.io` → `portforward.k8s.io`).
fn tunnelled_protocols(headers: &HeaderMap) -> Option<Vec<String>> {
    let websocket =
        headers.get(header::UPGRADE).and_then(|v| v.to_str().ok()).is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    if !websocket {
        return None;
    }
    let protocols: Vec<String> = header_tokens(headers, "sec-websocket-protocol")
        .filter_map(|p| p.strip_prefix(SPDY_TUNNEL_PREFIX).map(str::to_string))
        .collect();
    (!protocols.is_empty()).then_some(protocols)
}

/// Upgrades to SPDY at the agent first; only when it switches protocols does the client get its
/// WebSocket, whose binary messages then carry the SPDY bytes both ways.
async fn tunnel_port_forward(
    agent: &Agent,
    token: Option<String>,
    path: &str,
    client_headers: &HeaderMap,
    protocols: Vec<String>,
    client_upgrade: hyper::upgrade::OnUpgrade,
) -> ApiResult<Response> {
    let key = client_headers.get("sec-websocket-key").and_then(|v| v.to_str().ok()).map(str::to_string);
    let Some(key) = key else {
        return Err(ApiError::bad_request("unable to upgrade: missing Sec-WebSocket-Key"));
    };
    let mut headers = HeaderMap::new();
    headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static("SPDY/3.1"));
    for p in &protocols {
        if let Ok(v) = HeaderValue::from_str(p) {
            headers.append("x-stream-protocol-version", v);
        }
    }
    let mut answer = send(agent, token, Method::GET, path, &headers)
        .await
        .map_err(|e| ApiError::internal(format!("error dialing backend: {}", e.cause)))?;
    if answer.status() != StatusCode::SWITCHING_PROTOCOLS {
        let mut response = Response::builder().status(answer.status());
        for (k, v) in answer.headers() {
            if passes(k, false) {
                response = response.header(k, v);
            }
        }
        return response.body(Body::new(answer.into_body())).map_err(|e| ApiError::internal(e.to_string()));
    }
    let negotiated = answer
        .headers()
        .get("x-stream-protocol-version")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .unwrap_or_else(|| protocols[0].clone());
    let agent_upgrade = hyper::upgrade::on(&mut answer);
    tokio::spawn(async move {
        match tokio::try_join!(client_upgrade, agent_upgrade) {
            Ok((client, agent)) => splice_tunnel(client, agent).await,
            Err(error) => tracing::debug!(%error, "a tunnelled port forward did not start"),
        }
    });
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, "websocket")
        .header("Sec-WebSocket-Accept", accept)
        .header("Sec-WebSocket-Protocol", format!("{SPDY_TUNNEL_PREFIX}{negotiated}"))
        .body(Body::empty())
        .map_err(|e| ApiError::internal(e.to_string()))
}

/// Carries bytes between the client's WebSocket (binary messages) and the agent's SPDY connection
/// until either side closes; the other side then gets a few seconds to finish.
async fn splice_tunnel(client: hyper::upgrade::Upgraded, agent: hyper::upgrade::Upgraded) {
    const CLOSE_GRACE: Duration = Duration::from_secs(5);
    let ws = WebSocketStream::from_raw_socket(TokioIo::new(client), Role::Server, None).await;
    let (mut ws_tx, mut ws_rx) = ws.split();
    let (mut agent_rx, mut agent_tx) = tokio::io::split(TokioIo::new(agent));
    let up = async move {
        while let Some(message) = ws_rx.next().await {
            match message {
                Ok(Message::Binary(data)) => {
                    if agent_tx.write_all(&data).await.is_err() {
                        break;
                    }
                }
                Ok(Message::Close(_)) | Err(_) => break,
                Ok(_) => {} // pings are answered by the WebSocket itself; text has no meaning here
            }
        }
        let _ = agent_tx.shutdown().await;
    };
    let down = async move {
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            match agent_rx.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if ws_tx.send(Message::Binary(Bytes::copy_from_slice(&buf[..n]))).await.is_err() {
                        return;
                    }
                }
            }
        }
        let close = CloseFrame { code: CloseCode::Normal, reason: "".into() };
        let _ = ws_tx.send(Message::Close(Some(close))).await;
    };
    tokio::pin!(up, down);
    tokio::select! {
        _ = &mut up => { let _ = tokio::time::timeout(CLOSE_GRACE, down).await; }
        _ = &mut down => { let _ = tokio::time::timeout(CLOSE_GRACE, up).await; }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn q(s: &str) -> Vec<(String, String)> {
        pairs(Some(s))
    }

    fn pod(containers: &[&str], init: &[&str]) -> Value {
        let list = |names: &[&str]| names.iter().map(|n| json!({"name": n})).collect::<Vec<_>>();
        json!({"spec": {"containers": list(containers), "initContainers": list(init)}})
    }

    #[test]
    fn the_only_container_is_the_default_and_others_must_be_named() {
        assert_eq!(validate_container(&pod(&["app"], &[]), "web", None).unwrap(), "app");
        let err = validate_container(&pod(&["a", "b"], &["init"]), "web", None).unwrap_err();
        assert_eq!(err.code, 400);
        assert_eq!(err.message, "a container name must be specified for pod web, choose one of: [init a b]");
        assert_eq!(validate_container(&pod(&["a", "b"], &["init"]), "web", Some("init")).unwrap(), "init");
        let err = validate_container(&pod(&["app"], &[]), "web", Some("nope")).unwrap_err();
        assert_eq!(err.message, "container nope is not valid for pod web");
    }

    #[test]
    fn log_options_become_the_kubelet_query_or_an_invalid_status() {
        let query = log_query("web", &q("follow=true&tailLines=5&timestamps=1&previous=false&container=x")).unwrap();
        assert_eq!(query, "follow=true&timestamps=true&tailLines=5");
        let query = log_query("web", &q("sinceTime=2024-05-01T10:00:00.5%2B02:00")).unwrap();
        assert_eq!(query, "sinceTime=2024-05-01T08%3A00%3A00Z");
        let err = log_query("web", &q("tailLines=-1&limitBytes=0")).unwrap_err();
        assert_eq!(err.code, 422);
        assert_eq!(
            err.message,
            "PodLogOptions \"web\" is invalid: [tailLines: Invalid value: -1: must be greater than or equal to 0, limitBytes: Invalid value: 0: must be greater than 0]"
        );
    }

    #[test]
    fn exec_options_use_kubelets_parameter_names() {
        let query =
            stream_query(&q("command=sh&command=-c&command=echo+hi&stdin=true&stdout=true&stderr=false&tty=1"), true);
        assert_eq!(query, "command=sh&command=-c&command=echo+hi&input=1&output=1&tty=1");
        assert_eq!(stream_query(&q("command=ls&stdout=true"), false), "output=1");
        assert_eq!(port_query(&q("ports=8080&ports=9090,53")).unwrap(), "port=8080%2C9090%2C53");
        assert!(port_query(&q("ports=0")).is_err());
    }

    #[test]
    fn the_agent_is_reached_at_the_nodes_internal_ip_and_reported_port() {
        let node = json!({"status": {
            "addresses": [{"type": "Hostname", "address": "node-a"}, {"type": "InternalIP", "address": "10.0.0.7"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10350}},
        }});
        assert_eq!(agent_address(&node).unwrap(), Agent { host: "10.0.0.7".into(), port: 10350 });
        let bare = json!({"status": {"addresses": [{"type": "Hostname", "address": "node-b"}]}});
        assert_eq!(agent_address(&bare).unwrap(), Agent { host: "node-b".into(), port: 10250 });
        let err = agent_address(&json!({"status": {}})).unwrap_err();
        assert_eq!(err.message, "no preferred addresses found; known addresses: []");
        assert_eq!(Agent { host: "::1".into(), port: 1 }.authority(), "[::1]:1");
    }

    #[test]
    fn only_websocket_upgrades_offering_spdy_are_tunnelled() {
        let mut h = HeaderMap::new();
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        h.insert("sec-websocket-protocol", HeaderValue::from_static("SPDY/3.1+portforward.k8s.io, v4.channel.k8s.io"));
        assert_eq!(tunnelled_protocols(&h), Some(vec!["portforward.k8s.io".to_string()]));
        h.insert("sec-websocket-protocol", HeaderValue::from_static("v4.channel.k8s.io"));
        assert_eq!(tunnelled_protocols(&h), None);
        h.insert(header::UPGRADE, HeaderValue::from_static("SPDY/3.1"));
        assert_eq!(tunnelled_protocols(&h), None);
    }
}
