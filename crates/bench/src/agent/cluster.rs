//! The control plane and the node of a run: the release `berth server` (temp data dir, free
//! port), a node token for `berth agent`, the agent itself with a config of this run, and the
//! admin client the bench creates and watches pods with.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use k8s_openapi::api::core::v1::{Namespace, Node, ServiceAccount};
use k8s_openapi::api::node::v1::RuntimeClass;
use kube::api::{Api, ListParams, PostParams};

use crate::cri::daemons::Daemon;

/// How long a daemon may take to answer after its start.
const START_PATIENCE: Duration = Duration::from_secs(60);

pub fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Whether the process still runs (not gone, not a zombie its shell has yet to reap).
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| stat.rsplit_once(") ").map(|(_, rest)| !rest.starts_with('Z')))
        .unwrap_or(false)
}

/// An admin (or node) client from a kubeconfig file.
pub async fn client(kubeconfig: &Path) -> anyhow::Result<kube::Client> {
    let kc =
        kube::config::Kubeconfig::read_from(kubeconfig).with_context(|| format!("reading {}", kubeconfig.display()))?;
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
    Ok(kube::Client::try_from(config)?)
}

/// `berth server` on a free port, SQLite in `dir/data`; returns once it answers the admin.
pub async fn start_server(binary: &Path, dir: &Path) -> anyhow::Result<(Daemon, kube::Client, PathBuf)> {
    start_server_with(binary, dir, &[]).await
}

/// [`start_server`] with `extra` arguments (say, `--no-scheduler`; a
/// `--compaction-interval-seconds=N` of its own replaces the run's default of no compaction).
pub async fn start_server_with(
    binary: &Path,
    dir: &Path,
    extra: &[&str],
) -> anyhow::Result<(Daemon, kube::Client, PathBuf)> {
    let data_dir = dir.join("data");
    let port = free_port()?;
    let mut args: Vec<String> = vec![
        "server".into(),
        "--data-dir".into(),
        data_dir.to_string_lossy().into_owned(),
        "--secure-port".into(),
        port.to_string(),
    ];
    // No compaction during the run (it is not what is measured), unless `extra` says otherwise.
    if !extra.iter().any(|a| a.starts_with("--compaction-interval-seconds")) {
        args.extend(["--compaction-interval-seconds".into(), "3600".into()]);
    }
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    let daemon = Daemon::spawn(binary, &args, &dir.join("server.log"))?;
    let kubeconfig = data_dir.join("admin.kubeconfig");
    let deadline = Instant::now() + START_PATIENCE;
    let mut last = String::from("no admin.kubeconfig yet");
    loop {
        if !alive(daemon.pid) {
            bail!("berth server exited:\n{}", daemon.log_tail());
        }
        if kubeconfig.exists() {
            let answered = async {
                let client = client(&kubeconfig).await?;
                Api::<Namespace>::all(client.clone()).list(&ListParams::default().limit(1)).await?;
                anyhow::Ok(client)
            };
            match answered.await {
                Ok(client) => return Ok((daemon, client, data_dir)),
                Err(e) => last = format!("{e:#}"),
            }
        }
        if Instant::now() > deadline {
            bail!("berth server not ready after {START_PATIENCE:?}: {last}\n{}", daemon.log_tail());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `berth server token create --node NAME`: the node's kubeconfig, written to `path`.
pub fn node_kubeconfig(binary: &Path, data_dir: &Path, node: &str, path: &Path) -> anyhow::Result<()> {
    let out = Command::new(binary)
        .args(["server", "token", "create", "--node", node, "--data-dir"])
        .arg(data_dir)
        .output()
        .context("running berth server token create")?;
    if !out.status.success() {
        bail!("berth server token create failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    std::fs::write(path, &out.stdout)?;
    Ok(())
}

/// `berth agent` as node `node`, with one endpoint `berth` (the runtime at `socket`), its own
/// root dir and kubelet API port, logging at `log_filter` (`BERTH_LOG`).
pub fn start_agent(
    binary: &Path,
    dir: &Path,
    node: &str,
    kubeconfig: &Path,
    socket: &Path,
    log_filter: &str,
) -> anyhow::Result<Daemon> {
    std::fs::create_dir_all(dir)?;
    let config = dir.join("agent.toml");
    let toml = format!(
        "partial_readiness = false\n[[endpoints]]\nworkload_type = \"container\"\nname = \"berth\"\nendpoint = {:?}\n",
        format!("unix://{}", socket.display())
    );
    std::fs::write(&config, toml)?;
    let port = free_port()?;
    let path = |p: &Path| p.to_string_lossy().into_owned();
    // Through env(1), which execs: the daemon's pid is the agent's, and only it gets BERTH_LOG.
    let args: Vec<String> = vec![
        format!("BERTH_LOG={log_filter}"),
        "NO_COLOR=1".into(),
        path(binary),
        "agent".into(),
        "--config".into(),
        path(&config),
        "--kubeconfig".into(),
        path(kubeconfig),
        "--node-name".into(),
        node.into(),
        "--port".into(),
        port.to_string(),
        "--root-dir".into(),
        path(&dir.join("root")),
        // Its own proxy table, not the default one a cluster on this host may be using.
        "--proxy-table".into(),
        proxy_table(),
    ];
    Daemon::spawn(Path::new("/usr/bin/env"), &args, &dir.join("agent.log"))
}

/// The bench agent's nftables table (family `ip`), named after this process.
pub fn proxy_table() -> String {
    format!("berth-bench-{}", std::process::id())
}

/// Removes the bench agent's proxy table (the agent leaves its rules when it stops, as
/// kube-proxy does).
pub fn remove_proxy_table() {
    let _ = std::process::Command::new("nft")
        .args(["delete", "table", "ip", &proxy_table()])
        .stderr(std::process::Stdio::null())
        .status();
}

/// Waits until the Node is registered with `Ready` true.
pub async fn wait_node_ready(client: &kube::Client, node: &str, agent: &Daemon) -> anyhow::Result<Node> {
    let api: Api<Node> = Api::all(client.clone());
    let deadline = Instant::now() + START_PATIENCE;
    loop {
        if !alive(agent.pid) {
            bail!("berth agent exited:\n{}", agent.log_tail());
        }
        if let Some(n) = api.get_opt(node).await? {
            let conditions = n.status.as_ref().and_then(|s| s.conditions.as_ref());
            if conditions.into_iter().flatten().any(|c| c.type_ == "Ready" && c.status == "True") {
                return Ok(n);
            }
        }
        if Instant::now() > deadline {
            bail!("node {node} not Ready after {START_PATIENCE:?}:\n{}", agent.log_tail());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits for the `default` ServiceAccount the serviceaccount controller gives a new namespace:
/// the ServiceAccount admission plugin refuses pods until it exists.
pub async fn wait_for_service_account(client: &kube::Client, namespace: &str) -> anyhow::Result<()> {
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let deadline = Instant::now() + START_PATIENCE;
    while api.get_opt("default").await?.is_none() {
        if Instant::now() > deadline {
            bail!("no default ServiceAccount in namespace {namespace} after {START_PATIENCE:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// The namespace of the bench's pods (with its default ServiceAccount) and one RuntimeClass per
/// handler, named like it.
pub async fn create_objects(client: &kube::Client, namespace: &str, handlers: &[String]) -> anyhow::Result<()> {
    let ns: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": namespace}}))?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .context("creating the namespace")?;
    wait_for_service_account(client, namespace).await?;
    let classes: Api<RuntimeClass> = Api::all(client.clone());
    for handler in handlers {
        let rc: RuntimeClass =
            serde_json::from_value(serde_json::json!({"metadata": {"name": handler}, "handler": handler}))?;
        classes
            .create(&PostParams::default(), &rc)
            .await
            .with_context(|| format!("creating RuntimeClass {handler}"))?;
    }
    Ok(())
}

/// Memory of a process from `/proc/<pid>/status`, in KiB.
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcMemory {
    pub rss: u64,
    pub anon: u64,
    pub file: u64,
    /// The peak RSS so far (`VmHWM`).
    pub peak: u64,
    /// The highest VmRSS of a series of readings this one stands for (else `rss`).
    pub rss_max: u64,
}

impl ProcMemory {
    pub fn read(pid: u32) -> anyhow::Result<Self> {
        let status =
            std::fs::read_to_string(format!("/proc/{pid}/status")).with_context(|| format!("process {pid}"))?;
        let field = |name: &str| -> anyhow::Result<u64> {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim_start_matches(':').trim().trim_end_matches("kB").trim().parse().ok())
                .with_context(|| format!("no {name} for process {pid}"))
        };
        let rss = field("VmRSS")?;
        Ok(Self { rss, anon: field("RssAnon")?, file: field("RssFile")?, peak: field("VmHWM")?, rss_max: rss })
    }
}

/// User plus system CPU time a process has used so far.
pub fn cpu_time(pid: u32) -> anyhow::Result<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).with_context(|| format!("process {pid}"))?;
    // Fields after the command's closing parenthesis; utime and stime are the 14th and 15th of
    // the line, in clock ticks (USER_HZ, 100 on Linux).
    let rest = stat.rsplit_once(") ").map(|(_, r)| r).context("malformed /proc stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok()).context("no CPU times in /proc stat");
    let total = ticks(11)? + ticks(12)?;
    Ok(Duration::from_millis(total * 10))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memory_and_cpu_time_of_this_process_are_read_from_proc() {
        let me = std::process::id();
        let m = ProcMemory::read(me).unwrap();
        assert!(m.rss > 0 && m.peak >= m.rss);
        assert!(m.anon > 0 && m.anon + m.file <= m.rss, "VmRSS is RssAnon + RssFile + RssShmem: {m:?}");
        let spin = Instant::now();
        while spin.elapsed() < Duration::from_millis(50) {
            std::hint::black_box(0u64);
        }
        assert!(cpu_time(me).unwrap() >= Duration::from_millis(10));
        assert!(alive(me));
    }
}
