//! The API benchmark: one backend's store behind the real router over loopback HTTP, driven by
//! the `kube` crate with ConfigMaps.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow};
use axum::serve::ListenerExt;
use berth_apiserver::{ApiState, lifecycle, router};
use berth_store::Store;
use futures::TryStreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};

use crate::stats::{Figure, Latencies};

#[derive(Clone, Debug)]
pub struct Settings {
    /// Samples per latency metric, and creates per throughput run.
    pub ops: usize,
    /// Objects in the listed collection.
    pub list_size: usize,
    /// How many times that collection is listed.
    pub list_reps: usize,
    /// Clients of the concurrent create run.
    pub concurrency: usize,
}

/// What one backend measured.
pub struct Outcome {
    pub figures: Vec<Figure>,
    /// Size of one benchmark ConfigMap as the store keeps it.
    pub value_bytes: usize,
}

/// A ConfigMap of about 300 bytes once stored, the size the raw etcd puts copy.
pub fn config_map(name: &str) -> ConfigMap {
    let value = serde_json::json!({
        "metadata": {"name": name, "labels": {"app": "berth-bench", "tier": "control-plane"}},
        "data": {"settings.yaml": "replicas: 3\nimage: registry.example/app:1.0\nlog: info\n", "mode": "benchmark"},
    });
    serde_json::from_value(value).expect("a valid ConfigMap")
}

pub(crate) fn client(addr: SocketAddr) -> anyhow::Result<kube::Client> {
    let cfg = kube::Config::new(format!("http://{addr}").parse()?);
    Ok(kube::Client::try_from(cfg)?)
}

/// The real API router served on a loopback port, as one `berth server` serves it.
pub(crate) struct Served {
    pub addr: SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
}

/// Serves `router(state)` on a free loopback port.
pub(crate) async fn serve(state: Arc<ApiState>) -> anyhow::Result<Served> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    // `berth server` (axum-server) sets TCP_NODELAY; without it Nagle's algorithm and delayed
    // ACKs hold small watch events back by up to 40 ms.
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        axum::serve(listener, router(state))
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await
    });
    Ok(Served { addr, stop, server })
}

impl Served {
    /// Stops serving; `label` names the server in the note when it does not stop in time.
    pub(crate) async fn stop(self, label: &str) {
        let _ = self.stop.send(());
        // Idle keep-alive connections can hold a graceful shutdown; the figures are in already.
        if tokio::time::timeout(Duration::from_secs(5), self.server).await.is_err() {
            eprintln!("  ({label}: the API server did not stop within 5 s; leaving it)");
        }
    }
}

/// Runs every API measurement against `store`, labelled `backend`.
pub async fn run(backend: &str, store: Arc<dyn Store>, s: &Settings) -> anyhow::Result<Outcome> {
    let state = ApiState::new(store.clone(), None);
    lifecycle::bootstrap(&state).await.map_err(|e| anyhow!("bootstrap: {}", e.message))?;
    let served = serve(state).await?;
    let result = measure(backend, served.addr, store, s).await;
    served.stop(backend).await;
    result
}

async fn measure(backend: &str, addr: SocketAddr, store: Arc<dyn Store>, s: &Settings) -> anyhow::Result<Outcome> {
    let kube = client(addr)?;
    let namespaces: Api<Namespace> = Api::all(kube.clone());
    for ns in ["bench-latency", "bench-list", "bench-watch", "bench-serial", "bench-concurrent"] {
        let obj = serde_json::from_value(serde_json::json!({"metadata": {"name": ns}}))?;
        namespaces.create(&PostParams::default(), &obj).await.with_context(|| format!("creating namespace {ns}"))?;
    }
    let pp = PostParams::default();
    let mut figures = Vec::new();

    // Warm-up: connections, SQLite pages, etcd leader; not measured.
    let latency: Api<ConfigMap> = Api::namespaced(kube.clone(), "bench-latency");
    for i in 0..20 {
        latency.create(&pp, &config_map(&format!("warm-{i}"))).await?;
    }

    eprintln!("  {backend}: {} creates, 1 client", s.ops);
    let (lat, elapsed) = creates(addr, "bench-serial", 1, s.ops).await?;
    figures.push(Figure::new(backend, "create (1 client)", &lat, Some(elapsed)));

    eprintln!("  {backend}: {} creates, {} clients", s.ops * 2, s.concurrency);
    let (lat, elapsed) = creates(addr, "bench-concurrent", s.concurrency, s.ops * 2).await?;
    figures.push(Figure::new(backend, &format!("create ({} clients)", s.concurrency), &lat, Some(elapsed)));

    eprintln!("  {backend}: {} gets", s.ops);
    let serial: Api<ConfigMap> = Api::namespaced(kube.clone(), "bench-serial");
    let mut lat = Latencies::default();
    let start = Instant::now();
    for i in 0..s.ops {
        let t0 = Instant::now();
        serial.get(&format!("c1-0-{i}")).await?;
        lat.record(t0.elapsed());
    }
    figures.push(Figure::new(backend, "get", &lat, Some(start.elapsed())));

    eprintln!("  {backend}: {} lists of {} objects", s.list_reps, s.list_size);
    creates(addr, "bench-list", s.concurrency, s.list_size).await?;
    let list: Api<ConfigMap> = Api::namespaced(kube.clone(), "bench-list");
    let mut lat = Latencies::default();
    let start = Instant::now();
    for _ in 0..s.list_reps {
        let t0 = Instant::now();
        let got = list.list(&ListParams::default()).await?;
        lat.record(t0.elapsed());
        anyhow::ensure!(got.items.len() == s.list_size, "listed {} objects, not {}", got.items.len(), s.list_size);
    }
    figures.push(Figure::new(backend, &format!("list {} objects", s.list_size), &lat, Some(start.elapsed())));

    eprintln!("  {backend}: {} watch deliveries", s.ops);
    let lat = watch_delivery(kube.clone(), s.ops).await?;
    figures.push(Figure::new(backend, "watch delivery", &lat, None));

    let key = berth_apiserver::objects::key(&berth_api::resources::CONFIGMAPS, Some("bench-serial"), "c1-0-0");
    let value_bytes = match store.get(&key).await? {
        Some(kv) => kv.value.len(),
        None => serde_json::to_vec(&serial.get("c1-0-0").await?)?.len(),
    };
    Ok(Outcome { figures, value_bytes })
}

/// `total` creates in namespace `ns` from `clients` concurrent clients, each with its own
/// connection pool; returns per-create latencies and the wall time of the whole run.
async fn creates(addr: SocketAddr, ns: &str, clients: usize, total: usize) -> anyhow::Result<(Latencies, Duration)> {
    let mut apis = Vec::new();
    for _ in 0..clients {
        apis.push(Api::<ConfigMap>::namespaced(client(addr)?, ns));
    }
    let start = Instant::now();
    let tasks: Vec<_> = apis
        .into_iter()
        .enumerate()
        .map(|(c, api)| {
            tokio::spawn(async move {
                let mut lat = Latencies::default();
                for i in 0..crate::stats::share(total, clients, c) {
                    let obj = config_map(&format!("c{clients}-{c}-{i}"));
                    let t0 = Instant::now();
                    api.create(&PostParams::default(), &obj).await?;
                    lat.record(t0.elapsed());
                }
                anyhow::Ok(lat)
            })
        })
        .collect();
    let mut all = Latencies::default();
    for t in tasks {
        all.add(&t.await??);
    }
    Ok((all, start.elapsed()))
}

/// Time from just before each create call to the arrival of its ADDED event on a watch that is
/// already open on the collection. Creates are sequential, so this is delivery on a quiet server.
async fn watch_delivery(kube: kube::Client, n: usize) -> anyhow::Result<Latencies> {
    let api: Api<ConfigMap> = Api::namespaced(kube, "bench-watch");
    let rv = api.list(&ListParams::default()).await?.metadata.resource_version.unwrap_or_default();
    let sent: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let events = api.watch(&WatchParams::default().timeout(290), &rv).await?;
    let reader = tokio::spawn({
        let sent = sent.clone();
        async move {
            let mut lat = Latencies::default();
            futures::pin_mut!(events);
            while lat.len() < n as u64 {
                let Some(ev) = events.try_next().await? else { anyhow::bail!("the watch ended early") };
                if let WatchEvent::Added(obj) = ev {
                    let arrived = Instant::now();
                    let name = obj.metadata.name.unwrap_or_default();
                    if let Some(t0) = sent.lock().unwrap().remove(&name) {
                        lat.record(arrived - t0);
                    }
                }
            }
            Ok(lat)
        }
    });
    for i in 0..n {
        let name = format!("w-{i}");
        // The send time goes in before the request, so the event can never arrive unpaired.
        sent.lock().unwrap().insert(name.clone(), Instant::now());
        api.create(&PostParams::default(), &config_map(&name)).await?;
    }
    tokio::time::timeout(Duration::from_secs(30), reader).await.context("watch events still missing after 30 s")??
}
