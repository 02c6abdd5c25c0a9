//! The streaming client on this process's terminal: exec and attach run a session at the URL the
//! runtime returns (`berth_stream::client`, WebSocket) with our stdin, stdout and stderr, and with
//! `-t` a raw terminal whose size follows ours; port-forward listens locally and forwards each
//! connection over one SPDY connection.
//!
//! As crictl v1.29: `-t` needs `-i` and a terminal on stdin; with a terminal, ctrl-p ctrl-q ends
//! the input. Unlike crictl, which reports a streamed command's non-zero exit code as an error
//! and exits with 1, the command's exit code becomes ours (as with `exec -s`, and as kubectl does).

use std::io::Read;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use anyhow::{anyhow, bail};
use berth_stream::TerminalSize;
use berth_stream::client::{CommandIo, ForwardEvent, PortForwarder, run_command};
use rustix::termios::{OptionalActions, Termios};
use tokio::io::{AsyncRead, ReadBuf};
use tokio::net::TcpListener;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;

/// crictl's detach keys (`ctrl-p,ctrl-q`): typed on a terminal, they end the input.
const DETACH_KEYS: [u8; 2] = [0x10, 0x11];

/// The runtime's URL made absolute as crictl does: a bare path is on the kubelet's default
/// streaming address.
pub fn resolve_url(url: &str) -> String {
    if url.contains("://") {
        url.to_string()
    } else {
        format!("http://127.0.0.1:10250/{}", url.trim_start_matches('/'))
    }
}

/// Runs an exec or attach session at `url`: our stdin forwarded if `stdin`, a raw terminal if
/// `tty`; the command's exit code.
pub async fn stream_command(url: &str, stdin: bool, tty: bool) -> anyhow::Result<i32> {
    if tty && !stdin {
        bail!("tty=true must be specified with interactive=true");
    }
    if tty && !rustix::termios::isatty(std::io::stdin()) {
        bail!("input is not a terminal");
    }
    let url = resolve_url(url);
    let mut io = CommandIo {
        stdin: stdin.then(|| Box::new(StdinReader::start(tty)) as _),
        stdout: Some(Box::new(tokio::io::stdout())),
        // A terminal merges stderr into stdout.
        stderr: (!tty).then(|| Box::new(tokio::io::stderr()) as _),
        resize: None,
    };
    if !tty {
        return Ok(run_command(&url, io).await?);
    }

    let (sizes_tx, sizes) = mpsc::channel(8);
    if let Some(size) = terminal_size() {
        let _ = sizes_tx.try_send(size);
    }
    io.resize = Some(sizes);
    let mut window_changes = signal(SignalKind::window_change())?;
    let resizer = tokio::spawn(async move {
        while window_changes.recv().await.is_some() {
            if let Some(size) = terminal_size()
                && sizes_tx.send(size).await.is_err()
            {
                return;
            }
        }
    });
    let (mut terminate, mut hangup, mut interrupt) =
        (signal(SignalKind::terminate())?, signal(SignalKind::hangup())?, signal(SignalKind::interrupt())?);
    let raw = RawTerminal::enter()?;
    let outcome = tokio::select! {
        r = run_command(&url, io) => r.map_err(anyhow::Error::from),
        _ = terminate.recv() => Err(anyhow!("terminated")),
        _ = hangup.recv() => Err(anyhow!("hung up")),
        _ = interrupt.recv() => Err(anyhow!("interrupted")),
    };
    drop(raw);
    resizer.abort();
    outcome
}

/// Forwards each (local, remote) port pair through the session at `url` until interrupted
/// (SIGINT or SIGTERM, a clean end) or until the connection to the runtime is lost.
pub async fn port_forward(url: &str, ports: &[(u16, u16)]) -> anyhow::Result<()> {
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    let forwarder = Arc::new(PortForwarder::connect(&resolve_url(url)).await?);
    let mut listeners = Vec::new();
    for &(local, remote) in ports {
        match listen(local).await {
            Ok(bound) => {
                for listener in bound {
                    println!("Forwarding from {} -> {remote}", listener.local_addr()?);
                    listeners.push((listener, remote));
                }
            }
            Err(e) => eprintln!("Unable to listen on port {local}: {e}"),
        }
    }
    if listeners.is_empty() {
        let specs: Vec<String> = ports.iter().map(|(l, r)| format!("{{{l} {r}}}")).collect();
        bail!("unable to listen on any of the requested ports: [{}]", specs.join(" "));
    }
    let report: Arc<dyn Fn(ForwardEvent) + Send + Sync> = Arc::new(|event| match event {
        ForwardEvent::Connection { local, .. } => println!("Handling connection for {}", local.port()),
        ForwardEvent::Failed { local, remote, error } => {
            eprintln!("an error occurred forwarding {} -> {remote}: {error}", local.port());
        }
    });
    let serving: Vec<_> = listeners
        .into_iter()
        .map(|(listener, remote)| tokio::spawn(forwarder.clone().serve(listener, remote, report.clone())))
        .collect();
    let outcome = tokio::select! {
        () = forwarder.closed() => Err(anyhow!("lost connection to pod")),
        _ = interrupt.recv() => Ok(()),
        _ = terminate.recv() => Ok(()),
    };
    for task in serving {
        task.abort();
    }
    outcome
}

/// Listeners on localhost as kubectl makes them: 127.0.0.1 and ::1, on one port (the one the
/// first picked when `port` is 0); an error only if neither could be had.
async fn listen(port: u16) -> anyhow::Result<Vec<TcpListener>> {
    let mut port = port;
    let mut listeners = Vec::new();
    let mut errors = Vec::new();
    for ip in [std::net::IpAddr::from([127, 0, 0, 1]), std::net::IpAddr::from(std::net::Ipv6Addr::LOCALHOST)] {
        let addr = std::net::SocketAddr::new(ip, port);
        match TcpListener::bind(addr).await {
            Ok(listener) => {
                port = listener.local_addr()?.port();
                listeners.push(listener);
            }
            Err(e) => errors.push(format!("unable to create listener: Error listen tcp {addr}: {e}")),
        }
    }
    if listeners.is_empty() {
        bail!("failed to create listener: Error [{}]", errors.join(" "));
    }
    Ok(listeners)
}

/// Our terminal's size: stdout's, as kubectl takes it, else stdin's.
fn terminal_size() -> Option<TerminalSize> {
    let of = |size: rustix::io::Result<rustix::termios::Winsize>| {
        size.ok().filter(|s| s.ws_col > 0 && s.ws_row > 0).map(|s| TerminalSize { width: s.ws_col, height: s.ws_row })
    };
    of(rustix::termios::tcgetwinsize(std::io::stdout())).or_else(|| of(rustix::termios::tcgetwinsize(std::io::stdin())))
}

/// Stdin in raw mode for the life of the value: keys go to the remote terminal as typed.
struct RawTerminal {
    saved: Termios,
}

impl RawTerminal {
    fn enter() -> anyhow::Result<RawTerminal> {
        let stdin = std::io::stdin();
        let saved = rustix::termios::tcgetattr(&stdin)?;
        let mut raw = saved.clone();
        raw.make_raw();
        rustix::termios::tcsetattr(&stdin, OptionalActions::Now, &raw)?;
        Ok(RawTerminal { saved })
    }
}

impl Drop for RawTerminal {
    fn drop(&mut self) {
        let _ = rustix::termios::tcsetattr(std::io::stdin(), OptionalActions::Now, &self.saved);
    }
}

/// Our stdin, read on a thread of its own: a blocking read cannot be cancelled, and on tokio's
/// blocking pool it would hold up the end of the process until the next key or line.
struct StdinReader {
    rx: mpsc::Receiver<Vec<u8>>,
    pending: Vec<u8>,
    offset: usize,
}

impl StdinReader {
    /// Starts reading; with `detach_keys`, the input ends where ctrl-p ctrl-q is typed.
    fn start(detach_keys: bool) -> StdinReader {
        let (tx, rx) = mpsc::channel(4);
        std::thread::spawn(move || {
            let mut stdin = std::io::stdin().lock();
            let mut detach = detach_keys.then(DetachKeys::default);
            let mut buf = vec![0u8; 32 * 1024];
            loop {
                let n = match stdin.read(&mut buf) {
                    Ok(0) => return,
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(_) => return,
                };
                let mut data = Vec::with_capacity(n);
                let detached = match detach.as_mut() {
                    Some(keys) => keys.filter(&buf[..n], &mut data),
                    None => {
                        data.extend_from_slice(&buf[..n]);
                        false
                    }
                };
                if !data.is_empty() && tx.blocking_send(data).is_err() {
                    return;
                }
                if detached {
                    return;
                }
            }
        });
        StdinReader { rx, pending: Vec::new(), offset: 0 }
    }
}

impl AsyncRead for StdinReader {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        while self.offset == self.pending.len() {
            match ready!(self.rx.poll_recv(cx)) {
                Some(chunk) => {
                    self.pending = chunk;
                    self.offset = 0;
                }
                None => return Poll::Ready(Ok(())),
            }
        }
        let n = (self.pending.len() - self.offset).min(buf.remaining());
        let start = self.offset;
        buf.put_slice(&self.pending[start..start + n]);
        self.offset += n;
        Poll::Ready(Ok(()))
    }
}

/// Watches typed input for [`DETACH_KEYS`], holding back a partial match until it is decided.
#[derive(Default)]
struct DetachKeys {
    matched: usize,
}

impl DetachKeys {
    /// Appends to `out` what should pass; true once the whole sequence was typed (what followed
    /// it is dropped).
    fn filter(&mut self, input: &[u8], out: &mut Vec<u8>) -> bool {
        for &byte in input {
            if byte == DETACH_KEYS[self.matched] {
                self.matched += 1;
                if self.matched == DETACH_KEYS.len() {
                    return true;
                }
                continue;
            }
            out.extend_from_slice(&DETACH_KEYS[..self.matched]);
            self.matched = usize::from(byte == DETACH_KEYS[0]);
            if self.matched == 0 {
                out.push(byte);
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_paths_resolve_to_the_kubelet_streaming_address() {
        assert_eq!(resolve_url("/exec/abc"), "http://127.0.0.1:10250/exec/abc");
        assert_eq!(resolve_url("http://10.0.0.1:3000/exec/abc"), "http://10.0.0.1:3000/exec/abc");
    }

    #[test]
    fn ctrl_p_ctrl_q_ends_the_input_and_keeps_what_came_before() {
        let mut keys = DetachKeys::default();
        let mut out = Vec::new();
        assert!(keys.filter(b"ls\r\x10\x11after", &mut out));
        assert_eq!(out, b"ls\r");
    }

    #[test]
    fn a_sequence_split_across_reads_is_still_seen() {
        let mut keys = DetachKeys::default();
        let mut out = Vec::new();
        assert!(!keys.filter(b"a\x10", &mut out));
        assert_eq!(out, b"a", "a possible start is held back");
        assert!(keys.filter(b"\x11", &mut out));
        assert_eq!(out, b"a");
    }

    #[test]
    fn ctrl_p_alone_passes_once_the_next_key_is_not_ctrl_q() {
        let mut keys = DetachKeys::default();
        let mut out = Vec::new();
        assert!(!keys.filter(b"\x10x\x10\x10", &mut out));
        assert_eq!(out, b"\x10x\x10", "the last ctrl-p is still held back");
        assert!(!keys.filter(b"y", &mut out));
        assert_eq!(out, b"\x10x\x10\x10y");
    }
}
