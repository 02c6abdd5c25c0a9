//! `berth agent`: the node agent, registering this node and running its pods through CRI runtimes.

use std::path::PathBuf;

use anyhow::Context;
use berth_agent::config::Flags;

#[derive(clap::Args)]
pub struct Args {
    /// The agent's TOML config file, re-read on change (SIGHUP or a write); flags override it.
    #[arg(long, value_name = "PATH")]
    config: Option<PathBuf>,
    /// Kubeconfig to reach the control plane (e.g. from `berth server token create --node NAME`).
    #[arg(long, value_name = "PATH")]
    kubeconfig: Option<PathBuf>,
    /// The Node's name; default: the hostname, lowercased.
    #[arg(long, value_name = "NAME")]
    node_name: Option<String>,
    /// CRI runtimes as `workloadType:name:endpoint;…`, e.g.
    /// `container:berth:unix:///run/berth/runtime.sock;container:containerd:unix:///run/containerd/containerd.sock`;
    /// a bare `unix:///…` is one container endpoint named `runtime`. The first of a workload type is
    /// its default. Default: `container:berth:unix:///run/berth/runtime.sock`.
    #[arg(long, value_name = "LIST")]
    container_runtime_endpoint: Option<String>,
    /// Image services, in the same syntax, matched to the runtime endpoints by name; default: each
    /// runtime endpoint serves its own images.
    #[arg(long, value_name = "LIST")]
    image_service_endpoint: Option<String>,
    /// Port of the kubelet API (logs, exec, attach, port-forward); default 10250.
    #[arg(long, value_name = "PORT")]
    port: Option<u16>,
    /// Report the node Ready while at least one runtime is ready (default: all must be).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    partial_readiness: Option<bool>,
    /// Disk usage percent above which unused images are removed; default 85.
    #[arg(long, value_name = "PERCENT")]
    image_gc_high_threshold: Option<u8>,
    /// Disk usage percent image garbage collection brings the disk down to; default 80.
    #[arg(long, value_name = "PERCENT")]
    image_gc_low_threshold: Option<u8>,
    /// The agent's state directory; default /var/lib/berth/agent.
    #[arg(long, value_name = "PATH")]
    root_dir: Option<PathBuf>,
    /// How Services are proxied on this node: `nftables` (default; the agent's own table) or
    /// `none`.
    #[arg(long, value_name = "MODE")]
    proxy_mode: Option<berth_agent::config::ProxyMode>,
    /// The nftables table (family ip) the Service proxy owns; default `berth`. Two clusters on one
    /// host need two tables.
    #[arg(long, value_name = "NAME")]
    proxy_table: Option<String>,
    /// Comma-separated cluster DNS server addresses for pods with `dnsPolicy: ClusterFirst`
    /// (kubelet's flag); default: none, pods use the node's resolver.
    #[arg(long, value_name = "IPS", value_delimiter = ',')]
    cluster_dns: Option<Vec<String>>,
    /// The cluster's DNS domain, searched by pods; default cluster.local.
    #[arg(long, value_name = "DOMAIN")]
    cluster_domain: Option<String>,
    /// Every node's pod range (kube-proxy's flag): pod traffic leaving it is masqueraded;
    /// default: traffic leaving the node's own range is.
    #[arg(long, value_name = "CIDR")]
    cluster_cidr: Option<String>,
}

/// How often the agent gives back free heap and the code pages it touched since (one read of
/// /proc/self/smaps and a few madvise calls; what its periodic work uses faults back in from the
/// page cache).
const AGENT_TRIM_PERIOD: std::time::Duration = std::time::Duration::from_secs(3);

pub async fn run(args: Args) -> anyhow::Result<()> {
    let absolute = |p: Option<PathBuf>, flag: &str| -> anyhow::Result<Option<PathBuf>> {
        p.map(|p| std::path::absolute(p).with_context(|| flag.to_string())).transpose()
    };
    let flags = Flags {
        config: absolute(args.config, "--config")?,
        kubeconfig: absolute(args.kubeconfig, "--kubeconfig")?,
        node_name: args.node_name,
        container_runtime_endpoint: args.container_runtime_endpoint,
        image_service_endpoint: args.image_service_endpoint,
        port: args.port,
        partial_readiness: args.partial_readiness,
        image_gc_high_threshold: args.image_gc_high_threshold,
        image_gc_low_threshold: args.image_gc_low_threshold,
        root_dir: absolute(args.root_dir, "--root-dir")?,
        proxy_mode: args.proxy_mode,
        proxy_table: args.proxy_table,
        cluster_dns: args.cluster_dns,
        cluster_domain: args.cluster_domain,
        cluster_cidr: args.cluster_cidr,
    };
    // The agent wakes often (pod workers, heartbeats): its heap and code pages are trimmed on a
    // timer rather than when quiet.
    let _trim = crate::memory::spawn_trim_every(AGENT_TRIM_PERIOD);
    berth_agent::agent::run(flags).await.context("berth agent")
}
