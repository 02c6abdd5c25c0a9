//! `berth controller-manager`: the controllers alone against any Kubernetes API server, and the
//! same controllers run inside `berth server`; both hold the Lease
//! `kube-system/kube-controller-manager` while they work, so one set runs at a time.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use berth_controllers::{Config, Context};

use super::leading::{client, lead, parse_go_duration, shutdown_signal};

const LEASE_NAME: &str = "kube-controller-manager";

/// Controller options shared by `berth controller-manager` and `berth server`.
#[derive(clap::Args, Clone, Debug)]
pub struct ControllerArgs {
    /// Controllers to run: `*` for all, `name` to add one, `-name` to remove one
    /// (replicaset, replicationcontroller, deployment, garbagecollector, nodelifecycle, namespace,
    /// endpointslice, endpoint, serviceaccount, root-ca-cert-publisher).
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
}

impl ControllerArgs {
    /// The controllers' settings, with the cluster CA bundle (PEM) the root CA publisher puts
    /// in every namespace, if there is one.
    pub fn config(&self, root_ca: Option<String>) -> Config {
        Config {
            node_monitor_grace_period: self.node_monitor_grace_period,
            node_monitor_period: self.node_monitor_period,
            node_eviction_rate: self.node_eviction_rate,
            root_ca,
        }
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
    let client = client(args.kubeconfig.as_deref()).await?;
    manage(client, args.controllers.config(root_ca), args.leader_elect, enabled, shutdown_signal()).await;
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
