//! The client side of the streaming protocols, as crictl and kubectl speak them to the URL a
//! runtime's Exec, Attach or PortForward RPC returns: exec and attach sessions over WebSocket
//! (`v5.channel.k8s.io`, else `v4`), and port forwarding over SPDY/3.1 (`portforward.k8s.io`),
//! where one connection — one single-use URL — carries any number of forwarded TCP connections.

mod command;
mod port_forward;
mod spdy;

#[cfg(test)]
mod tests;

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

use crate::mux::ChannelReader;

pub use command::{CommandIo, run_command};
pub use port_forward::{ForwardEvent, PortForwarder};

/// How long connecting and the HTTP upgrade may take.
const UPGRADE_TIMEOUT: Duration = Duration::from_secs(30);
/// How much of a refusal's body is kept for the error message.
const MAX_ERROR_BODY: usize = 4096;

/// Why a streaming session could not start or did not finish.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("invalid stream URL {url:?}: {reason}")]
    Url { url: String, reason: String },
    #[error("connecting to {addr}: {source}")]
    Connect {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("timed out connecting to {0}")]
    Timeout(String),
    /// The HTTP exchange before the upgrade failed.
    #[error("upgrade request failed: {0}")]
    Http(String),
    /// The server answered the upgrade with an error (an unknown or spent token, no common protocol, …).
    #[error("unable to upgrade connection: {0}")]
    Refused(String),
    /// The server upgraded, but not to what was asked.
    #[error("{0}")]
    Handshake(String),
    /// The status on the error stream is not what the remotecommand protocol allows.
    #[error("error stream protocol error: {0}")]
    ErrorStream(String),
    /// The server reported a failure (its message, e.g. a port it could not reach).
    #[error("{0}")]
    Remote(String),
    /// The connection ended before the session did.
    #[error("lost connection to pod")]
    LostConnection,
}

/// An upgraded connection and the headers of the server's `101 Switching Protocols`.
struct Upgraded {
    headers: HeaderMap,
    io: TokioIo<hyper::upgrade::Upgraded>,
}

/// Connects to `url` (`http://host:port/path`) and upgrades the connection with `headers`
/// (besides `Connection: Upgrade` and `Host`).
async fn upgrade(url: &str, method: Method, headers: &[(&str, &str)]) -> Result<Upgraded, ClientError> {
    let bad = |reason: &str| ClientError::Url { url: url.to_string(), reason: reason.to_string() };
    let parsed = url::Url::parse(url).map_err(|e| bad(&e.to_string()))?;
    if parsed.scheme() != "http" {
        return Err(bad("only http:// stream URLs are supported"));
    }
    let host = parsed.host_str().ok_or_else(|| bad("no host"))?;
    let port = parsed.port_or_known_default().ok_or_else(|| bad("no port"))?;
    let authority = match parsed.port() {
        Some(port) => format!("{host}:{port}"),
        None => host.to_string(),
    };
    let target = match parsed.query() {
        Some(query) => format!("{}?{query}", parsed.path()),
        None => parsed.path().to_string(),
    };
    let addr = format!("{host}:{port}");
    let exchange = async {
        let tcp =
            TcpStream::connect(&addr).await.map_err(|source| ClientError::Connect { addr: addr.clone(), source })?;
        let _ = tcp.set_nodelay(true);
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .map_err(|e| ClientError::Http(e.to_string()))?;
        tokio::spawn(async move {
            if let Err(error) = conn.with_upgrades().await {
                tracing::debug!(%error, "stream client connection ended with an error");
            }
        });
        let mut request = Request::builder()
            .method(method)
            .uri(target)
            .header(header::HOST, authority)
            .header(header::CONNECTION, "Upgrade");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request.body(Empty::<Bytes>::new()).map_err(|e| ClientError::Http(e.to_string()))?;
        let response = sender.send_request(request).await.map_err(|e| ClientError::Http(e.to_string()))?;
        if response.status() != StatusCode::SWITCHING_PROTOCOLS {
            let status = response.status();
            let body = response.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
            let body = String::from_utf8_lossy(&body[..body.len().min(MAX_ERROR_BODY)]).trim().to_string();
            // Like client-go: the server's explanation if it gave one, else the status.
            return Err(ClientError::Refused(if body.is_empty() { status.to_string() } else { body }));
        }
        let headers = response.headers().clone();
        let upgraded = hyper::upgrade::on(response).await.map_err(|e| ClientError::Http(e.to_string()))?;
        Ok(Upgraded { headers, io: TokioIo::new(upgraded) })
    };
    tokio::time::timeout(UPGRADE_TIMEOUT, exchange).await.map_err(|_| ClientError::Timeout(addr.clone()))?
}

/// A response header's value, or `""`.
fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> &'a str {
    headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
}

/// Everything the server sends on a stream until it ends it.
async fn read_all(mut from: ChannelReader) -> Vec<u8> {
    let mut out = Vec::new();
    let _ = from.read_to_end(&mut out).await;
    out
}
