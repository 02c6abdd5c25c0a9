//! `berth cri attach`: attaches to a running container's stdio through the runtime's stream,
//! until the container exits or we are interrupted.

use k8s_cri::v1 as cri;

use super::{Context, Exit, rpc_error, stream, wrap};

#[derive(clap::Args)]
pub struct Args {
    /// Allocate a pseudo-TTY.
    #[arg(short, long)]
    tty: bool,
    /// Keep STDIN open.
    #[arg(short = 'i', long)]
    stdin: bool,
    /// CONTAINER-ID; a unique prefix is enough.
    id: String,
}

pub async fn run(ctx: &Context, args: Args) -> anyhow::Result<()> {
    let attach = async {
        let mut rt = ctx.runtime().await?;
        let req = cri::AttachRequest {
            container_id: args.id.clone(),
            stdin: args.stdin,
            tty: args.tty,
            stdout: true,
            stderr: !args.tty,
        };
        let url = rt.attach(ctx.request(req)).await.map_err(rpc_error)?.into_inner().url;
        stream::stream_command(&url, args.stdin, args.tty).await
    };
    match attach.await.map_err(|e| wrap("attaching running container failed", e))? {
        0 => Ok(()),
        code => Err(Exit(code).into()),
    }
}
