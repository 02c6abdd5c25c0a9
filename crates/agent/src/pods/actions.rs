//! What probes and lifecycle hooks do: run a command in the container (CRI `ExecSync`), an HTTP
//! GET or a TCP connect to the pod, or sleep — each giving an [`Outcome`].

use std::sync::Arc;
use std::time::Duration;

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::endpoint::Endpoint;

/// kubelet's probe user agent.
const USER_AGENT: &str = "kube-probe/1.33";

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
            Action::HttpGet(g.clone())
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
        Action::HttpGet(h) => {
            let port = match port_number(&h.port, &target.ports) {
                Ok(p) => p,
                Err(e) => return Outcome::Failure(e),
            };
            let host = h.host.clone().filter(|h| !h.is_empty()).unwrap_or_else(|| target.pod_ip.clone());
            if h.scheme.as_deref() == Some("HTTPS") {
                return Outcome::Failure("HTTPS probes and hooks are not supported by berth's agent".into());
            }
            let path = h.path.clone().filter(|p| !p.is_empty()).unwrap_or_else(|| "/".into());
            let headers: Vec<(String, String)> =
                h.http_headers.iter().flatten().map(|hh| (hh.name.clone(), hh.value.clone())).collect();
            http_get(&host, port, &path, &headers, timeout).await
        }
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

async fn exec(target: &Target, cmd: &[String], timeout: Duration) -> Outcome {
    let mut client = target.endpoint.runtime.clone();
    let req = cri::ExecSyncRequest {
        container_id: target.container_id.clone(),
        cmd: cmd.to_vec(),
        timeout: i64::try_from(timeout.as_secs().max(1)).unwrap_or(i64::MAX),
    };
    // The runtime enforces the timeout; this bound only guards against a runtime that hangs.
    let call = tokio::time::timeout(timeout + Duration::from_secs(5), client.exec_sync(req));
    match call.await {
        Err(_) => Outcome::Failure(format!("command {:?} timed out", cmd.join(" "))),
        Ok(Err(status)) => {
            Outcome::Failure(format!("rpc error: code = {:?} desc = {}", status.code(), status.message()))
        }
        Ok(Ok(resp)) => {
            let r = resp.into_inner();
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

/// A plain HTTP/1.1 GET: 200–399 is success. Only the status line is read.
pub async fn http_get(host: &str, port: u16, path: &str, headers: &[(String, String)], timeout: Duration) -> Outcome {
    let addr = host_port(host, port);
    let url = format!("http://{addr}{path}");
    let attempt = async {
        let mut stream = tokio::net::TcpStream::connect(&addr)
            .await
            .map_err(|e| format!("Get {url:?}: dial tcp {addr}: {}", connect_error(&e)))?;
        let mut request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n");
        if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("user-agent")) {
            request.push_str(&format!("User-Agent: {USER_AGENT}\r\n"));
        }
        if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("accept")) {
            request.push_str("Accept: */*\r\n");
        }
        for (k, v) in headers {
            request.push_str(&format!("{k}: {v}\r\n"));
        }
        request.push_str("Connection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.map_err(|e| format!("Get {url:?}: {e}"))?;
        let mut buf = Vec::with_capacity(256);
        let mut chunk = [0u8; 256];
        while !buf.windows(2).any(|w| w == b"\r\n") && buf.len() < 4096 {
            let n = stream.read(&mut chunk).await.map_err(|e| format!("Get {url:?}: {e}"))?;
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        let line = String::from_utf8_lossy(&buf);
        let code: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| format!("Get {url:?}: malformed HTTP response"))?;
        Ok::<u16, String>(code)
    };
    match tokio::time::timeout(timeout, attempt).await {
        Err(_) => Outcome::Failure(format!(
            "Get {url:?}: context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
        )),
        Ok(Err(e)) => Outcome::Failure(e),
        Ok(Ok(code)) if (200..400).contains(&code) => Outcome::Success,
        Ok(Ok(code)) => Outcome::Failure(format!("HTTP probe failed with statuscode: {code}")),
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

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

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
        assert_eq!(http_get("127.0.0.1", port, "/healthz", &headers, Duration::from_secs(2)).await, Outcome::Success);
        let req = req.await.unwrap();
        assert!(req.starts_with("GET /healthz HTTP/1.1\r\n"), "{req}");
        assert!(req.contains("User-Agent: kube-probe/1.33\r\n") && req.contains("X-Probe: yes\r\n"), "{req}");
        let (port, _) = serve_once("302 Found").await;
        assert!(http_get("127.0.0.1", port, "/", &[], Duration::from_secs(2)).await.is_success());
    }

    #[tokio::test]
    async fn http_get_fails_on_errors_and_refused_connections_as_kubelet_words_it() {
        let (port, _) = serve_once("500 Internal Server Error").await;
        assert_eq!(
            http_get("127.0.0.1", port, "/", &[], Duration::from_secs(2)).await,
            Outcome::Failure("HTTP probe failed with statuscode: 500".into())
        );
        let closed = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap().port();
        let Outcome::Failure(msg) = http_get("127.0.0.1", closed, "/x", &[], Duration::from_secs(2)).await else {
            panic!("a closed port cannot succeed")
        };
        assert_eq!(
            msg,
            format!("Get \"http://127.0.0.1:{closed}/x\": dial tcp 127.0.0.1:{closed}: connect: connection refused")
        );
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
