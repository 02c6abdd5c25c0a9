//! `berth cri version`: the runtime's name and versions, in crictl's four lines.

use k8s_cri::v1 as cri;

use super::{Context, rpc_error};

/// The CRI API version this client speaks.
const CLIENT_API_VERSION: &str = "v1";

pub async fn run(ctx: &Context) -> anyhow::Result<()> {
    let mut rt = ctx.runtime().await?;
    let req = cri::VersionRequest { version: CLIENT_API_VERSION.into() };
    let v = rt.version(ctx.request(req)).await.map_err(rpc_error)?.into_inner();
    println!("Version:  {}", v.version);
    println!("RuntimeName:  {}", v.runtime_name);
    println!("RuntimeVersion:  {}", v.runtime_version);
    println!("RuntimeApiVersion:  {}", v.runtime_api_version);
    Ok(())
}
