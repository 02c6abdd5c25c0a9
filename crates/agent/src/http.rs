//! The kubelet HTTPS API: container logs, exec, attach, port-forward, health, metrics and pods.
//!
//! Routes, as kubelet names them: `/healthz` (open to all), `/pods`, `/metrics`,
//! `/containerLogs/{ns}/{pod}/{container}`, `/exec/{ns}/{pod}[/{uid}]/{container}`,
//! `/attach/{ns}/{pod}[/{uid}]/{container}` and `/portForward/{ns}/{pod}[/{uid}]`. Every other route
//! needs a bearer token of an admin or of this node ([`auth`]). Pods are found through CRI
//! ([`lookup`]), logs are read from the CRI log files ([`logs`]), and exec, attach and port-forward
//! are handed to the runtime's streaming server ([`forward`]). The certificate is self-signed
//! ([`tls`]).

pub mod auth;
pub mod forward;
pub mod logs;
pub mod lookup;
pub mod tls;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, RawQuery, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use bytes::Bytes;
use http::{HeaderValue, Method, StatusCode, header};
use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde_json::json;

use crate::runtimes::RuntimeManager;
use auth::{AuthError, Authenticator};
use berth_common::error::error_chain;
use forward::text_error;
use logs::{LogOptions, LogReader, RunningCheck};
use lookup::{FoundPod, Instance, LookupError};

/// How long a request waits for the control plane when it only wants to learn a pod's UID.
const API_TIMEOUT: Duration = Duration::from_secs(3);

/// What the agent's HTTPS API needs.
pub struct Settings {
    /// To review bearer tokens and read Pods.
    pub client: kube::Client,
    pub node_name: String,
    pub runtimes: Arc<RuntimeManager>,
    /// `--port`, default 10250; 0 picks a free port (see [`Server::local_addr`]).
    pub port: u16,
    /// Default 0.0.0.0.
    pub bind_address: IpAddr,
    /// `<root_dir>/pki`: the self-signed serving certificate is made there on first start.
    pub cert_dir: PathBuf,
}

/// Why the API could not be served.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot prepare the serving certificate in {}", dir.display())]
    Certificate {
        dir: PathBuf,
        #[source]
        source: tls::CertError,
    },
    #[error("cannot listen on {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("serving on {addr} failed")]
    Serve {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// Serves the API until the future is dropped or serving fails.
pub async fn serve(settings: Settings) -> Result<(), Error> {
    Server::bind(settings).await?.run().await
}

/// The API bound to its port, not serving yet.
pub struct Server {
    listener: std::net::TcpListener,
    addr: SocketAddr,
    tls: Arc<rustls::ServerConfig>,
    app: Arc<App>,
}

impl Server {
    /// Prepares the certificate and binds the port.
    pub async fn bind(settings: Settings) -> Result<Server, Error> {
        let dir = settings.cert_dir.clone();
        let node = settings.node_name.clone();
        let tls = tokio::task::spawn_blocking(move || tls::serving_config(&dir, &node))
            .await
            .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
            .map_err(|source| Error::Certificate { dir: settings.cert_dir.clone(), source })?;
        let addr = SocketAddr::new(settings.bind_address, settings.port);
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .and_then(|l| l.into_std())
            .map_err(|source| Error::Bind { addr, source })?;
        let addr = listener.local_addr().map_err(|source| Error::Bind { addr, source })?;
        let app = Arc::new(App {
            auth: Authenticator::new(settings.client.clone(), &settings.node_name),
            client: settings.client,
            node_name: settings.node_name,
            runtimes: settings.runtimes,
            metrics: Metrics::new(),
        });
        Ok(Server { listener, addr, tls, app })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves until the future is dropped or serving fails.
    pub async fn run(self) -> Result<(), Error> {
        let addr = self.addr;
        tracing::info!(%addr, node = %self.app.node_name, "serving the agent API");
        let config = axum_server::tls_rustls::RustlsConfig::from_config(self.tls);
        axum_server::from_tcp_rustls(self.listener, config)
            .map_err(|source| Error::Serve { addr, source })?
            .serve(router(self.app).into_make_service())
            .await
            .map_err(|source| Error::Serve { addr, source })
    }
}

struct App {
    client: kube::Client,
    node_name: String,
    runtimes: Arc<RuntimeManager>,
    auth: Authenticator,
    metrics: Metrics,
}

fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/pods", get(pods))
        .route("/metrics", get(metrics))
        .route("/containerLogs/{namespace}/{pod}/{container}", get(container_logs))
        .route("/exec/{namespace}/{pod}/{container}", any(exec))
        .route("/exec/{namespace}/{pod}/{uid}/{container}", any(exec))
        .route("/attach/{namespace}/{pod}/{container}", any(attach))
        .route("/attach/{namespace}/{pod}/{uid}/{container}", any(attach))
        .route("/portForward/{namespace}/{pod}", any(port_forward))
        .route("/portForward/{namespace}/{pod}/{uid}", any(port_forward))
        .fallback(|| async { text_error(StatusCode::NOT_FOUND, "404 page not found") })
        .layer(middleware::from_fn_with_state(app.clone(), authenticate))
        .layer(middleware::from_fn_with_state(app.clone(), count))
        .with_state(app)
}

/// A `metav1.Status` failure, as the agent answers refused requests.
fn status_error(code: u16, reason: &str, message: &str) -> Response {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code,
    });
    let code = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (code, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

async fn authenticate(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    if req.uri().path() == "/healthz" {
        return next.run(req).await;
    }
    let header = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    let user = match app.auth.authenticate(header).await {
        Ok(user) => user,
        Err(err) => {
            if let AuthError::ReviewFailed(why) = &err {
                tracing::warn!(error = %why, "a token review failed");
            }
            return status_error(err.status_code(), "Unauthorized", &err.to_string());
        }
    };
    let verb = match *req.method() {
        Method::GET | Method::HEAD => "get",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "*",
    };
    // kubelet's subresources for its authorizer: these routes all count as `proxy`.
    let subresource = if req.uri().path() == "/metrics" { "metrics" } else { "proxy" };
    if let Err(err) = app.auth.authorize(&user, verb, subresource) {
        return status_error(err.status_code(), "Forbidden", &err.to_string());
    }
    next.run(req).await
}

async fn count(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    let route = req.uri().path().trim_start_matches('/').split('/').next().unwrap_or("").to_string();
    let route = match route.as_str() {
        "healthz" | "pods" | "metrics" | "containerLogs" | "exec" | "attach" | "portForward" => route,
        _ => "other".into(),
    };
    let response = next.run(req).await;
    app.metrics.requests.get_or_create(&RequestLabels { route, code: response.status().as_u16().to_string() }).inc();
    response
}

impl App {
    /// The pod from the API, if the control plane answers in time (only to learn its UID and
    /// the reason a container waits; the runtimes are the truth for everything else).
    async fn api_pod(&self, namespace: &str, name: &str) -> Option<Pod> {
        let api = Api::<Pod>::namespaced(self.client.clone(), namespace);
        match tokio::time::timeout(API_TIMEOUT, api.get_opt(name)).await {
            Ok(Ok(pod)) => {
                pod.filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(&self.node_name))
            }
            Ok(Err(error)) => {
                tracing::debug!(%error, namespace, name, "reading the pod failed; looking it up by name");
                None
            }
            Err(_) => None,
        }
    }

    async fn find_pod(
        &self,
        namespace: &str,
        name: &str,
        uid: Option<&str>,
    ) -> (Option<Pod>, Result<FoundPod, LookupError>) {
        let pod = self.api_pod(namespace, name).await;
        let api_uid = pod.as_ref().and_then(|p| p.metadata.uid.clone());
        let uid = uid.map(str::to_string).or(api_uid);
        let found = lookup::find_pod(&self.runtimes, namespace, name, uid.as_deref()).await;
        (pod, found)
    }
}

/// Why a container waits, from the pod's status in the API.
fn waiting_reason(pod: Option<&Pod>, container: &str) -> Option<String> {
    let status = pod?.status.as_ref()?;
    status
        .container_statuses
        .iter()
        .flatten()
        .chain(status.init_container_statuses.iter().flatten())
        .find(|s| s.name == container)?
        .state
        .as_ref()?
        .waiting
        .as_ref()?
        .reason
        .clone()
}

fn query_pairs(query: Option<&str>) -> Vec<(String, String)> {
    url::form_urlencoded::parse(query.unwrap_or("").as_bytes()).into_owned().collect()
}

fn lookup_error(err: &LookupError) -> Response {
    let code = StatusCode::from_u16(err.status_code()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    text_error(code, &err.message())
}

async fn container_logs(
    State(app): State<Arc<App>>,
    Path((namespace, pod_name, container)): Path<(String, String, String)>,
    RawQuery(query): RawQuery,
) -> Response {
    let opts = match LogOptions::from_query(&query_pairs(query.as_deref()), jiff::Timestamp::now()) {
        Ok(opts) => opts,
        Err(err) => return text_error(StatusCode::BAD_REQUEST, &err.0),
    };
    let (api_pod, found) = app.find_pod(&namespace, &pod_name, None).await;
    let pod = match found {
        Ok(pod) => pod,
        Err(err) => return lookup_error(&err),
    };
    let instance = if opts.previous { Instance::Previous } else { Instance::Latest };
    let reason = waiting_reason(api_pod.as_ref(), &container);
    let chosen = match lookup::find_container(&pod, &pod_name, &container, instance, reason.as_deref()).await {
        Ok(c) => c,
        Err(err) => return lookup_error(&err),
    };
    let mut runtime = pod.endpoint.runtime.clone();
    let status = match runtime
        .container_status(cri::ContainerStatusRequest { container_id: chosen.id.clone(), verbose: false })
        .await
    {
        Ok(s) => s.into_inner().status.unwrap_or_default(),
        Err(status) => return text_error(StatusCode::INTERNAL_SERVER_ERROR, status.message()),
    };
    if status.log_path.is_empty() {
        return text_error(StatusCode::BAD_REQUEST, &format!("container {container:?} in pod {pod_name:?} has no log"));
    }
    let mut path = PathBuf::from(&status.log_path);
    if path.is_relative() {
        // CRI log paths are relative to the sandbox's log directory, kubelet's layout.
        path = PathBuf::from(format!("/var/log/pods/{namespace}_{pod_name}_{}", pod.uid)).join(path);
    }
    let reader = match LogReader::open(path, opts).await {
        Ok(r) => r,
        Err(err) => return text_error(StatusCode::BAD_REQUEST, &error_chain(&err)),
    };
    let container_id = chosen.id.clone();
    let endpoint = pod.endpoint.clone();
    let running: RunningCheck = Arc::new(move || {
        let mut runtime = endpoint.runtime.clone();
        let id = container_id.clone();
        Box::pin(async move {
            runtime
                .container_status(cri::ContainerStatusRequest { container_id: id, verbose: false })
                .await
                .ok()
                .and_then(|s| s.into_inner().status)
                .is_some_and(|s| s.state == cri::ContainerState::ContainerRunning as i32)
        })
    });
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(4);
    tokio::spawn(async move {
        if let Err(error) = reader.stream(running, tx).await {
            tracing::warn!(error = %error_chain(&error), "serving a container log failed");
        }
    });
    let body = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|chunk| (Ok::<_, std::convert::Infallible>(chunk), rx))
    });
    let mut response = Response::new(Body::from_stream(body));
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    response
}

/// The stdin/stdout/stderr/tty flags of an exec or attach request (`1` or `true` mean yes).
#[derive(Debug, Default, PartialEq, Eq)]
struct StreamFlags {
    stdin: bool,
    stdout: bool,
    stderr: bool,
    tty: bool,
}

impl StreamFlags {
    fn from_query(pairs: &[(String, String)]) -> Result<StreamFlags, String> {
        let flag = |name: &str| pairs.iter().any(|(k, v)| k == name && (v == "1" || v.eq_ignore_ascii_case("true")));
        let mut flags = StreamFlags {
            stdin: flag("input") || flag("stdin"),
            stdout: flag("output") || flag("stdout"),
            stderr: flag("error") || flag("stderr"),
            tty: flag("tty"),
        };
        // kubelet: a terminal has no separate stderr, so the flag is dropped rather than refused.
        if flags.tty {
            flags.stderr = false;
        }
        if !flags.stdin && !flags.stdout && !flags.stderr {
            return Err("you must specify at least 1 of stdin, stdout, stderr".into());
        }
        Ok(flags)
    }
}

fn grpc_error(status: &tonic::Status) -> Response {
    let code = match status.code() {
        tonic::Code::NotFound => StatusCode::NOT_FOUND,
        tonic::Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    text_error(code, status.message())
}

async fn forward_to(req: Request, url: &str) -> Response {
    match forward::forward(req, url).await {
        Ok(response) => response,
        Err(err) => {
            tracing::warn!(error = %error_chain(&err), "forwarding a stream to the runtime failed");
            text_error(StatusCode::BAD_GATEWAY, &error_chain(&err))
        }
    }
}

/// Resolves the running container a stream is for, or the answer that refuses the request.
async fn running_container(
    app: &App,
    params: &HashMap<String, String>,
) -> Result<(FoundPod, cri::Container), Response> {
    let (namespace, pod_name, container) = (&params["namespace"], &params["pod"], &params["container"]);
    let (_, found) = app.find_pod(namespace, pod_name, params.get("uid").map(String::as_str)).await;
    let pod = found.map_err(|e| lookup_error(&e))?;
    let chosen = lookup::find_container(&pod, pod_name, container, Instance::Running, None)
        .await
        .map_err(|e| lookup_error(&e))?;
    Ok((pod, chosen))
}

async fn exec(State(app): State<Arc<App>>, Path(params): Path<HashMap<String, String>>, req: Request) -> Response {
    let pairs = query_pairs(req.uri().query());
    let flags = match StreamFlags::from_query(&pairs) {
        Ok(f) => f,
        Err(msg) => return text_error(StatusCode::BAD_REQUEST, &msg),
    };
    let cmd: Vec<String> = pairs.iter().filter(|(k, _)| k == "command").map(|(_, v)| v.clone()).collect();
    let (pod, container) = match running_container(&app, &params).await {
        Ok(found) => found,
        Err(response) => return response,
    };
    let request = cri::ExecRequest {
        container_id: container.id,
        cmd,
        tty: flags.tty,
        stdin: flags.stdin,
        stdout: flags.stdout,
        stderr: flags.stderr,
    };
    match pod.endpoint.runtime.clone().exec(request).await {
        Ok(answer) => forward_to(req, &answer.into_inner().url).await,
        Err(status) => grpc_error(&status),
    }
}

async fn attach(State(app): State<Arc<App>>, Path(params): Path<HashMap<String, String>>, req: Request) -> Response {
    let flags = match StreamFlags::from_query(&query_pairs(req.uri().query())) {
        Ok(f) => f,
        Err(msg) => return text_error(StatusCode::BAD_REQUEST, &msg),
    };
    let (pod, container) = match running_container(&app, &params).await {
        Ok(found) => found,
        Err(response) => return response,
    };
    let request = cri::AttachRequest {
        container_id: container.id,
        tty: flags.tty,
        stdin: flags.stdin,
        stdout: flags.stdout,
        stderr: flags.stderr,
    };
    match pod.endpoint.runtime.clone().attach(request).await {
        Ok(answer) => forward_to(req, &answer.into_inner().url).await,
        Err(status) => grpc_error(&status),
    }
}

/// Ports of a port-forward request: `port` query values, repeated or comma-separated.
fn ports(pairs: &[(String, String)]) -> Result<Vec<i32>, String> {
    let mut ports = Vec::new();
    for (_, value) in pairs.iter().filter(|(k, _)| k == "port") {
        for p in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match p.parse::<u16>() {
                Ok(port) if port > 0 => ports.push(i32::from(port)),
                _ => return Err(format!("invalid port {p:?}")),
            }
        }
    }
    Ok(ports)
}

async fn port_forward(
    State(app): State<Arc<App>>,
    Path(params): Path<HashMap<String, String>>,
    req: Request,
) -> Response {
    let port = match ports(&query_pairs(req.uri().query())) {
        Ok(p) => p,
        Err(msg) => return text_error(StatusCode::BAD_REQUEST, &msg),
    };
    let (namespace, pod_name) = (&params["namespace"], &params["pod"]);
    let (_, found) = app.find_pod(namespace, pod_name, params.get("uid").map(String::as_str)).await;
    let pod = match found {
        Ok(pod) if pod.is_ready() => pod,
        Ok(_) => {
            return text_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                &format!("pod not found (\"{namespace}/{pod_name}\")"),
            );
        }
        Err(err) => return lookup_error(&err),
    };
    let request = cri::PortForwardRequest { pod_sandbox_id: pod.sandbox.id.clone(), port };
    match pod.endpoint.runtime.clone().port_forward(request).await {
        Ok(answer) => forward_to(req, &answer.into_inner().url).await,
        Err(status) => grpc_error(&status),
    }
}

/// This node's pods, as kubelet's `/pods` lists them (read from the API).
async fn pods(State(app): State<Arc<App>>) -> Response {
    let api = Api::<Pod>::all(app.client.clone());
    let params = ListParams::default().fields(&format!("spec.nodeName={}", app.node_name));
    match api.list(&params).await {
        Ok(list) => {
            let body = json!({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": list.items});
            ([(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
        }
        Err(error) => status_error(503, "ServiceUnavailable", &format!("cannot list this node's pods: {error}")),
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    route: String,
    code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EndpointLabels {
    endpoint: String,
}

struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    running_pods: Family<EndpointLabels, Gauge>,
}

impl Metrics {
    fn new() -> Self {
        let mut registry = Registry::with_prefix("agent");
        let requests = Family::<RequestLabels, Counter>::default();
        let running_pods = Family::<EndpointLabels, Gauge>::default();
        registry.register("http_requests", "Requests to the agent's API by route and HTTP code", requests.clone());
        registry.register("running_pods", "Ready pod sandboxes per CRI endpoint", running_pods.clone());
        Metrics { registry, requests, running_pods }
    }
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    for (endpoint, _) in app.runtimes.endpoints() {
        let ready = cri::PodSandboxFilter {
            state: Some(cri::PodSandboxStateValue { state: cri::PodSandboxState::SandboxReady as i32 }),
            ..Default::default()
        };
        let mut runtime = endpoint.runtime.clone();
        let listed = tokio::time::timeout(
            API_TIMEOUT,
            runtime.list_pod_sandbox(cri::ListPodSandboxRequest { filter: Some(ready) }),
        )
        .await;
        let gauge = app.metrics.running_pods.get_or_create(&EndpointLabels { endpoint: endpoint.name.clone() });
        match listed {
            Ok(Ok(list)) => {
                gauge.set(list.into_inner().items.len() as i64);
            }
            // An endpoint that does not answer has no pod we can vouch for.
            _ => {
                gauge.set(0);
            }
        }
    }
    let mut out = String::new();
    if prometheus_client::encoding::text::encode(&mut out, &app.metrics.registry).is_err() {
        return text_error(StatusCode::INTERNAL_SERVER_ERROR, "cannot encode metrics");
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], out).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(q: &str) -> Vec<(String, String)> {
        query_pairs(Some(q))
    }

    #[test]
    fn stream_flags_follow_kubelet() {
        let f = StreamFlags::from_query(&pairs("stdin=1&stdout=1&stderr=1&tty=1")).unwrap();
        assert_eq!(f, StreamFlags { stdin: true, stdout: true, stderr: false, tty: true });
        let f = StreamFlags::from_query(&pairs("output=1&error=1")).unwrap();
        assert!(f.stdout && f.stderr && !f.stdin);
        assert_eq!(
            StreamFlags::from_query(&pairs("tty=1&stdin=0")).unwrap_err(),
            "you must specify at least 1 of stdin, stdout, stderr"
        );
    }

    #[test]
    fn ports_come_repeated_or_comma_separated() {
        assert_eq!(ports(&pairs("port=80,443&port=8080")).unwrap(), vec![80, 443, 8080]);
        assert_eq!(ports(&pairs("")).unwrap(), Vec::<i32>::new());
        assert!(ports(&pairs("port=0")).is_err());
        assert!(ports(&pairs("port=http")).is_err());
    }
}
