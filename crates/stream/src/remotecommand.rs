//! Exec and attach sessions (kubelet's remotecommand protocol): which streams a client opens for
//! each protocol version, running the backend on them, and the final status on the error stream.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;

use crate::backend::{Backend, BackendError, Streams};
use crate::mux::{self, ChannelWriter, OutFrame};
use crate::spdy::{self, IncomingStream};

/// How long a client has to open every stream it asked for, like kubelet's default.
pub const STREAM_CREATION_TIMEOUT: Duration = Duration::from_secs(30);
/// How long output may keep draining after the backend returned.
const DRAIN_LIMIT: Duration = Duration::from_secs(10);
/// How long the client gets to read the end of a session and hang up itself.
const CLOSE_GRACE: Duration = Duration::from_secs(5);

/// Versions of the remotecommand sub-protocol, oldest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Protocol {
    /// `channel.k8s.io`: no error-stream status on success, no resize.
    V1,
    /// `v2.channel.k8s.io`: the error stream always exists.
    V2,
    /// `v3.channel.k8s.io`: adds the resize stream.
    V3,
    /// `v4.channel.k8s.io`: the error stream carries a JSON metav1.Status.
    V4,
    /// `v5.channel.k8s.io` (WebSocket only): adds the close-channel signal.
    V5,
}

/// SPDY protocol names in the server's order of preference.
pub const SPDY_PROTOCOLS: &[&str] = &["v4.channel.k8s.io", "v3.channel.k8s.io", "v2.channel.k8s.io", "channel.k8s.io"];

impl Protocol {
    pub fn from_name(name: &str) -> Option<Protocol> {
        Some(match name {
            "" | "channel.k8s.io" | "base64.channel.k8s.io" => Protocol::V1,
            "v2.channel.k8s.io" => Protocol::V2,
            "v3.channel.k8s.io" => Protocol::V3,
            "v4.channel.k8s.io" | "v4.base64.channel.k8s.io" => Protocol::V4,
            "v5.channel.k8s.io" => Protocol::V5,
            _ => return None,
        })
    }

    fn supports_resize(self) -> bool {
        self >= Protocol::V3
    }
}

/// What the client asked to run.
#[derive(Debug, Clone)]
pub enum Command {
    Exec { container_id: String, cmd: Vec<String> },
    Attach { container_id: String },
}

/// Which streams the validated CRI request asked for.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

/// The backend's verdict on a session.
pub type Outcome = Result<i32, BackendError>;

/// Runs the command on the backend. Attach is abandoned when `client_gone` resolves first, since
/// it would otherwise last as long as the container.
pub async fn run(
    backend: &Arc<dyn Backend>,
    command: &Command,
    tty: bool,
    streams: Streams,
    client_gone: impl std::future::Future<Output = ()>,
) -> Outcome {
    match command {
        Command::Exec { container_id, cmd } => backend.exec(container_id, cmd.clone(), tty, streams).await,
        Command::Attach { container_id } => {
            tokio::select! {
                r = backend.attach(container_id, tty, streams) => r.map(|()| 0),
                () = client_gone => Ok(0),
            }
        }
    }
}

#[derive(Serialize)]
struct Status<'a> {
    metadata: Empty,
    status: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    details: Option<Details>,
    #[serde(skip_serializing_if = "Option::is_none")]
    code: Option<u16>,
}

#[derive(Serialize)]
struct Empty {}

#[derive(Serialize)]
struct Details {
    causes: Vec<Cause>,
}

#[derive(Serialize)]
struct Cause {
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'static str>,
    message: String,
}

/// What to write on the error stream at the end, if anything: a JSON metav1.Status for v4+,
/// the bare failure message for older versions (which write nothing on success).
pub fn final_status(protocol: Protocol, command: &Command, outcome: &Outcome) -> Option<Bytes> {
    let status = match outcome {
        Ok(0) => {
            Status { metadata: Empty {}, status: "Success", message: None, reason: None, details: None, code: None }
        }
        Ok(code) => {
            let inner = match command {
                Command::Exec { cmd, .. } => format!("error executing command {cmd:?}, exit code {code}"),
                Command::Attach { .. } => format!("exit code {code}"),
            };
            Status {
                metadata: Empty {},
                status: "Failure",
                message: Some(format!("command terminated with non-zero exit code: {inner}")),
                reason: Some("NonZeroExitCode"),
                details: Some(Details { causes: vec![Cause { reason: Some("ExitCode"), message: code.to_string() }] }),
                code: None,
            }
        }
        Err(e) => {
            let inner = match command {
                Command::Exec { .. } => format!("error executing command in container: {e}"),
                Command::Attach { .. } => format!("error attaching to container: {e}"),
            };
            Status {
                metadata: Empty {},
                status: "Failure",
                message: Some(format!("Internal error occurred: {inner}")),
                reason: Some("InternalError"),
                details: Some(Details { causes: vec![Cause { reason: None, message: inner }] }),
                code: Some(500),
            }
        }
    };
    if protocol >= Protocol::V4 {
        return serde_json::to_vec(&status).ok().map(Bytes::from);
    }
    status.message.map(Bytes::from)
}

/// Builds the backend's [`Streams`] from the client's channels; returns them with the output pumps.
#[allow(clippy::type_complexity)]
pub fn backend_streams<C>(
    tx: &mpsc::Sender<C>,
    stdin: Option<Box<dyn AsyncRead + Send + Unpin>>,
    stdout: Option<u32>,
    stderr: Option<u32>,
    resize: Option<Box<dyn AsyncRead + Send + Unpin>>,
) -> (Streams, Vec<tokio::task::JoinHandle<()>>)
where
    C: From<OutFrame> + Send + 'static,
{
    let mut pumps = Vec::new();
    let mut out = |id: Option<u32>| {
        id.map(|id| {
            let (pipe, pump) = mux::output_channel(ChannelWriter::new(tx.clone(), id));
            pumps.push(pump);
            Box::new(pipe) as Box<dyn AsyncWrite + Send + Unpin>
        })
    };
    let streams = Streams { stdin, stdout: out(stdout), stderr: out(stderr), resize: resize.map(mux::resize_events) };
    (streams, pumps)
}

/// Serves one exec/attach session on an upgraded SPDY connection.
pub async fn serve_spdy<IO>(io: IO, protocol: Protocol, command: Command, opts: Options, backend: Arc<dyn Backend>)
where
    IO: AsyncRead + AsyncWrite + Send + 'static,
{
    let (conn, mut incoming) = spdy::Connection::start(io);
    let Some(set) = wait_for_streams(&mut incoming, protocol, opts).await else {
        conn.shutdown(Duration::ZERO).await;
        return;
    };
    // Streams opened later are answered by the connection and otherwise ignored.
    tokio::spawn(async move { while incoming.recv().await.is_some() {} });

    let tx = conn.sender();
    let (streams, pumps) = backend_streams(
        &tx,
        set.stdin.map(|s| Box::new(s.data) as Box<dyn AsyncRead + Send + Unpin>),
        set.stdout.as_ref().map(|s| s.id),
        set.stderr.as_ref().map(|s| s.id),
        set.resize.map(|s| Box::new(s.data) as Box<dyn AsyncRead + Send + Unpin>),
    );
    let outcome = run(&backend, &command, opts.tty, streams, conn.closed()).await;
    if let Err(error) = &outcome {
        tracing::info!(%error, ?command, "stream session failed");
    }
    mux::drain(pumps, DRAIN_LIMIT).await;
    if let Some(error_stream) = set.error {
        let writer = ChannelWriter::new(tx.clone(), error_stream.id);
        if let Some(status) = final_status(protocol, &command, &outcome) {
            let _ = writer.send(status).await;
        }
        let _ = writer.finish().await;
    }
    drop(tx);
    conn.shutdown(CLOSE_GRACE).await;
}

/// The streams a remotecommand client opened.
#[derive(Default)]
struct StreamSet {
    error: Option<IncomingStream>,
    stdin: Option<IncomingStream>,
    stdout: Option<IncomingStream>,
    stderr: Option<IncomingStream>,
    resize: Option<IncomingStream>,
}

/// Collects the streams the request calls for; `None` if the client left or was too slow.
async fn wait_for_streams(
    incoming: &mut mpsc::Receiver<IncomingStream>,
    protocol: Protocol,
    opts: Options,
) -> Option<StreamSet> {
    let want_resize = opts.tty && protocol.supports_resize();
    let mut set = StreamSet::default();
    let complete = |s: &StreamSet| {
        s.error.is_some()
            && (!opts.stdin || s.stdin.is_some())
            && (!opts.stdout || s.stdout.is_some())
            && (!opts.stderr || s.stderr.is_some())
            && (!want_resize || s.resize.is_some())
    };
    let deadline = tokio::time::sleep(STREAM_CREATION_TIMEOUT);
    tokio::pin!(deadline);
    while !complete(&set) {
        let stream = tokio::select! {
            s = incoming.recv() => s?,
            () = &mut deadline => {
                tracing::info!("timed out waiting for client to create streams");
                return None;
            }
        };
        let kind = stream.header("streamtype").unwrap_or_default().to_ascii_lowercase();
        let slot = match kind.as_str() {
            "error" => &mut set.error,
            "stdin" => &mut set.stdin,
            "stdout" => &mut set.stdout,
            "stderr" => &mut set.stderr,
            "resize" => &mut set.resize,
            other => {
                tracing::debug!(stream_type = other, "ignoring stream of unexpected type");
                continue;
            }
        };
        *slot = Some(stream);
    }
    // Drop streams the request did not ask for so their data does not pile up.
    if !opts.stdin {
        set.stdin = None;
    }
    if !want_resize {
        set.resize = None;
    }
    Some(set)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exec() -> Command {
        Command::Exec { container_id: "c".into(), cmd: vec!["sh".into(), "-c".into(), "exit 3".into()] }
    }

    #[test]
    fn v4_success_is_a_bare_success_status() {
        let s = final_status(Protocol::V4, &exec(), &Ok(0)).unwrap();
        assert_eq!(&s[..], br#"{"metadata":{},"status":"Success"}"#);
    }

    #[test]
    fn v4_non_zero_exit_carries_the_exit_code_cause() {
        let s = final_status(Protocol::V4, &exec(), &Ok(3)).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&s).unwrap();
        assert_eq!(v["status"], "Failure");
        assert_eq!(v["reason"], "NonZeroExitCode");
        assert_eq!(v["details"]["causes"][0]["reason"], "ExitCode");
        assert_eq!(v["details"]["causes"][0]["message"], "3");
        assert!(v["message"].as_str().unwrap().starts_with("command terminated with non-zero exit code: "));
    }

    #[test]
    fn older_protocols_write_nothing_on_success_and_the_message_on_failure() {
        assert_eq!(final_status(Protocol::V3, &exec(), &Ok(0)), None);
        let s = final_status(Protocol::V2, &exec(), &Ok(3)).unwrap();
        assert!(std::str::from_utf8(&s).unwrap().starts_with("command terminated with non-zero exit code: "));
    }

    #[test]
    fn backend_failures_become_internal_errors() {
        let s = final_status(Protocol::V4, &exec(), &Err(BackendError::Failed("boom".into()))).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&s).unwrap();
        assert_eq!(v["reason"], "InternalError");
        assert_eq!(v["code"], 500);
        assert!(v["message"].as_str().unwrap().contains("boom"));
    }
}
