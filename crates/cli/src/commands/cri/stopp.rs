//! `berth cri stopp`: stops pods (their containers and sandbox), printing
//! `Stopped sandbox <id>` for each.

use k8s_cri::v1 as cri;

use super::{Context, rpc_error, wrap};

#[derive(clap::Args)]
pub struct Args {
    /// POD-ID [POD-ID...]; a unique prefix is enough.
    #[arg(required = true)]
    ids: Vec<String>,
}

pub async fn run(ctx: &Context, args: Args) -> anyhow::Result<()> {
    for id in &args.ids {
        stop_pod(ctx, id).await.map_err(|e| wrap(format!("stopping the pod sandbox {id:?}"), e))?;
    }
    Ok(())
}

pub async fn stop_pod(ctx: &Context, id: &str) -> anyhow::Result<()> {
    let mut rt = ctx.runtime().await?;
    let req = cri::StopPodSandboxRequest { pod_sandbox_id: id.into() };
    rt.stop_pod_sandbox(ctx.request(req)).await.map_err(rpc_error)?;
    println!("Stopped sandbox {id}");
    Ok(())
}
