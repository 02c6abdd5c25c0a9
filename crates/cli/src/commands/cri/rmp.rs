//! `berth cri rmp`: removes pods (`-f` stops ready ones first, `-a` all), printing
//! `Removed sandbox <id>` for each; errors are gathered and reported together, as crictl.

use anyhow::bail;
use k8s_cri::v1 as cri;

use super::{Context, rpc_error, stopp, wrap};

#[derive(clap::Args)]
pub struct Args {
    /// Force removal of the pod sandbox, disregarding if running.
    #[arg(short, long)]
    force: bool,
    /// Remove all pods.
    #[arg(short, long)]
    all: bool,
    /// POD-ID [POD-ID...]; a unique prefix is enough.
    #[arg(required_unless_present = "all")]
    ids: Vec<String>,
}

pub async fn run(ctx: &Context, args: Args) -> anyhow::Result<()> {
    let mut ids = args.ids;
    if args.all {
        let mut rt = ctx.runtime().await?;
        let r =
            rt.list_pod_sandbox(ctx.request(cri::ListPodSandboxRequest { filter: None })).await.map_err(rpc_error)?;
        ids = r.into_inner().items.into_iter().map(|p| p.id).collect();
        if ids.is_empty() {
            eprintln!("No pods to remove");
            return Ok(());
        }
    }
    let mut errors = Vec::new();
    for id in &ids {
        if let Err(e) = remove(ctx, id, args.force).await {
            errors.push(format!("{e:#}"));
        }
    }
    match errors.len() {
        0 => Ok(()),
        1 => bail!("{}", errors[0]),
        _ => bail!("[{}]", errors.join(", ")),
    }
}

async fn remove(ctx: &Context, id: &str, force: bool) -> anyhow::Result<()> {
    let mut rt = ctx.runtime().await?;
    let req = cri::PodSandboxStatusRequest { pod_sandbox_id: id.into(), verbose: false };
    let status = rt
        .pod_sandbox_status(ctx.request(req))
        .await
        .map_err(|s| wrap(format!("getting sandbox status of pod {id:?}"), rpc_error(s)))?
        .into_inner();
    if status.status.is_some_and(|s| s.state == cri::PodSandboxState::SandboxReady as i32) {
        if !force {
            bail!("pod sandbox {id:?} is running, please stop it first");
        }
        stopp::stop_pod(ctx, id).await.map_err(|e| wrap(format!("stopping the pod sandbox {id:?} failed"), e))?;
    }
    let req = cri::RemovePodSandboxRequest { pod_sandbox_id: id.into() };
    rt.remove_pod_sandbox(ctx.request(req))
        .await
        .map_err(|s| wrap(format!("removing the pod sandbox {id:?}"), rpc_error(s)))?;
    println!("Removed sandbox {id}");
    Ok(())
}
