//! `berth cri inspecti`: crictl's image status JSON — `status` (the CRI `Image`, handler in
//! `status.spec.runtimeHandler`) and the runtime's verbose `info` (chosen platform, manifest, config).

use anyhow::bail;
use k8s_cri::v1 as cri;

use super::output::{self, Format};
use super::{Context, image_spec, rpc_error};

#[derive(clap::Args)]
pub struct Args {
    /// Runtime handler whose copy is shown; the runtime's default when not given.
    #[arg(long, value_name = "HANDLER", default_value = "")]
    runtime: String,
    /// Output format.
    #[arg(short, long, value_enum, default_value = "json")]
    output: Format,
    #[arg(required = true)]
    images: Vec<String>,
}

pub async fn run(ctx: &Context, args: Args) -> anyhow::Result<()> {
    let mut client = ctx.images().await?;
    let mut missing = Vec::new();
    for image in &args.images {
        let req = cri::ImageStatusRequest { image: Some(image_spec(image, &args.runtime)), verbose: true };
        let resp = client.image_status(ctx.request(req)).await.map_err(rpc_error)?.into_inner();
        let Some(status) = &resp.image else {
            missing.push(image.as_str());
            continue;
        };
        let doc = output::status_info(output::image(status), vec![], &resp.info);
        output::print(&doc, args.output)?;
    }
    if !missing.is_empty() {
        bail!("no such image {}", missing.join(", "));
    }
    Ok(())
}
