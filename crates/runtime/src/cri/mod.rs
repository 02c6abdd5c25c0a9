//! The CRI v1 service: the shared state every RPC works on, handler lookup and startup
//! (recover, reconcile, exit watchers); the image, sandbox, container and stats halves live in
//! submodules as plain async methods, and [`grpc`] adapts them to tonic.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use berth_cni::{Cni, KernelNetns};
use berth_image::Images;
use k8s_cri::v1 as cri;
use tokio::sync::{broadcast, watch};

use crate::config::{Config, RuntimeHandler};
use crate::reality::HostReality;
use crate::state::{ContainerState, StateError, Store, now_ns};

mod container;
mod error;
pub mod grpc;
mod image;
mod runtime;
mod sandbox;
mod stats;
mod streaming;

pub use error::Error;
pub use image::PullTask;

/// Where the runtime finds what is not in its config.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// The `berth-monitor` binary; default: next to the running executable (or one directory up,
    /// for test binaries under `target/*/deps`), else on PATH.
    pub monitor_binary: Option<PathBuf>,
    /// Where network namespaces are bind-mounted; default `/run/berth/netns`.
    pub netns_dir: Option<PathBuf>,
    /// Where the streaming server (exec, attach, port-forward) listens; default 127.0.0.1 on a
    /// free port, as containerd's.
    pub stream_address: Option<std::net::SocketAddr>,
}

/// What the CRI services share: the configuration (with the resolved runtime handlers), the
/// image store, the sandbox and container records, the pod network, and the exit watchers.
pub struct Cri {
    config: Config,
    images: Arc<Images>,
    store: Arc<Store>,
    cni: Arc<Cni>,
    netns: Arc<KernelNetns>,
    monitor_binary: PathBuf,
    events: broadcast::Sender<cri::ContainerEventResponse>,
    /// Per running container: turns true once its exit is recorded.
    exits: Mutex<HashMap<String, watch::Receiver<bool>>>,
    /// Per exited container: the deletion of its OCI container started on its exit (`Some(ok)`
    /// once done).
    oci_deletes: Mutex<HashMap<String, watch::Receiver<Option<bool>>>>,
    /// Set by UpdateRuntimeConfig.
    pod_cidr: Mutex<String>,
    cpu_samples: stats::CpuSamples,
    /// Turns true on [`Cri::close`]: long-lived streams end, so a graceful shutdown can finish.
    closing: watch::Sender<bool>,
    /// Serves Exec/Attach/PortForward sessions; started by [`Cri::open`].
    stream: std::sync::OnceLock<berth_stream::StreamServer>,
    /// Which handlers' binaries pass their self-check (Status lists only those).
    handler_checks: Arc<runtime::HandlerChecks>,
    /// Host-side cleanups that run after their RPC answered (gVisor's slow `runsc delete`); a
    /// graceful stop waits for them ([`Cri::finish_background`]).
    background: tokio_util::task::TaskTracker,
}

/// The default network namespace directory.
pub const DEFAULT_NETNS_DIR: &str = "/run/berth/netns";

impl Cri {
    /// Opens the runtime: loads the sandbox and container records under the config's root,
    /// reconciles them with what is really running, writes the default CNI config if the conf
    /// dir has none, and starts watching every running container. `images` must have been opened
    /// with `config.images_config()`.
    pub async fn open(config: Config, images: Arc<Images>, options: Options) -> Result<Arc<Cri>, Error> {
        // When it is nowhere to be found, container creation fails naming it.
        let monitor_binary =
            options.monitor_binary.or_else(find_monitor).unwrap_or_else(|| PathBuf::from(berth_monitor::MONITOR_NAME));
        let root = config.root.clone();
        let (store, report) =
            tokio::task::spawn_blocking(move || Store::recover(root)).await.map_err(Error::Task)??;
        tracing::info!(sandboxes = report.sandboxes, containers = report.containers, "recovered records");
        let reality = HostReality::new(&config);
        let reconcile_store = store.clone();
        let changes = tokio::task::spawn_blocking(move || reconcile_store.reconcile(&reality, now_ns()))
            .await
            .map_err(Error::Task)?;
        for change in &changes.changes {
            tracing::info!(?change, "reconciled");
        }
        for error in &changes.errors {
            tracing::warn!(%error, "reconcile could not write a change");
        }

        let cni_dir = config.cni.conf_dir.clone();
        match berth_cni::config::write_default(&cni_dir, &default_network(&config.root)) {
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, dir = %cni_dir.display(), "writing the default CNI config failed"),
        }
        let cni =
            Cni::new(config.cni.conf_dir.clone(), config.cni.bin_dirs.clone()).with_cache_dir(config.root.join("cni"));
        let netns = KernelNetns::new(options.netns_dir.unwrap_or_else(|| PathBuf::from(DEFAULT_NETNS_DIR)));
        let handler_checks = runtime::HandlerChecks::start(&config.handlers).await;
        let (events, _) = broadcast::channel(1024);
        let cri = Arc::new(Cri {
            config,
            images,
            store,
            cni: Arc::new(cni),
            netns: Arc::new(netns),
            monitor_binary,
            events,
            exits: Mutex::new(HashMap::new()),
            oci_deletes: Mutex::new(HashMap::new()),
            pod_cidr: Mutex::new(String::new()),
            cpu_samples: Default::default(),
            closing: watch::Sender::new(false),
            stream: std::sync::OnceLock::new(),
            handler_checks,
            background: tokio_util::task::TaskTracker::new(),
        });
        let backend = Arc::new(streaming::StreamBackend(Arc::downgrade(&cri)));
        let address = options.stream_address.unwrap_or_else(|| std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
        let server = berth_stream::StreamServer::start(address, backend)
            .await
            .map_err(|e| Error::Host { what: format!("starting the streaming server on {address}"), source: e })?;
        tracing::info!(address = %server.local_addr(), "streaming server listening");
        let _ = cri.stream.set(server);
        cri.finish_removals(&report.stray_dirs).await;
        for c in cri.store.list_containers(&Default::default()) {
            if matches!(c.state(), ContainerState::Running | ContainerState::Unknown)
                && let Some(pid) = c.monitor_pid
            {
                cri.watch_exit(&c.id, pid);
            }
        }
        Ok(cri)
    }

    /// Finishes removals a crash interrupted: record-less container directories (a gVisor
    /// container's host side is removed after its record) get their OCI container deleted with
    /// every handler's runtime and their rootfs unmounted; record-less sandbox directories lose
    /// their `/dev/shm` mount. Then the directories go.
    async fn finish_removals(&self, stray: &[PathBuf]) {
        for dir in stray {
            let Some(id) = dir.file_name().map(|n| n.to_string_lossy().into_owned()) else { continue };
            let kind = dir.parent().and_then(|p| p.file_name()).map(|n| n.to_string_lossy().into_owned());
            match kind.as_deref() {
                Some("containers") => {
                    for handler in self.config.handlers.values() {
                        let (runtime, id) = (handler.oci().clone(), id.clone());
                        let _ = tokio::task::spawn_blocking(move || runtime.delete(&id, true)).await;
                    }
                    let _ = crate::host::unmount(&dir.join("bundle").join("rootfs"));
                }
                Some("sandboxes") => {
                    let _ = crate::host::unmount(&dir.join("files").join("shm"));
                }
                _ => continue,
            }
            match std::fs::remove_dir_all(dir) {
                Ok(()) => tracing::info!(dir = %dir.display(), "finished an interrupted removal"),
                Err(e) => tracing::warn!(dir = %dir.display(), error = %e, "could not finish an interrupted removal"),
            }
        }
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The handler a request or a record names, resolved when the config was loaded: `""` is the
    /// default handler; an unknown name is `InvalidArgument` naming the configured ones. Called
    /// once per RPC, where the name comes in; the code below it is handed the result.
    pub fn handler(&self, name: &str) -> Result<Arc<RuntimeHandler>, Error> {
        self.config.handler(name).cloned().ok_or_else(|| self.unknown_handler(name))
    }

    fn unknown_handler(&self, name: &str) -> Error {
        Error::UnknownHandler { handler: name.to_string(), known: self.config.handlers.keys().cloned().collect() }
    }

    /// Runs a blocking image-store call off the async workers.
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Images) -> Result<T, Error> + Send + 'static,
    ) -> Result<T, Error> {
        let images = Arc::clone(&self.images);
        tokio::task::spawn_blocking(move || f(&images)).await.map_err(Error::Task)?
    }

    /// Runs a record mutation (which writes to disk) off the async workers.
    async fn blocking_state<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> Result<T, StateError> + Send + 'static,
    ) -> Result<T, StateError> {
        match tokio::task::spawn_blocking(f).await {
            Ok(result) => result,
            Err(e) => Err(StateError::Io {
                op: "running",
                path: PathBuf::from("a state task"),
                source: std::io::Error::other(e),
            }),
        }
    }

    /// Subscribes to container events (GetContainerEvents).
    pub fn subscribe(&self) -> broadcast::Receiver<cri::ContainerEventResponse> {
        self.events.subscribe()
    }

    /// Ends the event streams (the runtime is shutting down); containers keep running.
    pub fn close(&self) {
        self.closing.send_replace(true);
    }

    /// Waits (at most `limit`) for the cleanups still running after their RPCs answered; false
    /// if some were left for the next start to finish.
    pub async fn finish_background(&self, limit: std::time::Duration) -> bool {
        self.background.close();
        let pending = self.background.len();
        if pending > 0 {
            tracing::info!(pending, "waiting for background cleanups");
        }
        let done = tokio::time::timeout(limit, self.background.wait()).await.is_ok();
        self.background.reopen();
        done
    }

    /// Resolves once [`Cri::close`] has been called.
    pub fn closed(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.closing.subscribe();
        async move {
            let _ = rx.wait_for(|closing| *closing).await;
        }
    }
}

/// `berth-monitor` next to the executable, one directory up (test binaries live in `deps/`), or
/// on PATH.
fn find_monitor() -> Option<PathBuf> {
    let name = berth_monitor::MONITOR_NAME;
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    let candidates = [Some(dir.join(name)), dir.parent().map(|d| d.join(name))];
    if let Some(found) = candidates.into_iter().flatten().find(|p| p.is_file()) {
        return Some(found);
    }
    crate::config::find_on_path(name, &std::env::var_os("PATH").unwrap_or_default())
}

/// berth's default network for a runtime whose state lives in `root`: its IP allocations too.
pub(crate) fn default_network(root: &std::path::Path) -> berth_cni::config::DefaultNetwork {
    berth_cni::config::DefaultNetwork { ipam_data_dir: root.join("cni").join("networks"), ..Default::default() }
}
