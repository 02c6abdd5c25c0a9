//! The HTTP proxy subresources `pods/proxy` and `services/proxy`, as kube-apiserver serves them:
//! `…/pods/{id}/proxy/{path}` forwards the request to the pod, `…/services/{id}/proxy/{path}` to
//! one ready endpoint of the Service, and streams the answer back.
//!
//! `{id}` is `name`, `name:port` or `scheme:name:port` (scheme `http` or `https`). Choosing the
//! target is pure ([`parse_id`], [`pod_destination`], [`service_destination`]); the rest is one
//! HTTP/1.1 exchange on a new connection, with upgrades spliced through.
//!
//! Status answers follow kube-apiserver: `invalid pod request "…"` (400), `address not allowed`
//! (400) for a pod without a usable IP, `no endpoints available for service "…"` (503), and
//! `error trying to reach service: …` (503) when the target cannot be reached. The target's own
//! answers, redirects included, reach the client as they are.

use std::hash::BuildHasher;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::response::{IntoResponse, Response};
use berth_api::resources::{ENDPOINTSLICES, PODS, SERVICES};
use berth_store::ListOptions;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, StatusCode};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use serde_json::Value;

use crate::request::Target;
use crate::{ApiError, ApiResult, ApiState, handlers, objects};

/// How long connecting to a target (TCP and TLS) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The label that ties an EndpointSlice to its Service.
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// Any method on `pods/{id}/proxy[/{*path}]`.
pub async fn pod(
    State(state): State<Arc<ApiState>>,
    Path(params): Path<Vec<(String, String)>>,
    req: Request,
) -> Response {
    serve(state, params, req, Kind::Pod).await
}

/// Any method on `services/{id}/proxy[/{*path}]`.
pub async fn service(
    State(state): State<Arc<ApiState>>,
    Path(params): Path<Vec<(String, String)>>,
    req: Request,
) -> Response {
    serve(state, params, req, Kind::Service).await
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Pod,
    Service,
}

async fn serve(state: Arc<ApiState>, params: Vec<(String, String)>, req: Request, kind: Kind) -> Response {
    let started = Instant::now();
    let verb = verb(req.method());
    let param = |key: &str| params.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str()).unwrap_or_default();
    let (namespace, id) = (param("namespace").to_string(), param("name").to_string());
    // kube-apiserver sends GET and HEAD of `…/proxy` to `…/proxy/`, so relative links resolve.
    if req.uri().path().ends_with("/proxy") && matches!(*req.method(), Method::GET | Method::HEAD) {
        let location = match req.uri().query() {
            Some(q) => format!("{}/?{q}", req.uri().path()),
            None => format!("{}/", req.uri().path()),
        };
        let response = Response::builder()
            .status(StatusCode::MOVED_PERMANENTLY)
            .header(header::LOCATION, location)
            .body(Body::empty())
            .unwrap_or_else(|e| ApiError::internal(e.to_string()).into_response());
        return response;
    }
    let destination = match kind {
        Kind::Pod => locate_pod(&state, &namespace, &id).await,
        Kind::Service => locate_service(&state, &namespace, &id).await,
    };
    let response = match destination {
        Ok(d) => forward(&d, req).await.unwrap_or_else(IntoResponse::into_response),
        Err(e) => e.into_response(),
    };
    let resource = match kind {
        Kind::Pod => "pods/proxy",
        Kind::Service => "services/proxy",
    };
    state.metrics.observe_request(verb, resource, response.status().as_u16(), started.elapsed());
    response
}

/// The verb kube-apiserver authorizes a proxy request as.
fn verb(method: &Method) -> &'static str {
    match *method {
        Method::GET | Method::HEAD => "get",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "",
    }
}

// ---------------------------------------------------------------------------------------------
// Where the request goes

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    Http,
    Https,
}

/// A parsed `{id}`: `name`, `name:port` or `scheme:name:port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyId {
    pub scheme: Scheme,
    pub name: String,
    /// A number, a port name, or empty.
    pub port: String,
}

/// Splits `{id}` as Go's `net.SplitSchemeNamePort`: the name must not be empty and the scheme
/// must be `http`, `https` or absent (http).
pub fn parse_id(id: &str) -> Option<ProxyId> {
    let parts: Vec<&str> = id.split(':').collect();
    let (scheme, name, port) = match parts.as_slice() {
        [name] => ("", *name, ""),
        [name, port] => ("", *name, *port),
        [scheme, name, port] => (*scheme, *name, *port),
        _ => return None,
    };
    let scheme = match scheme {
        "" | "http" => Scheme::Http,
        "https" => Scheme::Https,
        _ => return None,
    };
    (!name.is_empty()).then(|| ProxyId { scheme, name: name.to_string(), port: port.to_string() })
}

/// Where a proxied request is sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Destination {
    pub scheme: Scheme,
    pub host: String,
    /// `None`: the scheme's default port.
    pub port: Option<u16>,
}

impl Destination {
    fn port(&self) -> u16 {
        self.port.unwrap_or(match self.scheme {
            Scheme::Http => 80,
            Scheme::Https => 443,
        })
    }

    /// `host:port`, with IPv6 addresses in brackets.
    pub fn authority(&self) -> String {
        match self.host.parse::<IpAddr>() {
            Ok(IpAddr::V6(ip)) => format!("[{ip}]:{}", self.port()),
            _ => format!("{}:{}", self.host, self.port()),
        }
    }
}

/// Whether the server proxies to `ip`: kube-apiserver's `IsGlobalUnicast` rule (no unspecified,
/// loopback, multicast, link-local or broadcast addresses: nothing on the server's own host nor a
/// cloud metadata endpoint).
pub fn address_allowed(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            !(v4.is_unspecified() || v4.is_loopback() || v4.is_multicast() || v4.is_link_local() || v4.is_broadcast())
        }
        IpAddr::V6(v6) => !(v6.is_unspecified() || v6.is_loopback() || v6.is_multicast() || v6.is_unicast_link_local()),
    }
}

fn as_str<'a>(v: &'a Value, pointer: &str) -> Option<&'a str> {
    v.pointer(pointer).and_then(Value::as_str).filter(|s| !s.is_empty())
}

fn port_number(v: &Value, field: &str) -> Option<u16> {
    v.get(field).and_then(Value::as_u64).and_then(|p| u16::try_from(p).ok()).filter(|p| *p > 0)
}

/// The pod's target: its IP, and the port given by number, by a container's port name, or when
/// empty the first port a container declares (else the scheme's default).
pub fn pod_destination(pod: &Value, id: &ProxyId) -> ApiResult<Destination> {
    let containers: Vec<&Value> = ["/spec/containers", "/spec/initContainers"]
        .iter()
        .filter_map(|p| pod.pointer(p).and_then(Value::as_array))
        .flatten()
        .collect();
    let ports = || containers.iter().filter_map(|c| c.get("ports").and_then(Value::as_array)).flatten();
    let port = if id.port.is_empty() {
        pod.pointer("/spec/containers")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find_map(|c| c.get("ports").and_then(Value::as_array).and_then(|p| p.first()))
            .and_then(|p| port_number(p, "containerPort"))
    } else if let Ok(n) = id.port.parse::<u16>() {
        Some(n)
    } else {
        let named = ports().find(|p| p.get("name").and_then(Value::as_str) == Some(id.port.as_str()));
        let Some(n) = named.and_then(|p| port_number(p, "containerPort")) else {
            return Err(ApiError::unavailable(format!("no port named {:?} found in pod {:?}", id.port, id.name)));
        };
        Some(n)
    };
    let ip = as_str(pod, "/status/podIP").or_else(|| as_str(pod, "/status/podIPs/0/ip"));
    let Some(ip) = ip.and_then(|ip| ip.parse::<IpAddr>().ok()).filter(|ip| address_allowed(*ip)) else {
        return Err(ApiError::bad_request("address not allowed"));
    };
    Ok(Destination { scheme: id.scheme, host: ip.to_string(), port })
}

/// The Service's target: a ready endpoint of its EndpointSlices, on the endpoint port named as
/// the Service port that `id.port` names (a port number is looked up in the Service; empty
/// means the Service's only port). `pick` chooses among the candidates, given their count.
pub fn service_destination(
    service: &Value,
    slices: &[Value],
    raw_id: &str,
    id: &ProxyId,
    pick: impl FnOnce(usize) -> usize,
) -> ApiResult<Destination> {
    let service_ports: Vec<&Value> =
        service.pointer("/spec/ports").and_then(Value::as_array).into_iter().flatten().collect();
    let port_name = |p: &Value| p.get("name").and_then(Value::as_str).unwrap_or_default().to_string();
    let wanted = if let Ok(n) = id.port.parse::<u16>() {
        let Some(p) = service_ports.iter().find(|p| port_number(p, "port") == Some(n)) else {
            return Err(ApiError::unavailable(format!("no service port {n} found for service {:?}", id.name)));
        };
        port_name(p)
    } else if id.port.is_empty() && service_ports.len() == 1 {
        port_name(service_ports[0])
    } else {
        id.port.clone()
    };
    let slices: Vec<&Value> = slices
        .iter()
        .filter(|s| {
            s.pointer("/metadata/labels").and_then(|l| l.get(SERVICE_NAME_LABEL)).and_then(Value::as_str)
                == Some(id.name.as_str())
        })
        .collect();
    let endpoints = |s: &&Value| s.get("endpoints").and_then(Value::as_array).is_some_and(|e| !e.is_empty());
    if !slices.iter().any(endpoints) {
        return Err(ApiError::unavailable(format!("no endpoints available for service {:?}", id.name)));
    }
    let mut candidates = Vec::new();
    for slice in slices {
        let ports = slice.get("ports").and_then(Value::as_array).into_iter().flatten();
        let Some(port) = ports.filter(|p| port_name(p) == wanted).find_map(|p| port_number(p, "port")) else {
            continue;
        };
        for endpoint in slice.get("endpoints").and_then(Value::as_array).into_iter().flatten() {
            // An endpoint without conditions is ready, as the EndpointSlice API defines.
            if endpoint.pointer("/conditions/ready").and_then(Value::as_bool) == Some(false) {
                continue;
            }
            let addresses = endpoint.get("addresses").and_then(Value::as_array).into_iter().flatten();
            for ip in addresses.filter_map(Value::as_str).filter_map(|a| a.parse::<IpAddr>().ok()) {
                if address_allowed(ip) {
                    candidates.push(Destination { scheme: id.scheme, host: ip.to_string(), port: Some(port) });
                }
            }
        }
    }
    if candidates.is_empty() {
        return Err(ApiError::unavailable(format!("no endpoints available for service {raw_id:?}")));
    }
    let chosen = pick(candidates.len()) % candidates.len();
    Ok(candidates.swap_remove(chosen))
}

async fn locate_pod(state: &ApiState, namespace: &str, raw_id: &str) -> ApiResult<Destination> {
    let id = parse_id(raw_id).ok_or_else(|| ApiError::bad_request(format!("invalid pod request {raw_id:?}")))?;
    let t = Target { rt: &PODS, namespace: Some(namespace.into()), name: Some(id.name.clone()), subresource: None };
    let (pod, _) = handlers::load(state, &t, &id.name).await?;
    pod_destination(&pod, &id)
}

async fn locate_service(state: &ApiState, namespace: &str, raw_id: &str) -> ApiResult<Destination> {
    let id = parse_id(raw_id).ok_or_else(|| ApiError::bad_request(format!("invalid service request {raw_id:?}")))?;
    let t = Target { rt: &SERVICES, namespace: Some(namespace.into()), name: Some(id.name.clone()), subresource: None };
    let (service, _) = handlers::load(state, &t, &id.name).await?;
    let prefix = objects::prefix(&ENDPOINTSLICES, Some(namespace));
    let listed = state
        .store
        .list(&prefix, &ListOptions::default())
        .await
        .map_err(|e| ApiError::from_store(e, &ENDPOINTSLICES, ""))?;
    let slices =
        listed.items.iter().map(|kv| objects::decode_kv(&ENDPOINTSLICES, kv)).collect::<ApiResult<Vec<_>>>()?;
    let seed = std::collections::hash_map::RandomState::new().hash_one(Instant::now());
    service_destination(&service, &slices, raw_id, &id, |n| (seed % n as u64) as usize)
}

// ---------------------------------------------------------------------------------------------
// Forwarding

/// The path up to and including `…/{name}/proxy`: what links in proxied answers are put under.
pub fn proxy_prefix(raw_path: &str) -> &str {
    let end = raw_path.splitn(9, '/').take(8).map(|s| s.len() + 1).sum::<usize>().saturating_sub(1);
    &raw_path[..end.min(raw_path.len())]
}

/// Biggest HTML answer whose links are rewritten; bigger ones pass through as they are.
const MAX_REWRITTEN_HTML: usize = 16 << 20;

/// `html` with the absolute paths in its link attributes put under `prefix`, as kube-apiserver
/// rewrites proxied HTML so its links lead back through the proxy.
pub fn rewrite_html(html: &str, prefix: &str) -> String {
    static LINK: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    let link = LINK.get_or_init(|| {
        regex::Regex::new(
            r#"(?i)(\s(?:href|src|action|formaction|cite|background|codebase|data|poster|longdesc|usemap|icon|manifest|profile|classid)\s*=\s*)(["']?)(/[^"'\s>]*)"#,
        )
        .expect("the link pattern compiles")
    });
    link.replace_all(html, |c: &regex::Captures<'_>| {
        // `//host/path` is another host's, not this server's.
        if c[3].starts_with("//") { c[0].to_string() } else { format!("{}{}{prefix}{}", &c[1], &c[2], &c[3]) }
    })
    .into_owned()
}

/// The path after `…/{name}/proxy`, `/` when empty, as the client sent it (still escaped).
pub fn remaining_path(raw_path: &str) -> String {
    // "", "api", "v1", "namespaces", ns, kind, name, "proxy", rest…
    match raw_path.splitn(9, '/').nth(8) {
        Some(rest) => format!("/{rest}"),
        None => "/".to_string(),
    }
}

/// Headers that describe one hop and are not passed on either way (Go's `httputil` list); the
/// client's credentials are for this server only.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// The headers of `from` that go on to the next hop: no hop-by-hop headers, none that
/// `Connection` names, and no `Authorization`; upgrade requests and answers keep
/// `Connection`/`Upgrade`, for the splice.
pub fn end_to_end(from: &HeaderMap, request: bool, upgrading: bool) -> HeaderMap {
    let named: Vec<String> = from
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().to_ascii_lowercase())
        .filter(|t| !t.is_empty() && t != "upgrade")
        .collect();
    let mut out = HeaderMap::new();
    for (k, v) in from {
        let name = k.as_str();
        let upgrade_header = upgrading && (k == header::CONNECTION || k == header::UPGRADE);
        let dropped = HOP_BY_HOP.contains(&name) || named.iter().any(|n| n == name);
        if (dropped && !upgrade_header) || (request && k == header::AUTHORIZATION) {
            continue;
        }
        out.append(k.clone(), v.clone());
    }
    out
}

fn is_upgrade(headers: &HeaderMap) -> bool {
    let connection_upgrade = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    connection_upgrade && headers.contains_key(header::UPGRADE)
}

fn unreachable(cause: impl std::fmt::Display) -> ApiError {
    ApiError::unavailable(format!("error trying to reach service: {cause}"))
}

/// Sends `req` to `to` on a new connection and answers with the target's answer, its body still
/// streaming; a `101` splices the two connections.
async fn forward(to: &Destination, mut req: Request) -> ApiResult<Response> {
    let authority = to.authority();
    let prefix = proxy_prefix(req.uri().path()).to_string();
    let path = remaining_path(req.uri().path());
    let path_and_query = match req.uri().query() {
        Some(q) => format!("{path}?{q}"),
        None => path,
    };
    let upgrading = is_upgrade(req.headers());
    let client_upgrade = upgrading.then(|| hyper::upgrade::on(&mut req));
    let (parts, body) = req.into_parts();
    let mut headers = end_to_end(&parts.headers, true, upgrading);
    if !headers.contains_key(header::HOST) {
        // HTTP/2 clients name the host in the URI; HTTP/1.1 needs the header.
        let host = parts.uri.authority().map_or(authority.clone(), |a| a.to_string());
        headers.insert(header::HOST, HeaderValue::from_str(&host).map_err(|e| ApiError::bad_request(e.to_string()))?);
    }
    let mut request = http::Request::builder().method(parts.method).uri(&path_and_query);
    if let Some(h) = request.headers_mut() {
        *h = headers;
    }
    let request = request.body(body).map_err(|e| ApiError::bad_request(e.to_string()))?;

    let tcp = tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(&authority))
        .await
        .map_err(|_| unreachable(format!("dial tcp {authority}: i/o timeout")))?
        .map_err(|e| unreachable(format!("dial tcp {authority}: connect: {e}")))?;
    let _ = tcp.set_nodelay(true);
    let mut answer = match to.scheme {
        Scheme::Http => exchange(TokioIo::new(tcp), request).await?,
        Scheme::Https => {
            let server_name = match to.host.parse::<IpAddr>() {
                Ok(ip) => ServerName::IpAddress(ip.into()),
                Err(_) => {
                    ServerName::try_from(to.host.clone()).map_err(|e| unreachable(format!("invalid host: {e}")))?
                }
            };
            let tls = tokio::time::timeout(CONNECT_TIMEOUT, crate::proxy::tls_connector().connect(server_name, tcp))
                .await
                .map_err(|_| unreachable("net/http: TLS handshake timeout"))?
                .map_err(|e| unreachable(format!("tls: {e}")))?;
            exchange(TokioIo::new(tls), request).await?
        }
    };

    let switching = answer.status() == StatusCode::SWITCHING_PROTOCOLS;
    let mut response = Response::builder().status(answer.status());
    if let Some(h) = response.headers_mut() {
        *h = end_to_end(answer.headers(), false, switching);
    }
    if let (true, Some(client_upgrade)) = (switching, client_upgrade) {
        let target_upgrade = hyper::upgrade::on(&mut answer);
        tokio::spawn(async move {
            match tokio::try_join!(client_upgrade, target_upgrade) {
                Ok((client, target)) => {
                    let (mut client, mut target) = (TokioIo::new(client), TokioIo::new(target));
                    if let Err(error) = tokio::io::copy_bidirectional(&mut client, &mut target).await {
                        tracing::debug!(%error, "a proxied upgraded stream ended with an error");
                    }
                }
                Err(error) => tracing::debug!(%error, "a proxied upgrade did not complete"),
            }
        });
        return response.body(Body::empty()).map_err(|e| ApiError::internal(e.to_string()));
    }
    let headers = response.headers_mut().expect("the builder has no error yet");
    if let Some(location) = headers.get(header::LOCATION).and_then(|l| l.to_str().ok())
        && location.starts_with('/')
        && !location.starts_with("//")
        && let Ok(under) = HeaderValue::from_str(&format!("{prefix}{location}"))
    {
        headers.insert(header::LOCATION, under);
    }
    let html = headers
        .get(header::CONTENT_TYPE)
        .and_then(|t| t.to_str().ok())
        .is_some_and(|t| t.trim_start().to_ascii_lowercase().starts_with("text/html"));
    let encoded = headers.contains_key(header::CONTENT_ENCODING);
    let small = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|l| l.to_str().ok()?.parse::<usize>().ok())
        .is_none_or(|l| l <= MAX_REWRITTEN_HTML);
    if html && !encoded && small {
        let body =
            http_body_util::BodyExt::collect(http_body_util::Limited::new(answer.into_body(), MAX_REWRITTEN_HTML))
                .await
                .map_err(|e| unreachable(format!("reading the answer: {e}")))?
                .to_bytes();
        let text = String::from_utf8_lossy(&body);
        let rewritten = rewrite_html(&text, &prefix);
        headers.remove(header::CONTENT_LENGTH);
        return response.body(Body::from(rewritten)).map_err(|e| ApiError::internal(e.to_string()));
    }
    response.body(Body::new(answer.into_body())).map_err(|e| ApiError::internal(e.to_string()))
}

/// One HTTP/1.1 request on `io`; the connection lives until the answer's body is read (or an
/// upgrade ends).
async fn exchange<I>(io: I, request: http::Request<Body>) -> ApiResult<http::Response<hyper::body::Incoming>>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io).await.map_err(unreachable)?;
    tokio::spawn(async move {
        if let Err(error) = connection.with_upgrades().await {
            tracing::debug!(%error, "a proxied connection ended with an error");
        }
    });
    sender.send_request(request).await.map_err(unreachable)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn id(s: &str) -> ProxyId {
        parse_id(s).unwrap()
    }

    #[test]
    fn ids_are_name_name_port_or_scheme_name_port() {
        assert_eq!(id("web"), ProxyId { scheme: Scheme::Http, name: "web".into(), port: "".into() });
        assert_eq!(id("web:8080"), ProxyId { scheme: Scheme::Http, name: "web".into(), port: "8080".into() });
        assert_eq!(
            id("https:proxy-service-x:tlsportname1"),
            ProxyId { scheme: Scheme::Https, name: "proxy-service-x".into(), port: "tlsportname1".into() }
        );
        assert_eq!(id("http:web:"), ProxyId { scheme: Scheme::Http, name: "web".into(), port: "".into() });
        for bad in ["", ":80", "ftp:web:21", "a:b:c:d", "https::443"] {
            assert_eq!(parse_id(bad), None, "{bad}");
        }
    }

    fn pod(ip: Option<&str>) -> Value {
        let mut p = json!({"spec": {"containers": [
            {"name": "sidecar"},
            {"name": "app", "ports": [{"name": "http", "containerPort": 8080}, {"name": "metrics", "containerPort": 9090}]},
        ]}});
        if let Some(ip) = ip {
            p["status"] = json!({"podIP": ip});
        }
        p
    }

    #[test]
    fn a_pod_is_reached_at_its_ip_on_a_numbered_named_or_first_declared_port() {
        let at = |port: Option<u16>| Destination { scheme: Scheme::Http, host: "10.1.0.5".into(), port };
        let p = pod(Some("10.1.0.5"));
        assert_eq!(pod_destination(&p, &id("web:81")).unwrap(), at(Some(81)));
        assert_eq!(pod_destination(&p, &id("web:metrics")).unwrap(), at(Some(9090)));
        assert_eq!(pod_destination(&p, &id("web")).unwrap(), at(Some(8080)));
        let bare = json!({"spec": {"containers": [{"name": "c"}]}, "status": {"podIP": "10.1.0.5"}});
        let https = pod_destination(&bare, &id("https:web:")).unwrap();
        assert_eq!((https.scheme, https.authority()), (Scheme::Https, "10.1.0.5:443".to_string()));
        assert_eq!(pod_destination(&bare, &id("web")).unwrap().authority(), "10.1.0.5:80");
        let err = pod_destination(&p, &id("web:nope")).unwrap_err();
        assert_eq!((err.code, err.message.as_str()), (503, "no port named \"nope\" found in pod \"web\""));
    }

    #[test]
    fn a_pod_without_a_usable_address_is_not_proxied() {
        let refused = ["0.0.0.0", "127.0.0.1", "::1", "169.254.169.254", "224.0.0.1", "fe80::1", "x"];
        for ip in std::iter::once(None).chain(refused.map(Some)) {
            let err = pod_destination(&pod(ip), &id("web:80")).unwrap_err();
            assert_eq!((err.code, err.message.as_str()), (400, "address not allowed"), "{ip:?}");
        }
        let v6 = pod_destination(&pod(Some("fd00::5")), &id("web:80")).unwrap();
        assert_eq!(v6.authority(), "[fd00::5]:80");
    }

    fn service(ports: Value) -> Value {
        json!({"metadata": {"name": "svc"}, "spec": {"ports": ports}})
    }

    fn slice(service: &str, ports: Value, endpoints: Value) -> Value {
        json!({
            "metadata": {"labels": {"kubernetes.io/service-name": service}},
            "addressType": "IPv4",
            "ports": ports,
            "endpoints": endpoints,
        })
    }

    #[test]
    fn a_service_is_reached_at_a_ready_endpoint_on_the_port_named_like_the_service_port() {
        let svc = service(json!([{"name": "http", "port": 80}, {"name": "admin", "port": 81}]));
        let slices = [
            slice("other", json!([{"name": "http", "port": 1}]), json!([{"addresses": ["10.0.0.9"]}])),
            slice(
                "svc",
                json!([{"name": "http", "port": 8080}, {"name": "admin", "port": 8081}]),
                json!([
                    {"addresses": ["10.0.0.1"], "conditions": {"ready": false}},
                    {"addresses": ["10.0.0.2"], "conditions": {"ready": true}},
                    {"addresses": ["10.0.0.3"]},
                ]),
            ),
        ];
        let at = |host: &str, port| Destination { scheme: Scheme::Http, host: host.into(), port: Some(port) };
        let first = |_: usize| 0;
        let count = |expected: usize| {
            move |n: usize| {
                assert_eq!(n, expected);
                1
            }
        };
        assert_eq!(
            service_destination(&svc, &slices, "svc:http", &id("svc:http"), first).unwrap(),
            at("10.0.0.2", 8080)
        );
        assert_eq!(
            service_destination(&svc, &slices, "svc:81", &id("svc:81"), count(2)).unwrap(),
            at("10.0.0.3", 8081)
        );
        let err = service_destination(&svc, &slices, "svc:82", &id("svc:82"), first).unwrap_err();
        assert_eq!((err.code, err.message.as_str()), (503, "no service port 82 found for service \"svc\""));
        let err = service_destination(&svc, &slices, "svc:nope", &id("svc:nope"), first).unwrap_err();
        assert_eq!((err.code, err.message.as_str()), (503, "no endpoints available for service \"svc:nope\""));
    }

    #[test]
    fn a_service_with_one_port_needs_none_named_and_one_without_endpoints_is_unavailable() {
        let svc = service(json!([{"port": 80}]));
        let slices = [slice("svc", json!([{"port": 8080}]), json!([{"addresses": ["10.0.0.2"]}]))];
        let d = service_destination(&svc, &slices, "https:svc:", &id("https:svc:"), |_| 0).unwrap();
        assert_eq!((d.scheme, d.authority()), (Scheme::Https, "10.0.0.2:8080".to_string()));
        let empty = [slice("svc", json!([{"port": 8080}]), json!([]))];
        let err = service_destination(&svc, &empty, "svc:80", &id("svc:80"), |_| 0).unwrap_err();
        assert_eq!((err.code, err.message.as_str()), (503, "no endpoints available for service \"svc\""));
    }

    #[test]
    fn links_in_proxied_html_are_put_under_the_proxy_path() {
        let prefix = proxy_prefix("/api/v1/namespaces/ns/pods/http:web:1080/proxy/some/page");
        assert_eq!(prefix, "/api/v1/namespaces/ns/pods/http:web:1080/proxy");
        assert_eq!(
            proxy_prefix("/api/v1/namespaces/ns/services/web/proxy"),
            "/api/v1/namespaces/ns/services/web/proxy"
        );
        let html = r#"<a href="/rewriteme">test</a> <img src='/i.png'> <a href="//cdn/x">x</a> <a href="rel">r</a>"#;
        assert_eq!(
            rewrite_html(html, "/p"),
            r#"<a href="/p/rewriteme">test</a> <img src='/p/i.png'> <a href="//cdn/x">x</a> <a href="rel">r</a>"#
        );
    }

    #[test]
    fn the_remaining_path_keeps_its_escapes_and_defaults_to_the_root() {
        assert_eq!(remaining_path("/api/v1/namespaces/ns/pods/web:80/proxy"), "/");
        assert_eq!(remaining_path("/api/v1/namespaces/ns/pods/web:80/proxy/"), "/");
        assert_eq!(remaining_path("/api/v1/namespaces/ns/services/s/proxy/a/b%2Fc/"), "/a/b%2Fc/");
    }

    #[test]
    fn hop_by_hop_headers_and_credentials_stay_behind() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("authorization", "Bearer secret"),
            ("connection", "keep-alive, x-hop"),
            ("x-hop", "1"),
            ("keep-alive", "timeout=5"),
            ("transfer-encoding", "chunked"),
            ("x-end", "2"),
            ("content-type", "text/plain"),
        ] {
            h.append(k, HeaderValue::from_static(v));
        }
        let names = |m: HeaderMap| {
            let mut n: Vec<String> = m.keys().map(|k| k.to_string()).collect();
            n.sort();
            n
        };
        assert_eq!(names(end_to_end(&h, true, false)), ["content-type", "x-end"]);
        assert_eq!(names(end_to_end(&h, false, false)), ["authorization", "content-type", "x-end"]);
        h.insert("connection", HeaderValue::from_static("Upgrade"));
        h.insert("upgrade", HeaderValue::from_static("websocket"));
        assert!(is_upgrade(&h));
        assert_eq!(names(end_to_end(&h, true, true)), ["connection", "content-type", "upgrade", "x-end", "x-hop"]);
    }

    #[test]
    fn proxy_requests_are_served_with_the_verbs_kubernetes_authorizes() {
        let verbs: Vec<&str> =
            [Method::GET, Method::HEAD, Method::POST, Method::PUT, Method::PATCH, Method::DELETE, Method::OPTIONS]
                .iter()
                .map(verb)
                .collect();
        assert_eq!(verbs, ["get", "get", "create", "update", "patch", "delete", ""]);
    }
}
