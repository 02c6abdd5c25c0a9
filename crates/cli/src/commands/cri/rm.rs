//! `berth cri rm`: removes containers (`-f` stops running ones first, `-a` all), printing each
//! id; failures are reported per container and the verb fails at the end, as crictl.

use anyhow::bail;
use k8s_cri::v1 as cri;

use super::{Context, rpc_error, stop};

#[derive(clap::Args)]
pub struct Args {
    /// Force removal of the container, disregarding if running.
    #[arg(short, long)]
    force: bool,
    /// Remove all containers.
    #[arg(short, long)]
    all: bool,
    /// CONTAINER-ID [CONTAINER-ID...]; a unique prefix is enough.
    #[arg(required_unless_present = "all")]
    ids: Vec<String>,
}

pub async fn run(ctx: &Context, args: Args) -> anyhow::Result<()> {
    let mut rt = ctx.runtime().await?;
    let mut ids = args.ids;
    if args.all {
        let r =
            rt.list_containers(ctx.request(cri::ListContainersRequest { filter: None })).await.map_err(rpc_error)?;
        ids = r.into_inner().containers.into_iter().map(|c| c.id).collect();
        if ids.is_empty() {
            eprintln!("No containers to remove");
            return Ok(());
        }
    }
    let mut errored = false;
    for id in &ids {
        let req = cri::ContainerStatusRequest { container_id: id.clone(), verbose: false };
        let status = match rt.container_status(ctx.request(req)).await {
            Ok(r) => r.into_inner().status,
            Err(s) => {
                eprintln!("{}", rpc_error(s));
                errored = true;
                continue;
            }
        };
        if status.is_some_and(|s| s.state == cri::ContainerState::ContainerRunning as i32) {
            if !args.force {
                eprintln!("container {id:?} is running, please stop it first");
                errored = true;
                continue;
            }
            if let Err(e) = stop::stop(ctx, id, 0).await {
                eprintln!("stopping the container {id:?} failed: {e:#}");
                errored = true;
                continue;
            }
            println!("{id}");
        }
        let req = cri::RemoveContainerRequest { container_id: id.clone() };
        if let Err(s) = rt.remove_container(ctx.request(req)).await {
            eprintln!("removing container {id:?} failed: {}", rpc_error(s));
            errored = true;
            continue;
        }
        println!("{id}");
    }
    if errored {
        bail!("unable to remove container(s)");
    }
    Ok(())
}
