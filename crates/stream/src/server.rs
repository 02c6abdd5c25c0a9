//! The HTTP front: hands out single-use URLs for validated CRI requests, and serves those URLs by
//! upgrading the connection to SPDY/3.1 or WebSocket and starting the matching session.

use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use k8s_cri::v1 as cri;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::backend::Backend;
use crate::cache::{Request as CachedRequest, RequestCache};
use crate::portforward;
use crate::remotecommand::{self, Command, Options, Protocol};
use crate::websocket;

/// Port forwarding over one WebSocket is limited by the one-byte channel number (two channels per port).
const MAX_WS_PORTS: usize = 127;

/// The CRI streaming server. Serves until dropped; sessions already running finish on their own.
pub struct StreamServer {
    addr: SocketAddr,
    cache: Arc<RequestCache>,
    accept_task: JoinHandle<()>,
}

impl Drop for StreamServer {
    fn drop(&mut self) {
        self.accept_task.abort();
    }
}

impl std::fmt::Debug for StreamServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamServer").field("addr", &self.addr).finish_non_exhaustive()
    }
}

#[derive(Clone)]
struct State {
    cache: Arc<RequestCache>,
    backend: Arc<dyn Backend>,
}

impl StreamServer {
    /// Binds (e.g. 127.0.0.1:0) and serves in a spawned task until dropped.
    pub async fn start(addr: SocketAddr, backend: Arc<dyn Backend>) -> std::io::Result<StreamServer> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let cache = Arc::new(RequestCache::default());
        let state = State { cache: cache.clone(), backend };
        let accept_task = tokio::spawn(accept_loop(listener, state));
        tracing::info!(%addr, "stream server listening");
        Ok(StreamServer { addr, cache, accept_task })
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Validates an exec request and returns a single-use URL for it, valid for one minute.
    pub fn get_exec(&self, req: cri::ExecRequest) -> Result<cri::ExecResponse, tonic::Status> {
        if req.container_id.is_empty() {
            return Err(tonic::Status::invalid_argument("missing required container_id"));
        }
        if req.cmd.is_empty() {
            return Err(tonic::Status::invalid_argument("cmd must not be empty"));
        }
        validate_streams(req.tty, req.stdin, req.stdout, req.stderr)?;
        Ok(cri::ExecResponse { url: self.url("exec", CachedRequest::Exec(req))? })
    }

    /// Validates an attach request and returns a single-use URL for it, valid for one minute.
    pub fn get_attach(&self, req: cri::AttachRequest) -> Result<cri::AttachResponse, tonic::Status> {
        if req.container_id.is_empty() {
            return Err(tonic::Status::invalid_argument("missing required container_id"));
        }
        validate_streams(req.tty, req.stdin, req.stdout, req.stderr)?;
        Ok(cri::AttachResponse { url: self.url("attach", CachedRequest::Attach(req))? })
    }

    /// Validates a port-forward request and returns a single-use URL for it, valid for one minute.
    pub fn get_port_forward(&self, req: cri::PortForwardRequest) -> Result<cri::PortForwardResponse, tonic::Status> {
        if req.pod_sandbox_id.is_empty() {
            return Err(tonic::Status::invalid_argument("missing required pod_sandbox_id"));
        }
        if let Some(bad) = req.port.iter().find(|p| !(1..=65535).contains(*p)) {
            return Err(tonic::Status::invalid_argument(format!("invalid port {bad}: must be between 1 and 65535")));
        }
        Ok(cri::PortForwardResponse { url: self.url("portforward", CachedRequest::PortForward(req))? })
    }

    fn url(&self, kind: &str, req: CachedRequest) -> Result<String, tonic::Status> {
        let token = self.cache.insert(req).map_err(|e| tonic::Status::resource_exhausted(e.to_string()))?;
        // A wildcard bind address is no place to connect to; clients on this host use loopback.
        let mut addr = self.addr;
        if addr.ip().is_unspecified() {
            addr.set_ip(match addr.ip() {
                IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
                IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
            });
        }
        Ok(format!("http://{addr}/{kind}/{token}"))
    }
}

fn validate_streams(tty: bool, stdin: bool, stdout: bool, stderr: bool) -> Result<(), tonic::Status> {
    if tty && stderr {
        return Err(tonic::Status::invalid_argument("tty and stderr cannot both be true"));
    }
    if !stdin && !stdout && !stderr {
        return Err(tonic::Status::invalid_argument("one of stdin, stdout, or stderr must be set"));
    }
    Ok(())
}

async fn accept_loop(listener: TcpListener, state: State) {
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(error) => {
                tracing::warn!(%error, "stream server accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let state = state.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let state = state.clone();
                async move { Ok::<_, Infallible>(handle(state, req).await) }
            });
            if let Err(error) = http1::Builder::new().serve_connection(TokioIo::new(tcp), service).with_upgrades().await
            {
                tracing::debug!(%error, %peer, "stream server connection ended with an error");
            }
        });
    }
}

type Resp = Response<Full<Bytes>>;

fn text(status: StatusCode, msg: impl Into<String>) -> Resp {
    let mut body = msg.into();
    body.push('\n');
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    resp
}

/// All comma-separated values of a header, across repeated headers.
fn header_tokens(headers: &HeaderMap, name: &str) -> Vec<String> {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect()
}

/// The first protocol the client offers that the server speaks; `Some("")` if the client offers none.
fn negotiate<'a>(offered: &[String], supported: &[&'a str]) -> Option<&'a str> {
    if offered.is_empty() {
        return Some("");
    }
    offered.iter().find_map(|o| supported.iter().find(|s| **s == o.as_str()).copied())
}

enum Upgrade {
    Spdy,
    WebSocket { key: String },
}

async fn handle(state: State, mut req: Request<Incoming>) -> Resp {
    let path = req.uri().path().to_string();
    let Some((kind, token)) = path.strip_prefix('/').and_then(|p| p.split_once('/')) else {
        return text(StatusCode::NOT_FOUND, "404 page not found");
    };
    if !matches!(kind, "exec" | "attach" | "portforward") || token.is_empty() || token.contains('/') {
        return text(StatusCode::NOT_FOUND, "404 page not found");
    }
    if req.method() != Method::GET && req.method() != Method::POST {
        return text(StatusCode::METHOD_NOT_ALLOWED, format!("method {} not allowed: use GET or POST", req.method()));
    }
    // Look before consuming, so a malformed request does not burn a valid token.
    let cached = match (kind, state.cache.get(token)) {
        (_, None) => return text(StatusCode::NOT_FOUND, "token not found or expired"),
        ("exec", Some(r @ CachedRequest::Exec(_)))
        | ("attach", Some(r @ CachedRequest::Attach(_)))
        | ("portforward", Some(r @ CachedRequest::PortForward(_))) => r,
        _ => return text(StatusCode::NOT_FOUND, "token not found or expired"),
    };

    let headers = req.headers();
    let connection_upgrade = header_tokens(headers, "connection").iter().any(|t| t.eq_ignore_ascii_case("upgrade"));
    let upgrade_to = headers.get(header::UPGRADE).and_then(|v| v.to_str().ok()).unwrap_or("").to_ascii_lowercase();
    if !connection_upgrade || upgrade_to.is_empty() {
        return text(StatusCode::BAD_REQUEST, "unable to upgrade: missing upgrade headers in request");
    }
    let upgrade = match upgrade_to.as_str() {
        "spdy/3.1" => Upgrade::Spdy,
        "websocket" => {
            let Some(key) = headers.get("sec-websocket-key").and_then(|v| v.to_str().ok()) else {
                return text(StatusCode::BAD_REQUEST, "unable to upgrade: missing Sec-WebSocket-Key");
            };
            if headers.get("sec-websocket-version").and_then(|v| v.to_str().ok()) != Some("13") {
                return text(StatusCode::BAD_REQUEST, "unable to upgrade: unsupported Sec-WebSocket-Version (want 13)");
            }
            Upgrade::WebSocket { key: key.to_string() }
        }
        other => {
            return text(StatusCode::BAD_REQUEST, format!("unable to upgrade: unsupported protocol {other:?}"));
        }
    };

    let (offer_header, supported): (&str, &[&str]) = match (&upgrade, &cached) {
        (Upgrade::Spdy, CachedRequest::PortForward(_)) => ("x-stream-protocol-version", &[portforward::SPDY_PROTOCOL]),
        (Upgrade::Spdy, _) => ("x-stream-protocol-version", remotecommand::SPDY_PROTOCOLS),
        (Upgrade::WebSocket { .. }, CachedRequest::PortForward(_)) => {
            ("sec-websocket-protocol", websocket::PORT_FORWARD_PROTOCOLS)
        }
        (Upgrade::WebSocket { .. }, _) => ("sec-websocket-protocol", websocket::EXEC_PROTOCOLS),
    };
    let offered = header_tokens(headers, offer_header);
    let Some(protocol) = negotiate(&offered, supported) else {
        return text(
            StatusCode::FORBIDDEN,
            format!(
                "unable to upgrade: unable to negotiate protocol: client supports {offered:?}, server supports {supported:?}"
            ),
        );
    };

    let ws_ports = match (&upgrade, &cached) {
        (Upgrade::WebSocket { .. }, CachedRequest::PortForward(pf)) => match ws_ports(req.uri().query(), &pf.port) {
            Ok(p) => p,
            Err(msg) => return text(StatusCode::BAD_REQUEST, msg),
        },
        _ => Vec::new(),
    };

    // Everything checks out: now the token is spent.
    let Some(cached) = state.cache.consume(token) else {
        return text(StatusCode::NOT_FOUND, "token not found or expired");
    };
    let on_upgrade = hyper::upgrade::on(&mut req);
    let mut resp = Response::new(Full::new(Bytes::new()));
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = resp.headers_mut();
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    match &upgrade {
        Upgrade::Spdy => {
            h.insert(header::UPGRADE, HeaderValue::from_static("SPDY/3.1"));
            if !protocol.is_empty() {
                h.insert("X-Stream-Protocol-Version", HeaderValue::from_static(protocol));
            }
        }
        Upgrade::WebSocket { key } => {
            h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
            let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
            if let Ok(v) = HeaderValue::from_str(&accept) {
                h.insert("Sec-WebSocket-Accept", v);
            }
            if !protocol.is_empty() {
                h.insert("Sec-WebSocket-Protocol", HeaderValue::from_static(protocol));
            }
        }
    }
    tracing::debug!(kind, protocol, "upgrading stream connection");

    let backend = state.backend.clone();
    tokio::spawn(async move {
        let io = match on_upgrade.await {
            Ok(upgraded) => TokioIo::new(upgraded),
            Err(error) => {
                tracing::debug!(%error, "stream connection upgrade failed");
                return;
            }
        };
        match (upgrade, cached) {
            (Upgrade::Spdy, CachedRequest::PortForward(pf)) => {
                portforward::serve_spdy(io, pf.pod_sandbox_id, backend).await;
            }
            (Upgrade::WebSocket { .. }, CachedRequest::PortForward(pf)) => {
                websocket::serve_port_forward(io, protocol, pf.pod_sandbox_id, ws_ports, backend).await;
            }
            (upgrade, other) => {
                let (command, opts) = command_of(other);
                match upgrade {
                    Upgrade::Spdy => {
                        let version = Protocol::from_name(protocol).unwrap_or(Protocol::V1);
                        remotecommand::serve_spdy(io, version, command, opts, backend).await;
                    }
                    Upgrade::WebSocket { .. } => websocket::serve_command(io, protocol, command, opts, backend).await,
                }
            }
        }
    });
    resp
}

fn command_of(req: CachedRequest) -> (Command, Options) {
    match req {
        CachedRequest::Exec(e) => (
            Command::Exec { container_id: e.container_id, cmd: e.cmd },
            Options { stdin: e.stdin, stdout: e.stdout, stderr: e.stderr, tty: e.tty },
        ),
        CachedRequest::Attach(a) => (
            Command::Attach { container_id: a.container_id },
            Options { stdin: a.stdin, stdout: a.stdout, stderr: a.stderr, tty: a.tty },
        ),
        CachedRequest::PortForward(_) => unreachable!("port forwarding is dispatched before"),
    }
}

/// Ports for a WebSocket port forward: `?port=` (repeatable, or comma-separated), else the CRI request's.
fn ws_ports(query: Option<&str>, requested: &[i32]) -> Result<Vec<u16>, String> {
    let mut ports = Vec::new();
    for (k, v) in url::form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        if k == "port" {
            for p in v.split(',').map(str::trim) {
                match p.parse::<u16>() {
                    Ok(p) if p > 0 => ports.push(p),
                    _ => return Err(format!("invalid port {p:?}")),
                }
            }
        }
    }
    if ports.is_empty() {
        ports = requested.iter().filter_map(|p| u16::try_from(*p).ok()).collect();
    }
    if ports.is_empty() {
        return Err("query parameter \"port\" is required".into());
    }
    if ports.len() > MAX_WS_PORTS {
        return Err(format!("at most {MAX_WS_PORTS} ports can be forwarded over one WebSocket"));
    }
    Ok(ports)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiation_takes_the_clients_first_supported_protocol() {
        let offered = vec!["v5.channel.k8s.io".to_string(), "v3.channel.k8s.io".into(), "v4.channel.k8s.io".into()];
        assert_eq!(negotiate(&offered, remotecommand::SPDY_PROTOCOLS), Some("v3.channel.k8s.io"));
        assert_eq!(negotiate(&[], remotecommand::SPDY_PROTOCOLS), Some(""));
        assert_eq!(negotiate(&["v9".into()], remotecommand::SPDY_PROTOCOLS), None);
    }

    #[test]
    fn websocket_ports_come_from_the_query_or_else_the_request() {
        assert_eq!(ws_ports(Some("port=80&port=443"), &[1]), Ok(vec![80, 443]));
        assert_eq!(ws_ports(None, &[8080]), Ok(vec![8080]));
        assert!(ws_ports(Some("port=0"), &[]).is_err());
        assert!(ws_ports(None, &[]).is_err());
    }
}
