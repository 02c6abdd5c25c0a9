//! `berth cri stop`: stops running containers (SIGTERM, then SIGKILL after `--timeout`),
//! printing each id.

use std::time::Duration;

use k8s_cri::v1 as cri;

use super::{Context, rpc_error, wrap};

#[derive(clap::Args)]
pub struct Args {
    /// Seconds to wait to kill the container after a graceful stop is requested.
    #[arg(short = 't', long, default_value_t = 0)]
    timeout: i64,
    /// CONTAINER-ID [CONTAINER-ID...]; a unique prefix is enough.
    #[arg(required = true)]
    ids: Vec<String>,
}

pub async fn run(ctx: &Context, args: Args) -> anyhow::Result<()> {
    for id in &args.ids {
        stop(ctx, id, args.timeout).await.map_err(|e| wrap(format!("stopping the container {id:?}"), e))?;
        println!("{id}");
    }
    Ok(())
}

pub async fn stop(ctx: &Context, id: &str, grace_secs: i64) -> anyhow::Result<()> {
    let mut rt = ctx.runtime().await?;
    let req = cri::StopContainerRequest { container_id: id.into(), timeout: grace_secs };
    // The call lasts as long as the grace period, on top of the usual timeout (as the kubelet).
    let deadline = ctx.timeout + Duration::from_secs(grace_secs.max(0) as u64);
    rt.stop_container(ctx.request_with(req, Some(deadline))).await.map_err(rpc_error)?;
    Ok(())
}
