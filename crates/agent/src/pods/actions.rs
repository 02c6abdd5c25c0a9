//! What probes and lifecycle hooks do: run a command in the container (CRI `ExecSync`), an HTTP
//! or HTTPS GET or a TCP connect to the pod, or sleep — each giving an [`Outcome`].

use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use berth_common::tls::AnyServerCertificate;
use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

use crate::endpoint::Endpoint;

/// kubelet's user agents for probes and for lifecycle hooks.
const PROBE_USER_AGENT: &str = "kube-probe/1.33";
const HOOK_USER_AGENT: &str = "kube-lifecycle/1.33";

/// The result of one action: success, or failure with what went wrong (kubelet's wording).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Success,
    Failure(String),
}

impl Outcome {
    pub fn is_success(&self) -> bool {
        matches!(self, Outcome::Success)
    }
}

/// Where actions of one container go.
#[derive(Clone, Debug)]
pub struct Target {
    pub endpoint: Arc<Endpoint>,
    pub container_id: String,
    pub pod_ip: String,
    pub ports: Vec<core::ContainerPort>,
}

/// One thing to do, as found in a probe or a lifecycle handler.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    Exec(Vec<String>),
    HttpGet(core::HTTPGetAction),
    /// A lifecycle hook's GET: any response is success (see [`HttpRules::Hook`]).
    HttpHook(core::HTTPGetAction),
    Tcp(core::TCPSocketAction),
    Sleep(i64),
    /// gRPC probes and anything newer.
    Unsupported(&'static str),
}

impl Action {
    pub fn of_probe(p: &core::Probe) -> Action {
        if let Some(e) = &p.exec {
            Action::Exec(e.command.clone().unwrap_or_default())
        } else if let Some(h) = &p.http_get {
            Action::HttpGet(h.clone())
        } else if let Some(t) = &p.tcp_socket {
            Action::Tcp(t.clone())
        } else if p.grpc.is_some() {
            Action::Unsupported("grpc")
        } else {
            Action::Unsupported("empty")
        }
    }

    pub fn of_handler(h: &core::LifecycleHandler) -> Action {
        if let Some(e) = &h.exec {
            Action::Exec(e.command.clone().unwrap_or_default())
        } else if let Some(g) = &h.http_get {
            Action::HttpHook(g.clone())
        } else if let Some(t) = &h.tcp_socket {
            Action::Tcp(t.clone())
        } else if let Some(s) = &h.sleep {
            Action::Sleep(s.seconds)
        } else {
            Action::Unsupported("empty")
        }
    }
}

/// A named port resolved through the container's ports.
fn port_number(port: &IntOrString, ports: &[core::ContainerPort]) -> Result<u16, String> {
    match port {
        IntOrString::Int(n) => u16::try_from(*n).map_err(|_| format!("invalid port number: {n}")),
        IntOrString::String(name) => match name.parse::<u16>() {
            Ok(n) => Ok(n),
            Err(_) => ports
                .iter()
                .find(|p| p.name.as_deref() == Some(name.as_str()))
                .and_then(|p| u16::try_from(p.container_port).ok())
                .ok_or_else(|| format!("couldn't find port: {name}")),
        },
    }
}

fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") }
}

/// Runs `action` against `target`, giving up after `timeout`.
pub async fn run(action: &Action, target: &Target, timeout: Duration) -> Outcome {
    match action {
        Action::Exec(cmd) => exec(target, cmd, timeout).await,
        Action::HttpGet(h) => http_action(h, target, HttpRules::Probe, timeout).await,
        Action::HttpHook(h) => http_action(h, target, HttpRules::Hook, timeout).await,
        Action::Tcp(t) => {
            let port = match port_number(&t.port, &target.ports) {
                Ok(p) => p,
                Err(e) => return Outcome::Failure(e),
            };
            let host = t.host.clone().filter(|h| !h.is_empty()).unwrap_or_else(|| target.pod_ip.clone());
            tcp(&host, port, timeout).await
        }
        Action::Sleep(secs) => {
            tokio::time::sleep(Duration::from_secs(u64::try_from(*secs).unwrap_or(0)).min(timeout)).await;
            Outcome::Success
        }
        Action::Unsupported(kind) => Outcome::Failure(format!("{kind} actions are not supported by berth's agent")),
    }
}

async fn http_action(h: &core::HTTPGetAction, target: &Target, rules: HttpRules, timeout: Duration) -> Outcome {
    let port = match port_number(&h.port, &target.ports) {
        Ok(p) => p,
        Err(e) => return Outcome::Failure(e),
    };
    let host = h.host.clone().filter(|h| !h.is_empty()).unwrap_or_else(|| target.pod_ip.clone());
    // The API server admits only HTTP and HTTPS, and defaults to HTTP.
    let scheme = if h.scheme.as_deref() == Some("HTTPS") { Scheme::Https } else { Scheme::Http };
    let path = h.path.clone().filter(|p| !p.is_empty()).unwrap_or_else(|| "/".into());
    let headers: Vec<(String, String)> =
        h.http_headers.iter().flatten().map(|hh| (hh.name.clone(), hh.value.clone())).collect();
    http_get(rules, scheme, &host, port, &path, &headers, timeout).await
}

async fn exec(target: &Target, cmd: &[String], timeout: Duration) -> Outcome {
    let req = cri::ExecSyncRequest {
        container_id: target.container_id.clone(),
        cmd: cmd.to_vec(),
        timeout: i64::try_from(timeout.as_secs().max(1)).unwrap_or(i64::MAX),
    };
    // The runtime enforces the timeout; this bound only guards against a runtime that hangs.
    let call = tokio::time::timeout(timeout + Duration::from_secs(5), target.endpoint.cri.exec_sync(req));
    match call.await {
        Err(_) => Outcome::Failure(format!("command {:?} timed out", cmd.join(" "))),
        Ok(Err(status)) => {
            Outcome::Failure(format!("rpc error: code = {:?} desc = {}", status.code(), status.message()))
        }
        Ok(Ok(r)) => {
            if r.exit_code == 0 {
                Outcome::Success
            } else {
                let mut out = String::from_utf8_lossy(&r.stdout).into_owned();
                out.push_str(&String::from_utf8_lossy(&r.stderr));
                if out.trim().is_empty() {
                    Outcome::Failure(format!("command {:?} exited with {}", cmd.join(" "), r.exit_code))
                } else {
                    Outcome::Failure(out)
                }
            }
        }
    }
}

/// How an HTTP action reaches its target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    Http,
    /// TLS without verifying the certificate, as kubelet's prober does (`InsecureSkipVerify`).
    Https,
}

/// What an HTTP action's response means, as kubelet has it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HttpRules {
    /// A probe: 200–399 is success.
    Probe,
    /// A lifecycle hook: any response is success, only failing to get one is a failure; an HTTPS
    /// hook whose server answers in plain HTTP is sent again over HTTP without `Authorization`.
    Hook,
}

/// An HTTP/1.1 GET by `rules`, over TLS for [`Scheme::Https`]. Only the status line is read.
pub async fn http_get(
    rules: HttpRules,
    scheme: Scheme,
    host: &str,
    port: u16,
    path: &str,
    headers: &[(String, String)],
    timeout: Duration,
) -> Outcome {
    let user_agent = if rules == HttpRules::Hook { HOOK_USER_AGENT } else { PROBE_USER_AGENT };
    let deadline = tokio::time::Instant::now() + timeout;
    let mut result = get_status(scheme, host, port, path, headers, user_agent, deadline).await;
    if rules == HttpRules::Hook
        && scheme == Scheme::Https
        && matches!(&result, Err(e) if e.ends_with(PLAIN_HTTP_ANSWER))
    {
        let headers: Vec<_> =
            headers.iter().filter(|(k, _)| !k.eq_ignore_ascii_case("authorization")).cloned().collect();
        result = get_status(Scheme::Http, host, port, path, &headers, user_agent, deadline).await;
    }
    match result {
        Err(e) => Outcome::Failure(e),
        Ok(_) if rules == HttpRules::Hook => Outcome::Success,
        Ok(code) if (200..400).contains(&code) => Outcome::Success,
        Ok(code) => Outcome::Failure(format!("HTTP probe failed with statuscode: {code}")),
    }
}

/// Go's error for a TLS handshake answered in plain HTTP.
const PLAIN_HTTP_ANSWER: &str = "http: server gave HTTP response to HTTPS client";

/// The status code of one GET, or the failure in Go's words.
async fn get_status(
    scheme: Scheme,
    host: &str,
    port: u16,
    path: &str,
    headers: &[(String, String)],
    user_agent: &str,
    deadline: tokio::time::Instant,
) -> Result<u16, String> {
    let addr = host_port(host, port);
    let url = match scheme {
        Scheme::Http => format!("http://{addr}{path}"),
        Scheme::Https => format!("https://{addr}{path}"),
    };
    let attempt = async {
        let tcp = tokio::net::TcpStream::connect(&addr)
            .await
            .map_err(|e| format!("Get {url:?}: dial tcp {addr}: {}", connect_error(&e)))?;
        let request = get_request(&addr, path, headers, user_agent);
        match scheme {
            Scheme::Http => status_code(tcp, &request).await,
            Scheme::Https => {
                let mut recorded = RecordsFirstBytes::new(tcp);
                match tls_connector().connect(server_name(host)?, &mut recorded).await {
                    Ok(tls) => status_code(tls, &request).await,
                    Err(e) => Err(tls_error(&e, recorded.first())),
                }
            }
        }
        .map_err(|e| format!("Get {url:?}: {e}"))
    };
    match tokio::time::timeout_at(deadline, attempt).await {
        Err(_) => {
            Err(format!("Get {url:?}: context deadline exceeded (Client.Timeout exceeded while awaiting headers)"))
        }
        Ok(r) => r,
    }
}

fn get_request(addr: &str, path: &str, headers: &[(String, String)], user_agent: &str) -> String {
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("user-agent")) {
        request.push_str(&format!("User-Agent: {user_agent}\r\n"));
    }
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("accept")) {
        request.push_str("Accept: */*\r\n");
    }
    for (k, v) in headers {
        request.push_str(&format!("{k}: {v}\r\n"));
    }
    request.push_str("Connection: close\r\n\r\n");
    request
}

/// Sends `request` and reads the response's status code; the same for plain and TLS streams.
async fn status_code(mut stream: impl AsyncRead + AsyncWrite + Unpin, request: &str) -> Result<u16, String> {
    stream.write_all(request.as_bytes()).await.map_err(|e| e.to_string())?;
    let mut buf = Vec::with_capacity(256);
    let mut chunk = [0u8; 256];
    while !buf.windows(2).any(|w| w == b"\r\n") && buf.len() < 4096 {
        let n = stream.read(&mut chunk).await.map_err(|e| e.to_string())?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let line = String::from_utf8_lossy(&buf);
    line.split_whitespace().nth(1).and_then(|c| c.parse().ok()).ok_or_else(|| "malformed HTTP response".into())
}

/// The TLS server name: an IP address (sent without SNI) or a DNS name.
fn server_name(host: &str) -> Result<ServerName<'static>, String> {
    match host.parse::<IpAddr>() {
        Ok(ip) => Ok(ServerName::IpAddress(ip.into())),
        Err(_) => ServerName::try_from(host.to_string()).map_err(|e| format!("invalid host {host:?}: {e}")),
    }
}

/// A failed handshake in Go's words, since kubelet's messages carry them.
fn tls_error(e: &io::Error, first_bytes: &[u8]) -> String {
    match e.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()) {
        Some(rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType)) => {
            if first_bytes == b"HTTP/" {
                PLAIN_HTTP_ANSWER.into()
            } else {
                "tls: first record does not look like a TLS handshake".into()
            }
        }
        Some(rustls::Error::AlertReceived(alert)) => format!("remote error: tls: {}", words(&format!("{alert:?}"))),
        Some(other) => format!("tls: {other}"),
        None if e.kind() == io::ErrorKind::UnexpectedEof => "EOF".into(),
        None => e.to_string(),
    }
}

/// `HandshakeFailure` → `handshake failure`.
fn words(camel: &str) -> String {
    let mut out = String::with_capacity(camel.len() + 4);
    for (i, c) in camel.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push(' ');
        }
        out.push(c.to_ascii_lowercase());
    }
    out
}

fn tls_connector() -> tokio_rustls::TlsConnector {
    static CONFIG: OnceLock<Arc<rustls::ClientConfig>> = OnceLock::new();
    let config = CONFIG.get_or_init(|| {
        // The provider the agent's own TLS server uses (`http::tls`).
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .expect("ring supports the default protocol versions")
            .dangerous()
            // Any certificate, as kubelet probes with `InsecureSkipVerify`.
            .with_custom_certificate_verifier(Arc::new(AnyServerCertificate::new(provider)))
            .with_no_client_auth();
        // No ALPN, like kubelet's prober transport: the target picks HTTP/1.1.
        Arc::new(config)
    });
    tokio_rustls::TlsConnector::from(config.clone())
}

/// A stream that keeps the first five bytes the peer sent, so a plain HTTP answer to a TLS
/// handshake can be told apart from other garbage, as Go's HTTP client does.
struct RecordsFirstBytes<S> {
    inner: S,
    first: [u8; 5],
    len: usize,
}

impl<S> RecordsFirstBytes<S> {
    fn new(inner: S) -> Self {
        RecordsFirstBytes { inner, first: [0; 5], len: 0 }
    }

    fn first(&self) -> &[u8] {
        &self.first[..self.len]
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for RecordsFirstBytes<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let poll = Pin::new(&mut this.inner).poll_read(cx, buf);
        let read = &buf.filled()[before..];
        let take = read.len().min(this.first.len() - this.len);
        this.first[this.len..this.len + take].copy_from_slice(&read[..take]);
        this.len += take;
        poll
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for RecordsFirstBytes<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

fn connect_error(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::ConnectionRefused => "connect: connection refused".into(),
        _ => format!("connect: {e}"),
    }
}

pub async fn tcp(host: &str, port: u16, timeout: Duration) -> Outcome {
    let addr = host_port(host, port);
    match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(&addr)).await {
        Ok(Ok(_)) => Outcome::Success,
        Ok(Err(e)) => Outcome::Failure(format!("dial tcp {addr}: {}", connect_error(&e))),
        Err(_) => Outcome::Failure(format!("dial tcp {addr}: i/o timeout")),
    }
}

/// kubelet's message for a failed lifecycle hook.
pub fn hook_failure(action: &Action, container: &str, pod: &str, message: &str) -> String {
    match action {
        Action::Exec(cmd) => format!(
            "Exec lifecycle hook ({cmd:?}) for Container {container:?} in Pod {pod:?} failed - error: {message}"
        ),
        Action::HttpGet(h) | Action::HttpHook(h) => format!(
            "HTTP lifecycle hook ({}) for Container {container:?} in Pod {pod:?} failed - error: {message}",
            h.path.clone().unwrap_or_default()
        ),
        _ => format!("Lifecycle hook for Container {container:?} in Pod {pod:?} failed - error: {message}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    #[tokio::test]
    async fn a_hook_get_succeeds_on_any_response_and_says_it_is_kubelets_lifecycle() {
        let (port, req) = serve_once("500 Internal Server Error").await;
        let outcome =
            http_get(HttpRules::Hook, Scheme::Http, "127.0.0.1", port, "/stop", &[], Duration::from_secs(2)).await;
        assert_eq!(outcome, Outcome::Success);
        assert!(req.await.unwrap().contains("User-Agent: kube-lifecycle/1.33\r\n"));
        let closed = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap().port();
        let outcome =
            http_get(HttpRules::Hook, Scheme::Http, "127.0.0.1", closed, "/", &[], Duration::from_secs(2)).await;
        assert!(!outcome.is_success(), "no response at all is still a failure");
    }

    #[tokio::test]
    async fn an_https_hook_answered_in_plain_http_is_sent_again_over_http_without_authorization() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let second = tokio::spawn(async move {
            let mut requests = Vec::new();
            for _ in 0..2 {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut buf = vec![0u8; 4096];
                let n = s.read(&mut buf).await.unwrap();
                s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n").await.unwrap();
                requests.push(buf[..n].to_vec());
            }
            String::from_utf8_lossy(&requests[1]).into_owned()
        });
        let headers = vec![("Authorization".to_string(), "Bearer x".to_string()), ("X-A".to_string(), "b".to_string())];
        let outcome =
            http_get(HttpRules::Hook, Scheme::Https, "127.0.0.1", port, "/h", &headers, Duration::from_secs(5)).await;
        assert_eq!(outcome, Outcome::Success);
        let plain = second.await.unwrap();
        assert!(plain.starts_with("GET /h HTTP/1.1\r\n") && plain.contains("X-A: b\r\n"), "{plain}");
        assert!(!plain.contains("Authorization"), "{plain}");
    }

    async fn serve_once(status: &'static str) -> (u16, tokio::task::JoinHandle<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 1024];
            let n = s.read(&mut buf).await.unwrap();
            s.write_all(format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n").as_bytes()).await.unwrap();
            String::from_utf8_lossy(&buf[..n]).into_owned()
        });
        (port, task)
    }

    #[tokio::test]
    async fn http_get_succeeds_on_2xx_and_3xx_and_sends_kubelets_headers() {
        let (port, req) = serve_once("204 No Content").await;
        let headers = vec![("X-Probe".to_string(), "yes".to_string())];
        assert_eq!(
            http_get(HttpRules::Probe, Scheme::Http, "127.0.0.1", port, "/healthz", &headers, Duration::from_secs(2))
                .await,
            Outcome::Success
        );
        let req = req.await.unwrap();
        assert!(req.starts_with("GET /healthz HTTP/1.1\r\n"), "{req}");
        assert!(req.contains("User-Agent: kube-probe/1.33\r\n") && req.contains("X-Probe: yes\r\n"), "{req}");
        let (port, _) = serve_once("302 Found").await;
        assert!(
            http_get(HttpRules::Probe, Scheme::Http, "127.0.0.1", port, "/", &[], Duration::from_secs(2))
                .await
                .is_success()
        );
    }

    #[tokio::test]
    async fn http_get_fails_on_errors_and_refused_connections_as_kubelet_words_it() {
        let (port, _) = serve_once("500 Internal Server Error").await;
        assert_eq!(
            http_get(HttpRules::Probe, Scheme::Http, "127.0.0.1", port, "/", &[], Duration::from_secs(2)).await,
            Outcome::Failure("HTTP probe failed with statuscode: 500".into())
        );
        let closed = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap().port();
        let Outcome::Failure(msg) =
            http_get(HttpRules::Probe, Scheme::Http, "127.0.0.1", closed, "/x", &[], Duration::from_secs(2)).await
        else {
            panic!("a closed port cannot succeed")
        };
        assert_eq!(
            msg,
            format!("Get \"http://127.0.0.1:{closed}/x\": dial tcp 127.0.0.1:{closed}: connect: connection refused")
        );
    }

    /// A TLS server with a fresh self-signed certificate for `localhost` that answers one GET
    /// with `status`, giving back the request and the SNI name the client sent.
    async fn serve_tls_once(status: &'static str) -> (u16, tokio::task::JoinHandle<(String, Option<String>)>) {
        let rcgen::CertifiedKey { cert, signing_key } =
            rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(signing_key.serialize_der().into());
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert.der().clone()], key)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            let mut tls = acceptor.accept(tcp).await.unwrap();
            let sni = tls.get_ref().1.server_name().map(str::to_string);
            let mut buf = vec![0u8; 1024];
            let n = tls.read(&mut buf).await.unwrap();
            tls.write_all(format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n").as_bytes()).await.unwrap();
            tls.shutdown().await.unwrap();
            (String::from_utf8_lossy(&buf[..n]).into_owned(), sni)
        });
        (port, task)
    }

    #[tokio::test]
    async fn an_https_get_to_a_self_signed_server_succeeds_on_200_with_the_same_request_as_http() {
        let (port, served) = serve_tls_once("200 OK").await;
        let headers = vec![("X-Probe".to_string(), "yes".to_string())];
        let outcome =
            http_get(HttpRules::Probe, Scheme::Https, "127.0.0.1", port, "/healthz", &headers, Duration::from_secs(5))
                .await;
        assert_eq!(outcome, Outcome::Success);
        let (req, sni) = served.await.unwrap();
        assert_eq!(
            req,
            format!(
                "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUser-Agent: kube-probe/1.33\r\nAccept: */*\r\n\
                 X-Probe: yes\r\nConnection: close\r\n\r\n"
            )
        );
        assert_eq!(sni, None, "an IP address is not sent as SNI");
    }

    #[tokio::test]
    async fn an_https_get_to_a_dns_name_sends_it_as_sni() {
        let (port, served) = serve_tls_once("301 Moved Permanently").await;
        assert!(
            http_get(HttpRules::Probe, Scheme::Https, "localhost", port, "/", &[], Duration::from_secs(5))
                .await
                .is_success()
        );
        assert_eq!(served.await.unwrap().1.as_deref(), Some("localhost"));
    }

    #[tokio::test]
    async fn an_https_get_answered_500_fails_with_kubelets_message() {
        let (port, _) = serve_tls_once("500 Internal Server Error").await;
        assert_eq!(
            http_get(HttpRules::Probe, Scheme::Https, "127.0.0.1", port, "/", &[], Duration::from_secs(5)).await,
            Outcome::Failure("HTTP probe failed with statuscode: 500".into())
        );
    }

    #[tokio::test]
    async fn an_https_get_to_a_plain_http_server_fails_at_once_naming_the_https_url() {
        let (port, _) = serve_once("400 Bad Request").await;
        let started = std::time::Instant::now();
        let outcome =
            http_get(HttpRules::Probe, Scheme::Https, "127.0.0.1", port, "/ready", &[], Duration::from_secs(10)).await;
        assert_eq!(
            outcome,
            Outcome::Failure(format!(
                "Get \"https://127.0.0.1:{port}/ready\": http: server gave HTTP response to HTTPS client"
            ))
        );
        assert!(started.elapsed() < Duration::from_secs(5), "the failure must not wait for the timeout");
    }

    #[tokio::test]
    async fn an_https_get_to_a_server_that_closes_at_once_fails_with_go_eof() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        // Reads the ClientHello first: closing with it unread would reset the connection instead.
        tokio::spawn(async move {
            let (mut tcp, _) = listener.accept().await.unwrap();
            let _ = tcp.read(&mut [0u8; 4096]).await;
        });
        assert_eq!(
            http_get(HttpRules::Probe, Scheme::Https, "127.0.0.1", port, "/", &[], Duration::from_secs(5)).await,
            Outcome::Failure(format!("Get \"https://127.0.0.1:{port}/\": EOF"))
        );
    }

    #[tokio::test]
    async fn an_https_action_in_a_probe_reaches_the_pod_over_tls() {
        let (port, served) = serve_tls_once("204 No Content").await;
        let action = Action::HttpGet(core::HTTPGetAction {
            scheme: Some("HTTPS".into()),
            port: IntOrString::String("https".into()),
            path: Some("/live".into()),
            ..Default::default()
        });
        let target = Target {
            endpoint: Arc::new(Endpoint::connect_lazy("container", "unused", "unix:///nonexistent.sock", "").unwrap()),
            container_id: "c".into(),
            pod_ip: "127.0.0.1".into(),
            ports: vec![core::ContainerPort {
                name: Some("https".into()),
                container_port: i32::from(port),
                ..Default::default()
            }],
        };
        assert_eq!(run(&action, &target, Duration::from_secs(5)).await, Outcome::Success);
        assert!(served.await.unwrap().0.starts_with("GET /live HTTP/1.1\r\n"));
    }

    #[tokio::test]
    async fn tcp_checks_connect_and_named_ports_resolve() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        assert!(tcp("127.0.0.1", port, Duration::from_secs(2)).await.is_success());
        drop(listener);
        assert!(!tcp("127.0.0.1", port, Duration::from_secs(2)).await.is_success());
        let ports = vec![core::ContainerPort { name: Some("http".into()), container_port: 8080, ..Default::default() }];
        assert_eq!(port_number(&IntOrString::String("http".into()), &ports), Ok(8080));
        assert_eq!(port_number(&IntOrString::Int(81), &ports), Ok(81));
        assert_eq!(port_number(&IntOrString::String("nope".into()), &ports), Err("couldn't find port: nope".into()));
    }
}
