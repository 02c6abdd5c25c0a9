//! A single-member etcd (Debian's `/usr/bin/etcd`) on free loopback ports in a temp dir.

use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use crate::daemon::{Daemon, free_port, require_binary};

pub const ETCD_BIN: &str = "/usr/bin/etcd";

/// etcd's periodic progress notifications every second instead of every 10 minutes. Debian's
/// etcd 3.4 cannot be asked for progress safely, so a watch of a quiet prefix learns the store's
/// revision only from these.
pub const PROGRESS_NOTIFY_ARGS: [&str; 2] = ["--experimental-watch-progress-notify-interval", "1s"];

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
                PROGRESS_NOTIFY_ARGS[0],
                PROGRESS_NOTIFY_ARGS[1],
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

/// `POST path` with body `{}` over a raw socket (etcd 3.4 serves its gRPC gateway on the client
/// port), for the JSON answer; `None` unless it answered 200.
fn post_json(addr: &SocketAddr, path: &str) -> Option<serde_json::Value> {
    use std::io::{Read, Write};
    let mut s = TcpStream::connect_timeout(addr, Duration::from_millis(200)).ok()?;
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let req = format!(
        "POST {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{{}}"
    );
    s.write_all(req.as_bytes()).ok()?;
    let mut resp = String::new();
    let _ = s.read_to_string(&mut resp);
    if !(resp.starts_with("HTTP/1.0 200") || resp.starts_with("HTTP/1.1 200")) {
        return None;
    }
    serde_json::from_str(resp.split_once("\r\n\r\n")?.1).ok()
}

/// A member's `(own member id, leader's member id)` from `/v3/maintenance/status`; the gateway
/// writes uint64s as decimal strings, and a leader of 0 means the member knows of none.
fn member_status(addr: &SocketAddr) -> Option<(u64, u64)> {
    let v = post_json(addr, "/v3/maintenance/status")?;
    let id = |v: &serde_json::Value| v.as_str().and_then(|s| s.parse::<u64>().ok());
    Some((id(&v["header"]["member_id"])?, id(&v["leader"])?))
}

/// One member of an [`EtcdCluster`]: its process while it runs, and what restarting it needs.
struct Member {
    /// `None` once killed (the daemon was SIGKILLed and reaped).
    daemon: Option<Daemon>,
    args: Vec<String>,
    client: SocketAddr,
    endpoint: String,
    log: std::path::PathBuf,
    /// Raft member id, read from the member itself at start; stable across restarts (it lives in
    /// the data dir).
    id: u64,
}

/// N etcd members on free loopback ports in one temp dir, each under its own [`Daemon`] (so
/// they die with the test process) and logging to `etcd-<i>.log` there; killed and deleted on
/// drop. For tests of what berth does when etcd members die, lose the leader or lose quorum.
///
/// Members run with etcd's default timing spelled out, `--heartbeat-interval 100
/// --election-timeout 1000` (ms): a new leader takes a bit over a second after the leader dies.
pub struct EtcdCluster {
    // Declared before `dir`, so the members are reaped before their data is deleted.
    members: Vec<Member>,
    dir: tempfile::TempDir,
}

impl EtcdCluster {
    /// Starts `members` members bootstrapped statically (`--initial-cluster` of all, state `new`,
    /// a token unique to this cluster) and waits until every member's `/health` is healthy, which
    /// needs an elected leader; panics with the log tails after 30 s. If a port was taken meanwhile
    /// (`free_port` releases it before etcd binds it), starts all members again on new ports.
    pub fn start(members: usize) -> EtcdCluster {
        assert!(members > 0, "an etcd cluster needs at least one member");
        require_binary(ETCD_BIN, "etcd-server");
        let name = |i: usize| format!("member-{i}");
        for _attempt in 0..5 {
            // A temp dir per attempt: a failed attempt's cluster is dropped whole.
            let dir = tempfile::Builder::new().prefix("berth-testenv-etcd-cluster.").tempdir().expect("tempdir");
            // Distinct ports: free_port may hand out a released port again.
            let mut ports: Vec<u16> = Vec::new();
            while ports.len() < 2 * members {
                let p = free_port();
                if !ports.contains(&p) {
                    ports.push(p);
                }
            }
            let peer_url = |i: usize| format!("http://127.0.0.1:{}", ports[2 * i + 1]);
            let initial_cluster: Vec<String> = (0..members).map(|i| format!("{}={}", name(i), peer_url(i))).collect();
            let initial_cluster = initial_cluster.join(",");
            // The temp dir's name: unique to this cluster on this host.
            let token = dir.path().file_name().expect("temp dir name").to_string_lossy().replace('.', "-");
            let mut cluster = EtcdCluster { members: Vec::new(), dir };
            for i in 0..members {
                let client = ports[2 * i];
                let client_url = format!("http://127.0.0.1:{client}");
                let data = cluster.dir.path().join(format!("data-{i}"));
                let log = cluster.dir.path().join(format!("etcd-{i}.log"));
                let args: Vec<String> = [
                    "--name",
                    &name(i),
                    "--data-dir",
                    &data.display().to_string(),
                    "--listen-client-urls",
                    &client_url,
                    "--advertise-client-urls",
                    &client_url,
                    "--listen-peer-urls",
                    &peer_url(i),
                    "--initial-advertise-peer-urls",
                    &peer_url(i),
                    "--initial-cluster",
                    &initial_cluster,
                    "--initial-cluster-state",
                    "new",
                    "--initial-cluster-token",
                    &token,
                    "--heartbeat-interval",
                    "100",
                    "--election-timeout",
                    "1000",
                    "--logger",
                    "zap",
                    // Info, not error: elections and peer losses are what a failing test needs.
                    "--log-level",
                    "info",
                    PROGRESS_NOTIFY_ARGS[0],
                    PROGRESS_NOTIFY_ARGS[1],
                ]
                .iter()
                .map(|s| s.to_string())
                .collect();
                let daemon = Daemon::spawn(ETCD_BIN, &args, &log, Some(cluster.dir.path()));
                cluster.members.push(Member {
                    daemon: Some(daemon),
                    args,
                    client: ([127, 0, 0, 1], client).into(),
                    endpoint: client_url,
                    log,
                    id: 0,
                });
            }
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let exited: Vec<usize> = (0..members).filter(|&i| !cluster.running(i)).collect();
                if !exited.is_empty() {
                    if exited.iter().all(|&i| cluster.log(i).contains("address already in use")) {
                        break; // a port was taken: start over on new ones
                    }
                    panic!("etcd cluster: member(s) {exited:?} exited at start;\n{}", cluster.log_tails());
                }
                if cluster.members.iter().all(|m| health_ok(&m.client)) {
                    for m in &mut cluster.members {
                        m.id = member_status(&m.client).map(|(id, _)| id).unwrap_or_else(|| {
                            panic!("etcd member {} is healthy but answered no /v3/maintenance/status", m.endpoint)
                        });
                    }
                    return cluster;
                }
                if Instant::now() > deadline {
                    panic!("etcd cluster did not become healthy within 30 s;\n{}", cluster.log_tails());
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            // Dropping this attempt's cluster kills its members and deletes its dir.
            drop(cluster);
        }
        panic!("etcd cluster: no free ports after 5 attempts");
    }

    /// Client URLs `http://127.0.0.1:PORT` in member order, for `--etcd-servers` or a client.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(|m| m.endpoint.clone()).collect()
    }

    /// The client URL of one member.
    pub fn endpoint(&self, member: usize) -> &str {
        &self.members[member].endpoint
    }

    /// The temp dir: `data-<i>` and `etcd-<i>.log` of each member.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// SIGKILLs the member's etcd process (not its watchdog), as a crash would, and waits until
    /// it is gone. Its data dir stays, for [`EtcdCluster::restart`].
    pub fn kill(&mut self, member: usize) {
        let m = &mut self.members[member];
        let daemon = m.daemon.take().unwrap_or_else(|| panic!("etcd member {member} is not running"));
        assert!(sigkill(&[daemon.pid()]), "kill -9 {} (etcd member {member}) failed", daemon.pid());
        let deadline = Instant::now() + Duration::from_secs(10);
        while daemon.running() {
            assert!(Instant::now() < deadline, "etcd member {member} still runs 10 s after kill -9");
            std::thread::sleep(Duration::from_millis(10));
        }
        // Dropping the daemon lets its watchdog reap the zombie and exit; the temp dir stays.
        drop(daemon);
    }

    /// Starts a killed member again with the same name, ports, flags and data dir (etcd ignores
    /// the `--initial-cluster*` flags when the data dir exists) and waits until its `/health` is
    /// healthy; panics with its log tail after 30 s. Healthy needs a leader and quorum, so to
    /// restart into a cluster without quorum, use [`EtcdCluster::restart_no_wait`].
    pub fn restart(&mut self, member: usize) {
        self.restart_no_wait(member);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !health_ok(&self.members[member].client) {
            assert!(self.running(member), "etcd member {member} exited after restart; log:\n{}", self.log_tail(member));
            if Instant::now() > deadline {
                panic!("etcd member {member} not healthy 30 s after restart; log:\n{}", self.log_tail(member));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// As [`EtcdCluster::restart`], but only waits until the member's client port accepts
    /// connections (panics with its log tail after 30 s): for a member restarted into a cluster
    /// without quorum, whose `/health` stays unhealthy.
    pub fn restart_no_wait(&mut self, member: usize) {
        let m = &mut self.members[member];
        assert!(m.daemon.is_none(), "etcd member {member} is still running; kill it first");
        m.daemon = Some(Daemon::spawn(ETCD_BIN, &m.args, &m.log, Some(self.dir.path())));
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect_timeout(&self.members[member].client, Duration::from_millis(200)).is_err() {
            assert!(self.running(member), "etcd member {member} exited after restart; log:\n{}", self.log_tail(member));
            if Instant::now() > deadline {
                panic!("etcd member {member} not listening 30 s after restart; log:\n{}", self.log_tail(member));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether the member's etcd process runs (false once killed, or if it died by itself).
    pub fn running(&self, member: usize) -> bool {
        self.members[member].daemon.as_ref().is_some_and(Daemon::running)
    }

    /// The current leader, as seen by the first running member that answers: its index, or
    /// `None` if that member knows of no leader or of one that is not running (a dead leader is
    /// still reported until the election timeout has passed).
    pub fn leader(&self) -> Option<usize> {
        (0..self.members.len()).find_map(|i| self.leader_answer(i)).flatten()
    }

    /// The leader as seen by one member (index of a running member), to check that members agree;
    /// `None` if it does not answer or knows of no running leader.
    pub fn leader_seen_by(&self, member: usize) -> Option<usize> {
        self.leader_answer(member).flatten()
    }

    /// Polls [`EtcdCluster::leader`] until there is one or `timeout` has passed.
    pub fn wait_for_leader(&self, timeout: Duration) -> Option<usize> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(l) = self.leader() {
                return Some(l);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The member's whole log (all its runs, restarts appended).
    pub fn log(&self, member: usize) -> String {
        std::fs::read_to_string(&self.members[member].log).unwrap_or_default()
    }

    /// `None` if the member is not running or does not answer, else `Some` of the index of the
    /// leader it knows of, if that one is running.
    fn leader_answer(&self, member: usize) -> Option<Option<usize>> {
        if !self.running(member) {
            return None;
        }
        let (_, leader) = member_status(&self.members[member].client)?;
        Some(self.members.iter().position(|m| leader != 0 && m.id == leader).filter(|&i| self.running(i)))
    }

    /// The last 40 lines of a member's log, for failure messages.
    fn log_tail(&self, member: usize) -> String {
        let log = self.log(member);
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(40)..].join("\n")
    }

    fn log_tails(&self) -> String {
        (0..self.members.len())
            .map(|i| format!("--- member {i} ({}) log tail:\n{}\n", self.members[i].endpoint, self.log_tail(i)))
            .collect()
    }
}

impl Drop for EtcdCluster {
    /// SIGKILLs every member rather than stopping it: its data is deleted anyway, and a leader
    /// stopped after its peers tries to hand leadership to one of them and waits out etcd's
    /// request timeout (5 s + 2 election timeouts, 7 s here) first. The daemons, dropped next,
    /// then only reap them.
    fn drop(&mut self) {
        let pids: Vec<u32> = self.members.iter().filter_map(|m| m.daemon.as_ref()).map(Daemon::pid).collect();
        let _ = sigkill(&pids);
    }
}

/// `kill -9 PID…`, whether it succeeded (a command, not libc: the workspace denies unsafe code).
/// The pids are our daemons': their watchdogs reap them only when stopped, so even a daemon that
/// died by itself is still a zombie holding its pid, which cannot have been reused.
fn sigkill(pids: &[u32]) -> bool {
    pids.is_empty()
        || std::process::Command::new("kill")
            .arg("-9")
            .args(pids.iter().map(u32::to_string))
            .status()
            .is_ok_and(|s| s.success())
}
