//! `berth cri exec`: runs a command in a container. `-s` uses ExecSync; without it, an Exec
//! stream (with our stdin for `-i`, a terminal for `-t`). Either way the command's stdout and
//! stderr go to ours and its exit code becomes ours.

use std::io::Write;
use std::time::Duration;

use k8s_cri::v1 as cri;

use super::{Context, Exit, rpc_error, stream, wrap};

#[derive(clap::Args)]
pub struct Args {
    /// Run the command synchronously.
    #[arg(short, long)]
    sync: bool,
    /// Timeout in seconds (0: none).
    #[arg(long, default_value_t = 0)]
    timeout: i64,
    /// Allocate a pseudo-TTY.
    #[arg(short, long)]
    tty: bool,
    /// Keep STDIN open.
    #[arg(short, long)]
    interactive: bool,
    /// CONTAINER-ID; a unique prefix is enough.
    id: String,
    /// COMMAND [ARG...]
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    cmd: Vec<String>,
}

#[cfg(test)]
impl Args {
    pub fn cmd(&self) -> &[String] {
        &self.cmd
    }
}

pub async fn run(ctx: &Context, args: Args) -> anyhow::Result<()> {
    if args.sync {
        let code = exec_sync(ctx, &args).await.map_err(|e| wrap("execing command in container synchronously", e))?;
        return exit(code);
    }
    let code = exec_stream(ctx, &args).await.map_err(|e| wrap("execing command in container", e))?;
    exit(code)
}

fn exit(code: i32) -> anyhow::Result<()> {
    if code == 0 { Ok(()) } else { Err(Exit(code).into()) }
}

async fn exec_sync(ctx: &Context, args: &Args) -> anyhow::Result<i32> {
    let mut rt = ctx.runtime().await?;
    let req = cri::ExecSyncRequest { container_id: args.id.clone(), cmd: args.cmd.clone(), timeout: args.timeout };
    // The call lasts as long as the command may, plus the usual timeout; no limit if none.
    let deadline = (args.timeout > 0).then(|| ctx.timeout + Duration::from_secs(args.timeout as u64));
    let r = rt.exec_sync(ctx.request_with(req, deadline)).await.map_err(rpc_error)?.into_inner();
    let _ = std::io::stdout().write_all(&r.stdout);
    let _ = std::io::stderr().write_all(&r.stderr);
    Ok(r.exit_code)
}

async fn exec_stream(ctx: &Context, args: &Args) -> anyhow::Result<i32> {
    let mut rt = ctx.runtime().await?;
    let req = cri::ExecRequest {
        container_id: args.id.clone(),
        cmd: args.cmd.clone(),
        tty: args.tty,
        stdin: args.interactive,
        stdout: true,
        // A terminal merges stderr into stdout.
        stderr: !args.tty,
    };
    let url = rt.exec(ctx.request(req)).await.map_err(rpc_error)?.into_inner().url;
    stream::stream_command(&url, args.interactive, args.tty).await
}
