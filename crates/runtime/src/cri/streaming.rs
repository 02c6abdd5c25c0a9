//! Exec, Attach and PortForward: the RPCs check the container or sandbox and mint a URL on the
//! streaming server (`berth-stream`, kubelet's SPDY/WebSocket protocols); [`StreamBackend`] then
//! serves the session:
//!
//! - exec: the OCI runtime's `exec` with the container's process (its env, user, cwd) and the
//!   client's command, stdio piped to the client; with a TTY, on a pty of ours (see [`exec_tty`]),
//!   resized as the client asks;
//! - attach: a connection to the container's monitor, which relays its output from now on and
//!   passes input to its stdin (for containers created with `stdin`), until it exits;
//! - port-forward: a TCP connection to `localhost:port` made from inside the pod's network
//!   namespace (a short-lived thread enters it, so no pooled thread ever changes namespace).

use std::path::Path;
use std::sync::{Arc, Weak};
use std::time::Duration;

use berth_oci::ExecOptions;
use berth_stream::{AsyncStream, Backend, BackendError, Streams};
use k8s_cri::v1 as cri;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{Cri, Error};
use crate::state::{ContainerRecord, ContainerState};

impl Cri {
    pub fn exec(&self, req: cri::ExecRequest) -> Result<cri::ExecResponse, Error> {
        let record = self.running(&req.container_id)?;
        let req = cri::ExecRequest { container_id: record.id, ..req };
        self.stream()?.get_exec(req).map_err(Error::Stream)
    }

    pub fn attach(&self, req: cri::AttachRequest) -> Result<cri::AttachResponse, Error> {
        let record = self.running(&req.container_id)?;
        let req = cri::AttachRequest { container_id: record.id, ..req };
        self.stream()?.get_attach(req).map_err(Error::Stream)
    }

    pub fn port_forward(&self, req: cri::PortForwardRequest) -> Result<cri::PortForwardResponse, Error> {
        let sandbox = self.store.sandbox(&req.pod_sandbox_id)?;
        if sandbox.state() != crate::state::SandboxState::Ready {
            return Err(Error::FailedPrecondition(format!("pod sandbox {} is not ready", sandbox.id)));
        }
        let req = cri::PortForwardRequest { pod_sandbox_id: sandbox.id, ..req };
        self.stream()?.get_port_forward(req).map_err(Error::Stream)
    }

    fn stream(&self) -> Result<&berth_stream::StreamServer, Error> {
        self.stream.get().ok_or_else(|| Error::FailedPrecondition("the streaming server is not running".into()))
    }

    /// The container, which must be running.
    pub(crate) fn running(&self, id: &str) -> Result<ContainerRecord, Error> {
        let record = self.store.container(id)?;
        if record.state() != ContainerState::Running {
            return Err(Error::FailedPrecondition(format!(
                "container {} is {}, not running",
                record.id,
                record.state().as_str()
            )));
        }
        Ok(record)
    }
}

/// The streaming server's view of the runtime. Weak, so that the server (owned by [`Cri`]) does
/// not keep the runtime alive.
pub(crate) struct StreamBackend(pub(crate) Weak<Cri>);

impl StreamBackend {
    fn cri(&self) -> Result<Arc<Cri>, BackendError> {
        self.0.upgrade().ok_or_else(|| BackendError::Failed("the runtime is shutting down".into()))
    }
}

fn failed(e: impl std::fmt::Display) -> BackendError {
    BackendError::Failed(e.to_string())
}

fn lookup(cri: &Cri, id: &str) -> Result<ContainerRecord, BackendError> {
    match cri.running(id) {
        Ok(r) => Ok(r),
        Err(Error::State(crate::state::StateError::NotFound { .. })) => Err(BackendError::NotFound(id.to_string())),
        Err(e) => Err(failed(e)),
    }
}

#[async_trait::async_trait]
impl Backend for StreamBackend {
    async fn exec(
        &self,
        container_id: &str,
        cmd: Vec<String>,
        tty: bool,
        mut streams: Streams,
    ) -> Result<i32, BackendError> {
        let cri = self.cri()?;
        let record = lookup(&cri, container_id)?;
        // Clients send their terminal size first: the process starts at it.
        let first_size = match streams.resize.as_mut() {
            Some(sizes) if tty => tokio::time::timeout(FIRST_SIZE_WAIT, sizes.recv()).await.ok().flatten(),
            _ => None,
        };
        let (process_file, pid_file) = cri.exec_process_file(&record, &cmd, tty, first_size).map_err(failed)?;
        let handler = cri.handler(&record.handler).map_err(failed)?;
        let runtime = handler.oci();
        let result = if tty {
            exec_tty(&record, runtime, &process_file, &pid_file, first_size, streams).await
        } else {
            let args = runtime.exec_args(&record.id, &ExecOptions::new(&process_file).pid_file(&pid_file));
            exec_piped(args, streams).await
        };
        let _ = std::fs::remove_file(&process_file);
        let _ = std::fs::remove_file(&pid_file);
        result
    }

    async fn attach(&self, container_id: &str, _tty: bool, mut streams: Streams) -> Result<(), BackendError> {
        let cri = self.cri()?;
        let record = lookup(&cri, container_id)?;
        let socket = super::container::attach_socket(&record.id);
        let conn = tokio::net::UnixStream::connect(&socket)
            .await
            .map_err(|e| failed(format!("attaching to container {} ({}): {e}", record.id, socket.display())))?;
        // The client's terminal size goes to the container's terminal, which its monitor holds.
        let resizer = match (streams.resize.take(), record.monitor_pid) {
            (Some(mut sizes), Some(monitor_pid)) => {
                let state_dir = crate::reality::monitor_dir(cri.store.root(), &record.id);
                Some(tokio::spawn(async move {
                    while let Some(size) = sizes.recv().await {
                        if let Err(e) = berth_monitor::resize(&state_dir, monitor_pid, size.width, size.height) {
                            tracing::debug!(error = %e, "terminal not resized");
                        }
                    }
                }))
            }
            _ => None,
        };
        let result = attach_session(conn, streams).await;
        if let Some(task) = resizer {
            task.abort();
        }
        result
    }

    async fn port_forward(&self, pod_sandbox_id: &str, port: u16) -> Result<Box<dyn AsyncStream>, BackendError> {
        let cri = self.cri()?;
        let sandbox = match cri.store.sandbox(pod_sandbox_id) {
            Ok(s) => s,
            Err(_) => return Err(BackendError::NotFound(pod_sandbox_id.to_string())),
        };
        let netns = sandbox.netns_path.clone();
        let (tx, rx) = tokio::sync::oneshot::channel();
        // A thread of its own: entering a namespace is for the rest of the thread's life.
        std::thread::spawn(move || {
            let result = (|| -> std::io::Result<std::net::TcpStream> {
                if let Some(netns) = &netns {
                    let file = std::fs::File::open(netns)?;
                    nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)?;
                }
                let stream = std::net::TcpStream::connect_timeout(
                    &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
                    Duration::from_secs(10),
                )?;
                stream.set_nonblocking(true)?;
                Ok(stream)
            })();
            let _ = tx.send(result);
        });
        let stream = rx.await.map_err(failed)?.map_err(|e| {
            BackendError::Failed(format!("connecting to port {port} in pod sandbox {}: {e}", sandbox.id))
        })?;
        let stream = tokio::net::TcpStream::from_std(stream).map_err(failed)?;
        Ok(Box::new(stream))
    }
}

/// `runtime exec` with pipes: the client's stdin (if any) in, stdout and stderr out.
async fn exec_piped(args: Vec<std::ffi::OsString>, streams: Streams) -> Result<i32, BackendError> {
    use std::process::Stdio;
    let mut command = tokio::process::Command::new(&args[0]);
    command
        .args(&args[1..])
        .stdin(if streams.stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = command.spawn().map_err(|e| failed(format!("starting exec: {e}")))?;
    let stdin_task = match (streams.stdin, child.stdin.take()) {
        (Some(mut from), Some(mut to)) => Some(tokio::spawn(async move {
            let _ = tokio::io::copy(&mut from, &mut to).await;
            let _ = to.shutdown().await;
        })),
        _ => None,
    };
    let out = copy_out(child.stdout.take(), streams.stdout);
    let err = copy_out(child.stderr.take(), streams.stderr);
    let (_, _, status) = tokio::join!(out, err, child.wait());
    if let Some(task) = stdin_task {
        task.abort();
    }
    let status = status.map_err(failed)?;
    Ok(status.code().unwrap_or(128 + std::os::unix::process::ExitStatusExt::signal(&status).unwrap_or(0)))
}

/// Copies a child's pipe to the client's writer (or drains it when the client wants none).
async fn copy_out(
    from: Option<impl tokio::io::AsyncRead + Unpin>,
    to: Option<Box<dyn tokio::io::AsyncWrite + Send + Unpin>>,
) {
    let Some(mut from) = from else { return };
    match to {
        Some(mut to) => {
            let _ = tokio::io::copy(&mut from, &mut to).await;
            let _ = to.shutdown().await;
        }
        None => {
            let _ = tokio::io::copy(&mut from, &mut tokio::io::sink()).await;
        }
    }
}

/// How long a terminal exec waits for the client's first terminal size before it starts.
const FIRST_SIZE_WAIT: Duration = Duration::from_millis(200);

/// `runtime exec` of a terminal process, run by `setsid --ctty` on a pty of ours: the OCI
/// runtime sees a terminal on its stdio, allocates the container's pty and relays it (runc refuses
/// a console socket unless it detaches, and a detached exec's exit code would be lost), and a
/// resize of our side reaches it as SIGWINCH, which it passes on.
async fn exec_tty(
    record: &ContainerRecord,
    runtime: &berth_oci::OciRuntime,
    process_file: &Path,
    pid_file: &Path,
    first_size: Option<berth_stream::TerminalSize>,
    streams: Streams,
) -> Result<i32, BackendError> {
    let pty = nix::pty::openpty(None, None).map_err(|e| failed(format!("allocating a terminal: {e}")))?;
    let master = pty.master;
    let set_size = |master: &std::os::fd::OwnedFd, size: berth_stream::TerminalSize| {
        let ws = rustix::termios::Winsize { ws_row: size.height, ws_col: size.width, ws_xpixel: 0, ws_ypixel: 0 };
        let _ = rustix::termios::tcsetwinsize(master, ws);
    };
    // The process spec carries the first size too: the OCI runtime copies ours only after the
    // process started.
    if let Some(first) = first_size {
        set_size(&master, first);
    }
    let slave = std::fs::File::from(pty.slave);
    let args = runtime.exec_args(&record.id, &ExecOptions::new(process_file).pid_file(pid_file));
    let mut child = tokio::process::Command::new("setsid")
        .arg("--ctty")
        .args(&args)
        .stdin(slave.try_clone().map_err(failed)?)
        .stdout(slave.try_clone().map_err(failed)?)
        .stderr(slave)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| failed(format!("starting exec: {e}")))?;

    let mut reader = tokio::fs::File::from_std(std::fs::File::from(master.try_clone().map_err(failed)?));
    let mut writer = tokio::fs::File::from_std(std::fs::File::from(master.try_clone().map_err(failed)?));
    if let Some(mut resize) = streams.resize {
        let master = master.try_clone().map_err(failed)?;
        tokio::spawn(async move {
            while let Some(size) = resize.recv().await {
                set_size(&master, size);
            }
        });
    }
    let input = streams.stdin.map(|mut stdin| {
        tokio::spawn(async move {
            let _ = tokio::io::copy(&mut stdin, &mut writer).await;
        })
    });
    let mut stdout = streams.stdout;
    let output = async {
        let mut buf = vec![0u8; 32 * 1024];
        // EIO once the last holder of the terminal's other side is gone.
        while let Ok(n) = reader.read(&mut buf).await {
            if n == 0 {
                break;
            }
            if let Some(out) = stdout.as_mut()
                && out.write_all(&buf[..n]).await.is_err()
            {
                break;
            }
        }
    };
    // The terminal's output may trail the process's exit by a moment.
    let status = {
        tokio::pin!(output);
        let mut output_done = false;
        let status = tokio::select! {
            status = child.wait() => status,
            () = &mut output => {
                output_done = true;
                child.wait().await
            }
        };
        tracing::debug!(container = %record.id, ?status, "tty exec ended");
        // A finished future must not be polled again.
        if !output_done {
            let _ = tokio::time::timeout(Duration::from_millis(200), &mut output).await;
        }
        status
    };
    tracing::debug!(container = %record.id, "tty exec output drained");
    drop(master);
    if let Some(mut out) = stdout {
        let _ = out.shutdown().await;
    }
    if let Some(task) = input {
        task.abort();
    }
    let status = status.map_err(failed)?;
    Ok(status.code().unwrap_or(128 + std::os::unix::process::ExitStatusExt::signal(&status).unwrap_or(0)))
}

/// Bridges a client to the container's monitor (see `berth_monitor::attach`): the client's
/// stdin to the socket, output frames to the client's stdout and stderr, until the exit frame or
/// the monitor's end.
async fn attach_session(conn: tokio::net::UnixStream, streams: Streams) -> Result<(), BackendError> {
    use berth_monitor::attach::{Frame, parse_frame};
    let (mut from_monitor, mut to_monitor) = conn.into_split();
    let input = streams.stdin.map(|mut stdin| {
        tokio::spawn(async move {
            let _ = tokio::io::copy(&mut stdin, &mut to_monitor).await;
            // Half-close: the monitor decides what the end of this client's input means.
            let _ = to_monitor.shutdown().await;
        })
    });
    let (mut stdout, mut stderr) = (streams.stdout, streams.stderr);
    let mut buf = Vec::with_capacity(64 * 1024);
    let mut chunk = vec![0u8; 32 * 1024];
    'session: loop {
        while let Some((frame, used)) = parse_frame(&buf).map_err(failed)? {
            buf.drain(..used);
            let (target, data) = match frame {
                Frame::Stdout(data) => (stdout.as_mut(), data),
                // Without a stderr stream (a terminal) stderr goes to stdout.
                Frame::Stderr(data) => (stderr.as_mut().or(stdout.as_mut()), data),
                Frame::Exit(_) => break 'session,
            };
            if let Some(w) = target
                && w.write_all(&data).await.is_err()
            {
                break 'session;
            }
        }
        match from_monitor.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    if let Some(task) = input {
        task.abort();
    }
    for w in [stdout.as_mut(), stderr.as_mut()].into_iter().flatten() {
        let _ = w.shutdown().await;
    }
    Ok(())
}
