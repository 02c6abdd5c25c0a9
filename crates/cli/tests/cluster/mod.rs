//! The harness of the `berth up` tests: a whole cluster in a temp data dir with its own API,
//! agent and DNS ports, runtime socket, CNI bridge and proxy table, and helpers to drive it with
//! kubectl. Each test binary uses part of it.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use berth_testenv::cni::BridgeNetwork;
use berth_testenv::images::{Compression, ContainerConfig, Format, Image, Platform, busybox_layer};
use serde_json::Value;

/// One cluster test at a time: each runs a whole node (three parts and a dozen pods) on 2 cores.
pub fn one_cluster_at_a_time() -> MutexGuard<'static, ()> {
    static CLUSTERS: Mutex<()> = Mutex::new(());
    CLUSTERS.lock().unwrap_or_else(|e| e.into_inner())
}

/// The `berth` binary, with `berth-monitor` built beside it (where the runtime looks for it).
pub fn berth() -> Command {
    static MONITOR: OnceLock<PathBuf> = OnceLock::new();
    let bin = Path::new(env!("CARGO_BIN_EXE_berth"));
    MONITOR.get_or_init(|| berth_testenv::monitor::monitor_binary_in(bin.parent().unwrap()));
    Command::new(bin)
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A port free on every address: the API also listens on the host's address, the agent on all.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("0.0.0.0:0").unwrap().local_addr().unwrap().port()
}

/// Polls `f` until it returns `Some`, for at most `limit`.
pub fn eventually<T>(limit: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out after {limit:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// A cluster (or a worker) of `berth up` in a temp dir: data dir `d/`, socket `run/runtime.sock`.
/// On drop it is stopped with its pods (brought up again first if it was down with pods left).
pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub secure_port: u16,
    pub agent_port: u16,
    /// The cluster DNS's port (the host's own cluster may hold the default one).
    pub dns_port: u16,
    pub network: BridgeNetwork,
    /// Prepended to PATH for `berth up` (fake OCI runtimes).
    pub path_prefix: Option<PathBuf>,
    pub join: Option<PathBuf>,
}

impl Cluster {
    pub fn new() -> Cluster {
        Cluster {
            dir: tempfile::tempdir().unwrap(),
            secure_port: free_port(),
            agent_port: free_port(),
            dns_port: free_port(),
            network: BridgeNetwork::unique("bup", 232, 8),
            path_prefix: None,
            join: None,
        }
    }

    pub fn worker(join: &Path) -> Cluster {
        let mut worker = Cluster::new();
        worker.join = Some(join.to_path_buf());
        worker
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("d")
    }

    pub fn kubeconfig(&self) -> PathBuf {
        self.data_dir().join("admin.kubeconfig")
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("run/runtime.sock")
    }

    pub fn command(&self, verb: &str) -> Command {
        let mut c = berth();
        c.arg(verb).arg("--data-dir").arg(self.data_dir());
        c
    }

    pub fn up(&self) -> Output {
        let mut c = self.command("up");
        c.args(["--agent-port", &self.agent_port.to_string(), "--runtime-socket"])
            .arg(self.socket())
            .args(["--bridge", &self.network.bridge, "--pod-cidr", &self.network.subnet, "--runtime-config"])
            .arg(self.dir.path().join("no-runtime.toml"));
        match &self.join {
            Some(join) => c.arg("--join").arg(join),
            None => c.args([
                "--secure-port",
                &self.secure_port.to_string(),
                "--cluster-dns-port",
                &self.dns_port.to_string(),
            ]),
        };
        if let Some(prefix) = &self.path_prefix {
            let path = std::env::var_os("PATH").unwrap_or_default();
            let paths = std::iter::once(prefix.clone()).chain(std::env::split_paths(&path));
            c.env("PATH", std::env::join_paths(paths).unwrap());
        }
        c.output().unwrap()
    }

    /// `berth up`, asserted to succeed; its stdout.
    pub fn up_ok(&self) -> String {
        let out = self.up();
        assert!(out.status.success(), "berth up failed: {}\n{}\n{}", text(&out.stderr), text(&out.stdout), self.logs());
        text(&out.stdout)
    }

    pub fn down(&self, stop_pods: bool) -> Output {
        let mut c = self.command("down");
        if stop_pods {
            c.arg("--stop-pods");
        }
        c.output().unwrap()
    }

    pub fn status(&self) -> Output {
        self.command("status").output().unwrap()
    }

    pub fn supervisor_pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.data_dir().join("up.pid")).ok()?.trim().parse().ok()
    }

    pub fn kubectl(&self, args: &[&str]) -> Output {
        Command::new("kubectl").env("KUBECONFIG", self.kubeconfig()).args(args).output().unwrap()
    }

    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(out.status.success(), "kubectl {args:?}: {}\n{}", text(&out.stderr), self.logs());
        text(&out.stdout)
    }

    pub fn json(&self, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.extend(["-o", "json"]);
        serde_json::from_str(&self.kubectl_ok(&all)).unwrap()
    }

    /// The tail of every log, for failure messages.
    pub fn logs(&self) -> String {
        ["up", "server", "runtime", "agent"]
            .iter()
            .map(|p| {
                let path = self.data_dir().join(format!("logs/{p}.log"));
                let log = std::fs::read_to_string(&path).unwrap_or_default();
                let lines: Vec<&str> = log.lines().collect();
                format!("--- {} ---\n{}", path.display(), lines[lines.len().saturating_sub(30)..].join("\n"))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    pub fn has_sandboxes(&self) -> bool {
        std::fs::read_dir(self.data_dir().join("runtime/sandboxes")).is_ok_and(|mut d| d.next().is_some())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.logs());
        }
        if self.supervisor_pid().is_none() && self.has_sandboxes() {
            // Down with pods left (a failed test): up once more to remove them through CRI.
            let _ = self.up();
        }
        let out = self.down(true);
        if !out.status.success() {
            eprintln!("berth down --stop-pods: {}{}", text(&out.stdout), text(&out.stderr));
        }
        // The bridge plugin leaves its bridge behind.
        let _ = Command::new("ip").args(["link", "del", &self.network.bridge]).output();
    }
}

/// A busybox image whose command is `httpd` on port 80: the nginx of the examples.
pub fn httpd_image() -> Image {
    let mut config = ContainerConfig::cmd(&["httpd", "-f", "-p", "80", "-h", "/var/www"]);
    config.exposed_ports = vec!["80/tcp".into()];
    Image::build(Format::Oci, Platform::host(), config, vec![busybox_layer(Compression::Gzip)])
}

/// `examples/` copied into `dir` with their Docker Hub images replaced by `busybox` and `nginx`.
pub fn examples_in(dir: &Path, busybox: &str, nginx: &str) -> PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let target = dir.join("examples");
    std::fs::create_dir_all(&target).unwrap();
    for entry in std::fs::read_dir(&source).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let text = std::fs::read_to_string(&path).unwrap();
            let text =
                text.replace("docker.io/library/busybox:1.36", busybox).replace("docker.io/library/nginx:1.27", nginx);
            std::fs::write(target.join(path.file_name().unwrap()), text).unwrap();
        }
    }
    target
}

/// pod name → (node, [(container ID, restart count)]) of every pod.
pub fn containers(cluster: &Cluster) -> BTreeMap<String, (String, Vec<(String, i64)>)> {
    let pods = cluster.json(&["get", "pods"]);
    pods["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let statuses = p["status"]["containerStatuses"].as_array().cloned().unwrap_or_default();
            let ids = statuses
                .iter()
                .map(|s| {
                    (s["containerID"].as_str().unwrap_or("").to_string(), s["restartCount"].as_i64().unwrap_or(-1))
                })
                .collect();
            let node = p["spec"]["nodeName"].as_str().unwrap_or("").to_string();
            (p["metadata"]["name"].as_str().unwrap().to_string(), (node, ids))
        })
        .collect()
}

pub fn wait_all_ready(cluster: &Cluster) {
    let out = cluster.kubectl(&["wait", "--for=condition=Ready", "pods", "--all", "--timeout=240s"]);
    assert!(out.status.success(), "every pod Ready: {}\n{}", text(&out.stderr), cluster.logs());
}

pub fn node_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap().trim().to_lowercase()
}

/// Whether `pid` runs (a zombie waiting for init to reap it does not).
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z')))
}

/// Processes whose command line mentions `marker` (container monitors name their record dir).
pub fn processes_mentioning(marker: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != std::process::id())
        .filter(|pid| std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| text(&c).contains(marker)))
        .collect()
}
