//! `berth controller-manager`: the controllers alone against any Kubernetes API server, and the
//! same controllers run inside `berth server`; both hold the Lease
//! `kube-system/kube-controller-manager` while they work, so one set runs at a time.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use berth_controllers::node_ipam::{CidrSet, Ipv4Net};
use berth_controllers::{Config, Context};

use super::leading::{client, lead, parse_go_duration, shutdown_signal};

const LEASE_NAME: &str = "kube-controller-manager";

/// Controller options shared by `berth controller-manager` and `berth server`.
#[derive(clap::Args, Clone, Debug)]
pub struct ControllerArgs {
    /// Controllers to run: `*` for all, `name` to add one, `-name` to remove one
    /// (replicaset, replicationcontroller, deployment, garbagecollector, nodelifecycle, nodeipam,
    /// namespace, endpointslice, endpoint, serviceaccount, root-ca-cert-publisher).
    #[arg(long, value_delimiter = ',', default_value = "*")]
    pub controllers: Vec<String>,
    /// A node that renews neither its Lease nor its status for this long is unreachable.
    #[arg(long, default_value = "50s", value_parser = parse_go_duration)]
    pub node_monitor_grace_period: Duration,
    /// How often node health is checked.
    #[arg(long, default_value = "5s", value_parser = parse_go_duration)]
    pub node_monitor_period: Duration,
    /// Nodes whose pods are evicted per second when nodes fail.
    #[arg(long, default_value_t = 0.1)]
    pub node_eviction_rate: f64,
    /// Give every Node a pod CIDR (spec.podCIDR) from --cluster-cidr (the nodeipam controller).
    /// Off by default in `berth controller-manager`, as in kube-controller-manager; on by default
    /// in `berth server`.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub allocate_node_cidrs: Option<bool>,
    /// The IPv4 range Node pod CIDRs are cut from.
    #[arg(long, default_value = berth_controllers::DEFAULT_CLUSTER_CIDR, value_name = "CIDR",
        value_parser = parse_cluster_cidr)]
    pub cluster_cidr: Ipv4Net,
    /// The prefix length of each Node's pod CIDR; a cluster CIDR at least this long is one block.
    #[arg(long, default_value_t = berth_controllers::DEFAULT_NODE_CIDR_MASK_SIZE, value_name = "BITS")]
    pub node_cidr_mask_size: u8,
}

fn parse_cluster_cidr(text: &str) -> Result<Ipv4Net, String> {
    text.parse().map_err(|e: berth_controllers::node_ipam::CidrError| e.to_string())
}

impl ControllerArgs {
    /// The controllers' settings, with the cluster CA bundle (PEM) the root CA publisher puts
    /// in every namespace, if there is one; node CIDRs are allocated when `--allocate-node-cidrs`
    /// says so, else when `allocate_by_default`. A cluster CIDR and mask size that cannot be
    /// cut into blocks are an error when allocation is on.
    pub fn config(&self, root_ca: Option<String>, allocate_by_default: bool) -> anyhow::Result<Config> {
        let allocate_node_cidrs = self.allocate_node_cidrs.unwrap_or(allocate_by_default);
        if allocate_node_cidrs {
            CidrSet::new(self.cluster_cidr, self.node_cidr_mask_size)
                .map_err(|e| anyhow::anyhow!("--cluster-cidr/--node-cidr-mask-size: {e}"))?;
        }
        Ok(Config {
            node_monitor_grace_period: self.node_monitor_grace_period,
            node_monitor_period: self.node_monitor_period,
            node_eviction_rate: self.node_eviction_rate,
            root_ca,
            allocate_node_cidrs,
            cluster_cidr: self.cluster_cidr,
            node_cidr_mask_size: self.node_cidr_mask_size,
        })
    }
}

#[derive(clap::Args)]
pub struct Args {
    /// Kubeconfig of the API server to run the controllers for (any Kubernetes API server).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Elect one leader (Lease kube-system/kube-controller-manager) before running.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    leader_elect: bool,
    /// The cluster's CA bundle (PEM), published as `ca.crt` of the ConfigMap `kube-root-ca.crt`
    /// in every namespace; without it the root-ca-cert-publisher controller does not run.
    #[arg(long, value_name = "PATH")]
    root_ca_file: Option<PathBuf>,
    #[command(flatten)]
    controllers: ControllerArgs,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let enabled = berth_controllers::enabled(&args.controllers.controllers).map_err(anyhow::Error::msg)?;
    let root_ca = match &args.root_ca_file {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .with_context(|| format!("cannot read the root CA file {}", path.display()))?,
        ),
        None => None,
    };
    let config = args.controllers.config(root_ca, false)?;
    let client = client(args.kubeconfig.as_deref()).await?;
    manage(client, config, args.leader_elect, enabled, shutdown_signal()).await;
    Ok(())
}

/// Runs the `enabled` controllers until `shutdown`, as leader only when leader election is on.
pub async fn manage(
    client: kube::Client,
    config: Config,
    leader_elect: bool,
    enabled: std::collections::BTreeSet<&'static str>,
    shutdown: impl Future<Output = ()>,
) {
    let lease_client = client.clone();
    let work = move || {
        // A fresh context per term: caches start from a fresh list after a leader change.
        let ctx = Context::new(client.clone(), config.clone());
        let enabled = enabled.clone();
        async move { berth_controllers::run(ctx, &enabled).await }
    };
    lead(lease_client, LEASE_NAME, leader_elect, work, shutdown).await;
}
