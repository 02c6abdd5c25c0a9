//! The WebSocket flavour of the streaming protocols (`v5`/`v4.channel.k8s.io` and friends):
//! each binary message starts with a channel byte; base64 sub-protocols send text messages whose
//! first character is the channel digit.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use bytes::{BufMut, Bytes, BytesMut};
use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, watch};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, frame::coding::CloseCode};

use crate::backend::Backend;
use crate::mux::{self, ChannelReader, ChannelWriter, OutFrame};
use crate::portforward;
use crate::remotecommand::{self, Command, Options, Protocol};

/// WebSocket sub-protocols for exec/attach, in the server's order of preference.
pub const EXEC_PROTOCOLS: &[&str] =
    &["v5.channel.k8s.io", "v4.channel.k8s.io", "v4.base64.channel.k8s.io", "channel.k8s.io", "base64.channel.k8s.io"];
/// WebSocket sub-protocols for port forwarding.
pub const PORT_FORWARD_PROTOCOLS: &[&str] = &["v4.channel.k8s.io", "portforward.k8s.io", "v4.base64.channel.k8s.io"];

/// In v5, a message on this channel closes the channel named by its second byte.
pub(crate) const CLOSE_CHANNEL: u8 = 255;
pub(crate) const STDIN: u8 = 0;
pub(crate) const STDOUT: u32 = 1;
pub(crate) const STDERR: u32 = 2;
pub(crate) const ERROR: u32 = 3;
pub(crate) const RESIZE: u8 = 4;
const CLOSE_GRACE: Duration = Duration::from_secs(5);

/// Message framing chosen by the sub-protocol.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Framing {
    base64: bool,
    pub(crate) close_signal: bool,
}

impl Framing {
    pub(crate) fn for_protocol(name: &str) -> Framing {
        Framing { base64: name.contains("base64"), close_signal: name == "v5.channel.k8s.io" }
    }
}

pub(crate) enum WsCmd {
    Frame(OutFrame),
    Close,
}

impl From<OutFrame> for WsCmd {
    fn from(f: OutFrame) -> Self {
        WsCmd::Frame(f)
    }
}

/// A running WebSocket with its channels demultiplexed (either end: the client uses it too).
pub(crate) struct WsMux {
    pub(crate) tx: mpsc::Sender<WsCmd>,
    closed: watch::Receiver<bool>,
    reader: tokio::task::JoinHandle<()>,
    writer: tokio::task::JoinHandle<()>,
}

impl WsMux {
    /// Starts the reader and writer; `inputs` maps channel numbers to where their data goes.
    pub(crate) async fn start<IO>(
        io: IO,
        role: Role,
        framing: Framing,
        inputs: HashMap<u8, mpsc::Sender<Bytes>>,
    ) -> WsMux
    where
        IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        let ws = WebSocketStream::from_raw_socket(io, role, None).await;
        let (mut sink, mut stream) = ws.split();
        let (tx, mut rx) = mpsc::channel::<WsCmd>(64);
        let (closed_tx, closed) = watch::channel(false);
        let writer = tokio::spawn(async move {
            while let Some(cmd) = rx.recv().await {
                let msg = match cmd {
                    WsCmd::Frame(f) if f.data.is_empty() => continue,
                    WsCmd::Frame(f) => encode(framing, f.id as u8, &f.data),
                    WsCmd::Close => {
                        let frame = CloseFrame { code: CloseCode::Normal, reason: "".into() };
                        let _ = sink.send(Message::Close(Some(frame))).await;
                        return;
                    }
                };
                if sink.send(msg).await.is_err() {
                    return;
                }
            }
        });
        let reader = tokio::spawn(async move {
            let mut inputs = inputs;
            while let Some(Ok(msg)) = stream.next().await {
                let Some((channel, data)) = decode(framing, msg) else { continue };
                if framing.close_signal && channel == CLOSE_CHANNEL {
                    if let Some(&closing) = data.first() {
                        inputs.remove(&closing);
                    }
                    continue;
                }
                let delivered = match inputs.get(&channel) {
                    Some(input) if !data.is_empty() => input.send(data).await.is_ok(),
                    _ => true,
                };
                if !delivered {
                    inputs.remove(&channel);
                }
            }
            drop(inputs);
            closed_tx.send_replace(true);
        });
        WsMux { tx, closed, reader, writer }
    }

    pub(crate) async fn closed(&self) {
        let mut closed = self.closed.clone();
        let _ = closed.wait_for(|c| *c).await;
    }

    /// Sends a close frame, waits briefly for the peer's reply, then tears down.
    pub(crate) async fn shutdown(self, grace: Duration) {
        let _ = self.tx.send(WsCmd::Close).await;
        let _ = tokio::time::timeout(grace, self.closed()).await;
        self.reader.abort();
        self.writer.abort();
    }
}

fn encode(framing: Framing, channel: u8, data: &[u8]) -> Message {
    if framing.base64 {
        let mut text = String::with_capacity(1 + data.len() * 4 / 3 + 4);
        text.push(char::from(b'0' + channel));
        base64::engine::general_purpose::STANDARD.encode_string(data, &mut text);
        Message::text(text)
    } else {
        let mut buf = BytesMut::with_capacity(1 + data.len());
        buf.put_u8(channel);
        buf.put_slice(data);
        Message::binary(buf.freeze())
    }
}

fn decode(framing: Framing, msg: Message) -> Option<(u8, Bytes)> {
    match msg {
        Message::Binary(data) if !data.is_empty() => Some((data[0], data.slice(1..))),
        Message::Text(text) if framing.base64 && !text.is_empty() => {
            let bytes = text.as_bytes();
            let data = base64::engine::general_purpose::STANDARD.decode(&bytes[1..]).ok()?;
            Some((bytes[0].wrapping_sub(b'0'), Bytes::from(data)))
        }
        _ => None,
    }
}

/// Serves one exec/attach session on an upgraded WebSocket connection.
pub async fn serve_command<IO>(io: IO, protocol_name: &str, command: Command, opts: Options, backend: Arc<dyn Backend>)
where
    IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let protocol = Protocol::from_name(protocol_name).unwrap_or(Protocol::V1);
    let framing = Framing::for_protocol(protocol_name);
    let mut inputs = HashMap::new();
    let mut input = |channel: u8| {
        let (tx, rx) = mpsc::channel(16);
        inputs.insert(channel, tx);
        Box::new(ChannelReader::new(rx)) as Box<dyn AsyncRead + Send + Unpin>
    };
    let stdin = opts.stdin.then(|| input(STDIN));
    let resize = (opts.tty && protocol >= Protocol::V4).then(|| input(RESIZE));
    let ws = WsMux::start(io, Role::Server, framing, inputs).await;

    let (streams, pumps) = remotecommand::backend_streams(
        &ws.tx,
        stdin,
        opts.stdout.then_some(STDOUT),
        opts.stderr.then_some(STDERR),
        resize,
    );
    let outcome = remotecommand::run(&backend, &command, opts.tty, streams, ws.closed()).await;
    mux::drain(pumps, Duration::from_secs(10)).await;
    if let Some(status) = remotecommand::final_status(protocol, &command, &outcome) {
        let _ = ChannelWriter::new(ws.tx.clone(), ERROR).send(status).await;
    }
    ws.shutdown(CLOSE_GRACE).await;
}

/// Serves port forwarding for `ports` on an upgraded WebSocket connection: channel `2i` carries
/// data and `2i+1` errors for the i-th port, each opened by the port number (2 bytes, little endian).
pub async fn serve_port_forward<IO>(
    io: IO,
    protocol_name: &str,
    sandbox_id: String,
    ports: Vec<u16>,
    backend: Arc<dyn Backend>,
) where
    IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let framing = Framing::for_protocol(protocol_name);
    let mut inputs = HashMap::new();
    let mut readers = Vec::new();
    for i in 0..ports.len() {
        let (tx, rx) = mpsc::channel(16);
        inputs.insert((2 * i) as u8, tx);
        readers.push(ChannelReader::new(rx));
    }
    let ws = WsMux::start(io, Role::Server, framing, inputs).await;
    let mut tasks = Vec::new();
    for (i, (port, reader)) in ports.into_iter().zip(readers).enumerate() {
        let data = ChannelWriter::new(ws.tx.clone(), (2 * i) as u32);
        let errors = ChannelWriter::new(ws.tx.clone(), (2 * i + 1) as u32);
        let prefix = Bytes::copy_from_slice(&port.to_le_bytes());
        let (backend, sandbox_id) = (backend.clone(), sandbox_id.clone());
        tasks.push(tokio::spawn(async move {
            if data.send(prefix.clone()).await.is_err() || errors.send(prefix).await.is_err() {
                return;
            }
            portforward::forward(backend, sandbox_id, port, reader, data, errors).await;
        }));
    }
    tokio::select! {
        _ = futures::future::join_all(tasks) => {}
        () = ws.closed() => {}
    }
    ws.shutdown(CLOSE_GRACE).await;
}
