//! The seam between the streaming server and the container runtime that actually runs processes.

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;

/// What the server needs from the runtime; implemented by the CRI runtime.
#[async_trait::async_trait]
pub trait Backend: Send + Sync + 'static {
    /// Runs `cmd` in the container with the given streams; returns the exit code.
    async fn exec(
        &self,
        container_id: &str,
        cmd: Vec<String>,
        tty: bool,
        streams: Streams,
    ) -> Result<i32, BackendError>;

    /// Attaches to the container's main process stdio until it exits or the client goes.
    async fn attach(&self, container_id: &str, tty: bool, streams: Streams) -> Result<(), BackendError>;

    /// Connects to `port` on localhost inside the pod sandbox's network namespace and returns the connection.
    async fn port_forward(&self, pod_sandbox_id: &str, port: u16) -> Result<Box<dyn AsyncStream>, BackendError>;
}

/// A bidirectional byte stream, such as a TCP connection into a pod.
pub trait AsyncStream: AsyncRead + AsyncWrite + Send + Unpin {}

impl<T: AsyncRead + AsyncWrite + Send + Unpin> AsyncStream for T {}

/// The client's streams handed to the backend for one exec or attach.
///
/// `stdin` ends (reads EOF) when the client closes it or goes away; writes to `stdout`/`stderr`
/// fail once the client is gone. Dropping a writer ends that stream for the client.
#[derive(Default)]
pub struct Streams {
    pub stdin: Option<Box<dyn AsyncRead + Send + Unpin>>,
    pub stdout: Option<Box<dyn AsyncWrite + Send + Unpin>>,
    /// `None` when a TTY is requested: the terminal merges stderr into stdout.
    pub stderr: Option<Box<dyn AsyncWrite + Send + Unpin>>,
    /// Terminal size changes from the client; only with a TTY.
    pub resize: Option<mpsc::Receiver<TerminalSize>>,
}

impl std::fmt::Debug for Streams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Streams")
            .field("stdin", &self.stdin.is_some())
            .field("stdout", &self.stdout.is_some())
            .field("stderr", &self.stderr.is_some())
            .field("resize", &self.resize.is_some())
            .finish()
    }
}

/// A terminal size in character cells, as the client reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
pub struct TerminalSize {
    #[serde(rename = "Width")]
    pub width: u16,
    #[serde(rename = "Height")]
    pub height: u16,
}

/// Why the backend could not serve a stream request.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The container or sandbox does not exist (any more).
    #[error("not found: {0}")]
    NotFound(String),
    /// The runtime failed to start or run the process, or to connect to the port.
    #[error("{0}")]
    Failed(String),
}
