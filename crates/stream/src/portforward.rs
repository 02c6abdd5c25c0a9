//! Port forwarding: pairing a client's data and error streams per forwarded connection, dialing
//! the pod through the backend, and copying bytes both ways with half-close.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::backend::Backend;
use crate::mux::{CHUNK, ChannelWriter, OutFrame};
use crate::remotecommand::STREAM_CREATION_TIMEOUT;
use crate::spdy::{self, Frame, IncomingStream, WriteCmd};

/// The SPDY sub-protocol name for port forwarding.
pub const SPDY_PROTOCOL: &str = "portforward.k8s.io";

/// Forwards one client connection to `port` in the sandbox. `from_client` ends when the client
/// closes its side; errors are reported as text on `errors`. Both channels are ended on return.
pub async fn forward<C, R>(
    backend: Arc<dyn Backend>,
    sandbox_id: String,
    port: u16,
    mut from_client: R,
    to_client: ChannelWriter<C>,
    errors: ChannelWriter<C>,
) where
    C: From<OutFrame> + Send + 'static,
    R: AsyncRead + Send + Unpin,
{
    let result = match backend.port_forward(&sandbox_id, port).await {
        Err(e) => Err(e.to_string()),
        Ok(target) => {
            let (mut target_read, mut target_write) = tokio::io::split(target);
            let upstream = async {
                let copied = tokio::io::copy(&mut from_client, &mut target_write).await;
                // The client finished sending: pass the half-close on so the pod sees EOF.
                let _ = target_write.shutdown().await;
                copied.map(|_| ())
            };
            let downstream = async {
                let mut buf = vec![0u8; CHUNK];
                loop {
                    let n = target_read.read(&mut buf).await?;
                    if n == 0 {
                        return Ok(());
                    }
                    to_client.send(Bytes::copy_from_slice(&buf[..n])).await?;
                }
            };
            // The pod closing its side ends the forward; the client closing its side only half-closes.
            tokio::pin!(upstream, downstream);
            let mut upstream_done = false;
            loop {
                tokio::select! {
                    r = &mut upstream, if !upstream_done => {
                        upstream_done = true;
                        if let Err(error) = r {
                            tracing::debug!(%error, "copying to the pod failed");
                        }
                    }
                    r = &mut downstream => break r.map_err(|e: std::io::Error| e.to_string()),
                }
            }
        }
    };
    if let Err(e) = result {
        // Message as kubelet words it (CRI has no pod UID here).
        let msg = format!("error forwarding port {port} to pod {sandbox_id}, uid : {e}");
        tracing::info!(port, sandbox_id, error = %e, "port forward failed");
        let _ = errors.send(Bytes::from(msg)).await;
    }
    let _ = to_client.finish().await;
    let _ = errors.finish().await;
}

#[derive(Default)]
struct Pair {
    data: Option<IncomingStream>,
    error: Option<IncomingStream>,
    port: String,
    created: Option<Instant>,
}

/// Serves a SPDY port-forward connection until the client hangs up.
pub async fn serve_spdy<IO>(io: IO, sandbox_id: String, backend: Arc<dyn Backend>)
where
    IO: AsyncRead + AsyncWrite + Send + 'static,
{
    let (conn, mut incoming) = spdy::Connection::start(io);
    let tx = conn.sender();
    let mut pending: HashMap<String, Pair> = HashMap::new();
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    loop {
        let stream = tokio::select! {
            s = incoming.recv() => match s {
                Some(s) => s,
                None => break,
            },
            _ = ticker.tick() => {
                expire(&mut pending, &tx).await;
                continue;
            }
        };
        let kind = stream.header("streamtype").unwrap_or_default().to_ascii_lowercase();
        let port = stream.header("port").unwrap_or_default().to_string();
        // Old clients send no requestID; their error stream is opened right before the data stream.
        let request_id = match stream.header("requestid") {
            Some(id) => id.to_string(),
            None if kind == "data" => stream.id.saturating_sub(2).to_string(),
            None => stream.id.to_string(),
        };
        let pair = pending.entry(request_id.clone()).or_default();
        pair.created.get_or_insert_with(Instant::now);
        pair.port = port;
        match kind.as_str() {
            "data" => pair.data = Some(stream),
            "error" => pair.error = Some(stream),
            other => {
                tracing::debug!(stream_type = other, "refusing port-forward stream of unknown type");
                let _ =
                    conn.send(Frame::RstStream { stream_id: stream.id, status: spdy::frame::RST_PROTOCOL_ERROR }).await;
                continue;
            }
        }
        if pair.data.is_some() && pair.error.is_some() {
            let Some(Pair { data: Some(data), error: Some(error), port, .. }) = pending.remove(&request_id) else {
                continue;
            };
            let (backend, sandbox_id, tx) = (backend.clone(), sandbox_id.clone(), tx.clone());
            tokio::spawn(async move {
                let errors = ChannelWriter::new(tx.clone(), error.id);
                let to_client = ChannelWriter::new(tx, data.id);
                match port.parse::<u16>() {
                    Ok(port) if port > 0 => forward(backend, sandbox_id, port, data.data, to_client, errors).await,
                    _ => {
                        let _ = errors.send(Bytes::from(format!("invalid port {port:?}"))).await;
                        let _ = errors.finish().await;
                        let _ = to_client.finish().await;
                    }
                }
            });
        }
    }
    drop(tx);
    conn.shutdown(Duration::ZERO).await;
}

/// Ends stream pairs whose partner never came, telling the client on the error stream if it has one.
async fn expire(pending: &mut HashMap<String, Pair>, tx: &mpsc::Sender<WriteCmd>) {
    let now = Instant::now();
    let stale: Vec<String> = pending
        .iter()
        .filter(|(_, p)| p.created.is_some_and(|c| now.duration_since(c) > STREAM_CREATION_TIMEOUT))
        .map(|(id, _)| id.clone())
        .collect();
    for id in stale {
        let Some(pair) = pending.remove(&id) else { continue };
        if let Some(error) = pair.error {
            let w = ChannelWriter::new(tx.clone(), error.id);
            let _ = w.send(Bytes::from_static(b"timed out waiting for streams")).await;
            let _ = w.finish().await;
        }
        if let Some(data) = pair.data {
            let _ = ChannelWriter::new(tx.clone(), data.id).finish().await;
        }
    }
}
