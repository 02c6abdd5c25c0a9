//! A throwaway single-member etcd in a temp dir on free loopback ports.

use std::io::Write;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

pub struct EtcdServer {
    pub endpoint: String,
    child: Child,
    stdin: Option<ChildStdin>,
    dir: tempfile::TempDir,
}

fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl EtcdServer {
    /// Starts etcd and returns once it answers a status request.
    pub async fn start(binary: &Path) -> anyhow::Result<Self> {
        if !binary.exists() {
            bail!("no etcd at {} (Debian: apt-get install etcd-server)", binary.display());
        }
        let dir = tempfile::tempdir()?;
        let (client, peer) = (free_port()?, free_port()?);
        let client_url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let log = std::fs::File::create(dir.path().join("etcd.log"))?;
        // etcd runs under a shell that kills it when its stdin closes, so it also goes away
        // when the benchmark dies without running Drop.
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(r#""$0" "$@" & pid=$!; read _ignored; kill $pid; wait $pid"#)
            .arg(binary)
            .args(["--name", "bench", "--data-dir"])
            .arg(dir.path().join("data"))
            .args(["--listen-client-urls", &client_url, "--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("bench={peer_url}")])
            .args(["--logger", "zap", "--log-level", "error"])
            .args(berth_testenv::etcd::PROGRESS_NOTIFY_ARGS)
            .stdin(Stdio::piped())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let stdin = child.stdin.take();
        let server = Self { endpoint: client_url, child, stdin, dir };
        server.wait_healthy().await?;
        Ok(server)
    }

    /// etcd's own pid (the shell's child), for its memory and CPU.
    pub fn pid(&self) -> Option<u32> {
        let shell = self.child.id();
        let children = std::fs::read_to_string(format!("/proc/{shell}/task/{shell}/children")).ok()?;
        children.split_whitespace().next()?.parse().ok()
    }

    async fn wait_healthy(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let attempt = tokio::time::timeout(Duration::from_secs(2), async {
                let mut c = etcd_client::Client::connect([self.endpoint.as_str()], None).await?;
                c.status().await
            })
            .await;
            match attempt {
                Ok(Ok(_)) => return Ok(()),
                _ if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(100)).await,
                _ => {
                    let log = std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default();
                    bail!("etcd at {} did not become healthy in 30 s:\n{log}", self.endpoint);
                }
            }
        }
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        // EOF on the shell's stdin stops etcd; then reap the shell.
        if let Some(mut stdin) = self.stdin.take() {
            let _ = stdin.flush();
        }
        let _ = self.child.wait();
    }
}
