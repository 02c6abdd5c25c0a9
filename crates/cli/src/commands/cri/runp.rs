//! `berth cri runp`: runs a pod sandbox from a config file and prints its id.

use std::path::PathBuf;
use std::time::Duration;

use k8s_cri::v1 as cri;

use super::{Context, cancel_timeout, config, rpc_error, wrap};

#[derive(clap::Args)]
pub struct Args {
    /// Runtime handler to use; the runtime's default when not given.
    #[arg(short = 'r', long, value_name = "HANDLER", default_value = "")]
    runtime: String,
    /// Seconds to wait for the request to complete before cancelling it; the global timeout
    /// when not given.
    #[arg(short = 'T', long, value_parser = super::parse_duration)]
    cancel_timeout: Option<Duration>,
    /// pod-config.[json|yaml]
    config: PathBuf,
}

pub async fn run(ctx: &Context, args: Args) -> anyhow::Result<()> {
    let config = config::load_pod_config(&args.config).map_err(|e| wrap("load podSandboxConfig", e))?;
    let timeout = cancel_timeout(ctx, args.cancel_timeout);
    let id = run_pod(ctx, config, &args.runtime, timeout).await.map_err(|e| wrap("run pod sandbox", e))?;
    println!("{id}");
    Ok(())
}

/// RunPodSandbox; the id of the new sandbox.
pub async fn run_pod(
    ctx: &Context,
    config: cri::PodSandboxConfig,
    handler: &str,
    timeout: Duration,
) -> anyhow::Result<String> {
    let mut rt = ctx.runtime().await?;
    let req = cri::RunPodSandboxRequest { config: Some(config), runtime_handler: handler.into() };
    // Sandboxes take longer than other calls; the kubelet's CRI client doubles the timeout too.
    let resp = rt.run_pod_sandbox(ctx.request_with(req, Some(timeout * 2))).await.map_err(rpc_error)?;
    Ok(resp.into_inner().pod_sandbox_id)
}
