//! `berth cri start`: starts created containers, printing each id.

use k8s_cri::v1 as cri;

use super::{Context, rpc_error, wrap};

#[derive(clap::Args)]
pub struct Args {
    /// CONTAINER-ID [CONTAINER-ID...]; a unique prefix is enough.
    #[arg(required = true)]
    ids: Vec<String>,
}

pub async fn run(ctx: &Context, args: Args) -> anyhow::Result<()> {
    for id in &args.ids {
        start(ctx, id).await.map_err(|e| wrap(format!("starting the container {id:?}"), e))?;
        println!("{id}");
    }
    Ok(())
}

pub async fn start(ctx: &Context, id: &str) -> anyhow::Result<()> {
    let mut rt = ctx.runtime().await?;
    rt.start_container(ctx.request(cri::StartContainerRequest { container_id: id.into() })).await.map_err(rpc_error)?;
    Ok(())
}
