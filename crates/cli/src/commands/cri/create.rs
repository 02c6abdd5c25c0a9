//! `berth cri create` and `berth cri run`: a container from crictl's config files, pulling its
//! image first when asked (`create --with-pull`, `run` unless `--no-pull`).
//!
//! Unlike crictl, the pull names the pod's runtime handler: berth keeps images per handler
//! (KEP-4216), and a copy pulled for the default handler would not serve a gVisor pod.

use std::path::PathBuf;
use std::time::Duration;

use k8s_cri::v1 as cri;

use super::{Context, cancel_timeout, config, pull, rpc_error, runp, wrap};

#[derive(clap::Args)]
struct PullFlags {
    /// Do not pull the image.
    #[arg(long, conflicts_with = "with_pull")]
    no_pull: bool,
    /// Pull the image first.
    #[arg(long)]
    with_pull: bool,
    /// Registry credentials as USERNAME[:PASSWORD].
    #[arg(long, value_name = "USERNAME[:PASSWORD]", conflicts_with = "auth")]
    creds: Option<String>,
    /// Registry auth string: base64 of USERNAME:PASSWORD.
    #[arg(long, value_name = "AUTH_STRING")]
    auth: Option<String>,
}

#[derive(clap::Args)]
pub struct CreateArgs {
    #[command(flatten)]
    pull: PullFlags,
    /// Seconds to wait for the request to complete before cancelling it; the global timeout
    /// when not given.
    #[arg(short = 'T', long, value_parser = super::parse_duration)]
    cancel_timeout: Option<Duration>,
    /// The pod to create the container in.
    pod: String,
    /// container-config.[json|yaml]
    container_config: PathBuf,
    /// pod-config.[json|yaml]
    pod_config: PathBuf,
}

#[derive(clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    pull: PullFlags,
    /// Runtime handler for the pod; the runtime's default when not given.
    #[arg(short = 'r', long, value_name = "HANDLER", default_value = "")]
    runtime: String,
    /// Seconds to wait for the container create request before cancelling it.
    #[arg(short = 't', long, value_parser = super::parse_duration)]
    timeout: Option<Duration>,
    /// container-config.[json|yaml]
    container_config: PathBuf,
    /// pod-config.[json|yaml]
    pod_config: PathBuf,
}

pub async fn run_create(ctx: &Context, args: CreateArgs) -> anyhow::Result<()> {
    let pull = args.pull.with_pull;
    let timeout = cancel_timeout(ctx, args.cancel_timeout);
    let id = create(ctx, &args.pod, &args.container_config, &args.pod_config, pull, &args.pull, timeout)
        .await
        .map_err(|e| wrap("creating container", e))?;
    println!("{id}");
    Ok(())
}

pub async fn run_run(ctx: &Context, args: RunArgs) -> anyhow::Result<()> {
    let timeout = cancel_timeout(ctx, args.timeout);
    let result = async {
        let pod_config = config::load_pod_config(&args.pod_config).map_err(|e| wrap("load podSandboxConfig", e))?;
        let pod =
            runp::run_pod(ctx, pod_config, &args.runtime, timeout).await.map_err(|e| wrap("run pod sandbox", e))?;
        let pull = !args.pull.no_pull;
        let id = create(ctx, &pod, &args.container_config, &args.pod_config, pull, &args.pull, timeout)
            .await
            .map_err(|e| wrap("creating container failed", e))?;
        super::start::start(ctx, &id).await.map_err(|e| wrap(format!("starting the container {id:?}"), e))?;
        println!("{id}");
        anyhow::Ok(())
    };
    result.await.map_err(|e| wrap("running container", e))
}

async fn create(
    ctx: &Context,
    pod: &str,
    container_config: &std::path::Path,
    pod_config: &std::path::Path,
    pull: bool,
    flags: &PullFlags,
    timeout: Duration,
) -> anyhow::Result<String> {
    let mut config = config::load_container_config(container_config)?;
    let pod_config = config::load_pod_config(pod_config)?;
    let image = config.image.get_or_insert_with(Default::default);
    if image.user_specified_image.is_empty() {
        image.user_specified_image = image.image.clone();
    }
    let mut rt = ctx.runtime().await?;
    if pull {
        let auth = pull::auth_config(flags.creds.as_deref(), flags.auth.as_deref())?;
        let status = rt
            .pod_sandbox_status(
                ctx.request(cri::PodSandboxStatusRequest { pod_sandbox_id: pod.into(), verbose: false }),
            )
            .await
            .map_err(|s| wrap(format!("getting the pod sandbox status for {pod:?}"), rpc_error(s)))?
            .into_inner();
        let handler = status.status.map(|s| s.runtime_handler).unwrap_or_default();
        let spec = cri::ImageSpec {
            image: image.image.clone(),
            annotations: image.annotations.clone(),
            runtime_handler: handler,
            ..Default::default()
        };
        let req = cri::PullImageRequest { image: Some(spec), auth, sandbox_config: Some(pod_config.clone()) };
        // Pulls take as long as they take: no deadline, as crictl.
        ctx.images().await?.pull_image(req).await.map_err(|s| wrap("pulling image", rpc_error(s)))?;
    }
    let req = cri::CreateContainerRequest {
        pod_sandbox_id: pod.into(),
        config: Some(config),
        sandbox_config: Some(pod_config),
    };
    let resp = rt.create_container(ctx.request_with(req, Some(timeout))).await.map_err(rpc_error)?;
    Ok(resp.into_inner().container_id)
}
