//! `berth scheduler`: the scheduler alone against any Kubernetes API server, and the same
//! scheduler run inside `berth server`; both hold the Lease `kube-system/kube-scheduler` while
//! they schedule, so several of them place each pod once.

use std::path::PathBuf;

use anyhow::Context;
use berth_leader::{LeaderElector, LeaseConfig, default_identity};
use berth_scheduler::metrics::Metrics;
use berth_scheduler::pod_info::DEFAULT_SCHEDULER_NAME;
use berth_scheduler::scheduler::{self, Config};

/// The Lease kube-scheduler elects its leader with.
const LEASE_NAMESPACE: &str = "kube-system";
const LEASE_NAME: &str = "kube-scheduler";

/// Scheduling options shared by `berth scheduler` and `berth server`.
#[derive(clap::Args, Clone, Debug)]
pub struct SchedulingArgs {
    /// Elect one leader among several schedulers (Lease kube-system/kube-scheduler) before scheduling.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    /// Share of nodes to look at for each pod in large clusters, in percent; 0 adapts it to the
    /// cluster's size as kube-scheduler does.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=100))]
    pub percentage_of_nodes_to_score: u32,
}

#[derive(clap::Args)]
pub struct Args {
    /// Kubeconfig of the API server to schedule for (any Kubernetes API server).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Schedule the pods whose spec.schedulerName is this.
    #[arg(long, default_value = DEFAULT_SCHEDULER_NAME)]
    scheduler_name: String,
    #[command(flatten)]
    scheduling: SchedulingArgs,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let client = client(args.kubeconfig.as_deref()).await?;
    let metrics = Metrics::new(&args.scheduler_name);
    let config = Config {
        scheduler_name: args.scheduler_name,
        percentage_of_nodes_to_score: args.scheduling.percentage_of_nodes_to_score,
    };
    schedule(client, config, &args.scheduling, metrics, shutdown_signal()).await;
    Ok(())
}

/// Schedules until `shutdown`, as leader only when leader election is on.
pub async fn schedule(
    client: kube::Client,
    config: Config,
    args: &SchedulingArgs,
    metrics: Metrics,
    shutdown: impl Future<Output = ()>,
) {
    let lease_client = client.clone();
    let lead = move || {
        let (client, config, metrics) = (client.clone(), config.clone(), metrics.clone());
        async move {
            if let Err(e) = scheduler::run(client, config, metrics).await {
                tracing::error!(error = %format!("{e:#}"), "the scheduler stopped");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
        }
    };
    if args.leader_elect {
        let lease = LeaseConfig::new(LEASE_NAMESPACE, LEASE_NAME, default_identity());
        LeaderElector::new(lease_client, lease).run(lead, shutdown).await;
    } else {
        tokio::select! {
            _ = async { loop { lead().await } } => {}
            _ = shutdown => {}
        }
    }
}

/// The client of `path`, or of kube's inference (KUBECONFIG, in-cluster) without one.
pub async fn client(path: Option<&std::path::Path>) -> anyhow::Result<kube::Client> {
    let config = match path {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("cannot read kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .with_context(|| format!("cannot use kubeconfig {}", path.display()))?
        }
        None => kube::Config::infer().await.context("cannot find a kubeconfig (give --kubeconfig)")?,
    };
    kube::Client::try_from(config).context("cannot build the API client")
}

pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut term) = signal(SignalKind::terminate()) else { return std::future::pending().await };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
