//! Exec and attach sessions over WebSocket: local stdin and terminal sizes out, stdout and
//! stderr in, and the command's fate from the status on the error channel.

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use http::Method;
use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::handshake::client::generate_key;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;

use super::{ClientError, header_str, read_all, upgrade};
use crate::backend::TerminalSize;
use crate::mux::{CHUNK, ChannelReader, ChannelWriter};
use crate::remotecommand::Protocol;
use crate::websocket::{CLOSE_CHANNEL, ERROR, Framing, RESIZE, STDERR, STDIN, STDOUT, WsCmd, WsMux};

/// Sub-protocols offered, best first: v5 can tell the server that stdin ended.
const PROTOCOLS: &[&str] = &["v5.channel.k8s.io", "v4.channel.k8s.io"];

/// The local ends of an exec or attach session. Which streams exist is fixed by the RPC that
/// minted the URL; this only says where they come from and go to.
#[derive(Default)]
pub struct CommandIo {
    /// Sent to the process; its end closes the process's stdin (with `v5.channel.k8s.io`).
    pub stdin: Option<Box<dyn AsyncRead + Send + Unpin>>,
    /// Where the process's stdout goes (discarded if `None`).
    pub stdout: Option<Box<dyn AsyncWrite + Send + Unpin>>,
    /// Where the process's stderr goes (discarded if `None`); a terminal has none.
    pub stderr: Option<Box<dyn AsyncWrite + Send + Unpin>>,
    /// Terminal sizes to send, the current size first; only with a TTY.
    pub resize: Option<mpsc::Receiver<TerminalSize>>,
}

impl std::fmt::Debug for CommandIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommandIo")
            .field("stdin", &self.stdin.is_some())
            .field("stdout", &self.stdout.is_some())
            .field("stderr", &self.stderr.is_some())
            .field("resize", &self.resize.is_some())
            .finish()
    }
}

/// Runs the exec or attach session at `url` to its end; the command's exit code (0 for an
/// attach that ended normally). A failure the server reports is [`ClientError::Remote`].
pub async fn run_command(url: &str, io: CommandIo) -> Result<i32, ClientError> {
    let key = generate_key();
    let offer = PROTOCOLS.join(", ");
    let upgraded = upgrade(
        url,
        Method::GET,
        &[
            ("Upgrade", "websocket"),
            ("Sec-WebSocket-Version", "13"),
            ("Sec-WebSocket-Key", &key),
            ("Sec-WebSocket-Protocol", &offer),
        ],
    )
    .await?;
    if !header_str(&upgraded.headers, "upgrade").eq_ignore_ascii_case("websocket") {
        return Err(ClientError::Handshake("the server did not upgrade to a WebSocket".into()));
    }
    if header_str(&upgraded.headers, "sec-websocket-accept") != derive_accept_key(key.as_bytes()) {
        return Err(ClientError::Handshake("the server's Sec-WebSocket-Accept does not match the key".into()));
    }
    let protocol_name = header_str(&upgraded.headers, "sec-websocket-protocol").to_string();
    if !PROTOCOLS.contains(&protocol_name.as_str()) {
        return Err(ClientError::Handshake(format!(
            "unable to negotiate protocol: client supports {PROTOCOLS:?}, server returned {protocol_name:?}"
        )));
    }
    let protocol = Protocol::from_name(&protocol_name).unwrap_or(Protocol::V4);
    let framing = Framing::for_protocol(&protocol_name);

    let mut inputs = HashMap::new();
    let mut channel = |id: u32| {
        let (tx, rx) = mpsc::channel(16);
        inputs.insert(id as u8, tx);
        ChannelReader::new(rx)
    };
    let outputs =
        [tokio::spawn(copy_out(channel(STDOUT), io.stdout)), tokio::spawn(copy_out(channel(STDERR), io.stderr))];
    let status = tokio::spawn(read_all(channel(ERROR)));
    let ws = WsMux::start(upgraded.io, Role::Client, framing, inputs).await;
    let mut resize = io.resize;
    // The terminal's size goes ahead of any input, so that a command reading at once has it.
    if let Some(first) = resize.as_mut().and_then(|sizes| sizes.try_recv().ok()) {
        let _ = send_size(&ChannelWriter::new(ws.tx.clone(), u32::from(RESIZE)), first).await;
    }
    let senders = [
        io.stdin.map(|stdin| tokio::spawn(send_stdin(stdin, ws.tx.clone(), framing))),
        resize.map(|sizes| tokio::spawn(send_sizes(sizes, ws.tx.clone()))),
    ];

    // The server ends the session by closing the WebSocket after the status.
    ws.closed().await;
    for task in senders.into_iter().flatten() {
        task.abort();
    }
    for task in outputs {
        let _ = task.await;
    }
    let status = status.await.unwrap_or_default();
    ws.shutdown(Duration::ZERO).await;
    decode_status(protocol, &status)
}

/// Copies an incoming channel to a local writer, flushing as data comes (an interactive shell's
/// prompt has no newline). Keeps draining if the writer fails, so the session is not stalled.
async fn copy_out(mut from: ChannelReader, mut to: Option<Box<dyn AsyncWrite + Send + Unpin>>) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let Some(writer) = to.as_mut()
            && (writer.write_all(&buf[..n]).await.is_err() || writer.flush().await.is_err())
        {
            to = None;
        }
    }
}

/// Sends local stdin; at its end, closes the remote stdin if the protocol can say so.
async fn send_stdin(mut stdin: Box<dyn AsyncRead + Send + Unpin>, tx: mpsc::Sender<WsCmd>, framing: Framing) {
    let writer = ChannelWriter::new(tx.clone(), u32::from(STDIN));
    let mut buf = vec![0u8; CHUNK];
    loop {
        match stdin.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if writer.send(Bytes::copy_from_slice(&buf[..n])).await.is_err() {
                    return;
                }
            }
        }
    }
    if framing.close_signal {
        let _ = ChannelWriter::new(tx, u32::from(CLOSE_CHANNEL)).send(Bytes::from_static(&[STDIN])).await;
    }
}

async fn send_sizes(mut sizes: mpsc::Receiver<TerminalSize>, tx: mpsc::Sender<WsCmd>) {
    let writer = ChannelWriter::new(tx, u32::from(RESIZE));
    while let Some(size) = sizes.recv().await {
        if send_size(&writer, size).await.is_err() {
            return;
        }
    }
}

/// One `{"Width":w,"Height":h}` message on the resize channel.
async fn send_size(writer: &ChannelWriter<WsCmd>, size: TerminalSize) -> std::io::Result<()> {
    let json = serde_json::to_vec(&size).map_err(std::io::Error::other)?;
    writer.send(Bytes::from(json)).await
}

/// The parts of a metav1.Status the protocol uses.
#[derive(Deserialize)]
struct Status {
    #[serde(default)]
    status: String,
    #[serde(default)]
    message: String,
    #[serde(default)]
    reason: String,
    details: Option<Details>,
}

#[derive(Deserialize)]
struct Details {
    #[serde(default)]
    causes: Vec<Cause>,
}

#[derive(Deserialize)]
struct Cause {
    #[serde(default)]
    reason: String,
    #[serde(default)]
    message: String,
}

/// The exit code in the error channel's status, read as client-go reads it.
fn decode_status(protocol: Protocol, raw: &[u8]) -> Result<i32, ClientError> {
    if raw.is_empty() {
        // From v4 on the server always sends a status, success included: its absence means the
        // connection went before the command was done, and an exit code of 0 would be a lie.
        return if protocol >= Protocol::V4 { Err(ClientError::LostConnection) } else { Ok(0) };
    }
    if protocol < Protocol::V4 {
        return Err(ClientError::Remote(String::from_utf8_lossy(raw).into_owned()));
    }
    let status: Status = serde_json::from_slice(raw).map_err(|e| {
        ClientError::ErrorStream(format!("error decoding status {:?}: {e}", String::from_utf8_lossy(raw)))
    })?;
    match status.status.as_str() {
        "Success" => Ok(0),
        "Failure" if status.reason == "NonZeroExitCode" => {
            let details = status.details.ok_or_else(|| ClientError::ErrorStream("details must be set".into()))?;
            let cause = details
                .causes
                .iter()
                .find(|c| c.reason == "ExitCode")
                .ok_or_else(|| ClientError::ErrorStream("no ExitCode cause given".into()))?;
            cause
                .message
                .parse::<i32>()
                .map_err(|_| ClientError::ErrorStream(format!("invalid exit code value {:?}", cause.message)))
        }
        "Failure" => Err(ClientError::Remote(status.message)),
        _ => Err(ClientError::ErrorStream("unknown error".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_success_status_is_exit_code_zero() {
        assert_eq!(decode_status(Protocol::V5, br#"{"metadata":{},"status":"Success"}"#).unwrap(), 0);
    }

    #[test]
    fn a_non_zero_exit_status_yields_its_exit_code_cause() {
        let raw = br#"{"status":"Failure","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"42"}]}}"#;
        assert_eq!(decode_status(Protocol::V4, raw).unwrap(), 42);
        let raw = br#"{"status":"Failure","reason":"NonZeroExitCode","details":{"causes":[]}}"#;
        let err = decode_status(Protocol::V4, raw).unwrap_err();
        assert_eq!(err.to_string(), "error stream protocol error: no ExitCode cause given");
    }

    #[test]
    fn other_failures_carry_the_servers_message() {
        let raw =
            br#"{"status":"Failure","reason":"InternalError","message":"Internal error occurred: boom","code":500}"#;
        assert_eq!(decode_status(Protocol::V5, raw).unwrap_err().to_string(), "Internal error occurred: boom");
    }

    #[test]
    fn a_missing_status_from_v4_on_is_a_lost_connection() {
        assert!(matches!(decode_status(Protocol::V5, b""), Err(ClientError::LostConnection)));
        assert_eq!(decode_status(Protocol::V3, b"").unwrap(), 0);
    }
}
