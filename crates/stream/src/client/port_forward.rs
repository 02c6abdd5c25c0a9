//! Port forwarding over SPDY as client-go does it: per local connection an error stream and a
//! data stream sharing a request id, bytes copied both ways with half-close, and whatever the
//! server writes on the error stream reported as that connection's failure.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::Method;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;

use super::spdy::SpdyClient;
use super::{ClientError, header_str, read_all, upgrade};
use crate::mux::CHUNK;
use crate::portforward::SPDY_PROTOCOL;

/// One port-forward connection to the streaming server; forwards any number of local connections.
pub struct PortForwarder {
    conn: SpdyClient,
    next_request_id: AtomicU64,
}

impl std::fmt::Debug for PortForwarder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PortForwarder").field("closed", &self.conn.is_closed()).finish_non_exhaustive()
    }
}

/// What happens on a served port, for the caller to report (as kubectl prints it).
#[derive(Debug)]
pub enum ForwardEvent {
    /// A local connection came in on `local` and is being forwarded to `remote`.
    Connection { local: SocketAddr, remote: u16 },
    /// Forwarding a connection failed; the server's message for it, if it sent one.
    Failed { local: SocketAddr, remote: u16, error: ClientError },
}

impl PortForwarder {
    /// Upgrades the port-forward URL a runtime returned to SPDY.
    pub async fn connect(url: &str) -> Result<PortForwarder, ClientError> {
        let upgraded =
            upgrade(url, Method::POST, &[("Upgrade", "SPDY/3.1"), ("X-Stream-Protocol-Version", SPDY_PROTOCOL)])
                .await?;
        if !header_str(&upgraded.headers, "upgrade").eq_ignore_ascii_case("spdy/3.1") {
            return Err(ClientError::Handshake("the server did not upgrade to SPDY/3.1".into()));
        }
        let protocol = header_str(&upgraded.headers, "x-stream-protocol-version");
        if protocol != SPDY_PROTOCOL {
            return Err(ClientError::Handshake(format!(
                "unable to negotiate protocol: client supports [{SPDY_PROTOCOL:?}], server returned {protocol:?}"
            )));
        }
        Ok(PortForwarder { conn: SpdyClient::start(upgraded.io), next_request_id: AtomicU64::new(0) })
    }

    /// Forwards one local connection to `port` in the pod until either side is done. A failure
    /// the server reports (nothing listening on the port, …) is [`ClientError::Remote`].
    pub async fn forward<S>(&self, local: S, port: u16) -> Result<(), ClientError>
    where
        S: AsyncRead + AsyncWrite + Send + Unpin,
    {
        let request_id = self.next_request_id.fetch_add(1, Ordering::Relaxed).to_string();
        let headers = |kind: &str| {
            vec![
                ("streamtype".to_string(), kind.to_string()),
                ("port".to_string(), port.to_string()),
                ("requestid".to_string(), request_id.clone()),
            ]
        };
        let (error_id, error_stream) = self.conn.open(headers("error")).await?;
        // Nothing goes to the server on the error stream.
        let _ = self.conn.writer(error_id).finish().await;
        let message = tokio::spawn(read_all(error_stream));
        let (data_id, from_remote) = match self.conn.open(headers("data")).await {
            Ok(opened) => opened,
            Err(e) => {
                message.abort();
                self.conn.forget(error_id);
                return Err(e);
            }
        };
        let to_remote = self.conn.writer(data_id);

        let (mut local_read, mut local_write) = tokio::io::split(local);
        let downstream = async {
            let mut from_remote = from_remote;
            let _ = tokio::io::copy(&mut from_remote, &mut local_write).await;
            // The pod is done sending: pass the half-close on to the local client.
            let _ = local_write.shutdown().await;
        };
        let upstream = async {
            let mut buf = vec![0u8; CHUNK];
            loop {
                match local_read.read(&mut buf).await {
                    Ok(0) => return true,
                    Ok(n) => {
                        if to_remote.send(Bytes::copy_from_slice(&buf[..n])).await.is_err() {
                            return false;
                        }
                    }
                    Err(error) => {
                        tracing::debug!(%error, "reading the local connection failed");
                        return false;
                    }
                }
            }
        };
        tokio::pin!(downstream, upstream);
        // The pod closing its side ends the forward; the local side closing only half-closes.
        let mut upstream_done = false;
        loop {
            tokio::select! {
                () = &mut downstream => break,
                clean = &mut upstream, if !upstream_done => {
                    upstream_done = true;
                    if !clean {
                        break;
                    }
                    let _ = to_remote.finish().await;
                }
            }
        }
        if !upstream_done {
            let _ = to_remote.finish().await;
        }
        let message = message.await.unwrap_or_default();
        self.conn.forget(data_id);
        self.conn.forget(error_id);
        if message.is_empty() {
            Ok(())
        } else {
            Err(ClientError::Remote(String::from_utf8_lossy(&message).into_owned()))
        }
    }

    /// Accepts connections on `listener` and forwards each to `port` in the pod, reporting
    /// through `report`; runs until dropped.
    pub async fn serve(
        self: Arc<Self>,
        listener: TcpListener,
        port: u16,
        report: Arc<dyn Fn(ForwardEvent) + Send + Sync>,
    ) {
        loop {
            let (conn, _) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "accepting a connection to forward failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let local = conn.local_addr().unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 0)));
            let _ = conn.set_nodelay(true);
            report(ForwardEvent::Connection { local, remote: port });
            let (forwarder, report) = (self.clone(), report.clone());
            tokio::spawn(async move {
                if let Err(error) = forwarder.forward(conn, port).await {
                    report(ForwardEvent::Failed { local, remote: port, error });
                }
            });
        }
    }

    /// Resolves once the server has closed the connection or it failed: nothing more can be
    /// forwarded on it.
    pub async fn closed(&self) {
        self.conn.closed().await;
    }
}
