//! `berth runtime`: the CRI runtime, serving images per runtime handler on a unix socket.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use berth_image::Images;
use berth_runtime::config::{self, Config};
use berth_runtime::cri::{Cri, Options, grpc};
use berth_runtime::server;

#[derive(clap::Args)]
pub struct Args {
    /// The TOML config; when the default one is missing, the runc, crun and runsc found on PATH are
    /// configured with defaults.
    #[arg(long, value_name = "PATH")]
    config: Option<PathBuf>,
    /// CRI socket, instead of the config's `socket`.
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// State root, instead of the config's `root`.
    #[arg(long, value_name = "PATH")]
    root: Option<PathBuf>,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let path = args.config.clone().unwrap_or_else(|| PathBuf::from(config::DEFAULT_CONFIG_PATH));
    let mut cfg = Config::load(&path, args.config.is_some()).context("loading the runtime config")?;
    if let Some(socket) = args.socket {
        cfg.socket = std::path::absolute(socket).context("--socket")?;
    }
    if let Some(root) = args.root {
        cfg.root = std::path::absolute(root).context("--root")?;
    }
    let search_path = std::env::var_os("PATH").unwrap_or_default();
    for h in cfg.handlers.values() {
        let found = (h.binary.is_absolute() && h.binary.exists())
            || config::find_on_path(&h.binary.to_string_lossy(), &search_path).is_some();
        if !found {
            tracing::warn!(handler = h.name, binary = %h.binary.display(), "runtime binary not found");
        }
        tracing::info!(handler = h.name, platform = %h.platform, default = h.name == cfg.default_handler, "runtime handler");
    }

    let images_config = cfg.images_config();
    let images = tokio::task::spawn_blocking(move || Images::open(images_config))
        .await?
        .with_context(|| format!("opening the image store in {}", cfg.images_root().display()))?;
    let listener = server::bind(&cfg.socket).await?;
    let cri = Cri::open(cfg, Arc::new(images), Options::default()).await.context("starting the CRI runtime")?;
    let routes = grpc::routes(cri.clone());
    let _trim = crate::memory::spawn_trim_when_quiet(berth_runtime::server::rpcs_started);
    let closing = cri.clone();
    listener
        .serve(routes, async move {
            shutdown_signal().await;
            closing.close();
        })
        .await?;
    // Removals answered before the signal finish their host side (a kill leaves it to the next start).
    if !cri.finish_background(BACKGROUND_WAIT).await {
        tracing::warn!("background cleanups still running; the next start finishes them");
    }
    tracing::info!("berth runtime stopped");
    Ok(())
}

/// How long a graceful stop waits for cleanups that run after their RPC answered.
const BACKGROUND_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// SIGINT or SIGTERM.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("installing the SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutting down");
}
