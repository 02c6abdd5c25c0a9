//! The seam for the streaming client: exec, attach and port-forward speak the Kubernetes
//! streaming protocol to the URL the runtime returns. The client (crate `berth-stream`) is not
//! here yet; until it is, these fail with a clear message and `exec` without `-i`/`-t` falls
//! back to ExecSync.

use anyhow::bail;

/// Whether the functions below can stream; flip when the client lands.
pub const SUPPORTED: bool = false;

/// The runtime's URL made absolute as crictl does: a bare path is on the kubelet's default
/// streaming address.
pub fn resolve_url(url: &str) -> String {
    if url.contains("://") {
        url.to_string()
    } else {
        format!("http://127.0.0.1:10250/{}", url.trim_start_matches('/'))
    }
}

/// Runs an exec session at `url`: stdin forwarded if `stdin`, a raw terminal if `tty`; the
/// command's exit code.
pub async fn stream_exec(url: &str, stdin: bool, tty: bool) -> anyhow::Result<i32> {
    let _ = (stdin, tty);
    bail!("interactive exec is not supported yet (the runtime's stream is at {})", resolve_url(url))
}

/// Attaches to a container's stdio at `url`.
pub async fn stream_attach(url: &str, stdin: bool, tty: bool) -> anyhow::Result<()> {
    let _ = (stdin, tty);
    bail!("attach is not supported yet (the runtime's stream is at {})", resolve_url(url))
}

/// Forwards each (local, remote) port pair through the session at `url` until interrupted.
pub async fn port_forward(url: &str, ports: &[(u16, u16)]) -> anyhow::Result<()> {
    let _ = ports;
    bail!("port forwarding is not supported yet (the runtime's stream is at {})", resolve_url(url))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_paths_resolve_to_the_kubelet_streaming_address() {
        assert_eq!(resolve_url("/exec/abc"), "http://127.0.0.1:10250/exec/abc");
        assert_eq!(resolve_url("http://10.0.0.1:3000/exec/abc"), "http://10.0.0.1:3000/exec/abc");
    }
}
