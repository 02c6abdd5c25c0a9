//! `berth cri port-forward`: forwards local ports to a pod through the runtime's stream.

use anyhow::bail;
use k8s_cri::v1 as cri;

use super::{Context, rpc_error, stream, wrap};

#[derive(clap::Args)]
pub struct Args {
    /// POD-ID; a unique prefix is enough.
    id: String,
    /// [LOCAL_PORT:]REMOTE_PORT...
    #[arg(required = true)]
    ports: Vec<String>,
}

/// `8080:80` → (8080, 80); `80` → (80, 80), as kubectl reads port specs.
fn parse_port(spec: &str) -> anyhow::Result<(u16, u16)> {
    let (local, remote) = spec.split_once(':').unwrap_or((spec, spec));
    let remote: u16 = remote.parse().map_err(|_| anyhow::anyhow!("invalid port {spec:?}"))?;
    // An empty local port asks for any free one.
    let local: u16 =
        if local.is_empty() { 0 } else { local.parse().map_err(|_| anyhow::anyhow!("invalid port {spec:?}"))? };
    if remote == 0 {
        bail!("invalid port {spec:?}: the remote port must not be 0");
    }
    Ok((local, remote))
}

pub async fn run(ctx: &Context, args: Args) -> anyhow::Result<()> {
    let forward = async {
        let ports = args.ports.iter().map(|p| parse_port(p)).collect::<anyhow::Result<Vec<_>>>()?;
        let mut rt = ctx.runtime().await?;
        let req = cri::PortForwardRequest {
            pod_sandbox_id: args.id.clone(),
            port: ports.iter().map(|(_, remote)| i32::from(*remote)).collect(),
        };
        let url = rt.port_forward(ctx.request(req)).await.map_err(rpc_error)?.into_inner().url;
        stream::port_forward(&url, &ports).await
    };
    forward.await.map_err(|e| wrap("port forward", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_specs_are_local_colon_remote_or_one_port() {
        assert_eq!(parse_port("8080:80").unwrap(), (8080, 80));
        assert_eq!(parse_port("80").unwrap(), (80, 80));
        assert_eq!(parse_port(":80").unwrap(), (0, 80));
        assert!(parse_port("x:80").is_err());
        assert!(parse_port("80:0").is_err());
        assert!(parse_port("70000").is_err());
    }
}
