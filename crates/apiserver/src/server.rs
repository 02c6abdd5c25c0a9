//! `berth server`: opens the store, prepares TLS and the admin credentials in the data dir, and
//! serves the API with its housekeeping loops until a shutdown signal.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use berth_store::Store;
use berth_store::etcd::EtcdStore;
use berth_store::sqlite::SqliteStore;

use crate::admission::Admission;
use crate::authn::TokenAuthenticator;
use crate::services::{self, ServiceNetwork};
use crate::{ApiState, lifecycle, satoken, tls};

#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub data_dir: PathBuf,
    pub bind_address: IpAddr,
    pub secure_port: u16,
    /// Empty: the embedded SQLite store in the data dir.
    pub etcd_servers: Vec<String>,
    pub token_auth_file: Option<PathBuf>,
    pub extra_sans: Vec<String>,
    pub compaction_interval: Duration,
    /// Settings of the admission chain (`--default-not-ready-toleration-seconds`, ...).
    pub admission: Admission,
    /// `--service-cluster-ip-range` and `--service-node-port-range`.
    pub service_network: ServiceNetwork,
    /// The address put into the `kubernetes` Service's endpoints; `None`: the bind address, or
    /// the default route's source address when bound to every address.
    pub advertise_address: Option<IpAddr>,
    /// The service account token signing key, issuer and audiences.
    pub service_accounts: satoken::KeyOptions,
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot prepare data dir {path}")]
    DataDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot open the store")]
    Store(#[source] berth_store::StoreError),
    #[error("cannot prepare TLS and credentials")]
    Tls(#[source] tls::TlsError),
    #[error("cannot load the service account key")]
    ServiceAccountKey(#[source] satoken::KeyError),
    #[error("cannot load the token file")]
    Tokens(#[source] crate::authn::AuthnError),
    #[error("cannot create the system namespaces and the kubernetes service: {0}")]
    Bootstrap(String),
    #[error("cannot serve on {addr}")]
    Serve {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

pub async fn open_store(cfg: &ServerConfig) -> Result<Arc<dyn Store>, ServerError> {
    if cfg.etcd_servers.is_empty() {
        let path = cfg.data_dir.join("state.db");
        let store = tokio::task::spawn_blocking(move || SqliteStore::open(&path))
            .await
            .map_err(|e| ServerError::Store(berth_store::StoreError::Internal(Box::new(e))))?
            .map_err(ServerError::Store)?;
        Ok(Arc::new(store))
    } else {
        Ok(Arc::new(EtcdStore::connect(&cfg.etcd_servers).await.map_err(ServerError::Store)?))
    }
}

pub fn prepare_data_dir(cfg: &ServerConfig) -> Result<(), ServerError> {
    use std::os::unix::fs::PermissionsExt;
    let err = |source| ServerError::DataDir { path: cfg.data_dir.clone(), source };
    std::fs::create_dir_all(&cfg.data_dir).map_err(err)?;
    std::fs::set_permissions(&cfg.data_dir, std::fs::Permissions::from_mode(0o700)).map_err(err)?;
    Ok(())
}

/// A server ready to serve: store open, credentials and kubeconfig written, system namespaces
/// made. Parts that run in the same process (scheduler, controllers) reach it through
/// [`PreparedServer::local_service`] before [`PreparedServer::serve`] is called.
pub struct PreparedServer {
    pub state: Arc<ApiState>,
    pub kubeconfig: PathBuf,
    admin_token: String,
    pki: tls::Pki,
    addr: SocketAddr,
    /// Where pods reach a server bound to loopback (see [`advertise_to_pods`]).
    pod_listener: Option<std::net::TcpListener>,
    advertise: IpAddr,
    compaction_interval: Duration,
}

impl PreparedServer {
    pub async fn prepare(cfg: &ServerConfig) -> Result<PreparedServer, ServerError> {
        prepare_data_dir(cfg)?;
        let store = open_store(cfg).await?;
        let (advertise, pod_listener) = advertise_to_pods(cfg);
        // In-cluster clients reach the server as https://<kubernetes ClusterIP> or by the
        // Service's names; others at the advertise address.
        let mut sans = cfg.extra_sans.clone();
        sans.push(cfg.service_network.kubernetes_ip().to_string());
        sans.push(advertise.to_string());
        let pki = tls::ensure_pki(&cfg.data_dir, cfg.bind_address, &sans).map_err(ServerError::Tls)?;
        let token = tls::ensure_admin_token(&cfg.data_dir).map_err(ServerError::Tls)?;
        let url = tls::server_url(cfg.bind_address, cfg.secure_port);
        let kubeconfig = cfg.data_dir.join("admin.kubeconfig");
        tls::write_kubeconfig(&kubeconfig, &url, &pki.ca_pem, "admin", &token).map_err(ServerError::Tls)?;
        let mut authn = TokenAuthenticator::new(token.clone());
        if let Some(path) = &cfg.token_auth_file {
            authn.load_token_file(path).map_err(ServerError::Tokens)?;
        }
        authn.watch_token_file(&cfg.data_dir.join(crate::authn::NODE_TOKEN_FILE)).map_err(ServerError::Tokens)?;
        let sa = &cfg.service_accounts;
        let keys = satoken::load_keys(
            &cfg.data_dir,
            sa.signing_key_file.as_deref(),
            &sa.key_files,
            &sa.issuer,
            sa.api_audiences.clone(),
        )
        .map_err(ServerError::ServiceAccountKey)?;
        let state =
            ApiState::with_service_account_tokens(store, Some(authn), cfg.admission, cfg.service_network, Some(keys));
        lifecycle::bootstrap(&state).await.map_err(|e| ServerError::Bootstrap(e.message))?;
        // Servers starting together on one store race for the Service; the loser finds it made.
        let mut attempts = 0;
        while let Err(e) = services::ensure_kubernetes_service(&state, advertise, cfg.secure_port).await {
            attempts += 1;
            if attempts == 5 {
                return Err(ServerError::Bootstrap(e.message));
            }
            tokio::time::sleep(Duration::from_millis(200 * attempts)).await;
        }
        Ok(PreparedServer {
            state,
            kubeconfig,
            admin_token: token,
            pki,
            addr: SocketAddr::new(cfg.bind_address, cfg.secure_port),
            pod_listener,
            advertise,
            compaction_interval: cfg.compaction_interval,
        })
    }

    /// The API as an in-process service acting as the admin: no socket, no TLS, the same
    /// authentication, authorization, admission and metrics as every other request.
    pub fn local_service(&self) -> axum::Router {
        let header = http::HeaderValue::from_str(&format!("Bearer {}", self.admin_token))
            .expect("the admin token is printable ASCII");
        crate::router(self.state.clone()).layer(axum::middleware::map_request(
            move |mut req: axum::extract::Request| {
                let header = header.clone();
                async move {
                    req.headers_mut().insert(http::header::AUTHORIZATION, header);
                    req
                }
            },
        ))
    }

    /// Serves until SIGINT or SIGTERM, with the housekeeping loops.
    pub async fn serve(self) -> Result<(), ServerError> {
        let state = self.state;
        tokio::spawn(lifecycle::run_compactor(state.clone(), self.compaction_interval));
        tokio::spawn(crate::node_graph::run(state.clone()));
        services::spawn_repair(&state);
        tokio::spawn(keep_kubernetes_service(state.clone(), self.advertise, self.addr.port()));
        let rustls = tls::rustls_config(&self.pki).map_err(ServerError::Tls)?;
        let addr = self.addr;
        let handle = axum_server::Handle::new();
        let shutdown = handle.clone();
        let leaving = state.clone();
        tokio::spawn(async move {
            shutdown_signal().await;
            tracing::info!("shutting down");
            crate::server_leases::withdraw(&leaving).await;
            shutdown.graceful_shutdown(Some(Duration::from_secs(5)));
        });
        let rustls = axum_server::tls_rustls::RustlsConfig::from_config(rustls);
        if let Some(listener) = self.pod_listener {
            let for_pods = axum_server::from_tcp_rustls(listener, rustls.clone())
                .map_err(|source| ServerError::Serve { addr: SocketAddr::new(self.advertise, addr.port()), source })?
                .handle(handle.clone())
                .serve(crate::router(state.clone()).into_make_service());
            tokio::spawn(async move {
                if let Err(e) = for_pods.await {
                    tracing::warn!(error = %e, "serving the API to pods stopped");
                }
            });
            tracing::info!(address = %self.advertise, "serving the Kubernetes API to pods too");
        }
        tracing::info!(%addr, backend = state.store.backend(), kubeconfig = %self.kubeconfig.display(), "serving the Kubernetes API");
        axum_server::bind_rustls(addr, rustls)
            .handle(handle)
            .serve(crate::router(state).into_make_service())
            .await
            .map_err(|source| ServerError::Serve { addr, source })
    }
}

/// The address the `kubernetes` Service sends pods to, and a listener on it if the server must
/// listen there too. Pods cannot reach the host's loopback: a server bound to loopback without
/// `--advertise-address` also serves on the default route's source address (as the cluster DNS
/// does), unless that port is taken there; then pods cannot reach the API, which is logged.
fn advertise_to_pods(cfg: &ServerConfig) -> (IpAddr, Option<std::net::TcpListener>) {
    if let Some(a) = cfg.advertise_address {
        return (a, None);
    }
    if !cfg.bind_address.is_loopback() {
        return (services::advertise_address(cfg.bind_address), None);
    }
    let unspecified: IpAddr =
        if cfg.bind_address.is_ipv4() { Ipv4Addr::UNSPECIFIED.into() } else { Ipv6Addr::UNSPECIFIED.into() };
    let routable = services::advertise_address(unspecified);
    if routable.is_loopback() {
        return (cfg.bind_address, None);
    }
    let listener = std::net::TcpListener::bind((routable, cfg.secure_port)).and_then(|l| {
        l.set_nonblocking(true)?;
        Ok(l)
    });
    match listener {
        Ok(l) => (routable, Some(l)),
        Err(e) => {
            tracing::warn!(address = %routable, port = cfg.secure_port, error = %e, "cannot also listen where pods reach this host: pods will not reach the API");
            (cfg.bind_address, None)
        }
    }
}

/// Every ten seconds, puts back the `kubernetes` Service and this server's address in its
/// endpoints if they were deleted or changed, as kube-apiserver's controller does.
async fn keep_kubernetes_service(state: Arc<ApiState>, advertise: IpAddr, port: u16) {
    loop {
        tokio::time::sleep(Duration::from_secs(10)).await;
        if let Err(e) = services::ensure_kubernetes_service(&state, advertise, port).await {
            tracing::warn!(error = %e.message, "keeping the kubernetes service failed");
        }
    }
}

/// Runs until SIGINT or SIGTERM.
pub async fn run(cfg: ServerConfig) -> Result<(), ServerError> {
    PreparedServer::prepare(&cfg).await?.serve().await
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("installing a SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
