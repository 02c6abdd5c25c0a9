//! A single-member etcd (Debian's `/usr/bin/etcd`) on free loopback ports in a temp dir.

use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use crate::daemon::{Daemon, free_port, require_binary};

pub const ETCD_BIN: &str = "/usr/bin/etcd";

/// A running etcd; killed and its data deleted on drop.
pub struct Etcd {
    endpoint: String,
    daemon: Daemon,
    dir: tempfile::TempDir,
}

impl Etcd {
    /// Starts etcd and waits until `/health` reports healthy (about a second: it elects itself).
    pub fn start() -> Etcd {
        require_binary(ETCD_BIN, "etcd-server");
        let dir = tempfile::Builder::new().prefix("berth-testenv-etcd.").tempdir().expect("tempdir");
        let log = dir.path().join("etcd.log");
        for _attempt in 0..5 {
            let (client, peer) = (free_port(), free_port());
            let client_url = format!("http://127.0.0.1:{client}");
            let peer_url = format!("http://127.0.0.1:{peer}");
            let data = dir.path().join(format!("data-{client}"));
            let args: Vec<String> = [
                "--name",
                "testenv",
                "--data-dir",
                &data.display().to_string(),
                "--listen-client-urls",
                &client_url,
                "--advertise-client-urls",
                &client_url,
                "--listen-peer-urls",
                &peer_url,
                "--initial-advertise-peer-urls",
                &peer_url,
                "--initial-cluster",
                &format!("testenv={peer_url}"),
                "--logger",
                "zap",
                "--log-level",
                "error",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            let mut daemon = Daemon::spawn(ETCD_BIN, &args, &log, Some(dir.path()));
            let addr: SocketAddr = ([127, 0, 0, 1], client).into();
            let deadline = Instant::now() + Duration::from_secs(30);
            while daemon.exited().is_none() {
                if health_ok(&addr) {
                    return Etcd { endpoint: client_url, daemon, dir };
                }
                if Instant::now() > deadline {
                    panic!("etcd did not become healthy on {addr} within 30 s; log:\n{}", daemon.log());
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            if !daemon.log().contains("address already in use") {
                panic!("etcd exited at start; log:\n{}", daemon.log());
            }
        }
        panic!("etcd: no free ports after 5 attempts; log:\n{}", std::fs::read_to_string(log).unwrap_or_default());
    }

    /// `http://127.0.0.1:PORT`, for `--etcd-servers` or an etcd client.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }
    pub fn log(&self) -> String {
        self.daemon.log()
    }
}

/// `GET /health` over a raw socket, so starting etcd needs no async runtime.
fn health_ok(addr: &SocketAddr) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = TcpStream::connect_timeout(addr, Duration::from_millis(200)) else { return false };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").is_err() {
        return false;
    }
    let mut resp = String::new();
    let _ = s.read_to_string(&mut resp);
    (resp.starts_with("HTTP/1.0 200") || resp.starts_with("HTTP/1.1 200")) && resp.contains("\"health\":\"true\"")
}
