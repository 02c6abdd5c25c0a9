//! `berth cri rmi`: removes images for one runtime handler (the default one unless `--runtime`),
//! or for every handler with `--all-runtimes`; crictl prints `Deleted: <name>` per name.

use std::collections::BTreeSet;

use anyhow::bail;
use k8s_cri::v1 as cri;

use super::{Context, image_spec, rpc_error};

#[derive(clap::Args)]
pub struct Args {
    /// Runtime handler whose copy is removed; the runtime's default when not given.
    #[arg(long, value_name = "HANDLER", default_value = "", conflicts_with = "all_runtimes")]
    runtime: String,
    /// Remove the image for every runtime handler that has it.
    #[arg(long)]
    all_runtimes: bool,
    /// Remove all images.
    #[arg(short, long, conflicts_with = "prune")]
    all: bool,
    /// Remove all images not used by a container.
    #[arg(short = 'q', long)]
    prune: bool,
    #[arg(required_unless_present_any = ["all", "prune"], conflicts_with_all = ["all", "prune"])]
    images: Vec<String>,
}

pub async fn run(ctx: &Context, args: Args) -> anyhow::Result<()> {
    let mut client = ctx.images().await?;
    let mut targets: Vec<cri::Image> = Vec::new();
    let mut errors = Vec::new();

    if args.all || args.prune {
        let filter =
            (!args.runtime.is_empty()).then(|| cri::ImageFilter { image: Some(image_spec("", &args.runtime)) });
        targets = client
            .list_images(ctx.request(cri::ListImagesRequest { filter }))
            .await
            .map_err(rpc_error)?
            .into_inner()
            .images;
        if args.prune {
            let in_use = images_in_use(ctx).await?;
            targets.retain(|i| !in_use.contains(&i.id));
        }
    } else {
        let handlers = if args.all_runtimes { all_handlers(ctx).await? } else { vec![args.runtime.clone()] };
        for image in &args.images {
            let mut found = false;
            for h in &handlers {
                let req = cri::ImageStatusRequest { image: Some(image_spec(image, h)), verbose: false };
                match client.image_status(ctx.request(req)).await {
                    Ok(r) => {
                        if let Some(mut i) = r.into_inner().image {
                            // Remember which handler's copy this is, whatever the runtime filled in.
                            let spec = i.spec.get_or_insert_with(Default::default);
                            if spec.runtime_handler.is_empty() {
                                spec.runtime_handler = h.clone();
                            }
                            targets.push(i);
                            found = true;
                        }
                    }
                    Err(s) => {
                        errors.push(format!("image status of {image:?}: {}", rpc_error(s)));
                        found = true;
                    }
                }
            }
            if !found {
                errors.push(format!("no such image {image}"));
            }
        }
    }

    for i in targets {
        let handler = i.spec.as_ref().map_or("", |s| s.runtime_handler.as_str());
        let req = cri::RemoveImageRequest { image: Some(image_spec(&i.id, handler)) };
        if let Err(s) = client.remove_image(ctx.request(req)).await {
            errors.push(format!("removing image {}: {}", i.id, rpc_error(s)));
            continue;
        }
        // Images pulled by digest have no tags: crictl names them by digest then.
        let names = if i.repo_tags.is_empty() { &i.repo_digests } else { &i.repo_tags };
        for name in names {
            println!("Deleted: {name}");
        }
    }
    if !errors.is_empty() {
        bail!("unable to remove the image(s):\n{}", errors.join("\n"));
    }
    Ok(())
}

/// Every handler the runtime names in its status (`""` if it names none).
async fn all_handlers(ctx: &Context) -> anyhow::Result<Vec<String>> {
    let mut rt = ctx.runtime().await?;
    let status = rt.status(ctx.request(cri::StatusRequest { verbose: false })).await.map_err(rpc_error)?.into_inner();
    let names: Vec<String> = status.runtime_handlers.into_iter().map(|h| h.name).filter(|n| !n.is_empty()).collect();
    Ok(if names.is_empty() { vec![String::new()] } else { names })
}

/// Image ids containers use. A runtime that cannot list containers cannot tell what is unused,
/// so pruning refuses rather than remove images a container may need.
async fn images_in_use(ctx: &Context) -> anyhow::Result<BTreeSet<String>> {
    let mut rt = ctx.runtime().await?;
    match rt.list_containers(ctx.request(cri::ListContainersRequest { filter: None })).await {
        Ok(r) => Ok(r
            .into_inner()
            .containers
            .into_iter()
            .flat_map(|c| [Some(c.image_ref), c.image.map(|i| i.image)].into_iter().flatten())
            .collect()),
        Err(s) if s.code() == tonic::Code::Unimplemented => {
            bail!("cannot prune: the runtime does not list containers ({})", s.message())
        }
        Err(s) => Err(rpc_error(s)),
    }
}
