//! One server-side SPDY/3.1 connection: a reader task that demultiplexes client streams and a
//! writer task that owns the socket's write half and the outgoing header compression context.
//!
//! Like the Go spdystream that kubelet uses, no flow-control window is enforced; back-pressure
//! comes from bounded per-stream queues instead.

use std::collections::HashMap;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::frame::{self, Frame, HeaderDecoder, HeaderEncoder, Headers};
use crate::mux::{ChannelReader, OutFrame};

/// Data frames queued per incoming stream before the reader waits for the consumer.
const STREAM_QUEUE: usize = 16;

/// What the writer task is asked to do.
#[derive(Debug)]
pub enum WriteCmd {
    Frame(Frame),
}

impl From<OutFrame> for WriteCmd {
    fn from(f: OutFrame) -> Self {
        WriteCmd::Frame(Frame::Data { stream_id: f.id, fin: f.fin, data: f.data })
    }
}

/// A stream the client opened (SYN_STREAM), already answered with SYN_REPLY.
#[derive(Debug)]
pub struct IncomingStream {
    pub id: u32,
    pub headers: Headers,
    /// The client's data on this stream; ends at FIN or RST_STREAM.
    pub data: ChannelReader,
}

impl IncomingStream {
    pub fn header(&self, name: &str) -> Option<&str> {
        frame::header(&self.headers, name)
    }
}

/// The server's handle on a running connection.
pub struct Connection {
    writer: mpsc::Sender<WriteCmd>,
    closed: watch::Receiver<bool>,
    reader_task: JoinHandle<()>,
    writer_task: JoinHandle<()>,
    last_stream: watch::Receiver<u32>,
}

impl Connection {
    /// Starts serving SPDY on `io` (the upgraded HTTP connection); new client streams arrive on the receiver.
    pub fn start<IO>(io: IO) -> (Connection, mpsc::Receiver<IncomingStream>)
    where
        IO: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (read_half, write_half) = tokio::io::split(io);
        let (writer, writer_rx) = mpsc::channel(64);
        let (incoming_tx, incoming_rx) = mpsc::channel(16);
        let (closed_tx, closed) = watch::channel(false);
        let (last_tx, last_stream) = watch::channel(0);
        let writer_task = tokio::spawn(write_loop(write_half, writer_rx));
        let reader_task = tokio::spawn(read_loop(read_half, writer.clone(), incoming_tx, closed_tx, last_tx));
        (Connection { writer, closed, reader_task, writer_task, last_stream }, incoming_rx)
    }

    /// A sender for frames; data sent after the connection is gone is dropped with an error.
    pub fn sender(&self) -> mpsc::Sender<WriteCmd> {
        self.writer.clone()
    }

    pub async fn send(&self, frame: Frame) -> bool {
        self.writer.send(WriteCmd::Frame(frame)).await.is_ok()
    }

    /// Resolves once the client has closed the connection or it failed.
    pub async fn closed(&self) {
        let mut closed = self.closed.clone();
        let _ = closed.wait_for(|c| *c).await;
    }

    /// Says GOAWAY, gives the client `grace` to read what was sent and hang up, then closes.
    pub async fn shutdown(self, grace: Duration) {
        let last_good_stream_id = *self.last_stream.borrow();
        let _ = self.send(Frame::GoAway { last_good_stream_id, status: 0 }).await;
        let _ = tokio::time::timeout(grace, self.closed()).await;
        self.reader_task.abort();
        drop(self.writer);
        // The writer ends once every sender is gone; don't wait on senders held elsewhere for long.
        let mut writer_task = self.writer_task;
        if tokio::time::timeout(Duration::from_secs(1), &mut writer_task).await.is_err() {
            writer_task.abort();
        }
    }
}

/// Writes queued frames, batched, until every sender is gone; the client connection uses it too.
pub(crate) async fn write_loop<W: AsyncWrite + Unpin>(mut w: W, mut rx: mpsc::Receiver<WriteCmd>) {
    let mut encoder = HeaderEncoder::default();
    let mut buf = BytesMut::with_capacity(64 * 1024);
    while let Some(cmd) = rx.recv().await {
        let mut next = Some(cmd);
        // Batch whatever is already queued into one write.
        while let Some(WriteCmd::Frame(f)) = next {
            if let Err(error) = frame::write_frame(&f, &mut encoder, &mut buf) {
                tracing::warn!(%error, "dropping unencodable spdy frame");
            }
            next = if buf.len() < 256 * 1024 { rx.try_recv().ok() } else { None };
        }
        if let Err(error) = w.write_all(&buf).await.and(w.flush().await) {
            tracing::debug!(%error, "spdy connection write failed");
            return;
        }
        buf.clear();
    }
    let _ = w.shutdown().await;
}

async fn read_loop<R: AsyncRead + Unpin>(
    mut r: R,
    writer: mpsc::Sender<WriteCmd>,
    incoming: mpsc::Sender<IncomingStream>,
    closed: watch::Sender<bool>,
    last_stream: watch::Sender<u32>,
) {
    let mut decoder = HeaderDecoder::default();
    let mut streams: HashMap<u32, mpsc::Sender<Bytes>> = HashMap::new();
    let mut last_id = 0u32;
    let mut going_away = false;
    let send = |f: Frame| writer.send(WriteCmd::Frame(f));
    loop {
        let frame = match frame::read_frame(&mut r, &mut decoder).await {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(error) => {
                tracing::debug!(%error, "spdy connection read failed");
                break;
            }
        };
        match frame {
            Frame::SynStream { stream_id, fin, headers, .. } => {
                // Client streams are odd and strictly increasing.
                if stream_id % 2 == 0 || stream_id <= last_id || going_away {
                    let status = if going_away { frame::RST_REFUSED_STREAM } else { frame::RST_PROTOCOL_ERROR };
                    let _ = send(Frame::RstStream { stream_id, status }).await;
                    continue;
                }
                last_id = stream_id;
                last_stream.send_replace(stream_id);
                let (tx, rx) = mpsc::channel(STREAM_QUEUE);
                if !fin {
                    streams.insert(stream_id, tx);
                }
                let _ = send(Frame::SynReply { stream_id, fin: false, headers: Vec::new() }).await;
                let stream = IncomingStream { id: stream_id, headers, data: ChannelReader::new(rx) };
                if incoming.send(stream).await.is_err() {
                    // Nobody accepts streams any more; the session is winding down.
                    streams.remove(&stream_id);
                }
            }
            Frame::Data { stream_id, fin, data } => {
                let delivered = match streams.get(&stream_id) {
                    Some(tx) if !data.is_empty() => tx.send(data).await.is_ok(),
                    _ => true,
                };
                if !delivered {
                    // The consumer is gone; later data on this stream is dropped.
                    streams.remove(&stream_id);
                }
                if fin {
                    streams.remove(&stream_id);
                }
            }
            Frame::Headers { stream_id, fin: true, .. } | Frame::RstStream { stream_id, .. } => {
                streams.remove(&stream_id);
            }
            Frame::Ping { id } => {
                // Echo the client's (odd) pings; the server never pings, so even ids are not ours to answer.
                if id % 2 == 1 {
                    let _ = send(Frame::Ping { id }).await;
                }
            }
            Frame::GoAway { .. } => going_away = true,
            Frame::SynReply { .. }
            | Frame::Headers { .. }
            | Frame::Settings { .. }
            | Frame::WindowUpdate { .. }
            | Frame::Unknown { .. } => {}
        }
    }
    // Dropping the stream senders gives every reader EOF.
    drop(streams);
    closed.send_replace(true);
}
