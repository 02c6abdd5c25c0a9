//! `berth up`: a whole cluster on this machine in one command — control plane (API server,
//! scheduler, controllers), CRI runtime with the OCI runtimes that really work here, and the
//! node agent — or, with `--join`, a worker node of an existing cluster.
//!
//! # Design
//!
//! `berth up` first checks the machine ([`preflight`]: root, overlayfs, cgroups, CNI plugins,
//! iptables, busybox, free ports, a free runtime socket) and exits listing every missing thing
//! with its fix. Then it proves each OCI runtime ([`discovery`]: runc, crun, runsc on PATH and
//! the handlers of `/etc/berth/runtime.toml`), writes the runtime's config with the ones that
//! work (`D/runtime/runtime.toml`) and the pod network's conflist, and starts a detached
//! supervisor: the same binary re-executed as `berth up --foreground` in a session of its own
//! (`setsid`), its output in `D/logs/up.log`, its pid in `D/up.pid`. It returns once the node is
//! Ready — seen through the API with the admin kubeconfig (the node's own with `--join`) — and
//! prints how to use the cluster. `--foreground` runs the supervisor in the terminal instead
//! (Ctrl-C or SIGTERM is `berth down`).
//!
//! The [`supervisor`] runs `berth server`, `berth runtime` and `berth agent` as its children
//! (see its module for the order, the restarts with back-off and the stop sequence), creates a
//! RuntimeClass per working runtime once the API answers ([`cluster`]), and records every part
//! in `D/up.json` for `berth status`. `berth down` signals the supervisor (by the pid in its
//! pidfile, checked in `/proc`), which stops agent, server and runtime in that order;
//! containers keep running, and the next `berth up` finds them again (the runtime keeps its
//! records, the agent adopts what runs). Running `berth up` while a supervisor lives (its lock on
//! `D/up.lock` held, its pid a live `berth up --foreground`) changes nothing.
//!
//! Paths: everything under the data dir ([`layout`]), except the runtime socket
//! (`--runtime-socket`, default `/run/berth/runtime.sock`, where `berth cri` and crictl look
//! without flags) and the OCI runtimes' state roots beside it (`/run/berth/oci/<handler>`, on
//! tmpfs, so a reboot leaves no stale container state).

pub mod cluster;
pub mod discovery;
pub mod health;
pub mod layout;
pub mod preflight;
pub mod supervisor;

use std::ffi::OsString;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use discovery::{Probe, RuntimeSettings};
use layout::{DEFAULT_DATA_DIR, Layout, State, live_supervisor, log_tail, write_atomically};
use preflight::{DEFAULT_CNI_BIN_DIRS, Facts, Wanted};
use supervisor::Plan;

pub const DEFAULT_RUNTIME_SOCKET: &str = "/run/berth/runtime.sock";
const DEFAULT_RUNTIME_CONFIG: &str = "/etc/berth/runtime.toml";
/// A part that has restarted this often before the node is Ready makes `berth up` give up.
const MAX_RESTARTS_BEFORE_READY: u32 = 3;

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// Where everything lives: the server's store and admin.kubeconfig, runtime/, agent/, logs/.
    #[arg(long, default_value = DEFAULT_DATA_DIR)]
    data_dir: PathBuf,
    /// Run the supervisor in this terminal instead of in the background (Ctrl-C stops the
    /// cluster as `berth down` does).
    #[arg(long)]
    foreground: bool,
    /// Join the cluster of this node kubeconfig (from `berth server token create --node NAME` on
    /// the first machine) as a worker: only runtime and agent run here.
    #[arg(long, value_name = "KUBECONFIG", conflicts_with_all = ["etcd_servers", "tls_san"])]
    join: Option<PathBuf>,
    /// Comma-separated etcd v3 endpoints for the API server; default: the embedded SQLite store.
    #[arg(long, value_delimiter = ',', value_name = "URLS")]
    etcd_servers: Vec<String>,
    /// The node's name; default: the hostname, lowercased (with --join: the kubeconfig's node).
    #[arg(long, value_name = "NAME")]
    node_name: Option<String>,
    /// Address the API server listens on; this machine's IP lets other machines join (it goes
    /// into the serving certificate and the kubeconfigs).
    #[arg(long, default_value = "127.0.0.1")]
    bind_address: IpAddr,
    /// HTTPS port of the API server.
    #[arg(long, default_value_t = 6443)]
    secure_port: u16,
    /// Extra names or IPs for the API server's certificate (for workers on other machines).
    #[arg(long, value_delimiter = ',')]
    tls_san: Vec<String>,
    /// Port of the agent's kubelet API (logs, exec, attach, port-forward).
    #[arg(long, default_value_t = 10250)]
    agent_port: u16,
    /// Port (UDP and TCP) the cluster DNS listens on, behind the kube-dns Service's 10.96.0.10:53;
    /// 0 turns cluster DNS off.
    #[arg(long, default_value_t = super::server::DEFAULT_CLUSTER_DNS_PORT, value_name = "PORT")]
    cluster_dns_port: u16,
    /// The CRI socket of the runtime (the OCI runtimes' state goes to `oci/` beside it).
    #[arg(long, default_value = DEFAULT_RUNTIME_SOCKET, value_name = "PATH")]
    runtime_socket: PathBuf,
    /// The Linux bridge of the pod network.
    #[arg(long, default_value = "berth0", value_name = "NAME")]
    bridge: String,
    /// The cluster's pod range (IPv4): the API server gives each node a /24 of it (a range of /24
    /// or longer is one node's whole), and each node's pods get addresses from its block. Until
    /// the node has its block, and with --join (where the first machine's range counts), the
    /// pod network starts out with this whole range.
    #[arg(long, default_value = "10.244.0.0/16", value_name = "CIDR")]
    pod_cidr: String,
    /// Where the CNI plugins are (repeatable); default: /usr/lib/cni and /opt/cni/bin.
    #[arg(long = "cni-bin-dir", value_name = "DIR")]
    cni_bin_dirs: Vec<PathBuf>,
    /// Runtime config whose handlers are probed too and whose [registries] are kept; ignored
    /// when missing.
    #[arg(long, default_value = DEFAULT_RUNTIME_CONFIG, value_name = "PATH")]
    runtime_config: PathBuf,
    /// How long to wait for the node to be Ready, in seconds.
    #[arg(long, default_value_t = 180, value_name = "SECONDS")]
    timeout: u64,
    /// Internal: run as the supervisor `berth up` started (discovery done, a session of its own).
    #[arg(long, hide = true)]
    supervise: bool,
}

impl Args {
    /// Whether this process is the supervisor (it logs; `berth up` itself only talks).
    pub fn runs_supervisor(&self) -> bool {
        self.foreground
    }

    fn cni_bin_dirs(&self) -> Vec<PathBuf> {
        if self.cni_bin_dirs.is_empty() {
            DEFAULT_CNI_BIN_DIRS.iter().map(PathBuf::from).collect()
        } else {
            self.cni_bin_dirs.clone()
        }
    }

    /// `berth server` flags after `--data-dir`.
    fn server_args(&self) -> Vec<String> {
        let mut args = vec![
            "--bind-address".to_string(),
            self.bind_address.to_string(),
            "--secure-port".into(),
            self.secure_port.to_string(),
        ];
        if !self.etcd_servers.is_empty() {
            args.extend(["--etcd-servers".into(), self.etcd_servers.join(",")]);
        }
        if !self.tls_san.is_empty() {
            args.extend(["--tls-san".into(), self.tls_san.join(",")]);
        }
        args.extend(["--cluster-cidr".into(), self.pod_cidr.clone()]);
        args.extend(["--cluster-dns-port".into(), self.cluster_dns_port.to_string()]);
        args
    }

    /// The flags of the detached supervisor: these, resolved, plus `--supervise`.
    fn supervisor_args(&self, layout: &Layout, node: &str) -> anyhow::Result<Vec<OsString>> {
        let mut args: Vec<OsString> = vec!["up".into(), "--foreground".into(), "--supervise".into()];
        let mut flag = |name: &str, value: OsString| {
            args.push(name.into());
            args.push(value);
        };
        flag("--data-dir", layout.data_dir.clone().into());
        flag("--node-name", node.into());
        if let Some(join) = &self.join {
            flag("--join", std::path::absolute(join).context("--join")?.into());
        }
        if !self.etcd_servers.is_empty() {
            flag("--etcd-servers", self.etcd_servers.join(",").into());
        }
        flag("--bind-address", self.bind_address.to_string().into());
        flag("--secure-port", self.secure_port.to_string().into());
        if !self.tls_san.is_empty() {
            flag("--tls-san", self.tls_san.join(",").into());
        }
        flag("--agent-port", self.agent_port.to_string().into());
        flag("--cluster-dns-port", self.cluster_dns_port.to_string().into());
        flag("--pod-cidr", self.pod_cidr.clone().into());
        flag("--runtime-socket", std::path::absolute(&self.runtime_socket).context("--runtime-socket")?.into());
        Ok(args)
    }
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    if args.supervise {
        // Detached from the terminal and from `berth up`'s session.
        let _ = rustix::process::setsid();
    }
    let layout = Layout::new(&args.data_dir)?;
    if let Some(pid) = live_supervisor(&layout) {
        println!(
            "berth is already up in {} (supervisor pid {pid}); nothing changed. See `berth status{}`.",
            layout.data_dir.display(),
            layout.flag()
        );
        return Ok(());
    }
    let runtime_socket = std::path::absolute(&args.runtime_socket).context("--runtime-socket")?;
    let node_name = resolve_node_name(&args)?;
    let probes = if args.supervise {
        let path = layout.discovery_file();
        let text = std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
        serde_json::from_slice(&text).with_context(|| format!("cannot parse {}", path.display()))?
    } else {
        prepare(&args, &layout, &runtime_socket).await?
    };
    let plan = Plan {
        exe: berth_exe()?,
        layout: layout.clone(),
        node_name: node_name.clone(),
        join: args.join.is_some(),
        server_args: args.server_args(),
        runtime_socket,
        agent_port: args.agent_port,
        probes,
        cluster_cidr: args.pod_cidr.clone(),
    };
    if args.foreground {
        return supervisor::supervise(plan).await;
    }
    launch(&args, plan).await
}

/// The node's name: `--node-name`, the join kubeconfig's node, or the hostname.
fn resolve_node_name(args: &Args) -> anyhow::Result<String> {
    let from_join = match &args.join {
        Some(path) => {
            let text =
                std::fs::read_to_string(path).with_context(|| format!("cannot read --join {}", path.display()))?;
            Some(cluster::node_of_kubeconfig(&text).with_context(|| format!("--join {}", path.display()))?)
        }
        None => None,
    };
    let name = match (&args.node_name, from_join) {
        (Some(given), Some(join)) if *given != join => anyhow::bail!(
            "--node-name {given} differs from the node of the --join kubeconfig ({join}): a node may only register \
             itself"
        ),
        (Some(given), _) => given.clone(),
        (None, Some(join)) => join,
        (None, None) => std::fs::read_to_string("/proc/sys/kernel/hostname")
            .context("cannot read the hostname")?
            .trim()
            .to_lowercase(),
    };
    berth_apiserver::authn::validate_node_name(&name)
        .with_context(|| format!("node name {name:?}; pass --node-name"))?;
    Ok(name)
}

/// The running binary, for the supervisor and its parts (a binary replaced since it started
/// reads as "… (deleted)": the new one at that path is used).
fn berth_exe() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("cannot find the berth binary")?;
    let text = exe.to_string_lossy();
    Ok(text.strip_suffix(" (deleted)").map(PathBuf::from).unwrap_or(exe))
}

/// Preflight, runtime discovery, and the files the parts read: the runtime's config, the pod
/// network, the discovery record, and (joining) the node's kubeconfig.
async fn prepare(args: &Args, layout: &Layout, socket: &Path) -> anyhow::Result<Vec<Probe>> {
    let search_path = std::env::var_os("PATH").unwrap_or_default();
    let cni_bin_dirs = args.cni_bin_dirs();
    let mut ports = vec![(args.agent_port, "the agent's kubelet API", "--agent-port")];
    if args.join.is_none() {
        ports.insert(0, (args.secure_port, "the API server's", "--secure-port"));
    }
    let facts = Facts::gather(&Wanted {
        cni_bin_dirs: &cni_bin_dirs,
        ports,
        runtime_socket: socket,
        search_path: &search_path,
    });
    let mut problems = preflight::check(&facts);
    problems.extend(check_network(&args.bridge, &args.pod_cidr));
    if !problems.is_empty() {
        eprintln!("berth up: this machine is not ready ({} to fix):", problems.len());
        for p in &problems {
            eprintln!("  - {p}");
        }
        std::process::exit(1);
    }

    std::fs::create_dir_all(&layout.data_dir)
        .with_context(|| format!("cannot create {}", layout.data_dir.display()))?;
    let file = std::fs::read_to_string(&args.runtime_config).ok();
    let candidates =
        discovery::candidates(file.as_deref().map(|text| (args.runtime_config.as_path(), text)), &search_path)?;
    println!("berth up: proving each OCI runtime with a test container");
    let probes = discovery::probe_all(&candidates, &layout.probe_dir(), &facts.cgroups).await;
    for p in &probes {
        println!("  {}", p.summary());
    }
    if !probes.iter().any(Probe::works) {
        eprintln!(
            "berth up: no OCI runtime can run a container on this machine (looked for runc, crun and runsc on PATH{}): \
             apt-get install runc",
            if file.is_some() { format!(" and in {}", args.runtime_config.display()) } else { String::new() }
        );
        std::process::exit(1);
    }

    let runtime_dir = layout.runtime_dir();
    std::fs::create_dir_all(&runtime_dir).with_context(|| format!("cannot create {}", runtime_dir.display()))?;
    let oci_roots = socket.parent().unwrap_or(Path::new("/run/berth")).join("oci");
    let settings = RuntimeSettings {
        socket,
        root: &runtime_dir,
        oci_roots: &oci_roots,
        cni_conf_dir: &layout.cni_conf_dir(),
        cni_bin_dirs: &cni_bin_dirs,
        registries: file.as_deref().map(discovery::registries).unwrap_or_default(),
    };
    let config = discovery::runtime_toml(&settings, &candidates, &probes)?;
    write_atomically(&layout.runtime_config(), config.as_bytes())
        .with_context(|| format!("cannot write {}", layout.runtime_config().display()))?;
    write_network(layout, &args.bridge, &args.pod_cidr)?;
    let record = serde_json::to_vec_pretty(&probes).context("cannot render the discovery")?;
    write_atomically(&layout.discovery_file(), &record)
        .with_context(|| format!("cannot write {}", layout.discovery_file().display()))?;
    if let Some(join) = &args.join {
        let text = std::fs::read(join).with_context(|| format!("cannot read --join {}", join.display()))?;
        supervisor::write_private(&layout.node_kubeconfig(), &text)?;
    }
    Ok(probes)
}

/// A bridge name the kernel takes and an IPv4 CIDR.
fn check_network(bridge: &str, cidr: &str) -> Vec<String> {
    let mut problems = Vec::new();
    if bridge.is_empty() || bridge.len() > 15 || bridge.contains(['/', ' ']) {
        problems
            .push(format!("--bridge {bridge:?} is not a network device name (1 to 15 characters, no '/' or space)"));
    }
    // The network address itself: the API server takes it as its --cluster-cidr, strictly.
    let valid = cidr.split_once('/').is_some_and(|(ip, bits)| {
        let (Ok(ip), Ok(bits)) = (ip.parse::<std::net::Ipv4Addr>(), bits.parse::<u8>()) else { return false };
        (8..=30).contains(&bits) && u32::from(ip) & (u32::MAX >> bits) == 0
    });
    if !valid {
        problems.push(format!("--pod-cidr {cidr:?} is not an IPv4 subnet such as 10.244.0.0/16 (prefix 8 to 30)"));
    }
    problems
}

/// The pod network, the only config in `D/runtime/cni/net.d`: bridge, host-local IPAM with its
/// state under `D/runtime/cni/networks`, masquerade, portmap.
fn write_network(layout: &Layout, bridge: &str, cidr: &str) -> anyhow::Result<()> {
    let dir = layout.cni_conf_dir();
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "conflist" || e == "conf" || e == "json") {
            let _ = std::fs::remove_file(path);
        }
    }
    let network = berth_cni::DefaultNetwork {
        name: bridge.to_string(),
        bridge: bridge.to_string(),
        subnet: cidr.to_string(),
        ipam_data_dir: layout.ipam_dir(),
        ip_masq: true,
    };
    let mut text = serde_json::to_vec_pretty(&network.conflist()).context("cannot render the conflist")?;
    text.push(b'\n');
    let path = dir.join(format!("10-{bridge}.conflist"));
    write_atomically(&path, &text).with_context(|| format!("cannot write {}", path.display()))
}

/// Starts the supervisor in the background and waits for the node to be Ready.
async fn launch(args: &Args, plan: Plan) -> anyhow::Result<()> {
    let layout = &plan.layout;
    std::fs::create_dir_all(layout.logs_dir())
        .with_context(|| format!("cannot create {}", layout.logs_dir().display()))?;
    let log_path = layout.log("up");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .with_context(|| format!("cannot open {}", log_path.display()))?;
    let err = log.try_clone().context("cannot share the log file")?;
    let started = jiff::Timestamp::now();
    let mut child = std::process::Command::new(&plan.exe)
        .args(args.supervisor_args(layout, &plan.node_name)?)
        .current_dir("/")
        .stdin(std::process::Stdio::null())
        .stdout(log)
        .stderr(err)
        .spawn()
        .with_context(|| format!("cannot start the supervisor ({})", plan.exe.display()))?;
    let pid = child.id();
    println!(
        "berth up: started the supervisor (pid {pid}, log {}); waiting for node {} to be Ready",
        log_path.display(),
        plan.node_name
    );

    let deadline = Instant::now() + Duration::from_secs(args.timeout);
    let failure = loop {
        if let Some(status) = child.try_wait().context("waiting for the supervisor")? {
            if let Some(other) = live_supervisor(layout) {
                println!(
                    "berth is already up in {} (supervisor pid {other}); nothing changed",
                    layout.data_dir.display()
                );
                return Ok(());
            }
            anyhow::bail!(
                "the supervisor exited ({status}) before node {} was Ready; last lines of {}:\n{}",
                plan.node_name,
                log_path.display(),
                log_tail(&log_path, 20)
            );
        }
        let state = State::read(layout).filter(|s| s.supervisor_pid == pid);
        if let Some(part) = state.iter().flat_map(|s| &s.parts).find(|p| p.restarts >= MAX_RESTARTS_BEFORE_READY) {
            break format!(
                "berth {} keeps exiting ({} restarts, last: {}); last lines of {}:\n{}",
                part.name,
                part.restarts,
                part.last_exit.as_deref().unwrap_or("?"),
                part.log.display(),
                log_tail(&part.log, 20)
            );
        }
        if plan.api_kubeconfig().exists()
            && let Ok(client) = cluster::client(&plan.api_kubeconfig()).await
            && cluster::node_ready_since(&client, &plan.node_name, started).await.is_some()
        {
            break String::new();
        }
        if Instant::now() > deadline {
            let tails: Vec<String> = ["server", "runtime", "agent"]
                .iter()
                .map(|p| format!("--- {} ---\n{}", layout.log(p).display(), log_tail(&layout.log(p), 10)))
                .collect();
            break format!("node {} was not Ready within {}s\n{}", plan.node_name, args.timeout, tails.join("\n"));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    if failure.is_empty() {
        announce(&plan, pid).await;
        return Ok(());
    }
    // Leave nothing half-started behind: the supervisor stops what it started.
    if let Some(p) = rustix::process::Pid::from_raw(pid as i32) {
        let _ = rustix::process::kill_process(p, rustix::process::Signal::TERM);
    }
    let _ = tokio::time::timeout(Duration::from_secs(90), async {
        while child.try_wait().ok().flatten().is_none() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    anyhow::bail!("{failure}\n(stopped what berth up had started)")
}

/// Prints how to use the cluster, once the node is Ready.
pub async fn announce(plan: &Plan, supervisor_pid: u32) {
    let layout = &plan.layout;
    let client = cluster::client(&plan.api_kubeconfig()).await.ok();
    let (mut handlers, mut classes, mut server) = (Vec::new(), Vec::new(), String::new());
    if let Some(client) = &client {
        let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client.clone());
        if let Ok(node) = nodes.get(&plan.node_name).await {
            handlers = cluster::runtime_handlers(&node);
        }
        classes = cluster::describe_classes(client).await.unwrap_or_default();
    }
    if plan.join
        && let Ok(text) = std::fs::read_to_string(layout.node_kubeconfig())
        && let Ok(config) = serde_yaml::from_str::<serde_json::Value>(&text)
    {
        server = config.pointer("/clusters/0/cluster/server").and_then(|s| s.as_str()).unwrap_or_default().to_string();
    }
    let flag = layout.flag();
    let mut text = String::new();
    if plan.join {
        text.push_str(&format!("berth is up: node {} is Ready and joined the cluster at {server}\n", plan.node_name));
    } else {
        text.push_str(&format!("berth is up: node {} is Ready\n", plan.node_name));
    }
    text.push_str(&format!("  runtime handlers: {}\n", handlers.join(", ")));
    text.push_str(&format!("  RuntimeClasses:   {}\n", classes.join(", ")));
    text.push_str(&format!(
        "  supervisor pid {supervisor_pid}; data dir {}; logs in {}/\n\n",
        layout.data_dir.display(),
        layout.logs_dir().display()
    ));
    if plan.join {
        text.push_str("On the first machine:\n  kubectl get nodes -o wide\n");
    } else {
        text.push_str(&format!("  export KUBECONFIG={}\n", layout.admin_kubeconfig().display()));
        text.push_str("  kubectl get nodes\n  kubectl get runtimeclasses\n  kubectl apply -f examples/\n  kubectl get pods -o wide\n");
    }
    text.push_str(&format!("  berth status{flag}    # each part, pid, health, runtimes and handlers\n"));
    text.push_str(&format!("  berth down{flag}      # stop the cluster; containers keep running unless --stop-pods\n"));
    print!("{text}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_network_flags_are_checked() {
        assert!(check_network("berth0", "10.88.0.0/16").is_empty());
        let problems = check_network("a-very-long-bridge-name", "10.88.0.0");
        assert_eq!(problems.len(), 2);
        assert!(problems[0].starts_with("--bridge"));
        assert!(problems[1].starts_with("--pod-cidr \"10.88.0.0\" is not an IPv4 subnet"));
        assert_eq!(check_network("berth0", "10.88.1.0/16").len(), 1, "host bits are set");
    }

    #[test]
    fn the_detached_supervisor_gets_every_setting_resolved() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            up: Args,
        }
        let cli = Cli::parse_from(["berth", "--data-dir", "/d", "--secure-port", "7443", "--agent-port", "10251"]);
        let layout = Layout::new(Path::new("/d")).unwrap();
        let args = cli.up.supervisor_args(&layout, "n1").unwrap();
        let words: Vec<String> = args.iter().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(
            words.join(" "),
            "up --foreground --supervise --data-dir /d --node-name n1 --bind-address 127.0.0.1 --secure-port 7443 \
             --agent-port 10251 --cluster-dns-port 10053 --pod-cidr 10.244.0.0/16 --runtime-socket /run/berth/runtime.sock"
        );
        assert_eq!(
            cli.up.server_args(),
            [
                "--bind-address",
                "127.0.0.1",
                "--secure-port",
                "7443",
                "--cluster-cidr",
                "10.244.0.0/16",
                "--cluster-dns-port",
                "10053"
            ]
        );
    }
}
