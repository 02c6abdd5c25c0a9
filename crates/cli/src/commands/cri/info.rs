//! `berth cri info`: the runtime's verbose status — conditions, handlers and config — as crictl
//! prints it.

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
    let mut rt = ctx.runtime().await?;
    let r = rt.status(ctx.request(cri::StatusRequest { verbose: true })).await.map_err(rpc_error)?.into_inner();
    let mut extra = Vec::new();
    if !r.runtime_handlers.is_empty() {
        extra.push(("runtimeHandlers", output::runtime_handlers(&r.runtime_handlers)));
    }
    if let Some(f) = &r.features {
        extra.push(("features", serde_json::json!({"supplementalGroupsPolicy": f.supplemental_groups_policy})));
    }
    let doc = output::status_info(output::runtime_status(r.status.as_ref()), extra, &r.info);
    output::print(&doc, args.output)
}
