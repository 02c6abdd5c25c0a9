//! `berth agent`'s main loop: configuration, runtime status polling, the Node, pods and the kubelet API.
//!
//! [`run`] resolves the configuration, connects to the control plane and the CRI endpoints,
//! then runs side by side: the status poller (every endpoint's `Version` and `Status` every
//! [`POLL_INTERVAL`] and right after a configuration change), the Node reporter
//! ([`crate::node`]), the configuration watcher (SIGHUP, and the file's content checked every
//! [`CONFIG_CHECK_INTERVAL`]), the pod workers and the kubelet API. They share a [`Context`].

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use berth_common::error::error_chain;
use tokio::sync::{Notify, watch};

use crate::config::{Config, ConfigError, FileConfig, Flags, ProxyMode};
use crate::endpoint::{Endpoint, EndpointError};
use crate::node::NodeReporter;
use crate::runtimes::{RuntimeManager, probe};

/// How often every endpoint's `Version` and `Status` are read.
pub const POLL_INTERVAL: Duration = Duration::from_secs(2);
/// How often the config file's content is compared with the running one.
pub const CONFIG_CHECK_INTERVAL: Duration = Duration::from_secs(2);

/// What the agent's parts share. Cheap to clone.
#[derive(Clone)]
pub struct Context {
    /// The control plane, as this node.
    pub client: kube::Client,
    /// The CRI endpoints, their status and the pod→endpoint cache.
    pub runtimes: Arc<RuntimeManager>,
    pub node_name: String,
    /// The agent's own state (`--root-dir`), created at start.
    pub root_dir: PathBuf,
    /// The kubelet API's port (`--port`).
    pub port: u16,
    /// The running configuration; changes when the config file does (endpoints, partial
    /// readiness and the image GC thresholds apply at once, the rest after a restart).
    pub config: watch::Receiver<Arc<Config>>,
    /// Asks the status poller to read every endpoint now.
    pub poll_now: Arc<Notify>,
}

impl Context {
    /// `(--image-gc-high-threshold, --image-gc-low-threshold)` as configured now, in percent.
    pub fn image_gc_thresholds(&self) -> (u8, u8) {
        let config = self.config.borrow();
        (config.image_gc_high_threshold, config.image_gc_low_threshold)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("invalid configuration")]
    Config(#[from] ConfigError),
    #[error("reading kubeconfig {path}")]
    Kubeconfig {
        path: PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("finding a kubeconfig (give --kubeconfig)")]
    InferKubeconfig(#[source] kube::config::InferConfigError),
    #[error("building the API client")]
    Client(#[source] kube::Error),
    #[error("creating the root dir {path}")]
    RootDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("configuring endpoint {name}")]
    Endpoint {
        name: String,
        #[source]
        source: EndpointError,
    },
    #[error("installing a signal handler")]
    Signal(#[source] std::io::Error),
    #[error("the pod workers stopped")]
    Pods(#[source] crate::pods::Error),
    #[error("serving the kubelet API")]
    KubeletApi(#[source] crate::http::Error),
}

/// Where container logs live, `<namespace>_<pod>_<uid>/<container>/<restart>.log`, as kubelet keeps them.
pub const POD_LOG_DIR: &str = "/var/log/pods";

/// The kube client of `config.kubeconfig`, or of kube's inference without one.
pub async fn client(config: &Config) -> Result<kube::Client, AgentError> {
    let kube_config = match &config.kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .map_err(|source| AgentError::Kubeconfig { path: path.clone(), source })?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .map_err(|source| AgentError::Kubeconfig { path: path.clone(), source })?
        }
        None => kube::Config::infer().await.map_err(AgentError::InferKubeconfig)?,
    };
    kube::Client::try_from(kube_config).map_err(AgentError::Client)
}

/// The endpoints of a configuration, connected lazily.
pub fn endpoints(config: &Config) -> Result<Vec<Endpoint>, AgentError> {
    config
        .endpoints
        .iter()
        .map(|e| Endpoint::from_config(e).map_err(|source| AgentError::Endpoint { name: e.name.clone(), source }))
        .collect()
}

/// Runs the agent until SIGTERM or SIGINT. Containers keep running when it stops.
pub async fn run(flags: Flags) -> Result<(), AgentError> {
    let config = Config::load(&flags)?;
    let (cluster_dns, cluster_domain) = (config.cluster_dns.clone(), config.cluster_domain.clone());
    let ctx = start(flags, config).await?;
    let thresholds = ctx.clone();
    let pods = crate::pods::run(crate::pods::Settings {
        client: ctx.client.clone(),
        node_name: ctx.node_name.clone(),
        runtimes: ctx.runtimes.clone(),
        root_dir: ctx.root_dir.clone(),
        pod_log_dir: PathBuf::from(POD_LOG_DIR),
        image_gc_thresholds: Box::new(move || thresholds.image_gc_thresholds()),
        cluster_dns,
        cluster_domain,
    });
    let kubelet_api = crate::http::serve(crate::http::Settings {
        client: ctx.client.clone(),
        node_name: ctx.node_name.clone(),
        runtimes: ctx.runtimes.clone(),
        port: ctx.port,
        bind_address: IpAddr::from([0, 0, 0, 0]),
        cert_dir: ctx.root_dir.join("pki"),
    });
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).map_err(AgentError::Signal)?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
        result = pods => {
            result.map_err(AgentError::Pods)?;
        }
        result = kubelet_api => {
            result.map_err(AgentError::KubeletApi)?;
        }
    }
    tracing::info!(node = %ctx.node_name, "berth agent stopping; containers keep running");
    Ok(())
}

/// Connects everything and starts the background tasks (status poller, Node reporter, config
/// watcher); returns the shared context for the pod workers and the kubelet API.
pub async fn start(flags: Flags, config: Config) -> Result<Context, AgentError> {
    std::fs::create_dir_all(&config.root_dir)
        .map_err(|source| AgentError::RootDir { path: config.root_dir.clone(), source })?;
    if flags.container_runtime_endpoint.is_some() && config.config_file.is_some() {
        tracing::info!("--container-runtime-endpoint is given: the config file's [[endpoints]] are not used");
    }
    let client = client(&config).await?;
    let runtimes = Arc::new(RuntimeManager::new(config.node_name.clone()));
    runtimes.set_endpoints(endpoints(&config)?);
    for e in &config.endpoints {
        tracing::info!(name = %e.name, workload_type = %e.workload_type, endpoint = %e.endpoint, "CRI endpoint");
    }
    // One round before the Node is registered, so it starts with the runtimes' real status.
    poll_once(&runtimes).await;

    let file_text = config.config_file.as_ref().and_then(|p| std::fs::read_to_string(p).ok());
    let (config_tx, config_rx) = watch::channel(Arc::new(config.clone()));
    let ctx = Context {
        client,
        runtimes: Arc::clone(&runtimes),
        node_name: config.node_name.clone(),
        root_dir: config.root_dir.clone(),
        port: config.port,
        config: config_rx,
        poll_now: Arc::new(Notify::new()),
    };
    tokio::spawn(poll_runtimes(Arc::clone(&runtimes), Arc::clone(&ctx.poll_now)));
    tokio::spawn(NodeReporter::new(ctx.clone()).run());
    tokio::spawn(crate::network::run(ctx.clone()));
    if config.proxy_mode == ProxyMode::Nftables {
        start_service_proxy(&ctx, &config).await;
    }
    let watcher = ConfigWatcher { flags, tx: config_tx, file_text, ctx: ctx.clone() };
    let hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).map_err(AgentError::Signal)?;
    tokio::spawn(watcher.run(hangup));
    Ok(ctx)
}

/// Checks what the Service proxy needs from the host (saying what is missing) and starts it.
async fn start_service_proxy(ctx: &Context, config: &Config) {
    let mut proxy = berth_proxy::Config::new(config.node_name.clone());
    proxy.table = config.proxy_table.clone();
    proxy.cluster_cidr = config.cluster_cidr;
    for problem in berth_proxy::host::check(&proxy.nft, &proxy.conntrack).await {
        tracing::warn!(%problem, "service proxy: the host lacks something");
    }
    tracing::info!(table = %proxy.table, "service proxy: nftables");
    tokio::spawn(berth_proxy::run(ctx.client.clone(), proxy));
}

/// Reads every endpoint's status once, concurrently (each bounded by the probe timeout).
pub async fn poll_once(runtimes: &RuntimeManager) {
    let endpoints = runtimes.endpoints();
    let probes = endpoints.iter().map(|(endpoint, last)| async move {
        let status = probe(endpoint, last).await;
        if status.ready != last.ready || status.reason != last.reason {
            if status.ready {
                tracing::info!(endpoint = %endpoint.name, runtime = %status.runtime_name,
                    version = %status.runtime_version, handlers = ?status.handlers, "runtime ready");
            } else {
                tracing::warn!(endpoint = %endpoint.name, reason = %status.reason, message = %status.message,
                    "runtime not ready");
            }
        }
        runtimes.update_status_of(endpoint, status);
    });
    futures::future::join_all(probes).await;
}

/// Polls every [`POLL_INTERVAL`], and at once when poked.
async fn poll_runtimes(runtimes: Arc<RuntimeManager>, poll_now: Arc<Notify>) {
    loop {
        poll_once(&runtimes).await;
        tokio::select! {
            _ = tokio::time::sleep(POLL_INTERVAL) => {}
            _ = poll_now.notified() => {}
        }
    }
}

/// Re-reads the config file on SIGHUP and when its content changes. A file that fails to read,
/// parse or validate leaves the running configuration as it is.
struct ConfigWatcher {
    flags: Flags,
    tx: watch::Sender<Arc<Config>>,
    /// The file's content the running configuration came from.
    file_text: Option<String>,
    ctx: Context,
}

impl ConfigWatcher {
    async fn run(mut self, mut hangup: tokio::signal::unix::Signal) {
        let mut tick = tokio::time::interval(CONFIG_CHECK_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let forced = tokio::select! {
                _ = tick.tick() => false,
                _ = hangup.recv() => true,
            };
            self.check(forced).await;
        }
    }

    async fn check(&mut self, forced: bool) {
        let Some(path) = self.flags.config.clone() else {
            if forced {
                tracing::info!("SIGHUP: no config file to re-read (no --config)");
            }
            return;
        };
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) => {
                if forced || self.file_text.is_some() {
                    tracing::error!(path = %path.display(), error = %e, "cannot read the config file; keeping the running configuration");
                }
                // Reported once until the file is back.
                self.file_text = None;
                return;
            }
        };
        if !forced && self.file_text.as_deref() == Some(text.as_str()) {
            return;
        }
        self.file_text = Some(text.clone());
        let hostname = crate::config::hostname();
        let new = FileConfig::parse(&text, &path).and_then(|file| Config::resolve(&self.flags, file, &hostname));
        let new = match new {
            Ok(new) => new,
            Err(e) => {
                tracing::error!(path = %path.display(), error = %error_chain(&e), "the config file is invalid; keeping the running configuration");
                return;
            }
        };
        self.apply(new).await;
    }

    async fn apply(&mut self, mut new: Config) {
        let current = Arc::clone(&self.tx.borrow());
        let restart = new.needs_restart_for(&current);
        if !restart.is_empty() {
            tracing::warn!(settings = ?restart, "changed in the config file; they take effect when the agent restarts");
            new.node_name = current.node_name.clone();
            new.kubeconfig = current.kubeconfig.clone();
            new.port = current.port;
            new.root_dir = current.root_dir.clone();
        }
        if new == *current {
            tracing::info!("config file re-read; nothing changed");
            return;
        }
        if new.endpoints != current.endpoints {
            let endpoints = match endpoints(&new) {
                Ok(endpoints) => endpoints,
                Err(e) => {
                    tracing::error!(error = %error_chain(&e), "the config file's endpoints are invalid; keeping the running configuration");
                    return;
                }
            };
            let names: Vec<&str> = new.endpoints.iter().map(|e| e.name.as_str()).collect();
            let removed = self.ctx.runtimes.set_endpoints(endpoints);
            tracing::info!(endpoints = ?names, removed = ?removed, "CRI endpoints reconfigured");
            self.report_removed(&removed).await;
            self.ctx.poll_now.notify_one();
        }
        tracing::info!(
            partial_readiness = new.partial_readiness,
            image_gc_high_threshold = new.image_gc_high_threshold,
            image_gc_low_threshold = new.image_gc_low_threshold,
            "configuration reloaded"
        );
        self.tx.send_replace(Arc::new(new));
    }

    /// Pods are never silently lost: an endpoint removed with pods on it is logged, a Warning
    /// event `RuntimeRemovedWithPods` goes to the Node, and its `RuntimeReady.berth.dev/<name>`
    /// condition stays False (reason `RuntimeRemoved`) until its last pod is gone.
    async fn report_removed(&self, removed: &[String]) {
        for gone in self.ctx.runtimes.removed_with_pods() {
            if !removed.contains(&gone.name) {
                continue;
            }
            let message = format!(
                "runtime endpoint {} ({}) was removed from the configuration while {} pod(s) still run on it ({}); \
                 they keep running but are no longer managed; add the endpoint back to manage them",
                gone.name,
                gone.address,
                gone.pods.len(),
                gone.pods.join(", ")
            );
            tracing::warn!(endpoint = %gone.name, pods = ?gone.pods, "runtime endpoint removed with pods on it");
            crate::node::node_event(
                &self.ctx.client,
                &self.ctx.node_name,
                "Warning",
                "RuntimeRemovedWithPods",
                &message,
            )
            .await;
        }
    }
}
