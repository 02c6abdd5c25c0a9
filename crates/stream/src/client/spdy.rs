//! The client's end of a SPDY/3.1 connection: opens streams (odd ids, in order), routes the
//! server's data to each stream's reader, answers the server's pings. Frames and the writer task
//! are the server's own (`crate::spdy`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::ClientError;
use crate::mux::{ChannelReader, ChannelWriter};
use crate::spdy::WriteCmd;
use crate::spdy::conn::write_loop;
use crate::spdy::frame::{self, Frame, HeaderDecoder, Headers};

/// Data frames queued per stream before the reader waits for the consumer.
const STREAM_QUEUE: usize = 16;
/// Stream ids are 31 bits.
const MAX_STREAM_ID: u32 = 0x7fff_ffff;

type Routes = Arc<Mutex<HashMap<u32, mpsc::Sender<Bytes>>>>;

pub(crate) struct SpdyClient {
    writer: mpsc::Sender<WriteCmd>,
    /// The next stream id, locked while its SYN_STREAM is queued so that ids go out in order.
    next_id: tokio::sync::Mutex<u32>,
    routes: Routes,
    closed: watch::Receiver<bool>,
    reader_task: JoinHandle<()>,
    writer_task: JoinHandle<()>,
}

impl Drop for SpdyClient {
    fn drop(&mut self) {
        self.reader_task.abort();
        self.writer_task.abort();
    }
}

impl SpdyClient {
    /// Starts speaking SPDY on `io`, an upgraded connection.
    pub(crate) fn start<IO>(io: IO) -> SpdyClient
    where
        IO: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (read_half, write_half) = tokio::io::split(io);
        let (writer, writer_rx) = mpsc::channel(64);
        let (closed_tx, closed) = watch::channel(false);
        let routes = Routes::default();
        let writer_task = tokio::spawn(write_loop(write_half, writer_rx));
        let reader_task = tokio::spawn(read_loop(read_half, writer.clone(), routes.clone(), closed_tx));
        SpdyClient { writer, next_id: tokio::sync::Mutex::new(1), routes, closed, reader_task, writer_task }
    }

    /// Opens a stream with `headers`; its id and what the server sends on it (EOF at the
    /// server's FIN or reset, or when the connection goes).
    pub(crate) async fn open(&self, headers: Headers) -> Result<(u32, ChannelReader), ClientError> {
        let mut next_id = self.next_id.lock().await;
        let stream_id = *next_id;
        if stream_id > MAX_STREAM_ID || self.is_closed() {
            return Err(ClientError::LostConnection);
        }
        let (tx, rx) = mpsc::channel(STREAM_QUEUE);
        // Routed before the SYN goes out: the reply's data may follow at once.
        self.routes.lock().unwrap_or_else(|e| e.into_inner()).insert(stream_id, tx);
        let syn =
            Frame::SynStream { stream_id, associated_to: 0, priority: 0, fin: false, unidirectional: false, headers };
        if self.writer.send(WriteCmd::Frame(syn)).await.is_err() {
            self.forget(stream_id);
            return Err(ClientError::LostConnection);
        }
        *next_id += 2;
        Ok((stream_id, ChannelReader::new(rx)))
    }

    /// Sends data on a stream this client opened.
    pub(crate) fn writer(&self, stream_id: u32) -> ChannelWriter<WriteCmd> {
        ChannelWriter::new(self.writer.clone(), stream_id)
    }

    /// Drops whatever else the server sends on a stream.
    pub(crate) fn forget(&self, stream_id: u32) {
        self.routes.lock().unwrap_or_else(|e| e.into_inner()).remove(&stream_id);
    }

    pub(crate) fn is_closed(&self) -> bool {
        *self.closed.borrow()
    }

    /// Resolves once the server has closed the connection or it failed.
    pub(crate) async fn closed(&self) {
        let mut closed = self.closed.clone();
        let _ = closed.wait_for(|c| *c).await;
    }
}

async fn read_loop<R: AsyncRead + Unpin>(
    mut r: R,
    writer: mpsc::Sender<WriteCmd>,
    routes: Routes,
    closed: watch::Sender<bool>,
) {
    let mut decoder = HeaderDecoder::default();
    let route = |id: u32| routes.lock().unwrap_or_else(|e| e.into_inner()).get(&id).cloned();
    let forget = |id: u32| routes.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
    loop {
        let frame = match frame::read_frame(&mut r, &mut decoder).await {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(error) => {
                tracing::debug!(%error, "spdy client connection read failed");
                break;
            }
        };
        match frame {
            Frame::Data { stream_id, fin, data } => {
                if !data.is_empty()
                    && let Some(tx) = route(stream_id)
                    && tx.send(data).await.is_err()
                {
                    // The consumer is gone; later data on this stream is dropped.
                    forget(stream_id);
                }
                if fin {
                    forget(stream_id);
                }
            }
            Frame::SynReply { stream_id, fin: true, .. }
            | Frame::Headers { stream_id, fin: true, .. }
            | Frame::RstStream { stream_id, .. } => {
                forget(stream_id);
            }
            Frame::SynStream { stream_id, .. } => {
                // No protocol here has the server open streams.
                let refuse = Frame::RstStream { stream_id, status: frame::RST_REFUSED_STREAM };
                let _ = writer.send(WriteCmd::Frame(refuse)).await;
            }
            // The server's pings have even ids; odd ones would answer ours, and we send none.
            Frame::Ping { id } if id % 2 == 0 => {
                let _ = writer.send(WriteCmd::Frame(Frame::Ping { id })).await;
            }
            _ => {}
        }
    }
    // Dropping the routes gives every stream's reader EOF.
    routes.lock().unwrap_or_else(|e| e.into_inner()).clear();
    closed.send_replace(true);
}
