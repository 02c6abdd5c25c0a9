//! `berth scheduler`: the scheduler alone against any Kubernetes API server, and the same
//! scheduler run inside `berth server`; both hold the Lease `kube-system/kube-scheduler` while
//! they schedule, so several of them place each pod once.

use std::path::PathBuf;

use berth_scheduler::metrics::Metrics;
use berth_scheduler::pod_info::DEFAULT_SCHEDULER_NAME;
use berth_scheduler::scheduler::{self, Config};

use super::leading::{client, lead, shutdown_signal};

/// The Lease kube-scheduler elects its leader with.
const LEASE_NAME: &str = "kube-scheduler";

/// Scheduling options shared by `berth scheduler` and `berth server`.
#[derive(clap::Args, Clone, Debug)]
pub struct SchedulingArgs {
    /// Elect one leader (Lease kube-system/kube-scheduler, and kube-controller-manager for the
    /// controllers) before scheduling or running controllers.
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
    let work = move || {
        let (client, config, metrics) = (client.clone(), config.clone(), metrics.clone());
        async move {
            if let Err(e) = scheduler::run(client, config, metrics).await {
                tracing::error!(error = %format!("{e:#}"), "the scheduler stopped");
            }
        }
    };
    lead(lease_client, LEASE_NAME, args.leader_elect, work, shutdown).await;
}
