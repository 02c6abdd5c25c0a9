//! `berth cri imagefsinfo`: the image filesystem's usage as crictl prints it.

use k8s_cri::v1 as cri;

use super::output::{self, Format};
use super::{Context, rpc_error};

#[derive(clap::Args)]
pub struct Args {
    /// Output format.
    #[arg(short, long, value_enum, default_value = "json")]
    output: Format,
}

pub async fn run(ctx: &Context, args: Args) -> anyhow::Result<()> {
    let mut client = ctx.images().await?;
    let resp = client.image_fs_info(ctx.request(cri::ImageFsInfoRequest {})).await.map_err(rpc_error)?.into_inner();
    let doc = output::status_info(output::image_fs_info(&resp), vec![], &Default::default());
    output::print(&doc, args.output)
}
