//! The bench's own `berth up` cluster, started and stopped the way a user does (`berth up`,
//! `berth down --stop-pods`) in a data dir, ports, runtime socket and bridge of this run; and the
//! memory of its process tree.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::node::v1::RuntimeClass;
use kube::api::{Api, ListParams, PostParams};

use crate::agent::cluster::{alive, client, free_port};
use crate::cri::client::{CriClient, pid_field};
use crate::cri::net::Network;

/// How long `berth up` may take to bring the node Ready (it proves each runtime first).
const UP_TIMEOUT_SECONDS: u32 = 240;
/// How long the memory is sampled at the end of a settle.
const MEMORY_WINDOW: Duration = Duration::from_secs(6);

/// A running `berth up` cluster of this run.
pub struct UpCluster {
    binary: PathBuf,
    data_dir: PathBuf,
    socket: PathBuf,
    bridge: String,
    admin: kube::Client,
    down: bool,
}

impl UpCluster {
    /// `berth up` in `dir`: returns once it has (the node is Ready).
    pub async fn start(binary: &Path, dir: &Path, network: &Network) -> anyhow::Result<Self> {
        ensure!(
            binary.exists(),
            "no berth binary at {} (cargo build --release -p berth -p berth-monitor)",
            binary.display()
        );
        std::fs::create_dir_all(dir)?;
        let data_dir = dir.join("data");
        let socket = dir.join("run/runtime.sock");
        let mut up = Command::new(binary);
        up.arg("up").arg("--data-dir").arg(&data_dir);
        up.args(["--secure-port", &free_port()?.to_string(), "--agent-port", &free_port()?.to_string()]);
        up.arg("--runtime-socket").arg(&socket);
        up.args(["--bridge", network.bridge, "--pod-cidr", network.subnet]);
        // No user config: the runtimes are the ones discovery proves on this machine.
        up.arg("--runtime-config").arg(dir.join("no-runtime.toml"));
        up.args(["--node-name", "bench-node", "--timeout", &UP_TIMEOUT_SECONDS.to_string()]);
        let out = tokio::task::spawn_blocking(move || up.output()).await?.context("running berth up")?;
        if !out.status.success() {
            let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
            // What did start (parts, pods of the probes) goes again.
            let (binary, data) = (binary.to_owned(), data_dir.clone());
            let _ = tokio::task::spawn_blocking(move || down(&binary, &data)).await;
            bail!("berth up failed ({}):\n{text}", out.status);
        }
        let admin = match client(&data_dir.join("admin.kubeconfig")).await {
            Ok(admin) => admin,
            Err(e) => {
                let (binary, data) = (binary.to_owned(), data_dir.clone());
                let _ = tokio::task::spawn_blocking(move || down(&binary, &data)).await;
                return Err(e.context("the admin kubeconfig of berth up"));
            }
        };
        Ok(Self { binary: binary.to_owned(), data_dir, socket, bridge: network.bridge.to_owned(), admin, down: false })
    }

    pub fn admin(&self) -> kube::Client {
        self.admin.clone()
    }

    pub fn runtime_socket(&self) -> PathBuf {
        self.socket.clone()
    }

    pub fn log(&self, part: &str) -> PathBuf {
        self.data_dir.join("logs").join(format!("{part}.log"))
    }

    /// The pod network's conflist `berth up` wrote.
    pub fn conflist(&self) -> anyhow::Result<serde_json::Value> {
        let path = self.data_dir.join(format!("runtime/cni/net.d/10-{}.conflist", self.bridge));
        let text = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        Ok(serde_json::from_slice(&text)?)
    }

    /// The names of the RuntimeClasses `berth up` created.
    pub async fn runtime_classes(&self) -> anyhow::Result<Vec<String>> {
        let classes = Api::<RuntimeClass>::all(self.admin()).list(&ListParams::default()).await?;
        Ok(classes.items.into_iter().filter_map(|c| c.metadata.name).collect())
    }

    pub async fn create_namespace(&self, name: &str) -> anyhow::Result<()> {
        let ns: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": name}}))?;
        Api::<Namespace>::all(self.admin())
            .create(&PostParams::default(), &ns)
            .await
            .context("creating the namespace")?;
        crate::agent::cluster::wait_for_service_account(&self.admin(), name).await
    }

    /// `D/up.json`: the supervisor and its parts as it last wrote them.
    fn state(&self) -> anyhow::Result<serde_json::Value> {
        let path = self.data_dir.join("up.json");
        Ok(serde_json::from_slice(&std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?)?)
    }

    /// The supervisor's pid and each part's (name, pid).
    fn tree(&self) -> anyhow::Result<Vec<(String, u32)>> {
        let state = self.state()?;
        let mut pids = vec![("supervisor".to_owned(), pid_field(&state, "supervisor_pid")?)];
        for part in state["parts"].as_array().into_iter().flatten() {
            let name = part["name"].as_str().unwrap_or_default().to_owned();
            pids.push((name.clone(), pid_field(part, "pid").with_context(|| format!("part {name} has no pid"))?));
        }
        Ok(pids)
    }

    /// Fails when a part of the tree has died or restarted since the run began.
    pub fn ensure_alive(&self) -> anyhow::Result<()> {
        let state = self.state()?;
        for part in state["parts"].as_array().into_iter().flatten() {
            let restarts = part["restarts"].as_u64().unwrap_or(0);
            ensure!(restarts == 0, "{} restarted during the run: {}", part["name"], part["last_exit"]);
        }
        for (name, pid) in self.tree()? {
            ensure!(alive(pid), "{name} (pid {pid}) exited during the run; see {}", self.log(&name).display());
        }
        Ok(())
    }

    /// The tree's memory after `settle` seconds: sampled every 100 ms over the last
    /// [`MEMORY_WINDOW`]; the sample with the median total. Monitors and infra processes of the
    /// pods are found through the runtime's verbose CRI status and summed apart.
    pub async fn memory(&self, cri: &mut CriClient, settle: u64) -> anyhow::Result<TreeMemory> {
        let settle = Duration::from_secs(settle);
        tokio::time::sleep(settle.saturating_sub(MEMORY_WINDOW)).await;
        let tree = self.tree()?;
        let pods = pod_processes(cri).await?;
        let mut samples = Vec::new();
        let end = Instant::now() + settle.min(MEMORY_WINDOW);
        loop {
            self.ensure_alive()?;
            let parts = tree
                .iter()
                .map(|(name, pid)| Ok((name.clone(), Usage::read(*pid)?)))
                .collect::<anyhow::Result<Vec<_>>>()?;
            let mut monitors = Usage::default();
            for pid in &pods.monitors {
                monitors.add(&Usage::read(*pid).unwrap_or_default());
            }
            let mut infra = Usage::default();
            for pid in &pods.infra {
                infra.add(&Usage::read(*pid).unwrap_or_default());
            }
            samples.push(TreeMemory {
                parts,
                monitors,
                monitor_count: pods.monitors.len(),
                infra,
                infra_count: pods.infra.len(),
            });
            if Instant::now() >= end {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        samples.sort_by_key(|m| m.total().rss_kib);
        Ok(samples.swap_remove(samples.len() / 2))
    }

    /// `berth down --stop-pods`, then the bridge `berth up` made.
    pub async fn tear_down(mut self) {
        self.stop().await;
    }

    async fn stop(&mut self) {
        if !self.down {
            self.down = true;
            let (binary, data) = (self.binary.clone(), self.data_dir.clone());
            if let Err(e) = tokio::task::spawn_blocking(move || down(&binary, &data)).await {
                eprintln!("berth down: {e}");
            }
        }
    }
}

impl Drop for UpCluster {
    fn drop(&mut self) {
        if !self.down {
            // A failed run: stop the cluster all the same.
            down(&self.binary, &self.data_dir);
        }
    }
}

/// `berth down --stop-pods` of `data_dir`; a failure is reported, not returned.
fn down(binary: &Path, data_dir: &Path) {
    let out = Command::new(binary).arg("down").arg("--data-dir").arg(data_dir).arg("--stop-pods").output();
    match out {
        Ok(out) if out.status.success() => {}
        Ok(out) => eprintln!(
            "berth down --stop-pods failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => eprintln!("running berth down: {e}"),
    }
}

/// Pids of the pods' own berth processes: a monitor per container, an infra process per sandbox.
struct PodProcesses {
    monitors: Vec<u32>,
    infra: Vec<u32>,
}

async fn pod_processes(cri: &mut CriClient) -> anyhow::Result<PodProcesses> {
    let (sandboxes, containers) = cri.list().await?;
    let mut found = PodProcesses { monitors: Vec::new(), infra: Vec::new() };
    for id in containers {
        if let Ok(pid) = pid_field(&cri.container_info(&id).await?, "monitorPid") {
            found.monitors.push(pid);
        }
    }
    for id in sandboxes {
        // gVisor sandboxes have no infra process of berth's (runsc holds the pod).
        if let Ok(pid) = pid_field(&cri.sandbox_info(&id).await?, "pid")
            && crate::cri::client::comm(pid).starts_with("berth")
        {
            found.infra.push(pid);
        }
    }
    Ok(found)
}

/// Resident memory of a process or a sum of them, in KiB: VmRSS, and PSS (its fair share of
/// pages shared with others, such as the one binary's text all berth processes map).
#[derive(Clone, Copy, Debug, Default)]
pub struct Usage {
    pub rss_kib: u64,
    pub pss_kib: u64,
}

impl Usage {
    pub fn read(pid: u32) -> anyhow::Result<Self> {
        let rollup =
            std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).with_context(|| format!("process {pid}"))?;
        let field = |name: &str| -> anyhow::Result<u64> {
            rollup
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
                .with_context(|| format!("no {name} for process {pid}"))
        };
        Ok(Self { rss_kib: field("Rss:")?, pss_kib: field("Pss:")? })
    }

    pub fn add(&mut self, other: &Usage) {
        self.rss_kib += other.rss_kib;
        self.pss_kib += other.pss_kib;
    }
}

/// The tree's memory at one moment.
#[derive(Clone, Debug)]
pub struct TreeMemory {
    /// Supervisor, server, runtime, agent (as `up.json` names them).
    pub parts: Vec<(String, Usage)>,
    pub monitors: Usage,
    pub monitor_count: usize,
    pub infra: Usage,
    pub infra_count: usize,
}

impl TreeMemory {
    /// The supervisor and its parts, without the pods' processes.
    pub fn total(&self) -> Usage {
        let mut sum = Usage::default();
        for (_, u) in &self.parts {
            sum.add(u);
        }
        sum
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rss_and_pss_of_this_process_are_read_from_its_smaps_rollup() {
        let me = Usage::read(std::process::id()).unwrap();
        assert!(me.rss_kib > 0);
        assert!(me.pss_kib > 0 && me.pss_kib <= me.rss_kib, "{me:?}");
        let mut twice = me;
        twice.add(&me);
        assert_eq!(twice.rss_kib, 2 * me.rss_kib);
    }
}
