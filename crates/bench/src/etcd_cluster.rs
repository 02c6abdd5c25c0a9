//! `berth-bench etcd-cluster`: the API on a 3-member etcd cluster (`berth_testenv::EtcdCluster`,
//! on loopback, one temp dir) through one API server and through two API servers sharing the
//! cluster, next to raw etcd puts to the same cluster in the same run.
//!
//! An "API server" here is what one `berth server` process is: its own `EtcdStore` connected to
//! every member (pinned to one, failing over to the others), its own `ApiState` and the real
//! router served on its own loopback port with TCP_NODELAY. Server A and server B share nothing
//! but the cluster. The bench drives them with the `kube` crate and the ConfigMaps of
//! `berth-bench api`:
//!
//! 1. **1 server**: `--ops` creates from `--concurrency` clients through A, with a watch of the
//!    namespace open on A.
//! 2. **2 servers**: `--ops` creates in another namespace, half the clients on A and half on B,
//!    with a watch open on A and one on B. Each watch's deliveries are split into creates made
//!    through its own server ("same server") and through the other one ("other server"), which
//!    reach it only through etcd's watch.
//! 3. **raw etcd**: `--ops` puts of a value the size of one stored ConfigMap from
//!    `--concurrency` tasks on one etcd-client channel balanced over all three members.
//!
//! Watch delivery latency is the time from just before the create call is sent to the ADDED
//! event's arrival at the watch, so it includes the create itself; the creates run concurrently,
//! so it is delivery under that load. Figures are printed (and written as JSON with `--json`),
//! never asserted.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, ensure};
use berth_apiserver::{ApiState, lifecycle};
use berth_store::Store;
use berth_store::etcd::EtcdStore;
use berth_testenv::EtcdCluster;
use futures::TryStreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};
use serde_json::{Value, json};

use crate::api::{client, config_map};
use crate::stats::{Figure, Latencies, share};

/// Members of the etcd cluster.
const MEMBERS: usize = 3;
/// The API servers' names, in the order they are started.
const SERVERS: [&str; 2] = ["A", "B"];
const NS_ONE: &str = "bench-one";
const NS_TWO: &str = "bench-two";
const NS_WARM: &str = "bench-warm";
/// Creates through each server before anything is measured.
const WARM_UP: usize = 20;
/// How long the watches may still lack events once the creates are done.
const WATCH_GRACE: Duration = Duration::from_secs(30);

#[derive(clap::Args)]
pub struct EtcdClusterArgs {
    /// Creates per API run (one server, two servers), and raw puts.
    #[arg(long, default_value_t = 2000)]
    ops: usize,
    /// Clients of each run (split evenly over the servers in the two-server run).
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Also write the figures here as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

pub async fn run(args: EtcdClusterArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    ensure!(args.ops > 0, "--ops must be positive");
    ensure!(
        args.concurrency >= SERVERS.len(),
        "--concurrency must be at least {} (clients on each server)",
        SERVERS.len()
    );
    eprintln!("starting a {MEMBERS}-member etcd cluster");
    let (cluster, leader) = tokio::task::spawn_blocking(|| {
        let cluster = EtcdCluster::start(MEMBERS);
        let leader = cluster.wait_for_leader(Duration::from_secs(10));
        (cluster, leader)
    })
    .await
    .context("starting the etcd cluster")?;
    let endpoints = cluster.endpoints();
    eprintln!("  members {}; leader: {}", endpoints.join(" "), leader.map_or("none".to_owned(), |l| l.to_string()));
    let result = measure(&args, &endpoints).await;
    drop(cluster);
    let (value_bytes, figures) = result?;
    let report = Report { ops: args.ops, concurrency: args.concurrency, value_bytes, endpoints, leader, figures };
    report.print();
    crate::finish_run(args.json.as_deref(), || report.to_json(), started)
}

/// Starts servers A and B on the cluster, measures, stops them. Returns the stored size of one
/// ConfigMap and the figures.
async fn measure(args: &EtcdClusterArgs, endpoints: &[String]) -> anyhow::Result<(usize, Vec<Figure>)> {
    let mut stores: Vec<Arc<dyn Store>> = Vec::new();
    let mut served = Vec::new();
    for name in SERVERS {
        let store =
            EtcdStore::connect(endpoints).await.with_context(|| format!("server {name}: connecting to etcd"))?;
        let store: Arc<dyn Store> = Arc::new(store);
        let state = ApiState::new(store.clone(), None);
        lifecycle::bootstrap(&state).await.map_err(|e| anyhow!("server {name}: bootstrap: {}", e.message))?;
        let s = crate::api::serve(state).await?;
        eprintln!("  API server {name} on {}", s.addr);
        stores.push(store);
        served.push(s);
    }
    let addrs: Vec<SocketAddr> = served.iter().map(|s| s.addr).collect();
    let result = measure_on(args, endpoints, &addrs, stores[0].as_ref()).await;
    for (s, name) in served.into_iter().zip(SERVERS) {
        s.stop(&format!("server {name}")).await;
    }
    result
}

async fn measure_on(
    args: &EtcdClusterArgs,
    endpoints: &[String],
    addrs: &[SocketAddr],
    store: &dyn Store,
) -> anyhow::Result<(usize, Vec<Figure>)> {
    let namespaces: Api<Namespace> = Api::all(client(addrs[0])?);
    for ns in [NS_ONE, NS_TWO, NS_WARM] {
        let obj = serde_json::from_value(json!({"metadata": {"name": ns}}))?;
        namespaces.create(&PostParams::default(), &obj).await.with_context(|| format!("creating namespace {ns}"))?;
    }
    // Warm-up: connections, the stores' members, etcd's leader; not measured.
    for (s, addr) in addrs.iter().enumerate() {
        let api: Api<ConfigMap> = Api::namespaced(client(*addr)?, NS_WARM);
        for i in 0..WARM_UP {
            api.create(&PostParams::default(), &config_map(&format!("warm-{s}-{i}"))).await?;
        }
    }
    let mut figures = Vec::new();
    let c = args.concurrency;

    eprintln!("1 server: {} creates, {c} clients, watch on A", args.ops);
    let one = creates_watched(&addrs[..1], NS_ONE, c, args.ops).await.context("1 server")?;
    figures.push(Figure::new("1 server", &format!("create ({c} clients)"), &one.all, Some(one.elapsed)));
    figures.push(Figure::new("1 server", "watch on A, same server", &one.watches[0][0], None));

    eprintln!("2 servers: {} creates, {c} clients split over A and B, watches on A and B", args.ops);
    let two = creates_watched(addrs, NS_TWO, c, args.ops).await.context("2 servers")?;
    figures.push(Figure::new("2 servers", &format!("create ({c} clients)"), &two.all, Some(two.elapsed)));
    for (s, name) in SERVERS.iter().enumerate() {
        let metric = format!("create via {name} ({} clients)", share(c, SERVERS.len(), s));
        figures.push(Figure::new("2 servers", &metric, &two.per_server[s], Some(two.elapsed)));
    }
    for (w, name) in SERVERS.iter().enumerate() {
        figures.push(Figure::new("2 servers", &format!("watch on {name}, same server"), &two.watches[w][0], None));
        figures.push(Figure::new("2 servers", &format!("watch on {name}, other server"), &two.watches[w][1], None));
    }

    let key = berth_apiserver::objects::key(&berth_api::resources::CONFIGMAPS, Some(NS_ONE), &object_name(0, 0, 0));
    let value_bytes = match store.get(&key).await? {
        Some(kv) => kv.value.len(),
        None => anyhow::bail!("{key} is not in the store"),
    };
    eprintln!("raw etcd: {} puts of {value_bytes} bytes, {c} clients, balanced over {MEMBERS} members", args.ops);
    let (lat, elapsed) = crate::raw_etcd::puts(endpoints, c, args.ops, value_bytes).await?;
    figures.push(Figure::new("etcd raw", &format!("put ({c} clients)"), &lat, Some(elapsed)));
    Ok((value_bytes, figures))
}

/// What one run of watched creates measured.
struct Watched {
    /// Every create's latency.
    all: Latencies,
    /// Create latencies per server.
    per_server: Vec<Latencies>,
    /// Wall time of all creates.
    elapsed: Duration,
    /// Per watch (one on each server): delivery of creates made through the same server, and
    /// through the other one.
    watches: Vec<[Latencies; 2]>,
}

fn object_name(server: usize, client: usize, i: usize) -> String {
    format!("s{server}-c{client}-{i}")
}

/// `total` creates in `ns` from `clients` clients split evenly over the servers at `addrs`
/// (each client with its own connection pool), with a watch of `ns` open on every server.
async fn creates_watched(addrs: &[SocketAddr], ns: &str, clients: usize, total: usize) -> anyhow::Result<Watched> {
    // Name → (server it was created through, just before the create call was sent).
    let sent: Arc<Mutex<HashMap<String, (usize, Instant)>>> = Arc::default();
    let mut readers = Vec::new();
    for (w, addr) in addrs.iter().enumerate() {
        let api: Api<ConfigMap> = Api::namespaced(client(*addr)?, ns);
        let rv = api.list(&ListParams::default()).await?.metadata.resource_version.unwrap_or_default();
        let events = api.watch(&WatchParams::default().timeout(290), &rv).await?;
        let sent = sent.clone();
        readers.push(tokio::spawn(async move {
            let mut lat = [Latencies::default(), Latencies::default()];
            let mut seen = 0;
            futures::pin_mut!(events);
            while seen < total {
                let Some(ev) = events.try_next().await? else {
                    anyhow::bail!("the watch on {} ended early", SERVERS[w])
                };
                if let WatchEvent::Added(obj) = ev {
                    let arrived = Instant::now();
                    let name = obj.metadata.name.unwrap_or_default();
                    let Some((s, t0)) = sent.lock().unwrap().get(&name).copied() else { continue };
                    lat[usize::from(s != w)].record(arrived - t0);
                    seen += 1;
                }
            }
            Ok(lat)
        }));
    }

    // Client c talks to server c % n; its share of the creates is `share(total, clients, c)`.
    let mut apis = Vec::new();
    for c in 0..clients {
        let s = c % addrs.len();
        apis.push((s, Api::<ConfigMap>::namespaced(client(addrs[s])?, ns)));
    }
    let start = Instant::now();
    let tasks: Vec<_> = apis
        .into_iter()
        .enumerate()
        .map(|(c, (s, api))| {
            let sent = sent.clone();
            tokio::spawn(async move {
                let mut lat = Latencies::default();
                for i in 0..share(total, clients, c) {
                    let name = object_name(s, c, i);
                    let obj = config_map(&name);
                    let t0 = Instant::now();
                    // The send time goes in before the request, so no event can arrive unpaired.
                    sent.lock().unwrap().insert(name, (s, t0));
                    api.create(&PostParams::default(), &obj).await?;
                    lat.record(t0.elapsed());
                }
                anyhow::Ok((s, lat))
            })
        })
        .collect();
    let mut all = Latencies::default();
    let mut per_server: Vec<Latencies> = addrs.iter().map(|_| Latencies::default()).collect();
    for t in tasks {
        let (s, lat) = t.await??;
        all.add(&lat);
        per_server[s].add(&lat);
    }
    let elapsed = start.elapsed();

    let mut watches = Vec::new();
    for (w, reader) in readers.into_iter().enumerate() {
        let lat = tokio::time::timeout(WATCH_GRACE, reader).await.with_context(|| {
            format!("watch on {}: events still missing {} s after the creates", SERVERS[w], WATCH_GRACE.as_secs())
        })???;
        watches.push(lat);
    }
    Ok(Watched { all, per_server, elapsed, watches })
}

struct Report {
    ops: usize,
    concurrency: usize,
    value_bytes: usize,
    endpoints: Vec<String>,
    leader: Option<usize>,
    figures: Vec<Figure>,
}

fn cell(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.decimals$}"))
}

impl Report {
    fn find(&self, backend: &str, metric: &str) -> Option<&Figure> {
        self.figures.iter().find(|f| f.backend == backend && f.metric == metric)
    }

    fn rate(&self, backend: &str, metric: &str) -> Option<f64> {
        self.find(backend, metric).and_then(|f| f.ops_per_sec)
    }

    /// API creates/s through 1 and 2 servers ÷ raw puts/s, and 2 servers ÷ 1 server.
    fn ratios(&self) -> (Option<f64>, Option<f64>, Option<f64>) {
        let metric = format!("create ({} clients)", self.concurrency);
        let one = self.rate("1 server", &metric);
        let two = self.rate("2 servers", &metric);
        let raw = self.rate("etcd raw", &format!("put ({} clients)", self.concurrency));
        (one.zip(raw).map(|(a, r)| a / r), two.zip(raw).map(|(a, r)| a / r), two.zip(one).map(|(t, o)| t / o))
    }

    /// Per server with a watch in the two-server run: (server, other ÷ same at p50, at p99).
    fn watch_other_vs_same(&self) -> Vec<(&'static str, Option<f64>, Option<f64>)> {
        SERVERS
            .iter()
            .map(|name| {
                let same = self.find("2 servers", &format!("watch on {name}, same server"));
                let other = self.find("2 servers", &format!("watch on {name}, other server"));
                let ratio = |q: fn(&Figure) -> Option<f64>| same.and_then(q).zip(other.and_then(q)).map(|(s, o)| o / s);
                (*name, ratio(|f| f.p50_ms), ratio(|f| f.p99_ms))
            })
            .collect()
    }

    fn print(&self) {
        println!();
        println!(
            "berth-bench etcd-cluster: {} creates per run, {} clients, values of {} bytes, {MEMBERS} etcd members (leader: {})",
            self.ops,
            self.concurrency,
            self.value_bytes,
            self.leader.map_or("unknown".to_owned(), |l| format!("member {l}")),
        );
        println!("watch delivery: from just before the create call is sent to the ADDED event's arrival");
        println!();
        println!(
            "{:<10} {:<26} {:>10} {:>10} {:>10} {:>8}",
            "backend", "metric", "p50 ms", "p99 ms", "ops/s", "samples"
        );
        println!("{}", "-".repeat(79));
        for f in &self.figures {
            println!(
                "{:<10} {:<26} {:>10} {:>10} {:>10} {:>8}",
                f.backend,
                f.metric,
                cell(f.p50_ms, 3),
                cell(f.p99_ms, 3),
                cell(f.ops_per_sec, 0),
                f.samples
            );
        }
        println!();
        let (one, two, scale) = self.ratios();
        let c = self.concurrency;
        println!("API creates/s through 1 server ÷ raw etcd puts/s, {c} clients:  {}", cell(one, 2));
        println!("API creates/s through 2 servers ÷ raw etcd puts/s, {c} clients: {}", cell(two, 2));
        println!("API creates/s through 2 servers ÷ through 1 server:            {}", cell(scale, 2));
        for (name, p50, p99) in self.watch_other_vs_same() {
            println!("watch on {name}, other server ÷ same server: p50 {}×, p99 {}×", cell(p50, 2), cell(p99, 2));
        }
    }

    fn to_json(&self) -> Value {
        let figures: Vec<Value> = self
            .figures
            .iter()
            .map(|f| {
                json!({
                    "backend": f.backend, "metric": f.metric, "p50_ms": f.p50_ms, "p99_ms": f.p99_ms,
                    "ops_per_sec": f.ops_per_sec, "samples": f.samples,
                })
            })
            .collect();
        let (one, two, scale) = self.ratios();
        let watch: Vec<Value> = self
            .watch_other_vs_same()
            .iter()
            .map(|(name, p50, p99)| json!({"watch_on": name, "other_per_same_p50": p50, "other_per_same_p99": p99}))
            .collect();
        json!({
            "ops": self.ops,
            "concurrency": self.concurrency,
            "value_bytes": self.value_bytes,
            "etcd_members": self.endpoints,
            "etcd_leader": self.leader,
            "watch_delivery_from": "just before the create call is sent",
            "figures": figures,
            "api_creates_per_raw_etcd_puts": {"one_server": one, "two_servers": two},
            "two_servers_per_one_server_creates": scale,
            "watch_other_server_per_same_server": watch,
        })
    }
}
