//! Transport-neutral plumbing between multiplexed client channels (SPDY streams or WebSocket
//! channels) and the plain byte streams the backend sees.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncReadExt, DuplexStream, ReadBuf};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::backend::TerminalSize;

/// Largest chunk sent in one data frame or message.
pub const CHUNK: usize = 32 * 1024;

/// Data for one outgoing channel (`id` is the SPDY stream id or WebSocket channel number).
/// `fin` ends that channel (SPDY FIN); transports without half-close ignore it.
#[derive(Debug, Clone)]
pub struct OutFrame {
    pub id: u32,
    pub data: Bytes,
    pub fin: bool,
}

/// The readable end of an incoming channel; EOF when the client closes it or the connection ends.
#[derive(Debug)]
pub struct ChannelReader {
    rx: mpsc::Receiver<Bytes>,
    pending: Bytes,
}

impl ChannelReader {
    pub fn new(rx: mpsc::Receiver<Bytes>) -> Self {
        Self { rx, pending: Bytes::new() }
    }
}

impl AsyncRead for ChannelReader {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        while self.pending.is_empty() {
            match ready!(self.rx.poll_recv(cx)) {
                Some(chunk) => self.pending = chunk,
                None => return Poll::Ready(Ok(())),
            }
        }
        let n = self.pending.len().min(buf.remaining());
        buf.put_slice(&self.pending[..n]);
        self.pending.advance(n);
        Poll::Ready(Ok(()))
    }
}

/// Sends whole messages on one outgoing channel.
#[derive(Debug)]
pub struct ChannelWriter<C> {
    tx: mpsc::Sender<C>,
    id: u32,
}

impl<C: From<OutFrame>> ChannelWriter<C> {
    pub fn new(tx: mpsc::Sender<C>, id: u32) -> Self {
        Self { tx, id }
    }

    /// Sends `data` (split into chunks); fails once the connection is gone.
    pub async fn send(&self, data: Bytes) -> io::Result<()> {
        let mut data = data;
        while !data.is_empty() {
            let chunk = data.split_to(data.len().min(CHUNK));
            self.frame(chunk, false).await?;
        }
        Ok(())
    }

    /// Ends the channel for the client.
    pub async fn finish(&self) -> io::Result<()> {
        self.frame(Bytes::new(), true).await
    }

    async fn frame(&self, data: Bytes, fin: bool) -> io::Result<()> {
        let frame = OutFrame { id: self.id, data, fin };
        self.tx.send(frame.into()).await.map_err(|_| io::Error::from(io::ErrorKind::BrokenPipe))
    }
}

/// An output channel the backend writes to: it gets the returned pipe end, a task forwards
/// what it writes to the client and ends the channel when the backend drops or shuts down its end.
pub fn output_channel<C>(writer: ChannelWriter<C>) -> (DuplexStream, JoinHandle<()>)
where
    C: From<OutFrame> + Send + 'static,
{
    let (backend_end, mut our_end) = tokio::io::duplex(64 * 1024);
    let task = tokio::spawn(async move {
        let mut buf = vec![0u8; CHUNK];
        loop {
            match our_end.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if writer.send(Bytes::copy_from_slice(&buf[..n])).await.is_err() {
                        // The client is gone: dropping our end makes the backend's writes fail.
                        return;
                    }
                }
            }
        }
        let _ = writer.finish().await;
    });
    (backend_end, task)
}

/// Waits for output pumps to deliver what the backend wrote, but not forever: a backend that
/// leaked a writer into a background task must not keep the session open.
pub async fn drain(pumps: Vec<JoinHandle<()>>, limit: Duration) {
    let all = futures::future::join_all(pumps);
    if tokio::time::timeout(limit, all).await.is_err() {
        tracing::warn!("backend kept an output stream open after returning; closing it");
    }
}

/// Decodes the resize channel: a sequence of JSON `{"Width":w,"Height":h}` objects, in as
/// many or few frames as the client likes. Sizes the backend does not take in time are dropped.
pub fn resize_events<R>(mut input: R) -> mpsc::Receiver<TerminalSize>
where
    R: AsyncRead + Send + Unpin + 'static,
{
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        let mut buf: Vec<u8> = Vec::new();
        let mut chunk = vec![0u8; 4096];
        loop {
            match input.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
            let mut values = serde_json::Deserializer::from_slice(&buf).into_iter::<TerminalSize>();
            let mut used = 0;
            loop {
                match values.next() {
                    Some(Ok(size)) => {
                        used = values.byte_offset();
                        if tx.try_send(size).is_err() && tx.is_closed() {
                            return;
                        }
                    }
                    Some(Err(e)) if e.is_eof() => break,
                    Some(Err(error)) => {
                        tracing::debug!(%error, "invalid terminal size message; ignoring the resize stream");
                        return;
                    }
                    None => {
                        used = buf.len();
                        break;
                    }
                }
            }
            buf.drain(..used);
        }
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test]
    async fn resize_messages_split_across_frames_are_decoded_in_order() {
        let (tx, rx) = mpsc::channel(8);
        let mut sizes = resize_events(ChannelReader::new(rx));
        tx.send(Bytes::from_static(b"{\"Width\":80,\"Hei")).await.unwrap();
        tx.send(Bytes::from_static(b"ght\":24}\n{\"Width\":100,\"Height\":40}")).await.unwrap();
        assert_eq!(sizes.recv().await, Some(TerminalSize { width: 80, height: 24 }));
        assert_eq!(sizes.recv().await, Some(TerminalSize { width: 100, height: 40 }));
        drop(tx);
        assert_eq!(sizes.recv().await, None);
    }

    #[tokio::test]
    async fn a_channel_reader_yields_queued_data_then_eof() {
        let (tx, rx) = mpsc::channel(8);
        tx.send(Bytes::from_static(b"ab")).await.unwrap();
        tx.send(Bytes::from_static(b"cd")).await.unwrap();
        drop(tx);
        let mut out = String::new();
        ChannelReader::new(rx).read_to_string(&mut out).await.unwrap();
        assert_eq!(out, "abcd");
    }

    #[tokio::test]
    async fn an_output_channel_forwards_writes_and_ends_with_fin() {
        let (tx, mut rx) = mpsc::channel::<OutFrame>(8);
        let (mut pipe, task) = output_channel(ChannelWriter::new(tx, 7));
        pipe.write_all(b"hello").await.unwrap();
        drop(pipe);
        task.await.unwrap();
        let first = rx.recv().await.unwrap();
        assert_eq!((first.id, &first.data[..], first.fin), (7, &b"hello"[..], false));
        let last = rx.recv().await.unwrap();
        assert!(last.fin && last.data.is_empty());
    }
}
